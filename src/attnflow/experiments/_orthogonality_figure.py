"""The orthogonality figure: the configuration map, survival against the overlap in units of the margin."""

from __future__ import annotations

import numpy as np

MIN_PER_BIN = 10  # the curve skips bins with fewer configurations (a share of 3 is noise)


def plot(experiment, summary, spec, geometries):
    # Drawing modules load here, not at module top: every workflow job imports the registry.
    from ..plotting import figure_width, plt, wrap

    ds = experiment.with_axes(summary, spec)
    others = [d for d in ds.monotone.dims if d not in ("delta", "beta", "seed", "time", "geometry")]
    betas = ds.beta.values.astype(float)
    markers = {"sphere": ("o", "C0"), "flat": ("s", "C1")}
    fig, axes = plt.subplots(2, 2, figsize=(figure_width(), 6.8), layout="constrained")
    b_edges = np.arange(len(betas) + 1) - 0.5
    mesh = None
    for g, geometry in enumerate(geometries):
        ax = axes[0, g]
        share = ds.base_share.sel(geometry=geometry).values
        low, high = f"{np.nanmin(share):.0%}", f"{np.nanmax(share):.0%}"
        spread = low if low == high else f"{low}-{high}"
        ax.set_title(f"{geometry}: orthogonal heads monotone at\n{spread} of the configurations "
                     "(per beta)", fontsize=8)
        if "omega_edges" not in ds:
            ax.text(0.5, 0.5, "no overlap on the grid (every delta = 0)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
            continue
        edges = ds.omega_edges.values
        survival = ds.map_survival.sel(geometry=geometry).transpose("beta", "omega_bin").values
        certified_share = ds.map_certified.sel(geometry=geometry).transpose("beta", "omega_bin").values
        mesh = ax.pcolormesh(edges, b_edges, np.ma.masked_invalid(survival), cmap="viridis", vmin=0,
                             vmax=1, shading="flat")
        centres = np.sqrt(edges[:-1] * edges[1:])
        for j in range(len(betas)):
            for k, centre in enumerate(centres):
                if np.isfinite(survival[j, k]):
                    ax.text(centre, j, f"{survival[j, k]:.2f}\n{certified_share[j, k]:.2f}", ha="center",
                            va="center", fontsize=7, color="w" if survival[j, k] < 0.6 else "k")
        prediction = ds.predicted_omega.sel(geometry=geometry)
        for j, b in enumerate(betas):
            median = float(prediction.sel(beta=b).median())
            if np.isfinite(median):
                label = "median of the margin's predicted critical omega" if j == 0 else None
                ax.plot(np.clip(median, edges[0], edges[-1]), j + 0.38, "D", ms=5, mfc="w", mec="k",
                        mew=0.8, clip_on=False, label=label)
        ax.set_xscale("log")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_xticks(edges, [f"{e:.2g}" for e in edges], rotation=45)
        ax.minorticks_off()
        ax.set_yticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.grid(False)
        ax.set_xlabel(r"overlap $\omega = \max\|M_{h'} M_h\|_{op}$")
        ax.set_ylabel(r"inverse temperature $\beta$")
    if mesh is not None:
        fig.colorbar(mesh, ax=list(axes[0]), label="share staying monotone (first number)", shrink=0.9)
        axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.32), frameon=False)

    ax = axes[1, 0]
    ratio = ds.ratio_edges.values
    centres = np.sqrt(ratio[:-1] * ratio[1:])
    for geometry in geometries:
        marker, colour = markers[geometry]
        enough = ds.ratio_configurations.sel(geometry=geometry).values >= MIN_PER_BIN
        ax.plot(centres[enough], ds.ratio_survival.sel(geometry=geometry).values[enough], marker=marker,
                color=colour, label=geometry)
    ax.axvline(1.0, color="k", ls="--", lw=0.8, label="omega = the margin's prediction")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel(r"$\omega$ / the margin's prediction (per configuration)")
    ax.set_ylabel("share staying monotone")
    ax.set_title(f"survival against the overlap in units of the margin\n(bins of >= {MIN_PER_BIN} "
                 "configurations)", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")

    ax = axes[1, 1]
    top, low = np.nan, np.nan
    for geometry in geometries:
        crit = ds.critical_omega.sel(geometry=geometry).values.ravel()
        pred = ds.predicted_omega.sel(geometry=geometry).values.ravel()
        ok = np.isfinite(pred) & (pred > 0) & ~np.isnan(crit)
        crit, pred = crit[ok], pred[ok]
        if not crit.size:
            continue
        marker, colour = markers[geometry]
        finite = np.isfinite(crit)
        no_earlier = np.mean(crit[finite] >= pred[finite]) if finite.any() else np.nan
        ax.scatter(pred[finite], crit[finite], s=7, marker=marker, color=colour, alpha=0.6, lw=0,
                   label=f"{geometry}: {np.mean(finite):.0%} fail, {no_earlier:.0%} ≥ predicted")
        top = np.nanmax([top, *crit[finite], *pred])
        low = np.nanmin([low, *pred])
        # Never failing up to the search's end: a triangle on the panel's top edge.
        ax.scatter(pred[~finite], np.ones((~finite).sum()), s=9, marker="^", color=colour,
                   transform=ax.get_xaxis_transform(), clip_on=False)
    if np.isfinite(top):
        line = np.geomspace(low, top, 2)
        ax.plot(line, line, "k--", lw=0.8, label="= predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"margin's prediction $\min_h \mathrm{margin}_h / \sum_i |u^h_i| \sum_{h'} |u^{h'}_i|$")
    ax.set_ylabel(r"critical $\omega$ along the run's perturbation")
    ax.set_title("critical overlap per configuration\n(triangles on top: never fails)", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")  # below the diagonal: where the bound says nothing fails
    fixed = experiment.describe_fixed(spec, ("attention", "init", "H", "n", "d", "t_max", "seeds"))
    if others:
        fixed += f"; pooled over {', '.join(others)}"
    fig.suptitle(wrap(f"Approximate orthogonality (Thm 39), pointwise at the configurations up to "
                      f"$T_\\varepsilon$\n{fixed}", figure_width() - 0.2, 9), fontsize=9)
    return fig
