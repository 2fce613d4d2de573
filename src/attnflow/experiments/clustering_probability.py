"""Clustering probability over (t, beta): the fraction of runs clustered by time t."""

from __future__ import annotations

import itertools

import numpy as np
import xarray as xr

from .. import theory
from . import Axis, Experiment, Spec
from ._common import wilson_interval

TIME_POINTS = 256
COLUMNS = ("H", "spread", "d")  # the figure's columns: every combination of their values
HALF_COLOUR = "cyan"  # the measured P = 1/2 contour: black vanished on magma's low end


class ClusteringProbability(Experiment):
    name = "clustering_probability"
    theorem = "Thm 22, 25"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("Over seeds, what fraction of softmax runs from uniform random tokens has clustered "
                "(epsilon <= eps) by time t, as a function of beta, and how far does the equiangular ODE's "
                "time to the same level, from the mean cosine the starts actually have, carry: with equal "
                "heads, and with unequal heads of the same total strength (Thm 22's super-additivity)?")
    axes = (
        Axis("beta", min_values=2, why="a map over t and beta"),
        Axis("spread", why="one column per head-strength spread (0: equal heads)"),
        Axis("H"),
        Axis("d"),
    )
    observables = ()
    defaults = {
        # H = 2 with spread 0 (equal) and 0.8 (strengths 0.2, 1.8): unequal heads are not a time
        # rescaling of equal ones (H equal heads are one head at H times the speed), and the closed
        # form says they are slower at beta 3-6 and faster at 8.
        "fixed": {"rtol": 1e-08, "atol": 1e-11,
                  "attention": "softmax", "heads": "scalar", "lambda_dist": "linear", "lambda_bar": 1.0,
                  "H": 2, "init": "uniform", "n": 32, "d": 32, "seeds": 64, "t_max": 60.0, "n_samples": 2,
                  "cluster_metric": "epsilon", "cluster_threshold": 1e-2, "stop_at_cluster": True},
        "grid": {"spread": [0.0, 0.8], "beta": [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]},
        "batch_over": ["beta", "spread"],
    }
    caption = ("Fraction of runs clustered (epsilon = 1 - min cosine <= threshold) by time t, over "
               "(t, beta), softmax with scalar heads from uniform random tokens, one column per head "
               "strengths (linear spread s: lambda_h = lambda_bar (1 + s (2h/(H-1) - 1)); s = 0 equal "
               "heads). Cyan: measured P = 1/2; white dashed: the equiangular ODE's time to the same "
               "level from gamma0 = the mean cosine of the runs' starts (about 0 for uniform tokens), "
               "with the column's strengths. Bottom: P(t) at each beta with its 95% Wilson band, the "
               "closed-form time dashed; the legend gives the measured median time over the closed "
               "form. The closed form holds where that ratio is near 1: while the tokens collapse as "
               "one cluster (small beta). Where it is well above 1 (large beta) random tokens first "
               "form several metastable clusters, which the equiangular idealisation has not.")
    reading = ("Each run's clustering time is located on the integrator's dense output, so P(t) is "
               "exact between samples and the map is as fine in t as its 256 columns. The closed form "
               "starts from the mean pairwise cosine the runs' starts actually have (measured per column; "
               "0 in expectation for uniform tokens), not from the typical |cosine| 1/sqrt(d): the mean "
               "cosine is what the equiangular ODE evolves. It is the time of the idealisation in which "
               "every pair has that cosine; random tokens have cosines spread about it, and at large beta "
               "they first form several clusters that merge late (metastability), so the measured times "
               "exceed it there: read the legend's ratio per beta. A ratio a little above 1 at every beta "
               "is expected: the criterion waits for the last pair (the minimum cosine), which trails the "
               "mean. The columns differ in how the total "
               "strength is split between the heads: by Thm 22 unequal strengths change the early drive "
               "sum_h phi(lambda_h) (slower or faster than equal heads depending on the convexity of phi at "
               "lambda_bar beta), which a rescaling of time cannot do; H equal heads would only be one head "
               "at H times the speed.")

    pinned = {
        "cluster_metric": ("epsilon", "clustered: every pair within 1 - cluster_threshold"),
        "lambda_dist": ("linear", "the closed form needs each head's strength, which a linear spread fixes "
                                  "for every seed (spread 0: equal heads)"),
        **{key: (value, "the closed-form boundary is the equiangular ODE of scalar softmax heads")
           for key, value in (("heads", "scalar"), ("attention", "softmax"))},
    }

    refine_axis = "beta"
    # 2: the closed form from the starts' measured mean cosine, per column of (H, spread, d); the time
    # dimension is ``time``; the median over the closed form per beta.
    reduction_version = 2

    def refine_field(self, summary):
        return summary.probability.isel(time=-1, drop=True), 0.5  # clustered by t_max: P = 1/2

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        return xr.Dataset({"t_cluster": ds.t_cluster.where(~ds.censored, np.inf),
                           "gamma_start": ds.gamma_mean.isel(time=0, drop=True)})

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        from ..cell import Cell
        from ..strengths import head_strengths

        out = summary
        t_max = float(spec.fixed["t_max"])
        finite = out.t_cluster.values[np.isfinite(out.t_cluster.values)]
        t_min = max(float(finite.min()) / 2 if finite.size else t_max / 1e3, t_max / 1e4)
        t = np.geomspace(t_min, t_max, TIME_POINTS)
        times = out.t_cluster
        trials = times.notnull().sum("seed")
        grid = xr.DataArray(t, dims="time", coords={"time": t})
        clustered = (times.expand_dims(time=t) <= grid).sum("seed")
        out = out.assign_coords(time=("time", t))
        out["probability"] = clustered / trials
        low, high = wilson_interval(clustered, trials)
        out["probability_low"] = (clustered.dims, np.asarray(low))
        out["probability_high"] = (clustered.dims, np.asarray(high))
        out["t_median"] = times.median("seed")
        # The equiangular ODE evolves the mean cosine: start it where the runs' starts have theirs.
        out["gamma0"] = out.gamma_start.mean([d for d in out.gamma_start.dims if d not in COLUMNS])
        n, lam, threshold = (int(spec.fixed["n"]), float(spec.fixed["lambda_bar"]),
                             float(spec.fixed["cluster_threshold"]))
        closed = xr.full_like(out.t_median, np.nan)
        for point in _columns(out):
            column = Cell(H=int(point["H"]), lambda_dist="linear", spread=float(point["spread"]),
                          lambda_bar=lam)
            strengths = head_strengths(column, 0)
            gamma0 = float(out.gamma0.sel(point))
            if np.isfinite(gamma0):
                closed.loc[point] = theory.equiangular_time(gamma0, 1.0 - threshold, strengths,
                                                            closed.beta.values.astype(float), n)
        out["t_closed"] = closed
        out["median_over_closed"] = out.t_median / out.t_closed
        out.attrs.update({"n": n})
        return out

    def export_table(self, summary):
        """Per (H, spread, d, beta): the time by which half the runs have clustered, bracketed by where the
        95% Wilson band crosses 1/2, against the equiangular ODE's closed-form time from the starts' mean
        cosine; the fraction clustered by t_max with its band."""
        from ..tables import crossings, table, time_units

        ds = self.with_axes(summary, Spec.of(summary))
        lines = [a for a in (*COLUMNS, "beta") if a in ds.dims]
        t_half = crossings(ds.probability, "time", 0.5)[0]
        early = crossings(ds.probability_high, "time", 0.5)[0]  # the band's top reaches 1/2 first
        late = crossings(ds.probability_low, "time", 0.5)[0]
        # A band edge still below 1/2 at t_max censors that end: the time is beyond the grid.
        t_max = float(ds.time.max())
        early = early.where(early.notnull() | (ds.probability_high.max("time") >= 0.5), t_max)
        late = late.where(late.notnull() | (ds.probability_low.max("time") >= 0.5), np.inf)
        last = ds.isel(time=-1, drop=True)
        unit = time_units(ds, "time")
        columns = {
            "t_half": (t_half, "measured time by which half the runs have clustered (geometric midpoint of "
                               "the bracket on the summary's time grid; NaN: not reached by t_max)", unit),
            "t_half_low": (early, "where the 95% Wilson band's upper edge crosses 1/2 (t_max: not by then)",
                           unit),
            "t_half_high": (late, "where the band's lower edge crosses 1/2 (inf: not by t_max)", unit),
            "t_median": (ds.t_median, "median clustering time over seeds", unit),
            "t_closed": (ds.t_closed, "closed form: the equiangular ODE's time from gamma0, with the "
                                      "column's head strengths", unit),
            "median_over_closed": (ds.median_over_closed,
                                   "t_median / t_closed (near 1: the closed form holds)", "1"),
            "gamma0": (ds.gamma0, "the closed form's start: the mean pairwise cosine of the runs' starts",
                       "1"),
            "p_clustered": (last.probability, "fraction of runs clustered by t_max"),
            "p_clustered_low": (last.probability_low, "95% Wilson interval, lower end"),
            "p_clustered_high": (last.probability_high, "95% Wilson interval, upper end"),
            "seeds": (ds.t_cluster.notnull().sum("seed"), "runs (seeds) the fractions and times are over",
                      "1"),
        }
        return table(ds, lines, columns)

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from matplotlib.lines import Line2D

        from ..plotting import figure_width, log_edges, log_ticks, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        columns = list(_columns(ds))
        fig, axes = plt.subplots(2, len(columns), figsize=(figure_width(), 8.2), squeeze=False)
        t = ds.time.values
        b_vals = ds.beta.values.astype(float)
        t_edges, b_edges = log_edges(t), log_edges(b_vals)
        colours = sns.color_palette("viridis", n_colors=b_vals.size)
        t_max = float(spec.fixed["t_max"])
        mesh = None
        for j, point in enumerate(columns):
            sub = ds.sel(point)
            name = _column_name(point, ds)
            runs = int(sub.t_cluster.notnull().sum())
            # No run clustered by t_max: P = 0 throughout, which the panels say rather than draw as data.
            censored = runs > 0 and not np.isfinite(sub.t_cluster.values).any()
            ax = axes[0, j]
            prob = sub.probability.transpose("beta", "time").values
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
            ax.set_title(f"{name}\nP(clustered by t), {len(ds.seed)} seeds per beta; "
                         rf"$\gamma_0$ = {float(sub.gamma0):.3f}", fontsize=8)
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
                ratio = float(row.median_over_closed)
                ratio_text = f"{ratio:.2f}" if np.isfinite(ratio) else "median > t_max"
                ax.plot(t, row.probability, color=colour, label=rf"$\beta$ = {b:g}: {ratio_text}")
                # Only where 0 < P < 1: at 0 and 1 the eight betas' bands stacked into bars that read as data.
                inside = ((row.probability > 0) & (row.probability < 1)).values
                ax.fill_between(t, row.probability_low, row.probability_high, where=inside, color=colour,
                                alpha=0.2, lw=0)
                ax.axvline(float(row.t_closed), color=colour, ls="--", lw=0.9)
            _time_axis(ax)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("time $t$")
            ax.set_ylabel("fraction of runs clustered\n(95% Wilson band where 0 < P < 1)")
            # Under the panel: inside, it hid the curves of the betas it names.
            ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2), handlelength=1.2,
                      columnspacing=0.8, title=None if censored else "median time / closed form",
                      title_fontsize=7)
        cax = fig.add_axes([0.9, 0.55, 0.013, 0.33])
        fig.colorbar(mesh, cax=cax, label="fraction clustered")
        handles = [Line2D([], [], color=HALF_COLOUR, lw=1.6, label="measured P = 1/2"),
                   Line2D([], [], color="w", ls="--", marker="o", ms=3,
                          label=r"equiangular ODE from $\gamma_0$ = the starts' mean cosine")]
        # Under the figure, on a dark frame so the handles show the colours drawn on the map: inside
        # the map it hid the ODE's points.
        fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=2, bbox_to_anchor=(0.45, -0.02),
                   facecolor="0.15", edgecolor="0.5", labelcolor="w", framealpha=1)
        fixed = self.describe_fixed(spec, ("attention", "heads", "lambda_bar", "n", "d", "init"))
        fig.suptitle(wrap(f"Clustering probability over (t, beta): epsilon <= "
                          f"{spec.fixed['cluster_threshold']:g}\n{fixed}", figure_width() - 0.2, 9),
                     fontsize=9)
        fig.subplots_adjust(hspace=0.35, right=0.87, wspace=0.45, bottom=0.2)
        return fig


def _columns(ds):
    """The figure's columns: every combination of the values of ``COLUMNS`` (as ``sel`` points)."""
    axes = [a for a in COLUMNS if a in ds.dims]
    for combination in itertools.product(*(ds[a].values.tolist() for a in axes)):
        yield dict(zip(axes, combination, strict=True))


def _column_name(point: dict, ds) -> str:
    """A column's title: its values along the axes that vary (H and the strengths always)."""
    parts = [f"H = {point['H']}", "equal heads" if point["spread"] == 0 else f"spread {point['spread']:g}"]
    if ds.sizes.get("d", 1) > 1:
        parts.append(f"d = {point['d']}")
    return ", ".join(parts)


def _time_axis(ax) -> None:
    """Log time axis, its limits set: labels at 1, 2, 5 per decade over a short range, at the powers of
    ten alone over a long one, where 1, 2, 5 overlapped (an all-censored panel spans three decades or
    more, and its closed-form times widen the bottom one)."""
    from ..plotting import plain_log_axis

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    plain_log_axis(ax, "x", subs=(1.0, 2.0, 5.0) if np.log10(high / low) <= 2.5 else (1.0,))


EXPERIMENT = ClusteringProbability()
