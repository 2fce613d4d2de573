"""One experiment block's checks: its shape (extra points, ``batch_over``, grid values), fixed fields
off its grid, fields no cell reads, the files it names, its cells, and what the experiment declares its
figure needs (``axes``, ``pinned``, ``fixed_only``, ``bounds``)."""

from __future__ import annotations

import math

from ..cell import _DEFAULTS as CELL_DEFAULTS
from ..cell import CONDITIONAL_FIELDS, readers_of
from ..errors import ConfigError
from ..experiments import Experiment
from ..spec import Spec
from ..sweep import Point, point


# --- the experiment blocks -------------------------------------------------------------------------
def where(spec: Spec, key: str) -> str:
    """The config key of a cell field in an experiment block: ``experiments.<name>.grid.<key>`` on a
    grid axis, else ``experiments.<name>.fixed.<key>`` (where the value came from the defaults too)."""
    return f"experiments.{spec.name}.{'grid' if key in spec.grid else 'fixed'}.{key}"


def _canonical(value):
    """Numbers compared as values: 1 and 1.0 are one grid value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return repr(float(value)) if math.isfinite(value) else repr(value)


def check_grid(name: str, grid: dict) -> None:
    """Each grid value once (1 and 1.0 are one value), and each a single value: a list (say
    ``seeds: [[0, 1], [2, 3]]``) would name a batch and a store by its text."""
    for axis, values in grid.items():
        seen = {}
        for value in values:
            if isinstance(value, (list, tuple, dict)):
                raise ConfigError(f"experiments.{name}.grid.{axis}: {value!r} is a {type(value).__name__}; "
                                  "a grid axis takes single values (a list-valued field such as seeds "
                                  "goes under fixed)")
            key = _canonical(value)
            if key in seen:
                raise ConfigError(f"experiments.{name}.grid.{axis}: {seen[key]!r} and {value!r} are the "
                                  "same value (each value once)")
            seen[key] = value


def check_fixed_off_grid(spec: Spec, block: dict | None) -> None:
    """A field the block fixes is not also a grid axis (its own grid's or, without one, the experiment's
    default grid), where the grid would win and the fixed value be dropped without a word."""
    fixed = (block or {}).get("fixed") or {}
    for key in fixed:
        if key in spec.grid:
            grid = "the block's grid" if "grid" in (block or {}) else \
                "the experiment's default grid (the block gives none)"
            raise ConfigError(f"experiments.{spec.name}.fixed.{key} = {fixed[key]!r}: {key} is also an axis "
                              f"of {grid}, {spec.grid[key]!r}, which would win; keep one: drop it from "
                              f"fixed, or give a grid without {key}")


def check_read(spec: Spec, block: dict | None, points: list[Point]) -> None:
    """A field the block sets (fixed or grid) away from its default that no cell of the block reads (say
    ``gamma0`` beside ``init: uniform``) is refused: each cell drops it (``Cell._canonicalise``), and
    the figure would carry a setting that changed nothing."""
    block = block or {}
    given = {**(block.get("fixed") or {}), **(block.get("grid") or {})}
    for key, value in given.items():
        values = value if key in (block.get("grid") or {}) else [value]
        if key not in CONDITIONAL_FIELDS or all(_at_default(key, v) for v in values):
            continue
        if not any(key in p.cell.used_fields() for p in points):
            remedy = "add clusters to observables" if key == "cluster_eps" else \
                "give the choice that reads it"
            raise ConfigError(f"{where(spec, key)} = {value!r}: no cell of this experiment reads {key}; "
                              f"it is read only {readers_of(key)}: drop it, or {remedy}")


def _at_default(key: str, value) -> bool:
    """Whether a config's value of a field is its default, as ``Cell`` normalises it (a list for a
    sequence field: ``head_subset: []`` is the default ``()``)."""
    default = CELL_DEFAULTS[key]
    return (tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value) == default


def check_block(spec: Spec) -> None:
    """A block's own shape: each extra point gives exactly the grid axes, each ``batch_over`` axis is
    on the grid, each grid value is a single value and appears once."""
    for extra in spec.extra_points:
        if set(extra) != set(spec.grid):
            raise ConfigError(f"experiments.{spec.name}.extra_points: {extra!r} must give exactly the "
                              f"grid axes ({', '.join(spec.grid)})")
    for axis in spec.batch_over:
        if axis not in spec.grid:
            raise ConfigError(f"experiments.{spec.name}.batch_over: {axis!r} is not a grid axis "
                              f"(grid: {', '.join(spec.grid) or 'none'})")
    check_grid(spec.name, spec.grid)


def check_inputs(experiment: Experiment, spec: Spec) -> None:
    """Every value of a field the experiment declares under ``inputs`` names a file that exists."""
    for key, problem_of in experiment.inputs.items():
        for value in spec.values(key):
            problem = problem_of(value)
            if problem:
                raise ConfigError(f"{where(spec, key)} = {value!r}: {problem}")


def points_of(spec: Spec) -> list[Point]:
    """The grid points of a spec (``attnflow.sweep.point``); a cell ``Cell`` refuses is a
    ``ConfigError`` naming the experiment and the grid point, then Cell's own message (the field)."""
    from ..resources import oversized, size

    points, sized = [], set()
    for coords in spec.coordinates():
        at = f" (grid point {coords})" if coords else ""
        try:
            points.append(point(spec, coords))
        except TypeError as err:  # a field Cell does not have
            raise ConfigError(f"experiments.{spec.name}: {err}") from None
        except ValueError as err:
            raise ConfigError(f"experiments.{spec.name}{at}: {err}") from None
        cell = points[-1].cell
        of = size(cell)
        if of not in sized:
            sized.add(of)
            too_large = oversized(of)
            if too_large:
                raise ConfigError(f"experiments.{spec.name}{at}: {too_large}")
    return points


def check_needs(experiment: Experiment, spec: Spec, points: list[Point]) -> None:
    """What the experiment declares its figure needs, in order: no causal mask unless the figure is
    drawn over ``mask`` (the paper's closed forms are for unmasked attention), its ``pinned`` fields
    at their values, its ``fixed_only`` fields off the grid, enough values of each of its ``axes``
    (and the values they require), every value of a ``bounds`` field inside its range, and no grid
    axis the figure is not drawn over (unless it ``averages_other_axes``)."""
    name = experiment.name
    if "mask" not in {axis.name for axis in experiment.axes} and spec.values("mask") != ["none"]:
        raise ConfigError(f"{where(spec, 'mask')} = {spec.values('mask')!r}: the {name} figure draws closed "
                          "forms of unmasked attention; masks are compared in the variants experiment")
    for key, (value, why) in experiment.pinned.items():
        if key in spec.grid or spec.fixed.get(key) != value:
            raise ConfigError(f"experiments.{name}.fixed.{key}: must be {value} ({why})")
    for key, why in experiment.fixed_only.items():
        if key in spec.grid:
            raise ConfigError(f"experiments.{name}.grid.{key} = {spec.grid[key]!r}: must be fixed ({why})")
    for axis in experiment.axes:
        values = spec.values(axis.name)
        why = f" ({axis.why})" if axis.why else ""
        if len(values) < axis.min_values:
            raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure needs at least "
                              f"{axis.min_values} values{why}")
        for value in axis.required:
            if value not in values:
                raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure needs "
                                  f"{value!r} among them{why}")
        for value in values if axis.allowed else ():
            if value not in axis.allowed:
                raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure draws only "
                                  f"{', '.join(map(str, axis.allowed))}, not {value!r}{why}")
    for bound in experiment.bounds:
        for p in points:
            low, high = bound.ends(p.cell)
            value = p.coords.get(bound.key, spec.fixed.get(bound.key))
            if not low < getattr(p.cell, bound.key) < high:
                ends = f"({low:.4g}, {high:.4g})"
                if bound.low_text or bound.high_text:
                    ends = f"{bound.describe()} = {ends}"
                raise ConfigError(f"{where(spec, bound.key)}: {value!r} must lie in {ends}")
    drawn = [axis.name for axis in experiment.axes]
    for key in () if experiment.averages_other_axes else spec.grid:
        if key not in drawn:
            raise ConfigError(f"experiments.{name}.grid.{key} = {spec.grid[key]!r}: the {name} figure is "
                              f"drawn over {', '.join(drawn)}, with no panel for {key}; fix it under fixed "
                              "(one value), or run each value from its own config")
