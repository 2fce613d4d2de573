"""Snakemake script: summarise an experiment's stores into one consolidated zarr store."""

import json
import sys

from attnflow.run.jobs import aggregate_job

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

aggregate_job(
    snakemake.wildcards.experiment,  # noqa: F821
    snakemake.params.spec,  # noqa: F821
    snakemake.params.entries,  # noqa: F821
    snakemake.output.summary,  # noqa: F821
    snakemake.params.scheduler,  # noqa: F821
    snakemake.config,  # noqa: F821
    modules=json.loads(snakemake.params.modules),  # noqa: F821
    retire=snakemake.params.retire,  # noqa: F821
    manifests=snakemake.input.manifests,  # noqa: F821
)
