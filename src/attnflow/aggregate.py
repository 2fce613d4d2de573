"""Reduce an experiment's stores into one summary, in parallel with dask.

Each batch's store is one dask task: read whole, verified against its
completion record, and reduced by the experiment once per group of cells of
one shape (``attnflow.pack``), every cell at once, to a few quantities per
cell. The tasks run on the chosen scheduler (threads, or a dask.distributed
cluster); their results are stacked along the experiment's grid axes with an
explicit outer join, so a missing cell is NaN, never dropped, and listed. A
corrupt store stops the aggregation, named; so do stores written under another
numerics version (stale): a summary never mixes versions. A summary records
the numerics version of its stores and the version of its experiment's
reduction; the workflow rebuilds one whose versions are not the current ones. Every
variable and coordinate of a summary carries units, a long name and a
description (``attnflow.metadata``), and the summary a title, its Conventions
(CF) and a history line.
(Building one lazy dask graph over every store's reduction was measured
slower: 6.5 s of graph construction for 96 small stores against 1 s of work.)
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Sequence
from pathlib import Path

import dask
import numpy as np
import xarray as xr

from . import metadata
from .experiments import Experiment
from .names import describe_failures, seed_footer
from .pack import CELL, cell_values, select
from .spec import Spec
from .store import CorruptStore, StaleStore, load, open_groups, quarantine, record_of
from .store import write as write_store
from .version import __version__
from .versions import recorded_engines, store_versions, summary_versions, verify_batch


@contextlib.contextmanager
def dask_scheduler(name: str):
    """``threads`` | ``synchronous`` | ``distributed`` (a LocalCluster) | ``tcp://host:port``."""
    if name in ("threads", "synchronous"):
        # The scheduler itself, not its name: to resolve a name dask imports dask.distributed, to look
        # for a client (0.2 s of every aggregation job).
        import dask.local
        import dask.threaded

        scheduler = {"threads": dask.threaded.get, "synchronous": dask.local.get_sync}[name]
        with dask.config.set(scheduler=scheduler):
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


def _reduce_store(experiment: Experiment, path: str, wanted: Sequence[tuple[dict, str]]) -> list[xr.Dataset]:
    """One dask task: the reduced quantities of the cells of one store an experiment needs
    (``wanted``: grid coordinates and cell id), one piece per group, along ``cell``, tagged with
    their grid coordinates and accuracy certificates.

    A store whose bytes do not match its record is moved aside (so the next
    run recomputes it) and stops the aggregation, named.
    """
    try:
        record, members = load(path, expect=store_versions())
    except CorruptStore as err:
        aside = quarantine(path)
        raise CorruptStore(f"{err}; moved to {aside.name}, the next `snakemake` recomputes it") from None
    by_cell: dict[str, list[dict]] = {}
    for coords, cid in wanted:
        by_cell.setdefault(cid, []).append(coords)
    pieces = []
    for ds in open_groups(members, record["groups"], chunks=None):
        ids = [cid for cid in ds[CELL].values.tolist() if cid in by_cell]
        if not ids:
            continue
        rows = [(cid, coords) for cid in ids for coords in by_cell[cid]]
        cells = select(ds, [cid for cid, _ in rows])
        piece = _reduce_good_seeds(experiment, cells)
        # A scalar coordinate left by a selection (``isel(time=0)``'s ``time = 0``) describes no axis.
        piece = piece.drop_vars([name for name, coord in piece.coords.items() if coord.ndim == 0])
        certificate = cell_values(cells, "certificate_error").values
        seeds_failed = (cells.failed.sum("seed").values if "failed" in cells
                        else np.zeros(len(rows), dtype=int))
        failures = cell_values(cells, "seed_failures").values
        axes = list(rows[0][1])
        piece = piece.drop_vars(CELL).assign_coords(
            {a: (CELL, [coords[a] for _, coords in rows]) for a in axes})
        piece["certificate_error"] = (CELL, np.asarray(certificate, dtype=float))
        piece["store_cell"] = (CELL, [f"{path}:{cid}" for cid, _ in rows])
        piece[SEEDS_USED] = (CELL, (cells.sizes["seed"] - seeds_failed).astype(float))
        piece[SEEDS_FAILED] = (CELL, seeds_failed.astype(float))
        piece["seed_failures"] = (CELL, [str(f) if isinstance(f, str) else "" for f in failures])
        pieces.append(piece)
    return pieces


# Per grid point: the seeds its reductions used and those that failed (NaN where its cell is missing).
SEEDS_USED, SEEDS_FAILED = "n_seeds_used", "n_seeds_failed"
_COUNT_ATTRS = {
    SEEDS_USED: {"units": "1", "long_name": "seeds used",
                 "description": "seeds of the grid point's cell whose runs succeeded: the reductions use "
                                "these alone; NaN where the cell is missing"},
    SEEDS_FAILED: {"units": "1", "long_name": "seeds failed",
                   "description": "seeds of the grid point's cell whose runs failed (step budget, step-size "
                                  "underflow, non-finite values), left out of the reductions; NaN where "
                                  "the cell is missing"},
}


def _reduce_good_seeds(experiment: Experiment, cells: xr.Dataset) -> xr.Dataset:
    """``experiment.reduce`` of the cells, leaving out their failed seeds (``simulate``'s ``failed``).

    Cells without a failed seed are reduced together, as always; a cell with one is reduced alone
    on its good seeds, and what the reduction keeps per seed is NaN at the failed ones (what the
    derivations already read as a missing seed). A cell whose seeds all failed is NaN throughout.
    """
    if "failed" not in cells or not bool(cells.failed.any()):
        return experiment.reduce(cells).load()
    bad = cells.failed.any("seed").values
    ids = cells[CELL].values.tolist()

    def take(positions):  # the cells at these positions, their per-cell attributes with them
        return select(cells, [ids[i] for i in positions])

    parts = {}
    clean = np.flatnonzero(~bad)
    if clean.size:
        reduced = _as_float(experiment.reduce(take(clean)).load())
        parts.update(zip(clean.tolist(), _split_cells(reduced), strict=True))
    template = parts[int(clean[0])] if clean.size else None
    for i in np.flatnonzero(bad).tolist():
        one = take([i])
        good = np.flatnonzero(~one.failed.values[0])
        if good.size:
            parts[i] = _as_float(experiment.reduce(one.isel(seed=good)).load())
            if "seed" in parts[i].dims:
                parts[i] = parts[i].reindex(seed=cells.seed.values, fill_value=np.nan)
            template = parts[i] if template is None else template
        else:
            parts[i] = None
    for i in [i for i, part in parts.items() if part is None]:  # every seed failed: NaN throughout
        if template is None:  # the shape of the reduction: of the cell's own (NaN) samples
            template = _as_float(experiment.reduce(take([i])).load())
        parts[i] = xr.full_like(template, np.nan).assign_coords({CELL: cells[CELL].values[[i]]})
    return xr.concat([parts[i] for i in range(cells.sizes[CELL])], dim=CELL, join="outer", fill_value=np.nan,
                     coords="minimal", compat="override", combine_attrs="drop")


def _split_cells(reduced: xr.Dataset) -> list[xr.Dataset]:
    return [reduced.isel({CELL: [k]}) for k in range(reduced.sizes[CELL])]


def _as_float(reduced: xr.Dataset) -> xr.Dataset:
    """Booleans as 0/1 floats, so that a left-out seed can be NaN."""
    return reduced.assign({v: reduced[v].astype(float) for v in reduced.data_vars
                           if reduced[v].dtype == bool})


def summarise(experiment: Experiment, spec: Spec, entries: Sequence[tuple[dict, str, str]],
              failures: dict[str, str] | None = None) -> xr.Dataset:
    """Reduce ``(grid coords, store path, cell id)`` entries into one dataset over the grid axes.

    Grid axes become dimensions; a cell its store does not hold is NaN in every
    variable and listed in ``attrs['missing_cells']`` (and in ``failed_cells``,
    with its error, when ``failures`` names it); a corrupt store raises
    ``CorruptStore`` naming it; stores of another numerics version raise
    ``StaleStore`` naming them (never mixed with current ones).
    """
    axes = list(entries[0][0]) if entries else []
    by_store: dict[str, list[tuple[dict, str]]] = {}
    for coords, path, cid in entries:
        by_store.setdefault(path, []).append((coords, cid))
    states = {path: verify_batch(path, checksums=False) for path in by_store}
    for path, state in states.items():
        if state.status == "corrupt":
            raise CorruptStore(f"{path}: corrupt ({state.detail}); the next `snakemake` recomputes it")
    stale = sorted(path for path, state in states.items() if state.status == "stale")
    if stale:
        raise StaleStore(f"{experiment.name}: {len(stale)} stores are stale ({states[stale[0]].detail}): "
                         + ", ".join(stale) + "; a summary never mixes numerics versions, the next "
                         "`snakemake` recomputes them")
    records = {path: record_of(path) if states[path].ok else {} for path in by_store}
    held = {path: set(records[path].get("cells") or ()) for path in by_store}
    missing = sorted({f"{path}:{cid}" for _, path, cid in entries if cid not in held[path]})
    failed = [{"coords": coords, "error": failures[cid]} for coords, path, cid in entries
              if cid not in held[path] and cid in (failures or {})]
    tasks = [dask.delayed(_reduce_store)(experiment, path, [w for w in wanted if w[1] in held[path]])
             for path, wanted in by_store.items() if held[path] & {cid for _, cid in wanted}]
    pieces = [piece for pieces in dask.compute(*tasks) for piece in pieces]
    if not pieces:
        why = (f": {len(failed)} failed, the first at {failed[0]['coords']}: {failed[0]['error']}" if failed
               else "")
        raise FileNotFoundError(f"{experiment.name}: none of the {len(entries)} cells is stored{why} "
                                "(`attnflow status` lists them)")
    out = xr.concat(pieces, dim=CELL, join="outer", fill_value=np.nan, coords="minimal",
                    compat="override", combine_attrs="drop")
    certificate = _worst_certificate(out.certificate_error.values, out.store_cell.values)
    seed_failures = _seed_failures(out)
    out = out.drop_vars(["certificate_error", "store_cell", "seed_failures"])
    # A grid point with no cell (failed, or off a grid of extra points) is NaN: a boolean variable
    # would fill it with bool(NaN) = True and draw a missing cell as a fact.
    out = out.assign({v: out[v].astype(float) for v in out.data_vars if out[v].dtype == bool})
    if len(axes) == 1:
        out = out.swap_dims({CELL: axes[0]})
    elif axes:
        out = out.set_index({CELL: axes}).unstack(CELL, fill_value=np.nan)
    # Every grid value stays on its axis even when all of its cells are missing.
    grid = {a: list(dict.fromkeys(coords[a] for coords, _, _ in entries)) for a in axes}
    out = out.reindex(grid, fill_value=np.nan)
    # Numeric axes ascending, whatever the config's order (refinement appends extra points at the end):
    # the figures draw maps cell by cell from sorted edges. Categorical axes keep the config's order.
    out = out.sortby([a for a in axes if np.issubdtype(out[a].dtype, np.number)])
    out = experiment.derive(experiment.with_axes(out, spec), spec)
    for name, attrs in _COUNT_ATTRS.items():
        out[name].attrs.update(attrs)
    out.attrs.update({"experiment": experiment.name, "n_cells": len(entries), "missing_cells": missing,
                      "failed_cells": failed, "engines": _engines(entries, records), **certificate,
                      **seed_failures})
    # Units, long names and descriptions of every variable and coordinate, from one table
    # (attnflow.metadata) and the experiment's own: one it adds without them stops here, named.
    return metadata.describe_summary(out, experiment.name, experiment.metadata)


def _engines(entries, records: dict[str, dict]) -> str:
    """Which engines computed the summary's stored cells, and how many each ("jax: 3, numba: 1"): an
    ``engine: auto`` sweep takes cells of either (``run.batch.run_batch``), and the summary says so."""
    engines = {path: recorded_engines(record) for path, record in records.items()}
    counts: dict[str, int] = {}
    for path, cid in {(path, cid) for _, path, cid in entries if cid in engines[path]}:
        counts[engines[path][cid]] = counts.get(engines[path][cid], 0) + 1
    return ", ".join(f"{engine}: {count}" for engine, count in sorted(counts.items()))


def _seed_failures(out: xr.Dataset) -> dict:
    """What the figure's footer and the exports say of the failed seeds: how many of how many, at how
    many grid points, and the first grid point's line (``simulate``'s ``seed_failures``)."""
    used = np.nan_to_num(out[SEEDS_USED].values)
    failed = np.nan_to_num(out[SEEDS_FAILED].values)
    where = np.flatnonzero(failed > 0)
    first = str(out.seed_failures.values[where[0]]) if where.size else ""
    return {"n_seeds": int(used.sum() + failed.sum()), "n_seeds_failed": int(failed.sum()),
            "n_points_with_failed_seeds": int(where.size), "first_seed_failure": first}


def _worst_certificate(errors, where) -> dict:
    """The worst accuracy certificate of the cells (``simulation.simulate``): ``certificate_error``
    and the cell it comes from (``store:cell id``); ``certificate_uncertified`` counts cells that
    carry none."""
    errors = np.asarray(errors, dtype=float)
    certified = ~np.isnan(errors)
    out = {"certificate_uncertified": int((~certified).sum())}
    if certified.any():
        worst = int(np.flatnonzero(certified)[np.argmax(errors[certified])])
        out.update({"certificate_error": float(errors[worst]), "certificate_store": str(where[worst])})
    return out


def aggregate(experiment: Experiment, spec: Spec, entries, output, *, scheduler: str = "threads",
              provenance: dict | None = None, retire: Sequence[str] = (),
              failures: dict[str, str] | None = None) -> xr.Dataset:
    """Summarise an experiment's stores into the zarr store ``output`` (written atomically).

    ``retire``: files (the experiment's figures) removed first, so a failed
    aggregation never leaves a figure that looks current. ``failures``: the
    errors of failed cells (cell id -> error, from the batches' manifests).
    """
    for stale in retire:
        Path(stale).unlink(missing_ok=True)
    with dask_scheduler(scheduler):
        summary = summarise(experiment, spec, entries, failures)
    missing = summary.attrs.pop("missing_cells")
    failed = summary.attrs.pop("failed_cells")
    if failed:
        print(f"WARNING {experiment.name}: {len(failed)} cells failed (NaN in the summary, listed in the "
              f"caption): {describe_failures(failed)}")
    if summary.attrs.get("n_seeds_failed"):
        print(f"WARNING {experiment.name}: {seed_footer(summary.attrs)}; the first: "
              f"{summary.attrs['first_seed_failure']}")
    if missing:
        print(f"WARNING {experiment.name}: {len(missing)} cells have no store (NaN in the summary): "
              + ", ".join(missing))
    summary.attrs.update({
        **metadata.summary_attrs(experiment.name, history=(
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ} attnflow {__version__}: "
            f"{len(entries)} grid points of experiment {experiment.name} reduced from "
            f"{len({p for _, p, _ in entries})} simulation stores (reduction version "
            f"{experiment.reduction_version})")),
        "n_missing_cells": len(missing),
        "missing_cells": ", ".join(missing),
        "n_failed_cells": len(failed),
        "failed_cells": json.dumps(failed),
        "stores": ", ".join(sorted({p for _, p, _ in entries})),
        "attnflow_version": __version__,
        "experiment_spec": spec.to_json(),
        **summary_versions(experiment),
        **(provenance or {}),
    })
    write_store(summary, output, chunks="auto", replace=True, versions=summary_versions(experiment),
                meta={"failed_cells": summary.attrs["failed_cells"]})
    print(f"{experiment.name}: {len(entries)} grid points, {len(missing)} missing -> {output}")
    return summary


__all__ = ["SEEDS_FAILED", "SEEDS_USED", "aggregate", "dask_scheduler", "summarise"]
