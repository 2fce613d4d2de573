"""Snakemake script: draw one experiment's figure from its summary store."""

import sys

import xarray as xr

from attnflow.plots import render

sys.stderr = sys.stdout = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

summary = xr.open_zarr(snakemake.input.summary, consolidated=True).load()  # noqa: F821
render(snakemake.wildcards.experiment, summary, snakemake.config,  # noqa: F821
       [snakemake.output.png, snakemake.output.pdf], source=snakemake.input.summary)  # noqa: F821
