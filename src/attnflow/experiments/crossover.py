"""ReLU against softmax at late times (docs/model.md, result 11): where T_relu / T_softmax crosses 1."""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from ..tokens import typical_cosine
from . import Axis, Bound, Experiment

# Resolution of the closed-form background map (beta x level); the quadratures take ~1 s.
MAP_POINTS = (48, 40)
# Cells written out on the map (the measured ratio, the frozen fraction) up to this many per panel.
ANNOTATE_CELLS = 30


def level_axis(levels) -> np.ndarray:
    """Plot coordinate of a level gamma1: ``-log10(1 - gamma1)`` (0.9 -> 1, 0.99 -> 2)."""
    return -np.log10(1.0 - np.asarray(levels, dtype=float))


class Crossover(Experiment):
    name = "crossover"
    theorem = "result 11 (beyond Thm 25)"
    question = ("From gamma0 = 1/sqrt(d), at which (beta, level gamma1) does relu attention reach the level "
                "before softmax (T_relu / T_softmax < 1), on the exact equiangular ODEs and in particles "
                "from equiangular and from uniform random starts?")
    axes = (
        Axis("beta", min_values=2, why="a map over beta"),
        Axis("cluster_threshold", min_values=2, why="the levels gamma1 the mean cosine must reach"),
        Axis("attention", required=("softmax", "relu"), allowed=("softmax", "relu"),
             why="the ratio T_relu / T_softmax"),
        Axis("init", required=("equiangular_typical",), why="the exact equiangular start gamma0 = 1/sqrt(d)"),
    )
    observables = ("clusters",)
    defaults = {
        "fixed": {"heads": "scalar", "H": 1, "n": 16, "d": 64, "lambda_bar": 1.0,
                  "cluster_metric": "gamma_mean", "cluster_eps": 1e-2, "stop_at_cluster": True,
                  "t_max": 100.0, "n_samples": 2, "seeds": 8, "rtol": 1e-9, "atol": 1e-12},
        "grid": {"attention": ["softmax", "relu"], "init": ["equiangular_typical", "uniform"],
                 "cluster_threshold": [0.5, 0.9, 0.99, 0.999], "beta": [0.5, 1.0, 2.0, 4.0, 8.0]},
        # One job: the cells cost milliseconds, a job's start-up seconds.
        "batch_over": ["attention", "init", "beta", "cluster_threshold"],
    }
    caption = ("Result 11: T_relu / T_softmax, the ratio of the times for the mean cosine to reach gamma1, "
               "over (beta, gamma1), equal scalar heads. Background: the closed form (ratio of the exact "
               "time integrals of the two equiangular ODEs from gamma0 = 1/sqrt(d)); black: ratio = 1, "
               "below it (blue) relu is faster. (a) Markers: particles from the equiangular start, "
               "coloured by their measured ratio. (b) Markers: uniform random starts (median time over "
               "seeds); crosses: cells where some relu runs froze into several clusters and never reached "
               "the level (their median ratio is inf when most froze).")
    reading = ("On the equiangular start the particles reproduce the closed-form ratio to the solver's "
               "tolerance (the title gives the worst relative gap; the tests require 1e-8). Relu has no "
               "drive at gamma = 0 and softmax's drive falls like e^{-beta lambda (1 - gamma)}, so at "
               "small beta softmax is faster at every level, and relu's late-time drive, proportional "
               "to beta, wins at larger beta: the ratio = 1 contour runs from beta ~ 2.8 at gamma1 = 0.5 "
               "to beta ~ 1.6 at gamma1 = 0.999 (n = 16, d = 64), so relu overtakes late in the run "
               "first. From uniform random starts softmax follows the same trend while relu runs "
               "freeze into several clusters (relu weights vanish between tokens with negative "
               "cosine): the crosses mark where the ratio becomes infinite or is set by the runs that "
               "happened to start in one hemisphere, and the closed form stops describing relu. Relu's "
               "field is linear in beta, so its runs are one trajectory up to a time scale 1/beta: the "
               "frozen fraction is the same at every beta and depends on the level only.")

    pinned = {
        "cluster_metric": ("gamma_mean", "the time for the mean cosine to reach each level"),
        **{key: (value, "the closed form is the equiangular ODE of equal scalar heads")
           for key, value in (("heads", "scalar"), ("lambda_dist", "equal"))},
    }

    # A level the mean cosine already starts at (gamma0) or can never reach (1) has no time to it.
    bounds = (Bound("cluster_threshold", low=lambda cell: typical_cosine(cell.d), high=1.0,
                    low_text="gamma0 = 1/sqrt(d)", high_text="1"),)

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        # With stop_at_cluster a run that reached the level has counts of -1 after it; one that never
        # did ran to t_max, and its last sample counts the clusters it froze into.
        last = ds.cluster_count.isel(time=-1).astype(float)
        return xr.Dataset({
            "t_cluster": ds.t_cluster.where(~ds.censored, np.inf),
            "frozen": (ds.censored & (last >= 2)).astype(float),
            "clusters_end": last.where(ds.censored),
        })

    # 2: ``ran`` (both types' runs there) in the summary; equiangular_censored counts only those cells
    # that did not both reach the level (a failed or missing cell was counted too).
    # 3: no stray scalar coordinate time (left by isel(time=-1)); units and descriptions on every variable.
    reduction_version = 3

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        n, d, H = int(spec.fixed["n"]), int(spec.fixed["d"]), int(spec.fixed["H"])
        lambdas = np.full(H, float(spec.fixed["lambda_bar"]))
        gamma0 = typical_cosine(d)
        betas = out.beta.values.astype(float)
        levels = out.cluster_threshold.values.astype(float)
        closed = theory.time_ratio(gamma0, levels[None, :], lambdas, betas[:, None], n)
        out["ratio_closed"] = (("beta", "cluster_threshold"), closed)
        times = out.t_cluster.median("seed")
        ratio = times.sel(attention="relu") / times.sel(attention="softmax")
        out["ratio"] = ratio.transpose("init", "beta", "cluster_threshold")
        # Both types' runs are there (times finite, or +inf when censored); a failed or missing cell's
        # median time is NaN: no ratio and no censoring.
        out["ran"] = times.notnull().all("attention").transpose("init", "beta", "cluster_threshold")
        out["rel_error"] = out.ratio.sel(init="equiangular_typical") / out.ratio_closed - 1.0
        out["frozen_fraction"] = out.frozen.sel(attention="relu").mean("seed").transpose(
            "init", "beta", "cluster_threshold")
        # The background: the closed form on a fine grid spanning the measured one.
        fine_b = np.geomspace(betas.min(), betas.max(), MAP_POINTS[0])
        lo, hi = level_axis([levels.min(), levels.max()])
        fine_g = 1.0 - 10.0 ** -np.linspace(lo, hi, MAP_POINTS[1])
        out = out.assign_coords(beta_fine=("beta_fine", fine_b), level_fine=("level_fine", fine_g))
        out["ratio_closed_fine"] = (("beta_fine", "level_fine"),
                                    theory.time_ratio(gamma0, fine_g[None, :], lambdas, fine_b[:, None], n))
        out["beta_cross"] = ("cluster_threshold",
                             [theory.crossover_beta(gamma0, g, lambdas, n) for g in levels])
        # The agreement is over the cells where both particle runs reached the level by t_max.
        measured = out.ratio.sel(init="equiangular_typical").values
        reached = np.isfinite(measured) & (measured > 0)
        ran = out.ran.sel(init="equiangular_typical").values
        gaps = np.abs(out.rel_error.values[reached])
        out.attrs.update({"gamma0": gamma0, "n": n, "d": d,
                          "max_rel_error": float(gaps.max()) if gaps.size else np.nan,
                          "equiangular_censored": int((ran & ~reached).sum())})
        return out

    def export_table(self, summary):
        """Per (init, level gamma1): the beta where the measured ratio T_relu / T_softmax crosses 1
        (the bracket of grid values), against the closed-form crossing (exact equiangular ODEs)."""
        from ..tables import equiangular_starts, ratio_crossings, seed_count, table

        lines = ["init", "cluster_threshold"]
        # relu is faster at large beta: the ratio falls through 1, and a line above 1 all along the grid
        # has its crossing (if any) above it.
        mid, low, high = ratio_crossings(summary.ratio.transpose(*lines, "beta"), "beta", falling=True)
        equiangular = equiangular_starts(summary)
        gap = np.abs(summary.rel_error).max("beta")  # NaN where no particle run reached the level
        columns = {
            "beta_cross": (mid, "measured boundary: beta where the ratio of median times T_relu / T_softmax "
                                "crosses 1 (geometric midpoint of the first bracket; NaN: no crossing on "
                                "the grid); relu is faster above it"),
            "beta_cross_low": (low, "the bracket's grid value below the crossing; a ratio above 1 along "
                                    "the whole line: the largest beta (the crossing is above the grid); "
                                    "below 1 all along: 0 (below the grid)"),
            "beta_cross_high": (high, "the bracket's grid value above the crossing; above the grid: inf; "
                                      "below it: the smallest beta"),
            "beta_cross_closed": (summary.beta_cross, "where the closed-form ratio (exact time integrals "
                                  "of the two equiangular ODEs from gamma0 = 1/sqrt(d)) is 1"),
            "max_rel_error": (gap.where(equiangular), "equiangular starts: largest |measured / closed-form "
                              "ratio - 1| along the line"),
            "relu_frozen_max": (summary.frozen_fraction.max("beta"), "largest fraction of relu runs on the "
                                "line that froze into several clusters and never reached the level"),
            "seeds": (seed_count(summary.t_cluster, lines), "seeds each median time is over (the fewest at "
                      "any point of the line)", "1"),
        }
        return table(summary, lines, columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.colors import TwoSlopeNorm
        from matplotlib.lines import Line2D

        from ..plotting import MIN_TEXT, figure_width, plt, wrap

        ds = self.with_axes(summary, spec)
        inits = [i for i in ("equiangular_typical", "uniform") if i in ds.init.values]
        width = figure_width()
        side = width >= 5  # the two panels side by side, else one above the other
        fig, axes = plt.subplots(1 if side else 2, 2 if side else 1, squeeze=False, layout="constrained",
                                 figsize=(width, 4.8 if side else 8.0))
        axes = axes.ravel()
        panel = 0.36 * width if side else 0.6 * width  # an axes, beside the colour bar and the labels
        fine = ds.ratio_closed_fine.transpose("level_fine", "beta_fine").values
        log_ratio = np.log2(fine)
        span = max(float(np.nanmax(np.abs(log_ratio))), 1e-3)
        norm = TwoSlopeNorm(vmin=-span, vcenter=0.0, vmax=span)
        bx, gy = ds.beta_fine.values, level_axis(ds.level_fine.values)
        betas = ds.beta.values.astype(float)
        levels = ds.cluster_threshold.values.astype(float)
        B, G = np.meshgrid(betas, level_axis(levels), indexing="ij")
        mesh = None
        for ax, init, letter in zip(axes, ("equiangular_typical", "uniform"), "ab", strict=True):
            mesh = ax.pcolormesh(bx, gy, log_ratio, cmap="RdBu_r", norm=norm, shading="nearest", alpha=0.85)
            ax.contour(bx, gy, log_ratio, levels=[0.0], colors="k", linewidths=1.8)
            ax.plot(ds.beta_cross.values, level_axis(levels), "k+", ms=8)
            ax.set_xscale("log")
            pad = 0.25 * np.log(betas.max() / betas.min()) / max(betas.size - 1, 1)
            ax.set_xlim(betas.min() * np.exp(-pad), betas.max() * np.exp(pad))
            g_lo, g_hi = level_axis([levels.min(), levels.max()])
            # room for the labels: the values above the top row, the frozen shares under the bottom one
            below = 0.35 if init == "uniform" else 0.12
            ax.set_ylim(g_lo - below * (g_hi - g_lo), g_hi + 0.2 * (g_hi - g_lo))
            ax.set_xticks(betas, [f"{b:g}" for b in betas])
            ax.minorticks_off()
            ax.set_yticks(level_axis(levels), [f"{g:g}" for g in levels])
            ax.set_xlabel(r"inverse temperature $\beta$")
            if ax is axes[0] or not side:
                ax.set_ylabel(r"level $\gamma_1$ of the mean cosine" + "\n"
                              + r"(axis: $-\log_{10}(1-\gamma_1)$)")
            if init not in inits:
                ax.set_title(f"({letter}) {init}: not in the grid")
                continue
            measured = ds.ratio.sel(init=init).transpose("beta", "cluster_threshold").values
            finite = np.isfinite(measured) & (measured > 0)
            ax.scatter(B[finite], G[finite], c=np.log2(measured[finite]), cmap="RdBu_r", norm=norm, s=40,
                       edgecolors="k", linewidths=0.8, zorder=3)
            if (~finite).any():
                # A grey square, not an empty circle: the colour map's middle (ratio 1) is white too.
                ax.scatter(B[~finite], G[~finite], s=35, marker="s", facecolors="0.55", edgecolors="k",
                           linewidths=0.8, zorder=3)
            annotate = measured.size <= ANNOTATE_CELLS
            missing = ~ds.ran.sel(init=init).transpose("beta", "cluster_threshold").values
            for (i, j), value in np.ndenumerate(measured if annotate else np.empty((0, 0))):
                # A median censored either way is the grey square (legend): one line of text per marker,
                # clear of the row above.
                if missing[i, j] or finite[i, j]:
                    ax.annotate("no data" if missing[i, j] else f"{value:.3g}", (B[i, j], G[i, j]),
                                textcoords="offset points", xytext=(0, 5), ha="center", va="bottom",
                                fontsize=MIN_TEXT)
            if init == "equiangular_typical":
                censored = int(ds.attrs.get("equiangular_censored", 0))
                title = ("(a) equiangular start gamma0 = 1/sqrt(d): particles (markers) on the closed "
                         f"form, worst relative gap {ds.attrs['max_rel_error']:.1e}"
                         + (f" ({censored} cells short of the level at t_max: grey squares)"
                            if censored else ""))
            else:
                frozen = ds.frozen_fraction.sel(init=init).transpose("beta", "cluster_threshold").values
                hit = frozen > 0
                ax.scatter(B[hit], G[hit], marker="x", s=80, c="k", linewidths=1.0, zorder=4)
                # The share of relu runs that froze, once per beta under its column (it barely depends on
                # the level: the same runs freeze), not at every marker.
                for i in range(betas.size):
                    shares = frozen[i][hit[i]]
                    if shares.size:
                        low, high = shares.min(), shares.max()
                        text = f"{low:.0%}" if np.isclose(low, high) else f"{low:.0%}-\n{high:.0%}"
                        ax.annotate(text, (B[i, 0], g_lo - 0.08 * (g_hi - g_lo)), textcoords="offset points",
                                    xytext=(0, -2), ha="center", va="top", fontsize=MIN_TEXT,
                                    linespacing=0.9)
                title = (f"(b) uniform random starts (median time over {ds.sizes['seed']} seeds) on the "
                         "equiangular closed form; x: some relu runs froze into several clusters (never "
                         f"reached the level by t_max = {spec.fixed['t_max']:g}), their share under each "
                         "beta's column")
            ax.set_title(wrap(title, panel, 8))
        fig.colorbar(mesh, ax=list(axes), shrink=0.8, location="right" if side else "bottom",
                     label=r"$\log_2\, T_{relu} / T_{softmax}$" + ("\n" if side else " ")
                     + "(blue: relu faster)")
        handles = [Line2D([], [], color="k", lw=1.8, label="closed form: ratio = 1"),
                   Line2D([], [], color="k", marker="+", ls="", label="closed-form crossover beta per level"),
                   Line2D([], [], color="k", marker="o", mfc="0.8", ls="",
                          label="particles (measured ratio)")]
        if "uniform" in inits:
            handles += [Line2D([], [], color="k", marker="s", mfc="0.55", ls="",
                               label="grey square: median not reached by t_max (relu: half or more froze)"),
                        Line2D([], [], color="k", marker="x", ls="",
                               label="some relu runs froze (share of runs: under the column)")]
        # Under the panels, off the data (the markers fill the panels' corners).
        for handle in handles:
            handle.set_label(wrap(handle.get_label(), (0.45 if side else 0.85) * width - 0.4))
        fig.legend(handles=handles, loc="outside lower center", ncol=2 if side else 1)
        fixed = self.describe_fixed(spec, ("heads", "H", "n", "d", "lambda_bar", "rtol"))
        fig.suptitle(wrap(f"ReLU vs softmax at late times (result 11): T_relu / T_softmax from gamma0 = "
                          f"1/sqrt(d) = {ds.attrs['gamma0']:.3g}; {fixed}", 0.95 * width, 9))
        return fig


EXPERIMENT = Crossover()
