"""The metastability figure: the longest plateau against beta, per (H, d), with its fitted law and verdict."""

from __future__ import annotations

import numpy as np


def plot(experiment, summary, spec, verdict_line):
    # Drawing modules load here, not at module top: every workflow job imports the registry.
    from ..plotting import (
        figure_width,
        legend_of_drawn,
        log_edges,
        log_ticks,
        plain_log_axis,
        plt,
        sns,
        wrap,
    )

    ds = experiment.with_axes(summary, spec)
    combos = [(H, d) for H in ds.H.values for d in ds.d.values]
    # The bottom row's legends go under their panels (the extra height): inside, they covered runs.
    fig, axes = plt.subplots(3, len(combos), figsize=(figure_width(), 10.5), squeeze=False,
                             layout="constrained")
    t = ds.time.values[1:]  # t = 0 has no place on a log axis
    betas = ds.beta.values.astype(float)
    t_edges, b_edges = log_edges(t), log_edges(betas)
    n = int(spec.fixed["n"])
    shown = betas[np.unique(np.linspace(0, betas.size - 1, min(3, betas.size)).round().astype(int))]
    colours = dict(zip(shown, sns.color_palette("viridis", n_colors=shown.size), strict=True))
    mesh = None
    for col, (H, d) in enumerate(combos):
        sub = ds.sel(H=H, d=d)
        # A beta whose cells all failed has no staircase below: no dotted line for it either.
        drawn = [b for b in shown if np.isfinite(sub.count_median.sel(beta=b).values).any()]
        ax = axes[0, col]
        median = sub.count_median.transpose("beta", "time").values[:, 1:]
        mesh = ax.pcolormesh(t_edges, b_edges, median, cmap="viridis", vmin=1, vmax=n, shading="flat")
        ax.set_xscale("log")
        log_ticks(ax, "y", betas)
        for b in drawn:
            ax.axhline(b, color=colours[b], lw=0.8, ls=":")
        ax.set_xlabel("time $t$ (log)")
        ax.set_ylabel(r"inverse temperature $\beta$")
        ax.set_title(f"H = {H}, d = {d}: median cluster count over (log t, beta)\n(dotted: the betas "
                     "of the staircase below)", fontsize=8)

        ax = axes[1, col]
        for b in drawn:
            row = sub.sel(beta=b)
            ax.step(t, row.count_median.values[1:], where="post", color=colours[b], lw=1.6,
                    label=rf"$\beta$ = {b:g}: median")
            for q in ("count_q1", "count_q3"):
                ax.step(t, row[q].values[1:], where="post", color=colours[b], lw=0.8, ls="--")
        ax.set_xscale("log")
        plain_log_axis(ax, "y", base=2, subs=(1.0,))  # counts: 1, 2, 4, 8, 16
        ax.set_xlabel("time $t$ (log)")
        ax.set_ylabel("clusters (median; dashed: quartiles)")
        ax.set_title(f"H = {H}, d = {d}: the staircase, {ds.sizes['seed']} seeds", fontsize=8)
        legend_of_drawn(ax, fontsize=7, loc="lower left")  # before the first merger: no line there

        ax = axes[2, col]
        length = sub.plateau.transpose("beta", "seed").values
        cens = sub.plateau_censored.transpose("beta", "seed").values > 0
        jitter = np.exp(np.linspace(-0.04, 0.04, length.shape[1]))[None, :]
        bb = betas[:, None] * jitter
        ax.scatter(bb[~cens], length[~cens], s=14, color="C0", label="longest plateau (run)")
        ax.scatter(bb[cens], length[cens], s=14, facecolors="none", edgecolors="C3",
                   label="censored at t_max (lower bound)")
        ax.plot(betas, sub.plateau_median.values, "k_", ms=14, mew=2, label="median (bounds as values)")
        fit = {k: float(sub[f"fit_{k}"]) for k in ("rate", "rate_half", "rate_intercept", "power",
                                                   "power_half", "power_intercept")}
        verdict = str(sub.fit_verdict.values)
        if np.isfinite(fit["rate"]):
            # derive()'s fits, solid over the betas it fitted and faded beyond them:
            # log length = intercept + slope * u(beta), u = beta (exponential) or log beta (power law)
            fitted = sub.fitted.values.astype(bool)
            lo, hi = betas[fitted].min(), betas[fitted].max()
            models = (
                ("k-", "rate", np.asarray,
                 f"exp: rate {fit['rate']:.3g} ± {fit['rate_half']:.2g} per unit beta"),
                ("k--", "power", np.log,
                 f"power: beta^({fit['power']:.3g} ± {fit['power_half']:.2g})"),
            )
            for style, key, u, label in models:
                a, slope = fit[f"{key}_intercept"], fit[key]
                inside = np.geomspace(lo, hi, 50)
                ax.plot(inside, np.exp(a + slope * u(inside)), style, lw=1, label=label)
                for start, stop in ((betas.min(), lo), (hi, betas.max())):
                    if stop > start:
                        beyond = np.geomspace(start, stop, 20)
                        ax.plot(beyond, np.exp(a + slope * u(beyond)), style, lw=1, alpha=0.3)
        t_max = float(spec.fixed["t_max"])
        ax.axhline(t_max, color="0.5", lw=0.8, ls=":", label="t_max")
        floor = np.nanmin(length) if np.isfinite(length).any() else 1e-2
        ax.set_ylim(floor / 3, t_max * 10)
        ax.set_xscale("log")
        log_ticks(ax, "x", betas)
        ax.set_yscale("log")
        ax.set_xlabel(r"inverse temperature $\beta$")
        ax.set_ylabel("longest plateau length (time)")
        ax.set_title(wrap(f"H = {H}, d = {d}: {verdict_line(sub, verdict)} (censored fit, open markers "
                          "lower bounds; faded: beyond; ±: 95%)", figure_width() / len(combos) - 0.3, 8),
                     fontsize=8)
        # No entry for censored runs where there are none.
        legend_of_drawn(ax, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.colorbar(mesh, ax=list(axes[0]), label="median cluster count")
    fixed = experiment.describe_fixed(spec, ("attention", "heads", "n", "lambda_bar", "cluster_eps", "t_max"))
    fig.suptitle(wrap(f"Metastability (result 10): cluster count against log t; {fixed}; samples evenly "
                      "spaced in log t", figure_width() - 0.2, 9), fontsize=9)
    return fig
