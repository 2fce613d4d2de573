"""Snakemake script: simulate one batch of cells (I/O only; the work is attnflow.run.jobs.simulate_job)."""

import os
import sys

# A job not given a GPU (its `gpu` resource 0: its cells run on the numba engine) never looks at one:
# jax's first look claims most of a GPU's memory, which a job that was given it may be using. Set before
# anything imports jax.
GPU = int(snakemake.resources.get("gpu", 0) or 0)  # noqa: F821
if not GPU:
    os.environ["JAX_PLATFORMS"] = "cpu"

import numba  # noqa: E402

from attnflow.run.jobs import simulate_job  # noqa: E402

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821
numba.set_num_threads(min(snakemake.threads, numba.config.NUMBA_NUM_THREADS))  # noqa: F821

simulate_job(
    snakemake.params.cells,  # noqa: F821
    snakemake.wildcards.batch,  # noqa: F821
    snakemake.config,  # noqa: F821
    snakemake.output.manifest,  # noqa: F821
    gpu=GPU,
)
