"""Snakemake script: draw one figure of an experiment from its summary store."""

import json
import sys

from attnflow.run.jobs import plot_job

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

plot_job(
    snakemake.input.summary,  # noqa: F821
    [snakemake.output.png, snakemake.output.pdf],  # noqa: F821
    modules=json.loads(snakemake.params.modules),  # noqa: F821
    width=snakemake.params.width,  # noqa: F821
    part=snakemake.params.part,  # noqa: F821
)
