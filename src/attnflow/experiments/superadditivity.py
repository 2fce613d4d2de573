"""Heterogeneous heads (Thm 22): where do unequal head strengths cluster faster than equal ones?"""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from . import Axis, Experiment

CLOSED_COLOUR = "tab:green"  # the closed-form contour, apart from the measured one (black)


def linear_strengths(lambda_bar, spread, H):
    """The ``linear`` distribution's strengths, (..., H), broadcast over ``lambda_bar`` and ``spread``."""
    lambda_bar, spread = np.broadcast_arrays(np.asarray(lambda_bar, float), np.asarray(spread, float))
    offsets = 2.0 * np.arange(H) / (H - 1) - 1.0 if H > 1 else np.zeros(1)
    return lambda_bar[..., None] * (1.0 + spread[..., None] * offsets)


def censored_ratio(equal: xr.DataArray, linear: xr.DataArray, t_max: float):
    """Per seed, the interval ``[low, high]`` holding the paired ratio T(equal) / T(linear) when a censored
    time (inf: not clustered by ``t_max``) only says T > t_max: both finite, the ratio; the equal run
    censored, [t_max / T(linear), inf]; the linear one, [0, T(equal) / t_max]; both, [0, inf]. NaN where a
    run failed."""
    eq_in, lin_in = np.isfinite(equal), np.isfinite(linear)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = equal / linear
        low = xr.where(eq_in & lin_in, ratio, xr.where(lin_in, t_max / linear, 0.0))
        high = xr.where(eq_in & lin_in, ratio, xr.where(eq_in, equal / t_max, np.inf))
    ran = equal.notnull() & linear.notnull()
    return low.where(ran), high.where(ran)


class Superadditivity(Experiment):
    name = "superadditivity"
    theorem = "Thm 22"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("For which mean head strength and inverse temperature do heads of unequal strengths "
                "(linear spread, same total) cluster faster than equal heads, over the whole run, and "
                "how does that compare with the early-time closed form (lambda_c, sign of "
                "sum phi - H phi(lambda_bar))?")
    axes = (
        Axis("lambda_bar", min_values=2, why="a map over lambda_bar and beta"),
        Axis("beta", min_values=2, why="a map over lambda_bar and beta"),
        Axis("lambda_dist", min_values=2, required=("equal", "linear"),
             why="the ratio compares equal with linear strengths"),
        Axis("spread"), Axis("init"),
    )
    observables = ()
    defaults = {
        "fixed": {"heads": "scalar", "attention": "softmax", "H": 2, "n": 8, "d": 8, "gamma0": 0.0,
                  "seeds": 16, "t_max": 400.0, "n_samples": 41, "cluster_metric": "epsilon",
                  "cluster_threshold": 1e-2, "rtol": 1e-8, "atol": 1e-11,
                  "stop_at_cluster": True},
        "grid": {"init": ["equiangular", "uniform"], "spread": [0.5, 0.9],
                 "lambda_dist": ["equal", "linear"],
                 "lambda_bar": [0.25, 0.5, 1.0, 2.0, 4.0], "beta": [0.5, 1.0, 2.0, 4.0]},
        "batch_over": ["lambda_bar", "beta", "lambda_dist", "spread"],
    }
    caption = ("Ratio of clustering times T(equal heads) / T(linear spread, same total) over the mean "
               "strength lambda_bar and beta; > 1 (red) means unequal heads cluster faster (Thm 22). "
               "Rows: equiangular start (where the theorem lives) and uniform random starts (median of "
               "the per-seed ratio, same tokens for both; a censored run enters as the bound it is, and "
               "a cell is blank where that leaves the median undetermined); columns: spread. Black: "
               "measured ratio = 1; "
               "dashed: the early-time boundary lambda_c(beta); hatched: the early-rate prediction "
               "sum phi(lambda_h) > H phi(lambda_bar); wide pale green under the black line (top row): ratio "
               "= 1 of the closed-form time integral of the equiangular ODE.")
    reading = ("Thm 22 predicts the sign of the early clustering rate: unequal heads start faster where "
               "phi is convex (right of the dashed lambda_c curve, or exactly in the hatched region for "
               "the spread shown). The colour measures the whole run. On equiangular tokens it agrees "
               "with the closed-form time integral (the black contour runs along the wide green one); "
               "how far the black contour sits from the hatched region shows how much the early-time "
               "statement says about the full clustering time, and the bottom row how far it carries to "
               "random tokens.")

    refine_axis = "beta"
    # 2: censored_equal / censored_linear count the seeds that ran: a failed seed (issue 39) or a
    #    missing cell counted as not censored.
    # 3: a censored run enters the median ratio as the interval it bounds, not as +inf (or 0): the median
    #    is known where the medians of the lower and upper ends agree (ratio_low, ratio_high), else NaN.
    reduction_version = 3

    def refine_field(self, summary):
        ratio = summary.ratio.expand_dims(lambda_dist=["equal", "linear"])  # the grid's axes
        return np.log(ratio.clip(1e-6, 1e6)), 0.0

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        t = ds.t_cluster.where(~ds.censored, np.inf)  # censored: clustered after t_max
        return xr.Dataset({"t_cluster": t})

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        equal = out.t_cluster.sel(lambda_dist="equal")
        linear = out.t_cluster.sel(lambda_dist="linear")
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = equal / linear  # the same seed has the same tokens in both: a paired ratio
        low, high = censored_ratio(equal, linear, float(spec.fixed["t_max"]))
        out["ratio_seed"] = per_seed.where(np.isfinite(equal) & np.isfinite(linear))
        # A censored time is a bound (> t_max), not a value: each pair's ratio lies in [low, high], so the
        # median lies between the medians of the ends; it is known where they agree.
        out["ratio_low"], out["ratio_high"] = low.median("seed"), high.median("seed")
        out["ratio"] = out.ratio_low.where(out.ratio_low == out.ratio_high)
        # Of the seeds that ran (a failed seed, or a missing cell, is NaN: neither censored nor not).
        out["censored_equal"] = np.isinf(equal).where(equal.notnull()).mean("seed")
        out["censored_linear"] = np.isinf(linear).where(linear.notnull()).mean("seed")
        n, H = int(spec.fixed["n"]), int(spec.fixed["H"])
        out["lambda_c"] = xr.apply_ufunc(theory.lambda_c, out.beta, n)
        lam = linear_strengths(out.lambda_bar.values[:, None, None], out.spread.values[None, None, :], H)
        sign = theory.early_sign(lam, out.beta.values[None, :, None], n)
        out["early_sign"] = (("lambda_bar", "beta", "spread"), sign)
        # The equiangular ODE's time from gamma0 to the criterion's level, both distributions.
        gamma0 = float(spec.fixed.get("gamma0", 0.0))
        level = _level(spec)
        beta = out.beta.values[None, :, None]
        equal_lam = np.broadcast_to(lam.mean(axis=-1, keepdims=True), lam.shape)
        t_eq = theory.equiangular_time(gamma0, level, equal_lam, beta, n)
        t_lin = theory.equiangular_time(gamma0, level, lam, beta, n)
        out["ratio_closed"] = (("lambda_bar", "beta", "spread"), t_eq / t_lin)
        out.attrs.update({"n": n, "H": H, "gamma0": gamma0, "level": level})
        return out

    def export_table(self, summary):
        """Per (init, spread, beta): where the measured ratio T(equal) / T(unequal) crosses 1 along
        lambda_bar (the bracket of grid values), against the early-time boundary lambda_c(beta) and
        the crossing of the closed-form time ratio (equiangular ODE) on the same grid."""
        from ..tables import equiangular_starts, ratio_crossings, seed_count, table

        lines = ["init", "spread", "beta"]
        mid, low, high = ratio_crossings(summary.ratio.transpose(*lines, "lambda_bar"), "lambda_bar")
        closed = summary.ratio_closed.transpose("spread", "beta", "lambda_bar")
        cmid, clow, chigh = ratio_crossings(closed, "lambda_bar")
        equiangular = equiangular_starts(summary)
        censored = (summary.censored_equal + summary.censored_linear).max("lambda_bar") > 0
        columns = {
            "lambda_cross": (mid, "measured boundary: lambda_bar where the median ratio T(equal)/T(linear) "
                                  "crosses 1 (geometric midpoint of the first bracket; NaN: no crossing)"),
            "lambda_cross_low": (low, "the bracket's grid value below the crossing"),
            "lambda_cross_high": (high, "the bracket's grid value above the crossing"),
            "lambda_c_closed": (summary.lambda_c, "early-time closed-form boundary lambda_c(beta) (Thm 22)"),
            "lambda_cross_closed": (cmid.where(equiangular), "where the closed-form time ratio of the "
                                    "equiangular ODE crosses 1, bracketed on the same grid (equiangular "
                                    "starts only)"),
            "lambda_cross_closed_low": (clow.where(equiangular), "its bracket, lower grid value"),
            "lambda_cross_closed_high": (chigh.where(equiangular), "its bracket, upper grid value"),
            "censored": (censored.astype(float), "1 if some runs on this line never clustered by t_max"),
            "seeds": (seed_count(summary.t_cluster, lines), "seeds per grid point of the line, each median "
                      "ratio is over (the fewest at any point of the line)", "1"),
        }
        return table(summary, lines, columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.colors import LogNorm
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.patheffects import withStroke

        from ..plotting import (
            MIN_TEXT,
            columns_for,
            figure_width,
            log_edges,
            log_ticks,
            plain_labels,
            plt,
            wrap,
        )

        ds = self.with_axes(summary, spec)
        inits, spreads = list(ds.init.values), list(ds.spread.values)
        # The spreads side by side while each panel keeps 1.6 in, else in further blocks of rows.
        width = figure_width()
        ncols = columns_for(len(spreads), 1.6)
        blocks = -(-len(spreads) // ncols)
        nrows = len(inits) * blocks
        fig, axes = plt.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True, layout="constrained",
                                 figsize=(width, min(2.3 * nrows + 2.0, 9.0)))
        for ax in axes.flat[len(inits) * len(spreads):]:
            ax.set_visible(False)
        lam_vals, b_vals = ds.lambda_bar.values.astype(float), ds.beta.values.astype(float)
        lam_edges, b_edges = log_edges(lam_vals), log_edges(b_vals)
        n, H = ds.attrs["n"], ds.attrs["H"]
        # The closed forms on a fine grid: smooth boundaries over the coarse measurement.
        lam_fine = np.geomspace(lam_edges[0], lam_edges[-1], 80)
        b_fine = np.geomspace(b_edges[0], b_edges[-1], 80)
        lf, bf = np.meshgrid(lam_fine, b_fine)
        finite = ds.ratio.values[np.isfinite(ds.ratio.values) & (ds.ratio.values > 0)]
        span = max(float(np.max(np.abs(np.log10(finite)))) if finite.size else 1.0, 0.05)
        norm = LogNorm(vmin=10 ** -span, vmax=10**span)
        mesh = None
        for r, init in enumerate(inits):
            for c, spread in enumerate(spreads):
                i, j = (c // ncols) * len(inits) + r, c % ncols
                ax = axes[i, j]
                sub = ds.sel(init=init, spread=spread)
                ratio = sub.ratio.transpose("beta", "lambda_bar").values
                shown = np.clip(ratio, norm.vmin, norm.vmax)
                mesh = ax.pcolormesh(lam_edges, b_edges, shown, cmap="RdBu_r", norm=norm, shading="flat")
                censored = (sub.censored_equal + sub.censored_linear).transpose("beta", "lambda_bar").values
                for bi, li in zip(*np.nonzero(censored > 0), strict=True):
                    colour = _mark_colour(mesh, shown[bi, li])
                    # A halo of the other colour keeps it legible under the hatching and the contours.
                    halo = withStroke(linewidth=2, foreground="k" if colour == "w" else "w")
                    ax.text(lam_vals[li], b_vals[bi], "c", ha="center", va="center", fontsize=MIN_TEXT + 1,
                            color=colour, fontweight="bold", path_effects=[halo])
                lg, bg = np.meshgrid(lam_vals, b_vals)
                # An undetermined median (NaN) is no ratio of 1: the contour leaves it out.
                log_ratio = np.ma.masked_invalid(np.log(np.clip(ratio, 1e-6, 1e6)))
                if log_ratio.count() and log_ratio.min() < 0 < log_ratio.max():
                    # Above everything else: the measurement is what the closed forms are read against.
                    ax.contour(lg, bg, log_ratio, levels=[0.0], colors="k", linewidths=1.4, zorder=5)
                sign = theory.early_sign(linear_strengths(lf, spread, H), bf, n)
                with plt.rc_context({"hatch.color": "0.15"}):  # the theme's white hatch hid on pale cells
                    ax.contourf(lf, bf, sign, levels=[0.5, 2], colors="none", hatches=["////"])
                ax.contour(lf, bf, sign, levels=[0.0], colors="0.3", linewidths=0.6)
                if init.startswith("equiangular"):
                    closed = sub.ratio_closed.transpose("beta", "lambda_bar").values
                    if np.nanmin(closed) < 1 < np.nanmax(closed):
                        # Wide and pale under the measured contour: where the two agree the black line
                        # runs along its middle, and both stay visible.
                        ax.contour(lg, bg, np.log(closed), levels=[0.0], colors=CLOSED_COLOUR, linewidths=4.0,
                                   alpha=0.6, zorder=4)
                ax.plot(theory.lambda_c(b_fine, n), b_fine, "k--", lw=1.2)
                ax.set_xlim(lam_edges[0], lam_edges[-1])
                ax.set_ylim(b_edges[0], b_edges[-1])
                log_ticks(ax, "x", lam_vals)
                log_ticks(ax, "y", b_vals)
                where = "equiangular start" if init.startswith("equiangular") else f"{init} start"
                ax.set_title(wrap(f"{where}, spread {spread:g}", 0.95 * width / ncols, 8))
                if i == nrows - 1:
                    ax.set_xlabel(r"mean head strength $\bar\lambda$")
                if j == 0:
                    ax.set_ylabel(r"inverse temperature $\beta$")
        bar = fig.colorbar(mesh, ax=axes, shrink=0.7,
                           label=r"$T_{equal} / T_{unequal}$" + "\n(> 1: unequal heads faster)")
        # Plain numbers at 1, 2, 3, 5 per decade (not 4x10^0), and no crowded minor labels.
        ticks = [m * 10.0**e for e in range(-3, 4) for m in (1, 2, 3, 5)
                 if norm.vmin <= m * 10.0**e <= norm.vmax]
        bar.set_ticks(ticks)
        plain_labels(bar.ax.yaxis)
        handles = [
            Line2D([], [], color="k", lw=1.6, label="measured ratio = 1"),
            Line2D([], [], color="k", ls="--", label=r"early-time boundary $\lambda_c(\beta)$"),
            Patch(facecolor="none", edgecolor="0.15", hatch="///",
                  label=r"early-rate prediction $\sum\phi(\lambda_h) > H\phi(\bar\lambda)$"
                        " (thin grey: its edge)"),
            Line2D([], [], color=CLOSED_COLOUR, lw=4.0, alpha=0.6,
                   label="closed-form time ratio = 1 (equiangular ODE, equiangular starts; "
                         "under the black line where they agree)"),
            Line2D([], [], marker="$c$", color="k", ls="",
                   label="some runs censored (not clustered by t_max): in the median as the bounds "
                         "they are; on a blank cell they leave the median undetermined"),
        ]
        ncol = 2 if width >= 5 else 1
        for handle in handles:
            handle.set_label(wrap(handle.get_label(), 0.9 * width / ncol - 0.4))
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol)
        fixed = self.describe_fixed(spec, ("attention", "heads", "H", "n", "d", "gamma0",
                                           "cluster_threshold"))
        fig.suptitle(wrap(f"Super-additivity of unequal heads (Thm 22): clustering time to epsilon <= "
                          f"{spec.fixed.get('cluster_threshold')}; {fixed}", 0.95 * width, 9))
        return fig


def _mark_colour(mesh, value) -> str:
    """The censoring mark's colour on a cell of ``mesh`` drawn at ``value``: white on a dark cell, black
    on a pale one or a blank one (NaN: the median undetermined by censoring), where white vanished."""
    if np.isnan(value):
        return "k"
    r, g, b, _ = mesh.to_rgba(value)
    return "w" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "k"  # luma


def _level(spec) -> float:
    """The common cosine at which the clustering criterion holds on equiangular tokens."""
    if spec.fixed.get("cluster_metric", "epsilon") == "epsilon":
        return 1.0 - float(spec.fixed["cluster_threshold"])
    return float(spec.fixed["cluster_threshold"])


EXPERIMENT = Superadditivity()
