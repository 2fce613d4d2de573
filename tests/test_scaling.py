"""Clustering time from uniform random tokens (the scaling experiment): the run's times against the
equiangular ODE where it is exact, and the summary's medians, censoring and fits on known data."""

import numpy as np
import pytest
import xarray as xr

from attnflow import theory
from attnflow.cell import Cell
from attnflow.experiments import Spec, registry
from attnflow.simulation import simulate
from attnflow.tokens import initial_tokens, typical_cosine

EXPERIMENT = registry().get("scaling")


def _cell(**fields) -> Cell:
    """A cell with the experiment's own defaults (its pinned fields and tolerances included)."""
    fixed = EXPERIMENT.defaults["fixed"]
    keys = ("heads", "H", "beta", "lambda_bar", "init", "cluster_metric", "cluster_threshold", "cluster_eps",
            "stop_at_cluster", "t_max", "n_samples", "seeds", "rtol", "atol")
    return Cell(**{**{k: fixed[k] for k in keys}, "observables": ["clusters"], **fields})


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_two_uniform_tokens_take_the_equiangular_time_from_their_own_cosine(attention):
    # Two tokens are always equiangular: their cosine obeys the equiangular ODE exactly, from the cosine
    # they start at. At the experiment's rtol 1e-8 the measured times agree with the closed-form integral
    # to 8e-9 relative at most (measured, both types); 1e-7 leaves a factor 10 for another machine's
    # round-off and still fails a time off by one solver step or a level crossed at the wrong sample.
    cell = _cell(attention=attention, n=2, d=3, seeds=12)
    ds = simulate(cell)
    x = initial_tokens(cell, cell.seeds)
    cos0 = np.einsum("sd,sd->s", x[:, 0], x[:, 1])
    level = cell.cluster_threshold
    reached = ~ds.censored.values
    # (relu from a cosine <= 0: inf, no drive)
    closed = theory.equiangular_time(cos0, level, [cell.lambda_bar], cell.beta, 2, attention)
    if attention == "relu":
        # Relu has no drive between tokens with a cosine <= 0: they never move, and stay two clusters.
        assert (cos0 <= 0).any() and (cos0 > 0).any()  # seeds 0-11 hold both cases
        assert not reached[cos0 <= 0].any()
        assert (ds.cluster_count.isel(time=-1).values[cos0 <= 0] == 2).all()
    below = cos0 < level  # a seed that starts above the level has reached it at t = 0
    assert below.sum() >= 8
    np.testing.assert_array_equal(reached[below], closed[below] <= cell.t_max)
    np.testing.assert_allclose(ds.t_cluster.values[below & reached], closed[below & reached], rtol=1e-7)


def _summary(times: np.ndarray, n, d, clusters=None) -> tuple[xr.Dataset, Spec]:
    """A summary as the aggregation hands it to derive: the reduction over (attention, n, d, seed)."""
    spec = EXPERIMENT.spec({"grid": {"attention": ["softmax", "relu"], "n": n.tolist(), "d": d.tolist()}})
    dims = ("attention", "n", "d", "seed")
    coords = {"attention": ["softmax", "relu"], "n": n, "d": d, "seed": np.arange(times.shape[-1])}
    censored = np.isinf(times)
    last = np.where(censored, 2.0 if clusters is None else clusters, -1.0)
    ds = xr.Dataset({"cluster_count": (dims + ("time",), np.stack([np.ones_like(times), last], axis=-1)),
                     "t_cluster": (dims, np.where(censored, np.nan, times)),
                     "censored": (dims, censored)}, coords=coords)
    reduced = EXPERIMENT.reduce(ds)
    reduced.attrs = {"experiment": "scaling", "experiment_spec": spec.to_json()}
    return reduced, spec


def test_medians_censoring_and_slopes_on_known_times():
    n, d = np.array([8, 16, 32, 64]), np.array([4, 16, 64])
    # softmax: every seed at T = 2 + 0.5 ln n + 0.3 ln d, shifted per seed by -0.2, -0.1, 0.1, 0.2
    # (median and slopes exact); relu: the same times, but three of four seeds censored at n = 64.
    base = 2.0 + 0.5 * np.log(n)[:, None] + 0.3 * np.log(d)[None, :]
    times = np.stack([base] * 2)[..., None] + np.array([-0.2, -0.1, 0.1, 0.2])
    times[1, 3, :, 1:] = np.inf
    summary, spec = _summary(times, n, d)
    out = EXPERIMENT.derive(summary, spec)
    np.testing.assert_allclose(out.t_median.sel(attention="softmax").transpose("n", "d"), base, rtol=1e-14)
    assert np.isinf(out.t_median.sel(attention="relu", n=64)).all()  # half or more censored: inf
    relu = out.t_median.sel(attention="relu", n=[8, 16, 32]).transpose("n", "d")
    np.testing.assert_allclose(relu, base[:3], rtol=1e-14)
    # Quartiles are the nearest order statistics (the second and third of four seeds), never an
    # interpolation with inf.
    np.testing.assert_allclose(out.t_q1.sel(attention="softmax").transpose("n", "d"), base - 0.1, rtol=1e-14)
    np.testing.assert_allclose(out.t_q3.sel(attention="softmax").transpose("n", "d"), base + 0.1, rtol=1e-14)
    assert float(out.censored_fraction.sel(attention="relu", n=64, d=4)) == 0.75
    assert float(out.frozen_fraction.sel(attention="relu", n=64, d=4)) == 0.75
    assert float(out.clusters_frozen.sel(attention="relu", n=64, d=4)) == 2.0
    assert float(out.censored_fraction.sel(attention="softmax").max()) == 0.0
    np.testing.assert_allclose(out.log_n_slope.sel(attention="softmax"), 0.5, rtol=1e-12)
    np.testing.assert_allclose(out.log_d_slope.sel(attention="softmax"), 0.3, rtol=1e-12)
    # relu's fit along n uses the three finite medians (still exact); along d at n = 64 there is none.
    np.testing.assert_allclose(out.log_n_slope.sel(attention="relu"), 0.5, rtol=1e-12)
    assert np.isnan(float(out.log_d_slope.sel(attention="relu", n=64)))
    # The closed form at each grid point is the equiangular time from gamma0 = 1/sqrt(d).
    for att in ("softmax", "relu"):
        for nn in (8, 64):
            for dd in (4, 64):
                expected = theory.equiangular_time(typical_cosine(dd), 0.9, [1.0], 1.0, nn, att)
                assert float(out.t_closed.sel(attention=att, n=nn, d=dd)) == pytest.approx(float(expected),
                                                                                         rel=1e-13)
    # The contours' fine grid spans the measured one and meets it at the corners.
    fine = out.t_closed_fine.sel(attention="relu")
    assert float(fine.isel(n_fine=0, d_fine=0)) == pytest.approx(float(out.t_closed.sel(
        attention="relu", n=8, d=4)), rel=1e-12)
    assert float(fine.isel(n_fine=-1, d_fine=-1)) == pytest.approx(float(out.t_closed.sel(
        attention="relu", n=64, d=64)), rel=1e-12)


def test_export_fits_match_the_summary():
    n, d = np.array([8, 16, 32]), np.array([4, 64])
    base = 1.0 + 0.4 * np.log(n)[:, None] + 0.25 * np.log(d)[None, :]
    times = np.stack([base] * 2)[..., None] + np.array([0.0, 0.0, 0.0])
    summary, spec = _summary(times, n, d)
    table = EXPERIMENT.export_table(EXPERIMENT.derive(summary, spec))
    along_n = table[table.fit == "T ~ s ln n"]
    along_d = table[table.fit == "T ~ s ln d"]
    assert len(along_n) == 2 * d.size and len(along_d) == 2 * n.size
    np.testing.assert_allclose(along_n.measured, 0.4, rtol=1e-12)
    np.testing.assert_allclose(along_d.measured, 0.25, rtol=1e-12)
    assert (table.seeds == 3).all() and (table.censored_max == 0).all()
    assert set(table.attrs["units"]) == set(table.columns)


def test_figure_draws_no_bound_for_random_starts_and_fits_over_their_range():
    """Issue 52: no bound's regime edge or closed-form contours over the maps (their labels covered the
    cells' numbers), no slope-1 guide drawn over every n; the measured law with its interval, drawn over
    the n it is fitted on (relu: 8-32, its n = 64 median is censored)."""
    from matplotlib.contour import ContourSet

    from attnflow.plotting import plt

    n, d = np.array([8, 16, 32, 64]), np.array([4, 16, 64])
    base = 2.0 + 0.5 * np.log(n)[:, None] + 0.3 * np.log(d)[None, :]
    times = np.stack([base] * 2)[..., None] + np.array([-0.2, -0.1, 0.1, 0.2])
    times[1, 3, :, 1:] = np.inf
    summary, spec = _summary(times, n, d)
    fig = EXPERIMENT.plot(EXPERIMENT.derive(summary, spec), spec)
    curves = fig.axes[2]
    for ax in fig.axes[:2]:
        assert not [c for c in ax.collections if isinstance(c, ContourSet)]
        assert not [line for line in ax.get_lines() if line.get_linestyle() == "--"]  # no regime edge
        texts = [t for t in ax.texts if t.get_text()]
        assert len(texts) == n.size * d.size  # the cells' numbers and nothing else
    solid = [line for line in curves.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata()) > 2]
    assert len(solid) == 2 * d.size  # one fitted law per (attention, d)
    spans = sorted({(round(min(line.get_xdata())), round(max(line.get_xdata()))) for line in solid})
    assert spans == [(8, 32), (8, 64)]
    for line in solid:  # the law itself: T = a + 0.5 ln n
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        np.testing.assert_allclose(np.diff(y) / np.diff(np.log(x)), 0.5, rtol=1e-9)
    assert not [line for line in curves.get_lines() if line.get_linestyle() == "--"]  # no slope-1 guide
    labels = [t.get_text() for legend in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
              for t in legend.get_texts()]
    assert any("s = 0.50 [0.50, 0.50]" in label for label in labels), labels
    plt.close(fig)
