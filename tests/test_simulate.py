import numpy as np
import pytest
from reference import random_sphere, random_symmetric

import attnflow
from attnflow import Cell, simulate
from attnflow.observables import GROUPS, variables


def test_dataset_layout_and_metadata():
    cell = Cell(H=2, n=5, d=4, seeds=[3, 7], t_max=1.0, n_samples=6, heads="random",
                observables=list(GROUPS.names()))
    ds = simulate(cell)
    assert dict(ds.sizes) == {"seed": 2, "time": 6, "head": 2, "token": 5, "dim": 4, "dim_col": 4}
    assert list(ds.seed.values) == [3, 7]
    assert ds.energy.dims == ("seed", "time", "head")
    assert ds.rd_margin.dims == ("seed", "time", "head", "token")
    assert ds.x.dims == ("seed", "time", "token", "dim")
    for name, var in ds.data_vars.items():
        # CF: units on quantities, none on flags (censored, failed)
        assert ("units" in var.attrs) == (var.dtype != bool) and "description" in var.attrs, name
    for field, value in cell.to_dict().items():
        assert ds.attrs[f"cell_{field}"] == value
    assert ds.attrs["attnflow_version"] == attnflow.__version__
    # Seeded heads are stored per seed; diagonal heads as their diagonals, once (they do not
    # depend on the seed): no d x d matrix per seed.
    assert ds.score_matrix.dims == ("seed", "head", "dim", "dim_col")
    scalar = simulate(cell.replace(heads="scalar"))
    assert scalar.score_diagonal.dims == ("head", "dim") and "score_matrix" not in scalar


def test_only_the_requested_observables_are_recorded():
    ds = simulate(Cell(H=2, n=5, d=4, seeds=2, t_max=1.0, observables=["energy"]))
    recorded = {v.name for v in variables(["energy"])}
    assert recorded == {"gamma_mean", "gamma_min", "energy", "energy_rate"}
    assert recorded <= set(ds.data_vars) and "entropy" not in ds and "x" not in ds


def test_censoring_and_located_cluster_time():
    cell = Cell(H=1, n=4, d=3, beta=1.0, seeds=3, t_max=0.2, n_samples=5, observables=[])
    short = simulate(cell)
    assert short.censored.all() and np.isnan(short.t_cluster).all()
    long = simulate(cell.replace(t_max=40.0, n_samples=4001))
    assert not long.censored.any()
    eps = 1.0 - long.gamma_min.values
    t = long.time.values
    for b in range(3):
        tc = float(long.t_cluster[b])
        k = np.searchsorted(t, tc)
        # The crossing lies between the bracketing samples ...
        assert eps[b, k - 1] > 1e-3 >= eps[b, k]
        # ... and, located on the dense output, closer to the truth than a linear
        # interpolation of the samples (whose error is O(dt^2 eps'')) would need.
        linear = t[k - 1] + (1e-3 - eps[b, k - 1]) / (eps[b, k] - eps[b, k - 1]) * (t[k] - t[k - 1])
        assert tc == pytest.approx(linear, abs=1e-4)
    # Never the horizon: a censored run is NaN, never t_max.
    assert not np.any(long.t_cluster.values == 40.0)
    # The crossing does not depend on the sampling.
    coarse = simulate(cell.replace(t_max=40.0, n_samples=3))
    np.testing.assert_allclose(coarse.t_cluster.values, long.t_cluster.values, rtol=1e-9)


def test_norm_drift_round_off_on_sphere_and_real_in_flat():
    ds = simulate(Cell(H=2, n=8, d=6, heads="random", seeds=4, t_max=5.0))
    assert float(ds.norm_drift.max()) < 1e-14
    flat = simulate(Cell(H=2, n=8, d=6, heads="random", geometry="flat", seeds=2, t_max=0.5))
    # In flat geometry the flow moves the norms: dynamics, under its own name, never "drift".
    assert "norm_drift" not in flat and float(flat.norm_change.min()) > 1e-6


def test_explicit_inputs_replace_generators_and_are_recorded(rng):
    n, d, H = 5, 4, 2
    m = random_symmetric(rng, H, d)
    v = rng.standard_normal((H, d, d))
    x0 = random_sphere(rng, n, d)
    cell = Cell(H=H, n=n, d=d, seeds=2, t_max=0.5, n_samples=3, observables=["positions"])
    ds = simulate(cell, x0=x0, score_matrices=m, value_matrices=v)
    # On the sphere explicit tokens are re-normalised: a change of an ulp or two.
    np.testing.assert_allclose(ds.x.isel(time=0).values, np.stack([x0, x0]), rtol=0, atol=5e-16)
    np.testing.assert_array_equal(ds.score_matrix.values, m)  # shared by the seeds: stored once
    np.testing.assert_array_equal(ds.value_matrix.values, v)
    assert ds.attrs["heads_source"] == "explicit" and ds.attrs["x0_source"] == "explicit"


def test_explicit_values_beside_heads_drawn_per_seed(rng):
    # The score matrices are stored per seed, the explicit values once: each with its own dims.
    d, H = 4, 2
    v = rng.standard_normal((H, d, d))
    ds = simulate(Cell(H=H, n=5, d=d, heads="random", seeds=3, t_max=0.5, n_samples=3), value_matrices=v)
    assert ds.score_matrix.dims == ("seed", "head", "dim", "dim_col")
    assert ds.value_matrix.dims == ("head", "dim", "dim_col")
    np.testing.assert_array_equal(ds.value_matrix.values, v)
    assert ds.attrs["values_source"] == "explicit"


def test_explicit_inputs_refused_with_clear_messages(rng):
    cell = Cell(H=2, n=5, d=4, seeds=1, t_max=0.5)
    with pytest.raises(ValueError, match="x0: tokens are not on the unit sphere"):
        simulate(cell, x0=2.0 * random_sphere(rng, 5, 4))
    with pytest.raises(ValueError, match=r"x0: shape \(5, 3\)"):
        simulate(cell, x0=random_sphere(rng, 5, 3))
    with pytest.raises(ValueError, match="x0: complex entries"):
        simulate(cell, x0=random_sphere(rng, 5, 4) + 0j)
    with pytest.raises(ValueError, match="x0: contains non-finite"):
        simulate(cell, x0=np.full((5, 4), np.nan))
    with pytest.raises(ValueError, match="score_matrices: not symmetric"):
        simulate(cell, score_matrices=rng.standard_normal((2, 4, 4)))
    with pytest.raises(ValueError, match="score_matrices: complex"):
        simulate(cell, score_matrices=np.stack([np.eye(4)] * 2) * 1j)
    with pytest.raises(ValueError, match="score_matrices: beta"):
        simulate(cell.replace(beta=100.0), score_matrices=10 * np.stack([np.eye(4)] * 2))
    with pytest.raises(TypeError, match="expects a Cell"):
        simulate({"H": 2})
    with pytest.raises(ValueError, match="x0: not an array of one shape"):
        simulate(cell, x0=[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0]])
    with pytest.raises(TypeError, match=r"certify = 'no': must be True or False"):
        simulate(cell, certify="no")
    # Refused before any allocation: 4 seeds x 10^11 samples would need terabytes.
    with pytest.raises(ValueError, match=r"its arrays need .* GiB .* above 1024 GiB"):
        simulate(cell.replace(n_samples=10**11))


def test_a_step_budget_failure_is_a_failed_seed_stored_with_its_cell():
    # 50 steps cannot reach t = 50 at usa beta 8: every seed fails, each recorded with its error and
    # time of failure, NaN after it; the cell is returned (stored, not computed again), uncertified.
    cell = Cell(H=2, n=6, d=6, attention="usa", beta=8.0, heads="random", seeds=2, t_max=50.0,
                max_steps=50)
    ds = simulate(cell)
    assert ds.failed.values.tolist() == [True, True] and (ds.failure.values == 2).all()
    assert ds.failure.attrs["flag_meanings"].split()[2] == "step_budget_exhausted"
    assert ds.attrs["n_seeds_failed"] == 2 and "certificate_error" not in ds.attrs
    assert ds.attrs["seed_failures"].startswith("2 of 2 seeds failed: step budget of 50 exhausted "
                                                "(seeds 0, 1;")
    t_failed = ds.t_failed.values
    assert np.all((t_failed > 0) & (t_failed < 50.0))
    for s in range(2):  # samples up to the failure kept, after it NaN
        after = ds.time.values > t_failed[s]
        assert np.isnan(ds.gamma_mean.values[s, after]).all()
        assert np.isfinite(ds.gamma_mean.values[s, ~after]).all() and (~after).sum() >= 1
    assert not ds.censored.values.any()  # never clustered, but not "censored at t_max" either
