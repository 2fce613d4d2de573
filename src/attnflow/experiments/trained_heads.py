"""Trained heads: the theory against a real transformer's attention layers (Thm 19, 39)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from . import Axis, Experiment
from ._common import all_heads_monotone, before_cluster, monotone_judged
from .beta_star import grid_threshold


def missing_weights(weights) -> str | None:
    """Why a ``weights`` value names no file (``no such file in /home/me``), or None. The packaged
    ``minilm`` always names one: whether it is installed is ``unavailable``'s question."""
    from ..trained import PACKAGED, WeightsError, resolve

    if weights == PACKAGED:
        return None
    try:
        resolve(weights)
    except WeightsError as err:
        return str(err)
    return None


class TrainedHeads(Experiment):
    """The ``trained_heads`` experiment (the layer's matrices themselves: ``trained.LayerMatrices``)."""

    name = "trained_heads"
    theorem = "Thm 19, 39"
    question = ("Do the heads of a trained transformer (MiniLM-L6 by default) keep per-head monotonicity "
                "and Radial Dominance, up to which beta, per layer, and how does that compare with the "
                "idealisation of exactly orthogonal heads of equal strength? And how orthogonal are "
                "trained heads: principal angles between their query subspaces, and ||M_h' M_h||_op?")
    axes = (
        Axis("layer"),
        Axis("beta", min_values=2, why="a map over layer and beta"),
        Axis("heads", required=("trained", "trained_orthogonal"), why="real heads against the idealisation"),
    )
    observables = ("energy", "energy_path", "radial")
    defaults = {
        "fixed": {"rtol": 1e-07, "atol": 1e-10,
                  "weights": "minilm", "H": 12, "d": 384, "n": 8, "init": "embedding", "values": "aligned",
                  "t_max": 8.0, "n_samples": 21, "seeds": 8, "stop_at_cluster": True},
        "grid": {"layer": [0, 5], "heads": ["trained", "trained_orthogonal"], "beta": [1.0, 4.0, 16.0, 64.0]},
        "batch_over": ["beta"],
    }
    caption = ("Heads of a trained transformer layer by layer (Thm 19, 39), from n tokens drawn from its "
               "embedding matrix. (a) principal angles between the query subspaces of every pair of heads "
               "(the paper quotes 70-85 degrees, shaded) and (b) the normalised overlap "
               "||M_h' M_h||_op / (||M_h'|| ||M_h||). (c, d) the trained heads and (e, f) exactly "
               "orthogonal heads of the mean strength of the layer's selected heads: fraction of runs "
               "in which every head's energy is non-decreasing up to the clustering time, and the "
               "fraction of that time inside Radial Dominance, over (layer, beta); diamonds: the measured "
               "threshold per layer.")
    reading = ("The paper motivates approximate orthogonality by angles of 70-85 degrees between trained "
               "heads; panel (a) shows the median there but a wide lower tail, and panel (b) overlaps far "
               "from the small-delta regime of Thm 39. Compare (c) with (e): where the trained heads lose "
               "per-head monotonicity at a lower beta than their orthogonal idealisation, the overlap "
               "between real heads costs monotonicity; equal thresholds say the idealisation carries.")

    # A weights file the config names that does not exist is the user's mistake: refused, never skipped.
    inputs = {"weights": missing_weights}

    refine_axis = "beta"

    def refine_field(self, summary):
        return summary.frac_mono_path, 0.5

    def unavailable(self, spec) -> str | None:
        """Skipped only when the optional MiniLM package (``weights: minilm``) is not installed."""
        from ..trained import PACKAGED, WeightsError, resolve

        if PACKAGED not in spec.values("weights"):
            return None
        try:
            resolve(PACKAGED)
        except WeightsError as err:
            return str(err)
        return None

    # 2: a seed whose run failed at the smallest (largest) beta is no longer counted below (above) the
    #    grid on the strength of the next beta: undetermined, in beta_mono_undetermined (issue 52); the
    #    below/above fractions are over the seeds placed, a seed without any run no longer among them.
    # 3: every head monotone judged at every accepted integration step (energy_path), not the samples only.
    reduction_version = 3

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        keep = before_cluster(ds)
        monotone = all_heads_monotone(ds)
        inside = (ds.rd_margin >= 0).all(("head", "token"))
        return xr.Dataset({
            "mono_path": (monotone | ~keep).all("time").astype(float),
            "time_rd": (inside & keep).sum("time") / keep.sum("time"),
            "strength": ds.lam.isel(seed=0) if "seed" in ds.lam.dims else ds.lam,
        })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        from .. import trained

        out = summary.sortby("beta")
        out["frac_mono_path"] = out.mono_path.mean("seed")
        out["frac_time_rd"] = out.time_rd.mean("seed")
        known = (1 - out.mono_path).where(out.mono_path.notnull())
        per_seed, below, above, undetermined = grid_threshold(known, out.beta)
        counted = known.notnull().any("beta") & ~undetermined  # as beta_star: placed seeds only
        out["beta_mono_mean"] = per_seed.mean("seed")
        out["beta_mono_below_grid"] = below.where(counted).mean("seed")
        out["beta_mono_above_grid"] = above.where(counted).mean("seed")
        out["beta_mono_undetermined"] = (undetermined & known.notnull().any("beta")).sum("seed")
        weights, n_heads = spec.fixed["weights"], int(spec.fixed.get("model_heads", 0))
        layers = [int(v) for v in out.layer.values]
        angles = np.stack([trained.principal_angles(weights, L, n_heads).ravel() for L in layers])
        cross = np.stack([trained.cross_norms(weights, L, n_heads) for L in layers])
        out["principal_angle"] = (("layer", "angle"), angles, {"units": "degree"})
        out["cross_norm"] = (("layer", "pair"), cross)
        out.attrs["weights_sha256"] = trained.digest(weights)
        out.attrs["monotone_judged"] = monotone_judged(spec)
        return out

    def export_table(self, summary):
        """Per (layer, heads): the measured threshold in beta of per-head monotonicity (as beta_star: mean
        over the seeds on the grid, a 95% interval that keeps the grid's resolution and its censoring, the
        seed counts), next to the same layer's orthogonal idealisation (the configuration the closed form
        idealises) and the layer's measured head geometry."""
        from ..tables import table, threshold_columns

        fails = (1 - summary.mono_path).where(summary.mono_path.notnull())
        columns = threshold_columns("beta_mono", fails, "beta", "every head's energy non-decreasing up to "
                                                               "the clustering time")
        if "trained_orthogonal" in summary.heads.values:
            orthogonal = columns["beta_mono"][0].sel(heads="trained_orthogonal", drop=True)
            columns["beta_mono_orthogonal"] = (orthogonal,
                                               "the same layer's exactly orthogonal heads of equal strength: "
                                               "the beta_mono of its row", "1")
        columns["principal_angle_median"] = (summary.principal_angle.median("angle"),
                                             "median principal angle between the layer's heads", "degree")
        columns["cross_norm_max"] = (summary.cross_norm.max("pair"),
                                     "largest normalised overlap ||M_h' M_h|| / (||M_h'|| ||M_h||)", "1")
        return table(summary, ["layer", "heads"], columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        from ..plotting import MIN_TEXT, figure_width, log_edges, log_ticks, plt, wrap

        ds = self.with_axes(summary, spec)
        layers = [int(v) for v in ds.layer.values]
        width = figure_width()
        # Three columns (the trained heads' geometry, then the two head sets' maps) while each keeps 1.8 in;
        # else the maps go under the geometry, two columns.
        wide = width >= 5.4
        if wide:
            fig, axes = plt.subplots(2, 3, squeeze=False, layout="constrained", figsize=(width, 5.4))
        else:  # (a, b) on the first row, the maps under them: a 2 x 3 view of a 3 x 2 layout
            fig, grid = plt.subplots(3, 2, squeeze=False, layout="constrained", figsize=(width, 8.5))
            axes = np.array([[grid[0, 0], grid[1, 0], grid[1, 1]], [grid[0, 1], grid[2, 0], grid[2, 1]]])
        panel = 0.9 * width / 3 if wide else 0.33 * width
        ax = axes[0, 0]
        ax.axhspan(70, 85, color="tab:green", alpha=0.15, label="70-85 degrees (the paper)")
        ax.violinplot([ds.principal_angle.sel(layer=L).values for L in layers], positions=layers,
                      showmedians=True, widths=0.8)
        ticks = []
        for L in layers:
            values = ds.principal_angle.sel(layer=L).values
            ticks.append(f"{L}\nmedian {np.median(values):.0f}\np10 {np.percentile(values, 10):.0f}\n"
                         f"min {values.min():.0f}")
        ax.set_xticks(layers, ticks, fontsize=MIN_TEXT)
        ax.set_ylim(0, 92)
        ax.set_xlabel("layer")
        ax.set_ylabel("principal angle between\nquery subspaces (degrees)")
        ax.set_title(wrap("(a) how orthogonal are trained heads?", panel, 8))
        ax = axes[1, 0]
        ax.boxplot([ds.cross_norm.sel(layer=L).values for L in layers], positions=layers, widths=0.6)
        ax.set_xticks(layers)
        ax.set_xlabel("layer")
        ax.set_ylabel(r"$\|M_{h'} M_h\|_{op} / (\|M_{h'}\| \|M_h\|)$")
        ax.set_title(wrap("(b) overlap between heads (0: orthogonal, Thm 39 needs it small)", panel, 8))

        b_vals = ds.beta.values.astype(float)
        b_edges = log_edges(b_vals)
        l_edges = np.arange(len(layers) + 1) - 0.5
        mesh = None
        for col, heads in ((1, "trained"), (2, "trained_orthogonal")):
            sub = ds.sel(heads=heads)
            for row, (var, what) in enumerate((("frac_mono_path", "every head monotone up to T_eps"),
                                               ("frac_time_rd", "time inside Radial Dominance"))):
                ax = axes[row, col]
                mesh = ax.pcolormesh(l_edges, b_edges, sub[var].transpose("beta", "layer").values,
                                     cmap="viridis", vmin=0, vmax=1, shading="flat")
                if row == 0:
                    mean = sub.beta_mono_mean.values
                    ax.plot(np.arange(len(layers)), mean, "D", color="w", mec="k", ms=6)
                    above = sub.beta_mono_above_grid.values >= 0.5
                    below = sub.beta_mono_below_grid.values >= 0.5
                    ax.plot(np.arange(len(layers))[above], np.full(above.sum(), b_edges[-1] * 0.93), "^",
                            color="w", mec="k")
                    ax.plot(np.arange(len(layers))[below], np.full(below.sum(), b_edges[0] * 1.07), "v",
                            color="w", mec="k")
                ax.set_xticks(np.arange(len(layers)), [str(L) for L in layers])
                log_ticks(ax, "y", b_vals)
                ax.set_ylim(b_edges[0], b_edges[-1])
                ax.set_xlabel("layer")
                ax.set_ylabel(r"inverse temperature $\beta$" if wide else r"$\beta$")
                letter = "cdef"[(col - 1) * 2 + row]
                label = "trained heads" if heads == "trained" else "orthogonal heads, equal strength"
                ax.set_title(wrap(f"({letter}) {label}: {what}", panel, 8))
        if wide:
            fig.colorbar(mesh, ax=[axes[0, 2], axes[1, 2]], shrink=0.7, label="fraction of runs / of time")
        else:
            fig.colorbar(mesh, ax=list(axes[:, 1:].ravel()), location="bottom", shrink=0.8,
                         label="fraction of runs / of time")
        # Under the panels, off the maps.
        fig.legend(handles=[Patch(color="tab:green", alpha=0.15, label="(a) 70-85 degrees (the paper)"),
                            Line2D([], [], marker="D", color="w", mec="k", ls="",
                                   label="(c, e) measured threshold (mean over seeds)"),
                            Line2D([], [], marker="^", color="w", mec="k", ls="", label="above the grid"),
                            Line2D([], [], marker="v", color="w", mec="k", ls="",
                                   label="fails already at the smallest beta")],
                   loc="outside lower center", ncol=2 if wide else 1)
        # The weights by their file's name: a path is one word no line break can split.
        weights = Path(str(spec.fixed.get("weights", ""))).name
        fixed = ", ".join([f"weights={weights}", self.describe_fixed(spec, ("n", "init", "values"))])
        fig.suptitle(wrap(f"Trained heads (Thm 19, 39): {fixed}; seeds={len(ds.seed)}", 0.95 * width, 9))
        return fig


EXPERIMENT = TrainedHeads()
