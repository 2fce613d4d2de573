"""docs/model.md's identities, each checked against an independent route."""

import numpy as np
import pytest
from reference import entropies, head_energies, head_outputs, random_sphere, random_symmetric, velocity

from attnflow import Cell, simulate, theory
from attnflow.engine import observe


def _obs(x, m, beta, attention, geometry):
    out = observe(x[None], m[None], attention=attention, beta=beta, geometry=geometry)
    return {k: v[0] for k, v in out.items()}


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_thm11_total_energy_rate_equals_kinetic(rng, geometry):
    # usa, random symmetric heads: dE_multi/dt = (1/n) sum_i ||dx_i/dt||^2 exactly.
    for _ in range(5):
        n, d, H, beta = 7, 5, 3, 1.3
        m = random_symmetric(rng, H, d)
        x = random_sphere(rng, n, d)
        o = _obs(x, m, beta, "usa", geometry)
        xdot = velocity(x, m, beta, "usa", geometry)
        kinetic_ref = np.mean(np.sum(xdot**2, axis=1))
        # Both sides are sums of O(1) terms: agreement to a few ulps of the total.
        assert o["energy_rate"].sum() == pytest.approx(kinetic_ref, rel=1e-12)
        assert o["kinetic"] == pytest.approx(kinetic_ref, rel=1e-12)
        # Independent route for the rate itself: central difference of E along xdot.
        eps = 1e-5
        fd = (head_energies(x + eps * xdot, m, beta) - head_energies(x - eps * xdot, m, beta)) / (2 * eps)
        # Central difference error is O(eps^2 ||E'''||) ~ 1e-10 here.
        np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(o["energy"], head_energies(x, m, beta), rtol=1e-13)


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_energy_rate_by_finite_differences_for_every_attention(rng, attention):
    # The per-head energy and its rate are defined alike whatever drives the flow.
    n, d, H, beta = 6, 5, 2, 0.9
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    xdot = velocity(x, m, beta, attention)
    eps = 1e-5
    fd = (head_energies(x + eps * xdot, m, beta) - head_energies(x - eps * xdot, m, beta)) / (2 * eps)
    o = _obs(x, m, beta, attention, "sphere")
    np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(o["energy"], head_energies(x, m, beta), rtol=1e-13)


@pytest.mark.parametrize("attention", ["softmax", "usa"])
def test_energy_rate_with_explicit_value_matrices(rng, attention):
    # V_h != M_h: the head outputs are not the energy's gradient rows, so the engine
    # forms sum_j p_ij M_h x_j itself (normalised weights it builds only for this).
    n, d, H, beta = 6, 5, 2, 1.1
    m = random_symmetric(rng, H, d)
    v = rng.standard_normal((H, d, d)) / 2
    x = random_sphere(rng, n, d)
    xdot = velocity(x, m, beta, attention, "sphere", v)
    eps = 1e-5
    fd = (head_energies(x + eps * xdot, m, beta) - head_energies(x - eps * xdot, m, beta)) / (2 * eps)
    # Energies without entropies: the weights are normalised for the energies alone.
    o = {k: a[0] for k, a in observe(x[None], m[None], attention=attention, beta=beta, values=v[None],
                                     groups=("velocity", "energy")).items()}
    # Central differences: O(eps^2) ~ 1e-10, as above.
    np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(o["energy"], head_energies(x, m, beta), rtol=1e-13)
    np.testing.assert_allclose(o["kinetic"], np.mean(np.sum(xdot**2, axis=1)), rtol=1e-12)


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_thm16_17_per_head_decomposition(rng, geometry):
    on_sphere = geometry == "sphere"
    n, d, H, beta = 6, 6, 3, 0.8
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    outs = [f for _, f in head_outputs(x, m, beta, "usa")]
    a = [np.sum(f * x, axis=1) for f in outs]
    expected = []
    for h in range(H):
        own = np.sum((outs[h] - a[h][:, None] * x) ** 2, axis=1) if on_sphere else np.sum(outs[h] ** 2, 1)
        cross = sum(
            np.sum(outs[k] * outs[h], axis=1) - (a[k] * a[h] if on_sphere else 0.0)
            for k in range(H) if k != h
        )
        expected.append(np.sum(own + cross) / n**3)
    o = _obs(x, m, beta, "usa", geometry)
    # Same sums in another order: round-off on O(1) quantities.
    np.testing.assert_allclose(o["energy_rate"], expected, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(o["radial_shadow"], np.stack(a), rtol=1e-12, atol=1e-14)


def test_block_heads_fall_on_sphere_but_not_flat():
    # Exactly orthogonal block heads: the flat cross term vanishes, the sphere's
    # -a^h' a^h does not. Over 50 random configurations some head's energy falls
    # on the sphere; in flat space none does.
    H, d, n, beta = 2, 4, 6, 2.0
    m = np.zeros((H, d, d))
    m[0, :2, :2] = np.eye(2)
    m[1, 2:, 2:] = np.eye(2)
    falls = 0
    for seed in range(50):
        x = random_sphere(np.random.default_rng(seed), n, d)
        assert _obs(x, m, beta, "usa", "flat")["energy_rate"].min() >= 0.0
        falls += _obs(x, m, beta, "usa", "sphere")["energy_rate"].min() < 0.0
    assert falls > 0
    # The same, through a full simulation: a per-head energy decreases in time
    # on the sphere while the flat run is monotone for every head.
    # Flat usa blows up in finite time (norms grow, so do the weights): keep t short.
    cell = Cell(H=H, n=n, d=d, beta=beta, attention="usa", heads="block", seeds=8,
                t_max=0.05, n_samples=11)
    sphere = simulate(cell)
    flat = simulate(cell.replace(geometry="flat"))
    assert (sphere.energy.diff("time") < 0).any()
    assert (flat.energy_rate >= 0).all()
    assert (flat.energy.diff("time") >= -1e-12).all()


def test_thm27_entropy_rate_by_finite_differences(rng):
    n, d, H, beta = 6, 5, 2, 1.7
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    xdot = velocity(x, m, beta, "softmax")
    eps = 1e-5
    fd = (entropies(x + eps * xdot, m, beta) - entropies(x - eps * xdot, m, beta)) / (2 * eps)
    o = _obs(x, m, beta, "softmax", "sphere")
    # Central difference: O(eps^2) ~ 1e-10 truncation, 1e-11 cancellation.
    np.testing.assert_allclose(o["entropy_rate"], fd, atol=1e-8)
    np.testing.assert_allclose(o["entropy"], entropies(x, m, beta), rtol=1e-13)


def test_entropy_rises_to_log_n_for_equiangular_scalar_heads():
    cell = Cell(H=2, n=6, d=6, beta=1.0, init="equiangular", gamma0=0.1, seeds=1,
                t_max=12.0, n_samples=61, rtol=1e-9, atol=1e-12)
    ds = simulate(cell)
    ent = ds.entropy.isel(seed=0, head=0, token=0).values
    assert np.all(np.diff(ent) >= -1e-12)
    assert ent[-1] == pytest.approx(np.log(6), abs=1e-6)


def test_equiangular_ode_matches_particles():
    cell = Cell(H=3, n=5, d=5, beta=2.0, heads="scalar", lambda_dist="linear", spread=0.5,
                init="equiangular", gamma0=0.05, seeds=1, t_max=4.0, n_samples=41,
                rtol=1e-10, atol=1e-12)
    ds = simulate(cell)
    lambdas = ds.lam.values[0]
    ref = theory.solve_equiangular(0.05, lambdas, 2.0, 5, ds.time.values)
    # Both solved at <= 1e-10 relative tolerance; 1e-8 leaves room for error growth.
    np.testing.assert_allclose(ds.gamma_mean.values[0], ref, atol=1e-8)
    # Equiangular is invariant: every pair keeps the common cosine.
    np.testing.assert_allclose(ds.gamma_min.values[0], ref, atol=1e-8)
    # The exact early rate is sum_h phi(lambda_h) (Thm 22).
    assert float(ds.gamma_mean_rate.isel(seed=0, time=0)) == pytest.approx(
        float(theory.equiangular_rate(0.05, lambdas, 2.0, 5)), rel=1e-12)


def test_late_rate_is_two_lambda():
    cell = Cell(H=2, n=4, d=4, beta=1.0, lambda_dist="linear", spread=0.4, lambda_bar=0.5,
                init="equiangular", gamma0=0.2, seeds=1, t_max=14.0, n_samples=141,
                rtol=1e-11, atol=1e-14)
    ds = simulate(cell)
    eps = 1.0 - ds.gamma_min.values[0]
    late = (ds.time.values > 8) & (eps > 1e-10)
    slope = np.polyfit(ds.time.values[late], np.log(eps[late]), 1)[0]
    # The correction to exp(-2 Lambda t) is O(epsilon) ~ 1e-4 relative here.
    assert -slope == pytest.approx(theory.late_rate(ds.lam.values[0]), rel=1e-3)


@pytest.mark.parametrize("H, n", [(2, 8), (3, 20)])
def test_sufficient_margin_changes_sign_at_beta_star(H, n):
    bstar = float(theory.beta_star(H, n))
    for beta, sign in [(0.98 * bstar, 1), (1.02 * bstar, -1)]:
        cell = Cell(H=H, n=n, d=n, beta=beta, init="orthogonal", seeds=1, t_max=0.01, n_samples=2)
        margin = simulate(cell).rd_margin_sufficient.isel(time=0).values
        assert np.all(np.sign(margin) == sign)
    # beta* <= 0 (H=4, n=8): no positive beta satisfies the condition.
    assert theory.beta_star(4, 8) <= 0
    cell = Cell(H=4, n=8, d=8, beta=0.05, init="orthogonal", seeds=1, t_max=0.01, n_samples=2)
    assert (simulate(cell).rd_margin_sufficient.isel(time=0) < 0).all()
