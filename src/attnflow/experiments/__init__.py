"""Experiments: one module each, the only place an experiment is defined.

An experiment module defines ``EXPERIMENT``, an instance of a subclass of
``Experiment`` that declares the question (theorem), the grid axes its figure
needs, the observables its reduction reads, its default config block, the
per-store reduction, the derivation across cells, the figure and the report
caption. The registry is built from the modules of this package plus any
module a config names under ``experiment_modules``; validation, the schema, the
workflow, the docs and the figures all read it.

What an experiment needs of its config is declared as data, never checked here:
``axes`` (values the figure is drawn over), ``pinned`` (fields fixed at one value),
``fixed_only`` (fields that must not be grid axes), ``bounds`` (a range every value of
a field must lie in) and ``inputs`` (fields naming a file that must exist).
``attnflow.config`` evaluates them, with every other config check, and is the one
module that raises ``ConfigError`` for a config's content; an experiment module
raises none and has no ``check`` to override.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import xarray as xr

from ..cell import _DEFAULTS as CELL_DEFAULTS
from ..registry import Registry
from ..spec import Axis, Bound, Spec, point_key


class NoExport(NotImplementedError):
    """An experiment that declares no export table (no threshold, boundary or fitted exponent)."""


class Experiment:
    """Base of every experiment; subclasses set the class attributes and the four methods."""

    name: ClassVar[str]
    theorem: ClassVar[str]  # e.g. "Thm 19"
    question: ClassVar[str]  # what the experiment answers, in a sentence or two
    axes: ClassVar[tuple[Axis, ...]]  # what the figure is drawn over
    observables: ClassVar[tuple[str, ...]]  # groups the reduction reads (added to every cell)
    defaults: ClassVar[dict]  # the default config block: fixed, grid, batch_over
    caption: ClassVar[str]  # report caption
    reading: ClassVar[str]  # how to read the figure, for docs/experiments.md
    # What the experiment needs of its config, declared here and checked by attnflow.config alone
    # (each refusal one ConfigError line naming the experiment, key and value):
    # Cell fields the closed form is derived for, fixed at one value: field -> (value, why).
    pinned: ClassVar[dict[str, tuple[object, str]]] = {}
    # Cell fields that may take any one value but must not be grid axes: field -> why.
    fixed_only: ClassVar[dict[str, str]] = {}
    # Ranges every value of a cell field must lie in (beyond what Cell itself accepts).
    bounds: ClassVar[tuple[Bound, ...]] = ()
    # Whether the figure averages over grid axes it is not drawn over (and says so); otherwise a grid
    # axis outside ``axes`` is refused: the figure would have no panel for it.
    averages_other_axes: ClassVar[bool] = False
    # Cell fields naming an input file: field -> a function of one value that says why it names
    # no readable file (one line, e.g. "no such file"; the config names the key and value), or None.
    inputs: ClassVar[dict[str, Callable[[object], str | None]]] = {}
    # The version of ``reduce`` and ``derive``: bump it with a change that moves a number in
    # the summary. Summaries record it; the workflow rebuilds (with its figure) one built
    # under another.
    reduction_version: ClassVar[int] = 1
    # Units, long name and description of summary variables attnflow.metadata.SUMMARIES does not
    # declare for this experiment: name -> (units, long_name, description), units "1" when
    # dimensionless (docs/model.md, "Units and metadata"). A summary variable declared nowhere stops
    # the aggregation, named.
    metadata: ClassVar[dict[str, tuple[str, str, str]]] = {}

    # --- configuration -------------------------------------------------------------------------
    def spec(self, block: dict | None, defaults: dict | None = None) -> Spec:
        """Resolve a config block over the experiment's defaults, the config's and the cell's.

        ``fixed`` merges key by key, each level over the next: the block's
        ``fixed``, the config's ``defaults``, ``self.defaults["fixed"]``,
        ``Cell``'s own defaults. ``grid`` and ``batch_over``, when given, replace
        the experiment's. The cells record the groups in
        ``self.observables`` on top of any the config asks for.
        """
        block = dict(block or {})
        grid = {axis: list(values) for axis, values in
                (block["grid"] if "grid" in block else self.defaults.get("grid", {})).items()}
        if "batch_over" in block:
            batch_over = block["batch_over"] or ()
        else:  # the experiment's choice, for the axes this grid has
            batch_over = [a for a in self.defaults.get("batch_over", ()) if a in grid]
        given = {**copy.deepcopy(self.defaults.get("fixed", {})), **(defaults or {}),
                 **(block.get("fixed") or {})}
        fixed = {**CELL_DEFAULTS, **given}
        fixed["observables"] = list(dict.fromkeys([*given.get("observables", ()), *self.observables]))
        fixed["seeds"] = fixed["seeds"] if isinstance(fixed["seeds"], int) else list(fixed["seeds"])
        for axis in grid:
            fixed.pop(axis, None)
        extra = tuple(dict(p) for p in block.get("extra_points") or ())
        return Spec(self.name, fixed, grid, tuple(batch_over), extra)

    def unavailable(self, spec: Spec) -> str | None:
        """Why this experiment cannot run on this machine (say, optional weights not installed), or None.

        An unavailable experiment is skipped with that message instead of failing the sweep. A
        mistake in the config (a file it names that does not exist) is no reason to skip: declare
        it under ``inputs``, and ``attnflow.config`` refuses it.
        """
        return None

    # --- data ----------------------------------------------------------------------------------
    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        """Cells of one shape, stacked along ``cell`` (``attnflow.pack``) -> the few quantities per
        cell the figure needs, along ``cell``. Every cell at once: a sweep of 100,000 cells is
        reduced in about a thousand calls, not 100,000. A cell's parameters are its attributes,
        per cell: ``attnflow.pack.cell_values(ds, "cell_beta")``."""
        raise NotImplementedError

    def derive(self, summary: xr.Dataset, spec: Spec) -> xr.Dataset:
        """Quantities across cells: thresholds, fits, closed forms on the same grid."""
        return summary

    # --- refinement ----------------------------------------------------------------------------
    refine_axis: ClassVar[str | None] = None  # the axis along which `attnflow refine` splits brackets

    def refine_field(self, summary: xr.Dataset):
        """``(field, level)``: the boundary ``attnflow refine`` brackets is where ``field`` crosses
        ``level`` along ``refine_axis``; ``field`` has the grid axes as its dims."""
        raise NotImplementedError(f"{self.name} declares no boundary to refine")

    def refinement(self, summary: xr.Dataset, spec: Spec) -> list[dict]:
        """New grid points: the midpoint of every bracket of the boundary along ``refine_axis``.

        Along each line of the grid (every combination of the other axes), two
        neighbouring computed values on opposite sides of the level make a
        bracket; its midpoint is geometric on a positive axis. Each round halves
        every bracket.
        """
        import numpy as np

        axis = self.refine_axis
        field, level = self.refine_field(summary)
        others = [a for a in spec.grid if a != axis]
        field = field.transpose(*others, axis)
        values = np.asarray(field[axis].values, dtype=float)
        order = np.argsort(values)
        known = {point_key(coords) for coords in spec.coordinates()}
        points = []
        for index in np.ndindex(*field.shape[:-1]):
            line = np.asarray(field.values[index], dtype=float)[order] - level
            xs = values[order]
            ok = np.isfinite(line)
            line, xs = line[ok], xs[ok]
            for k in range(len(line) - 1):
                if np.sign(line[k]) != np.sign(line[k + 1]) and line[k] * line[k + 1] <= 0:
                    lo, hi = xs[k], xs[k + 1]
                    mid = float(np.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi))
                    point = {a: _plain(field[a].values[i]) for a, i in zip(others, index, strict=True)}
                    point[axis] = round(mid, 12)
                    key = point_key({a: point[a] for a in spec.grid})
                    if key not in known:
                        known.add(key)
                        points.append(point)
        return points

    # --- export --------------------------------------------------------------------------------
    def export_table(self, summary: xr.Dataset):
        """The experiment's results for a paper: one row per grid line (a ``pandas.DataFrame``).

        Each row holds the measured threshold, boundary or fitted exponent of one
        line of the grid with its interval, and the closed form at the same point;
        ``attnflow.tables`` has the helpers. There is no default: an experiment
        that does not override this has nothing of that kind to tabulate, and
        ``attnflow export`` says so rather than dumping its summary.
        """
        raise NoExport(f"experiment {self.name} declares no export (it measures no threshold, boundary or "
                       f"exponent); its summary is attnflow.open_summary({self.name!r}, configfile=...)")

    # --- figure --------------------------------------------------------------------------------
    # The figures the experiment draws, one file each: "" is <name>.png (the first, always there),
    # "x" is <name>-x.png. An experiment with more than one has ``plot(summary, spec, part)``.
    figures: ClassVar[tuple[str, ...]] = ("",)
    # Whether the figure has a layout at a column's width (3.5 in): one without is drawn at a journal's
    # text width (``plotting.TEXT_WIDTH``) where ``figure_width`` is narrower, and the plot job says so.
    column_layout: ClassVar[bool] = True

    def plot(self, summary: xr.Dataset, spec: Spec):
        """The figure (a matplotlib Figure) from the summary and the spec it was built from.

        Draw it ``attnflow.plotting.figure_width()`` wide (the config's ``figure_width``), every
        text at least ``attnflow.plotting.MIN_TEXT`` points. An experiment declaring several
        ``figures`` takes a third argument, the part to draw.

        Import the drawing modules here (``from attnflow.plotting import plt, sns`` also sets
        the figures' theme), not at module top: every workflow job imports the registry, and
        only plot jobs draw.
        """
        raise NotImplementedError

    def draw(self, summary: xr.Dataset, spec: Spec, part: str = ""):
        """The figure ``part`` (one of ``figures``) of the summary."""
        if part not in self.figures:
            raise ValueError(f"experiment {self.name} draws no figure {part!r} (it draws {self.figures})")
        return self.plot(summary, spec, part) if len(self.figures) > 1 else self.plot(summary, spec)

    def with_axes(self, summary: xr.Dataset, spec: Spec) -> xr.Dataset:
        """The summary with every figure axis as a dimension (a fixed one gets length 1)."""
        for axis in self.axes:
            if axis.name not in summary.dims:
                if axis.name in summary.coords:
                    summary = summary.drop_vars(axis.name)
                summary = summary.expand_dims({axis.name: spec.values(axis.name)})
        return summary

    def describe_fixed(self, spec: Spec, keys: Sequence[str]) -> str:
        """``key=value`` for the fixed fields among ``keys`` (for titles)."""
        return ", ".join(f"{k}={spec.fixed[k]}" for k in keys if k in spec.fixed)


def _plain(value):
    """A numpy scalar as the plain Python value a YAML config holds."""
    return value.item() if hasattr(value, "item") else value


class ExperimentModuleError(ImportError):
    """A module named as an experiment module that cannot be imported or defines no ``EXPERIMENT``.

    ``attnflow.config`` reports it as the ``ConfigError`` ``experiment_modules: <this message>``.
    """


def _module_experiments(module_names: Iterable[str]) -> list[Experiment]:
    found = []
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ExperimentModuleError(f"cannot import {module_name!r}: {err}") from None
        except Exception as err:  # the module itself is broken: name it, not a traceback from inside
            where = ""
            tb = err.__traceback__
            while tb is not None:
                where = f" ({tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno})"
                tb = tb.tb_next
            raise ExperimentModuleError(f"importing {module_name!r} failed: "
                                        f"{type(err).__name__}: {err}{where}") from None
        experiment = getattr(module, "EXPERIMENT", None)
        if not isinstance(experiment, Experiment):
            raise ExperimentModuleError(f"{module_name!r} defines no EXPERIMENT "
                                        "(an attnflow.experiments.Experiment instance)")
        found.append(experiment)
    return found


def builtin_modules() -> list[str]:
    return [f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]


def registry(extra_modules: Iterable[str] = ()) -> Registry[Experiment]:
    """Every built-in experiment, then those of ``extra_modules`` (importable module names)."""
    return Registry("experiment", _module_experiments([*builtin_modules(), *extra_modules]))


__all__ = ["Axis", "Bound", "Experiment", "ExperimentModuleError", "NoExport", "Spec", "builtin_modules",
           "registry"]
