"""Thm 22's figure: drawn from a summary built by hand, no simulation."""

import numpy as np
import xarray as xr

from attnflow.experiments.superadditivity import EXPERIMENT


def test_the_censoring_mark_shows_on_dark_pale_and_blank_cells():
    from attnflow.plotting import plt

    grid = {"init": ["equiangular"], "spread": [0.5], "lambda_dist": ["equal", "linear"],
            "lambda_bar": [0.5, 1.0, 2.0], "beta": [1.0, 2.0]}
    coords = {**grid, "seed": [0, 1, 2]}
    t = np.ones([len(values) for values in coords.values()])
    t[0, 0, :, 0, 0, :] = np.inf  # no seed clusters either way: no ratio, a blank cell
    t[0, 0, 0, 2, 1, :] = np.inf  # equal heads never cluster: the ratio only bounded below, a blank cell
    t[0, 0, 0, 1, 0, 0] = np.inf  # one seed censored, ratio 1 (median of 1, 1, inf): a pale cell
    spec = EXPERIMENT.spec({"grid": grid})
    summary = EXPERIMENT.derive(xr.Dataset({"t_cluster": (tuple(coords), t)}, coords=coords), spec)
    assert np.isnan(summary.ratio.sel(lambda_bar=0.5, beta=1.0)).all()
    # A censored run bounds its time, it is no value: the median of bounds (t_max/1 each) is undetermined.
    assert np.isnan(summary.ratio.sel(lambda_bar=2.0, beta=2.0)).all()
    fig = EXPERIMENT.plot(summary, spec)
    marks = {tuple(mark.get_position()): mark.get_color()
             for mark in fig.axes[0].texts if mark.get_text() == "c"}
    plt.close(fig)
    # White vanished on the blank (white) and pale cells: black on each.
    assert marks == {(0.5, 1.0): "k", (1.0, 1.0): "k", (2.0, 2.0): "k"}
