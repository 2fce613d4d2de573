"""Reduce an experiment's stores into one summary, in parallel with dask.

Each store is one dask task: verified against its completion record, opened
lazily (only the variables the reduction touches are read) and reduced by the
experiment to a few quantities per cell. The tasks run on the chosen scheduler
(threads, or a dask.distributed cluster); their results are stacked along the
experiment's grid axes with an explicit outer join, so a missing cell is NaN,
never dropped, and listed. A corrupt store stops the aggregation, named; so
do stores written under another numerics version (stale): a summary never
mixes versions. A summary records the numerics version of its stores and the
version of its experiment's reduction; the workflow rebuilds one whose
versions are not the current ones.
(Building one lazy dask graph over every store's reduction was measured
slower: 6.5 s of graph construction for 96 small stores against 1 s of work.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

import dask
import numpy as np
import xarray as xr

from . import __version__
from .experiments import Experiment, Spec
from .store import CorruptStore, StaleStore, open_verified, quarantine
from .store import write as write_store
from .sweep import describe_failures, failure_of, store_versions, summary_versions, verify_cell


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
                          dashboard_address=None) as cluster, Client(cluster):
            yield
    else:
        with Client(name, timeout="10s"):
            yield


def _reduce_store(experiment: Experiment, coords: dict, path: str) -> xr.Dataset:
    """One dask task: the reduced quantities of one cell, tagged with its grid coordinates.

    A store whose bytes do not match its record is moved aside (so the next
    run recomputes it) and stops the aggregation, named.
    """
    try:
        # Lazily indexed numpy: one task per store.
        ds = open_verified(path, expect=store_versions(), chunks=None)
    except CorruptStore as err:
        aside = quarantine(path)
        raise CorruptStore(f"{err}; moved to {aside.name}, the next `snakemake` recomputes it") from None
    with ds:
        piece = experiment.reduce(ds).load()
        certificate = ds.attrs.get("certificate_error")
    piece = piece.expand_dims("cell").assign_coords({a: ("cell", [v]) for a, v in coords.items()})
    if certificate is not None:
        piece.attrs["certificate_error"] = float(certificate)
    return piece


def summarise(experiment: Experiment, spec: Spec, entries: Sequence[tuple[dict, str]]) -> xr.Dataset:
    """Reduce ``(grid coords, store path)`` pairs into one dataset over the grid axes.

    Grid axes become dimensions; a cell whose store is missing is NaN in every
    variable and listed in ``attrs['missing_cells']``; a corrupt store raises
    ``CorruptStore`` naming it; stores of another numerics version raise
    ``StaleStore`` naming them (never mixed with current ones).
    """
    axes = list(entries[0][0]) if entries else []
    states = {path: verify_cell(path, checksums=False) for path in dict.fromkeys(p for _, p in entries)}
    for path, state in states.items():
        if state.status == "corrupt":
            raise CorruptStore(f"{path}: corrupt ({state.detail}); the next `snakemake` recomputes it")
    stale = sorted(path for path, state in states.items() if state.status == "stale")
    if stale:
        raise StaleStore(f"{experiment.name}: {len(stale)} stores are stale ({states[stale[0]].detail}): "
                         + ", ".join(stale) + "; a summary never mixes numerics versions, the next "
                         "`snakemake` recomputes them")
    missing = sorted({path for _, path in entries if not states[path].ok})
    failed = [{"coords": coords, "error": record["error"]} for coords, path in entries
              if not states[path].ok and (record := failure_of(path))]
    tasks = [dask.delayed(_reduce_store)(experiment, coords, path)
             for coords, path in entries if states[path].ok]
    pieces = list(dask.compute(*tasks))
    if not pieces:
        raise FileNotFoundError(f"{experiment.name}: none of the {len(entries)} stores exists")
    certificate = _worst_certificate(pieces, [p for _, p in entries if states[p].ok])
    out = xr.concat(pieces, dim="cell", join="outer", fill_value=np.nan, coords="minimal",
                    compat="override", combine_attrs="drop")
    if len(axes) == 1:
        out = out.swap_dims(cell=axes[0])
    elif axes:
        out = out.set_index(cell=axes).unstack("cell", fill_value=np.nan)
    # Every grid value stays on its axis even when all of its cells are missing.
    grid = {a: list(dict.fromkeys(coords[a] for coords, _ in entries)) for a in axes}
    out = out.reindex(grid, fill_value=np.nan)
    out = experiment.derive(experiment.with_axes(out, spec), spec)
    out.attrs.update({"experiment": experiment.name, "n_cells": len(entries), "missing_cells": missing,
                      "failed_cells": failed, **certificate})
    return out


def _worst_certificate(pieces, paths) -> dict:
    """The worst accuracy certificate of the stores (``simulation.simulate``): ``certificate_error``
    and the store it comes from; ``certificate_uncertified`` counts stores that carry none."""
    found = [(p.attrs["certificate_error"], path) for p, path in zip(pieces, paths, strict=True)
             if "certificate_error" in p.attrs]
    out = {"certificate_uncertified": len(pieces) - len(found)}
    if found:
        worst, where = max(found, key=lambda item: item[0] if item[0] == item[0] else float("inf"))
        out.update({"certificate_error": worst, "certificate_store": str(where)})
    return out


def aggregate(experiment: Experiment, spec: Spec, entries, output, *, scheduler: str = "threads",
              provenance: dict | None = None, retire: Sequence[str] = ()) -> xr.Dataset:
    """Summarise an experiment's stores into the zarr store ``output`` (written atomically).

    ``retire``: files (the experiment's figures) removed first, so a failed
    aggregation never leaves a figure that looks current.
    """
    for stale in retire:
        Path(stale).unlink(missing_ok=True)
    with dask_scheduler(scheduler):
        summary = summarise(experiment, spec, entries)
    missing = summary.attrs.pop("missing_cells")
    failed = summary.attrs.pop("failed_cells")
    if failed:
        print(f"WARNING {experiment.name}: {len(failed)} cells failed (NaN in the summary, listed in the "
              f"caption): {describe_failures(failed)}")
    if missing:
        print(f"WARNING {experiment.name}: {len(missing)} cells have no store (NaN in the summary): "
              + ", ".join(missing))
    summary.attrs.update({
        "n_missing_cells": len(missing),
        "missing_cells": ", ".join(missing),
        "n_failed_cells": len(failed),
        "failed_cells": json.dumps(failed),
        "stores": ", ".join(sorted({p for _, p in entries})),
        "attnflow_version": __version__,
        "experiment_spec": spec.to_json(),
        **summary_versions(experiment),
        **(provenance or {}),
    })
    write_store(summary, output, chunks="auto", replace=True, versions=summary_versions(experiment))
    print(f"{experiment.name}: {len(entries)} grid points, {len(missing)} missing -> {output}")
    return summary


__all__ = ["aggregate", "dask_scheduler", "summarise"]
