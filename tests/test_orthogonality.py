"""Thm 39 pointwise: the per-head rates the orthogonality figure evaluates, its overlaps, its critical
overlaps and the margin's prediction of them."""

import numpy as np
import pytest
import xarray as xr

from attnflow import Cell, simulate
from attnflow.experiments import orthogonality as orth
from attnflow.pack import as_cells, group_cells
from attnflow.tokens import unit_rows

LAM = 1.0
SWAP = np.array([[0.0, 1.0], [1.0, 0.0]])  # the perturbation of both heads: unit operator norm


def known_heads(s):
    """Block heads diag(lam, 0), diag(0, lam) in d = 2, both perturbed by s SWAP: M_1 M_2 =
    [[s^2, 2 lam s], [0, s^2]], whose norm is omega(s) = lam s + s sqrt(lam^2 + s^2)."""
    return np.stack([np.diag([LAM, 0.0]), np.diag([0.0, LAM])]) + np.asarray(s)[..., None, None, None] * SWAP


def known_omega(s):
    return LAM * s + s * np.sqrt(LAM**2 + s**2)


def s_for(omega):
    """The inverse of known_omega (increasing in s), by bisection."""
    low, high = np.zeros_like(omega), np.full_like(omega, 10.0)
    for _ in range(60):
        mid = 0.5 * (low + high)
        below = known_omega(mid) < omega
        low, high = np.where(below, mid, low), np.where(below, high, mid)
    return high


def test_overlap_of_the_known_heads_is_its_closed_form():
    s = np.array([1e-3, 0.05, 0.3, 2.0])
    np.testing.assert_allclose(orth.cross_norms(known_heads(s)), known_omega(s), rtol=1e-13)


@pytest.mark.parametrize("spherical", [True, False], ids=["sphere", "flat"])
@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_survival_is_one_below_the_margins_prediction_and_falls_above(spherical, beta):
    """300 configurations of 5 uniform tokens; at each, the overlap set to f times the margin's
    prediction along the known perturbation (omega known in closed form)."""
    x = unit_rows(np.random.default_rng(1).standard_normal((300, 5, 2)))
    base = np.broadcast_to(known_heads(0.0), (300, 2, 2, 2))
    without = orth.head_terms(x, base, beta, spherical)
    predicted = orth.predicted_overlap(without)
    kept = orth.monotone(without) & (predicted > 0)  # Thm 39's hypothesis: orthogonal heads monotone
    assert kept.sum() >= 100
    survival = {}
    for factor in (0.25, 1.0, 4.0):
        heads = known_heads(s_for(factor * predicted))
        with_overlap = orth.head_terms(x, heads, beta, spherical)
        survival[factor] = orth.monotone(with_overlap)[kept].mean()
        # The sufficient condition is a proof: where it holds, no head loses energy.
        certified = orth.certified(with_overlap, known_omega(s_for(factor * predicted)))
        assert not np.any(certified & ~orth.monotone(with_overlap))
    # Below the prediction no configuration fails (the cross term cannot cancel the margins there, and
    # on these configurations the perturbation's change of the heads' own terms does not either) ...
    assert survival[0.25] == survival[1.0] == 1.0
    # ... and at 4x it does fail at some: the prediction is where the margin is spent, not a loose bound.
    assert survival[4.0] < (0.9 if spherical else 0.99)


@pytest.fixture(scope="module")
def runs():
    cells = {f"c{i}": Cell(heads="perturbed_block", attention="usa", init="uniform", H=2, n=6, d=4,
                           delta=delta, beta=beta, seeds=4, t_max=6.0, n_samples=13, geometry=geometry,
                           observables=list(orth.EXPERIMENT.observables))
             for i, (delta, beta, geometry) in enumerate([(0.1, 0.5, "sphere"), (0.4, 1.0, "sphere"),
                                                          (0.3, 1.0, "flat")])}
    # Flat usa runs blow up: a short horizon.
    cells["c2"] = cells["c2"].replace(t_max=0.05, n_samples=13)
    stores = {key: simulate(cell, certify=False) for key, cell in cells.items()}
    return {key: as_cells(group_cells({key: ds})[""]) for key, ds in stores.items()}  # as aggregate reads it


def test_numpy_rates_are_the_engines(runs):
    """head_terms (numpy, Thm 16-17's decomposition) against the engine's recorded dE_h/dt, each run in
    its own geometry: two routes to one sum of O(scale) terms, so they agree to round-off (1e-12 of the
    largest rate leaves room for exp of scores rounded differently)."""
    for ds in runs.values():
        spherical = ds.attrs["cell_geometry"] == "sphere"
        x = ds.x.isel(cell=0).values
        heads = ds.score_matrix.isel(cell=0).values[:, None]
        beta = float(ds.attrs["cell_beta"])
        terms = orth.head_terms(x, heads, beta, spherical)
        rate = (terms["margin"] + terms["cross"]) / ds.sizes["token"] ** 3
        recorded = ds.energy_rate.isel(cell=0).transpose("seed", "time", "head").values
        ok = np.isfinite(recorded)
        np.testing.assert_allclose(rate[ok], recorded[ok], rtol=0, atol=1e-12 * np.abs(recorded[ok]).max())
        if spherical:  # the sphere's margin is the sum of the recorded Radial Dominance margins
            margins = ds.rd_margin.isel(cell=0).sum("token").transpose("seed", "time", "head").values
            np.testing.assert_allclose(terms["margin"][ok], margins[ok], rtol=0,
                                       atol=1e-12 * np.abs(margins[ok]).max())


def test_the_map_is_consistent_with_each_configurations_critical_overlap(runs):
    # The flat run samples other times: outer join, NaN where a run has no sample.
    out = xr.concat([orth.configuration_map(ds) for ds in runs.values()], dim="cell", join="outer")
    base, kept, certified = out.base_monotone.values, out.monotone.values, out.certified.values
    assert np.all(np.isnan(kept) | (base == 1))  # conditioned on the orthogonal heads being monotone
    assert np.all(np.isnan(certified) == np.isnan(kept))
    assert not np.any((certified == 1) & (kept == 0))  # the condition is sufficient
    assert np.all(out.base_monotone.sel(geometry="flat").values[np.isfinite(base[..., 1])] == 1)  # Thm 16
    # The run's own heads lie at s = delta on the path M0 + s E whose first failure is the critical
    # overlap: monotone there exactly when omega is below it (up to the bisection's 2^-30 bracket).
    omega = out.omega.broadcast_like(out.critical_omega).values
    critical = out.critical_omega.values
    known = np.isfinite(critical) & (np.abs(omega / critical - 1) > 1e-6)
    assert known.sum() + np.isinf(critical).sum() >= 10
    np.testing.assert_array_equal(kept[known], omega[known] < critical[known])
    assert np.all(kept[np.isinf(critical)] == 1)  # never fails along the path: not at delta either


def test_figure_and_table_from_a_small_summary(runs):
    from attnflow.plotting import plt

    experiment = orth.EXPERIMENT
    spec = experiment.spec({"grid": {"delta": [0.1, 0.4], "beta": [0.5, 1.0]}})
    sphere = [orth.configuration_map(runs[k]) for k in ("c0", "c1")]
    summary = xr.concat(sphere, dim="cell").assign_coords(delta=("cell", [0.1, 0.4]),
                                                          beta=("cell", [0.5, 1.0]))
    summary = summary.set_index(cell=["delta", "beta"]).unstack("cell")
    summary = experiment.derive(summary, spec)
    assert set(summary.map_survival.dims) == {"beta", "geometry", "omega_bin"}
    assert float(summary.map_survival.max()) <= 1.0
    fig = experiment.plot(summary, spec)
    fig.draw_without_rendering()
    plt.close(fig)
    summary.attrs.update({"experiment": "orthogonality", "experiment_spec": spec.to_json()})
    table = experiment.export_table(summary)
    assert sorted(table.geometry) == ["flat", "flat", "sphere", "sphere"]
    ran = table.survival_delta_min.notna()  # delta = 0.1 ran at beta = 0.5 only
    assert ran.sum() == 2 and (table.survival_delta_min[ran] >= table.certified_delta_min[ran]).all()
