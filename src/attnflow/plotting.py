"""Figure helpers shared by the experiments, and ``render``: summary -> PNG and PDF with provenance."""

from __future__ import annotations

import json
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
import xarray as xr  # noqa: E402

from .experiments import Spec, registry  # noqa: E402

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


def log_edges(values) -> np.ndarray:
    """Cell edges for a heatmap over log-spaced ``values``: geometric midpoints, extended at the ends."""
    v = np.log(np.asarray(values, dtype=float))
    if v.size == 1:
        return np.exp(np.array([v[0] - 0.5, v[0] + 0.5]))
    mid = 0.5 * (v[1:] + v[:-1])
    return np.exp(np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]]))


def spec_of(summary: xr.Dataset) -> Spec:
    """The experiment spec a summary was built from (its attrs), never the live config."""
    return Spec.from_json(summary.attrs["experiment"], summary.attrs["experiment_spec"])


def certificate_line(summary: xr.Dataset) -> str:
    """What a figure says of its accuracy: the worst certificate of the stores behind it."""
    worst = summary.attrs.get("certificate_error")
    unknown = int(summary.attrs.get("certificate_uncertified", 0))
    if worst is None:
        return "accuracy certificate: none (stores written before certificates)"
    text = (f"accuracy certificate: worst deviation {float(worst):.1e} of a recorded observable, relative "
            "to its scale, from a rerun of the first seeds at a 100x tighter tolerance")
    return text + (f"; {unknown} stores without one" if unknown else "")


def failed_note(summary: xr.Dataset) -> str:
    """``Failed cells (missing in the figure): ...`` for a summary with failed cells, else ``""``."""
    from .sweep import describe_failures

    failed = json.loads(summary.attrs.get("failed_cells") or "[]")
    return f"Failed cells (missing in the figure): {describe_failures(failed)}." if failed else ""


def render(summary: xr.Dataset, outputs, source: str = "", experiment_modules=()) -> None:
    """Draw the summary's experiment figure and save it to every path in ``outputs`` (PNG, PDF).

    The files carry their provenance in their metadata: experiment, summary
    store, config digest and package version. Cells that failed (missing, NaN)
    are listed under the figure.
    """
    name = summary.attrs["experiment"]
    experiment = registry(experiment_modules).get(name)
    fig = experiment.plot(summary, spec_of(summary))
    fig.text(0.995, -0.005, certificate_line(summary), ha="right", va="top", fontsize=6, color="0.3")
    note = failed_note(summary)
    if note:  # under everything the figure drew (legends below the axes included)
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        fig.text(box.x0 / fig.get_figwidth(), box.y0 / fig.get_figheight() - 0.01, textwrap.fill(note, 140),
                 fontsize=6, ha="left", va="top", color="0.3")
    provenance = (f"attnflow {summary.attrs.get('attnflow_version', '?')}; experiment {name}; "
                  f"summary {source}; config sha256 {summary.attrs.get('config_sha256', '?')}")
    for path in outputs:
        if str(path).endswith(".pdf"):
            meta = {"Title": f"attnflow {name}", "Subject": provenance, "Creator": "attnflow"}
        else:
            meta = {"Title": f"attnflow {name}", "Description": provenance, "Software": "attnflow"}
        fig.savefig(path, dpi=150, bbox_inches="tight", metadata=meta)
    plt.close(fig)
