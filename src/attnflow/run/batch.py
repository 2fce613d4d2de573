"""Running one batch (a simulate job's work): the cells its store, another batch's store or a killed job's
checkpoints hold are taken, the others simulated, and the batch's store written with all of them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..cell import Cell
from ..ids import _id_with_engine, cell_id
from ..layout import STORE_SUFFIX, Layout
from ..names import cells_phrase
from ..store import StoreState, write
from ..versions import engine_staleness, store_versions, stored_engine, stored_engine_numerics
from .failures import failure_remedy
from .manifest import BatchResult
from .stored import _pending_cells, _read_cells, _stores_holding

if TYPE_CHECKING:
    import xarray as xr


# Errors that fail one cell, named, and let its batch go on: the simulation's own, and the
# arithmetic ones the compiled code can still raise (numba reports some as SystemError).
CELL_ERRORS = (ArithmeticError, SystemError)

# A running job checkpoints the cells it finished (one store in ``Layout.pending``) at most this
# often: a job killed mid-batch loses at most this much work, and a batch of many cheap cells does
# not write a file per cell.
CHECKPOINT_SECONDS = 60.0


def run_batch(cells: Iterable[Cell], batch: str, layout: Layout, log=print, provenance=None,
              names: dict[str, str] | None = None, retry_failed: bool = False) -> BatchResult:
    """Simulate a batch's cells that its store does not hold, and write its store with all of them.

    The store's cells are reused if its record matches (every byte checked):
    all of a complete store's, the intact groups' of a corrupt one (the damaged
    ones are computed again), none of a stale one's (another numerics version)
    but where only its layout is older (``store_layout``): those are all kept and
    written again in the current layout, nothing computed.
    The cells computed are checkpointed into ``Layout.pending`` (a store each
    ``CHECKPOINT_SECONDS``, and one on the way out of a job stopped by Ctrl-C or
    SIGTERM), so a job killed mid-batch loses at most that much work (stopped:
    the cell it was computing); the batch's store is written when every cell is
    done, and the checkpoints removed. A seed that fails (step budget, step-size underflow,
    non-finite values) is stored as failed with its cell (``simulate``): the
    numbers decide it, so the stored cell is final until the cell, its
    ``max_steps`` or the numerics version changes, unless ``retry_failed``
    (such cells are computed again). A cell that fails whole (an arithmetic
    error in the compiled code) is left out, its error returned, and the batch
    goes on. A ``MemoryError`` or a kill ends the job: the next run retries it.
    ``names``: cell id -> how the log names it (``jobs.cell_name``; default the id).
    A stored cell that another engine computed than the one its cell names
    (``engine: numba`` or ``jax``) is computed again: a store never mixes engines
    silently. A cell of ``engine: auto`` leaves the choice to the machine, and
    keeps a store of either engine (results brought from a GPU machine are not
    recomputed on the CPU). The store's record and the result name each cell's
    engine. Cells the store holds that the batch no longer has (a value removed
    from its grid) stay in it, off the grid, so that putting the value back
    computes nothing; the result lists them with the others.
    """
    import shutil

    cells = list(cells)
    ids = [cell_id(c) for c in cells]
    run = _Batch(cells, ids, set(ids), batch, layout.store(batch), layout.pending(batch), log, names or {})
    _take_own_store(run)
    if retry_failed:
        _drop_failed_seeds(run)
    _drop_other_engines(run)
    run.stored = set(run.have) - run.rekeyed  # rekeyed cells make the store be written again, under their ids
    _take_checkpoints(run)
    _take_from_other_stores(run, layout, retry_failed)
    run.budget = _under_lower_budget(cells, ids, run.have)  # max_steps raised: the cells that did not need it
    failed = _compute(run, provenance)
    placed, done = _write_store(run)
    shutil.rmtree(run.pending, ignore_errors=True)
    return _result(run, placed, done, failed)


@dataclasses.dataclass
class _Batch:
    """A batch as ``run_batch`` goes through it: its cells, its store and checkpoints, and the cells it
    holds so far (``have``: id -> dataset), by where each came from."""

    cells: list[Cell]
    ids: list[str]
    grid: set[str]  # the ids of the cells the batch has now
    name: str
    path: Path  # the batch's store
    pending: Path  # the checkpoints (``Layout.pending``)
    log: Callable
    names: dict[str, str]  # cell id -> how the log names it
    state: StoreState | None = None  # the batch's store, as read
    have: dict = dataclasses.field(default_factory=dict)
    wanted: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> the engine it names
    rekeyed: set[str] = dataclasses.field(default_factory=set)  # stored under their id with the engine
    stored: set[str] = dataclasses.field(default_factory=set)  # in the batch's store, under their id
    elsewhere: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> another store
    budget: dict[str, int] = dataclasses.field(default_factory=dict)  # cell id -> the max_steps it ran under

    def stale_engine(self, cid: str, ds: xr.Dataset) -> str | None:
        """Why a stored cell is not taken: another engine than the cell names, or its older numerics."""
        return engine_staleness(stored_engine(ds), stored_engine_numerics(ds), self.wanted.get(cid))


def _take_own_store(run: _Batch) -> None:
    """The cells the batch's own store holds, its state logged where it is corrupt or stale."""
    # Every byte: a job reads its own store once. The start-up check compares sizes and times
    # only; bit rot reaches this job through the ticket `attnflow status --deep` writes.
    run.state, have = _read_cells(run.path)
    # Cells stored while the engine was part of ids (``_id_with_engine``) come under their id now.
    for cell, cid in zip(run.cells, run.ids, strict=True):
        if (old := _id_with_engine(cell)) in have and cid not in have:
            have[cid] = have.pop(old)
            have[cid].attrs["cell_id"] = cid
            run.rekeyed.add(cid)
    run.have = have
    state = run.state
    if state.status in ("corrupt", "stale"):
        run.log(f"{run.path.name}: {state.status} ({state.detail}); its "
                + ("intact cells are kept" if state.status == "corrupt" else
                   "cells are kept" if have else "cells are computed again"))


def _drop_failed_seeds(run: _Batch) -> None:
    """``retry_failed``: the stored cells of the grid that hold failed seeds are computed again."""
    again = [cid for cid, ds in run.have.items() if cid in run.grid and ds.attrs.get("n_seeds_failed")]
    for cid in again:
        del run.have[cid]
    if again:
        run.log(f"retry_failed: {len(again)} cells with failed seeds computed again")


def _drop_other_engines(run: _Batch) -> None:
    """Stored cells another engine computed than their cell names (or under its older numbers): computed
    again, or dropped where off the grid."""
    from ..engines import engine_for

    # The engine each cell names; auto takes either (the store records which).
    run.wanted = {cid: engine_for(cell) for cell, cid in zip(run.cells, run.ids, strict=True)
                  if cell.engine != "auto"}
    for cid, why in [(cid, why) for cid, ds in run.have.items() if (why := run.stale_engine(cid, ds))]:
        del run.have[cid]
        run.log(f"{run.names.get(cid, cid)}: {why}: "
                + ("computed again" if cid in run.grid else "dropped (off grid)"))


def _take_checkpoints(run: _Batch) -> None:
    """The cells a killed job of this batch checkpointed, where the store lacks them."""
    resumed = {cid: ds for cid, ds in _pending_cells(run.pending).items()
               if cid not in run.have and not run.stale_engine(cid, ds)}
    run.have.update(resumed)


def _take_from_other_stores(run: _Batch, layout: Layout, retry_failed: bool) -> None:
    """Cells another batch's store holds (its manifest says so): a batch renamed (its axes listed in
    another order, its batch_over edited), a cell two experiments share whose owning batch moved with
    an edit. Taken from there, never computed again (a cell with failed seeds only without
    ``retry_failed``)."""
    if wanted_ids := {cid for cid in run.ids if cid not in run.have}:
        for other in _stores_holding(layout, run.path, wanted_ids):
            for cid, ds in _read_cells(other)[1].items():
                if (cid in wanted_ids and cid not in run.have and not run.stale_engine(cid, ds)
                        and not (retry_failed and ds.attrs.get("n_seeds_failed"))):
                    run.have[cid], run.elsewhere[cid] = ds, other.name


def _compute(run: _Batch, provenance: dict | None) -> dict[str, str]:
    """Simulate, in order, the cells the batch does not hold (those it holds are logged as skipped),
    checkpointing the computed ones every ``CHECKPOINT_SECONDS`` and on the way out of a job stopped
    mid-batch. Returns the cells that failed whole: id -> error."""
    failed = {}
    unsaved: dict = {}  # computed since the last checkpoint
    last_checkpoint = time.monotonic()
    try:
        for i, (cell, cid) in enumerate(zip(run.cells, run.ids, strict=True), 1):
            name = run.names.get(cid, cid)
            if cid in run.have:
                run.log(f"[{i}/{len(run.cells)}] {name}: complete{_where(run, cid)}, skipped")
                continue
            ds, said = _simulate(cell, cid, provenance)
            if ds is None:
                failed[cid] = said
                run.log(f"[{i}/{len(run.cells)}] {name}: FAILED: {said}")
                continue
            run.have[cid] = unsaved[cid] = ds
            seeds = f"{cell.n_seeds} seeds"
            if ds.attrs.get("n_seeds_failed"):
                seeds = f"{ds.attrs['seed_failures']} ({failure_remedy(cell, ds.attrs['seed_failures'])})"
            run.log(f"[{i}/{len(run.cells)}] {name}: {seeds}, {int(ds.n_steps.max())} steps, {said}")
            if time.monotonic() - last_checkpoint >= CHECKPOINT_SECONDS and i < len(run.cells):
                _checkpoint(run, unsaved)
                last_checkpoint = time.monotonic()
    except BaseException:
        # Stopped mid-batch (Ctrl-C; SIGTERM, which the workflow's jobs raise: stop_on_sigterm; a
        # MemoryError): the cells finished since the last checkpoint are kept too, so the next run
        # computes none of them again.
        if unsaved:
            try:
                _checkpoint(run, unsaved)
            except Exception as err:  # noqa: BLE001  (the stop is what the job reports)
                run.log(f"checkpoint on stopping failed ({err}): {cells_phrase(len(unsaved))} computed "
                        "again next run")
        raise
    return failed


def _where(run: _Batch, cid: str) -> str:
    """Where a cell the batch holds came from, as its "skipped" line says (nothing: its own store)."""
    if cid in run.stored:
        return ""
    if cid in run.elsewhere:
        return f" (in {run.elsewhere[cid]})"
    if cid in run.budget:
        return f" (its run under max_steps = {run.budget[cid]} never reached it: the same numbers)"
    return " (stored under its id with the engine)" if cid in run.rekeyed else " (finished by a killed job)"


def _simulate(cell: Cell, cid: str, provenance: dict | None) -> tuple[xr.Dataset | None, str]:
    """One cell simulated: its dataset (its id, versions and ``provenance`` in its attributes) and how
    its log line ends (the seconds it took; the engine compiled for it); for a cell that failed whole,
    None and its error."""
    from ..engine import compilations
    from ..simulation import SimulationError, describe, simulate  # the engine loads only where it runs

    start, compiled = time.perf_counter(), compilations()
    try:
        ds = simulate(cell)
    except (SimulationError, *CELL_ERRORS) as err:
        error = str(err) if isinstance(err, SimulationError) else \
            f"{describe(cell)}: {type(err).__name__} in the simulation: {err}"
        return None, error
    elapsed = time.perf_counter() - start
    ds.attrs.update({"cell_id": cid, **store_versions(), **(provenance or {})})
    compiling = (" (compiling the engine for this kind of cell, once: numba caches it for every "
                 "later job)") if compilations() > compiled else ""
    return ds, f"computed in {elapsed:.3f} s{compiling}"


def _checkpoint(run: _Batch, unsaved: dict) -> None:
    """The cells computed since the last checkpoint, written to one store in the checkpoints."""
    from ..pack import group_cells, placement

    groups = group_cells(unsaved)
    write(groups, run.pending / f"{next(reversed(unsaved))}{STORE_SUFFIX}", versions=store_versions(),
          replace=True, meta={"batch": run.name, "cells": placement(groups), **_engines_of(unsaved)})
    run.log(f"checkpoint: {cells_phrase(len(unsaved))} kept in {run.pending}")
    unsaved.clear()


def _write_store(run: _Batch) -> tuple[dict[str, str], list[str]]:
    """The batch's store written with every cell it holds, unless it holds them already (or none: no
    store). Returns the store's cells (id -> group) and the grid's cells it holds, in order."""
    from ..metadata import store_attrs
    from ..pack import group_cells, placement
    from ..store import record_of

    path, have = run.path, run.have
    done = [cid for cid in dict.fromkeys(run.ids) if cid in have]
    # Off the grid: kept, so that the value put back computes nothing (the summary leaves them out).
    kept = [cid for cid in have if cid not in run.grid]
    if kept:
        run.log(f"{cells_phrase(len(kept))} the batch no longer has (a value removed from its grid) stay in "
                f"{path.name}, off the grid: put back, they are not computed again")
    if not done and not kept:
        path.unlink(missing_ok=True)  # every cell failed: no store
        return {}, done
    if run.state.ok and run.stored == {*done, *kept}:
        return record_of(path)["cells"], done  # nothing new: the store stays as it is
    held = {cid: have[cid] for cid in [*done, *kept]}
    groups = group_cells(held, store_attrs(run.name, len(done) + len(kept)))
    placed = placement(groups)
    write(groups, path, versions=store_versions(), replace=True,
          meta={"batch": run.name, "cells": placed, **_engines_of(held)})
    new = len(set(done) - run.stored - run.rekeyed)
    run.log(f"{path.name}: {cells_phrase(len(done))} written ({new} new"
            + (f"; {len(kept)} more off the grid" if kept else "") + ")")
    return placed, done


def _result(run: _Batch, placed: dict[str, str], done: list[str], failed: dict[str, str]) -> BatchResult:
    """What the batch ends with, its failures logged."""
    have = run.have
    seed_failures = {cid: str(have[cid].attrs["seed_failures"]) for cid in done
                     if have[cid].attrs.get("n_seeds_failed")}
    if seed_failures:
        run.log(f"{len(seed_failures)} of {len(run.cells)} cells hold failed seeds (stored as failed, left "
                "out of the reductions; not computed again until the cell, its max_steps or the numerics "
                "change)")
    if failed:
        run.log(f"{len(failed)} of {len(run.cells)} cells FAILED (recorded in the manifest; not retried "
                "until the cell or the numerics change)")
    held = _engines_of({cid: have[cid] for cid in placed if cid in have})
    return BatchResult(run.path, placed, failed, seed_failures, held["engines"], held["engine_numerics"])


def _under_lower_budget(cells: list[Cell], ids: list[str], have: dict[str, xr.Dataset]) -> dict[str, int]:
    """Cells not in ``have`` whose run under a lower ``max_steps`` is (the budget raised, as a failure's
    remedy says), with no seed failed and its certificate's companion run finished: a run never stopped
    by its budget takes the same steps under a larger one, so its numbers are taken, relabelled, into
    ``have``, never computed again. Only the cells that failed are. Returns id -> the budget it ran under."""
    budgets = {int(ds.attrs["cell_max_steps"]) for ds in have.values() if "cell_max_steps" in ds.attrs}
    out = {}
    for cell, cid in zip(cells, ids, strict=True):
        if cid in have:
            continue
        for lower in sorted((b for b in budgets if b < cell.max_steps), reverse=True):
            ds = have.get(cell_id(dataclasses.replace(cell, max_steps=lower)))
            if ds is not None and not ds.attrs.get("n_seeds_failed") and \
                    not str(ds.attrs.get("certificate_variable", "")).startswith("companion run failed"):
                have[cid] = ds.copy()
                have[cid].attrs.update(cell_id=cid, cell_max_steps=cell.max_steps)
                out[cid] = lower
                break
    return out


def _engines_of(cells: dict[str, xr.Dataset]) -> dict[str, dict]:
    """What a store's record and a manifest say of its cells' engines: each cell's engine and the version
    of that engine's own numbers."""
    return {"engines": {cid: stored_engine(ds) for cid, ds in cells.items()},
            "engine_numerics": {cid: stored_engine_numerics(ds) for cid, ds in cells.items()}}


__all__ = ["CELL_ERRORS", "CHECKPOINT_SECONDS", "run_batch"]
