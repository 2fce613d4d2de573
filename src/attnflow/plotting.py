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

import contextlib
import textwrap

import matplotlib

matplotlib.use("Agg")  # before pyplot: jobs run without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

# Sizes for print: a figure is drawn at the width it is printed at (``figure_width``: 7 in for a
# journal's text width, 3.5 in for a column), and no text in it is smaller than MIN_TEXT (7 pt, the
# usual journal floor). Titles and labels at TEXT, ticks, legends and annotations at MIN_TEXT.
TEXT_WIDTH = 7.0  # inches
COLUMN_WIDTH = 3.5
MIN_TEXT = 7.0  # points
TEXT = 8.0
sns.set_theme(context="paper", style="whitegrid", rc={
    "font.size": TEXT, "axes.titlesize": TEXT, "axes.labelsize": TEXT, "figure.titlesize": TEXT + 1,
    "xtick.labelsize": MIN_TEXT, "ytick.labelsize": MIN_TEXT, "legend.fontsize": MIN_TEXT,
    "legend.title_fontsize": MIN_TEXT, "figure.labelsize": TEXT})

_width = [TEXT_WIDTH]  # the width figures are drawn at now (``drawing_width``)


def figure_width() -> float:
    """The width, in inches, of the figure being drawn (``figures.render`` sets it from the config's
    ``figure_width``): experiments size their figures from it and lay their panels out for it."""
    return _width[-1]


@contextlib.contextmanager
def drawing_width(inches: float):
    """Figures drawn inside are ``inches`` wide (``figure_width``)."""
    _width.append(float(inches))
    try:
        yield
    finally:
        _width.pop()


def figure_size(height_per_width: float, height_max: float = 9.0) -> tuple[float, float]:
    """(width, height) at the drawing width: ``height_per_width`` of it tall, at most ``height_max``
    inches (a printed page's text block is about 9 in tall)."""
    width = figure_width()
    return width, min(width * height_per_width, height_max)


def wrap(text: str, inches: float, size: float = MIN_TEXT) -> str:
    """``text`` broken into lines that fit ``inches`` at ``size`` points (an average character of the
    theme's sans-serif is about 0.55 em wide; its existing line breaks kept, never inside ``$...$``)."""
    chars = max(int(inches * 72 / (0.55 * size)), 12)
    glue = "\x00"  # a space inside mathtext, which must not become a line break
    parts = text.split("$")
    joined = "$".join(p.replace(" ", glue) if k % 2 else p for k, p in enumerate(parts))
    lines = [textwrap.fill(line, chars, break_long_words=False, break_on_hyphens=False) if line else ""
             for line in joined.split("\n")]
    return "\n".join(lines).replace(glue, " ")


def columns_for(panels: int, min_inches: float = 1.6) -> int:
    """How many of ``panels`` side by side the drawing width holds, each at least ``min_inches`` wide
    (the rest go on further rows)."""
    return max(1, min(panels, int(figure_width() // min_inches)))


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


def plain_log_axis(ax, axis: str, base: float = 10.0, subs=None) -> None:
    """A log axis whose ticks can be read: at ``subs`` x ``base``^k, written plainly (2, not 2x10^0), no
    minor labels; ``base=2, subs=(1,)`` for counts. Without ``subs``, the sparsest of 1-2-5, 1-2-3-5 and
    1-9 per decade that puts at least three labels on the axis's range (call it once the data is drawn):
    matplotlib's default labels only the powers of ten, and 1-2-5 alone labels a range from 0.8 to 3
    with "1" and "2" only."""
    from matplotlib.ticker import LogLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    if subs is not None:
        choices = (subs,)
    else:
        choices = ((1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), tuple(float(k) for k in range(1, 10)))
    # The data's own range (not the view's: an axis with no positive data, every cell behind it
    # failed, has none, and mark_empty_log_axes turns it linear later).
    positive = ax.dataLim.minposx if axis == "x" else ax.dataLim.minposy
    high = ax.dataLim.x1 if axis == "x" else ax.dataLim.y1
    for choice in choices:
        locator = LogLocator(base=base, subs=choice)
        if not (np.isfinite(positive) and np.isfinite(high) and high >= positive):
            break
        ticks = [t for t in locator.tick_values(positive, high) if positive <= t <= high]
        if len(ticks) >= 3:
            break
    target.set_major_locator(locator)
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
                    transform=ax.transAxes, ha="center", va="center", fontsize=MIN_TEXT, color="0.3",
                    wrap=True)


__all__ = ["COLUMN_WIDTH", "MAX_TICKS", "MIN_TEXT", "TEXT", "TEXT_WIDTH", "columns_for", "drawing_width",
           "drawn", "figure_size", "figure_width", "legend_of_drawn", "log_edges", "log_ticks",
           "mark_empty_log_axes", "plain_labels", "plain_log_axis", "plt", "sns", "wrap"]
