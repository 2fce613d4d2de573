"""Approximate orthogonality (Thm 39): per-head monotonicity against the overlap of the heads."""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..pack import cell_values
from . import Axis, Experiment, Spec
from ._common import all_heads_monotone, before_cluster


def cross_norms(score_matrices: np.ndarray) -> np.ndarray:
    """Per seed, ``omega = max over head pairs of ||M_h' M_h||_op``: the overlap Thm 39 bounds (the
    paper's delta), not the cell field ``delta`` (the perturbation norm); score_matrices (..., H, d, d),
    the result (...)."""
    m = score_matrices
    H = m.shape[-3]
    worst = np.zeros(m.shape[:-3])
    for a in range(H):
        for b in range(H):
            if a != b:
                worst = np.maximum(worst, np.linalg.norm(m[..., a, :, :] @ m[..., b, :, :], 2, axis=(-2, -1)))
    return worst


def critical_overlap(ds: xr.Dataset) -> xr.DataArray:
    """Per seed, the largest overlap omega for which the sufficient condition below holds along the run.

    usa on the sphere (Thm 16-17): ``n^3 dE_h/dt = sum_i [T^h_i - a^h_i sum_{h'} a^h'_i]
    + sum_i sum_{h'} <f^h'_i, f^h_i>``, the first sum being the recorded margins. With
    ``f^h_i = M_h u^h_i``, ``|u^h_i| <= Z^h_i = sum_j exp(beta s^h_ij)``, each cross term is at
    most ``omega Z^h'_i Z^h_i``, and ``sum_i Z^h_i = 2 beta n^2 E_h``. So every head is
    monotone while ``sum_i margin^h_i >= omega (2 beta n^2)^2 E_h (E - E_h)``: Thm 39's form
    (an overlap small against the heads' own terms), with its constant from the bound.
    Returns the ratio's minimum over heads and the samples up to ``T_eps`` (as for Thm 19:
    after it the rates are round-off); negative where the margins alone fail (the radial
    shadows of Thm 17, even at omega = 0).
    """
    n = ds.sizes["token"]
    beta = cell_values(ds, "cell_beta")
    margin = ds.rd_margin.sum("token")
    others = ds.energy.sum("head") - ds.energy
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = margin / ((2 * beta * n * n) ** 2 * ds.energy * others)
    return ratio.where(before_cluster(ds)).min(("time", "head"))


class Orthogonality(Experiment):
    name = "orthogonality"
    theorem = "Thm 39"
    question = ("Does per-head monotonicity of exactly orthogonal heads survive a small overlap of the "
                "heads, omega = max ||M_h' M_h||_op (Thm 39's delta), produced by a perturbation of norm "
                "delta (the cell field)? A map over (delta, beta) on the sphere, with a sufficient "
                "condition of Thm 39's form on it.")
    axes = (Axis("delta", min_values=2, why="a map over the perturbation norm"),
            Axis("beta", min_values=1))
    observables = ("energy", "radial")
    pinned = {"attention": ("usa", "the sufficient condition bounds usa's cross terms by its row sums")}
    averages_other_axes = True  # the title names the axes averaged over
    defaults = {
        # The sphere, where usa stays bounded (|s| <= ||M_h||): horizons long enough for the
        # tokens to cluster, unlike flat usa, which blows up at t ~ 0.03 as delta grows.
        # Orthogonal tokens: there exactly orthogonal heads keep every head monotone up to
        # T_eps (measured: all runs, beta 0.1-1); from uniform starts the radial shadows break
        # it at every delta.
        "fixed": {"heads": "perturbed_block", "attention": "usa", "geometry": "sphere", "init": "orthogonal",
                  "H": 2, "n": 8, "d": 8, "t_max": 10.0, "n_samples": 41, "seeds": 16},
        "grid": {"delta": [0.0, 0.05, 0.1, 0.25, 0.5], "beta": [0.25, 0.5, 1.0, 2.0]},
        "batch_over": ["delta", "beta"],
    }
    caption = ("Per-head monotonicity of approximately orthogonal heads (Thm 39) over (delta, beta): "
               "colour, the fraction of runs with every head's energy non-decreasing; numbers, that "
               "fraction over the fraction of runs that satisfy the sufficient condition "
               "sum_i margin^h_i >= omega (2 beta n^2)^2 E_h (E - E_h) at every sample (Thm 39's form, "
               "from Thm 16-17); right, the measured overlap omega = max ||M_h' M_h||_op against delta "
               "(the cell field: the operator norm of the perturbation added to block heads), dashed "
               "the bound 2 lambda delta + delta^2 where every head has strength lambda.")
    reading = ("delta is the cell field (the perturbation's norm); the overlap it produces, omega = "
               "max ||M_h' M_h||_op (Thm 39's delta, at most 2 lambda delta + delta^2), is on the right. "
               "Thm 39 says per-head monotonicity survives an overlap small against the heads' own "
               "terms: the sufficient condition drawn (second number in each cell; hatched where it "
               "holds for most runs) can only hold where the measured fraction is 1, and the gap between "
               "the two is the slack of the bound. On the sphere even omega = 0 can fail, through the "
               "radial shadows of Thm 17 (from uniform starts it fails at every delta); from orthogonal "
               "tokens (the default) exactly orthogonal heads are monotone up to T_eps. There a head's "
               "own terms vanish on the tokens of the other block, so no overlap is small against them: "
               "the condition holds at delta = 0 only, and strict per-head monotonicity fails for most "
               "runs at the smallest delta on the grid. Thm 39's hypothesis, not its conclusion, is what "
               "breaks.")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        # Along the path up to T_eps, as Thm 19's threshold is measured (after it, round-off).
        window = before_cluster(ds)
        monotone = all_heads_monotone(ds) | ~window
        scale = abs(ds.energy_rate).max(("time", "head"))
        matrices = ds.score_matrix.transpose(..., "head", ds.score_matrix.dims[-2], ds.score_matrix.dims[-1])
        omega = xr.DataArray(cross_norms(np.asarray(matrices.values)), dims=matrices.dims[:-3])
        holds = critical_overlap(ds) >= omega
        return xr.Dataset({
            "frac_samples_monotone": monotone.where(window).mean(("seed", "time")),
            "frac_runs_monotone": monotone.all("time").mean("seed"),
            "frac_runs_condition": holds.mean("seed"),
            "min_relative_rate": (ds.energy_rate.min(("time", "head")) / scale).min("seed"),
            "cross_norm": omega.max("seed"),
        })

    def export_table(self, summary):
        """Per line of the grid along delta (per beta, and any other grid axis): the perturbation norm
        where the share of runs with every head monotone falls through 1/2, and where the share of runs
        meeting the sufficient condition does, each bracketed by grid values; the largest overlap
        omega the grid's deltas produce. The condition is the bound's side: it can only hold where
        the runs are monotone."""
        from ..export import crossings, table

        ds = self.with_axes(summary, Spec.of(summary))
        lines = [d for d in ds.frac_runs_monotone.dims if d != "delta"]
        shares = {
            "monotone": (ds.frac_runs_monotone, "the share of runs with every head monotone up to T_eps"),
            "condition": (ds.frac_runs_condition,
                          "the share of runs meeting the sufficient condition at every sample"),
        }
        columns = {}
        for key, (share, what) in shares.items():
            mid, low, high = crossings(share.transpose(*lines, "delta"), "delta", 0.5)
            columns[f"delta_{key}"] = (mid, f"perturbation norm delta where {what} falls through 1/2 "
                                            "(midpoint of the first bracket; NaN: no crossing on the grid)")
            columns[f"delta_{key}_low"] = (low, "the bracket's grid value below the crossing")
            columns[f"delta_{key}_high"] = (high, "the bracket's grid value above the crossing")
        columns["omega_max"] = (ds.cross_norm.max("delta"), "largest overlap omega = max ||M_h' M_h||_op "
                                                            "over the grid's deltas (and seeds)")
        return table(ds, lines, columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import figure_width, plt, wrap

        ds = self.with_axes(summary, spec)
        # Grid axes beyond the map's (a config may vary t_max, say): averaged, and said so.
        extra = [dim for dim in ds.frac_runs_monotone.dims if dim not in ("beta", "delta")]
        monotone = ds.frac_runs_monotone.mean(extra).transpose("beta", "delta").values
        condition = ds.frac_runs_condition.mean(extra).transpose("beta", "delta").values
        deltas, betas = ds.delta.values, ds.beta.values
        fig, (ax, right) = plt.subplots(1, 2, figsize=(figure_width(), 4.2),
                                        gridspec_kw={"width_ratios": [3, 2]})
        mesh = ax.imshow(monotone, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1,
                         extent=(-0.5, len(deltas) - 0.5, -0.5, len(betas) - 0.5))
        for j in range(len(betas)):
            for i in range(len(deltas)):
                if condition[j, i] > 0.5:  # the sufficient condition holds for most runs
                    ax.add_patch(plt.Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, hatch="//",
                                               edgecolor="w", lw=0))
                text = ("no data" if np.isnan(monotone[j, i])  # failed or missing cells
                        else f"{monotone[j, i]:.2f}\n{condition[j, i]:.2f}")
                colour = "0.3" if np.isnan(monotone[j, i]) else "w" if monotone[j, i] < 0.6 else "k"
                ax.text(i, j, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(deltas)), [f"{v:g}" for v in deltas])
        ax.set_yticks(range(len(betas)), [f"{v:g}" for v in betas])
        ax.grid(False)  # the theme's grid ran through the cells' numbers
        ax.set_xlabel(r"perturbation norm $\delta$ (cell field; Thm 39 bounds the overlap $\omega$)")
        ax.set_ylabel(r"inverse temperature $\beta$")
        ax.set_title(wrap("runs with every head monotone up to $T_\\varepsilon$ (colour, first number);\n"
                          r"runs meeting $\sum_i$margin$^h_i \geq \omega (2\beta n^2)^2 E_h (E - E_h)$ "
                          "(second; hatched > 1/2)", 0.5 * figure_width(), 8), fontsize=8, pad=10)
        fig.colorbar(mesh, ax=ax, label="fraction of runs, every head monotone")
        right.plot(deltas, ds.cross_norm.max(["beta", *extra]).values, "ko-", label="measured")
        # The bound for equal strengths lambda: only where every cell of the panel has them.
        if spec.fixed.get("lambda_dist") == "equal" and "lambda_bar" in spec.fixed:
            lam, fine = float(spec.fixed["lambda_bar"]), np.linspace(0, float(np.max(deltas)), 100)
            right.plot(fine, 2 * lam * fine + fine**2, "k--", lw=1,
                       label=rf"bound $2\lambda\delta + \delta^2$, $\lambda = {lam:g}$")
            right.legend(fontsize=7)
        right.set_xlabel(r"perturbation norm $\delta$")
        right.set_ylabel(r"measured overlap $\omega = \max\|M_{h'} M_h\|_{op}$")
        right.set_title(wrap("the overlap each delta produces (max over seeds)", 0.3 * figure_width(), 8),
                        fontsize=8)
        fixed = self.describe_fixed(spec, ("attention", "heads", "geometry", "H", "n", "d", "t_max"))
        if extra:
            fixed += f"; averaged over {', '.join(extra)}"
        fig.suptitle(wrap(f"Approximate orthogonality (Thm 39): the condition is sufficient, for usa on the "
                          f"sphere; {fixed}", 0.95 * figure_width(), 9), fontsize=9)
        fig.tight_layout()
        return fig


EXPERIMENT = Orthogonality()
