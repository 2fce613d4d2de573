"""Figures from summary datasets: one function per experiment, closed form next to measurement."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
import xarray as xr  # noqa: E402

sns.set_theme(context="paper", style="whitegrid")


def _fixed(ds: xr.Dataset, config: dict, experiment: str) -> str:
    fixed = config["experiments"][experiment].get("fixed", {})
    keys = ("attention", "heads", "H", "n", "d", "beta", "lambda_bar", "spread", "init", "gamma0",
            "geometry", "t_max")
    return ", ".join(f"{k}={fixed[k]}" for k in keys if k in fixed)


def _ensure_dims(ds: xr.Dataset, config: dict, experiment: str, dims) -> xr.Dataset:
    """Give axes a figure facets over but the config fixed a length-1 dimension."""
    fields = {**config.get("defaults", {}), **config["experiments"][experiment].get("fixed", {})}
    for dim in dims:
        if dim not in ds.dims:
            if dim in ds.coords:
                ds = ds.drop_vars(dim)
            ds = ds.expand_dims({dim: [fields[dim]]})
    return ds


def _log_ticks(ax, axis, values):
    """Log axis with ticks at the grid values, written plainly."""
    set_scale, set_ticks = (ax.set_xscale, ax.set_xticks) if axis == "x" else (ax.set_yscale, ax.set_yticks)
    set_scale("log")
    set_ticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()


def energy(ds, config):
    ds = _ensure_dims(ds, config, "energy", ("heads", "geometry"))
    combos = [(h, g) for h in ds.heads.values for g in ds.geometry.values]
    fig, axes = plt.subplots(2, len(combos), figsize=(3.3 * len(combos), 5.6), squeeze=False,
                             sharex=True)
    colors = sns.color_palette(n_colors=ds.sizes["head"])
    for k, (heads, geometry) in enumerate(combos):
        sub = ds.sel(heads=heads, geometry=geometry)
        top, bottom = axes[0, k], axes[1, k]
        top.plot(ds.time, sub.energy_total, color="k", lw=1.8, label=r"total $E_{multi}$")
        for h, color in zip(ds["head"].values, colors, strict=True):
            top.plot(ds.time, sub.energy_head.sel(head=h), color=color, label=f"head {h}: $E_{h}$")
            bottom.plot(ds.time, sub.energy_rate_min.sel(head=h), color=color,
                        label=f"head {h}")
        bottom.axhline(0.0, color="k", lw=0.8)
        res, falling = float(sub.thm11_residual), float(sub.frac_head_falling)
        top.set_title(f"{heads} heads, {geometry}\nThm 11 residual {res:.1e}", fontsize=8)
        bottom.set_title(f"samples with a head's energy falling: {falling:.0%}", fontsize=8)
        bottom.set_xlabel(r"time $t$")
    axes[0, 0].set_ylabel(r"energy (mean over seeds)")
    axes[1, 0].set_ylabel(r"min over seeds of $dE_h/dt$")
    axes[0, 0].legend(fontsize=6)
    axes[1, 0].legend(fontsize=6)
    fig.suptitle(f"Energy (Thm 11, 16-17): total rises everywhere; per-head energy can fall on the "
                 f"sphere; {_fixed(ds, config, 'energy')}", fontsize=9)
    fig.tight_layout()
    return fig


def beta_star(ds, config):
    ds = _ensure_dims(ds, config, "beta_star", ("H", "n", "attention", "beta"))
    Hs, ns = ds.H.values, ds.n.values
    fig, axes = plt.subplots(len(Hs), len(ns), figsize=(3.6 * len(ns), 2.9 * len(Hs)),
                             squeeze=False, sharex=True, sharey=True)
    palette = dict(zip(ds.attention.values, sns.color_palette(n_colors=ds.sizes["attention"]),
                       strict=True))
    for (i, H), (j, n) in ((a, b) for a in enumerate(Hs) for b in enumerate(ns)):
        ax = axes[i, j]
        for att, color in palette.items():
            sub = ds.sel(H=H, n=n, attention=att)
            ax.plot(ds.beta, sub.frac_mono_path, "o-", color=color,
                    label=f"{att}: per-head monotone up to $T_\\epsilon$")
            ax.plot(ds.beta, sub.frac_mono_t0, ":", color=color, label=f"{att}: at $t=0$")
            ax.plot(ds.beta, sub.frac_time_rd, "--", color=color, lw=1, alpha=0.7,
                    label=f"{att}: time in Radial Dominance")
            mean, std = float(sub.beta_emp_mean), float(sub.beta_emp_std)
            if np.isfinite(mean):
                ax.errorbar(mean, 0.5, xerr=std, fmt="D", color=color, ms=5, capsize=3,
                            label=f"{att}: empirical threshold")
            if float(sub.beta_emp_below_grid) >= 0.5:
                ax.plot(ds.beta[0], 0.5, "<", color=color, ms=9,
                        label=f"{att}: threshold below the grid")
        closed = float(ds.beta_star_closed.sel(H=H, n=n))
        if closed > 0:
            ax.axvline(closed, color="k", ls="--", lw=1.2, label=r"closed form $\beta^*(H,n)$")
        orth = float(ds.beta_orthogonal.sel(H=H, n=n))
        if np.isfinite(orth):
            ax.axvline(orth, color="tab:red", ls=":", lw=1.5, label="orthogonal-token check")
        _log_ticks(ax, "x", ds.beta.values)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"H={H}, n={n}; " + (f"$\\beta^*$={closed:.3f}" if closed > 0
                                          else r"$\beta^*\leq 0$: no $\beta$ qualifies"),
                     fontsize=8)
        if i == len(Hs) - 1:
            ax.set_xlabel(r"inverse temperature $\beta$")
        if j == 0:
            ax.set_ylabel("fraction of runs / of time")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.suptitle("Critical inverse temperature (Thm 19): empirical threshold (mean ± sd over seeds) "
                 f"vs closed form; {_fixed(ds, config, 'beta_star')}", fontsize=9)
    fig.tight_layout()
    return fig


def superadditivity(ds, config):
    ds = _ensure_dims(ds, config, "superadditivity", ("beta", "lambda_dist", "lambda_bar"))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    palette = sns.color_palette(n_colors=ds.sizes["beta"])
    for beta, color in zip(ds.beta.values, palette, strict=False):
        sub = ds.sel(beta=beta)
        ratio = sub.early_rate.sel(lambda_dist="linear") / sub.early_rate.sel(lambda_dist="equal")
        theory_ratio = (sub.early_rate_theory.sel(lambda_dist="linear")
                        / sub.early_rate_theory.sel(lambda_dist="equal"))
        axes[0].plot(ds.lambda_bar, theory_ratio, color=color, label=rf"$\sum\phi / H\phi$, $\beta$={beta:g}")
        axes[0].plot(ds.lambda_bar, ratio, "o", color=color, label="measured")
        axes[0].axvline(float(sub.lambda_c.max()), color=color, ls="--", lw=1)
        for dist, marker, size in (("equal", "s", 8), ("linear", "x", 6)):
            axes[1].plot(sub.late_rate_theory.sel(lambda_dist=dist), sub.late_rate.sel(lambda_dist=dist),
                         marker, color=color, ms=size, mfc="none", label=f"{dist}, $\\beta$={beta:g}")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_xlabel(r"mean head strength $\bar\lambda$ (dashed: $\lambda_c$)")
    axes[0].set_ylabel("early rate, heterogeneous / equal")
    axes[0].legend(fontsize=6)
    lim = float(np.nanmax(ds.late_rate_theory)) * 1.05
    axes[1].plot([0, lim], [0, lim], color="k", lw=0.8, label=r"$2\Lambda$")
    axes[1].set_xlabel(r"closed form $2\Lambda$")
    axes[1].set_ylabel(r"fitted late rate of $\epsilon(t)$")
    axes[1].legend(fontsize=6)
    fig.suptitle(f"Heterogeneous heads (Thm 22); {_fixed(ds, config, 'superadditivity')}")
    fig.tight_layout()
    return fig


def clustering_time(ds, config):
    ds = _ensure_dims(ds, config, "clustering_time", ("attention", "n", "d"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    palette = dict(zip(ds.attention.values, sns.color_palette(n_colors=ds.sizes["attention"]),
                       strict=True))
    styles = ["-", "--", ":", "-."]
    n = ds.n.values.astype(float)
    for att in ds.attention.values:
        for i, d in enumerate(ds.d.values):
            t = ds.t_cluster_median.sel(attention=att, d=d)
            slope = float(ds.exponent_n.sel(attention=att, d=d)) if "exponent_n" in ds else np.nan
            if np.isfinite(t).any():
                axes[0].plot(n, t.where(np.isfinite(t)), "o" + styles[i % 4], color=palette[att],
                             label=f"{att}, d={d}: fitted exponent {slope:.2f}")
            axes[2].plot(n, ds.censored_fraction.sel(attention=att, d=d), "o" + styles[i % 4],
                         color=palette[att], label=f"{att}, d={d}")
        for j, nn in enumerate(ds.n.values):
            t = ds.t_cluster_median.sel(attention=att, n=nn)
            slope = float(ds.exponent_d.sel(attention=att, n=nn)) if "exponent_d" in ds else np.nan
            if np.isfinite(t).any():
                axes[1].plot(ds.d, t.where(np.isfinite(t)), "s" + styles[j % 4], color=palette[att],
                             label=f"{att}, n={nn}: fitted exponent {slope:.2f}")
        if not np.isfinite(ds.t_cluster_median.sel(attention=att)).any():
            for ax in axes[:2]:
                ax.plot([], [], color=palette[att], label=f"{att}: censored everywhere (right)")
    finite = ds.t_cluster_median.where(np.isfinite(ds.t_cluster_median))
    if np.isfinite(finite).any():
        ref = float(finite.min())
        axes[0].plot(n, ref * n / n[0], "k--", lw=1, label=r"$O(n)$ reference")
        dmax = float(ds.d.max())
        axes[0].plot(n, 2 * ref * n * np.log(dmax) / (n[0] * np.log(dmax)), "k:", lw=1,
                     label=rf"$O(n \log d)$ reference, d={dmax:g}")
    _log_ticks(axes[0], "x", ds.n.values)
    _log_ticks(axes[1], "x", ds.d.values)
    for ax in axes[:2]:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1, 2, 3, 5, 7)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel(r"median clustering time $T_\epsilon$")
    axes[0].set_xlabel(r"tokens $n$")
    axes[1].set_xlabel(r"dimension $d$")
    axes[2].set_xscale("log")
    axes[2].set_xticks(ds.n.values, [f"{v:g}" for v in ds.n.values])
    axes[2].minorticks_off()
    axes[2].set_xlabel(r"tokens $n$")
    axes[2].set_ylabel(r"censored fraction ($T_\epsilon > t_{max}$)")
    axes[2].set_ylim(-0.05, 1.05)
    for ax in axes:
        ax.legend(fontsize=6)
    fig.suptitle(f"Clustering time (Thm 25), uniform random starts; "
                 f"{_fixed(ds, config, 'clustering_time')}; "
                 "medians with half the runs censored are not drawn")
    fig.tight_layout()
    return fig


def entropy(ds, config):
    ds = _ensure_dims(ds, config, "entropy", ("n", "beta"))
    df = ds.entropy.to_dataframe().reset_index()
    grid = sns.relplot(data=df, x="time", y="entropy", hue="beta", col="n", kind="line",
                       height=2.8, aspect=1.3, palette="viridis")
    for n, ax in grid.axes_dict.items():
        ax.axhline(np.log(n), color="k", ls="--", label=r"$\log n$")
        res = float(ds.thm27_residual.sel(n=n).max())
        ax.set_title(f"n={n}; Thm 27 residual {res:.1e}", fontsize=8)
        ax.legend(fontsize=6)
    grid.set_axis_labels(r"time $t$", r"attention entropy $H^h_i$ (nat)")
    grid.figure.suptitle(f"Entropy production (Thm 27); {_fixed(ds, config, 'entropy')}\n"
                         "residual: exact rate integrated (Simpson) vs stored entropy change",
                         y=1.08, fontsize=9)
    return grid.figure


def orthogonality(ds, config):
    ds = _ensure_dims(ds, config, "orthogonality", ("delta",))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(ds.delta, ds.frac_runs_monotone, "o-", label="runs with every head monotone")
    ax.plot(ds.delta, ds.min_relative_rate, "s-", label=r"min $\dot E_h$ / max $|\dot E_h|$")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlabel(r"perturbation norm $\delta$")
    ax.set_ylabel("fraction / ratio")
    overlap = ax.twinx()
    overlap.plot(ds.delta, ds.cross_norm, "k:", label=r"$\max\|M_{h'} M_h\|_{op}$ (right)")
    overlap.set_ylabel(r"measured head overlap $\max\|M_{h'} M_h\|_{op}$")
    overlap.grid(False)
    handles = ax.get_legend_handles_labels()
    extra = overlap.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="center right")
    ax.set_title(f"Approximate orthogonality (Thm 39)\n{_fixed(ds, config, 'orthogonality')}",
                 fontsize=8)
    fig.tight_layout()
    return fig


FIGURES = {
    "energy": energy,
    "beta_star": beta_star,
    "superadditivity": superadditivity,
    "clustering_time": clustering_time,
    "entropy": entropy,
    "orthogonality": orthogonality,
}


def render(experiment: str, ds: xr.Dataset, config: dict, outputs, source: str = "") -> None:
    """Draw the experiment's figure and save it to every path in ``outputs`` (PNG, PDF).

    The files carry their provenance in their metadata: experiment, summary
    store, config digest and package version.
    """
    fig = FIGURES[experiment](ds, config)
    provenance = (f"attnflow {ds.attrs.get('attnflow_version', '?')}; experiment {experiment}; "
                  f"summary {source}; config sha256 {ds.attrs.get('config_sha256', '?')}")
    for path in outputs:
        if str(path).endswith(".pdf"):
            meta = {"Title": f"attnflow {experiment}", "Subject": provenance, "Creator": "attnflow"}
        else:
            meta = {"Title": f"attnflow {experiment}", "Description": provenance,
                    "Software": "attnflow"}
        fig.savefig(path, dpi=150, bbox_inches="tight", metadata=meta)
    plt.close(fig)
