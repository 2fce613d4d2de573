"""Metastability (docs/model.md, result 10): the staircase of the cluster count against log t, and how long
its plateaus last as beta grows."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from . import Axis, Experiment

# The exponential and power-law fits of the plateau length are told apart when one's residual
# variance (in log length) is below this fraction of the other's; otherwise "cannot tell".
PREFERENCE = 0.5
# The fit uses the betas where fewer than this fraction of the plateaus outlast t_max.
MAX_CENSORED = 0.5


def longest_plateau(times: np.ndarray, counts: np.ndarray) -> tuple[float, bool, float]:
    """The longest stretch of one run's cluster count at a constant value >= 2, after t = 0.

    A plateau starts at the first sample with its count and ends at the first sample with another
    count (a merge); one still on at the last sample is censored (its length is then a lower
    bound, up to ``t_max``). Returns ``(length, censored, count)``; ``(nan, False, nan)`` when the
    run never holds two or more clusters after t = 0. Lengths are resolved to the sample spacing.
    """
    t, c = np.asarray(times, float)[1:], np.asarray(counts, float)[1:]
    ok = np.isfinite(c)
    t, c = t[ok], c[ok]
    best = (np.nan, False, np.nan)
    start = 0
    for k in range(1, c.size + 1):
        if k == c.size or c[k] != c[start]:
            if c[start] >= 2:
                censored = k == c.size
                length = (t[-1] if censored else t[k]) - t[start]
                if not np.isfinite(best[0]) or length > best[0]:
                    best = (float(length), bool(censored), float(c[start]))
            start = k
    return best


def growth_fit(beta: np.ndarray, length: np.ndarray, level: float = 0.95) -> dict:
    """Fits of ``log L`` against beta (exponential: ``L ~ e^{rate beta}``) and against ``log beta``
    (power law: ``L ~ beta^power``), least squares over the given runs, with the t-interval of each
    slope; and which of the two the data favour.

    The run-to-run scatter at one beta is common to both models, so they are told apart by their lack
    of fit: the mean squared residual of the per-beta means of ``log L`` (weighted by runs), against
    the noise of those means (within-beta variance / runs). A model is preferred when its lack of
    fit is below ``PREFERENCE`` times the other's and the other's exceeds twice the noise.
    """
    from scipy import stats

    ok = np.isfinite(length) & (length > 0)
    x, y = np.asarray(beta, float)[ok], np.log(np.asarray(length, float)[ok])
    out = {"runs": int(ok.sum())}
    if np.unique(x).size < 3:
        return {**out, "rate": np.nan, "rate_half": np.nan, "rate_intercept": np.nan, "power": np.nan,
                "power_half": np.nan, "power_intercept": np.nan, "verdict": "too few betas to fit"}
    groups = np.unique(x)
    counts = np.array([np.sum(x == g) for g in groups])
    means = np.array([y[x == g].mean() for g in groups])
    spread = np.array([y[x == g].var(ddof=1) if c > 1 else np.nan
                       for g, c in zip(groups, counts, strict=True)])
    noise = np.nanmean(spread / counts) if np.isfinite(spread).any() else 0.0
    lack = {}
    for key, xs, gs in (("rate", x, groups), ("power", np.log(x), np.log(groups))):
        fit = stats.linregress(xs, y)
        half = stats.t.ppf(0.5 + level / 2, x.size - 2) * fit.stderr
        out[key], out[f"{key}_half"], out[f"{key}_intercept"] = fit.slope, half, fit.intercept
        lack[key] = np.average((means - fit.intercept - fit.slope * gs) ** 2, weights=counts)
    if lack["rate"] < PREFERENCE * lack["power"] and lack["power"] > 2 * noise:
        out["verdict"] = "looks exponential in beta"
    elif lack["power"] < PREFERENCE * lack["rate"] and lack["rate"] > 2 * noise:
        out["verdict"] = "looks like a power of beta"
    else:
        out["verdict"] = "exp and power law fit alike: cannot tell"
    out.update({"lack_exp": lack["rate"], "lack_power": lack["power"], "noise": noise})
    return out


class Metastability(Experiment):
    name = "metastability"
    theorem = "result 10 (Geshkovski et al. 2024)"
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
               "Bottom: the longest plateau of each run (a count >= 2 held between two merges) against "
               "beta, log scale; open markers are censored (still on at t_max, lower bounds); lines: "
               "least-squares fits of log length against beta (exponential) and against log beta (power "
               "law) over the uncensored runs, with 95% intervals of the slopes and which fits better.")
    reading = ("Samples are evenly spaced in log t (sample_spacing: log), so every decade of the horizon "
               "has the same resolution. At small beta the tokens reach one cluster within a few time "
               "units. As beta grows the count drops within O(1) time to several clusters and then stays "
               "there over decades of t: the staircase. The plateau lengths grow with beta; the bottom "
               "row says whether exponential growth (the cited theorem, in the limit of large beta) fits "
               "better than a power law on the range measured. Plateaus that outlast t_max are censored, "
               "so at the largest beta the fit is a lower bound unless the horizon grows with it.")

    pinned = {
        "sample_spacing": ("log", "the staircase needs samples evenly spaced in log t"),
        "init": ("uniform", "metastable states form from uniform random tokens"),
        "stop_at_cluster": (False, "the plateaus are read from the cluster count up to t_max"),
    }
    # 2: the fits' intercepts and the betas fitted (``fitted``) are in the summary, so the figure draws
    # derive()'s fits instead of refitting their intercepts.
    reduction_version = 2
    fixed_only = {key: "every cell shares one sample grid, the map's time axis"
                  for key in ("t_max", "n_samples")}

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        counts = ds.cluster_count.astype(float).load().transpose(..., "time")
        times = ds.time.values
        runs = counts.values.reshape(-1, counts.sizes["time"])  # one row per (cell, seed)
        plateaus = [longest_plateau(times, run) for run in runs]
        length, censored, level = (np.array(v, dtype=float).reshape(counts.shape[:-1])
                                   for v in zip(*plateaus, strict=True))
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
        # Uncensored runs, at the betas where most runs are uncensored (elsewhere the runs that merged
        # before t_max are the short tail, and would bias the fit down); the figure draws the fits there.
        out["fitted"] = out.censored_fraction < MAX_CENSORED
        keys = ("rate", "rate_half", "rate_intercept", "power", "power_half", "power_intercept")
        fits = {k: np.full((out.sizes["H"], out.sizes["d"]), np.nan) for k in keys}
        verdicts = np.empty((out.sizes["H"], out.sizes["d"]), dtype=object)
        for i, H in enumerate(out.H.values):
            for j, d in enumerate(out.d.values):
                sub = out.sel(H=H, d=d)
                keep = sub.fitted & (sub.plateau_censored == 0)
                length = sub.plateau.where(keep).transpose("beta", "seed").values
                beta = np.broadcast_to(sub.beta.values.astype(float)[:, None], length.shape)
                fit = growth_fit(beta.ravel(), length.ravel())
                for k in keys:
                    fits[k][i, j] = fit[k]
                verdicts[i, j] = fit["verdict"]
        for k in keys:
            out[f"fit_{k}"] = (("H", "d"), fits[k])
        out["fit_verdict"] = (("H", "d"), verdicts.astype(str))
        return out

    def export_table(self, summary):
        """Per (H, d): the fitted growth of the longest plateau with beta, exponential rate and power-law
        exponent with their 95% intervals, and which of the two the data favour. The cited theorem
        gives the exponential form, not its rate: there is no closed form to set beside them."""
        from ..export import table

        columns = {}
        for key, model in (("rate", "exponential rate: L ~ exp(rate beta)"),
                           ("power", "power-law exponent: L ~ beta^power")):
            fit, half = summary[f"fit_{key}"], summary[f"fit_{key}_half"]
            columns[key] = (fit, f"{model}, least squares of log L over the uncensored runs at the betas "
                                 f"where fewer than {MAX_CENSORED:g} of the plateaus outlast t_max")
            columns[f"{key}_low"] = (fit - half, "95% Student-t interval of the slope, lower end")
            columns[f"{key}_high"] = (fit + half, "95% Student-t interval of the slope, upper end")
        columns["verdict"] = (summary.fit_verdict, "which model the per-beta means favour (lack of fit "
                                                   f"below {PREFERENCE:g} times the other's), or cannot tell")
        return table(summary, ["H", "d"], columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import (
            MIN_TEXT,
            figure_width,
            legend_of_drawn,
            log_edges,
            log_ticks,
            plain_log_axis,
            plt,
            sns,
            wrap,
        )

        ds = self.with_axes(summary, spec)
        combos = [(H, d) for H in ds.H.values for d in ds.d.values]
        fig, axes = plt.subplots(3, len(combos), figsize=(figure_width(), 9.0), squeeze=False,
                                 layout="constrained")
        t = ds.time.values[1:]  # t = 0 has no place on a log axis
        betas = ds.beta.values.astype(float)
        t_edges, b_edges = log_edges(t), log_edges(betas)
        n = int(spec.fixed["n"])
        shown = betas[np.unique(np.linspace(0, betas.size - 1, min(3, betas.size)).round().astype(int))]
        colours = dict(zip(shown, sns.color_palette("viridis", n_colors=shown.size), strict=True))
        mesh = None
        for col, (H, d) in enumerate(combos):
            sub = ds.sel(H=H, d=d)
            # A beta whose cells all failed has no staircase below: no dotted line for it either.
            drawn = [b for b in shown if np.isfinite(sub.count_median.sel(beta=b).values).any()]
            ax = axes[0, col]
            median = sub.count_median.transpose("beta", "time").values[:, 1:]
            mesh = ax.pcolormesh(t_edges, b_edges, median, cmap="viridis", vmin=1, vmax=n, shading="flat")
            ax.set_xscale("log")
            log_ticks(ax, "y", betas)
            for b in drawn:
                ax.axhline(b, color=colours[b], lw=0.8, ls=":")
            ax.set_xlabel("time $t$ (log)")
            ax.set_ylabel(r"inverse temperature $\beta$")
            ax.set_title(f"H = {H}, d = {d}: median cluster count over (log t, beta)\n(dotted: the betas "
                         "of the staircase below)", fontsize=8)

            ax = axes[1, col]
            for b in drawn:
                row = sub.sel(beta=b)
                ax.step(t, row.count_median.values[1:], where="post", color=colours[b], lw=1.6,
                        label=rf"$\beta$ = {b:g}: median")
                for q in ("count_q1", "count_q3"):
                    ax.step(t, row[q].values[1:], where="post", color=colours[b], lw=0.8, ls="--")
            ax.set_xscale("log")
            plain_log_axis(ax, "y", base=2, subs=(1.0,))  # counts: 1, 2, 4, 8, 16
            ax.set_xlabel("time $t$ (log)")
            ax.set_ylabel("clusters (median; dashed: quartiles)")
            ax.set_title(f"H = {H}, d = {d}: the staircase, {ds.sizes['seed']} seeds", fontsize=8)
            legend_of_drawn(ax, fontsize=MIN_TEXT)

            ax = axes[2, col]
            length = sub.plateau.transpose("beta", "seed").values
            cens = sub.plateau_censored.transpose("beta", "seed").values > 0
            jitter = np.exp(np.linspace(-0.04, 0.04, length.shape[1]))[None, :]
            bb = betas[:, None] * jitter
            ax.scatter(bb[~cens], length[~cens], s=14, color="C0", label="longest plateau (run)")
            ax.scatter(bb[cens], length[cens], s=14, facecolors="none", edgecolors="C3",
                       label="censored at t_max (lower bound)")
            ax.plot(betas, sub.plateau_median.values, "k_", ms=14, mew=2, label="median")
            fit = {k: float(sub[f"fit_{k}"]) for k in ("rate", "rate_half", "rate_intercept", "power",
                                                       "power_half", "power_intercept")}
            verdict = str(sub.fit_verdict.values)
            if np.isfinite(fit["rate"]):
                # derive()'s fits, solid over the betas it fitted and faded beyond them:
                # log length = intercept + slope * u(beta), u = beta (exponential) or log beta (power law)
                fitted = sub.fitted.values.astype(bool)
                lo, hi = betas[fitted].min(), betas[fitted].max()
                models = (
                    ("k-", "rate", np.asarray,
                     f"exp: rate {fit['rate']:.3g} ± {fit['rate_half']:.2g} per unit beta"),
                    ("k--", "power", np.log,
                     f"power: beta^({fit['power']:.3g} ± {fit['power_half']:.2g})"),
                )
                for style, key, u, label in models:
                    a, slope = fit[f"{key}_intercept"], fit[key]
                    inside = np.geomspace(lo, hi, 50)
                    ax.plot(inside, np.exp(a + slope * u(inside)), style, lw=1, label=label)
                    for start, stop in ((betas.min(), lo), (hi, betas.max())):
                        if stop > start:
                            beyond = np.geomspace(start, stop, 20)
                            ax.plot(beyond, np.exp(a + slope * u(beyond)), style, lw=1, alpha=0.3)
            t_max = float(spec.fixed["t_max"])
            ax.axhline(t_max, color="0.5", lw=0.8, ls=":", label="t_max")
            floor = np.nanmin(length) if np.isfinite(length).any() else 1e-2
            ax.set_ylim(floor / 3, t_max * 10)
            ax.set_xscale("log")
            log_ticks(ax, "x", betas)
            ax.set_yscale("log")
            ax.set_xlabel(r"inverse temperature $\beta$")
            ax.set_ylabel("longest plateau length (time)")
            ax.set_title(f"H = {H}, d = {d}: {verdict}\n(fit: betas < {MAX_CENSORED:.0%} censored; "
                         "faded: beyond; ±: 95%)", fontsize=8)
            legend_of_drawn(ax, fontsize=MIN_TEXT)  # no entry for censored runs where there are none
        fig.colorbar(mesh, ax=list(axes[0]), label="median cluster count")
        fixed = self.describe_fixed(spec, ("attention", "heads", "n", "lambda_bar", "cluster_eps", "t_max"))
        fig.suptitle(wrap(f"Metastability (result 10): cluster count against log t; {fixed}; samples evenly "
                          "spaced in log t", 0.95 * figure_width(), 9), fontsize=9)
        return fig


EXPERIMENT = Metastability()
