"""The clustering-probability figure: drawn from a summary built by hand, no simulation."""

import numpy as np
import pytest
import xarray as xr

from attnflow.experiments.clustering_probability import EXPERIMENT


@pytest.mark.parametrize("clustered_at", [None, 1e-4], ids=["all-censored", "H=4-clusters-early"])
def test_a_censored_panel_says_so_and_its_time_axis_stays_readable(clustered_at):
    from attnflow.plotting import plt

    grid = {"H": [1, 4], "beta": [1.0, 2.0, 4.0]}
    spec = EXPERIMENT.spec({"fixed": {"t_max": 0.5, "seeds": 8}, "grid": grid})
    t = np.full((2, 3, 8), np.inf)  # H, beta, seed: no run of H = 1 clusters by t_max
    if clustered_at:  # the time grid then starts at clustered_at / 2: four decades, derive's widest
        t[1] = clustered_at * np.arange(1, 9)
    coords = {**grid, "seed": np.arange(8)}
    summary = EXPERIMENT.derive(xr.Dataset({"t_cluster": (("H", "beta", "seed"), t)}, coords=coords), spec)
    fig = EXPERIMENT.plot(summary, spec)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:4]:
        low, high = ax.get_xlim()
        boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels()
                 if label.get_text() and low <= label.get_position()[0] <= high]
        assert len(boxes) >= 3
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), "tick labels overlap"
    (top1, top4), (bottom1, bottom4) = fig.axes[:2], fig.axes[2:4]
    notes = [[text.get_text() for text in ax.texts] for ax in (top1, top4)]
    plt.close(fig)
    assert notes[0] == ["every run censored:\nnone of the 24 runs clustered by t_max = 0.5"]
    assert bool(notes[1]) == (clustered_at is None)
    # One flat line says P = 0 for every beta, where one per beta lay on top of each other.
    assert len(bottom1.lines) == 1 + 3  # that line and the betas' closed-form times
    assert len(bottom4.lines) == (1 + 3 if clustered_at is None else 2 * 3)


def test_a_failed_beta_gets_no_entry_in_a_censored_panel():
    from attnflow.plotting import plt

    grid = {"H": [1], "beta": [1.0, 2.0, 4.0]}
    spec = EXPERIMENT.spec({"fixed": {"t_max": 0.5, "seeds": 8}, "grid": grid})
    t = np.full((1, 3, 8), np.inf)
    t[0, 0] = np.nan  # beta = 1: every cell failed, no runs
    coords = {**grid, "seed": np.arange(8)}
    summary = EXPERIMENT.derive(xr.Dataset({"t_cluster": (("H", "beta", "seed"), t)}, coords=coords), spec)
    fig = EXPERIMENT.plot(summary, spec)
    bottom = fig.axes[1]
    labels = [text.get_text() for text in bottom.get_legend().get_texts()]
    plt.close(fig)
    assert len(bottom.lines) == 1 + 2  # the P = 0 line and the closed-form times of the betas that ran
    assert not any("= 1: closed form" in label for label in labels), labels
    assert any("every beta that ran" in label for label in labels)
