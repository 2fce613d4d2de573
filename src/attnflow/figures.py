"""An experiment's figure from its summary: ``render`` draws it and saves PNG and PDF with provenance.

Called by the workflow's plot job (``workflow.plot_job``). It looks the
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
from .experiments import Spec, registry  # noqa: E402
from .numerics import CERTIFICATE_BOUND  # noqa: E402
from .sweep import seed_footer  # noqa: E402

DPI = 150  # of the PNG


def certificate_line(summary: xr.Dataset) -> str:
    """What a figure says of its accuracy: the worst certificate of the stores behind it."""
    worst = summary.attrs.get("certificate_error")
    unknown = int(summary.attrs.get("certificate_uncertified", 0))
    if worst is None:
        return "accuracy certificate: none (stores written before certificates)"
    text = (f"accuracy certificate: worst deviation {float(worst):.1e} of a recorded variable, relative "
            "to its scale, from a rerun of the first seeds at a 100x tighter tolerance")
    if not float(worst) <= CERTIFICATE_BOUND:  # NaN included
        text += f" (above {CERTIFICATE_BOUND:g}: uncertified; `attnflow status` names the cells)"
    return text + (f"; {unknown} stores without one" if unknown else "")


def failed_note(summary: xr.Dataset) -> str:
    """One short line on what failed, else ``""``: the seeds left out (``sweep.seed_footer``) and
    the cells missing; `attnflow status` names each with its remedy."""
    failed = json.loads(summary.attrs.get("failed_cells") or "[]")
    parts = [seed_footer(summary.attrs)] if summary.attrs.get("n_seeds_failed") else []
    if failed:
        parts.append(f"{len(failed)} cell{'s' if len(failed) > 1 else ''} failed (missing)")
    return f"Failed: {'; '.join(parts)}; `attnflow status` names them." if parts else ""


def _under_everything(fig, text: str, right: bool = False) -> None:
    """A footnote under everything the figure drew so far (legends below the axes included), at its
    left edge or, ``right``, its right edge."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    width, height = fig.get_figwidth(), fig.get_figheight()
    fig.text((box.x1 if right else box.x0) / width, box.y0 / height - 0.01, text, fontsize=6,
             ha="right" if right else "left", va="top", color="0.3")


def render(summary: xr.Dataset, outputs, source: str = "", experiment_modules=()) -> None:
    """Draw the summary's experiment figure and save it to every path in ``outputs`` (PNG, PDF).

    The files carry their provenance in their metadata: experiment, summary
    store, config digest and package version. Cells that failed (missing, NaN)
    are listed under the figure.
    """
    name = summary.attrs["experiment"]
    experiment = registry(experiment_modules).get(name)
    fig = experiment.plot(summary, Spec.of(summary))
    plotting.mark_empty_log_axes(fig)  # plots that lay themselves out call it first
    # Lay the figure out once, at the PNG's resolution, and keep that layout: the footnotes go under
    # what it placed (a layout engine run later would move the axes onto them) and both files show it.
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    _under_everything(fig, certificate_line(summary), right=True)
    note = failed_note(summary)
    if note:
        _under_everything(fig, note)
    provenance = (f"attnflow {summary.attrs.get('attnflow_version', '?')}; experiment {name}; "
                  f"summary {source}; config sha256 {summary.attrs.get('config_sha256', '?')}")
    box = _tight_box(fig)
    for path in outputs:
        if str(path).endswith(".pdf"):
            meta = {"Title": f"attnflow {name}", "Subject": provenance, "Creator": "attnflow"}
        else:
            meta = {"Title": f"attnflow {name}", "Description": provenance, "Software": "attnflow"}
        fig.savefig(path, dpi=DPI, bbox_inches=box, metadata=meta)
    plt.close(fig)


def _tight_box(fig):
    """The box ``savefig(bbox_inches="tight")`` crops the PNG to, computed once for both files: "tight"
    lays the figure out again for each file it writes (a third of a plot job's drawing time)."""
    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(plt.rcParams["savefig.pad_inches"])


__all__ = ["certificate_line", "failed_note", "render"]
