"""An experiment's figure from its summary: ``render`` draws it and saves PNG and PDF with provenance.

Called by the workflow's plot job (``run.jobs.plot_job``). It looks the
experiment up in the registry, so it sits above the experiments; the helpers
they draw with are ``attnflow.plotting``, below them.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")  # before pyplot: jobs run without a display
import matplotlib.pyplot as plt  # noqa: E402
import xarray as xr  # noqa: E402

from . import plotting  # noqa: E402  (the figures' theme, set on import)
from .experiments import registry  # noqa: E402
from .names import seed_footer  # noqa: E402
from .numerics import CERTIFICATE_BOUND  # noqa: E402
from .spec import Spec  # noqa: E402

DPI = 150  # of the PNG


def certificate_line(summary: xr.Dataset) -> str:
    """What a figure says of its accuracy: the worst certificate of the stores behind it."""
    worst = summary.attrs.get("certificate_error")
    unknown = int(summary.attrs.get("certificate_uncertified", 0))
    if worst is None:
        return "accuracy certificate: none (stores written before certificates)"
    seeds = "every seed" if not unknown else "every certified seed"
    text = (f"accuracy certificate: error of a recorded variable at most {float(worst):.1e} of its scale, "
            f"{seeds} (each rerun at another tolerance)")
    if not float(worst) <= CERTIFICATE_BOUND:  # NaN included
        text += f" (above {CERTIFICATE_BOUND:g}: uncertified; `attnflow status` names the cells)"
    # A cell stores NaN where a seed of it has no certificate (stability-limited steps, a failed companion,
    # stores written before certificates): counted, never folded into the worst number.
    return text + (f"; {unknown} cell{'s' if unknown > 1 else ''} with a seed no companion run could bound "
                   "(`attnflow status` says why)" if unknown else "")


def failed_note(summary: xr.Dataset) -> str:
    """One short line on what failed, else ``""``: the seeds left out (``names.seed_footer``) and
    the cells missing; `attnflow status` names each with its remedy."""
    failed = json.loads(summary.attrs.get("failed_cells") or "[]")
    parts = [seed_footer(summary.attrs)] if summary.attrs.get("n_seeds_failed") else []
    if failed:
        parts.append(f"{len(failed)} cell{'s' if len(failed) > 1 else ''} failed (missing)")
    return f"Failed: {'; '.join(parts)}; `attnflow status` names them." if parts else ""


def _under_everything(fig, text: str, right: bool = False) -> None:
    """A footnote under everything the figure drew so far (legends below the axes included), at its
    left edge or, ``right``, its right edge, in lines that fit the figure's width."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    width, height = fig.get_figwidth(), fig.get_figheight()
    left, right_edge = max(box.x0, 0.0), min(box.x1, width)
    fig.text((right_edge if right else left) / width, box.y0 / height - 0.01,
             plotting.wrap(text, 0.97 * (right_edge - left), plotting.MIN_TEXT), fontsize=plotting.MIN_TEXT,
             ha="right" if right else "left", va="top", color="0.3", multialignment="left")


def drawn_width(experiment, width: float) -> float:
    """The width a figure is drawn at: ``width`` (the config's ``figure_width``), or a journal's text
    width where that is wider and the experiment has no ``column_layout``."""
    return float(width) if experiment.column_layout else max(float(width), plotting.TEXT_WIDTH)


def compose(summary: xr.Dataset, experiment_modules=(), width: float = plotting.TEXT_WIDTH, part: str = ""):
    """The summary's experiment figure ``part`` (one of ``Experiment.figures``), drawn ``width`` inches
    wide (``drawn_width``), laid out, with its footnotes: what ``render`` saves (a matplotlib Figure;
    close it)."""
    name = summary.attrs["experiment"]
    experiment = registry(experiment_modules).get(name)
    with plotting.drawing_width(drawn_width(experiment, width)):
        fig = experiment.draw(summary, Spec.of(summary), part)
    plotting.mark_empty_log_axes(fig)  # plots that lay themselves out call it first
    # Lay the figure out once, at the PNG's resolution, and keep that layout: the footnotes go under
    # what it placed (a layout engine run later would move the axes onto them) and both files show it.
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    _pin_figure_legends(fig)
    _under_everything(fig, certificate_line(summary), right=True)
    note = failed_note(summary)
    if note:
        _under_everything(fig, note)
    return fig


def render(summary: xr.Dataset, outputs, source: str = "", experiment_modules=(),
           width: float = plotting.TEXT_WIDTH, part: str = "") -> None:
    """Draw the summary's experiment figure ``part`` (one of ``Experiment.figures``) ``width`` inches
    wide (``compose``) and save it to every path in ``outputs`` (PNG, PDF).

    The files carry their provenance in their metadata: experiment, summary
    store, config digest and package version. Cells that failed (missing, NaN)
    are listed under the figure. Nothing is saved beyond ``drawn_width``: the
    experiments lay their figures out for it.
    """
    name = summary.attrs["experiment"]
    fig = compose(summary, experiment_modules, width, part)
    figure = f"{name}-{part}" if part else name
    provenance = (f"attnflow {summary.attrs.get('attnflow_version', '?')}; experiment {name}; "
                  f"summary {source}; config sha256 {summary.attrs.get('config_sha256', '?')}")
    box = _tight_box(fig)
    for path in outputs:
        if str(path).endswith(".pdf"):
            meta = {"Title": f"attnflow {figure}", "Subject": provenance, "Creator": "attnflow"}
        else:
            meta = {"Title": f"attnflow {figure}", "Description": provenance, "Software": "attnflow"}
        fig.savefig(path, dpi=DPI, bbox_inches=box, metadata=meta)
    plt.close(fig)


def _pin_figure_legends(fig) -> None:
    """Keep each figure legend where the layout put it. One placed by ``loc`` alone ("outside lower
    center") is anchored to the figure's box, which ``savefig`` replaces by the crop box: the legend
    would move down onto the footnotes placed under it."""
    renderer = fig.canvas.get_renderer()
    for legend in fig.legends:
        box = legend.get_window_extent(renderer).transformed(fig.transFigure.inverted())
        legend.set_bbox_to_anchor(box, transform=fig.transFigure)
        legend.set_loc("center")


def _tight_box(fig):
    """The box ``savefig(bbox_inches="tight")`` crops the PNG to, computed once for both files: "tight"
    lays the figure out again for each file it writes (a third of a plot job's drawing time). Never
    wider than the figure: what an experiment drew beyond it (``tests/test_figure_layout.py`` says
    none does) would make the file wider than the page it was drawn for."""
    from matplotlib.transforms import Bbox

    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(plt.rcParams["savefig.pad_inches"])
    return Bbox([[max(box.x0, 0.0), box.y0], [min(box.x1, fig.get_figwidth()), box.y1]])


__all__ = ["DPI", "certificate_line", "compose", "failed_note", "render"]
