"""Critical inverse temperature (Thm 19): per-head monotonicity and Radial Dominance over (n, beta)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from . import Axis, Experiment
from ._common import all_heads_monotone, before_cluster, first_failure, monotone_judged, t_interval


def _bracket(fails: np.ndarray, beta: np.ndarray):
    """Along one line of the grid: (geometric midpoint of the first fail's bracket, below, above,
    undetermined); ``_common.first_failure`` says which seeds are censored and which undetermined."""
    if not np.isfinite(fails).any():
        return np.nan, False, False, False
    low, high, below, above = first_failure(fails, beta, 0.0)
    on = not (below or above or np.isnan(low))
    return (float(np.sqrt(low * high)) if on else np.nan), below, above, bool(np.isnan(low))


def grid_threshold(fails: xr.DataArray, beta: xr.DataArray):
    """Per seed: the geometric midpoint of [last passing beta, first failing beta] along ``beta``.

    ``fails`` is 1 where the property fails, 0 where it holds, NaN where the
    cell was not computed (a failed seed, a missing store, or a refined grid that
    skipped this line): NaN cells are neither. Returns (threshold, below grid,
    above grid, undetermined): a seed failing at the smallest beta is below the
    grid, one holding at every beta through the largest is above it; both are NaN
    in the threshold, never folded into its mean. A seed whose threshold may or
    may not be beyond a grid end because the cell there was not computed (it
    fails at the first computed beta after a failed run at the smallest, or holds
    up to a failed run at the largest) is undetermined: in none of the three.
    """
    fails = fails.sortby("beta")
    threshold, below, above, undetermined = xr.apply_ufunc(
        _bracket, fails, fails.beta, input_core_dims=[["beta"], ["beta"]], output_core_dims=[[], [], [], []],
        vectorize=True, output_dtypes=[float, bool, bool, bool])
    return threshold, below, above, undetermined


def orthogonal_threshold(H: int, n: int, alpha: float = 1.0, tol: float = 1e-12) -> float:
    """Largest beta for which the sufficient Radial-Dominance margin holds at orthogonal tokens.

    Bisection on the margin the engine measures (equal scalar heads ``alpha I``,
    ``x_i = e_i``, softmax): an independent check of ``theory.beta_star``. NaN
    when no positive beta satisfies it, inf when every beta up to 1000 does.
    """
    from ..engine import observe

    H, n = int(H), int(n)
    x = np.eye(n)[None]
    score_matrices = np.broadcast_to(alpha * np.eye(n), (1, H, n, n)).copy()

    def margin(beta):
        out = observe(x, score_matrices, attention="softmax", beta=beta, groups=("radial",))
        return float(out["rd_margin_sufficient"].min())

    lo, hi = 1e-9, 1.0
    if margin(lo) < 0:
        return np.nan
    while margin(hi) >= 0:
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return np.inf
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if margin(mid) >= 0 else (lo, mid)
    return 0.5 * (lo + hi)


class BetaStar(Experiment):
    name = "beta_star"
    theorem = "Thm 19"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("Below which inverse temperature does every head's energy stay non-decreasing, and do "
                "trajectories stay inside the Radial Dominance region? Measured over (n, beta) against "
                "the closed-form beta*(H, n), for scalar heads (where it is derived) and block heads "
                "(beyond it).")
    axes = (
        Axis("n", min_values=2, why="a map over n and beta"),
        Axis("beta", min_values=2, why="a map over n and beta"),
        Axis("H"), Axis("attention"), Axis("heads"),
    )
    observables = ("energy", "energy_path", "radial")
    defaults = {
        # Monotonicity is measured up to the clustering time: each run stops there.
        "fixed": {"rtol": 1e-09, "atol": 1e-12,
                  "d": 12, "t_max": 8.0, "n_samples": 41, "seeds": 16, "lambda_bar": 1.0,
                  "stop_at_cluster": True},
        "grid": {"attention": ["softmax", "usa"], "H": [2, 3], "heads": ["scalar", "block"],
                 "n": [4, 8, 16, 32], "beta": [0.25, 0.5, 1.0, 2.0, 4.0, 6.0]},
        "batch_over": ["beta", "n", "heads"],
    }
    caption = ("Per (attention, H) column and head structure: the fraction of runs in which every "
               "head's energy is non-decreasing up to the clustering time (the 'heads monotone' rows; "
               "none for equal scalar heads, where it is 1 by construction) and the mean fraction of that "
               "time spent inside Radial Dominance (the 'in Radial Dom.' rows), over n and beta, uniform "
               "random starts (Thm 19). Black dashed: the closed form beta*(H, n) (hatched where beta* <= "
               "0); red circles: the orthogonal-token check (bisection on the measured margin); white "
               "diamonds: the measured threshold per n, mean and 95% interval over the seeds whose "
               "threshold is on the grid (heads monotone: every head monotone fails above it; Radial "
               "Dominance: the start leaves it above it), shown where most seeds have one (triangles: "
               "most seeds above or below the grid).")
    reading = ("The closed form is a sufficient condition at one configuration (orthogonal tokens, "
               "equal scalar heads): it says nothing fails below the dashed curve. The colour shows "
               "where monotonicity actually fails: with equal scalar heads every head is monotone at "
               "every beta (the heads coincide, so the total's monotonicity carries over: that row is "
               "not drawn) although "
               "Radial Dominance is left well above beta*; with softmax block heads monotonicity fails "
               "above a measured threshold (diamonds) that can be compared with the curve, while usa "
               "block heads lose it already at the grid's smallest beta (triangles below it). The "
               "diamonds of the Radial Dominance rows date the start leaving Radial Dominance; "
               "the colour there is the share of the run spent inside it, so the two need not "
               "agree. The red circles sit on the curve: they check the formula by bisection on the "
               "measured margin.")

    refine_axis = "beta"
    # 2: its per-run booleans (mono_t0, mono_path, rd_t0) are summarised as 0/1 floats, so a grid
    # point without a cell is NaN; it read True (monotone) off a grid of extra points.
    # 3: no stray scalar coordinate time = 0 (left by isel(time=0)); units and descriptions on every variable.
    #    A seed without a run (failed, or its cell missing) is left out of frac_runs_rd and of the
    #    below/above-grid fractions, which counted it as neither (issue 39).
    # 4: a seed whose run failed at the smallest (largest) beta is no longer counted below (above) the
    #    grid on the strength of the next beta: it is undetermined (beta_*_undetermined counts them) and the
    #    below/above fractions are over the seeds placed (issue 52).
    # 5: every head monotone is judged at every accepted integration step, not only at the samples
    #    (the energy_path group; attrs monotone_judged): a dip between samples fails it (issue 52).
    reduction_version = 5

    def refine_field(self, summary):
        return summary.frac_mono_path, 0.5

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        keep = before_cluster(ds)
        monotone = all_heads_monotone(ds)
        inside = (ds.rd_margin >= 0).all(("head", "token"))
        return xr.Dataset({
            "mono_t0": monotone.isel(time=0),
            "mono_path": (monotone | ~keep).all("time"),
            "rd_t0": inside.isel(time=0),
            "time_rd": (inside & keep).sum("time") / keep.sum("time"),
        })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary.sortby("beta")
        lam = float(spec.fixed.get("lambda_bar", 1.0))
        for prop, fails in (("mono", 1 - out.mono_path), ("rd", 1 - out.rd_t0)):
            known = fails.where(out.mono_path.notnull())
            per_seed, below, above, undetermined = grid_threshold(known, out.beta)
            # The fractions are over the seeds whose threshold is placed (on, below or above the grid):
            # a seed with no run, or one undetermined by a failed run at a grid end, is in none.
            counted = known.notnull().any("beta") & ~undetermined
            below, above = below.where(counted), above.where(counted)
            mean, half = xr.apply_ufunc(t_interval, per_seed, input_core_dims=[["seed"]],
                                        output_core_dims=[[], []], vectorize=True)
            out[f"beta_{prop}"] = per_seed
            out[f"beta_{prop}_mean"] = mean
            out[f"beta_{prop}_ci"] = half
            out[f"beta_{prop}_below_grid"] = below.mean("seed")
            out[f"beta_{prop}_above_grid"] = above.mean("seed")
            out[f"beta_{prop}_undetermined"] = (undetermined & known.notnull().any("beta")).sum("seed")
        out["frac_mono_t0"] = out.mono_t0.astype(float).mean("seed")
        out["frac_mono_path"] = out.mono_path.astype(float).mean("seed")
        out["frac_time_rd"] = out.time_rd.mean("seed")
        out["frac_runs_rd"] = (out.time_rd == 1).where(out.time_rd.notnull()).mean("seed")
        # Closed form and its independent check, on the measurement's own (H, n) grid.
        out["beta_star_closed"] = xr.apply_ufunc(theory.beta_star, out.H, out.n, lam)
        out["beta_orthogonal"] = xr.apply_ufunc(np.vectorize(orthogonal_threshold), out.H, out.n, lam)
        out.attrs["alpha"] = lam
        out.attrs["monotone_judged"] = monotone_judged(spec)
        return out

    def export_table(self, summary):
        """Per (attention, H, heads, n): the measured thresholds in beta (mean over the seeds on the grid,
        a 95% interval that keeps the grid's resolution and its censoring), how many seeds had theirs on,
        below or above the grid, and the closed form beta*(H, n)."""
        from ..tables import table, threshold_columns

        computed = summary.mono_path.notnull()
        columns = {}
        for prop, fails, what in (("mono", 1 - summary.mono_path, "every head's energy non-decreasing up to "
                                                                   "the clustering time"),
                                  ("rd", 1 - summary.rd_t0, "the start inside Radial Dominance")):
            columns.update(threshold_columns(f"beta_{prop}", fails.where(computed), "beta", what))
        columns["beta_star_closed"] = (summary.beta_star_closed, "closed form beta*(H, n) (Thm 19), "
                                       f"alpha = {summary.attrs.get('alpha', 1.0)}", "1")
        columns["beta_orthogonal"] = (summary.beta_orthogonal, "bisection on the measured margin at "
                                      "orthogonal tokens (check of the closed form)", "1")
        return table(summary, ["attention", "H", "heads", "n"], columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        from ..plotting import columns_for, figure_width, log_edges, log_ticks, plt, wrap

        ds = self.with_axes(summary, spec)
        columns = [(a, H) for a in ds.attention.values for H in ds.H.values]
        # Equal scalar heads coincide, so each head's energy is the total's share and monotone wherever the
        # total is (always): that row is 1 by construction and says nothing; it is left out, and said so.
        equal = spec.fixed.get("lambda_dist", "equal") == "equal"
        trivial = [(heads, "mono") for heads in ds.heads.values if heads == "scalar" and equal]
        rows = [(heads, q) for heads in ds.heads.values for q in ("mono", "rd") if (heads, q) not in trivial]
        # The (attention, H) columns side by side while each keeps 1.3 in, else in further blocks of rows.
        width = figure_width()
        ncols = columns_for(len(columns), 1.3)
        blocks = -(-len(columns) // ncols)
        fig, axes = plt.subplots(len(rows) * blocks, ncols, squeeze=False, sharex=True, sharey=True,
                                 figsize=(width, min(1.45 * len(rows) * blocks + 2.2, 9.0)),
                                 layout="constrained")
        n_vals, b_vals = ds.n.values.astype(float), ds.beta.values.astype(float)
        n_edges, b_edges = log_edges(n_vals), log_edges(b_vals)
        n_fine = np.geomspace(n_edges[0], n_edges[-1], 200)
        alpha = float(ds.attrs.get("alpha", 1.0))
        mesh = None
        for c, (att, H) in enumerate(columns):
            closed = theory.beta_star(H, n_fine, alpha)
            j = c % ncols
            for r, (heads, q) in enumerate(rows):
                i = (c // ncols) * len(rows) + r
                ax = axes[i, j]
                sub = ds.sel(attention=att, H=H, heads=heads)
                colour = sub.frac_mono_path if q == "mono" else sub.frac_time_rd
                mesh = ax.pcolormesh(n_edges, b_edges, colour.transpose("beta", "n").values,
                                     cmap="viridis", vmin=0, vmax=1, shading="flat")
                positive = closed > 0
                ax.plot(n_fine[positive], closed[positive], "k--", lw=1.4)
                if (~positive).any():
                    ax.axvspan(n_edges[0], n_fine[~positive].max(), ymax=0.12, facecolor="none",
                               edgecolor="k", hatch="///", lw=0)
                ax.plot(n_vals, sub.beta_orthogonal.values, "o", mfc="none", mec="tab:red", ms=5, mew=1.2)
                mean, half = sub[f"beta_{q}_mean"].values, sub[f"beta_{q}_ci"].values
                above = sub[f"beta_{q}_above_grid"].values >= 0.5
                below = sub[f"beta_{q}_below_grid"].values >= 0.5
                # A diamond stands for most seeds: drawn where most have their threshold on the grid.
                on_grid = 1.0 - sub[f"beta_{q}_above_grid"].values - sub[f"beta_{q}_below_grid"].values
                on = on_grid > 0.5
                ax.errorbar(n_vals[on], mean[on], yerr=np.nan_to_num(half[on]), fmt="D", color="w", mec="k",
                            ms=4, ecolor="w", capsize=2)
                ax.plot(n_vals[above], np.full(above.sum(), b_edges[-1] * 0.93), "^", color="w", mec="k")
                ax.plot(n_vals[below], np.full(below.sum(), b_edges[0] * 1.07), "v", color="w", mec="k")
                ax.set_xlim(n_edges[0], n_edges[-1])
                ax.set_ylim(b_edges[0], b_edges[-1])
                log_ticks(ax, "x", n_vals)
                log_ticks(ax, "y", b_vals)
                if r == 0:
                    ax.set_title(f"{att}, H = {H}")
                if i == axes.shape[0] - 1:
                    ax.set_xlabel("tokens $n$")
                if j == 0:
                    what = "heads monotone" if q == "mono" else "in Radial Dom."
                    regime = "closed form" if heads == "scalar" else "beyond it"
                    ax.set_ylabel(f"{heads} heads ({regime}):\n{what}; " + r"$\beta$")
        for ax in axes.flat[len(rows) * len(columns):]:
            ax.set_visible(False)
        fig.colorbar(mesh, ax=axes, shrink=0.6, label=wrap("fraction of runs (every head monotone) or of "
                                                            "time (in Radial Dominance)", 2.6, 8))
        handles = [
            Line2D([], [], color="k", ls="--", label=rf"closed form $\beta^*(H,n)$, $\alpha={alpha:g}$: "
                   "sufficient at orthogonal tokens, equal scalar heads (these runs: uniform tokens)"),
            Patch(facecolor="none", edgecolor="k", hatch="///",
                  label=r"$\beta^* \leq 0$: no $\beta$ qualifies"),
            Line2D([], [], marker="o", mfc="none", mec="tab:red", ls="", label="orthogonal-token check"),
            Line2D([], [], marker="D", color="w", mec="k", ls="",
                   label="measured threshold, mean and 95% CI over the seeds on the grid (heads "
                         "monotone: monotonicity fails above; Radial Dominance: the start leaves it above)"),
            Line2D([], [], marker="^", color="w", mec="k", ls="",
                   label="threshold above the grid (most seeds)"),
            Line2D([], [], marker="v", color="w", mec="k", ls="",
                   label="threshold below the grid (most seeds)"),
        ]
        ncol = 2 if width >= 5 else 1
        for handle in handles:
            handle.set_label(wrap(handle.get_label(), 0.9 * width / ncol - 0.4))
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol)
        fixed = self.describe_fixed(spec, ("d", "init", "lambda_dist", "lambda_bar", "t_max"))
        omitted = ("; equal scalar heads' monotonicity not drawn: 1 by construction (the heads "
                   "coincide)" if trivial else "")
        fig.suptitle(wrap("Critical inverse temperature (Thm 19): per-head monotonicity and Radial Dominance "
                          f"up to the clustering time; {fixed}; seeds={len(ds.seed)}{omitted}",
                          0.95 * width, 9))
        return fig


EXPERIMENT = BetaStar()
