"""Tables for a paper: an experiment's measured thresholds, boundaries and exponents, one row per grid line.

The numbers live in the summary stores (and the figures); ``attnflow export``
writes them as CSV or JSON. Each experiment declares its table
(``Experiment.export_table``); an experiment without a threshold, boundary or
fitted exponent declares none and says so, instead of exporting its raw
summary. The helpers here are what those declarations share: brackets of a
crossing along one axis, fits with their confidence intervals, and a table
from data arrays over the same grid lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

Columns = dict[str, tuple[xr.DataArray, str]]


def table(summary: xr.Dataset, lines: list[str], columns: Columns) -> pd.DataFrame:
    """One row per combination of the grid axes ``lines``, one column per ``name -> (array, description)``.

    Each array is broadcast over the lines (a closed form over fewer axes repeats);
    an array with a dimension outside ``lines`` is an error, never a silent
    flattening. The descriptions go to ``DataFrame.attrs["columns"]`` (and the JSON).
    """
    columns = {**columns, **_seed_columns(summary, lines, columns)}
    arrays = {}
    for name, (array, _) in columns.items():
        extra = [d for d in array.dims if d not in lines]
        if extra:
            raise ValueError(f"export column {name}: dimension {extra[0]!r} is not a grid line axis "
                             f"({', '.join(lines)})")
        arrays[name] = array.reset_coords(drop=True)
    frame = xr.Dataset(arrays, coords={d: summary[d].values for d in lines})
    df = frame.to_dataframe(dim_order=lines).reset_index()[[*lines, *columns]]
    df.attrs["columns"] = {name: doc for name, (_, doc) in columns.items()}
    return df


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


def ratio_crossings(ratio: xr.DataArray, axis: str):
    """``crossings`` of a ratio through 1 along ``axis``. Non-positive entries, which no ratio of times
    has, are left out; the bracket is that of the log-ratio through 0, without taking logs."""
    return crossings(ratio.where(ratio > 0), axis, 1.0)


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


def export(experiment: str, configfile, results=None) -> pd.DataFrame:
    """The export table of ``experiment`` from its verified summary (``attnflow.open_summary``)."""
    from .access import load_sweep, open_summary

    summary = open_summary(experiment, configfile, results=results)
    exp = load_sweep(configfile, results).experiments.get(experiment)
    df = exp.export_table(summary)
    provenance = {k: summary.attrs[k] for k in ("config_sha256", "attnflow_version") if k in summary.attrs}
    df.attrs.update({"experiment": experiment, "theorem": exp.theorem, **provenance})
    return df


def _plain(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_csv(df: pd.DataFrame, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.10g")


def write_json(df: pd.DataFrame, path) -> None:
    """The table as ``{experiment, theorem, provenance, columns: {name: description}, rows: [...]}``;
    NaN is null (not measured on this grid), infinities are the strings "inf" and "-inf"."""
    out = {**{k: v for k, v in df.attrs.items() if k != "columns"},
           "columns": df.attrs.get("columns", {c: "" for c in df.columns}),
           "rows": [{k: _plain(v) for k, v in row.items()} for row in df.to_dict(orient="records")]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


__all__ = ["crossings", "equiangular_starts", "export", "first_crossing", "ratio_crossings", "slope_interval",
           "table", "write_csv", "write_json"]
