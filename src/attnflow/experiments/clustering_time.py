"""Clustering time, relu against softmax (Thm 25): O(n) and O(n log d) in the regimes where they hold."""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from ..tokens import typical_cosine
from . import Axis, Experiment

# "<<" in the regimes of Thm 25, read as a factor 4.
REGIME_FACTOR = 4.0


def softmax_regime_n(beta, lam):
    """The least n of softmax's regime: ``n - 1 = 4 e^{beta lambda}``."""
    return 1.0 + REGIME_FACTOR * np.exp(beta * lam)


def relu_regime_d(n):
    """The least d of relu's regime at ``n``: ``(n - 1) / sqrt(d) = 1/4``, i.e. ``d = 16 (n - 1)^2``."""
    return (REGIME_FACTOR * (np.asarray(n, float) - 1.0)) ** 2


def in_regime(attention: str, n, d, beta, lam):
    """Where each bound's linearisation holds.

    relu: ``(n - 1) gamma0 <= 1/4`` with ``gamma0 = 1/sqrt(d)`` (the cosine term of
    the drive is small all the way from the start); softmax: ``n - 1 >= 4 e^{beta
    lambda}`` (the drive at gamma = 0 is ``~2 Lambda / n``).
    """
    n, d = np.broadcast_arrays(np.asarray(n, float), np.asarray(d, float))
    if attention == "relu":
        return (n - 1) * typical_cosine(d) <= 1.0 / REGIME_FACTOR
    return n >= softmax_regime_n(beta, lam)


def initial_drive_bound(attention: str, gamma0, gamma1, n, beta, lambdas):
    """An upper bound on the time from gamma0 to gamma1 read off the initial drive (Thm 25).

    softmax: ``(gamma1 - gamma0) / rate(gamma0)``, of order n (the drive grows with gamma at these
    beta). relu: the linearised ODE ``dgamma/dt = (2 beta sum lambda^2 / n) gamma`` gives
    ``n ln(gamma1 / gamma0) / (2 beta sum lambda^2)``, of order n log d, but it bounds the time only
    while the dropped factor ``(1 - gamma)(1 + (n - 1) gamma) >= 1``, i.e. for ``gamma1 <= (n - 2) / (n
    - 1)``: never at n = 2, where the true time to 1/2 exceeds it by ~10% at d = 64. Elsewhere the
    bound drops only ``1 + (n - 1) gamma >= 1``: ``n [logit(gamma1) - logit(gamma0)] / (2 beta sum
    lambda^2)``, a true bound for every n, also O(n log d) (see :func:`relu_linear_is_bound`).
    """
    lambdas = np.asarray(lambdas, float)
    if attention == "relu":
        scale = n / (2.0 * beta * np.sum(lambdas**2))
        linear = scale * np.log(gamma1 / gamma0)
        logit = scale * (np.log(gamma1 / (1.0 - gamma1)) - np.log(gamma0 / (1.0 - gamma0)))
        return np.where(relu_linear_is_bound(gamma1, n), linear, logit)
    return (gamma1 - gamma0) / theory.equiangular_rate(gamma0, lambdas, beta, n)


def relu_linear_is_bound(gamma1, n):
    """Where relu's linearised time bounds the true one: ``gamma1 <= (n - 2) / (n - 1)``."""
    n = np.asarray(n, float)
    return np.asarray(gamma1, float) <= (n - 2.0) / (n - 1.0)


def loglog_slope(t: np.ndarray, n: np.ndarray) -> float:
    ok = np.isfinite(t) & (t > 0)
    if ok.sum() < 2:
        return np.nan
    return float(np.polyfit(np.log(n[ok]), np.log(t[ok]), 1)[0])


class ClusteringTime(Experiment):
    name = "clustering_time"
    theorem = "Thm 25"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("How long do relu and softmax attention take to cluster from a typical start, against "
                "the closed-form time of the equiangular ODE, and do the bounds T = O(n) (softmax) and "
                "O(n log d) (relu) show in the regimes where they are derived?")
    axes = (
        Axis("n", min_values=2, why="exponents in n"),
        Axis("d", min_values=2, why="the log d dependence"),
        Axis("attention", required=("softmax", "relu"), allowed=("softmax", "relu"),
             why="relu against softmax, the equiangular ODE's two types"),
        Axis("init", required=("equiangular_typical",), why="the theorem's equiangular start"),
        Axis("cluster_threshold"),
    )
    observables = ("clusters",)
    figures = ("", "uniform")  # clustering_time.png: equiangular starts; clustering_time-uniform.png: random
    defaults = {
        "fixed": {"heads": "scalar", "H": 1, "beta": 1.0, "lambda_bar": 1.0, "cluster_metric": "gamma_mean",
                  "cluster_eps": 1e-2, "t_max": 100.0, "n_samples": 21, "seeds": 16,
                  "rtol": 1e-8, "atol": 1e-11},
        "grid": {"attention": ["softmax", "relu"], "init": ["equiangular_typical", "uniform"],
                 "cluster_threshold": [0.5, 0.99], "n": [2, 4, 8, 16], "d": [64, 256, 1024, 4096]},
        "batch_over": ["n", "d", "cluster_threshold", "init"],
    }
    caption = ("Thm 25, equal scalar heads. (a) relu and (b) softmax: time for the mean cosine to reach "
               "1/2 (filled) and 0.99 (open) from equiangular tokens with gamma0 = 1/sqrt(d), against n, "
               "per d: particles (markers), the exact time integral of the equiangular ODE (lines), and "
               "an upper bound to 1/2 read off the initial drive (dashed: for relu the linearised time n "
               "ln(gamma1 / gamma0) / (2 beta sum lambda^2) where it is a bound, gamma1 <= (n-2)/(n-1), "
               "and n [logit(gamma1) - logit(gamma0)] / (2 beta sum lambda^2) elsewhere, i.e. at n = 2, "
               "where the linearised time is ~10% short of the true one; for softmax (gamma1 - gamma0) "
               "/ rate(gamma0), a bound while the drive grows with gamma: at n = 2 and small d it is not "
               "(d = 8: 2% short; the default d >= 64 keeps it above)); slopes fitted where "
               "each bound's linearisation holds (shaded), over every n where fewer than two n are "
               "shaded (marked 'all n'). (c) the same against d. (d) particles against the closed form. "
               "Uniform random starts, in clustering_time-uniform.png: (a) clusters left at t_max and (b) "
               "runs that never reached the level.")
    reading = ("On equiangular tokens the particles sit on the closed-form lines (panel d: the relative "
               "gap is the solver's tolerance). Relu has no drive at gamma = 0 and escapes gamma0 = "
               "1/sqrt(d) exponentially at rate 2 beta sum lambda^2 / n. The n log d of its bound shows "
               "in the dependence on d: in panel c relu's time is linear in log d with slope close to "
               "the bound's n / (4 beta sum lambda^2) where (n - 1) gamma0 is small, and below it as "
               "(n - 1) gamma0 grows. In n the time stays under the dashed bound and rises more slowly "
               "(fitted slopes below 1 in the shaded regime): the factor 1 + (n - 1) gamma speeds the "
               "drive up as the tokens gather, so O(n log d) bounds relu's time without being its "
               "scaling in n. Softmax has a positive drive ~2 Lambda / n "
               "at gamma = 0: the dashed O(n) line bounds its time, but the drive grows as the tokens "
               "gather, so the measured exponent in n is far below 1 (fitted over every n of the "
               "default grid, whose shaded regime holds one n): O(n) is a bound, not the scaling. "
               "From random tokens relu weights vanish between tokens with negative cosine: "
               "relu runs freeze into several clusters (clustering_time-uniform.png, panel a), "
               "which a censored time alone would hide.")

    pinned = {
        "cluster_metric": ("gamma_mean", "the time for the mean cosine to reach each cluster_threshold"),
        "stop_at_cluster": (False, "the uniform-start figure counts the clusters left at t_max"),
        **{key: (value, "the closed form is the equiangular ODE of equal scalar heads")
           for key, value in (("heads", "scalar"), ("lambda_dist", "equal"))},
    }

    # 2: no stray scalar coordinate time (left by isel(time=-1)); units and descriptions on every variable.
    reduction_version = 2

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        return xr.Dataset({
            "t_cluster": ds.t_cluster.where(~ds.censored, np.inf),
            "clusters_end": ds.cluster_count.isel(time=-1).astype(float),
        })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        H, beta, lam = int(spec.fixed["H"]), float(spec.fixed["beta"]), float(spec.fixed["lambda_bar"])
        lambdas = np.full(H, lam)
        n, d = out.n.values.astype(float), out.d.values.astype(float)
        levels = out.cluster_threshold.values.astype(float)
        atts = [str(a) for a in out.attention.values]
        gamma0 = typical_cosine(d)
        shape = (len(atts), n.size, d.size, levels.size)
        closed, bound = np.empty(shape), np.empty(shape)
        for a, att in enumerate(atts):
            closed[a] = theory.equiangular_time(gamma0[None, :, None], levels[None, None, :], lambdas, beta,
                                                n[:, None, None], att)
            bound[a] = initial_drive_bound(att, gamma0[None, :, None], levels[None, None, :],
                                           n[:, None, None], beta, lambdas)
        dims = ("attention", "n", "d", "cluster_threshold")
        out["t_closed"] = (dims, closed)
        out["t_bound"] = (dims, bound)
        out["regime"] = (("attention", "n", "d"),
                         np.stack([in_regime(att, n[:, None], d[None, :], beta, lam) for att in atts]))
        eq = out.sel(init="equiangular_typical")
        out["t_equiangular"] = eq.t_cluster.median("seed").transpose(*dims)
        out["rel_error"] = out.t_equiangular / out.t_closed - 1.0
        fit = np.full((len(atts), d.size, levels.size), np.nan)
        fit_all = np.full_like(fit, np.nan)
        for a in range(len(atts)):
            for k in range(d.size):
                regime = out.regime.values[a, :, k]
                for m in range(levels.size):
                    measured = out.t_equiangular.values[a, :, k, m]
                    fit[a, k, m] = loglog_slope(measured[regime], n[regime])
                    fit_all[a, k, m] = loglog_slope(measured, n)
        out["exponent_n"] = (("attention", "d", "cluster_threshold"), fit)
        out["exponent_n_all"] = (("attention", "d", "cluster_threshold"), fit_all)
        # dT / d(log d) at fixed n; for relu in its regime the bound's slope is n / (4 beta sum lambda^2).
        slope = np.full((len(atts), n.size, levels.size), np.nan)
        for a in range(len(atts)):
            for i in range(n.size):
                for m in range(levels.size):
                    t = out.t_equiangular.values[a, i, :, m]
                    ok = np.isfinite(t)
                    if ok.sum() >= 2:
                        slope[a, i, m] = np.polyfit(np.log(d[ok]), t[ok], 1)[0]
        out["log_d_slope"] = (("attention", "n", "cluster_threshold"), slope)
        out["log_d_slope_relu_bound"] = ("n", n / (4.0 * beta * np.sum(lambdas**2)))
        if "uniform" in out.init.values:
            uni = out.sel(init="uniform")
            out["censored_uniform"] = np.isinf(uni.t_cluster).where(uni.t_cluster.notnull()).mean("seed")
            out["clusters_uniform"] = uni.clusters_end.median("seed")
            out["clusters_uniform_q1"] = uni.clusters_end.quantile(0.25, "seed").drop_vars("quantile")
            out["clusters_uniform_q3"] = uni.clusters_end.quantile(0.75, "seed").drop_vars("quantile")
        out.attrs.update({"H": H, "beta": beta, "lambda_bar": lam})
        return out

    def export_table(self, summary):
        """The fitted exponents, one row per line of the grid: T ~ n^p along n (per attention, d, level;
        in the regime where the bound is derived, and over every n) and T ~ s log d along d (per
        attention, n, level), each with its 95% interval, the same fit of the closed-form time, and
        the bound's exponent or slope."""
        import pandas as pd

        from ..tables import slope_interval, time_units

        n, d = summary.n.values.astype(float), summary.d.values.astype(float)
        seeds = summary.t_cluster.sel(init="equiangular_typical").notnull().sum("seed")
        rows = []
        for att in summary.attention.values:
            for level in summary.cluster_threshold.values:
                point = {"attention": str(att), "cluster_threshold": float(level)}
                for dd in d:
                    sel = {"attention": att, "d": dd, "cluster_threshold": level}
                    measured = summary.t_equiangular.sel(sel).values
                    closed = summary.t_closed.sel(sel).values
                    regime = summary.regime.sel(attention=att, d=dd).values.astype(bool)
                    for which, mask in (("regime", regime), ("all", np.ones_like(regime))):
                        fit = slope_interval(np.log(n[mask]), np.log(measured[mask]))
                        rows.append({"fit": f"log T ~ p log n ({which} n)", **point, "d": dd, "n": np.nan,
                                     "points": int(np.isfinite(measured[mask]).sum()),
                                     "seeds": int(seeds.sel(sel).values[mask].min()) if mask.any() else 0,
                                     "measured": fit[0], "low": fit[1], "high": fit[2],
                                     "closed_form": slope_interval(np.log(n[mask]), np.log(closed[mask]))[0],
                                     "bound": 1.0})
                for nn in n:
                    sel = {"attention": att, "n": nn, "cluster_threshold": level}
                    measured = summary.t_equiangular.sel(sel).values
                    fit = slope_interval(np.log(d), measured)
                    closed = slope_interval(np.log(d), summary.t_closed.sel(sel).values)[0]
                    bound = float(summary.log_d_slope_relu_bound.sel(n=nn)) if att == "relu" else np.nan
                    rows.append({"fit": "T ~ s log d", **point, "d": np.nan, "n": nn,
                                 "points": int(np.isfinite(measured).sum()),
                                 "seeds": int(seeds.sel(sel).min()),
                                 "measured": fit[0], "low": fit[1], "high": fit[2],
                                 "closed_form": closed, "bound": bound})
        df = pd.DataFrame(rows)
        df.attrs["columns"] = {
            "fit": "which fit: the exponent in n at fixed d (in the bound's regime, or over every n), or the "
                   "slope in log d at fixed n",
            "attention": "attention", "cluster_threshold": "the mean-cosine level reached",
            "d": "the fixed d of an n-fit", "n": "the fixed n of a log d fit",
            "points": "grid points with a measured time in the fit",
            "seeds": "seeds each point's median time is over (the fewest at any point of the fit)",
            "measured": "fitted exponent or slope of the particles' median time (equiangular start)",
            "low": "95% Student-t interval of the fit, lower end (NaN with fewer than 3 points)",
            "high": "95% Student-t interval of the fit, upper end",
            "closed_form": "the same fit of the closed-form time (equiangular ODE, Thm 25), same points",
            "bound": "the bound's exponent in n (O(n), O(n log d)) or relu's log d slope n / (4 beta sum "
                     "lambda^2)",
        }
        # An exponent in n is a number; a slope in log d is a time per unit of log d. The model's time is a
        # number too (attnflow.units), so one column holds both, in units "1".
        if time_units(summary) != "1":
            raise ValueError(f"clustering_time export: time in {time_units(summary)!r}, not a number: an "
                             "exponent and a slope would share a column in two units")
        df.attrs["units"] = {"fit": None, "attention": None, "cluster_threshold": "1", "d": "1", "n": "1",
                             "points": "1", "seeds": "1",
                             **dict.fromkeys(("measured", "low", "high", "closed_form", "bound"), "1")}
        return df

    def plot(self, summary, spec, part=""):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import figure_width, plt
        from ._clustering_time_figures import equiangular, uniform

        ds = self.with_axes(summary, spec)
        width = figure_width()
        ncols = 2 if width >= 5 else 1
        if part == "":
            # Each panel over an axes of its own that holds its legend: off the data, and as wide as the
            # panel (a legend hung below an axes would widen its column).
            nrows = -(-4 // ncols)
            fig, grid = plt.subplots(2 * nrows, ncols, squeeze=False, layout="constrained",
                                     figsize=(width, min(3.0 * nrows + 0.6, 9.0)),
                                     gridspec_kw={"height_ratios": [2.2, 0.8] * nrows})
            axes = [grid[2 * (k // ncols), k % ncols] for k in range(4)]
            keys = [grid[2 * (k // ncols) + 1, k % ncols] for k in range(4)]
            for key in keys:
                key.set_axis_off()
            equiangular(self, fig, axes, keys, ds, spec)
        else:
            nrows = -(-2 // ncols)
            fig, grid = plt.subplots(nrows, ncols, squeeze=False, layout="constrained",
                                     figsize=(width, min(2.3 * nrows + 1.3, 9.0)))
            uniform(self, fig, grid.flat, ds, spec)
        return fig


EXPERIMENT = ClusteringTime()
