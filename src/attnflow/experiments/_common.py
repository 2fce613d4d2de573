"""Reductions shared by several experiments."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

# A per-head rate counts as negative below -1e-9 of the run's largest |rate|:
# far above the round-off of sums of O(scale) terms (~1e-15), far below the
# violations Thm 16-17 produces (percents of the scale).
SIGN_RTOL = 1e-9


def all_heads_monotone(ds: xr.Dataset) -> xr.DataArray:
    """(seed, time): every per-head energy rate is non-negative (to round-off) at the sample and, where
    the store has ``energy_rate_min`` (the ``energy_path`` group), at the end of every accepted
    integration step since the previous sample: a dip between samples fails it (issue 52)."""
    scale = abs(ds.energy_rate).max(("time", "head"))
    rate = ds.energy_rate_min if "energy_rate_min" in ds else ds.energy_rate
    return (rate >= -SIGN_RTOL * scale).all("head")


def monotone_judged(spec) -> str:
    """How ``all_heads_monotone`` judged the runs of ``spec``'s cells, for the summary's attrs."""
    if "energy_path" in spec.fixed.get("observables", ()):
        return ("at every sample and at the end of every accepted integration step between samples "
                "(energy_rate_min)")
    return "at the samples only"


def before_cluster(ds: xr.Dataset) -> xr.DataArray:
    """Mask (seed, time): samples up to ``t_cluster`` (the whole run when censored)."""
    horizon = ds.t_cluster.fillna(ds.time[-1])
    return ds.time <= horizon


def first_failure(values: np.ndarray, xs: np.ndarray, floor: float):
    """One seed's line (``values``: 1 fails, 0 holds, NaN not computed, along sorted ``xs``) ->
    ``(low, high, below, above)``: the bracket of its first failure and its censoring.

    A seed failing at the grid's first value is censored below the grid, bracket ``(floor, xs[0])``; one
    holding at every value through the grid's last is censored above, ``(xs[-1], inf)``; otherwise the
    bracket is (last computed value before the first failure, that failure), which may span values not
    computed. A seed whose first computed failure comes after values not computed at the grid's start,
    with no pass before it, or that never fails but was not computed at the grid's last value, has its
    threshold beyond a grid end only possibly: it is undetermined, NaN bracket and neither flag, and in
    no count (a seed that failed at the smallest beta is not "below the grid" on the strength of the next
    value, issue 52). A seed with nothing computed is undetermined too.
    """
    known = np.isfinite(values)
    if not known.any():
        return np.nan, np.nan, False, False
    failing = np.flatnonzero(values == 1)
    if not failing.size:
        return (xs[-1], np.inf, False, True) if known[-1] else (np.nan, np.nan, False, False)
    first = failing[0]
    if first == 0:
        return floor, xs[0], True, False
    passed = np.flatnonzero(known[:first])
    if not passed.size:
        return np.nan, np.nan, False, False
    return xs[passed[-1]], xs[first], False, False


def wilson_interval(successes, trials, z: float = 1.96):
    """Wilson score interval of a binomial proportion (95% by default): (low, high)."""
    successes = np.asarray(successes, dtype=float)
    trials = np.asarray(trials, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = successes / trials
        denom = 1.0 + z * z / trials
        centre = (p + z * z / (2 * trials)) / denom
        half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return centre - half, centre + half


def t_interval(values: np.ndarray, axis: int = -1, level: float = 0.95):
    """Mean and half-width of the Student-t confidence interval over ``axis`` (NaNs ignored)."""
    from scipy.special import stdtrit  # scipy.stats.t.ppf's own kernel, without importing scipy.stats (1 s)

    values = np.asarray(values, dtype=float)
    count = np.sum(np.isfinite(values), axis=axis)
    # No value (no seed with a threshold on the grid) or one is a NaN mean or half-width, by design:
    # numpy's "Mean of empty slice" / "Degrees of freedom" warnings would only print into exports.
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=axis) if values.size else np.nan
        sd = np.nanstd(values, axis=axis, ddof=1)
        half = stdtrit(np.maximum(count - 1, 1), 0.5 + level / 2) * sd / np.sqrt(count)
    half = np.where(count >= 2, half, np.nan)
    return mean, half
