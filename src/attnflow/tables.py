"""The experiments' table toolkit: what their ``export_table`` declarations share.

Thresholds over seeds with intervals that keep the grid's resolution and its
censoring, brackets of a crossing along one axis, fits with their confidence
intervals, and a table from data arrays over the same grid lines, every column
with its description and units. ``attnflow.export`` writes the tables (CSV with
CSVW metadata, JSON); the experiments build them with these.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import xarray as xr

# name -> (array, description) or (array, description, units); without units the array's own
# ``units`` attribute, else "1" (CF's dimensionless: every axis a grid line runs along is).
Columns = dict[str, tuple]

def table(summary: xr.Dataset, lines: list[str], columns: Columns) -> pd.DataFrame:
    """One row per combination of the grid axes ``lines``, one column per ``name -> (array, description[,
    units])``.

    Each array is broadcast over the lines (a closed form over fewer axes repeats);
    an array with a dimension outside ``lines`` is an error, never a silent
    flattening. Every column's description and units, the lines' own included,
    go to ``DataFrame.attrs["columns"]`` and ``["units"]`` (and to the files).
    """
    columns = {**columns, **_seed_columns(summary, lines, columns)}
    arrays = {}
    for name, (array, *_) in columns.items():
        extra = [d for d in array.dims if d not in lines]
        if extra:
            raise ValueError(f"export column {name}: dimension {extra[0]!r} is not a grid line axis "
                             f"({', '.join(lines)})")
        arrays[name] = array.reset_coords(drop=True)
    frame = xr.Dataset(arrays, coords={d: summary[d].values for d in lines})
    order = sorted(columns, key=lambda name: name != "seeds")  # the seed count first, beside the line
    df = frame.to_dataframe(dim_order=lines).reset_index()[[*lines, *order]]
    described = {d: _axis_meaning(summary, d) for d in lines}
    for name, (array, doc, *units) in columns.items():
        described[name] = (doc, units[0] if units else array.attrs.get("units", "1"))
    df.attrs["columns"] = {name: described[name][0] for name in df.columns}
    df.attrs["units"] = {name: described[name][1] for name in df.columns}
    return counts_as_integers(df)


# Columns that count seeds or grid points: integers (nullable: empty where the line has no cells), typed
# so in the CSVW metadata. By name: the helpers here make them, and experiments' tables reuse the names.
COUNT_COLUMNS = ("seeds", "seeds_used", "seeds_failed", "points")
COUNT_SUFFIXES = ("_seeds", "_below_grid", "_above_grid")


def is_count(name: str) -> bool:
    return name in COUNT_COLUMNS or name.endswith(COUNT_SUFFIXES)


def counts_as_integers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its count columns (``is_count``) as nullable integers; an experiment's own table calls
    it too."""
    for name in df.columns:
        if is_count(name) and df[name].dtype.kind in "fiub":
            df[name] = df[name].astype("Int64")
    return df


def _axis_meaning(summary: xr.Dataset, axis: str) -> tuple[str, str | None]:
    """(description, units) of a grid axis: its coordinate's attrs, else the Cell field's documentation;
    units None for an axis of names (attention, heads...), which has none."""
    from .cell import FIELD_DOCS

    attrs = summary[axis].attrs
    doc = attrs.get("description") or attrs.get("long_name") or FIELD_DOCS.get(axis) or f"grid axis {axis}"
    textual = summary[axis].dtype.kind in "OUS"
    return f"grid axis {axis}: {doc}", None if textual else attrs.get("units", "1")


def time_units(summary: xr.Dataset, axis: str = "time") -> str:
    """The units of a summary's time axis (its coordinate's attribute; the model's time is dimensionless)."""
    return summary[axis].attrs.get("units", "1") if axis in summary.coords else "1"


def seed_count(per_seed: xr.DataArray, lines: list[str]) -> xr.DataArray:
    """Per grid line: the fewest seeds with a value of ``per_seed`` at any point of the line (what every
    point of an estimate along it has at least)."""
    counts = per_seed.notnull().sum("seed")
    return counts.min([d for d in counts.dims if d not in lines])


def requested_seeds(summary: xr.Dataset) -> int:
    """The seeds each cell of a summary was asked for (its experiment block's), for an experiment whose
    reduction already counts over seeds; 1 when the block names none (Cell's default)."""
    from .spec import Spec

    return int(Spec.of(summary).fixed.get("seeds", 1))


def seed_brackets(fails: xr.DataArray, axis: str) -> xr.Dataset:
    """Per seed and line: where along ``axis`` a property first fails, as a bracket of grid values.

    ``fails`` is 1 where the property fails, 0 where it holds and NaN where the
    cell was not computed (neither: a failed seed, a line a refinement skipped).
    The bracket is the last value before the first failure and that failure
    (``low``, ``high``). A seed already failing at its line's first computed
    value is censored below the grid, bracket (floor, first value), floor 0 on
    a positive axis (-inf otherwise); one never failing is censored above,
    (last value, inf). A seed with nothing computed on the line, or whose
    threshold is beyond a grid end only possibly (a failed run there:
    ``experiments._common.first_failure``), has NaN for both and is in no count.
    ``below`` and ``above`` flag the censored seeds.
    """
    from .experiments._common import first_failure

    fails = fails.sortby(axis)
    xs = fails[axis].values.astype(float)
    floor = 0.0 if xs.min() > 0 else -np.inf

    def one(values):
        return first_failure(values, xs, floor)

    low, high, below, above = xr.apply_ufunc(
        one, fails, input_core_dims=[[axis]], output_core_dims=[[], [], [], []], vectorize=True,
        output_dtypes=[float, float, bool, bool])
    return xr.Dataset({"low": low, "high": high, "below": below, "above": above}, attrs={"floor": floor})


def threshold_interval(brackets: xr.Dataset, level: float = 0.95) -> xr.Dataset:
    """A threshold over seeds from their brackets (``seed_brackets``), with an interval a reader can trust.

    ``estimate``: the mean over the seeds whose threshold is on the grid of their
    brackets' midpoints (geometric on a positive axis: the figures' diamonds).
    ``low``, ``high``: the hull of (a) the Student-t ``level`` interval of those
    seeds' bracket ends, from the lower end of their lower ends to the upper end
    of their upper ends, so it is never narrower than the grid's resolution (one
    seed: its bracket), and (b) the brackets of the censored seeds: down to the
    floor when some seed fails at its line's first value, up to inf when some
    never fails. It holds the estimate, and the mean over every seed too.
    ``seeds``: seeds with a computed value on the line; ``on_grid``, ``below``,
    ``above``: how many of them have their threshold on, below or above the grid.
    """
    from .experiments._common import t_interval

    floor = brackets.attrs["floor"]
    low, high, below, above = brackets.low, brackets.high, brackets.below, brackets.above
    on = low.notnull() & ~below & ~above
    mid = (np.sqrt(low * high) if floor == 0 else 0.5 * (low + high)).where(on)

    def t_end(ends, sign):
        mean, half = xr.apply_ufunc(t_interval, ends.where(on), input_core_dims=[["seed"]],
                                    output_core_dims=[[], []], vectorize=True, kwargs={"level": level})
        return mean + sign * half.fillna(0.0)  # one seed: its bracket, no spread to add

    lows = xr.concat([t_end(low, -1).clip(min=floor), low.where(below | above).min("seed")], "part")
    highs = xr.concat([t_end(high, +1), high.where(below | above).max("seed")], "part")
    return xr.Dataset({
        "estimate": mid.mean("seed"), "low": lows.min("part"), "high": highs.max("part"),
        "seeds": low.notnull().sum("seed"), "on_grid": on.sum("seed"),
        "below": below.sum("seed"), "above": above.sum("seed"),
    })


def threshold_columns(name: str, fails: xr.DataArray, axis: str, what: str, units: str = "1") -> Columns:
    """The export columns of a threshold over seeds along ``axis`` (``fails``: 1 where ``what`` fails,
    0 where it holds, NaN where not computed): the estimate, its interval, and the seed counts beside them
    (``seeds``, the seeds computed on the line, is shared by every threshold of a table)."""
    brackets = seed_brackets(fails, axis)
    found = threshold_interval(brackets)
    floor = "0" if brackets.attrs["floor"] == 0 else "-inf"
    return {
        name: (found.estimate, f"measured threshold in {axis} ({what} fails above it): mean over the seeds "
                               f"whose threshold is on the grid ({name}_seeds of them) of each seed's "
                               "bracket midpoint (geometric on a positive axis)", units),
        f"{name}_low": (found.low, "95% interval, lower end: the Student-t interval of the on-grid seeds' "
                                   "bracket ends (never narrower than the grid's resolution), extended to "
                                   f"{floor} when some seed fails already at the smallest {axis}", units),
        f"{name}_high": (found.high, "95% interval, upper end: as the lower end, extended to inf when some "
                                     "seed never fails on the grid", units),
        f"{name}_seeds": (found.on_grid, "seeds whose threshold is on the grid (the estimate is over them)",
                          "1"),
        f"{name}_below_grid": (found.below, f"seeds failing already at the smallest {axis} (threshold below "
                                            "the grid)", "1"),
        f"{name}_above_grid": (found.above, "seeds never failing on the grid (threshold above it)", "1"),
        f"{name}_undetermined": ((fails.notnull().any(axis) & brackets.low.isnull()).sum("seed"),
                                 "seeds left out: computed on the line, but whose threshold may or may not "
                                 "be beyond a grid end, their run there having failed", "1"),
        "seeds": (found.seeds, "seeds computed on the line (on, below and above the grid add up to it)",
                  "1"),
    }


def _seed_columns(summary: xr.Dataset, lines: list[str], columns: Columns) -> Columns:
    """How many seed runs each row rests on and how many failed (left out), summed over the grid
    points of its line: from the summary's per-point counts (``aggregate``), where it has them."""
    out = {}
    for name, source, doc in (("seeds_used", "n_seeds_used", "seed runs the row's estimates use, over the "
                                                              "grid points of its line"),
                              ("seeds_failed", "n_seeds_failed", "seed runs that failed (step budget, "
                                                                 "underflow, non-finite), left out")):
        if source in summary and name not in columns and set(summary[source].dims) >= set(lines):
            counts = summary[source]
            out[name] = (counts.sum([d for d in counts.dims if d not in lines], min_count=1), doc)
    return out


def first_crossing(values: np.ndarray, axis_values: np.ndarray, level: float, *, geometric: bool = True):
    """Along one line: the first bracket where ``values`` crosses ``level`` going up the axis.

    Returns ``(estimate, low, high)``: the bracket's two neighbouring axis values
    (computed, finite values only) and its midpoint (geometric on a positive
    axis), or three NaNs when the line never crosses on the grid.
    """
    values, xs = np.asarray(values, float), np.asarray(axis_values, float)
    order = np.argsort(xs)
    values, xs = values[order], xs[order]
    ok = np.isfinite(values)
    values, xs = values[ok] - level, xs[ok]
    for k in range(len(values) - 1):
        if values[k] * values[k + 1] <= 0 and np.sign(values[k]) != np.sign(values[k + 1]):
            lo, hi = xs[k], xs[k + 1]
            mid = math.sqrt(lo * hi) if geometric and lo > 0 else 0.5 * (lo + hi)
            return mid, lo, hi
    return np.nan, np.nan, np.nan


def crossings(field: xr.DataArray, axis: str, level: float, *, geometric: bool = True):
    """``first_crossing`` along ``axis`` for every line of ``field``: (estimate, low, high) arrays."""
    return xr.apply_ufunc(
        lambda v, x: first_crossing(v, x, level, geometric=geometric), field, field[axis],
        input_core_dims=[[axis], [axis]], output_core_dims=[[], [], []], vectorize=True,
        output_dtypes=[float, float, float])


def _beyond(values: np.ndarray, xs: np.ndarray, level: float, falling: bool, floor: float):
    """One line that never crosses ``level``: the bracket beyond the grid where it would, if it goes
    through the level the way ``falling`` says; NaNs for a line without values or on both sides."""
    ok = np.isfinite(values)
    values, xs = values[ok] - level, xs[ok]
    if not values.size or not ((values > 0).all() or (values < 0).all()):
        return np.nan, np.nan
    if (values[0] > 0) == falling:  # still on the near side at the grid's end: it crosses above it
        return xs.max(), np.inf
    return floor, xs.min()


def crossings_beyond(field: xr.DataArray, axis: str, level: float, *, falling: bool, geometric: bool = True):
    """``crossings``, where a line that stays on one side of ``level`` gets the bracket beyond the grid
    on the side where it would cross, going down through the level as the axis grows (``falling``) or
    up: (last value, inf) or (floor, first value), floor 0 on a positive axis, -inf otherwise. The
    estimate stays NaN there: the grid does not hold the crossing."""
    mid, low, high = crossings(field, axis, level, geometric=geometric)
    xs = field[axis].values.astype(float)
    floor = 0.0 if xs.min() > 0 else -np.inf
    out_low, out_high = xr.apply_ufunc(
        lambda v: _beyond(np.asarray(v, float), xs, level, falling, floor), field,
        input_core_dims=[[axis]], output_core_dims=[[], []], vectorize=True, output_dtypes=[float, float])
    return mid, low.fillna(out_low), high.fillna(out_high)


def ratio_crossings(ratio: xr.DataArray, axis: str, *, falling: bool | None = None):
    """``crossings`` of a ratio through 1 along ``axis`` (``crossings_beyond`` with ``falling``).
    Non-positive entries, which no ratio of times has, are left out; the bracket is that of the
    log-ratio through 0, without taking logs."""
    ratio = ratio.where(ratio > 0)
    if falling is None:
        return crossings(ratio, axis, 1.0)
    return crossings_beyond(ratio, axis, 1.0, falling=falling)


def equiangular_starts(summary: xr.Dataset) -> xr.DataArray:
    """Along ``init``: True for the equiangular starts, where a closed form describes the particles."""
    inits = summary.init.values
    return xr.DataArray([str(i).startswith("equiangular") for i in inits], dims="init",
                        coords={"init": inits})


def slope_interval(x, y, level: float = 0.95):
    """Least-squares slope of ``y`` on ``x`` (finite pairs), and its ``level`` confidence interval.

    The interval is Student-t on the slope's standard error; it needs three
    points (two give the slope alone, NaN bounds).
    """
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 2 or np.ptp(x) == 0:
        return np.nan, np.nan, np.nan
    fit = stats.linregress(x, y)
    if x.size < 3:
        return float(fit.slope), np.nan, np.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 2) * fit.stderr
    return float(fit.slope), float(fit.slope - half), float(fit.slope + half)


__all__ = ["COUNT_COLUMNS", "Columns", "counts_as_integers", "crossings", "crossings_beyond",
           "equiangular_starts", "first_crossing", "is_count", "ratio_crossings", "requested_seeds",
           "seed_brackets", "seed_count", "slope_interval", "table", "threshold_columns",
           "threshold_interval", "time_units"]
