"""The paper's statements carried over to sigmoid attention and causal masking (docs/model.md, results
8-9)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..attention import ATTENTIONS, MASKS
from . import Axis, Experiment, Spec
from ._common import SIGN_RTOL, all_heads_monotone


def gradient_flow(attention: str, mask: str) -> bool:
    """Whether the energy identity dE/dt = (1/n) sum_i ||dx_i/dt||^2 is a theorem for this variant."""
    return ATTENTIONS.get(attention).gradient_flow and not MASKS.get(mask).masked


class Variants(Experiment):
    name = "variants"
    theorem = "Thm 11, 19, 22 (results 8-9)"
    question = ("Which of the paper's statements survive sigmoid attention and causal masking? The four "
                "attention types, with and without the mask, side by side: total energy monotone (where "
                "the flow is a gradient flow), every head monotone, the clustering time, and where the "
                "final cluster sits relative to where token 0 started.")
    axes = (
        Axis("attention", min_values=2, why="variants side by side"),
        Axis("mask", min_values=1),
        Axis("beta", min_values=2, why="a map over beta"),
        Axis("heads", min_values=1),
    )
    observables = ("velocity", "energy", "positions")
    defaults = {
        "fixed": {"H": 2, "n": 8, "d": 8, "lambda_dist": "linear", "lambda_bar": 1.0, "spread": 0.5,
                  "init": "uniform", "t_max": 20.0, "n_samples": 41, "seeds": 16},
        "grid": {"heads": ["scalar", "random"], "attention": ["softmax", "usa", "relu", "sigmoid"],
                 "mask": ["none", "causal"], "beta": [0.5, 1.0, 2.0, 4.0]},
        "batch_over": ["beta", "mask", "attention"],
    }
    caption = ("The paper's statements under sigmoid attention and causal masking. Rows: attention type "
               "and mask (gradient flows marked); columns: beta. Panels: fraction of runs whose total "
               "energy never falls; Thm 11's residual max|dE/dt - K| / max K (log10; round-off where the "
               "flow is a gradient flow); fraction of runs with every head monotone; median clustering "
               "time; how far the tokens end from where token 0 started (log10).")
    reading = ("Gradient flows (usa and sigmoid, unmasked; marked with a star) must show a residual at "
               "round-off (log10 below -10) and a total energy that never falls (fraction 1): that is "
               "Thm 11 and its sigmoid analogue (result 8). Softmax and relu are not gradient flows of "
               "the energy, and a causal mask breaks the identity for every type: the residual panel "
               "says by how much. Per-head monotonicity (Thm 19) is a small-beta property: read where "
               "the fraction leaves 1 along beta. With scalar heads under a causal mask, token 0 never "
               "moves, and for softmax, usa and sigmoid every token converges to it (result 9): the last "
               "panel falls towards round-off there as the runs converge (in the default grid usa and "
               "sigmoid slowest at small beta, softmax at large beta), while "
               "unmasked the cluster forms away from token 0's start (distance O(1)). relu weights vanish "
               "between tokens with negative cosine, so relu runs freeze into several clusters, masked or "
               "not. Random heads carry no such fact. The median clustering time counts censored runs as "
               "later than t_max (blank where most are).")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        total = ds.energy_rate.sum("head")
        scale = abs(total).max("time")
        kinetic = ds.kinetic.max("time")
        # Where the tokens end up, against where token 0 started: under a mask with scalar heads
        # token 0 never moves and the cluster forms on it (result 9); unmasked it forms elsewhere.
        start = ds.x.isel(time=0, token=0)
        distance = np.sqrt(((ds.x.isel(time=-1) - start) ** 2).sum("dim")).max("token")
        return xr.Dataset({
            "frac_total_monotone": (total >= -SIGN_RTOL * scale).all("time").mean("seed"),
            "energy_residual": (abs(total - ds.kinetic).max("time") / kinetic).max("seed"),
            "frac_heads_monotone": all_heads_monotone(ds).all("time").mean("seed"),
            # Censored runs count as later than any time (the median of the clustering time,
            # not of the runs that clustered); inf where most runs are censored.
            "t_cluster_median": ds.t_cluster.where(~ds.censored, np.inf).median("seed"),
            "frac_censored": ds.censored.mean("seed"),
            "distance_from_token0": distance.median("seed"),
        })

    def export_table(self, summary):
        """Per variant (attention, mask, head structure): whether it is a gradient flow, Thm 11's
        largest residual and the least share of runs with a monotone total energy over beta, and how
        far along beta every run keeps every head monotone (Thm 19's small-beta property). No closed
        form: beta* is derived for equal scalar heads, the beta_star experiment's setting."""
        from ..export import requested_seeds, table

        ds = self.with_axes(summary, Spec.of(summary))
        lines = [d for d in ds.frac_heads_monotone.dims if d != "beta"]
        heads = ds.frac_heads_monotone.sortby("beta")
        held = (heads >= 1.0).astype(int).cumprod("beta").astype(bool)  # at every beta up to this one
        attention, mask = ds.attention.values, ds.mask.values
        flows = xr.DataArray([[float(gradient_flow(str(a), str(m))) for m in mask] for a in attention],
                             dims=("attention", "mask"), coords={"attention": attention, "mask": mask})
        columns = {
            "gradient_flow": (flows, "1 if the flow is a gradient flow of its energy (Thm 11, result 8)"),
            "energy_residual_max": (ds.energy_residual.max("beta"), "largest Thm 11 residual "
                                    "max|dE/dt - K| / max K over the line (round-off for a gradient flow)"),
            "frac_total_monotone_min": (ds.frac_total_monotone.min("beta"), "least share of runs whose "
                                        "total energy never falls, over the line"),
            "beta_heads_all": (heads.beta.where(held).max("beta"), "largest grid beta up to which every run "
                               "keeps every head monotone, from the smallest beta on (NaN: not even there)"),
            "frac_heads_monotone_min": (heads.min("beta"), "least share of runs with every head monotone, "
                                        "over the line"),
        }
        columns["seeds"] = (xr.DataArray(requested_seeds(summary)), "seeds per cell, which every share is "
                            "over (the experiment block's)", "1")
        return table(ds, lines, columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import plt, sns

        ds = self.with_axes(summary, spec)
        structures = [str(h) for h in ds.heads.values]
        panels = [
            ("frac_total_monotone", "runs with total energy monotone", "viridis", (0, 1), False),
            ("energy_residual", r"$\log_{10}$ Thm 11 residual", "magma", (-16, 0), True),
            ("frac_heads_monotone", "runs with every head monotone", "viridis", (0, 1), False),
            ("t_cluster_median", r"median $T_\varepsilon$ (time)", "cividis", None, False),
            ("distance_from_token0", r"$\log_{10}$ max$_i\,\|x_i(t_{max}) - x_0(0)\|$", "magma", (-16, 0.5),
             True),
        ]
        # Height per row of panels: its heatmap rows and its own titles and beta axis (their room is not
        # shared out among the rows: with more head structures the short heatmaps would squeeze their labels).
        fig, axes = plt.subplots(len(structures), len(panels), figsize=(4.2 * len(panels), len(structures)
                                 * (0.42 * ds.sizes["attention"] * ds.sizes["mask"] + 0.6) + 1.0),
                                 squeeze=False)
        # One colour scale per panel across the rows (the same quantity), stretched to the data where it
        # leaves the nominal range (a residual of 10^2 must not read as 10^0).
        shown = {var: np.log10(np.maximum(ds[var], 1e-16)) if logscale else ds[var]
                 for var, _, _, _, logscale in panels}
        scales = {}
        for var, _, _, limits, _ in panels:
            data = np.asarray(shown[var].values, dtype=float)
            data = data[np.isfinite(data)]
            low, high = limits or (np.inf, -np.inf)
            if data.size:
                low, high = min(low, data.min()), max(high, data.max())
            scales[var] = (low, high) if low <= high else (0.0, 1.0)  # no limits and no data
        for r, heads in enumerate(structures):
            sub = ds.sel(heads=heads)
            rows = [(a, m) for a in sub.attention.values for m in sub.mask.values]
            labels = [f"{a}{' / ' + m if MASKS.get(m).masked else ''}{' *' if gradient_flow(a, m) else ''}"
                      for a, m in rows]
            for c, (var, title, cmap, _, logscale) in enumerate(panels):
                panel = shown[var].sel(heads=heads)
                values = np.array([[float(panel.sel(attention=a, mask=m, beta=b)) for b in sub.beta.values]
                                   for a, m in rows])
                # A median clustering time beyond t_max is +inf (a failed cell is NaN): blank, and said so.
                censored = np.isinf(values) & (var == "t_cluster_median")
                values[np.isinf(values)] = np.nan
                vmin, vmax = scales[var]
                ax = axes[r, c]
                # seaborn draws the whole figure after each heatmap (to check its tick labels):
                # with the other panels hidden meanwhile, that costs one panel, not all drawn so far.
                for other in axes.flat:
                    other.set_visible(other is ax)
                sns.heatmap(values, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, annot=True,
                            fmt=".1f" if logscale or var == "t_cluster_median" else ".2f",
                            annot_kws={"fontsize": 6}, xticklabels=[f"{b:g}" for b in sub.beta.values],
                            yticklabels=labels if c == 0 else False, cbar=True, mask=~np.isfinite(values))
                # Row labels across: seaborn stands them on end unless they overlap when it draws, before
                # tight_layout shrinks the panels, and two short rows' labels then run into each other.
                ax.tick_params(axis="y", labelrotation=0)
                for i, j in zip(*np.nonzero(censored), strict=True):
                    ax.text(j + 0.5, i + 0.5, "censored", ha="center", va="center", fontsize=5, color="0.4")
                ax.set_xlabel(r"$\beta$")
                ax.set_title(f"{title}\n{heads} heads", fontsize=8)
                ax.tick_params(labelsize=7)
        for ax in axes.flat:
            ax.set_visible(True)
        seeds = spec.fixed["seeds"]
        fixed = self.describe_fixed(spec, ("H", "n", "d", "lambda_dist", "spread", "init", "t_max",
                                           "cluster_threshold"))
        fig.suptitle("Sigmoid attention and causal masking against the paper's statements "
                     "(* = gradient flow: Thm 11 / result 8 apply)\n"
                     f"{fixed}, {seeds if isinstance(seeds, int) else len(seeds)} seeds; blank T_eps: most "
                     f"runs censored at t_max (censored share over the map "
                     f"{float(ds.frac_censored.mean()):.2f})",
                     fontsize=9)
        fig.tight_layout()
        return fig


EXPERIMENT = Variants()
