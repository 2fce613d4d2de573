"""Energy (Thm 11, 16-17): the total energy rises; a head's own energy can fall on the sphere."""

from __future__ import annotations

import xarray as xr

from . import Axis, Experiment
from ._common import all_heads_monotone


class EnergyExperiment(Experiment):
    """The ``energy`` experiment (not ``attention.Energy``, the rule an attention type declares)."""

    name = "energy"
    theorem = "Thm 11, 16-17"
    question = ("Does the total energy E_multi rise along the flow, flat and on the sphere, and can a "
                "single head's energy E_h fall even with exactly orthogonal heads?")
    axes = (Axis("heads"), Axis("geometry"))
    observables = ("energy", "velocity")
    defaults = {
        # Flat usa blows up in finite time (from t ~ 0.29 for some seeds): keep t_max below.
        "fixed": {"rtol": 1e-07, "atol": 1e-10,
                  "attention": "usa", "H": 2, "n": 8, "d": 4, "beta": 1.0, "t_max": 0.2, "n_samples": 41,
                  "seeds": 32},
        "grid": {"geometry": ["sphere", "flat"], "heads": ["random", "block"]},
        "batch_over": ["geometry", "heads"],
    }
    caption = ("Total energy E_multi (black) and per-head energies E_h, as changes since t = 0, against "
               "time (top), and the smallest per-head rate over seeds (bottom), per head structure and "
               "geometry (Thm 11, 16-17). Titles give the largest relative residual of dE_multi/dt = "
               "(1/n) sum_i ||dx_i/dt||^2 and the fraction of (seed, time) samples where some head's "
               "energy falls.")
    reading = ("Thm 11 says the black curve never falls and its rate equals the kinetic term: the "
               "residual in each title is round-off (~1e-15). Thm 16-17 say a head's own energy can "
               "fall on the sphere through the radial shadows of the other heads, even when the heads "
               "are exactly orthogonal (block), but not in flat space with orthogonal heads: look for "
               "bottom-row curves below zero in the sphere columns only.")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        total_rate = ds.energy_rate.sum("head")
        residual = abs(total_rate - ds.kinetic).max(("seed", "time")) / ds.kinetic.max(("seed", "time"))
        return xr.Dataset({
            "energy_total": ds.energy.sum("head").mean("seed"),
            "energy_head": ds.energy.mean("seed"),
            "energy_rate_min": ds.energy_rate.min("seed"),
            "thm11_residual": residual,
            "frac_head_falling": (~all_heads_monotone(ds)).mean(("seed", "time")),
        })

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import columns_for, figure_width, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        combos = [(h, g) for h in ds.heads.values for g in ds.geometry.values]
        # A column per (heads, geometry) while each keeps 1.6 in; more go on a further pair of rows.
        ncols = columns_for(len(combos), 1.6)
        pairs = -(-len(combos) // ncols)
        width = figure_width()
        fig, axes = plt.subplots(2 * pairs, ncols, figsize=(width, min(3.6 * pairs + 1.0, 9.0)),
                                 squeeze=False, sharex=True, layout="constrained")
        colors = sns.color_palette(n_colors=ds.sizes["head"])
        panel = 0.7 * width / ncols  # an axes, beside its tick labels
        for k, (heads, geometry) in enumerate(combos):
            sub = ds.sel(heads=heads, geometry=geometry)
            top, bottom = axes[2 * (k // ncols), k % ncols], axes[2 * (k // ncols) + 1, k % ncols]
            # Changes since t = 0: the total (~1) and each head (~1/H of it) on one axis left the heads'
            # curves flat; their changes are of one size.
            total = sub.energy_total
            top.plot(ds.time, total - total.isel(time=0), color="k", lw=1.8,
                     label=r"total $E_{multi}$" if k == 0 else None)
            for h, color in zip(ds["head"].values, colors, strict=True):
                head = sub.energy_head.sel(head=h)
                top.plot(ds.time, head - head.isel(time=0), color=color,
                         label=f"head {h}" if k == 0 else None)
                bottom.plot(ds.time, sub.energy_rate_min.sel(head=h), color=color)
            top.axhline(0.0, color="k", lw=0.8)
            bottom.axhline(0.0, color="k", lw=0.8)
            res, falling = float(sub.thm11_residual), float(sub.frac_head_falling)
            top.set_title(wrap(f"{heads} heads, {geometry}\nThm 11 residual {res:.0e}", panel, 8))
            bottom.set_title(wrap(f"a head's energy falls in {falling:.0%} of (seed, time)", panel, 8))
            bottom.set_xlabel(r"time $t$")
        for ax in axes.flat[2 * len(combos):]:
            ax.set_visible(False)
        for r in range(pairs):
            axes[2 * r, 0].set_ylabel("change since t = 0\n(mean over seeds)")
            axes[2 * r + 1, 0].set_ylabel(r"min over seeds of $dE_h/dt$")
        # The legend under the panels, off the curves: per-head energies (colours) and the total (black).
        fig.legend(loc="outside lower center", ncol=ds.sizes["head"] + 1)
        fixed = self.describe_fixed(spec, ("attention", "H", "n", "d", "beta", "t_max"))
        fig.suptitle(wrap(f"Energy (Thm 11, 16-17): the total rises everywhere; a head's own energy can fall "
                          f"on the sphere; {fixed}", 0.95 * width, 9))
        return fig


EXPERIMENT = EnergyExperiment()
