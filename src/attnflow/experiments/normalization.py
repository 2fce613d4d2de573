"""Normalization schemes (docs/model.md, result 12): how Post-LN, Pre-LN, Peri-LN and nGPT cluster."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import xarray as xr

from .. import theory
from ..geometry import GEOMETRIES
from . import Axis, Bound, Experiment

# The clusters left are counted at this depth (time), or at t_max where the horizon is shorter.
DEPTH = 10.0
# epsilon below this is round-off of 1 - gamma_min: not drawn on the log axes.
EPSILON_FLOOR = 1e-13
SCHEMES = tuple(g.name for g in GEOMETRIES if g.speed is not None)  # the sphere flows of result 12


@contextlib.contextmanager
def _quiet():
    """A failed cell is NaN for every seed, so its medians are NaN by design: numpy's warnings would
    only print into the plot job's log."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        yield


def _last_finite(values: xr.DataArray) -> xr.DataArray:
    """Along ``time``, the last finite entry (NaN where none)."""
    a = values.transpose(..., "time").values
    finite = np.isfinite(a)
    index = a.shape[-1] - 1 - np.argmax(finite[..., ::-1], axis=-1)
    picked = np.take_along_axis(a, index[..., None], axis=-1)[..., 0]
    dims = values.transpose(..., "time").dims[:-1]
    return xr.DataArray(np.where(finite.any(-1), picked, np.nan), dims=dims,
                        coords={d: values[d] for d in dims if d in values.coords})


class Normalization(Experiment):
    name = "normalization"
    theorem = "result 12 (Karagodin, Ge, Polyanskiy, Rigollet 2025)"
    question = ("How fast do tokens cluster under each normalization scheme (Post-LN, the sphere; Pre-LN; "
                "Peri-LN; nGPT), from equiangular starts against the closed-form times and from uniform "
                "starts; does Pre-LN's epsilon fall like t^-2 where Post-LN's falls exponentially; and how "
                "many clusters does each scheme leave at a fixed depth?")
    axes = (
        Axis("geometry", min_values=2, allowed=SCHEMES, why="the schemes side by side"),
        Axis("beta", why="a map over beta"),
        Axis("init", required=("equiangular",), allowed=("equiangular", "uniform"),
             why="the equiangular start has the closed-form times"),
    )
    observables = ("clusters", "radius")
    # 2: the closed-form times in log space (inf past float64, where they raised) and their last digits
    # (theory.equiangular_scheme_time in x = logit, equiangular_scheme_parts without cancellation)
    reduction_version = 2
    defaults = {
        "fixed": {"attention": "softmax", "heads": "scalar", "H": 2, "n": 6, "d": 8, "lambda_dist": "linear",
                  "lambda_bar": 0.8, "spread": 0.25, "gamma0": 0.05, "cluster_metric": "gamma_mean",
                  "cluster_threshold": 0.99, "t_max": 100.0, "n_samples": 41, "sample_spacing": "log",
                  "seeds": 4, "rtol": 1e-9, "atol": 1e-12},
        "grid": {"geometry": list(SCHEMES), "init": ["equiangular", "uniform"], "beta": [1.3, 4.0]},
        "batch_over": ["geometry", "init", "beta"],
    }
    pinned = {"attention": ("softmax", "the equiangular ODEs of result 12 are derived for softmax"),
              "heads": ("scalar", "the equiangular ODEs are those of scalar heads"),
              "cluster_metric": ("gamma_mean", "the time for the common cosine to reach its level")}
    fixed_only = {key: "the closed-form times are drawn for one set of head strengths"
                  for key in ("H", "n", "lambda_dist", "lambda_bar", "spread", "gamma0", "ngpt_alpha")}
    bounds = (Bound("cluster_threshold", low=lambda cell: cell.gamma0, high=1.0, low_text="gamma0",
                    high_text="1"),)
    caption = ("Result 12: normalization schemes as per-token speeds on the sphere flow (scalar softmax "
               "heads). (a) Clustering time (the mean cosine reaching the threshold) over (scheme, beta): "
               "dots, particles from equiangular starts (median over seeds); circles, uniform starts "
               "(median; censored medians, not clustered by t_max, are not drawn); lines, the closed-form "
               "quadrature of the equiangular ODEs; a triangle at the top, a quadrature time past 1.8e308 "
               "(float64's largest: Pre-LN's and Peri-LN's times grow with their radii, past it at large "
               "beta, as at beta = 16). (b) epsilon = 1 - gamma_min against time on log-log axes from the "
               "equiangular start at the smallest beta: Pre-LN's slope -2 (dashed) and "
               "Post-LN's exp(-2 Lambda t) (dotted) drawn through the late samples. (c) Clusters left at a "
               "fixed depth from uniform starts (mean over seeds), per scheme and beta: the paper's "
               "representation collapse as a map. (d) The mean radius from the equiangular start.")
    reading = ("In (a) every equiangular dot sits on its line (the quadrature of result 12: the title gives "
               "the largest relative gap, which the solver's tolerance sets); Pre-LN and Peri-LN take "
               "several times longer than Post-LN because the radii grow and slow the directions, and "
               "nGPT's speed alpha/||u|| is close to Post-LN's. In (b) Post-LN's epsilon falls "
               "exponentially (a curve that plunges on log-log axes to round-off) while Pre-LN's follows the "
               "slope -2 line: epsilon t^2 tends to a constant because r grows linearly (d). In (c) the "
               "schemes that slow clustering leave more clusters at a given depth: the map reads which "
               "normalization resists representation collapse, and how that depends on beta. The energy "
               "identities are not drawn here: the flows are no gradient flows of the energy at speed 1.")
    column_layout = False  # four panels: drawn at the text width (7 in)

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        times = ds.time.values
        depth = int(np.argmin(np.abs(times - min(DEPTH, times[-1]))))
        with _quiet():
            return xr.Dataset({
                "t_cluster": ds.t_cluster.where(~ds.censored, np.inf),
                "epsilon": (1.0 - ds.gamma_min).median("seed"),
                "radius_mean": ds.radius_mean.median("seed"),
                "clusters_depth": ds.cluster_count.isel(time=depth).astype(float).drop_vars("time"),
                "lam": ds.lam.mean("seed"),
            })

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        n, gamma0 = int(spec.fixed["n"]), float(spec.fixed["gamma0"])
        level = float(spec.fixed.get("cluster_threshold", 0.99))
        alpha = float(spec.fixed.get("ngpt_alpha", 1.0))
        lam = out.lam
        for dim in [d for d in lam.dims if d != "head"]:
            lam = lam.max(dim)  # every cell has the same strengths (fixed_only); NaN-free over failures
        lambdas = lam.values
        geometries = [str(g) for g in np.atleast_1d(out.geometry.values)] if "geometry" in out.dims \
            else [str(spec.fixed["geometry"])]
        betas = np.atleast_1d(out.beta.values).astype(float) if "beta" in out.dims else \
            np.array([float(spec.fixed["beta"])])
        closed = np.array([[theory.equiangular_scheme_time(gamma0, level, lambdas, b, n, g, alpha)
                            for b in betas] for g in geometries])
        out["t_closed"] = (("geometry", "beta"), closed)
        out = out.assign_coords(geometry=geometries, beta=betas) if "geometry" not in summary.dims else out
        with _quiet():
            out["t_median"] = out.t_cluster.median("seed")
            out["clusters_mean"] = out.clusters_depth.mean("seed")
        if "init" in out.dims and "equiangular" in out.init.values:
            gap = out.t_median.sel(init="equiangular") / out.t_closed - 1.0
            out["rel_gap"] = gap
            finite = np.abs(gap.values[np.isfinite(gap.values)])
            out.attrs["max_rel_gap"] = float(finite.max()) if finite.size else np.nan
            eps = out.epsilon.sel(init="equiangular")
            above = (eps > EPSILON_FLOOR) & (out.time > 0)
            last = eps.where(above) * out.time**2
            out["late_t2"] = _last_finite(last)
        out.attrs.update({"depth": min(DEPTH, float(out.time.values[-1])), "n": n, "gamma0": gamma0,
                          "level": level, "Lambda": float(np.sum(lambdas))})
        return out

    def plot(self, summary, spec):
        from ..plotting import figure_width, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        width = figure_width()
        geometries = [str(g) for g in ds.geometry.values]
        betas = ds.beta.values.astype(float)
        colours = dict(zip(geometries, sns.color_palette("colorblind", len(geometries)), strict=True))
        fig, axes = plt.subplots(2, 2, figsize=(width, 0.85 * width), layout="constrained")
        ax_time, ax_eps, ax_map, ax_r = axes.ravel()
        # (a) clustering time against beta, closed form and particles
        for g in geometries:
            c = colours[g]
            closed = ds.t_closed.sel(geometry=g).values
            ax_time.plot(betas, closed, color=c, lw=1.5, label=g)
            # A finite time with no finite neighbour (one beta, or the last before inf) is a line of one
            # point, which draws nothing: a dash marks it.
            ok = np.isfinite(closed) & (closed > 0)
            alone = ok & ~np.r_[False, ok[:-1]] & ~np.r_[ok[1:], False]
            ax_time.plot(betas[alone], closed[alone], "_", color=c, ms=10, mew=1.5)
            ax_time.plot(betas, ds.t_median.sel(geometry=g, init="equiangular"), "o", color=c, ms=5)
            if "uniform" in ds.init.values:
                ax_time.plot(betas, ds.t_median.sel(geometry=g, init="uniform"), "o", mfc="none", color=c,
                             ms=7)
        # A closed-form time past float64's range (pre_ln's radius at large beta, theory.
        # equiangular_scheme_time) has no point on the axis: a triangle at the top says where the line goes.
        beyond = [(g, b) for g in geometries for b in betas
                  if np.isposinf(float(ds.t_closed.sel(geometry=g, beta=b)))]
        for k, (g, b) in enumerate(beyond):  # the schemes past it at one beta stacked down from the top
            below = sum(1 for _, at in beyond[:k] if at == b)
            ax_time.plot(b, 0.96 - 0.07 * below, "^", color=colours[g], ms=6,
                         transform=ax_time.get_xaxis_transform(), clip_on=False)
        if beyond:
            ax_time.plot([], [], "^", color="0.3", ms=6, label="quadrature past 1.8e308")
        ax_time.set_xscale("log")
        ax_time.set_xticks(betas, [f"{b:g}" for b in betas])  # the grid's betas, not crowded minor labels
        ax_time.minorticks_off()
        ax_time.set_yscale("log")
        drawn = np.concatenate([ds.t_closed.values.ravel(), ds.t_median.values.ravel()])
        if not np.any(np.isfinite(drawn) & (drawn > 0)):  # a log axis with nothing on it cannot autoscale
            ax_time.set_ylim(1.0, 10.0)
            ax_time.text(0.5, 0.5, "no finite time: quadratures past range,\nparticle medians censored",
                         transform=ax_time.transAxes, ha="center", va="center", fontsize=8, color="0.3")
        ax_time.set_xlabel(r"inverse temperature $\beta$")
        ax_time.set_ylabel(r"clustering time (to $\bar\gamma$ = " + f"{ds.attrs['level']:g})")
        gap = ds.attrs.get("max_rel_gap", np.nan)
        gap_text = f"; largest gap {gap:.1e}" if np.isfinite(gap) else ""
        circles = ", circles: uniform" if "uniform" in ds.init.values else ""  # none drawn otherwise
        ax_time.set_title(wrap(f"(a) lines: quadrature; dots: equiangular{circles}{gap_text}",
                               0.48 * width, 8), loc="left")
        ax_time.legend(fontsize=7, loc="upper left")
        # (b) epsilon against time, log-log, at the smallest beta
        beta0 = betas.min()
        t = ds.time.values
        late = t > 0
        for g in geometries:
            eps = ds.epsilon.sel(geometry=g, init="equiangular", beta=beta0).values
            keep = late & (eps > EPSILON_FLOOR)
            ax_eps.loglog(t[keep], eps[keep], color=colours[g], lw=1.5, label=g)
        tt = t[late]
        if "pre_ln" in geometries:
            eps = ds.epsilon.sel(geometry="pre_ln", init="equiangular", beta=beta0).values[late]
            ok = np.flatnonzero(eps > EPSILON_FLOOR)
            if ok.size:
                k = ok[-1]
                ax_eps.loglog(tt, eps[k] * (tt / tt[k]) ** -2.0, "k--", lw=1, label=r"slope $-2$")
        if "sphere" in geometries:
            eps = ds.epsilon.sel(geometry="sphere", init="equiangular", beta=beta0).values[late]
            ok = np.flatnonzero((eps > 1e3 * EPSILON_FLOOR) & (tt > 1.0))
            if ok.size:
                k = ok[len(ok) // 2]
                curve = eps[k] * np.exp(-2.0 * ds.attrs["Lambda"] * (tt - tt[k]))
                shown = curve > EPSILON_FLOOR
                ax_eps.loglog(tt[shown], curve[shown], "k:", lw=1.2, label=r"$e^{-2\Lambda t}$")
        ax_eps.set_ylim(EPSILON_FLOOR, 2.0)
        ax_eps.set_xlim(1e-2, t[-1] * 1.5)
        ax_eps.set_xlabel(r"time $t$")
        ax_eps.set_ylabel(r"$\varepsilon = 1 - \gamma_{\min}$")
        ax_eps.set_title(wrap(f"(b) equiangular start, beta = {beta0:g}", 0.48 * width, 8), loc="left")
        ax_eps.legend(fontsize=7, loc="lower left")
        # (c) clusters at the depth from uniform starts
        init = "uniform" if "uniform" in ds.init.values else "equiangular"
        grid = ds.clusters_mean.sel(init=init).transpose("geometry", "beta").values
        top = max(2.0, float(np.nanmax(grid)) if np.isfinite(grid).any() else 2.0)
        mesh = ax_map.imshow(grid, aspect="auto", cmap="viridis", origin="lower", vmin=1, vmax=top)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if np.isfinite(grid[i, j]):
                    ax_map.text(j, i, f"{grid[i, j]:.2g}", ha="center", va="center", fontsize=7,
                                color="w" if grid[i, j] < 0.5 * (1 + np.nanmax(grid)) else "k")
        ax_map.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax_map.set_yticks(range(len(geometries)), geometries)
        ax_map.set_xlabel(r"inverse temperature $\beta$")
        fig.colorbar(mesh, ax=ax_map, label="clusters")
        ax_map.set_title(wrap(f"(c) clusters left at t = {ds.attrs['depth']:g}, {init} starts",
                              0.48 * width, 8), loc="left")
        # (d) the radii from the equiangular start
        for g in geometries:
            r = ds.radius_mean.sel(geometry=g, init="equiangular", beta=beta0).values
            ax_r.loglog(t[late], r[late], color=colours[g], lw=1.5)
        ax_r.set_xlim(1e-2, t[-1] * 1.5)
        ax_r.set_xlabel(r"time $t$")
        ax_r.set_ylabel(r"mean radius $r$")
        ax_r.set_title(wrap(f"(d) mean radius r, beta = {beta0:g}", 0.48 * width, 8),
                       loc="left")
        fixed = self.describe_fixed(spec, ("n", "d", "H", "lambda_bar", "spread", "gamma0"))
        fig.suptitle(wrap(f"Normalization schemes (result 12); {fixed}", 0.95 * width, 9))
        return fig


EXPERIMENT = Normalization()
