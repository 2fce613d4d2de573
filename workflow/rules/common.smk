import json

from snakemake.utils import validate

from attnflow.sweep import (
    ConfigError,
    estimated_memory_mb,
    estimated_seconds,
    experiment_batches,
    validate_config,
)


validate(config, schema="../schemas/config.schema.yaml")
try:
    validate_config(config)
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None

RESULTS = config["results"]
STORES = f"{RESULTS}/simulations"
EXPERIMENT_NAMES = list(config["experiments"])
BATCHES = {name: experiment_batches(config, name) for name in EXPERIMENT_NAMES}


wildcard_constraints:
    experiment="|".join(EXPERIMENT_NAMES),
    batch="[A-Za-z0-9._+-]+",


def batch_cells(wildcards):
    """The cells of one batch job, as plain dicts (Snakemake params must be hashable text)."""
    cells = BATCHES[wildcards.experiment][wildcards.batch]
    return json.dumps([cell.to_dict() for cell in cells], sort_keys=True)


def experiment_manifests(wildcards):
    return expand(
        f"{RESULTS}/manifests/{wildcards.experiment}/{{batch}}.json",
        batch=sorted(BATCHES[wildcards.experiment]),
    )


def simulate_runtime(wildcards):
    """Minutes requested for a batch job (cluster runtime), from the cost model in attnflow.sweep."""
    return max(5, int(estimated_seconds(BATCHES[wildcards.experiment][wildcards.batch]) / 60) + 1)


def simulate_mem_mb(wildcards):
    return estimated_memory_mb(BATCHES[wildcards.experiment][wildcards.batch])

