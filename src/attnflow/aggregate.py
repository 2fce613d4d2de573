"""Aggregation entry point: summary store per experiment, on a chosen dask scheduler."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import dask

from . import __version__
from .summaries import cell_entries, summarise
from .sweep import config_digest


@contextlib.contextmanager
def dask_scheduler(name: str):
    """``threads`` | ``synchronous`` | ``distributed`` (a LocalCluster) | ``tcp://host:port``."""
    if name in ("threads", "synchronous"):
        with dask.config.set(scheduler=name):
            yield
        return
    from dask.distributed import Client, LocalCluster

    if name == "distributed":
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, \
                Client(cluster):
            yield
    else:
        with Client(name):
            yield


def aggregate_experiment(config: dict, experiment: str, stores, output, scheduler="threads"):
    """Summarise ``experiment``'s stores under ``stores`` into the zarr store ``output``."""
    entries = cell_entries(config, experiment, stores)
    with dask_scheduler(scheduler):
        summary = summarise(experiment, entries)
    missing = summary.attrs.pop("missing_cells")
    if missing:
        print(f"WARNING {experiment}: {len(missing)} cells have no store (NaN in the summary): "
              + ", ".join(missing))
    summary.attrs.update({
        "n_missing_cells": len(missing),
        "missing_cells": ", ".join(missing),
        "stores": ", ".join(str(p) for _, p in entries),
        "attnflow_version": __version__,
        "config_sha256": config_digest(config),
        "experiment_config": json.dumps(
            {"defaults": config.get("defaults", {}), **config["experiments"][experiment]},
            sort_keys=True),
    })
    out = Path(output)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    summary.to_zarr(tmp, mode="w", consolidated=True, zarr_format=2)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"{experiment}: {len(entries)} cells, {len(missing)} missing -> {out}")
    return summary
