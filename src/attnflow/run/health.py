"""What is wrong with a results directory's batches and cells: each finished batch's store against its
manifest, a batch whose manifest is gone, every cell's state (``attnflow status``), and the line the
workflow starts with for each problem."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..ids import _id_with_engine, cell_id
from ..names import cells_phrase
from ..store import StoreState, record_of, root_attrs
from ..versions import engine_staleness, recorded_engine_numerics, recorded_engines, verify_batch
from .failures import _short_error, retry_requested
from .manifest import MANIFEST_FORMAT, _numerics_version, read_manifest

if TYPE_CHECKING:
    from ..sweep import Sweep


def store_health(sweep: Sweep, batch: str, record: dict, checksums: bool = False) -> StoreState:
    """A finished batch's store against its (format 2) manifest ``record``: done, or missing, damaged,
    stale, or another file than the one the manifest records.

    Cheap unless ``checksums``: one ``stat`` of the store against the size and time the manifest
    recorded, and its zip directory and record (the versions); only a store whose size or time
    differs is read, every byte.
    """
    if not record["cells"]:
        return StoreState("done")  # every cell failed: no store
    store = sweep.layout.store(batch)
    try:
        st = store.stat()
        seen = (st.st_size, st.st_mtime_ns) == (record["size"], record["mtime_ns"])
    except OSError:
        seen = False
    # Size and time as recorded: still the record's versions (zip directory and record, no checksums),
    # so a store an older numerics wrote (its manifest matching it) is stale, not reused.
    state = verify_batch(store, checksums=checksums or not seen)
    if state.ok and not seen:
        # Touched or copied since its manifest, every byte intact: its cells are good; the next run
        # records it again (computing nothing) so that the start-up check need not read it whole again.
        state = StoreState("replaced", "touched or replaced since its manifest was written; intact, every "
                                       "byte checked against its record")
    return state


def other_engines(sweep: Sweep, batch: str, record: dict) -> dict[str, str]:
    """The cells a batch's manifest (or store) ``record`` holds that another engine computed than the
    one their cell names (``engine: numba`` or ``jax``), or that their engine computed under another
    version of its own numbers: cell id -> why (``versions.engine_staleness``). A cell of ``engine: auto``
    leaves the engine to the machine and keeps a store of either (``run_batch``)."""
    held, versions = recorded_engines(record), recorded_engine_numerics(record)
    named = {cell_id(c): None if c.engine == "auto" else c.engine for c in sweep.batches.get(batch, ())}
    return {cid: why for cid, engine in held.items()
            if cid in named and (why := engine_staleness(engine, versions[cid], named[cid]))}


def batch_health(sweep: Sweep, batch: str, record: dict,
                 checksums: bool = False) -> list[tuple[str, StoreState]]:
    """What is wrong with a finished batch (its manifest ``record``, ``{}`` when unreadable), as (path,
    state) pairs: an unreadable or old manifest, its store (``store_health``), cells of it another
    engine computed than their cell names (stale: ``other_engines``), its failed cells, and cells its
    manifest lacks (``changed``: a grid value added or edited; Snakemake would rerun such a batch for
    its parameters only where it has their record, not in another working copy of these results).
    """
    store = sweep.layout.store(batch)
    if not record:
        return [(str(store), StoreState("corrupt", "its manifest is unreadable: the batch runs again"))]
    if record.get("format") != MANIFEST_FORMAT:
        return [(str(store), StoreState("stale", "written by attnflow 0.1, one store per cell, which this "
                                                 "version does not read"))]
    if not record["cells"] and not record["failed"]:  # a job records every cell, stored or failed
        return [(str(store), StoreState("corrupt", "its manifest records none of its cells: the batch "
                                                   "runs again"))]
    problems = []
    # A manifest is the batch's only if it records every cell the batch holds now: one written for other
    # cells (another config or working copy on these results; a weights file edited in place, which
    # renames its cells) leaves Snakemake nothing to rerun where this check finds the cells missing.
    recorded = set(record["cells"]) | set(record["failed"])
    ids = set(cell_id(c) for c in sweep.batches[batch])
    absent = ids - recorded
    if absent:
        problems.append((str(store), StoreState("changed", _changed_cells(len(absent), len(ids) - len(absent),
                                                                          len(recorded - ids)))))
    if not (state := store_health(sweep, batch, record, checksums)).ok:
        problems.append((str(store), state))
    elif other := other_engines(sweep, batch, record):
        first = next(iter(other))
        problems.append((str(store), StoreState(
            "stale", f"{len(other)} of its cells {other[first]} (first: {sweep.name_of(first)})")))
    if retry_requested(sweep) or record.get("numerics_version") != _numerics_version():
        # A failure is final for its numerics: retried when they change, or on request.
        problems += [(f"{store}:{cid}", StoreState("failed", str(error)))
                     for cid, error in sorted((record.get("failed") or {}).items())]
        if retry_requested(sweep) and state.ok:
            problems += [(f"{store}:{cid}", StoreState("failed", str(line)))
                         for cid, line in sorted((record.get("seed_failures") or {}).items())]
    return problems


def _changed_cells(new: int, held: int, dropped: int) -> str:
    """How the start-up line (``damage_line``) says what befell a batch whose manifest lacks ``new`` of its
    cells, records ``held`` of them and ``dropped`` cells the batch no longer has."""
    if not dropped:  # a value added to a grid axis (or a refined point)
        return f"gained {cells_phrase(new)} (its store holds the other {held})"
    # Cells a removed value left stay in the store (run_batch), off the grid: not a change by themselves.
    return (f"changed (its store holds {held} of its {new + held} cells, and keeps {dropped} it no longer "
            "has, off the grid: a grid value added, edited, or written for another config or input file)")


def damage_line(sweep: Sweep, batch: str, path: str, state: StoreState) -> str:
    """The line the workflow prints at its start for one problem ``issue_repairs`` found: what was found
    and what the run does about it (a dry run prints the same)."""
    if state.status == "changed":
        return f"attnflow: batch {batch} {state.detail}: it runs, computing only the cells its store lacks"
    # A store's path names its batch: the batch is not named again.
    if state.status == "replaced":
        return (f"attnflow: {path} was {state.detail.split(';')[0]}: intact, its job records it again "
                "(nothing recomputed)")
    if state.status == "failed":
        return f"attnflow: retrying {sweep.name_of(path.rsplit(':', 1)[1])}: {_short_error(state.detail)}"
    return (f"attnflow: {path} is {state.status}" + (f" ({state.detail})" if state.detail else "")
            + ": its job recomputes it")


def unhealthy(sweep: Sweep, checksums: bool = False) -> dict[str, list[tuple[str, StoreState]]]:
    """Batches whose store is now missing, does not match its record, or is stale (written under
    another numerics version), or that have a failed cell: batch -> problems (``batch_health``).

    One manifest read and one ``stat`` per batch, whatever the number of cells:
    cheap enough for every start of the workflow; ``checksums`` reads every byte
    (``attnflow status``, which so finds bit rot). A batch without a manifest runs
    anyway. A failure the numbers decide (a cell that failed whole, seeds stored
    as failed) is not retried: the same cell under the same numerics fails the
    same way. It is retried when the numerics version changes (its manifest
    records the one it failed under), with its cell (a new ``max_steps`` is a new
    cell), or once per run with ``retry_failures`` set (the ticket is tied to the
    manifest's time, which the retry renews).
    """
    found = {}
    summarised = None  # the batches current summaries were built from: looked for once, if needed
    for batch in sweep.batches:
        record = read_manifest(sweep, batch)
        if record is None:
            summarised = _summarised_batches(sweep) if summarised is None else summarised
            problems = orphan_health(sweep, batch, checksums, summarised)
        else:
            problems = batch_health(sweep, batch, record, checksums)
        if problems:
            found[batch] = problems
    return found


def orphan_health(sweep: Sweep, batch: str, checksums: bool = False,
                  summarised: set[str] | None = None) -> list[tuple[str, StoreState]]:
    """A batch without a manifest that ran before (its store, a killed job's checkpoints or a summary
    built from it are there): what is wrong with its store, as ``batch_health`` says it. Snakemake deletes
    the manifest of a job that failed or was killed, so nothing else remembers that this batch needs
    its job: without a ticket a store missing or damaged then is never recomputed. A store holding
    every cell of the batch is left to ``outdated_summaries``; a batch that never ran has nothing wrong.
    ``summarised``: ``_summarised_batches(sweep)``, if the caller has it."""
    store = sweep.layout.store(batch)
    if not store.exists() and not store.is_symlink():
        ran = _ran_before(sweep, batch, _summarised_batches(sweep) if summarised is None else summarised)
        return [(str(store), StoreState("missing", "its manifest too"))] if ran else []
    state = verify_batch(store, checksums=checksums)
    if not state.ok:
        return [(str(store), StoreState(state.status, f"{state.detail}; its manifest is missing",
                                        state.damaged))]
    held = set(record_of(store).get("cells") or ())
    ids = set(cell_id(c) for c in sweep.batches[batch])
    if ids - held:
        return [(str(store), StoreState("changed", f"has no manifest, and its store holds {len(ids & held)} "
                                                   f"of its {len(ids)} cells"))]
    return []


def _summarised_batches(sweep: Sweep) -> set[str]:
    """The batches whose stores a summary on disk read, of every experiment whose summary was built from
    this config's very grid (one metadata read per summary; none without summaries). Only those it
    read (``stores`` in its attrs): a grid edited elsewhere can move a shared cell from another
    experiment's batch into a new batch of this one, which never ran."""
    out: set[str] = set()
    for name, spec in sweep.specs.items():
        attrs = root_attrs(sweep.layout.summary(name))
        if attrs.get("experiment_spec") != spec.to_json():
            continue
        batches = sweep.batches_of(name)
        if "stores" in attrs:  # else (none recorded): every batch of its grid, as before summaries said
            read = {Path(p).name for p in str(attrs["stores"]).split(", ")}
            batches = [b for b in batches if sweep.layout.store(b).name in read]
        out.update(batches)
    return out


def _ran_before(sweep: Sweep, batch: str, summarised: set[str]) -> bool:
    """Whether a batch with neither manifest nor store ran before: a killed job left checkpoints, or a
    summary on disk was built from this config's very grid, so from this batch's cells (``summarised``:
    ``_summarised_batches``). A batch that never ran (a value added to an axis) runs anyway; a ticket
    for it would only rerun it later for nothing if that edit is undone."""
    return batch in summarised or sweep.layout.pending(batch).exists()


def _ids_of_today(cells, record: dict) -> dict:
    """A manifest or store ``record`` with the cells it holds under the ids they had while the engine was
    part of ids (``ids._id_with_engine``: stores of 2026-12-04/05) renamed to today's ids: the next job
    takes them so (``run_batch``), computing nothing, so status and plan count them done, not missing."""
    held = record.get("cells") or {}
    renamed = {old: cid for cell in cells
               if (old := _id_with_engine(cell)) in held and (cid := cell_id(cell)) not in held}
    if not renamed:
        return record
    return {**record, **{key: {renamed.get(k, k): v for k, v in record[key].items()}
                         for key in ("cells", "engines", "engine_numerics")
                         if isinstance(record.get(key), dict)}}


def every_seed_failed(line: str | None) -> bool:
    """Whether a cell's ``seed_failures`` line (``"3 of 3 seeds failed: ..."``, simulation's
    ``_failure_summary``) says that every seed failed: the cell is stored, but holds no number to use."""
    match = re.match(r"(\d+) of (\d+) seeds failed", line or "")
    return bool(match) and match[1] == match[2]


def cell_states(sweep: Sweep, checksums: bool = False) -> dict[str, StoreState]:
    """Every cell of the sweep -> its state: done | missing | failed (its error as detail) | corrupt |
    interrupted (finished by a job that was killed before writing its batch's store) | stale (its store
    written under another numerics version, or the cell computed by another engine than it names:
    ``other_engines``). A done cell's detail says when its store
    was touched since its manifest (intact: the next run records it).

    Per batch, not per cell: its manifest, one ``stat`` of its store (every byte with
    ``checksums``), one look for a killed job's pending cells. A 100,000-cell sweep in
    a thousand batches is a few thousand file operations.
    """
    states: dict[str, StoreState] = {}
    for batch, cells in sweep.batches.items():
        store = sweep.layout.store(batch)
        record = read_manifest(sweep, batch)
        failed: dict = {}
        other: dict = {}
        if not record:  # never finished, its manifest deleted or unreadable: what its store holds, if any
            stored = _ids_of_today(cells, record_of(store))
            held = stored.get("cells") or {}
            state = verify_batch(store, checksums=checksums) if held else StoreState("missing")
            other = other_engines(sweep, batch, stored)
        elif record.get("format") != MANIFEST_FORMAT:
            held, state = {cell_id(c): "" for c in cells}, batch_health(sweep, batch, record)[0][1]
        else:
            record = _ids_of_today(cells, record)
            held, failed = record["cells"], record["failed"]
            state = store_health(sweep, batch, record, checksums)
            other = other_engines(sweep, batch, record)
        seed_lines = (record or {}).get("seed_failures") or {}
        pending = set()  # cells a killed job checkpointed (rarely any: one listing)
        if sweep.layout.pending(batch).exists():
            for checkpoint in sweep.layout.pending(batch).iterdir():
                pending.update(record_of(checkpoint).get("cells") or ())
        for cell in cells:
            cid = cell_id(cell)
            if cid in held:
                intact = (state.status == "corrupt" and state.damaged and "" not in state.damaged
                          and held[cid] not in state.damaged)  # its group is intact: the next run keeps it
                if state.status == "replaced":  # every byte checked: done, and said so
                    states[cid] = StoreState("done", f"{store.name}: {state.detail}")
                else:
                    states[cid] = StoreState("done") if intact else state
                if states[cid].ok and cid in other:
                    states[cid] = StoreState("stale", other[cid])
                if states[cid].ok and every_seed_failed(seed_lines.get(cid)):  # stored, but nothing to use
                    states[cid] = StoreState("failed", seed_lines[cid])
            elif cid in failed:
                states[cid] = StoreState("failed", str(failed[cid]))
            elif cid in pending:
                states[cid] = StoreState("interrupted", f"finished by a killed job of batch {batch}")
            else:
                states[cid] = StoreState("missing")
    return states


__all__ = ["batch_health", "cell_states", "damage_line", "every_seed_failed", "orphan_health",
           "other_engines", "store_health", "unhealthy"]
