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
first that needs it, so one job writes it. (A cell's id: ``attnflow.ids``;
running the batches: ``attnflow.run``.)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from .cell import Cell
from .ids import cell_id
from .layout import Layout, results_of
from .names import _axis_order, batch_experiment, grid_point_name
from .spec import Spec


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


__all__ = ["EngineConflict", "Point", "Sweep", "canonical_grid", "point", "resolve", "spec_points"]
