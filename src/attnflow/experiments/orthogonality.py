"""Approximate orthogonality (Thm 39): per-head monotonicity against the overlap of the heads."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

from . import Axis, Experiment
from ._common import all_heads_monotone


def max_cross_norm(scores: np.ndarray) -> float:
    """max over seeds and head pairs of ``||M_h' M_h||_op``: the overlap omega that Thm 39 bounds (the
    paper's delta), not the cell field ``delta`` (the perturbation norm); scores (seed, H, d, d)."""
    H = scores.shape[1]
    worst = 0.0
    for a in range(H):
        for b in range(H):
            if a != b:
                prod = scores[:, a] @ scores[:, b]
                worst = max(worst, float(np.max(np.linalg.norm(prod, 2, axis=(-2, -1)))))
    return worst


class Orthogonality(Experiment):
    name = "orthogonality"
    theorem = "Thm 39"
    question = ("Does per-head monotonicity of exactly orthogonal heads survive a small overlap of the "
                "heads, omega = max ||M_h' M_h||_op (Thm 39's delta), produced by a perturbation of norm "
                "delta (the cell field)?")
    axes = (Axis("delta", min_values=2, why="a curve over the perturbation norm"),)
    observables = ("energy",)
    defaults = {
        # Flat: the flat per-head energy of orthogonal heads is monotone (Thm 16); flat usa
        # blows up sooner as delta grows (from t ~ 0.028 at delta 2): keep t_max below.
        "fixed": {"heads": "perturbed_block", "attention": "usa", "geometry": "flat", "H": 2, "n": 8,
                  "d": 8, "beta": 1.0, "t_max": 0.02, "n_samples": 11, "seeds": 16},
        "grid": {"delta": [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0]},
        "batch_over": ["delta"],
    }
    caption = ("Per-head monotonicity against the perturbation norm delta (the cell field: operator norm "
               "of the symmetric perturbation added to block heads) of approximately orthogonal heads "
               "(Thm 39): fraction of runs with every head's energy non-decreasing, the smallest "
               "normalised per-head rate, and the measured overlap omega = max ||M_h' M_h||_op (right "
               "axis), the quantity Thm 39 bounds (its delta).")
    reading = ("At delta = 0 the heads are exactly orthogonal and, in flat space, every head is "
               "monotone (fraction 1, smallest normalised rate >= 0). Thm 39 says this survives small "
               "overlaps: read off the perturbation norm delta, and the overlap omega it produces (right "
               "axis; Thm 39's delta is omega, at most 2 lambda delta + delta^2), where the fraction first "
               "drops below 1.")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        monotone = all_heads_monotone(ds)
        scale = abs(ds.energy_rate).max(("time", "head"))
        return xr.Dataset({
            "frac_samples_monotone": monotone.mean(("seed", "time")),
            "frac_runs_monotone": monotone.all("time").mean("seed"),
            "min_relative_rate": (ds.energy_rate.min(("time", "head")) / scale).min("seed"),
            "cross_norm": xr.DataArray(max_cross_norm(np.asarray(ds.score_matrix.values))),
        })

    def plot(self, summary, spec):
        ds = self.with_axes(summary, spec)
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(ds.delta, ds.frac_runs_monotone.squeeze(), "o-", label="runs with every head monotone")
        ax.plot(ds.delta, ds.min_relative_rate.squeeze(), "s-",
                label=r"min $\dot E_h$ / max $|\dot E_h|$")
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xlabel(r"perturbation norm $\delta$ (cell field; not Thm 39's bound)")
        ax.set_ylabel("fraction / ratio")
        overlap = ax.twinx()
        overlap.plot(ds.delta, ds.cross_norm.squeeze(), "k:",
                     label=r"overlap $\omega = \max\|M_{h'} M_h\|_{op}$ (right)")
        overlap.set_ylabel("measured overlap (Thm 39's $\\delta$)\n"
                           r"$\omega = \max\|M_{h'} M_h\|_{op}$")
        overlap.grid(False)
        handles = ax.get_legend_handles_labels()
        extra = overlap.get_legend_handles_labels()
        ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="center right")
        fixed = self.describe_fixed(spec, ("attention", "heads", "geometry", "H", "n", "d", "beta", "t_max"))
        ax.set_title(f"Approximate orthogonality (Thm 39)\n{fixed}", fontsize=8)
        fig.tight_layout()
        return fig


EXPERIMENT = Orthogonality()
