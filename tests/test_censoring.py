"""Seeds whose run failed at a grid end are not censored on the strength of the next value (issue 52)."""

from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr

from attnflow.experiments import registry
from attnflow.experiments.beta_star import grid_threshold
from attnflow.tables import seed_brackets, threshold_columns

BETA = [0.25, 0.5, 1.0, 2.0]
NAN = np.nan
# One line of the grid, six seeds (1: monotonicity fails, 0: holds, NaN: the run failed):
FAILS = np.array([
    [NAN, 1, 1, 1],  # failed at the smallest beta, fails at the next: may or may not be below the grid
    [NAN, 1, 1, 1],  # the same
    [1, 1, 1, 1],    # fails at the smallest beta: below the grid
    [0, 1, 1, 1],    # threshold on the grid, in (0.25, 0.5)
    [0, 0, 0, 0],    # holds everywhere: above the grid
    [0, 0, 0, NAN],  # holds up to a failed run at the largest beta: may or may not be above it
])


def _fails(values=FAILS):
    return xr.DataArray(values, dims=("seed", "beta"), coords={"seed": np.arange(len(values)), "beta": BETA})


def test_a_failed_run_at_a_grid_end_leaves_the_seed_undetermined():
    threshold, below, above, undetermined = grid_threshold(_fails(), _fails().beta)
    assert below.values.tolist() == [False, False, True, False, False, False]
    assert above.values.tolist() == [False, False, False, False, True, False]
    assert undetermined.values.tolist() == [True, True, False, False, False, True]
    np.testing.assert_allclose(threshold.values[3], np.sqrt(0.25 * 0.5), rtol=1e-15)
    assert np.isnan(threshold.values[[0, 1, 2, 4, 5]]).all()


def test_a_gap_inside_the_line_widens_the_bracket():
    """Holds at 0.25, failed at 0.5, fails at 1: the bracket is (0.25, 1), on the grid."""
    threshold, below, above, undetermined = grid_threshold(_fails(np.array([[0, NAN, 1, 1]])), _fails().beta)
    assert not (below | above | undetermined).any()
    np.testing.assert_allclose(threshold.values[0], np.sqrt(0.25 * 1.0), rtol=1e-15)


def test_beta_star_fractions_are_over_the_seeds_placed():
    """Of the six seeds three are placed (one below, one on, one above): 1/3 below, 1/3 above, and the
    summary says three were undetermined. Before the fix: 3/6 below, 2/6 above."""
    shape = (6, 1, 1, 1, 1, 4)
    dims = ("seed", "attention", "H", "heads", "n", "beta")
    mono = (1 - FAILS).reshape(shape)
    ones = np.where(np.isnan(mono), NAN, 1.0)
    summary = xr.Dataset(
        {"mono_path": (dims, mono), "mono_t0": (dims, ones), "rd_t0": (dims, ones), "time_rd": (dims, ones)},
        coords={"seed": np.arange(6), "attention": ["softmax"], "H": [2], "heads": ["scalar"], "n": [4],
                "beta": BETA})
    out = registry().get("beta_star").derive(summary, SimpleNamespace(fixed={"lambda_bar": 1.0}))
    line = dict(attention="softmax", H=2, heads="scalar", n=4)
    assert float(out.beta_mono_below_grid.sel(line)) == pytest.approx(1 / 3, rel=1e-15)
    assert float(out.beta_mono_above_grid.sel(line)) == pytest.approx(1 / 3, rel=1e-15)
    assert int(out.beta_mono_undetermined.sel(line)) == 3
    # Radial Dominance holds at t = 0 wherever a run exists: every seed with a run at the largest beta is
    # above the grid (4 of them), the one whose largest-beta run failed is undetermined.
    assert float(out.beta_rd_above_grid.sel(line)) == 1.0 and int(out.beta_rd_undetermined.sel(line)) == 1


def test_export_counts_the_undetermined_seeds_apart():
    brackets = seed_brackets(_fails(), "beta")
    assert brackets.below.values.tolist() == [False, False, True, False, False, False]
    assert brackets.above.values.tolist() == [False, False, False, False, True, False]
    columns = threshold_columns("beta_mono", _fails(), "beta", "monotonicity")
    counts = {k: int(columns[f"beta_mono_{k}"][0]) for k in ("seeds", "below_grid", "above_grid",
                                                             "undetermined")}
    assert counts == {"seeds": 1, "below_grid": 1, "above_grid": 1, "undetermined": 3}
    assert int(columns["seeds"][0]) == 3  # placed: on, below and above add up to it
    # Censored below: the interval reaches 0; above: inf; the undetermined seeds widen nothing.
    assert float(columns["beta_mono_low"][0]) == 0.0 and float(columns["beta_mono_high"][0]) == np.inf
