"""Metastability (docs/model.md, result 10): the staircase of the cluster count against log t, and how long
its plateaus last as beta grows."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from ..pack import cell_values
from . import Axis, Experiment

# The exponential and power-law fits are told apart when one's maximised log-likelihood exceeds the
# other's by more than this (both have three parameters, so it is an AIC difference of 4: the other
# model keeps under e^-2 = 14% of the support); otherwise "cannot tell".
LOGLIK_MARGIN = 2.0
# A plateau lasts at least this factor of the time it began at (t_end >= PLATEAU_SPAN t_start).
PLATEAU_SPAN = 2.0


def plateaus(times: np.ndarray, counts: np.ndarray, tokens: int) -> list[tuple[float, bool, float]]:
    """One run's plateaus of the cluster count: ``(length, censored, count)`` each.

    A plateau is a metastable state: a stretch of one count that (i) is entered by a merge, a drop of
    the count, so the initial stretch before any two tokens meet is never one; (ii) holds formed
    clusters, between 2 and ``tokens / 2`` of them (two tokens or more per cluster on average:
    before that most tokens are still alone, moving towards each other, the first transient); and
    (iii) lasts at least as long as the time it began at (``t_end >= PLATEAU_SPAN t_start``, a
    visible step in log t). A metastable state outlives its formation: it forms in O(1) time and
    lasts ~e^(c beta) (Geshkovski et al.), while the counts the tokens pass through as they collapse,
    at any beta, each last a fraction of their age. The stretch still on at the last sample is
    censored (its length ``t_max - t_start`` a lower bound) and counts when it meets (i) and (ii):
    whether it meets (iii) is not known yet. Lengths are resolved to the sample spacing.
    """
    t, c = np.asarray(times, float), np.asarray(counts, float)
    ok = np.isfinite(c)
    t, c = t[ok], c[ok]
    found = []
    start = 0
    for k in range(1, c.size + 1):
        if k == c.size or c[k] != c[start]:
            entered_by_merge = start > 0 and c[start] < c[start - 1]
            if entered_by_merge and 2 <= c[start] <= tokens / 2:
                censored = k == c.size
                end = t[-1] if censored else t[k]
                if censored or end >= PLATEAU_SPAN * t[start]:
                    found.append((float(end - t[start]), bool(censored), float(c[start])))
            start = k
    return found


def longest_plateau(times: np.ndarray, counts: np.ndarray, tokens: int) -> tuple[float, bool, float]:
    """The longest of one run's ``plateaus``: ``(length, censored, count)``; ``(nan, False, nan)`` when it
    has none. Censored when the run ends on a plateau: the longest is then at least ``length`` (the
    last one may yet outlast every earlier one), a lower bound for the fit."""
    found = plateaus(times, counts, tokens)
    if not found:
        return (np.nan, False, np.nan)
    length, _, count = max(found, key=lambda p: p[0])
    return (length, found[-1][1], count)


def censored_fit(x: np.ndarray, y: np.ndarray, censored: np.ndarray, level: float = 0.95) -> dict:
    """Maximum likelihood of ``y = intercept + slope x + sigma e``, e standard normal, where a censored
    ``y`` is a lower bound (a Tobit model: an exact value enters by its density, a censored one by
    the probability of exceeding it). With nothing censored it is least squares. Returns intercept,
    slope, the slope's half-width (``level``; Student t on runs - 2 degrees of freedom, the standard
    error from the observed information) and the maximised log-likelihood; NaNs when it has no
    maximum (fewer than two exact values, or fewer than three distinct x)."""
    from scipy import optimize, special, stats

    x, y, censored = np.asarray(x, float), np.asarray(y, float), np.asarray(censored, bool)
    nan = {"intercept": np.nan, "slope": np.nan, "half": np.nan, "loglik": np.nan}
    if (~censored).sum() < 2 or np.unique(x).size < 3:
        return nan

    def negative_loglik(theta):
        a, b, log_sigma = theta
        z = (y - a - b * x) / np.exp(log_sigma)
        exact = -0.5 * z[~censored] ** 2 - 0.5 * np.log(2 * np.pi) - log_sigma  # log density
        return -(np.sum(exact) + np.sum(special.log_ndtr(-z[censored])))  # log P(e > z) for a bound

    slope, intercept = np.polyfit(x, y, 1)  # start: least squares with the bounds taken as values
    spread = float(np.std(y - intercept - slope * x)) or 1.0
    start = [intercept, slope, np.log(spread)]
    result = optimize.minimize(negative_loglik, start, method="BFGS", options={"gtol": 1e-8})
    # BFGS stops on "precision loss" at the optimum of a flat likelihood: the gradient says whether it is.
    if not (result.success or np.linalg.norm(result.jac) < 1e-5 * x.size):
        # a rough start (heavy censoring): the simplex first, then BFGS again
        rough = optimize.minimize(negative_loglik, start, method="Nelder-Mead",
                                  options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 20000})
        result = optimize.minimize(negative_loglik, rough.x, method="BFGS", options={"gtol": 1e-8})
    theta = result.x
    if not np.isfinite(result.fun) or theta[2] < np.log(spread) - 30:  # sigma -> 0: no maximum
        return nan
    # The observed information by central differences (steps 1e-4 of each parameter's scale).
    step = 1e-4 * np.maximum(np.abs(theta), 1.0)
    hessian = np.empty((3, 3))
    for i in range(3):
        for j in range(3):
            ei, ej = np.eye(3)[i] * step[i], np.eye(3)[j] * step[j]
            hessian[i, j] = (negative_loglik(theta + ei + ej) - negative_loglik(theta + ei - ej)
                             - negative_loglik(theta - ei + ej) + negative_loglik(theta - ei - ej)) / (
                                 4 * step[i] * step[j])
    try:
        variance = np.linalg.inv(hessian)[1, 1]
    except np.linalg.LinAlgError:
        variance = np.nan
    half = stats.t.ppf(0.5 + level / 2, max(x.size - 2, 1)) * np.sqrt(variance) if variance > 0 else np.nan
    return {"intercept": theta[0], "slope": theta[1], "half": half, "loglik": -result.fun}


def growth_fit(beta: np.ndarray, length: np.ndarray, censored=None, level: float = 0.95) -> dict:
    """Censored fits (``censored_fit``) of ``log L`` against beta (exponential: ``L ~ e^{rate beta}``)
    and against ``log beta`` (power law: ``L ~ beta^power``), censored lengths lower bounds; and which
    of the two the data favour, by their maximised likelihoods (both have three parameters)."""
    length = np.asarray(length, float)
    censored = np.zeros(length.shape, bool) if censored is None else np.asarray(censored, bool)
    ok = np.isfinite(length) & (length > 0)
    x, y, cens = np.asarray(beta, float)[ok], np.log(length[ok]), censored[ok]
    out = {"runs": int(ok.sum()), "censored": int(cens.sum())}
    if np.unique(x).size < 3:
        return {**out, "rate": np.nan, "rate_half": np.nan, "rate_intercept": np.nan, "power": np.nan,
                "power_half": np.nan, "power_intercept": np.nan, "verdict": "too few betas to fit"}
    loglik = {}
    for key, xs in (("rate", x), ("power", np.log(x))):
        fit = censored_fit(xs, y, cens, level)
        out[key], out[f"{key}_half"], out[f"{key}_intercept"] = fit["slope"], fit["half"], fit["intercept"]
        loglik[key] = fit["loglik"]
    out.update({"loglik_exp": loglik["rate"], "loglik_power": loglik["power"]})
    if not np.isfinite([loglik["rate"], loglik["power"]]).all():
        out["verdict"] = "too few uncensored plateaus to fit"
    elif loglik["rate"] > loglik["power"] + LOGLIK_MARGIN:
        out["verdict"] = "looks exponential in beta"
    elif loglik["power"] > loglik["rate"] + LOGLIK_MARGIN:
        out["verdict"] = "looks like a power of beta"
    else:
        out["verdict"] = "exp and power law fit alike: cannot tell"
    return out


def _verdict_line(sub, verdict: str) -> str:
    """The verdict with its margin (Delta log L, exponential over power law) and the censored runs it rests
    on, naming the betas where most runs are censored (their fit rests on the model's scatter)."""
    if "fit_loglik_margin" not in sub:  # a summary of reduction 3
        return verdict
    margin, runs, cens = (float(sub[f"fit_{k}"]) for k in ("loglik_margin", "runs", "censored"))
    if not np.isfinite(margin):
        return verdict
    text = f"{verdict}, \u0394log L = {margin:+.1f} (exp - power; > {LOGLIK_MARGIN:g} decides); " \
           f"{cens:.0f} of {runs:.0f} runs censored"
    censored = sub.plateau_censored.where(sub.plateau.notnull())
    heavy = [f"{int(censored.sel(beta=b).sum())}/{int(censored.sel(beta=b).notnull().sum())} at "
             f"\u03b2 = {float(b):g}" for b in sub.beta.values
             if float(censored.sel(beta=b).mean()) > 0.5]
    return text + (f" ({', '.join(heavy)})" if heavy else "")


class Metastability(Experiment):
    name = "metastability"
    theorem = "result 10 (Geshkovski et al. 2024)"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("From uniform random tokens at large beta, do the tokens form several clusters within O(1) "
                "time that then persist on plateaus of the cluster count (a staircase in log t), and does "
                "the plateaus' length grow exponentially in beta, as Geshkovski, Koubbi, Polyanskiy and "
                "Rigollet (2024) prove?")
    axes = (
        Axis("beta", min_values=3, why="a map over beta and a fit of the plateau length against it"),
        Axis("H"),
        Axis("d"),
    )
    observables = ("clusters",)
    defaults = {
        "fixed": {"attention": "softmax", "heads": "scalar", "lambda_bar": 1.0,
                  "init": "uniform", "n": 16, "seeds": 8, "t_max": 1000.0, "n_samples": 61,
                  "sample_spacing": "log", "cluster_eps": 1e-2, "lambda_dist": "linear", "spread": 0.5,
                  # Long horizons: at rtol 1e-6 the certificate reads 7e-4 (gamma_min); 1e-8 certifies.
                  "rtol": 1e-8, "atol": 1e-11},
        "grid": {"H": [1, 2], "d": [2], "beta": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0]},
        "batch_over": ["H", "d", "beta"],  # one job in the default grid
    }
    caption = ("Result 10: softmax, scalar heads (with H > 1 of unequal strengths, linear spread, since "
               "equal scalar heads are one head at H times the speed), uniform random tokens. Top: "
               "median cluster count (<x_i, x_j> >= 1 - cluster_eps joins tokens) over (log t, beta), "
               "per (H, d). Middle: the staircase for a few betas, median (solid) and quartiles (dashed). "
               "Bottom: the longest plateau of each run against beta, log scale: a plateau is a count of "
               "2 to n/2 clusters entered by a merge and held at least as long as the time it began at "
               "(so the first transient, the counts the tokens pass through as they first collapse, is "
               "not one); open "
               "markers are censored (the run ends on a plateau: lower bounds); lines: censored-data "
               "(Tobit) maximum-likelihood fits of log length against beta (exponential) and against log "
               "beta (power law) over every run with a plateau, the censored ones as lower bounds, with "
               "95% intervals of the slopes and which fits better.")
    reading = ("Samples are evenly spaced in log t (sample_spacing: log), so every decade of the horizon "
               "has the same resolution. At small beta the tokens reach one cluster within a few time "
               "units. As beta grows the count drops within O(1) time to several clusters and then stays "
               "there over decades of t: the staircase. The plateau lengths grow with beta; the bottom "
               "row says whether exponential growth (the cited theorem, in the limit of large beta) fits "
               "better than a power law on the range measured. Plateaus that outlast t_max are censored: "
               "each enters the fit by the probability that its length exceeds what was seen (a Tobit "
               "likelihood, log-normal scatter about the line, as the least-squares fit assumes for the "
               "exact ones), so they pull the line up instead of being dropped, which biased the rate "
               "down. Where most runs at a beta are censored the fit there rests on the model's scatter: "
               "a longer horizon, not the fit, resolves it. A beta with no plateau (small beta: the "
               "tokens collapse straight to one cluster) adds nothing to the fit.")

    pinned = {
        "sample_spacing": ("log", "the staircase needs samples evenly spaced in log t"),
        "init": ("uniform", "metastable states form from uniform random tokens"),
        "stop_at_cluster": (False, "the plateaus are read from the cluster count up to t_max"),
    }
    # 2: the fits' intercepts and the betas fitted (``fitted``) are in the summary, so the figure draws
    # derive()'s fits instead of refitting their intercepts.
    # 3: a plateau is entered by a merge and lasts as long as its age (the first transient is not one);
    # a run ending on a plateau is censored; the fits are censored-data (Tobit) maximum likelihood over
    # every run with a plateau, censored lengths as lower bounds.
    reduction_version = 4  # 4: the verdict's margin and the censored runs it rests on (fit_loglik_margin...)
    fixed_only = {key: "every cell shares one sample grid, the map's time axis"
                  for key in ("t_max", "n_samples")}

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        counts = ds.cluster_count.astype(float).load().transpose(..., "time")
        times = ds.time.values
        runs = counts.values.reshape(-1, counts.sizes["time"])  # one row per (cell, seed)
        # Tokens per cell: a store group's cells carry it in their attributes, a single run in its own.
        n = cell_values(ds, "cell_n") if "cell" in ds.dims else xr.DataArray(float(ds.attrs["cell_n"]))
        tokens = n.broadcast_like(counts.isel(time=0)).transpose(*counts.dims[:-1])
        found = [longest_plateau(times, run, n) for run, n in zip(runs, tokens.values.ravel(), strict=True)]
        length, censored, level = (np.array(v, dtype=float).reshape(counts.shape[:-1])
                                   for v in zip(*found, strict=True))
        dims = counts.dims[:-1]
        return xr.Dataset({
            "cluster_count": counts,
            "plateau": (dims, length),
            "plateau_censored": (dims, censored),
            "plateau_count": (dims, level),
        })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        # A failed cell is NaN for every seed, so its medians are NaN by design: numpy's "All-NaN slice"
        # warnings would only print into the plot job's log.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
            out["count_median"] = out.cluster_count.median("seed")
            out["count_q1"] = out.cluster_count.quantile(0.25, "seed").drop_vars("quantile")
            out["count_q3"] = out.cluster_count.quantile(0.75, "seed").drop_vars("quantile")
            out["plateau_median"] = out.plateau.median("seed")
            out["censored_fraction"] = out.plateau_censored.where(out.plateau.notnull()).mean("seed")
        # Every run with a plateau enters the fit, a censored one as a lower bound: dropping the censored
        # runs (the longest plateaus, at the largest beta) would bias the rate down.
        out["fitted"] = out.plateau.notnull().any("seed")
        keys = ("rate", "rate_half", "rate_intercept", "power", "power_half", "power_intercept")
        fits = {k: np.full((out.sizes["H"], out.sizes["d"]), np.nan) for k in keys}
        verdicts = np.empty((out.sizes["H"], out.sizes["d"]), dtype=object)
        # What the verdict rests on: its margin, and how many of the runs fitted are lower bounds.
        for k in ("loglik_margin", "runs", "censored"):
            fits[k] = np.full((out.sizes["H"], out.sizes["d"]), np.nan)
        for i, H in enumerate(out.H.values):
            for j, d in enumerate(out.d.values):
                sub = out.sel(H=H, d=d)
                length = sub.plateau.transpose("beta", "seed").values
                censored = sub.plateau_censored.transpose("beta", "seed").values > 0
                beta = np.broadcast_to(sub.beta.values.astype(float)[:, None], length.shape)
                fit = growth_fit(beta.ravel(), length.ravel(), censored.ravel())
                for k in keys:
                    fits[k][i, j] = fit[k]
                fits["loglik_margin"][i, j] = fit.get("loglik_exp", np.nan) - fit.get("loglik_power", np.nan)
                fits["runs"][i, j], fits["censored"][i, j] = fit["runs"], fit["censored"]
                verdicts[i, j] = fit["verdict"]
        for k in fits:
            out[f"fit_{k}"] = (("H", "d"), fits[k])
        out["fit_verdict"] = (("H", "d"), verdicts.astype(str))
        return out

    def export_table(self, summary):
        """Per (H, d): the fitted growth of the longest plateau with beta, exponential rate and power-law
        exponent with their 95% intervals, and which of the two the data favour. The cited theorem
        gives the exponential form, not its rate: there is no closed form to set beside them."""
        from ..tables import seed_count, table

        columns = {}
        for key, model in (("rate", "exponential rate: L ~ exp(rate beta)"),
                           ("power", "power-law exponent: L ~ beta^power")):
            fit, half = summary[f"fit_{key}"], summary[f"fit_{key}_half"]
            columns[key] = (fit, f"{model}, censored-data (Tobit) maximum likelihood of log L over every "
                                 "run with a plateau, those still on at t_max as lower bounds")
            columns[f"{key}_low"] = (fit - half, "95% Student-t interval of the slope, lower end")
            columns[f"{key}_high"] = (fit + half, "95% Student-t interval of the slope, upper end")
        columns["verdict"] = (summary.fit_verdict, "which model the data favour (maximised log-likelihood "
                                                   f"higher by more than {LOGLIK_MARGIN:g}), or cannot tell")
        columns["seeds"] = (seed_count(summary.plateau, ["H", "d"]), "seeds with a plateau per beta (the "
                            "fewest at any beta of the line; censored ones enter the fits as lower bounds)",
                            "1")
        return table(summary, ["H", "d"], columns)

    def plot(self, summary, spec):
        from ._metastability_figure import plot

        return plot(self, summary, spec, _verdict_line)


EXPERIMENT = Metastability()
