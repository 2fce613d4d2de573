"""What the Snakemake workflow asks of the package: the validated sweep, job parameters, store health.

``workflow/rules/common.smk`` calls these at parse time; the rule scripts call
``simulate_job``, ``aggregate_job`` and ``plot_job``. Keeping the logic here
makes it testable without Snakemake.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path

from . import jobparams
from .config import load as load_config
from .config import validate
from .errors import ConfigError
from .layout import Layout, results_of
from .spec import Spec
from .store import StoreState, record_of, root_attrs, verify
from .sweep import (
    Sweep,
    _id_with_engine,
    cell_id,
    cells_phrase,
    config_digest,
    engine_staleness,
    recorded_engine_numerics,
    recorded_engines,
    summary_versions,
    verify_batch,
)
from .version import __version__

MANIFEST_FORMAT = 2  # 1: attnflow 0.1, a store per cell (its manifests listed them under "stores")


def sweep_from_workflow(config: dict, configfiles=()) -> Sweep:
    """Validate the config Snakemake loaded; its files are re-read strictly (duplicate keys refused).
    The last config file names the results directory of a config without ``results``."""
    configfiles = list(configfiles)
    for path in configfiles:
        load_config(path)
    return validate(config, configfile=configfiles[-1] if configfiles else None)


# --- which config a results directory belongs to --------------------------------------------------------
# A config's identity: where its file is and what identifies its grids. Editing a config keeps its file (the
# same config, changed); two working copies of one config hold the same grids (they may share results); a
# project moved or copied with its results keeps its config where it was beside them (the same relative path).
# Run-time switches (where results go, share_results, retry_failures, the dask scheduler, the figures' width)
# and the order of keys identify nothing.
GRID_KEYS = ("experiments", "defaults", "experiment_modules")


def grids_digest(config: dict) -> str:
    """SHA-256 of what identifies a config's grids (``GRID_KEYS``, keys in any order), nothing else."""
    return config_digest({key: config.get(key) for key in GRID_KEYS})


def _legacy_digest(config: dict) -> str:
    """The digest owner records written before 2026-12-07 hold: the content but for ``results`` and
    ``share_results`` (run-time switches included)."""
    return config_digest({k: v for k, v in config.items() if k not in ("results", "share_results")})


def _beside(configfile: Path, results: Path) -> str:
    """The config's path from its results directory, both resolved: what a moved project keeps."""
    return os.path.relpath(configfile.resolve(), Path(results).resolve())


def config_identity(sweep: Sweep, configfile: str | Path | None) -> dict:
    """What ``Layout.owner`` records of the config a run uses: its name as given, its resolved path, that
    path from the results directory, and the digest of what identifies its grids (``grids_digest``)."""
    return {"config": str(configfile) if configfile else None,
            "path": str(Path(configfile).resolve()) if configfile else None,
            "from_results": _beside(Path(configfile), sweep.results) if configfile else None,
            "grids_sha256": grids_digest(sweep.config),
            "config_sha256": _legacy_digest(sweep.config)}


class UnreadableOwner(ValueError):
    """A results directory's owner record exists but is no record: truncated, empty, not a mapping."""


def owner_of(results: str | Path) -> dict | None:
    """The config recorded as the owner of a results directory; None when no record is there.
    Raises ``UnreadableOwner`` for a record that cannot be read: a damaged record names no owner,
    and is no licence to take the directory over."""
    path = Layout(results).owner
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UnreadableOwner(f"{path} cannot be read ({err})") from None
    if not isinstance(record, dict) or not {"path", "config_sha256", "grids_sha256"} & set(record):
        raise UnreadableOwner(f"{path} is not an owner record ({json.dumps(record)[:60]})")
    return record


def claim_results(sweep: Sweep, configfile: str | Path | None) -> None:
    """Record this run's config as the results directory's owner (a run, never a dry run, writes it)."""
    path = sweep.layout.owner
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(config_identity(sweep, configfile), indent=1) + "\n")
    os.replace(tmp, path)


def would_drop(sweep: Sweep) -> tuple[dict[str, int], list[str]]:
    """What this sweep's run would take from its results directory as another config left it: per batch
    of the same name, the cells its manifest records that this sweep's batch does not hold (kept in the
    store off the grid, out of the summaries); the experiments whose summary (and figure) was built from
    another grid."""
    cells = {}
    for batch, batch_cells in sweep.batches.items():
        record = read_manifest(sweep, batch) or {}
        recorded = set(record.get("cells") or ()) | set(record.get("failed") or ())
        lost = recorded - {cell_id(c) for c in batch_cells}
        if lost:
            cells[batch] = len(lost)
    summaries = [name for name, spec in sweep.specs.items() if sweep.layout.summary(name).exists()
                 and root_attrs(sweep.layout.summary(name)).get("experiment_spec") != spec.to_json()]
    return cells, summaries


def same_config(owner: dict, ours: dict) -> bool:
    """Whether an owner record names this config: the same file (paths resolved: ``b/../a/c.yaml`` and a
    symlinked folder are one file), the same file beside its results (a project moved or copied whole),
    or the same grids (a copy of the config, or one run with other run-time switches)."""
    recorded = owner.get("path")
    if recorded and ours["path"] and (recorded == ours["path"] or _resolved(recorded) == ours["path"]):
        return True
    if owner.get("from_results") and owner.get("from_results") == ours["from_results"]:
        return True
    return (owner.get("grids_sha256") == ours["grids_sha256"]
            or owner.get("config_sha256") == ours["config_sha256"])


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a symlink loop: compared as written
        return path


def foreign_owner(sweep: Sweep, configfile: str | Path | None) -> str | None:
    """Why this run must not use its results directory, or None when it may (the message names the other
    config, what this run would drop and how to go on). Refused, unless the config says
    ``share_results: true``: another config owns it (``Layout.owner``); its owner record cannot be read
    (never a takeover); no record is there but the directory holds what this run would drop (the record
    deleted, or left by another config's run)."""
    if sweep.config.get("share_results"):
        return None
    name = str(configfile) if configfile else "this config"
    take_over = (f"take the directory over with `share_results: true` in {name} or "
                 "`--config share_results=True`")
    try:
        owner = owner_of(sweep.results)
    except UnreadableOwner as err:
        return (f"results directory {sweep.results}: its owner record {err}, so which config owns the "
                f"directory is unknown; if {name} does, delete {sweep.layout.owner} (the next run records "
                f"{name} as its owner), else restore it; or {take_over}")
    ours = config_identity(sweep, configfile)
    if owner is not None and same_config(owner, ours):
        return None
    cells, summaries = would_drop(sweep)
    dropped = []
    if cells:
        first = sorted(cells)[0]
        # Stores keep cells off the grid (run_batch), but the summaries and figures leave them out.
        dropped.append(f"{sum(cells.values())} of its cells from the summaries of {len(cells)} stores "
                       f"(first: {first}, {cells[first]} cell{'s' if cells[first] > 1 else ''}; they stay "
                       "stored, off the grid)")
    if summaries:
        dropped.append(f"its summaries and figures of {', '.join(summaries)}")
    if owner is None:  # no record: what the directory holds decides (older attnflow wrote none)
        if not dropped:
            return None
        return (f"results directory {sweep.results} has no owner record ({sweep.layout.owner} deleted, or "
                f"never written) and holds results of other grids: {name} running there would drop "
                f"{' and '.join(dropped)}. Give {name} its own `results:`, or {take_over}")
    what = " and ".join(dropped) or "no cell or summary of it yet, but would take the directory over"
    return (f"results directory {sweep.results} belongs to config {owner.get('config')} (digest "
            f"{str(owner.get('grids_sha256') or owner.get('config_sha256'))[:12]}, recorded in "
            f"{sweep.layout.owner}); {name} running there would drop {what}. Give {name} its own "
            f"`results:` (or leave it out: results/<its file name>), or {take_over}, or delete "
            f"{sweep.results}")


class ResultsBusy(RuntimeError):
    """Another workflow controller holds the results directory's lock."""


# The locks this process holds, by lock path: open file descriptions, kept for the process's lifetime.
_HELD: dict[Path, int] = {}
# A controller that runs the workflow itself (``attnflow refine``) passes its lock's file descriptor to
# the ``snakemake`` it starts under this name: the same open file description, so the child holds it too.
LOCK_FD_ENV = "ATTNFLOW_RESULTS_LOCK_FD"


def lock_results(results: str | Path) -> Path:
    """Take the results directory's exclusive lock for the rest of this process; return the lock's path.

    Two controllers on one results directory would each run every job (Snakemake's
    own lock is per working directory, and two working copies share results), and
    one's summary would overwrite the other's. So the workflow's main process takes
    ``Layout.lock`` (``flock``, released by the kernel when the process ends, even
    when killed) and a second controller fails at once, naming the holder. Taking
    it again in the same process, or in a ``snakemake`` started by a holder that
    passed its descriptor (``LOCK_FD_ENV``), is a no-op. Raises ``ResultsBusy``.
    """
    path, fd = _acquire(results)
    if fd is None:
        raise ResultsBusy(_busy_message(results, path))
    _HELD[path.resolve()] = fd
    return path


def results_holder(results: str | Path) -> str | None:
    """``"pid N on host"`` of another controller holding the results directory's lock, else None.

    Takes nothing and writes nothing: the workflow asks at parse time (before it
    knows whether it is a dry run) so that it issues no repair tickets under a
    running controller, and a dry run leaves the results directory as it found it
    (the lock file's bytes and time included). Creates nothing where no lock file is.
    """
    path = Layout(results).lock
    if not path.exists() or path.resolve() in _HELD or _inherited_lock(path) is not None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)  # flock needs no write access: the file is not touched
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # the lock, if it was free and so taken, goes with it
    return None


def _acquire(results: str | Path) -> tuple[Path, int | None]:
    """The lock's path and a descriptor holding it (this process's, an inherited one, or a new one
    with this process's id written in it), or None while another process holds it."""
    path = Layout(results).lock
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.resolve() in _HELD:
        return path, _HELD[path.resolve()]
    inherited = _inherited_lock(path)
    if inherited is not None:  # this process's already (its parent's, shared): never closed here
        _HELD[path.resolve()] = inherited
        return path, inherited
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return path, None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    return path, fd


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "a process that has not written its id yet"
    except OSError:
        return "a process that has not written its id yet"


def _busy_message(results: str | Path, path: Path) -> str:
    return (f"results directory {Path(results).absolute()} is in use by another attnflow controller "
            f"({_holder(path)}; lock {path}): two controllers would run every job twice and overwrite "
            "each other's summaries; wait for it to finish or stop it")


def release_results(results: str | Path) -> None:
    """Give up the lock ``lock_results`` took (``refine`` holds it only while it runs)."""
    fd = _HELD.pop(Layout(results).lock.resolve(), None)
    if fd is not None:
        os.close(fd)  # the last descriptor of the open file description: the lock goes with it


def lock_for_child(results: str | Path) -> tuple[dict[str, str], tuple[int]]:
    """``(environment additions, pass_fds)`` under which a ``snakemake`` this process starts (it holds
    the lock, see ``lock_results``) shares the lock instead of failing on it."""
    fd = _HELD[Layout(results).lock.resolve()]
    return {LOCK_FD_ENV: str(fd)}, (fd,)


def _inherited_lock(path: Path) -> int | None:
    """The descriptor named by ``LOCK_FD_ENV`` if it is this lock file and holds its lock."""
    try:
        fd = int(os.environ[LOCK_FD_ENV])
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by this open file description: succeeds
            return fd
    except (KeyError, ValueError, OSError):
        pass
    return None


def read_manifest(sweep: Sweep, batch: str) -> dict | None:
    """A batch's manifest: None if it has none; ``{}`` if it has one that is unreadable or not what a
    simulate job writes (``batch_health`` sends such a batch to run again)."""
    path = sweep.layout.manifest(batch)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if _well_formed(record) else {}


def _well_formed(record) -> bool:
    """A manifest as ``simulate_job`` writes it (of either format: the old one is stale, not damaged)."""
    if not isinstance(record, dict):
        return False
    if record.get("format") != MANIFEST_FORMAT:
        return "stores" in record
    return (isinstance(record.get("cells"), dict) and isinstance(record.get("failed"), dict)
            and all(isinstance(record.get(k), int) for k in ("size", "mtime_ns") if record.get("cells")))


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
    version of its own numbers: cell id -> why (``sweep.engine_staleness``). A cell of ``engine: auto``
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


def _short_error(error: str) -> str:
    """A cell's error without the ``cell(...): `` it starts with (the line names its grid point)."""
    return error.split("): ", 1)[1] if error.startswith("cell(") and "): " in error else error


def _numerics_version() -> int:
    from .numerics import NUMERICS_VERSION

    return NUMERICS_VERSION


# The config key (``snakemake --config retry_failures=True``) that computes known failures again.
RETRY_KEY = "retry_failures"


def retry_requested(sweep: Sweep) -> bool:
    """Whether the config asks to compute the known failures again (``RETRY_KEY``)."""
    return bool(sweep.config.get(RETRY_KEY))


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


def _orphaned(sweep: Sweep, batch: str, summarised: set[str]) -> bool:
    """A batch that ran (``_ran_before``, or its store is there) but whose manifest is gone."""
    if sweep.layout.manifest(batch).exists():
        return False
    store = sweep.layout.store(batch)
    return store.exists() or store.is_symlink() or _ran_before(sweep, batch, summarised)


def _runs_anyway(sweep: Sweep, batch: str) -> bool:
    """Whether Snakemake reruns a batch by itself: no manifest, or one that lacks some of its cells is
    rerun through its parameters (a value added to an axis)."""
    record = read_manifest(sweep, batch)
    if not record or record.get("format") != MANIFEST_FORMAT:
        return True
    recorded = set(record["cells"]) | set(record["failed"])
    return any(cell_id(c) not in recorded for c in sweep.batches[batch])


def _ids_of_today(cells, record: dict) -> dict:
    """A manifest or store ``record`` with the cells it holds under the ids they had while the engine was
    part of ids (``sweep._id_with_engine``: stores of 2026-12-04/05) renamed to today's ids: the next job
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


def find_repairs(sweep: Sweep, checksums: bool = False) -> tuple[dict[str, list[tuple[str, StoreState]]],
                                                                    dict[str, str]]:
    """The damage of every finished batch with a damaged store (``unhealthy``) and the repair tickets it
    calls for (path -> text), written by nobody yet.

    A ticket (``<what>-<digest>.ticket`` in ``Layout.repairs(batch)``, the damage as JSON;
    ``<what>`` is what the dry run's reason then shows, say ``store-missing``) is an
    input of the batch's simulate job, newer than its manifest: Snakemake reruns the
    job, which recomputes the damaged stores alone. The workflow's ``ticket`` rule
    writes it, as the run's first job: a dry run lists that job and writes nothing.
    The digest covers the damage and the manifest's time, so a run stopped after
    writing a ticket finds it again, and a later damage gets a new one. Tickets
    stay as a record of what was healed. ``checksums``: every byte read
    (``attnflow status``, which writes its tickets itself: ``issue_repairs``).
    """
    damage = unhealthy(sweep, checksums)
    tickets = {}
    for batch, problems in damage.items():
        manifest = sweep.layout.manifest(batch)
        seen = manifest.stat().st_mtime_ns if manifest.exists() else None
        what = "+".join(dict.fromkeys(map(_repair_word, problems)))
        tickets.update([_ticket(sweep.layout.repairs(batch), what, {
            "manifest_mtime_ns": seen,
            "stores": [{"path": p, "status": s.status, "detail": s.detail} for p, s in problems]})])
    return damage, tickets


def issue_repairs(sweep: Sweep, checksums: bool = False) -> dict[str, list[tuple[str, StoreState]]]:
    """Write the repair tickets ``find_repairs`` finds, now (``attnflow status``: bit rot the workflow's
    start-up check cannot see); return the damage."""
    damage, tickets = find_repairs(sweep, checksums)
    for path, text in tickets.items():
        write_ticket(path, text)
    return damage


def _repair_word(problem: tuple[str, StoreState]) -> str:
    """What a repair ticket's name says of one problem (``issue_repairs``)."""
    state = problem[1]
    if state.status == "changed":
        return "cells-added" if state.detail.startswith("gained") else "cells-changed"
    return {"failed": "failure-retried"}.get(state.status, f"store-{state.status}")


def _summary_word(why: str) -> str:
    """What a summary ticket's name says of why it is outdated (``outdated_summaries``)."""
    if why.startswith("built from batch"):
        return "manifest-missing"
    if why.startswith("built from another grid"):
        return "grid-changed"
    return f"summary-{why.split()[0]}"  # missing, corrupt, stale...


def _ticket(directory: Path, what: str, record: dict) -> tuple[str, str]:
    """``(<directory>/<what>-<digest of record>.ticket, its text)``: ``what`` (say ``store-missing``) names
    the ticket where Snakemake's reason for its job shows it."""
    text = json.dumps(record, indent=1, sort_keys=True)
    return str(directory / f"{what}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.ticket"), text


def write_ticket(path: str | Path, text: str) -> None:
    """Write a ticket unless it is there (a run stopped after writing it, or ``attnflow status``): its
    name is the digest of its text, and a ticket rewritten would be newer than the job it reran."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)  # never a half-written ticket


def outdated_summaries(sweep: Sweep, checksums: bool = False) -> dict[str, str]:
    """Experiments whose summary must be rebuilt (with its figure) where Snakemake sees nothing to do.

    Snakemake compares times, not versions or bytes, and does not rerun a job
    for an intermediate file deleted under an output that stays. So: a summary
    damaged (its members against its completion record: sizes, or every byte
    with ``checksums``, as ``attnflow status --deep`` reads them); built under
    another numerics or reduction version (stale); deleted while its figure
    stays; the manifest of a batch that ran (``_orphaned``) deleted while the
    summary stays; built from another grid than the config's while no batch of
    it reruns by itself (another config's summary on a shared results
    directory, say). Returns experiment -> why; each gets a ticket
    (``issue_summary_tickets``).
    """
    found = {}
    summarised = _summarised_batches(sweep)
    for name, spec in sweep.specs.items():
        summary = sweep.layout.summary(name)
        if summary.exists():
            state = verify(summary, checksums=checksums, expect=summary_versions(sweep.experiments.get(name)))
            batches = sweep.batches_of(name)
            gone = [b for b in batches if _orphaned(sweep, b, summarised)]
            if not state.ok:
                found[name] = f"{state.status} ({state.detail})"
            elif gone:
                found[name] = f"built from batch {gone[0]}, whose manifest is missing"
            elif (root_attrs(summary).get("experiment_spec") != spec.to_json()
                  and not any(_runs_anyway(sweep, b) for b in batches)):
                # Built from another grid (fewer cells, or the same cells in another block), with no
                # batch to rerun: Snakemake sees that only in its records of the job's parameters, which
                # another working copy (or a results directory copied in) does not have.
                found[name] = "built from another grid (or fixed fields) than this config's"
        elif any(p.exists() for p in sweep.layout.figures(name)):
            found[name] = "missing while its figure stays"
    return found


def leaving_points(sweep: Sweep) -> dict[str, tuple[list[dict], dict[str, list]]]:
    """Per experiment whose summary on disk holds grid points its grid no longer has: those points'
    coordinates and the axis values removed (axis -> values; none where only extra points left). The
    rebuilt summary leaves them out; their cells stay in their stores (``run_batch``). One metadata
    read per summary, and only a summary built from another grid is read further."""
    out = {}
    for name, spec in sweep.specs.items():
        recorded = root_attrs(sweep.layout.summary(name)).get("experiment_spec")
        if not recorded or recorded == spec.to_json():
            continue
        try:
            old = Spec.from_json(name, recorded)
            points = list(old.coordinates())
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a spec of another attnflow's making: rebuilt all the same, said by no line
        now = {_coords_key(coords) for coords in spec.coordinates()}
        gone = [coords for coords in points if _coords_key(coords) not in now]
        if gone:
            values = {axis: [v for v in old.grid[axis] if _coords_key({axis: v}) not in
                             {_coords_key({axis: w}) for w in spec.grid.get(axis, ())}]
                      for axis in old.grid if axis in spec.grid}
            out[name] = (gone, {axis: vs for axis, vs in values.items() if vs})
    return out


def _coords_key(coords: dict) -> str:
    """A grid point as text, equal for equal values (1 and 1.0 alike, as cells normalise them)."""
    def plain(value):
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    return json.dumps({k: plain(v) for k, v in coords.items()}, sort_keys=True, default=str)


def leaving_line(name: str, points: list[dict], values: dict[str, list]) -> str:
    """The start-up line (a dry run's too) on the grid points that leave an experiment's summary
    (``leaving_points``): by the values removed, else by the first points."""
    from .sweep import _plain, grid_point_name

    if values:
        what = "; ".join(f"{axis} = {', '.join(map(_plain, vs))} removed" for axis, vs in values.items())
    else:
        what = "; ".join(grid_point_name(name, c) for c in points[:2]) + ("; ..." if len(points) > 2 else "")
    return (f"attnflow: {len(points)} grid point{'s' if len(points) > 1 else ''} of {name} leave its summary "
            f"and figure ({what}): their cells stay stored, off the grid; put back, they are not computed "
            "again")


def off_grid_cells(sweep: Sweep) -> dict[str, dict[str, int]]:
    """The stored cells no grid of this sweep has (values removed from a grid, kept so that putting them
    back computes nothing: ``run_batch``), by experiment: store name -> how many. From the manifests
    alone (one small file per batch, this sweep's or not)."""
    from .sweep import batch_experiment

    ours = set(sweep.owner)
    out: dict[str, dict[str, int]] = {}
    for manifest in sorted(sweep.layout.manifests.glob("*.json")):
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # unreadable: its batch's health says so
        cells = record.get("cells") if isinstance(record, dict) else None
        if not isinstance(cells, dict) or not isinstance(record.get("store"), str):
            continue
        count = sum(cid not in ours for cid in cells)
        if count:
            out.setdefault(batch_experiment(manifest.stem), {})[record["store"]] = count
    return out


def find_summary_repairs(sweep: Sweep, checksums: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """Every outdated summary (``outdated_summaries``: experiment -> why) and the ticket each calls for
    (path -> text), written by nobody yet: an input of its aggregate and plot jobs, newer than both, so
    Snakemake rebuilds the summary and its figure (and first any batch whose manifest is missing). The
    workflow's ``ticket`` rule writes them as the run starts, as it does repair tickets (``find_repairs``)."""
    found = outdated_summaries(sweep, checksums)
    tickets = {}
    for name, why in found.items():
        # The times of the summary and figures: the same damage again, after a rebuild, gets a
        # new ticket (newer than what the rebuild wrote).
        outputs = (sweep.layout.summary(name), *sweep.layout.figures(name))
        seen = {p.name: p.stat().st_mtime_ns for p in outputs if p.exists()}
        tickets.update([_ticket(sweep.layout.summary_tickets(name), _summary_word(why),
                                {"experiment": name, "why": why, "mtime_ns": seen})])
    return found, tickets


def issue_summary_tickets(sweep: Sweep, checksums: bool = False) -> dict[str, str]:
    """Write the summary tickets ``find_summary_repairs`` finds, now (``attnflow status --deep``)."""
    found, tickets = find_summary_repairs(sweep, checksums)
    for path, text in tickets.items():
        write_ticket(path, text)
    return found


def figure_caption(sweep: Sweep, experiment: str) -> str:
    """The report caption of an experiment's figure: the experiment's, then the failed cells its
    summary lists (missing in the figure), read from the summary's attributes."""
    from .sweep import describe_failures

    caption = sweep.experiments.get(experiment).caption
    try:
        failed = json.loads(record_of(sweep.layout.summary(experiment)).get("failed_cells") or "[]")
    except (ValueError, TypeError):
        failed = []
    if not failed:
        return caption
    return f"{caption} Failed cells (missing in the figure): {describe_failures(failed)}."


def summary_tickets(results: str | Path, experiment: str, issued=()) -> list[str]:
    """Every ticket of an experiment's summary, written or ``issued`` (paths the ``ticket`` rule writes
    in this run): inputs of its aggregate and plot jobs."""
    return _tickets_in(Layout(results).summary_tickets(experiment), issued)


def repair_tickets(results: str | Path, batch: str, issued=()) -> list[str]:
    """Every repair ticket of a batch, written or ``issued``: inputs of its simulate job."""
    return _tickets_in(Layout(results).repairs(batch), issued)


def _tickets_in(directory: Path, issued) -> list[str]:
    """The tickets in ``directory`` and those of ``issued`` that go there: once written, a ticket stays an
    input of its job, whose set of inputs Snakemake would otherwise see change."""
    written = {str(p) for p in directory.glob("*.ticket")}
    return sorted(written | {p for p in issued if Path(p).parent == directory})


def batch_params(sweep: Sweep, batch: str, write: bool = True) -> str:
    """The simulate job's parameter: the digest naming the file of its cells as JSON (each cell's cached
    canonical JSON, the text ``json.dumps([cell.to_dict() ...], sort_keys=True)`` gives; see
    ``attnflow.jobparams``): it changes when, and only when, the batch's cells do."""
    text = "[" + ", ".join(cell.canonical_json() for cell in sweep.batches[batch]) + "]"
    return jobparams.put(sweep.layout, text, write)


def spec_params(sweep: Sweep, name: str, write: bool = True) -> str:
    """An aggregate job's parameter: the digest naming the file of its experiment's spec, as
    ``batch_params``."""
    return jobparams.put(sweep.layout, sweep.specs[name].to_json(), write)


def entries_params(sweep: Sweep, name: str, write: bool = True) -> str:
    """An aggregate job's parameter: the digest naming the file of its experiment's grid points
    (``Sweep.entries``: grid coordinates, store path, cell id), as ``batch_params``."""
    return jobparams.put(sweep.layout, json.dumps(sweep.entries(name)), write)


def provenance(config: dict) -> dict:
    """What stores and summaries record of their origin. Read inside the jobs, never a rule
    parameter: Snakemake reruns a job whose parameters change, and the digest changes with
    any edit of the config."""
    return {"config_sha256": config_digest(config), "attnflow_version": __version__}


@contextlib.contextmanager
def stop_on_sigterm():
    """Within: SIGTERM (SLURM's time limit or scancel, a user's kill) ends this process as an exception, as
    Ctrl-C does, instead of at once, so that ``run_batch`` checkpoints the cells it finished before the job
    exits (status 143, as a kill by SIGTERM). The signal lands when the engine next returns to Python
    (SLURM's SIGKILL follows after its KillWait). Outside the main thread, where no handler can be set,
    it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        print(f"attnflow: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def simulate_job(cells_params: str, batch: str, config: dict, output: str, log=print, gpu: int = 0):
    """Simulate the cells of a batch (``cells_params``: the digest ``batch_params`` gave) its store does not
    hold, then write its manifest: the cells its store holds, the store's size and time (what the
    start-up check compares), the cells that failed whole (errors by cell id), those holding failed
    seeds (their ``seed_failures`` line) and the numerics version they failed under. The job succeeds
    with failures: the numbers decide them, so the next run skips them (``known_failures``) until the
    cell or the numerics change. ``gpu``: the GPUs the job was given (its ``gpu`` resource), for which
    its large ``auto`` cells were planned on the JAX engine: a job given one where jax sees none fails,
    naming it, rather than compute them on numba (the stores would then be stale at every start). The
    manifest records each stored cell's engine."""
    from . import resources
    from .cell import Cell
    from .engines import engine_for
    from .sweep import cell_name, run_batch

    layout = Layout(results_of(config))
    cells = [Cell(**fields) for fields in json.loads(jobparams.get(layout, cells_params))]
    unmet = [c for c in cells if c.engine == "auto" and engine_for(c) != resources.job_engine(c, bool(gpu))]
    if unmet:
        raise RuntimeError(
            f"batch {batch} was given {gpu} GPU for {len(unmet)} cells of engine auto that the cost model "
            f"calls large (first: {cell_name(unmet[0], batch, config)}), but jax sees no GPU on "
            f"{socket.gethostname()}: install jax's GPU build there (pip install 'attnflow[jax-cuda]'), or "
            "run without `--resources gpu=...` to compute them on the numba engine")
    with stop_on_sigterm():
        result = run_batch(cells, batch, layout, log=log,
                           provenance={"batch": batch, **provenance(config)},
                           names={cell_id(c): cell_name(c, batch, config) for c in cells},
                           retry_failed=bool(config.get(RETRY_KEY)))
    stat = result.path.stat() if result.cells else None
    Path(output).write_text(json.dumps({
        "format": MANIFEST_FORMAT,
        "batch": batch,
        "store": result.path.name if result.cells else None,
        "size": stat.st_size if stat else None,
        "mtime_ns": stat.st_mtime_ns if stat else None,
        "cells": result.cells,
        "failed": result.failed,
        "seed_failures": result.seed_failures,
        "engines": result.engines,
        "engine_numerics": result.engine_numerics,
        "numerics_version": _numerics_version(),
    }, indent=1))


def recorded_failures(sweep: Sweep) -> tuple[dict[str, str], dict[str, str]]:
    """What the batches' manifests record, each manifest read once: the cells that failed whole (cell id
    -> error) and the stored cells holding failed seeds (cell id -> how many seeds failed and why)."""
    whole, seeds = {}, {}
    for batch in sweep.batches:
        record = read_manifest(sweep, batch) or {}
        for key, found in (("failed", whole), ("seed_failures", seeds)):
            if isinstance(record.get(key), dict):
                found.update(record[key])
    return whole, seeds


def failed_cells(sweep: Sweep) -> dict[str, str]:
    """Every cell the batches' manifests record as failed whole: cell id -> error."""
    return recorded_failures(sweep)[0]


def seed_failed_cells(sweep: Sweep) -> dict[str, str]:
    """Every stored cell the batches' manifests record as holding failed seeds: cell id -> the line
    saying how many seeds failed and why."""
    return recorded_failures(sweep)[1]


def _cells_by_id(sweep: Sweep) -> dict:
    return {cell_id(c): c for cells in sweep.batches.values() for c in cells}


def failure_lines(sweep: Sweep, failures: tuple[dict, dict] | None = None) -> list[str]:
    """One line per failure, by grid point, with its remedy: the cells that failed whole, then those
    holding failed seeds (what ``attnflow status`` and the end of a run print). ``failures``:
    ``recorded_failures(sweep)`` where the caller has read it already."""
    from .sweep import failure_remedy

    cells = _cells_by_id(sweep)
    whole, seeds = failures or recorded_failures(sweep)
    lines = []
    for kind, found in (("failed", whole), ("failed seeds", seeds)):
        for cid, error in sorted(found.items(), key=lambda item: sweep.name_of(item[0])):
            if cid in cells:
                short = _short_error(error)
                lines.append(f"{kind} {sweep.name_of(cid)}: {short}; {failure_remedy(cells[cid], short)}")
    return lines


def known_failures_notice(sweep: Sweep) -> str | None:
    """The one line a run starts with when it skips failures the numbers decided (None when none)."""
    if retry_requested(sweep):
        return None
    ids = _cells_by_id(sweep)
    recorded_whole, recorded_seeds = recorded_failures(sweep)
    whole = [cid for cid in recorded_whole if cid in ids]
    seeds = [cid for cid in recorded_seeds if cid in ids]
    if not whole and not seeds:
        return None
    parts = ([f"{cells_phrase(len(whole))} that failed"] if whole else []) + \
        ([f"{cells_phrase(len(seeds))} with failed seeds (stored as failed)"] if seeds else [])
    return (f"attnflow: skipping known failures: {' and '.join(parts)}; the same numbers fail the same way, "
            "so they are computed again only when their cell (say a larger max_steps), or the numerics "
            f"version changes; `attnflow status` names them; to force them: `snakemake --config "
            f"{RETRY_KEY}=True`")


def failure_report(sweep: Sweep) -> str | None:
    """The line a run ends with when cells or seeds failed (None when none did): how many, where (by
    grid point), and the first with its remedy."""
    whole, seeds = recorded_failures(sweep)
    lines = failure_lines(sweep, (whole, seeds))
    if not lines:
        return None
    ids = set(whole) | set(seeds)
    where = [f"{name} {sum(cell_id(p.cell) in ids for p in points)}" for name, points in sweep.points.items()
             if any(cell_id(p.cell) in ids for p in points)]
    counts = ([f"{len(whole)} cells failed"] if whole else []) + \
        ([f"{len(seeds)} cells hold failed seeds"] if seeds else [])
    first = lines[0]
    return (f"attnflow: {' and '.join(counts)} ({', '.join(where)} grid points; failed seeds are left out of "
            "the reductions, counted in the summaries and figures); `attnflow status` lists them; first: "
            f"{first if len(first) < 400 else first[:400] + '...'}")


def aggregate_job(name: str, spec_params: str, entries_params: str, output: str, scheduler: str,
                  config: dict, modules=(), retire=(), manifests=()):
    """Summarise one experiment from the stores its rule names (never re-derived from the config;
    the digests ``spec_params`` and ``entries_params`` gave); the errors of its
    failed cells come from the batches' ``manifests``."""
    from .aggregate import aggregate
    from .experiments import registry

    experiment = registry(modules).get(name)
    layout = Layout(results_of(config))
    entries = [tuple(entry) for entry in json.loads(jobparams.get(layout, entries_params))]
    failures = {}
    for path in manifests:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            failures.update(json.loads(Path(path).read_text()).get("failed") or {})
    spec = Spec.from_json(name, jobparams.get(layout, spec_params))
    return aggregate(experiment, spec, entries, output, scheduler=scheduler, provenance=provenance(config),
                     retire=retire, failures=failures)


def plot_job(summary_path: str, outputs, modules=(), width: float | None = None, part: str = ""):
    """Draw one figure (``part`` of its experiment's ``figures``) from the experiment's summary store
    (the spec comes from the summary), ``width`` inches wide (the config's ``figure_width``)."""
    from .experiments import registry
    from .figures import drawn_width, render
    from .plotting import TEXT_WIDTH
    from .store import open_verified

    width = TEXT_WIDTH if width is None else width
    with open_verified(summary_path, chunks=None) as summary:  # read whole: no dask (0.4 s of imports)
        summary = summary.load()
        experiment = registry(modules).get(summary.attrs["experiment"])
        drawn = drawn_width(experiment, width)
        if drawn > width:
            print(f"{experiment.name}: drawn {drawn:g} in wide, not figure_width = {width:g}: its panels "
                  "side by side have no layout narrower")
        render(summary, outputs, source=summary_path, experiment_modules=modules, width=width, part=part)


__all__ = ["LOCK_FD_ENV", "MANIFEST_FORMAT", "ConfigError", "ResultsBusy", "aggregate_job", "batch_health",
           "other_engines",
           "claim_results", "config_identity", "every_seed_failed", "foreign_owner", "grids_digest",
           "orphan_health", "owner_of",
           "same_config", "store_health", "UnreadableOwner",
           "would_drop",
           "batch_params", "cell_states", "damage_line", "entries_params", "failed_cells", "failure_lines",
           "failure_report",
           "figure_caption", "find_repairs", "find_summary_repairs", "issue_repairs",
           "issue_summary_tickets", "leaving_line", "leaving_points", "off_grid_cells", "write_ticket",
           "known_failures_notice", "lock_for_child", "lock_results",
           "RETRY_KEY",
           "retry_requested", "seed_failed_cells",
           "outdated_summaries",
           "plot_job", "provenance", "read_manifest", "recorded_failures", "release_results",
           "repair_tickets", "results_holder",
           "simulate_job", "spec_params", "stop_on_sigterm", "summary_tickets", "sweep_from_workflow",
           "unhealthy"]
