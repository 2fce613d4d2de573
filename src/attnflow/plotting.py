"""Low-level figure helpers the experiment modules draw with (axes, ticks, heatmap edges).

It sits below the experiments and imports none of them: drawing a whole
figure from a summary (``render``), which looks the experiment up, is
``attnflow.figures``, above them.

Importing it loads matplotlib (Agg backend) and seaborn and sets the figures'
theme, so the experiments import it inside their ``plot`` methods, never at
module top: every Snakemake job imports the experiment registry, and most
jobs draw nothing. ``plt`` and ``sns`` are re-exported for them.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before pyplot: jobs run without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

sns.set_theme(context="paper", style="whitegrid")


MAX_TICKS = 12  # labels per axis: a refined or dense axis keeps a readable subset of its values


def log_ticks(ax, axis: str, values) -> None:
    """Log axis with ticks at the grid values, written plainly; at most ``MAX_TICKS`` of them, evenly
    spread over the sorted values (the ends kept), so a 5000-value axis stays legible."""
    values = sorted({float(v) for v in values})
    if len(values) > MAX_TICKS:
        keep = np.unique(np.round(np.linspace(0, len(values) - 1, MAX_TICKS)).astype(int))
        values = [values[i] for i in keep]
    set_scale, set_ticks = (ax.set_xscale, ax.set_xticks) if axis == "x" else (ax.set_yscale, ax.set_yticks)
    set_scale("log")
    set_ticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()


def plain_log_axis(ax, axis: str, base: float = 10.0, subs=(1.0, 2.0, 5.0)) -> None:
    """A log axis whose ticks can be read: at ``subs`` x ``base``^k (1, 2, 5 per decade; ``base=2,
    subs=(1,)`` for counts), written plainly (2, not 2x10^0), no minor labels. Matplotlib's default
    labels only the powers of ten, which leaves a short range with one label or none."""
    from matplotlib.ticker import LogLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    target.set_major_locator(LogLocator(base=base, subs=subs))
    plain_labels(target)


def plain_labels(axis) -> None:
    """Major ticks of ``axis`` (an ``XAxis``/``YAxis``, a colour bar's included) written plainly (2, not
    2x10^0), minor ones unlabelled."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def drawn(artist) -> bool:
    """Whether a legend handle from ``plot`` or ``scatter`` shows anything: a line with a finite point, a
    scatter with a finite marker. A grid point whose cells all failed (NaN) still makes its line, which
    ``ax.legend()`` would list. Other artists (bands, error bars) count as drawn."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return bool(np.isfinite(artist.get_xydata()).all(axis=1).any())
    if isinstance(artist, PathCollection):
        return bool(np.isfinite(np.asarray(artist.get_offsets(), dtype=float)).all(axis=1).any())
    return True


def legend_of_drawn(ax, **kwargs) -> None:
    """``ax.legend(**kwargs)`` over the handles that show something (``drawn``); none: no legend."""
    handles = [h for h in ax.get_legend_handles_labels()[0] if drawn(h)]
    if handles:
        ax.legend(handles=handles, **kwargs)


def log_edges(values) -> np.ndarray:
    """Cell edges for a heatmap over log-spaced ``values``: geometric midpoints, extended at the ends."""
    v = np.log(np.asarray(values, dtype=float))
    if v.size == 1:
        return np.exp(np.array([v[0] - 0.5, v[0] + 0.5]))
    mid = 0.5 * (v[1:] + v[:-1])
    return np.exp(np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]]))


def mark_empty_log_axes(fig) -> None:
    """A log-scaled panel with no positive data (every cell behind it failed: NaN) cannot be drawn
    (matplotlib: "Data cannot be log-scaled"), which would cost the whole figure: such an axis goes
    linear and the panel says why. Colour bars keep their own scale. ``figures.render`` calls it; a
    plot that lays itself out (``tight_layout``) calls it first."""
    for ax in fig.axes:
        if getattr(ax, "_colorbar", None) is not None:
            continue
        empty = False
        for scale, minpos, linear in ((ax.get_xscale(), ax.dataLim.minposx, ax.set_xscale),
                                      (ax.get_yscale(), ax.dataLim.minposy, ax.set_yscale)):
            if scale == "log" and not np.isfinite(minpos):
                linear("linear")
                empty = True
        if empty:
            ax.text(0.5, 0.5, "no data: every cell behind this panel failed or is missing",
                    transform=ax.transAxes, ha="center", va="center", fontsize=7, color="0.3")


__all__ = ["MAX_TICKS", "drawn", "legend_of_drawn", "log_edges", "log_ticks", "mark_empty_log_axes",
           "plain_labels", "plain_log_axis", "plt", "sns"]
