"""What an experiment is run over: its resolved config block (``Spec``), the axes its figure is drawn over
(``Axis``) and the ranges its fields must lie in (``Bound``).

A leaf: the sweep, the config, the aggregation and the run side read specs without importing the
experiments; ``attnflow.experiments`` re-exports these names for the experiment modules.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cell import Cell


@dataclasses.dataclass(frozen=True)
class Axis:
    """A cell field the figure is drawn over (from the grid, or one value from ``fixed``)."""

    name: str
    min_values: int = 1  # the figure needs at least this many values
    required: tuple = ()  # values that must be among them
    why: str = ""
    allowed: tuple = ()  # when given, the only values the figure (its closed forms) can draw


@dataclasses.dataclass(frozen=True)
class Bound:
    """Every value of the cell field ``key`` must lie strictly between ``low`` and ``high``.

    An end is a number or a function of the grid point's ``Cell`` (an end that depends on
    other fields, such as ``1/sqrt(d)``). ``low_text`` and ``high_text`` write the ends in
    the refusal, which ``attnflow.config`` formats: ``experiments.<name>.grid.<key>: <value>
    must lie in (<low_text>, <high_text>) = (<low>, <high>)``.
    """

    key: str
    low: float | Callable[[Cell], float] = -math.inf
    high: float | Callable[[Cell], float] = math.inf
    low_text: str = ""
    high_text: str = ""

    def ends(self, cell: Cell) -> tuple[float, float]:
        """``(low, high)`` at one grid point."""
        return tuple(float(end(cell)) if callable(end) else float(end) for end in (self.low, self.high))

    def describe(self) -> str:
        """The interval as the docs write it, e.g. ``(gamma0 = 1/sqrt(d), 1)``."""
        low = self.low_text or (f"{self.low:g}" if not callable(self.low) else "?")
        high = self.high_text or (f"{self.high:g}" if not callable(self.high) else "?")
        return f"({low}, {high})"


def _value_key(value) -> str:
    """One coordinate as ``point_key`` writes it."""
    return json.dumps(value, default=float)


def point_key(coords: dict) -> str:
    """A grid point as text, equal for equal coordinates (1 and 1.0 alike, any key order)."""
    return json.dumps(coords, sort_keys=True, default=float)


@dataclasses.dataclass(frozen=True)
class Spec:
    """An experiment's resolved config block: every cell field not on the grid, the grid, the batches."""

    name: str
    fixed: dict  # every cell field except the grid axes (config defaults, experiment, fixed)
    grid: dict  # axis -> list of values
    batch_over: tuple[str, ...]
    extra_points: tuple = ()  # grid points beyond the product (dicts over the grid axes), e.g. refinements

    def values(self, axis: str) -> list:
        """The values of a cell field: its grid values (and extra points'), or its one fixed value."""
        if axis not in self.grid:
            return [self.fixed[axis]]
        return list(dict.fromkeys([*self.grid[axis], *(p[axis] for p in self.extra_points)]))

    def coordinates(self):
        """Every grid point's coordinates, each once: the product of the grid, then the extra points
        (in the grid's axis order)."""
        axes = list(self.grid)
        # Each axis's values once (as point_key tells them apart): their product repeats no point,
        # so only the extra points need a key each (a sweep may hold 100,000 points).
        values = {a: list({_value_key(v): v for v in reversed(self.grid[a])}.values())[::-1] for a in axes}
        for combination in itertools.product(*(values[a] for a in axes)):
            yield dict(zip(axes, combination, strict=True))
        on_axes = {a: {_value_key(v) for v in values[a]} for a in axes}
        seen = set()
        for point in self.extra_points:
            coords = {a: point[a] for a in axes}
            key = point_key(coords)
            if key not in seen and not all(_value_key(coords[a]) in on_axes[a] for a in axes):
                seen.add(key)
                yield coords

    def to_json(self) -> str:
        return json.dumps({"fixed": self.fixed, "grid": self.grid, "batch_over": list(self.batch_over),
                           "extra_points": list(self.extra_points)}, sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: str) -> Spec:
        block = json.loads(text)
        return cls(name, block["fixed"], block["grid"], tuple(block["batch_over"]),
                   tuple(block.get("extra_points", ())))

    @classmethod
    def of(cls, summary) -> Spec:
        """The spec a summary was built from (its attrs), never the live config."""
        return cls.from_json(summary.attrs["experiment"], summary.attrs["experiment_spec"])


__all__ = ["Axis", "Bound", "Spec", "point_key"]
