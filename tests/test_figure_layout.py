"""Figures drawn from small synthetic summaries in the layouts the default config does not show: their
labels do not run into each other, and their legends list only what is drawn."""

import json

import numpy as np
import xarray as xr

from attnflow.experiments import Spec, registry


def _summary(name: str, grid: dict, variables: dict) -> tuple[xr.Dataset, Spec]:
    """A summary of ``variables`` over ``grid``, the experiment's default fixed fields."""
    spec = Spec(name, registry().get(name).defaults["fixed"], grid, ())
    attrs = {"experiment": name, "experiment_spec": spec.to_json()}
    return xr.Dataset(variables, coords=grid, attrs=attrs), spec


def _boxes(fig, texts):
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]


def _collisions(fig, texts, others=()):
    """Pairs of ``texts`` whose boxes overlap each other, or one of ``others``."""
    fig.draw_without_rendering()
    boxes, other = _boxes(fig, texts), _boxes(fig, others)
    pairs = [(a, b) for i, (a, box) in enumerate(boxes) for b, box2 in boxes[i + 1:] if box.overlaps(box2)]
    return pairs + [(a, b) for a, box in boxes for b, box2 in other if box.overlaps(box2)]


def test_variants_row_labels_stay_apart_with_two_rows_per_panel():
    # Two head structures of two variants each: seaborn stood the row labels on end before the layout
    # shrank the panels, and "softmax" and "usa *" were drawn over each other.
    from attnflow.plotting import plt

    grid = {"heads": ["scalar", "random"], "attention": ["softmax", "usa"], "mask": ["none"],
            "beta": [0.5, 1.0]}
    dims = tuple(grid)
    shape = tuple(len(v) for v in grid.values())
    names = ("frac_total_monotone", "energy_residual", "frac_heads_monotone", "t_cluster_median",
             "distance_from_token0", "frac_censored")
    summary, spec = _summary("variants", grid, {v: (dims, np.full(shape, 0.5)) for v in names})
    fig = registry().get("variants").plot(summary, spec)
    panels = [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is None]
    labels = [t for ax in panels for t in ax.get_yticklabels()]
    assert [t.get_text() for t in labels if t.get_text()] == ["softmax", "usa *"] * 2
    assert _collisions(fig, labels, [ax.title for ax in panels] + [fig._suptitle]) == []
    plt.close(fig)


def test_entropy_axis_label_clears_the_title_with_one_panel():
    from attnflow.plotting import plt

    grid = {"n": [8], "beta": [1.0, 4.0]}
    time = np.linspace(0.0, 5.0, 11)
    entropy = np.log(8) - np.exp(-time)[:, None, None] * np.ones((1, 1, 2))
    summary, spec = _summary("entropy", grid, {"entropy": (("time", "n", "beta"), entropy),
                                               "thm27_residual": (("n", "beta"), np.full((1, 2), 1e-6))})
    summary = summary.assign_coords(time=time)
    fig = registry().get("entropy").plot(summary, spec)
    ax = fig.axes[0]
    assert _collisions(fig, [ax.yaxis.label], [ax.title, fig._suptitle]) == []
    plt.close(fig)


def test_metastability_legends_list_only_the_betas_drawn():
    # Every cell at beta = 4 failed (NaN): the staircase has no line for it, so no legend entry either;
    # no run is censored, so no entry for censored runs. The failed cells stay in the footnote.
    from attnflow.figures import failed_note
    from attnflow.plotting import plt

    exp = registry().get("metastability")
    grid = {"H": [1], "d": [2], "beta": [1.0, 2.0, 4.0]}
    time = np.array([0.0, 0.1, 1.0, 10.0, 100.0])
    staircase = np.array([[16, 8, 4, 2, 1], [16, 8, 2, 2, 1], [16, 4, 4, 1, 1]], dtype=float)  # one per seed
    counts = xr.DataArray(np.broadcast_to(staircase[:, :, None, None, None], (3, 5, 1, 1, 3)),
                          dims=("seed", "time", "H", "d", "beta"), coords={**grid, "time": time})
    summary = exp.reduce(xr.Dataset({"cluster_count": counts}, attrs={"cell_n": 16}))
    summary = summary.where(summary.beta != 4.0)  # the failed cells
    failed = [{"coords": {"H": 1, "d": 2, "beta": 4.0}, "error": "step budget of 2000 exhausted"}]
    spec = Spec("metastability", {**exp.defaults["fixed"], "t_max": 100.0}, grid, ())
    summary.attrs = {"experiment": "metastability", "experiment_spec": spec.to_json(),
                     "failed_cells": json.dumps(failed)}
    summary = exp.derive(summary, spec)
    fig = exp.plot(summary, spec)
    top, stairs, plateaus = fig.axes[:3]
    assert [t.get_text() for t in stairs.get_legend().get_texts()] == [r"$\beta$ = 1: median",
                                                                      r"$\beta$ = 2: median"]
    assert sorted(line.get_ydata()[0] for line in top.get_lines()) == [1.0, 2.0]  # the staircase's betas
    assert "censored" not in " ".join(t.get_text() for t in plateaus.get_legend().get_texts())
    assert "beta=4.0" in failed_note(summary)
    plt.close(fig)
