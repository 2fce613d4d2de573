"""Snakemake script: simulate one batch of cells (I/O only; the work is attnflow.workflow.simulate_job)."""

import sys

import numba

from attnflow.workflow import simulate_job

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821
numba.set_num_threads(min(snakemake.threads, numba.config.NUMBA_NUM_THREADS))  # noqa: F821

simulate_job(
    snakemake.params.cells,  # noqa: F821
    snakemake.wildcards.batch,  # noqa: F821
    snakemake.config,  # noqa: F821
    snakemake.output.manifest,  # noqa: F821
)
