"""Figures drawn from small synthetic summaries in the layouts the default config does not show: their
labels do not run into each other."""

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
