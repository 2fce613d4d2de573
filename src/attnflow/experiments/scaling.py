"""Clustering time from uniform random starts over decades of n and d, against Thm 25's closed forms."""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from ..tokens import typical_cosine
from . import Axis, Bound, Experiment
from .clustering_time import in_regime

# Resolution of the closed-form contours (n x d); the softmax quadratures take well under a second.
MAP_POINTS = (33, 25)
# Cells written out on a map (median time, frozen share) up to this many per panel.
ANNOTATE_CELLS = 40


def slope_along(values: np.ndarray, x: np.ndarray) -> float:
    """Least-squares slope of ``values`` against ``x`` over the finite points (NaN with fewer than 2)."""
    ok = np.isfinite(values)
    if ok.sum() < 2:
        return np.nan
    return float(np.polyfit(x[ok], values[ok], 1)[0])


def slopes(values: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """``slope_along`` each line of ``values`` along ``axis`` (that axis gone from the result)."""
    return np.apply_along_axis(slope_along, axis, values, x)


class Scaling(Experiment):
    name = "scaling"
    theorem = "Thm 25, beyond its equiangular start"
    question = ("How does the time to cluster from uniform random tokens grow with n and d, over decades "
                "(to n = 2048 on a GPU), against the closed-form time of the equiangular ODE from the "
                "typical cosine gamma0 = 1/sqrt(d) and the theorem's O(n) and O(n log d) bounds?")
    axes = (
        Axis("n", min_values=2, why="the growth with n"),
        Axis("d", min_values=2, why="the growth with d"),
        Axis("attention", allowed=("softmax", "relu"), why="the equiangular ODE's two types"),
    )
    observables = ("clusters",)
    defaults = {
        "fixed": {"heads": "scalar", "H": 1, "beta": 1.0, "lambda_bar": 1.0, "init": "uniform",
                  "cluster_metric": "gamma_mean", "cluster_threshold": 0.9, "cluster_eps": 1e-2,
                  "stop_at_cluster": True, "t_max": 100.0, "n_samples": 2, "seeds": 16,
                  "rtol": 1e-8, "atol": 1e-11},
        "grid": {"attention": ["softmax", "relu"], "n": [8, 16, 32, 64], "d": [4, 16, 64]},
        # One job: every cell but the largest costs milliseconds, a job's start-up seconds.
        "batch_over": ["attention", "n", "d"],
    }
    caption = ("Clustering from uniform random tokens, equal scalar heads: the time for the mean cosine to "
               "reach the level (stop_at_cluster), over (n, d). (a) softmax and (b) relu: median time over "
               "seeds (colour, and written in the cell); grey hatched: half the runs or more never reached "
               "the level by t_max; a percentage: the share of runs that froze into several clusters. (c) "
               "The same times against n per d (median and quartiles) with the measured law T = a + s ln n "
               "fitted to them (solid, drawn over the n it is fitted on; the legend gives s and its 95% "
               "interval) and, dotted, the equiangular ODE's time from gamma0 = 1/sqrt(d): a reference "
               "random starts do not follow, not a bound. Thm 25's O(n) and O(n log d) bounds are derived "
               "for equiangular starts (clustering_time draws them there) and none is drawn here. (d) The "
               "share of runs that never reached the level, and the median number of clusters they froze "
               "into.")
    reading = ("Thm 25's bounds, T = O(n) (softmax) and O(n log d) (relu), are derived for equiangular "
               "starts; from random starts the medians exceed the bound's own constant (by about 2x at "
               "d = 16 and 5x at d = 4), so no bound is drawn: what (c) shows is the measured law, "
               "T = a + s ln n with its fitted s and interval, over the n it is fitted on. The equiangular "
               "ODE from the typical cosine 1/sqrt(d) (dotted) is a reference, not a bound: uniform starts "
               "are slower than it (1.2-2.2x for softmax, 3-5x for relu) and their time grows like log n, "
               "a constant dT/d ln n in (c), where the closed form barely grows: the mean cosine of random "
               "tokens starts near 0, not at 1/sqrt(d), and the slowest tokens set the time to the level. "
               "Along d the softmax times fall a little (most of it from d = 4 to 16) where the closed form "
               "rises "
               "like ln d (the export's slopes have opposite signs): the closed form's growth in d comes "
               "from its start at 1/sqrt(d), which random tokens do not share. Softmax runs all reach "
               "the level. Relu weights vanish between tokens with negative cosine, so relu runs "
               "freeze into several clusters, most often at small d (two antipodal clusters at d = 4): "
               "panel (d) counts them, which a censored time alone would hide. The default grid stops at "
               "n = 64 for a laptop; config/large.yaml takes it to n = 2048 and d = 512 on a GPU.")

    pinned = {
        "init": ("uniform", "random tokens are what it measures; clustering_time has the equiangular start"),
        "cluster_metric": ("gamma_mean", "the time for the mean cosine to reach the level"),
        "stop_at_cluster": (True, "a run stops at the level: a sweep to n = 2048 spends nothing after it"),
        **{key: (value, "the closed form is the equiangular ODE of equal scalar heads")
           for key, value in (("heads", "scalar"), ("lambda_dist", "equal"))},
    }
    fixed_only = {"cluster_threshold": "one level per map"}
    # A level at or below gamma0 = 1/sqrt(d) has a closed-form time of 0 or less; 1 is never reached.
    bounds = (Bound("cluster_threshold", low=lambda cell: typical_cosine(cell.d), high=1.0,
                    low_text="gamma0 = 1/sqrt(d)", high_text="1"),)

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        # With stop_at_cluster a run that reached the level has counts of -1 after it; one that never
        # did ran to t_max, and its last sample counts the clusters it froze into.
        last = ds.cluster_count.isel(time=-1, drop=True).astype(float)
        return xr.Dataset({
            "t_cluster": ds.t_cluster.where(~ds.censored, np.inf),
            "frozen": (ds.censored & (last >= 2)).astype(float),
            "clusters_end": last.where(ds.censored),
        })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = self.with_axes(summary, spec)
        H, beta, lam = int(spec.fixed["H"]), float(spec.fixed["beta"]), float(spec.fixed["lambda_bar"])
        level = float(spec.fixed["cluster_threshold"])
        lambdas = np.full(H, lam)
        n, d = out.n.values.astype(float), out.d.values.astype(float)
        atts = [str(a) for a in out.attention.values]
        t = out.t_cluster
        # Inf is a run that never got there: the median is inf once half the runs are censored. The
        # quartiles are the nearest order statistics (an interpolation between a time and inf is NaN).
        out["t_median"] = t.median("seed")
        out["t_q1"] = t.quantile(0.25, "seed", method="nearest").drop_vars("quantile")
        out["t_q3"] = t.quantile(0.75, "seed", method="nearest").drop_vars("quantile")
        ran = t.notnull()
        out["censored_fraction"] = np.isinf(t).where(ran).mean("seed")
        out["frozen_fraction"] = out.frozen.where(ran).mean("seed")
        out["clusters_frozen"] = out.clusters_end.median("seed")
        gamma0 = typical_cosine(d)
        shape = (len(atts), n.size, d.size)
        closed = np.empty(shape)
        n_fine = np.geomspace(n.min(), n.max(), MAP_POINTS[0])
        d_fine = np.geomspace(d.min(), d.max(), MAP_POINTS[1])
        fine = np.empty((len(atts), *MAP_POINTS))
        for a, att in enumerate(atts):
            closed[a] = theory.equiangular_time(gamma0[None, :], level, lambdas, beta, n[:, None], att)
            fine[a] = theory.equiangular_time(typical_cosine(d_fine)[None, :], level, lambdas, beta,
                                              n_fine[:, None], att)
        dims = ("attention", "n", "d")
        out["t_closed"] = (dims, closed)
        out["regime"] = (dims, np.stack([in_regime(att, n[:, None], d[None, :], beta, lam) for att in atts]))
        out["median_over_closed"] = out.t_median / out.t_closed
        out = out.assign_coords(n_fine=("n_fine", n_fine), d_fine=("d_fine", d_fine))
        out["t_closed_fine"] = (("attention", "n_fine", "d_fine"), fine)
        median = out.t_median.transpose(*dims).values
        # dT/d ln n at each d and dT/d ln d at each n, of the particles' medians and of the closed form.
        for name, values in (("log_n_slope", median), ("log_n_slope_closed", closed)):
            out[name] = (("attention", "d"), slopes(values, np.log(n), axis=1))
        for name, values in (("log_d_slope", median), ("log_d_slope_closed", closed)):
            out[name] = (("attention", "n"), slopes(values, np.log(d), axis=2))
        out.attrs.update({"H": H, "beta": beta, "lambda_bar": lam, "cluster_threshold": level})
        return out

    def export_table(self, summary):
        """The fitted slopes, one row per line of the grid: dT/d ln n at fixed d and dT/d ln d at fixed
        n (per attention), each with its 95% interval, beside the same fit of the closed-form time."""
        import pandas as pd

        from ..tables import slope_interval, time_units

        n, d = summary.n.values.astype(float), summary.d.values.astype(float)
        seeds = summary.t_cluster.notnull().sum("seed")
        rows = []
        for att in summary.attention.values:
            for along, fixed_axis, x in (("n", "d", np.log(n)), ("d", "n", np.log(d))):
                for value in summary[fixed_axis].values:
                    sel = {"attention": att, fixed_axis: value}
                    measured = summary.t_median.sel(sel).values
                    fit = slope_interval(x, measured)
                    rows.append({"fit": f"T ~ s ln {along}", "attention": str(att),
                                 "d": float(value) if fixed_axis == "d" else np.nan,
                                 "n": float(value) if fixed_axis == "n" else np.nan,
                                 "points": int(np.isfinite(measured).sum()),
                                 "seeds": int(seeds.sel(sel).min()),
                                 "censored_max": float(summary.censored_fraction.sel(sel).max()),
                                 "measured": fit[0], "low": fit[1], "high": fit[2],
                                 "closed_form": slope_interval(x, summary.t_closed.sel(sel).values)[0]})
        df = pd.DataFrame(rows)
        df.attrs["columns"] = {
            "fit": "which fit: the slope of the median time in ln n at fixed d, or in ln d at fixed n",
            "attention": "attention", "d": "the fixed d of a fit along n",
            "n": "the fixed n of a fit along d",
            "points": "grid points with a finite median time in the fit (a median over half censored runs "
                      "is inf and left out)",
            "seeds": "seeds each median time is over (the fewest at any point of the line)",
            "censored_max": "largest fraction of runs on the line that never reached the level by t_max",
            "measured": "fitted slope of the particles' median time from uniform random tokens",
            "low": "95% Student-t interval of the slope, lower end (NaN with fewer than 3 points)",
            "high": "95% Student-t interval of the slope, upper end",
            "closed_form": "the same fit of the equiangular ODE's time from gamma0 = 1/sqrt(d)",
        }
        per_unit = time_units(summary)
        df.attrs["units"] = {"fit": None, "attention": None, "d": "1", "n": "1", "points": "1", "seeds": "1",
                             "censored_max": "1",
                             **dict.fromkeys(("measured", "low", "high", "closed_form"), per_unit)}
        return df

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.colors import LogNorm
        from matplotlib.lines import Line2D
        from matplotlib.patches import Rectangle

        from ..plotting import (
            MIN_TEXT,
            figure_width,
            log_edges,
            log_ticks,
            plain_labels,
            plain_log_axis,
            plt,
            sns,
            wrap,
        )
        from ..tables import slope_interval

        ds = self.with_axes(summary, spec)
        width = figure_width()
        side = width >= 5
        # Each lower panel over an axes of its own that holds its legend: off the data, as wide as the panel.
        if side:
            fig, grid = plt.subplots(3, 2, squeeze=False, layout="constrained", figsize=(width, 9.0),
                                     gridspec_kw={"height_ratios": [2.4, 2.0, 1.5]})
            axes, keys = [grid[0, 0], grid[0, 1], grid[1, 0], grid[1, 1]], [grid[2, 0], grid[2, 1]]
        else:
            fig, grid = plt.subplots(6, 1, squeeze=False, layout="constrained", figsize=(width, 12.0),
                                     gridspec_kw={"height_ratios": [2.0, 2.0, 1.9, 1.3, 1.6, 0.7]})
            axes, keys = [grid[0, 0], grid[1, 0], grid[2, 0], grid[4, 0]], [grid[3, 0], grid[5, 0]]
        for key in keys:
            key.set_axis_off()
        panel = (0.38 if side else 0.8) * width
        n, d = ds.n.values.astype(float), ds.d.values.astype(float)
        atts = [a for a in ("softmax", "relu") if a in ds.attention.values]
        level = float(spec.fixed["cluster_threshold"])
        t_max = float(spec.fixed["t_max"])
        # One colour scale for the measured times of both panels.
        values = ds.t_median.values.ravel()
        values = values[np.isfinite(values) & (values > 0)]
        values = values if values.size else np.array([1.0, 10.0])
        norm = LogNorm(vmin=values.min(), vmax=max(values.max(), values.min() * 1.01))
        cmap = plt.get_cmap("viridis").with_extremes(bad="0.75")
        n_edges, d_edges = log_edges(n), log_edges(d)
        annotate = n.size * d.size <= ANNOTATE_CELLS
        mesh = None
        for ax, att, letter in zip(axes[:2], ("softmax", "relu"), "ab", strict=True):
            if att not in atts:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{att}: not in the grid", transform=ax.transAxes, ha="center")
                continue
            median = ds.t_median.sel(attention=att).transpose("d", "n").values
            mesh = ax.pcolormesh(n_edges, d_edges, np.ma.masked_invalid(np.where(np.isinf(median), np.nan,
                                                                                 median)),
                                 cmap=cmap, norm=norm)
            for k, i in zip(*np.nonzero(np.isinf(median)), strict=True):
                ax.add_patch(Rectangle((n_edges[i], d_edges[k]), n_edges[i + 1] - n_edges[i],
                                       d_edges[k + 1] - d_edges[k], facecolor="0.75", edgecolor="0.45",
                                       hatch="//", lw=0))
            if annotate:
                frozen = ds.frozen_fraction.sel(attention=att).transpose("d", "n").values
                for (k, i), value in np.ndenumerate(median):
                    # A censored cell is hatched; it says what share of its runs froze.
                    text = ("no run" if np.isnan(value) else f"{frozen[k, i]:.0%}" if np.isinf(value)
                            else f"{value:.3g}" + (f"\n{frozen[k, i]:.0%}" if frozen[k, i] > 0 else ""))
                    dark = np.isfinite(value) and norm(value) < 0.55
                    ax.text(n[i], d[k], text, ha="center", va="center", fontsize=MIN_TEXT, linespacing=0.9,
                            color="w" if dark else "k")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(n_edges[0], n_edges[-1])
            ax.set_ylim(d_edges[0], d_edges[-1])
            log_ticks(ax, "x", n)
            log_ticks(ax, "y", d)
            ax.set_xlabel("tokens $n$")
            ax.set_ylabel("dimension $d$")
            # No closed form and no bound over the cells: neither is one for random starts (the equiangular
            # ODE is drawn in (c) as a reference), and a label over the map would cover the cells' numbers.
            ax.set_title(wrap(f"({letter}) {att}: median time over seeds (colour, number; % of runs frozen)",
                              panel, 8))
        if mesh is not None:
            bar = fig.colorbar(mesh, ax=list(axes[:2]), shrink=0.6 if side else 0.9, aspect=40,
                               location="bottom",
                               label=wrap(f"time for the mean cosine to reach {level:g} (grey hatched: half "
                                          "the runs or more never did)", 0.9 * panel))
            bar.set_ticks([v for v in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000, 2000, 5000)
                           if norm.vmin <= v <= norm.vmax])
            plain_labels(bar.ax.xaxis)

        # Panels (c) and (d) draw a line per (attention, d): the attention's colour, darker as d grows.
        palette = dict(zip(["softmax", "relu"], sns.color_palette(n_colors=2), strict=True))
        tones = np.linspace(1.0, 0.45, d.size)
        curves = [(att, k, dd, tuple(np.array(palette[att]) * tones[k]))
                  for att in atts for k, dd in enumerate(d)]
        ax = axes[2]
        for att, k, dd, colour in curves:
            sel = dict(attention=att, d=dd)
            med = ds.t_median.sel(sel).values
            lo, hi = ds.t_q1.sel(sel).values, ds.t_q3.sel(sel).values
            ok = np.isfinite(med)
            hi = np.where(np.isfinite(hi), hi, med)
            shift = n * (1 + 0.025 * (k - (d.size - 1) / 2))
            # The measured law T = a + s ln n, least squares over the finite medians, drawn over the n it
            # is fitted on only; s with its 95% interval (export's slope_interval: the same fit).
            slope, low, high = slope_interval(np.log(n), med)
            if np.isfinite(slope):
                a = np.mean(med[ok]) - slope * np.mean(np.log(n[ok]))
                span = np.geomspace(n[ok].min(), n[ok].max(), 20)
                ax.plot(span, a + slope * np.log(span), "-", color=colour, lw=1.2)
                fitted = (f"s = {slope:.2f} [{low:.2f}, {high:.2f}]" if np.isfinite(low)
                          else f"s = {slope:.2f} (2 points: no interval)")
            else:
                fitted = "censored: no fit"
            med, lo, hi = med[ok], lo[ok], hi[ok]
            ax.errorbar(shift[ok], med, yerr=[med - lo, hi - med], fmt="o", color=colour,
                        ms=4, capsize=2, label=f"{att}, d={dd:g}: {fitted}")
            ax.plot(n, ds.t_closed.sel(sel), ":", color=colour, lw=1)
        ax.axhline(t_max, color="0.6", lw=0.8, ls=":")
        ax.set_xscale("log")
        log_ticks(ax, "x", n)
        plain_log_axis(ax, "y")
        ax.set_xlabel("tokens $n$")
        ax.set_ylabel(f"time to gamma_mean = {level:g}")
        ax.set_title(wrap("(c) against n: particles (median, quartiles) and the law T = a + s ln n fitted to "
                          "them (solid, over the n fitted); dotted: the equiangular ODE from 1/sqrt(d), a "
                          f"reference, not a bound; grey dotted: t_max = {t_max:g}", panel, 8))
        handles = [*ax.get_legend_handles_labels()[0],
                   Line2D([], [], color="k", lw=1.2, label="fitted T = a + s ln n"),
                   Line2D([], [], color="k", lw=1, ls=":", label="equiangular ODE from 1/sqrt(d) (no bound)")]
        # Under the panel, off the data.
        # One column: the fits' intervals make each entry about as wide as the panel.
        keys[0].legend(handles=handles, fontsize=MIN_TEXT, title="s = dT/d ln n [95% interval]",
                       title_fontsize=MIN_TEXT, ncol=1, loc="upper center", frameon=False,
                       borderaxespad=0)

        ax = axes[3]
        for att, _, dd, colour in curves:
            sel = dict(attention=att, d=dd)
            frac = ds.censored_fraction.sel(sel).values
            ax.plot(n, frac, "o-", color=colour, ms=4, label=f"{att}, d={dd:g}")
            clusters = ds.clusters_frozen.sel(sel).values
            if annotate:
                for x, y, c in zip(n, frac, clusters, strict=True):
                    if np.isfinite(c) and y > 0:
                        ax.annotate(f"{c:g}", (x, y), textcoords="offset points", xytext=(0, 4),
                                    ha="center", fontsize=MIN_TEXT, color=colour)
        ax.set_xscale("log")
        log_ticks(ax, "x", n)
        ax.set_ylim(-0.05, 1.1)
        ax.set_xlabel("tokens $n$")
        ax.set_ylabel("share of runs short of the level")
        ax.set_title(wrap(f"(d) runs that never reached the level by t_max = {t_max:g}; number: the median "
                          "count of clusters they froze into", panel, 8))
        keys[1].legend(*ax.get_legend_handles_labels(), fontsize=MIN_TEXT, ncol=2, loc="upper center",
                       frameon=False, borderaxespad=0)
        fixed = self.describe_fixed(spec, ("heads", "H", "beta", "lambda_bar", "rtol"))
        fig.suptitle(wrap(f"Clustering time from uniform random tokens (Thm 25's bounds are for equiangular "
                          f"starts: none drawn); {fixed}, {ds.sizes['seed']} seeds",
                          0.95 * width, 9))
        return fig


EXPERIMENT = Scaling()
