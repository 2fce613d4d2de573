"""Clustering probability over (t, beta): the fraction of runs clustered by time t."""

from __future__ import annotations

import numpy as np
import xarray as xr

from .. import theory
from ..tokens import typical_cosine
from . import Axis, Experiment
from ._common import wilson_interval

TIME_POINTS = 256
HALF_COLOUR = "cyan"  # the measured P = 1/2 contour: black vanished on magma's low end


class ClusteringProbability(Experiment):
    name = "clustering_probability"
    theorem = "Thm 22, 25"
    question = ("Over seeds, what fraction of softmax runs from uniform random tokens has clustered "
                "(epsilon <= eps) by time t, as a function of beta, and where does the equiangular "
                "ODE's time from gamma0 = 1/sqrt(d) to the same level put the boundary?")
    axes = (
        Axis("beta", min_values=2, why="a map over t and beta"),
        Axis("H"),
    )
    observables = ()
    defaults = {
        "fixed": {"attention": "softmax", "heads": "scalar", "lambda_dist": "equal", "lambda_bar": 1.0,
                  "init": "uniform", "n": 32, "d": 32, "seeds": 64, "t_max": 60.0, "n_samples": 2,
                  "cluster_metric": "epsilon", "cluster_threshold": 1e-2, "stop_at_cluster": True},
        "grid": {"H": [1, 4], "beta": [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]},
        "batch_over": ["beta"],
    }
    caption = ("Fraction of runs clustered (epsilon = 1 - min cosine <= threshold) by time t, over "
               "(t, beta), softmax with equal scalar heads from uniform random tokens, per number of "
               "heads (top). Cyan: measured P = 1/2; white dashed: the equiangular ODE's time from "
               "gamma0 = 1/sqrt(d) to the same level (closed form; an equiangular configuration with "
               "gamma0 > 0 needs d >= n, hence d = n by default: at d < n the curve is the scalar ODE's "
               "time only, the idealisation has no tokens, and the figure says so). Bottom: P(t) at each "
               "beta with its 95% Wilson band, the closed-form time dashed.")
    reading = ("Each run's clustering time is located on the integrator's dense output, so P(t) is "
               "exact between samples and the map is as fine in t as its 256 columns. Left of the "
               "dashed curve the equiangular idealisation has not clustered yet: random tokens cluster "
               "later than equiangular ones at the same typical cosine when beta is large (tokens "
               "first form several metastable clusters), and close to it when beta is small.")

    pinned = {
        "cluster_metric": ("epsilon", "clustered: every pair within 1 - cluster_threshold"),
        **{key: (value, "the closed-form boundary is the equiangular ODE of equal scalar softmax heads")
           for key, value in (("heads", "scalar"), ("lambda_dist", "equal"), ("attention", "softmax"))},
    }

    refine_axis = "beta"

    def refine_field(self, summary):
        return summary.probability.isel(t=-1, drop=True), 0.5  # clustered by t_max: P = 1/2

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        return xr.Dataset({"t_cluster": ds.t_cluster.where(~ds.censored, np.inf)})

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        out = summary
        t_max = float(spec.fixed["t_max"])
        finite = out.t_cluster.values[np.isfinite(out.t_cluster.values)]
        t_min = max(float(finite.min()) / 2 if finite.size else t_max / 1e3, t_max / 1e4)
        t = np.geomspace(t_min, t_max, TIME_POINTS)
        times = out.t_cluster
        trials = times.notnull().sum("seed")
        clustered = (times.expand_dims(t=t) <= xr.DataArray(t, dims="t", coords={"t": t})).sum("seed")
        out = out.assign_coords(t=("t", t, {"units": "time"}))
        out["probability"] = clustered / trials
        low, high = wilson_interval(clustered, trials)
        out["probability_low"] = (clustered.dims, np.asarray(low))
        out["probability_high"] = (clustered.dims, np.asarray(high))
        out["t_median"] = times.median("seed")
        n, d, lam, threshold = (int(spec.fixed["n"]), int(spec.fixed["d"]), float(spec.fixed["lambda_bar"]),
                                float(spec.fixed["cluster_threshold"]))
        gamma0 = typical_cosine(d)
        closed = [[float(theory.equiangular_time(gamma0, 1.0 - threshold, np.full(int(H), lam), b, n))
                   for b in out.beta.values] for H in out.H.values]
        out["t_closed"] = (("H", "beta"), np.array(closed))
        out.attrs.update({"gamma0": gamma0, "n": n, "d": d, "equiangular_exists": int(d >= n)})
        return out

    def export_table(self, summary):
        """Per (H, beta): the time by which half the runs have clustered, bracketed by where the 95%
        Wilson band crosses 1/2, against the equiangular ODE's closed-form time; the fraction clustered
        by t_max with its band."""
        from ..export import crossings, table

        t_half = crossings(summary.probability, "t", 0.5)[0]
        early = crossings(summary.probability_high, "t", 0.5)[0]  # the band's top reaches 1/2 first
        late = crossings(summary.probability_low, "t", 0.5)[0]
        last = summary.isel(t=-1, drop=True)
        columns = {
            "t_half": (t_half, "measured time by which half the runs have clustered (geometric midpoint of "
                               "the bracket on the summary's time grid; NaN: not reached by t_max)"),
            "t_half_low": (early, "where the 95% Wilson band's upper edge crosses 1/2"),
            "t_half_high": (late, "where the band's lower edge crosses 1/2 (NaN: not by t_max)"),
            "t_median": (summary.t_median, "median clustering time over seeds"),
            "t_closed": (summary.t_closed, "closed form: the equiangular ODE's time from gamma0 = 1/sqrt(d)"),
            "p_clustered": (last.probability, "fraction of runs clustered by t_max"),
            "p_clustered_low": (last.probability_low, "95% Wilson interval, lower end"),
            "p_clustered_high": (last.probability_high, "95% Wilson interval, upper end"),
            "seeds": (summary.t_cluster.notnull().sum("seed"), "runs"),
        }
        return table(summary, ["H", "beta"], columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.lines import Line2D

        from ..plotting import MIN_TEXT, figure_size, log_edges, log_ticks, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        Hs = ds.H.values
        fig, axes = plt.subplots(2, len(Hs), figsize=figure_size(1.0), squeeze=False)
        t = ds.t.values
        b_vals = ds.beta.values.astype(float)
        t_edges, b_edges = log_edges(t), log_edges(b_vals)
        colours = sns.color_palette("viridis", n_colors=b_vals.size)
        t_max = float(spec.fixed["t_max"])
        mesh = None
        for j, H in enumerate(Hs):
            sub = ds.sel(H=H)
            runs = int(sub.t_cluster.notnull().sum())
            # No run clustered by t_max: P = 0 throughout, which the panels say rather than draw as data.
            censored = runs > 0 and not np.isfinite(sub.t_cluster.values).any()
            ax = axes[0, j]
            prob = sub.probability.transpose("beta", "t").values
            mesh = ax.pcolormesh(t_edges, b_edges, prob, cmap="magma", vmin=0, vmax=1, shading="flat")
            tg, bg = np.meshgrid(t, b_vals)
            if np.nanmin(prob) < 0.5 < np.nanmax(prob):
                ax.contour(tg, bg, prob, levels=[0.5], colors=HALF_COLOUR, linewidths=1.6)
            ax.plot(sub.t_closed.values, b_vals, "w--", lw=1.6, marker="o", ms=3)
            ax.set_xlim(t_edges[0], t_edges[-1])
            _time_axis(ax)
            if censored:
                ax.text(0.5, 0.5, f"every run censored:\nnone of the {runs} runs clustered by t_max = "
                        f"{t_max:g}", transform=ax.transAxes, ha="center", va="center", fontsize=8,
                        bbox={"facecolor": "w", "edgecolor": "0.5"})
            ax.set_ylim(b_edges[0], b_edges[-1])
            log_ticks(ax, "y", b_vals)
            ax.set_xlabel("time $t$")
            ax.set_ylabel(r"inverse temperature $\beta$")
            ax.set_title(wrap(f"H = {H}: P(clustered by t), {len(ds.seed)} seeds per beta",
                              0.8 * fig.get_figwidth() / len(Hs), 8), fontsize=8)
            ax = axes[1, j]
            if censored:  # one line for every beta, which would all lie on it
                ax.plot(t, np.zeros_like(t), color="0.3",
                        label=f"every beta that ran: P = 0 up to t_max = {t_max:g}")
            for b, colour in zip(b_vals, colours, strict=True):
                row = sub.sel(beta=b)
                if censored and not row.t_cluster.notnull().any():
                    continue  # its cells failed: no runs, no P, and nothing to show for it here
                if censored:  # the closed-form times carry the betas' colours instead
                    ax.axvline(float(row.t_closed), color=colour, ls="--", lw=0.9,
                               label=rf"$\beta$ = {b:g}: closed form")
                    continue
                ax.plot(t, row.probability, color=colour, label=rf"$\beta$ = {b:g}")
                # Only where 0 < P < 1: at 0 and 1 the eight betas' bands stacked into bars that read as data.
                inside = ((row.probability > 0) & (row.probability < 1)).values
                ax.fill_between(t, row.probability_low, row.probability_high, where=inside, color=colour,
                                alpha=0.2, lw=0)
                ax.axvline(float(row.t_closed), color=colour, ls="--", lw=0.9)
            _time_axis(ax)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("time $t$")
            ax.set_ylabel("fraction of runs clustered\n(95% Wilson band where 0 < P < 1)")
            # All censored: the legend sits clear of the closed-form times, at the centre left.
            ax.legend(fontsize=MIN_TEXT, ncol=2, loc="center left" if censored else "best")
        cax = fig.add_axes([0.9, 0.55, 0.013, 0.33])
        fig.colorbar(mesh, cax=cax, label="fraction clustered")
        exists = ds.attrs["d"] >= ds.attrs["n"]
        what = "" if exists else f" (scalar ODE only: no equiangular tokens at d = {ds.attrs['d']} < n)"
        handles = [Line2D([], [], color=HALF_COLOUR, lw=1.6, label="measured P = 1/2"),
                   Line2D([], [], color="w", ls="--", marker="o", ms=3,
                          label=wrap(f"equiangular ODE from gamma0 = 1/sqrt(d) = "
                                     f"{ds.attrs['gamma0']:.3f}{what}", 0.4 * fig.get_figwidth()))]
        # Under the figure, on a dark frame so the handles show the colours drawn on the map: inside
        # the map it hid the ODE's points.
        fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=2, bbox_to_anchor=(0.45, -0.04),
                   facecolor="0.15", edgecolor="0.5", labelcolor="w", framealpha=1)
        fixed = self.describe_fixed(spec, ("attention", "heads", "lambda_bar", "n", "d", "init",
                                           "cluster_threshold"))
        fig.suptitle(wrap("Clustering probability over (t, beta): epsilon <= "
                          f"{spec.fixed['cluster_threshold']:g}; {fixed}", 0.95 * fig.get_figwidth(), 9),
                     fontsize=9)
        fig.subplots_adjust(hspace=0.3, right=0.87, wspace=0.22)
        return fig


def _time_axis(ax) -> None:
    """Log time axis, its limits set: labels at 1, 2, 5 per decade over a short range, at the powers of
    ten alone over a long one, where 1, 2, 5 overlapped (an all-censored panel spans three decades or
    more, and its closed-form times widen the bottom one)."""
    from ..plotting import plain_log_axis

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    plain_log_axis(ax, "x", subs=(1.0, 2.0, 5.0) if np.log10(high / low) <= 2.5 else (1.0,))


EXPERIMENT = ClusteringProbability()
