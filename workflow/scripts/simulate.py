"""Snakemake script: simulate one batch of cells (I/O only; the work is attnflow.sweep.run_batch)."""

import json
import sys

import numba

from attnflow import Cell
from attnflow.sweep import config_digest, run_batch

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821
numba.set_num_threads(min(snakemake.threads, numba.config.NUMBA_NUM_THREADS))  # noqa: F821

cells = [Cell(**fields) for fields in json.loads(snakemake.params.cells)]  # noqa: F821
provenance = {
    "experiment": snakemake.wildcards.experiment,  # noqa: F821
    "batch": snakemake.wildcards.batch,  # noqa: F821
    "config_sha256": config_digest(snakemake.config),  # noqa: F821
}
grid_axes = list(snakemake.config["experiments"][snakemake.wildcards.experiment].get("grid", {}))  # noqa: F821
paths = run_batch(cells, snakemake.params.stores, provenance=provenance,  # noqa: F821
                  coord_fields=grid_axes)
with open(snakemake.output.manifest, "w") as fh:  # noqa: F821
    json.dump({"stores": [str(p) for p in paths], "cells": json.loads(snakemake.params.cells)},  # noqa: F821
              fh, indent=1)
