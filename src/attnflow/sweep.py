"""From a validated config to cells, batches and stores.

Nothing here checks a config: ``attnflow.config.validate`` does, and then calls
``Sweep.expand`` with what it resolved (this module never imports ``config``).
Given a config ``validate`` has not accepted, the functions here may fail with
whatever error the bad value causes (a ``Cell``'s own ``ValueError``, say).

Each experiment's grid is the Cartesian product of its axes; each cell's
store is named by a hash of all its fields, so adding a value to an axis adds
stores and changes none. Cells are grouped into batches (one simulation job
each): cells differing only along ``batch_over`` share one. A cell that
several experiments (or grid points) share is owned by exactly one batch, the
first that needs it, so one job writes it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .cell import Cell
from .layout import STORE_SUFFIX, Layout, results_of
from .pack import LAYOUT
from .spec import Spec
from .store import StoreState, write
from .store import verify as verify_store

if TYPE_CHECKING:
    import xarray as xr


def config_digest(config: dict) -> str:
    """SHA-256 of a config (as canonical JSON): the provenance tag of stores, summaries and figures."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def cell_id(cell: Cell) -> str:
    """Stable short name of a cell: a hash of every field but its engine (values normalised by
    ``Cell``) and of the content of any file it reads (so editing a weights file in place makes new
    stores). Two engines' results of one cell share its id; the store records the engine."""
    return _hashed(cell.identity_json() + cell.input_digest())  # the JSON cached on the cell


def _id_with_engine(cell: Cell) -> str | None:
    """The id a cell of a non-default engine had while the engine was part of ids (stores written
    from 2026-12-04 to 2026-12-05), None for a default one: ``run_batch`` takes such a cell from its store."""
    if cell.canonical_json() == cell.identity_json():
        return None
    return _hashed(cell.canonical_json() + cell.input_digest())


def cells_phrase(count: int) -> str:
    """"1 cell", "2 cells": how logs and messages count cells."""
    return f"{count} cell" + ("" if count == 1 else "s")


def _hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def store_versions() -> dict:
    """What a simulation store's completion record must hold to be current: the numerics version
    (``attnflow.engine.NUMERICS_VERSION``) and the stored layout (``attnflow.pack.LAYOUT``). A store
    written under another is ``stale``: another numerics' cells are computed again, another layout's
    are read and written again in this one (``run_batch``), nothing computed."""
    from .numerics import NUMERICS_VERSION

    return {"numerics_version": NUMERICS_VERSION, "store_layout": LAYOUT}


def summary_versions(experiment) -> dict:
    """What a summary's record must hold to be current: its stores' numerics version and its
    experiment's ``reduction_version``."""
    return {**store_versions(), "reduction_version": experiment.reduction_version}


def verify_batch(path: str | Path, *, checksums: bool = True) -> StoreState:
    """``store.verify`` of a batch's store, which is also ``stale`` when another numerics wrote it."""
    return verify_store(path, checksums=checksums, expect=store_versions())


def describe_failures(failed: list[dict]) -> str:
    """Failed grid points for a caption: ``coords (error)``, the error without the cell's repetition."""
    def short(error: str) -> str:
        return error.split("): ", 1)[1] if error.startswith("cell(") and "): " in error else error

    return "; ".join(", ".join(f"{k}={v}" for k, v in f["coords"].items()) + f" ({short(f['error'])})"
                     for f in failed)


def _plain(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def grid_point_name(experiment: str, coords: dict) -> str:
    """A grid point as a person reads it: ``beta_star (attention=usa, H=2, heads=block, n=4, beta=16)``."""
    if not coords:
        return experiment
    return f"{experiment} ({', '.join(f'{k}={_plain(v)}' for k, v in coords.items())})"


def batch_experiment(batch: str) -> str:
    """The experiment a batch belongs to: its name's first part (``_batch_key``)."""
    return batch.split("-", 1)[0]


def cell_name(cell: Cell, batch: str, config: dict) -> str:
    """A batch's cell named by its grid point (``grid_point_name``), from the config alone: the batch's
    experiment and the values of that experiment's grid axes (the fields a grid point sets). A simulate
    job names its cells so without expanding the sweep."""
    experiment = batch_experiment(batch)
    block = (config.get("experiments") or {}).get(experiment) or {}
    axes = list(block.get("grid") or {}) or [a for extra in block.get("extra_points") or () for a in extra]
    modules = tuple(config.get("experiment_modules") or ())
    axes = _axis_order(dict.fromkeys(axes), _default_axes(experiment, modules))
    return grid_point_name(experiment, {a: getattr(cell, a) for a in axes if hasattr(cell, a)})


@functools.lru_cache(maxsize=64)
def _default_axes(experiment: str, modules: tuple) -> tuple:
    """The axes of an experiment's default grid, in order (none for one the registry does not know)."""
    from .experiments import ExperimentModuleError, registry

    try:
        experiments = registry(modules)
    except (ExperimentModuleError, ValueError):  # the config's check names it; a name needs no order
        return ()
    return tuple(experiments.get(experiment).defaults.get("grid", {})) if experiment in experiments else ()


def failure_remedy(cell: Cell, error: str) -> str:
    """What to change for a failure the numbers decide (``error``: a seed's or a cell's), in words: the
    step budget, the tolerance, or the stiffness that caused it (the cost model's, ``resources``)."""
    from .resources import stiffness

    stiff = stiffness(cell)
    why = (f"{cell.attention} at beta = {cell.beta:g} is stiff (the cost model puts its steps at "
           f"{stiff:.3g}x a mild flow's)" if stiff > 100 else "")
    if "step budget" in error:
        fix = f"raise max_steps (now {cell.max_steps}) or loosen rtol (now {cell.rtol:g})"
        return f"{fix}; {why}: a lower beta or t_max is cheaper" if why else fix
    if "underflow" in error or "non-finite" in error or "left the sphere" in error:
        return (f"{why}: lower beta or t_max" if why else
                f"the flow overflows or blows up here: lower beta or t_max (now {cell.t_max:g})")
    return "see the error; `attnflow status` lists the failures"


def seed_footer(attrs) -> str:
    """``"5 of 48 seeds failed, at 3 grid points (left out)"``: a summary's failed seeds in one line
    ("" when none failed)."""
    failed = int(attrs.get("n_seeds_failed") or 0)
    if not failed:
        return ""
    points = int(attrs.get("n_points_with_failed_seeds") or 0)
    return (f"{failed} of {int(attrs.get('n_seeds') or 0)} seeds failed, at {points} grid point"
            f"{'s' if points != 1 else ''} (left out)")


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point of an experiment: its coordinates along the grid axes and its cell."""

    coords: dict
    cell: Cell


def resolve(config: dict, experiments) -> tuple[dict[str, Spec], dict[str, str]]:
    """Every experiment block resolved to its ``Spec``, and those experiments that cannot run on
    this machine (name -> the experiment's ``unavailable`` reason)."""
    specs, skipped = {}, {}
    for name, block in (config.get("experiments") or {}).items():
        experiment = experiments.get(name)
        spec = experiment.spec(block, config.get("defaults"))
        specs[name] = spec = dataclasses.replace(spec, grid=canonical_grid(spec.grid, experiment))
        reason = experiment.unavailable(spec)
        if reason:
            skipped[name] = reason
    return specs, skipped


def canonical_grid(grid: dict, experiment) -> dict:
    """A grid's axes in one order whatever the config's: those the experiment's default grid does not
    name first (by name), then the default grid's in its order (the shipped configs' order). The order
    of the grid points, so of a batch's cells and the batch's name, never depends on how a config lists
    its keys (a YAML formatter sorting them replans nothing)."""
    return {axis: grid[axis] for axis in _axis_order(grid, tuple(experiment.defaults.get("grid", {})))}


def _axis_order(axes, known: tuple) -> list:
    """``canonical_grid``'s order of ``axes``: those not in ``known`` by name, then ``known``'s in order."""
    return sorted(a for a in axes if a not in known) + [a for a in known if a in axes]


def point(spec: Spec, coords: dict) -> Point:
    """The grid point of a spec at ``coords``: its fixed fields and the coordinates, as a ``Cell``
    (whose own ``ValueError`` names a field it refuses)."""
    return Point(coords, Cell(**{**spec.fixed, **coords}))


def spec_points(spec: Spec) -> list[Point]:
    """The grid points of a resolved spec (the product, then any extra points, each once)."""
    return [point(spec, coords) for coords in spec.coordinates()]


def _batch_key(spec: Spec, coords: dict) -> str:
    key = {k: v for k, v in coords.items() if k not in spec.batch_over}
    label = "-".join(f"{k}{v}" for k, v in key.items()) or "all"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{spec.name}-{label}-{digest}" if len(label) < 60 else f"{spec.name}-{digest}"


class EngineConflict(ValueError):
    """Two experiments share a cell and name two engines for it (``attnflow.config`` reports it)."""


def _one_engine(held: Cell, held_by: str, other: Cell, other_by: str) -> Cell:
    """The cell two experiments share (one id: the engine is no part of it) as one engine computes it:
    the one an experiment names, where the other says ``auto`` (which takes either)."""
    if held.engine == "auto":
        return other
    if other.engine == "auto":
        return held
    raise EngineConflict(f"engine: experiments {held_by} ({held.engine}) and {other_by} ({other.engine}) "
                         "share cells, which are stored once and computed by one engine: give both the same "
                         "engine, or auto to one of them")


@dataclasses.dataclass
class Sweep:
    """A validated config: its experiments' specs and grid points, and the simulation batches."""

    config: dict
    experiments: object  # Registry[Experiment]
    specs: dict[str, Spec]
    points: dict[str, list[Point]]
    batches: dict[str, list[Cell]]  # batch name -> cells it owns (each cell id in one batch)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # experiment -> why it cannot run
    owner: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> the batch that owns it

    @classmethod
    def from_config(cls, config: dict, experiments) -> Sweep:
        """The sweep of a config ``attnflow.config.validate`` accepts (which is what callers should
        call: it checks the config first and returns this)."""
        specs, skipped = resolve(config, experiments)
        points = {name: spec_points(spec) for name, spec in specs.items() if name not in skipped}
        return cls.expand(config, experiments, specs, points, skipped)

    @classmethod
    def expand(cls, config: dict, experiments, specs: dict[str, Spec], points: dict[str, list[Point]],
               skipped: dict[str, str]) -> Sweep:
        """The sweep of checked specs: the ``skipped`` experiments left out, the others' grid points
        (``points``: name -> its points) grouped into batches, each cell owned by the first batch that
        needs it, the experiments taken by name: which batch owns a shared cell never depends on the order
        of the config's keys (sorting them, a YAML formatter's work, moves no cell)."""
        specs = {name: spec for name, spec in specs.items() if name not in skipped}
        batches: dict[str, list[Cell]] = {}
        owner: dict[str, str] = {}
        index: dict[str, int] = {}  # cell id -> its place in its batch's list
        for name, spec in sorted(specs.items()):
            keys: dict[tuple, str] = {}  # batch names by the coordinates they hold fixed (named once)
            for p in points[name]:
                cid = cell_id(p.cell)
                if cid not in owner:
                    fixed = tuple(repr(v) for k, v in p.coords.items() if k not in spec.batch_over)
                    if fixed not in keys:
                        keys[fixed] = _batch_key(spec, p.coords)
                    owner[cid] = batch = keys[fixed]
                    index[cid] = len(batches.setdefault(batch, []))
                    batches[batch].append(p.cell)
                else:  # a cell another experiment holds: one engine computes it
                    batch, i = owner[cid], index[cid]
                    held = batches[batch][i]
                    if p.cell.engine != held.engine:
                        batches[batch][i] = _one_engine(held, batch_experiment(batch), p.cell, name)
        return cls(config, experiments, specs, points, batches, skipped, owner)

    @property
    def results(self) -> Path:
        return results_of(self.config)

    @property
    def layout(self) -> Layout:
        """Where every output of this sweep lives (with the figures each experiment draws)."""
        parts = tuple((name, self.experiments.get(name).figures) for name in self.specs
                      if tuple(self.experiments.get(name).figures) != ("",))
        return Layout(self.results, parts)

    @property
    def stores(self) -> Path:
        return self.layout.stores

    def store_of(self, cell: Cell) -> Path:
        """The store holding a cell: its owning batch's."""
        return self.layout.store(self.owner[cell_id(cell)])

    def entries(self, name: str) -> list[tuple[dict, str, str]]:
        """``(grid coordinates, store path, cell id)`` of every grid point of an experiment."""
        out = []
        for p in self.points[name]:
            cid = cell_id(p.cell)
            out.append((p.coords, str(self.layout.store(self.owner[cid])), cid))
        return out

    @functools.cached_property
    def _names(self) -> dict[str, dict[str, str]]:
        return {name: {cell_id(p.cell): grid_point_name(name, p.coords) for p in reversed(points)}
                for name, points in self.points.items()}

    def name_of(self, cid: str, experiment: str | None = None) -> str:
        """A cell id as a person reads it (``grid_point_name``): the grid point of ``experiment`` that
        uses the cell, or of the first experiment that does; the id itself for a cell none uses."""
        for name in [experiment] if experiment in self._names else self._names:
            if cid in self._names[name]:
                return self._names[name][cid]
        return cid

    def batches_of(self, name: str) -> list[str]:
        """The batches holding an experiment's cells (its own and those it shares)."""
        return sorted({self.owner[cell_id(p.cell)] for p in self.points[name]})


@dataclasses.dataclass
class BatchResult:
    """What ``run_batch`` leaves: the batch's store, the cells it holds, those that failed whole (id ->
    error) and those that hold failed seeds (id -> ``simulate``'s ``seed_failures`` line)."""

    path: Path
    cells: dict[str, str]  # cell id -> its group in the store
    failed: dict[str, str]
    seed_failures: dict[str, str] = dataclasses.field(default_factory=dict)
    engines: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> engine
    engine_numerics: dict[str, int] = dataclasses.field(default_factory=dict)  # cell id -> its version


# Errors that fail one cell, named, and let its batch go on: the simulation's own, and the
# arithmetic ones the compiled code can still raise (numba reports some as SystemError).
CELL_ERRORS = (ArithmeticError, SystemError)


def stored_cells(path: str | Path) -> dict[str, xr.Dataset]:
    """The cells of a batch's store that can be trusted (id -> dataset, loaded): all of a complete
    store's, those of a corrupt store's intact groups, none of a stale or unreadable one's."""
    return _read_cells(path)[1]


def _read_cells(path: str | Path) -> tuple[StoreState, dict[str, xr.Dataset]]:
    """A batch's store read once, every byte checked: its state and its trusted cells."""
    from .pack import split
    from .store import open_members, read

    state, record, members = read(path, expect=store_versions())
    layout_only = state.status == "stale" and _layout_only(record)
    if layout_only:
        # Stale in its layout alone: the same numbers, read (pack reads either layout) and written again.
        state = StoreState("stale", state.detail + "; its cells are read and written again in this layout")
    elif state.status not in ("done", "corrupt") or "" in state.damaged:  # "": the root's metadata
        return state, {}
    cells = {}
    for group in record.get("groups", []):
        if group not in state.damaged:
            with open_members(members, group, chunks=None) as ds:
                cells.update(split(ds.load()))
    if layout_only:
        cells = {cid: _renamed_norm(ds) for cid, ds in cells.items()}
    return state, cells


def _renamed_norm(ds: xr.Dataset) -> xr.Dataset:
    """A layout-1 cell as layout 2 stores it: a flat cell's norm_drift (no drift there) as norm_change."""
    from .simulation import norm_variable

    if "norm_drift" not in ds or ds.attrs.get("cell_geometry") == "sphere":
        return ds
    name, attrs = norm_variable(False)
    ds = ds.rename({"norm_drift": name})
    ds[name].attrs = attrs
    return ds


def _layout_only(record: dict) -> bool:
    """Whether a store's record differs from the current versions in its layout alone."""
    return all(record.get(key) == want for key, want in store_versions().items() if key != "store_layout")


def _stores_holding(layout: Layout, path: Path, wanted: set[str]) -> list[Path]:
    """The other batches' stores whose manifest lists one of the ``wanted`` cell ids. The manifests (small
    JSON files, 20 times cheaper to read than a store's record) only point the way: the caller reads
    each store it names, every byte checked. Every job with a new cell asks, a fresh sweep's included."""
    found = set()
    for manifest in layout.manifests.glob("*.json"):
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # unreadable: its batch runs again, and the workflow says so
        cells = record.get("cells") if isinstance(record, dict) else None
        if isinstance(cells, dict) and isinstance(record.get("store"), str) and not wanted.isdisjoint(cells):
            found.add(layout.stores / record["store"])
    return [store for store in sorted(found) if store != path and store.exists()]


def stored_engine(ds: xr.Dataset) -> str:
    """The engine that computed a stored cell (its ``engine`` attribute): ``numba`` or ``jax``; a cell
    stored before the JAX engine existed has none, and was computed by numba."""
    return str(ds.attrs.get("engine", "numba"))


def stored_engine_numerics(ds: xr.Dataset) -> int:
    """The version of its engine's own numbers a stored cell was computed under (``engine_numerics``;
    1 for a cell stored before engines had their own)."""
    return int(ds.attrs.get("engine_numerics", 1))


def recorded_engines(record: dict) -> dict[str, str]:
    """A store record's or manifest's engines by cell id (``run_batch`` records them): every cell it
    holds, ``numba`` for a cell recorded before the JAX engine existed."""
    engines = record.get("engines") if isinstance(record.get("engines"), dict) else {}
    return {cid: str(engines.get(cid, "numba")) for cid in record.get("cells") or ()}


def recorded_engine_numerics(record: dict) -> dict[str, int]:
    """A store record's or manifest's engine numerics versions by cell id (1 where none is recorded)."""
    versions = record.get("engine_numerics") if isinstance(record.get("engine_numerics"), dict) else {}
    return {cid: int(versions.get(cid, 1)) for cid in record.get("cells") or ()}


def engine_staleness(stored: str, numerics: int, wanted: str | None) -> str | None:
    """Why a cell that engine ``stored`` computed under its numerics version ``numerics`` is stale (status
    says so), or None: another engine than the one its cell names (``wanted``; None for ``auto``, which
    takes either), or another version of that engine's own numbers (``numerics.ENGINE_NUMERICS``)."""
    from .numerics import ENGINE_NUMERICS

    if wanted is not None and stored != wanted:
        return f"computed by {stored}, this config asks for {wanted}"
    current = ENGINE_NUMERICS.get(stored)
    if numerics != current:
        return f"computed by {stored} under its numerics {numerics}, now {current}"
    return None


def _pending_cells(directory: Path) -> dict[str, xr.Dataset]:
    """The cells a killed job checkpointed before it could write its batch's store (complete,
    current stores only)."""
    cells = {}
    for path in sorted(directory.glob(f"*{STORE_SUFFIX}")):
        cells.update(stored_cells(path))
    return cells


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
    ``names``: cell id -> how the log names it (``cell_name``; default the id).
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

    from .engine import compilations
    from .engines import engine_for
    from .metadata import store_attrs
    from .pack import group_cells, placement
    from .simulation import SimulationError, describe, simulate  # the engine loads only where it runs
    from .store import record_of

    path, pending = layout.store(batch), layout.pending(batch)
    cells = list(cells)
    ids = [cell_id(c) for c in cells]
    names = names or {}
    # Every byte: a job reads its own store once. The start-up check compares sizes and times
    # only; bit rot reaches this job through the ticket `attnflow status --deep` writes.
    state, have = _read_cells(path)
    # Cells stored while the engine was part of ids (``_id_with_engine``) come under their id now.
    rekeyed = set()
    for cell, cid in zip(cells, ids, strict=True):
        if (old := _id_with_engine(cell)) in have and cid not in have:
            have[cid] = have.pop(old)
            have[cid].attrs["cell_id"] = cid
            rekeyed.add(cid)
    if state.status in ("corrupt", "stale"):
        log(f"{path.name}: {state.status} ({state.detail}); its "
            + ("intact cells are kept" if state.status == "corrupt" else
               "cells are kept" if have else "cells are computed again"))
    grid = set(ids)
    if retry_failed:
        again = [cid for cid, ds in have.items() if cid in grid and ds.attrs.get("n_seeds_failed")]
        for cid in again:
            del have[cid]
        if again:
            log(f"retry_failed: {len(again)} cells with failed seeds computed again")
    # The engine each cell names; auto takes either (the store records which).
    wanted = {cid: engine_for(cell) for cell, cid in zip(cells, ids, strict=True) if cell.engine != "auto"}

    def stale_engine(cid, ds) -> str | None:  # another engine than the cell names, or its older numerics
        return engine_staleness(stored_engine(ds), stored_engine_numerics(ds), wanted.get(cid))

    for cid, why in [(cid, why) for cid, ds in have.items() if (why := stale_engine(cid, ds))]:
        del have[cid]
        log(f"{names.get(cid, cid)}: {why}: " + ("computed again" if cid in grid else "dropped (off grid)"))
    stored = set(have) - rekeyed  # rekeyed cells make the store be written again, under their ids
    resumed = {cid: ds for cid, ds in _pending_cells(pending).items()
               if cid not in have and not stale_engine(cid, ds)}
    have.update(resumed)
    # Cells another batch's store holds (its manifest says so): a batch renamed (its axes listed in
    # another order, its batch_over edited), a cell two experiments share whose owning batch moved with
    # an edit. Taken from there, never computed again (a cell with failed seeds only without retry_failed).
    elsewhere: dict[str, str] = {}  # cell id -> that store
    if wanted_ids := {cid for cid in ids if cid not in have}:
        for other in _stores_holding(layout, path, wanted_ids):
            for cid, ds in _read_cells(other)[1].items():
                if (cid in wanted_ids and cid not in have and not stale_engine(cid, ds)
                        and not (retry_failed and ds.attrs.get("n_seeds_failed"))):
                    have[cid], elsewhere[cid] = ds, other.name
    budget = _under_lower_budget(cells, ids, have)  # max_steps raised: the cells that did not need it
    failed = {}
    unsaved: dict = {}  # computed since the last checkpoint
    last_checkpoint = time.monotonic()

    def checkpoint() -> None:
        groups = group_cells(unsaved)
        write(groups, pending / f"{next(reversed(unsaved))}{STORE_SUFFIX}", versions=store_versions(),
              replace=True, meta={"batch": batch, "cells": placement(groups), **_engines_of(unsaved)})
        log(f"checkpoint: {cells_phrase(len(unsaved))} kept in {pending}")
        unsaved.clear()

    try:
        for i, (cell, cid) in enumerate(zip(cells, ids, strict=True), 1):
            name = names.get(cid, cid)
            if cid in have:
                where = "" if cid in stored else f" (in {elsewhere[cid]})" if cid in elsewhere else \
                    f" (its run under max_steps = {budget[cid]} never reached it: the same numbers)" \
                    if cid in budget else " (stored under its id with the engine)" if cid in rekeyed else \
                    " (finished by a killed job)"
                log(f"[{i}/{len(cells)}] {name}: complete{where}, skipped")
                continue
            start, compiled = time.perf_counter(), compilations()
            try:
                ds = simulate(cell)
            except (SimulationError, *CELL_ERRORS) as err:
                error = str(err) if isinstance(err, SimulationError) else \
                    f"{describe(cell)}: {type(err).__name__} in the simulation: {err}"
                failed[cid] = error
                log(f"[{i}/{len(cells)}] {name}: FAILED: {error}")
                continue
            elapsed = time.perf_counter() - start
            ds.attrs.update({"cell_id": cid, **store_versions(), **(provenance or {})})
            have[cid] = unsaved[cid] = ds
            seeds = f"{cell.n_seeds} seeds"
            if ds.attrs.get("n_seeds_failed"):
                seeds = f"{ds.attrs['seed_failures']} ({failure_remedy(cell, ds.attrs['seed_failures'])})"
            compiling = (" (compiling the engine for this kind of cell, once: numba caches it for every "
                         "later job)") if compilations() > compiled else ""
            log(f"[{i}/{len(cells)}] {name}: {seeds}, {int(ds.n_steps.max())} steps, "
                f"computed in {elapsed:.3f} s{compiling}")
            if time.monotonic() - last_checkpoint >= CHECKPOINT_SECONDS and i < len(cells):
                checkpoint()
                last_checkpoint = time.monotonic()
    except BaseException:
        # Stopped mid-batch (Ctrl-C; SIGTERM, which the workflow's jobs raise: stop_on_sigterm; a
        # MemoryError): the cells finished since the last checkpoint are kept too, so the next run
        # computes none of them again.
        if unsaved:
            try:
                checkpoint()
            except Exception as err:  # noqa: BLE001  (the stop is what the job reports)
                log(f"checkpoint on stopping failed ({err}): {cells_phrase(len(unsaved))} computed again "
                    "next run")
        raise
    done = [cid for cid in dict.fromkeys(ids) if cid in have]
    # Off the grid: kept, so that the value put back computes nothing (the summary leaves them out).
    kept = [cid for cid in have if cid not in grid]
    if kept:
        log(f"{cells_phrase(len(kept))} the batch no longer has (a value removed from its grid) stay in "
            f"{path.name}, off the grid: put back, they are not computed again")
    if not done and not kept:
        path.unlink(missing_ok=True)  # every cell failed: no store
        placed = {}
    elif state.ok and stored == {*done, *kept}:
        placed = record_of(path)["cells"]  # nothing new: the store stays as it is
    else:
        groups = group_cells({cid: have[cid] for cid in [*done, *kept]},
                             store_attrs(batch, len(done) + len(kept)))
        placed = placement(groups)
        write(groups, path, versions=store_versions(), replace=True,
              meta={"batch": batch, "cells": placed, **_engines_of({c: have[c] for c in [*done, *kept]})})
        log(f"{path.name}: {cells_phrase(len(done))} written ({len(set(done) - stored - rekeyed)} new"
            + (f"; {len(kept)} more off the grid" if kept else "") + ")")
    shutil.rmtree(pending, ignore_errors=True)
    seed_failures = {cid: str(have[cid].attrs["seed_failures"]) for cid in done
                     if have[cid].attrs.get("n_seeds_failed")}
    if seed_failures:
        log(f"{len(seed_failures)} of {len(cells)} cells hold failed seeds (stored as failed, left out of "
            "the reductions; not computed again until the cell, its max_steps or the numerics change)")
    if failed:
        log(f"{len(failed)} of {len(cells)} cells FAILED (recorded in the manifest; not retried until the "
            "cell or the numerics change)")
    held = _engines_of({cid: have[cid] for cid in placed if cid in have})
    return BatchResult(path, placed, failed, seed_failures, held["engines"], held["engine_numerics"])


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


__all__ = ["BatchResult", "CELL_ERRORS", "CHECKPOINT_SECONDS", "EngineConflict", "Point", "STORE_SUFFIX",
           "Sweep",
           "batch_experiment", "cell_id", "cells_phrase", "cell_name", "config_digest", "describe_failures",
           "engine_staleness", "failure_remedy", "recorded_engine_numerics", "recorded_engines",
           "stored_engine", "stored_engine_numerics",
           "canonical_grid", "grid_point_name", "point", "seed_footer", "resolve", "run_batch", "spec_points",
           "store_versions",
           "stored_cells", "summary_versions", "verify_batch"]
