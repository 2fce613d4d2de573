"""Snakemake script: summarise an experiment's stores into one consolidated zarr store."""

import sys

from attnflow.aggregate import aggregate_experiment

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

aggregate_experiment(
    snakemake.config,  # noqa: F821
    snakemake.wildcards.experiment,  # noqa: F821
    snakemake.params.stores,  # noqa: F821
    snakemake.output.summary,  # noqa: F821
    scheduler=snakemake.params.scheduler,  # noqa: F821
)
