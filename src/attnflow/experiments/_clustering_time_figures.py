"""The clustering_time figures' panels: from equiangular starts against the closed form and the bound
(``clustering_time.png``), from uniform starts (``clustering_time-uniform.png``)."""

from __future__ import annotations

import numpy as np


def equiangular(experiment, fig, axes, keys, ds, spec):
    from matplotlib.lines import Line2D

    from ..plotting import figure_width, log_ticks, mark_empty_log_axes, plain_log_axis, sns, wrap

    width = figure_width()
    panel = 0.95 * width / (2 if width >= 5 else 1)
    n, d = ds.n.values.astype(float), ds.d.values.astype(float)
    levels = ds.cluster_threshold.values.astype(float)
    shades = sns.color_palette("viridis", n_colors=d.size)
    for ax, att, letter in ((axes[0], "relu", "a"), (axes[1], "softmax", "b")):
        if att not in ds.attention.values:
            ax.set_axis_off()
            continue
        for dd, colour in zip(d, shades, strict=True):
            regime = ds.regime.sel(attention=att, d=dd).values
            if regime.any():
                ax.axvspan(n[regime].min() * 0.9, n[regime].max() * 1.1, color=colour, alpha=0.07)
            for m, level in enumerate(levels):
                sel = dict(attention=att, d=dd, cluster_threshold=level)
                ax.plot(n, ds.t_closed.sel(sel), "-", color=colour, lw=1, alpha=1 if m == 0 else 0.5)
                if m == 0:  # the linear bounds hold up to 1/2, not to 0.99 (the drive vanishes at 1)
                    ax.plot(n, ds.t_bound.sel(sel), "--", color=colour, lw=1)
                fit = float(ds.exponent_n.sel(sel))
                label = (f"d={dd:g}, {level:g}: {fit:.2f}" if np.isfinite(fit) else
                         f"d={dd:g}, {level:g}: {float(ds.exponent_n_all.sel(sel)):.2f} (all n)")
                ax.plot(n, ds.t_equiangular.sel(sel), "o", color=colour, mfc=colour if m == 0 else "none",
                        ms=4, label=label)
        log_ticks(ax, "x", n)
        plain_log_axis(ax, "y")
        ax.set_xlabel("tokens $n$")
        ax.set_ylabel("time to the level")
        what = ("relu: O(n log d) from the initial drive; shaded: (n-1) gamma0 <= 1/4" if att == "relu"
                else "softmax: O(n) bound from the initial drive; shaded: n-1 >= 4 e^(beta lambda)")
        ax.set_title(wrap(f"({letter}) {what}", panel, 8))
        # Under the panel, off the data: the fitted slopes, which are the panel's result.
        title = wrap("log-log slope in n (d, level: slope), fitted in the shaded regime; all n: fewer "
                     "than 2 n there", panel)
        keys[ord(letter) - ord("a")].legend(*ax.get_legend_handles_labels(), loc="upper center", ncol=2,
                                            frameon=False, borderaxespad=0, title=title)

    ax = axes[2]
    palette = dict(zip(["softmax", "relu"], sns.color_palette(n_colors=2), strict=True))
    level = levels[0]
    for att in ds.attention.values:
        tones = np.linspace(1.0, 0.45, n.size)
        for i, nn in enumerate(n):
            colour = tuple(np.array(palette[att]) * tones[i])
            sel = dict(attention=att, n=nn, cluster_threshold=level)
            ax.plot(d, ds.t_closed.sel(sel), "-", color=colour, lw=1)
            got = float(ds.log_d_slope.sel(sel))
            label = f"{att}, n={nn:g}: {got:.2f}"
            if att == "relu":
                label += f" ({float(ds.log_d_slope_relu_bound.sel(n=nn)):.2f})"
            ax.plot(d, ds.t_equiangular.sel(sel), "s", color=colour, ms=4, label=label)
    ax.set_xscale("log")
    log_ticks(ax, "x", d)
    ax.set_xlabel("dimension $d$ (log scale)")
    ax.set_ylabel(f"time to {level:g}")
    ax.set_title(wrap("(c) equiangular start against d: relu grows like log d, softmax barely moves",
                      panel, 8))
    keys[2].legend(*ax.get_legend_handles_labels(), loc="upper center", ncol=2, frameon=False,
                   borderaxespad=0, title="dT/dlog d (relu: its bound)")

    ax = axes[3]
    gap = np.abs(ds.rel_error.values.ravel())
    ax.hist(np.log10(np.clip(gap[np.isfinite(gap)], 1e-16, None)), bins=20, color="0.4")
    ax.set_xlabel(r"$\log_{10}$ |T particles / T closed form - 1|")
    ax.set_ylabel("cells")
    ax.set_title(wrap(f"(d) particles against the closed-form integral (rtol {spec.fixed.get('rtol'):g})",
                      panel, 8))
    handles = [Line2D([], [], color="k", marker="o", ls="",
                      label="particles (filled: to 1/2, open: to 0.99)"),
               Line2D([], [], color="k", lw=1, label="closed form: exact time integral"),
               Line2D([], [], color="k", ls="--", lw=1,
                      label="upper bound to 1/2 read off the initial drive (relu at n = 2: logit form)")]
    for handle in handles:
        handle.set_label(wrap(handle.get_label(), panel - 0.5))
    keys[3].legend(handles=handles, loc="upper center", frameon=False, borderaxespad=0,
                   title="(a)-(c): lines and markers")
    fixed = experiment.describe_fixed(spec, ("heads", "H", "beta", "lambda_bar"))
    fig.suptitle(wrap(f"Clustering time, relu vs softmax (Thm 25), equiangular start gamma0 = 1/sqrt(d); "
                      f"{fixed}", 0.95 * width, 9))
    mark_empty_log_axes(fig)  # before the layout, which draws the axes


def uniform(experiment, fig, axes, ds, spec):
    from matplotlib.lines import Line2D

    from ..plotting import figure_width, log_ticks, sns, wrap

    width = figure_width()
    panel = 0.95 * width / (2 if width >= 5 else 1)
    n, d = ds.n.values.astype(float), ds.d.values.astype(float)
    levels = ds.cluster_threshold.values.astype(float)
    level = levels[0]
    if "clusters_uniform" not in ds:
        for ax in axes:
            ax.set_axis_off()
        axes[0].text(0.5, 0.5, "no uniform starts in the grid", transform=axes[0].transAxes, ha="center")
        return
    palette = dict(zip(["softmax", "relu"], sns.color_palette(n_colors=2), strict=True))
    ax = axes[0]
    for att in ds.attention.values:
        for k, dd in enumerate(d):
            colour = tuple(np.array(palette[att]) * np.linspace(1.0, 0.45, d.size)[k])
            sel = dict(attention=att, d=dd, cluster_threshold=level)
            med = ds.clusters_uniform.sel(sel).values
            lo, hi = ds.clusters_uniform_q1.sel(sel).values, ds.clusters_uniform_q3.sel(sel).values
            ax.errorbar(n * (1 + 0.03 * k), med, yerr=[med - lo, hi - med], fmt="o-", color=colour,
                        ms=4, capsize=2, label=f"{att}, d={dd:g}")
    ax.plot(n, n, color="0.6", lw=0.8, ls="--", label="n (no token merged)")
    ax.set_xscale("log")
    log_ticks(ax, "x", n)
    log_ticks(ax, "y", [1, *n])  # most runs end in one cluster
    ax.set_xlabel("tokens $n$")
    ax.set_ylabel("clusters at $t_{max}$ (median, quartiles)")
    ax.set_title(wrap(f"(a) clusters left at t_max = {spec.fixed['t_max']:g} (tokens joined where "
                      f"<x_i, x_j> >= {1 - spec.fixed.get('cluster_eps', 0.01):g})", panel, 8))
    ax = axes[1]
    for att in ds.attention.values:
        for k, dd in enumerate(d):
            colour = tuple(np.array(palette[att]) * np.linspace(1.0, 0.45, d.size)[k])
            for m, lv in enumerate(levels):
                frac = ds.censored_uniform.sel(attention=att, d=dd, cluster_threshold=lv).values
                ax.plot(n, frac, "o-" if m == 0 else "o:", color=colour, mfc=colour if m == 0 else "none",
                        ms=4)
    ax.set_xscale("log")
    log_ticks(ax, "x", n)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("tokens $n$")
    ax.set_ylabel("censored fraction")
    ax.set_title(wrap("(b) runs that never reach the level by t_max", panel, 8))
    # One legend for both panels, under them: the colours are (attention, d) in both.
    handles = [h for h in axes[0].get_legend_handles_labels()[0]]
    handles += [Line2D([], [], color="k", marker="o", ls="-", label=f"(b) to {levels[0]:g}")]
    if levels.size > 1:
        handles += [Line2D([], [], color="k", marker="o", mfc="none", ls=":",
                           label=f"(b) to {levels[1]:g}")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3 if width >= 5 else 2)
    fixed = experiment.describe_fixed(spec, ("heads", "H", "beta", "lambda_bar"))
    fig.suptitle(wrap(f"Clustering from uniform random starts, relu vs softmax (Thm 25); {fixed}",
                      0.95 * width, 9))
