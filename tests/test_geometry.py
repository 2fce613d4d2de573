"""Geometries as declarations (docs/model.md, result 12): the Thm 11 identity with a speed, the equiangular
scalar ODEs and the Pre-LN clustering time, on both engines, each against an independent route."""

import importlib.util

import numpy as np
import pytest
from reference import direction_velocity, head_energies, random_sphere, random_symmetric, velocity

from attnflow import Cell, engine, simulate, theory
from attnflow.contract import ClusterEvent, Controller, Heads, Problem, SaveAt
from attnflow.engine import observe
from attnflow.geometry import GEOMETRIES
from attnflow.tokens import equiangular_tokens

SCHEMES = [g.name for g in GEOMETRIES if g.speed is not None]  # the sphere flows (flat: test_identities)
_HAS_JAX = all(importlib.util.find_spec(name) for name in ("jax", "diffrax", "equinox", "optimistix"))
ENGINES = ["numba"] + (["jax"] if _HAS_JAX else [])


@pytest.fixture(autouse=True, scope="module")
def _quick_compilation():
    """As in test_jax_engine.py: XLA's optimisation passes are half the compilation and move results by
    round-off at most, far below these tolerances."""
    if not _HAS_JAX:
        yield
        return
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


def _solver(name):
    if name == "jax":
        from attnflow import jaxengine

        return jaxengine.solve
    return engine.solve


def _configuration(rng, n, d, geometry):
    """Unit rows on the sphere; rows of radius in [1, 2] where the geometry carries radii."""
    x = random_sphere(rng, n, d)
    return x * rng.uniform(1.0, 2.0, (n, 1)) if GEOMETRIES.get(geometry).radii else x


@pytest.mark.parametrize("geometry", SCHEMES)
def test_thm11_with_a_speed_holds_to_round_off(rng, geometry):
    # Result 12: usa, symmetric M_h = V_h: dE/dt = (1/n) sum_k ||dtheta_k/dt||^2 / s_k, E of the directions.
    n, d, H, beta, alpha = 7, 5, 3, 1.3, 0.7
    for _ in range(3):
        m = random_symmetric(rng, H, d)
        x = _configuration(rng, n, d, geometry)
        o = {k: v[0] for k, v in observe(x[None], m[None], attention="usa", beta=beta, geometry=geometry,
                                         ngpt_alpha=alpha, groups=("energy", "velocity", "positions",
                                                                   "radius")).items()}
        # The independent route: the speed form dtheta_k/dt = s_k P(u_k) of the plain reference.
        theta, theta_dot, s = direction_velocity(x, m, beta, "usa", geometry, alpha=alpha)
        speed_sum = np.mean(np.sum(theta_dot**2, axis=1) / s)
        # Two sums of O(1) terms: a few ulps of their size.
        assert o["energy_rate"].sum() == pytest.approx(speed_sum, rel=1e-12)
        np.testing.assert_allclose(o["x"], theta, rtol=0, atol=1e-15)
        np.testing.assert_allclose(o["kinetic"], np.mean(np.sum(theta_dot**2, axis=1)), rtol=1e-12)
        np.testing.assert_allclose(o["radius"], np.linalg.norm(x, axis=1), rtol=1e-15)
        # And the rate itself by central differences of E(theta) along the flow, O(eps^2) ~ 1e-10.
        eps = 1e-5
        fd = (head_energies(theta + eps * theta_dot, m, beta)
              - head_energies(theta - eps * theta_dot, m, beta)) / (2 * eps)
        np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_both_engines_record_the_speed_identity_at_the_start(rng, engine_name):
    # The same identity on each engine's solve: the first sample is the initial configuration.
    n, d, H, beta, alpha = 6, 4, 2, 1.1, 0.8
    m = random_symmetric(rng, H, d)
    for geometry in SCHEMES:
        x = _configuration(rng, n, d, geometry)
        problem = Problem(x[None], Heads(m[None]), "usa", beta, geometry, ngpt_alpha=alpha)
        result = _solver(engine_name)(problem, Controller(1e-8, 1e-10, 10_000),
                                      SaveAt([0.0, 0.1], ("energy", "velocity", "radius")))
        _, theta_dot, s = direction_velocity(x, m, beta, "usa", geometry, alpha=alpha)
        rate = result.variables["energy_rate"][0, 0].sum()
        assert rate == pytest.approx(np.mean(np.sum(theta_dot**2, axis=1) / s), rel=1e-12), geometry
        np.testing.assert_allclose(result.variables["radius"][0, 0], np.linalg.norm(x, axis=1), rtol=1e-14)
        dx = velocity(x, m, beta, "usa", geometry, alpha=alpha)
        # Radii grow by dr_k/dt = <theta_k, dx_k/dt> (0 on the sphere): over 0.1, to second order.
        r1 = np.linalg.norm(x + 0.1 * dx, axis=1) if GEOMETRIES.get(geometry).radii else np.ones(n)
        np.testing.assert_allclose(result.variables["radius"][0, 1], r1, rtol=0, atol=0.05)


# docs/model.md, result 12: n = 6, d = 8, beta = 1.3, lambda = (1, 0.6), gamma0 = 0.05.
N, D, BETA, LAMBDAS, GAMMA0 = 6, 8, 1.3, np.array([1.0, 0.6]), 0.05


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("geometry", SCHEMES)
def test_equiangular_starts_follow_the_scalar_odes(engine_name, geometry):
    x0 = equiangular_tokens(N, D, GAMMA0)[None]
    t = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    problem = Problem(x0, Heads(diagonal=np.repeat(LAMBDAS[None, :, None], D, axis=2)), "softmax", BETA,
                      geometry, ngpt_alpha=0.7)
    result = _solver(engine_name)(problem, Controller(1e-11, 1e-13, 100_000),
                                  SaveAt(t, ("velocity", "radius")))
    gamma, r = theory.solve_equiangular_scheme(GAMMA0, LAMBDAS, BETA, N, t, geometry, ngpt_alpha=0.7)
    # The particles stay equiangular with one radius; rtol 1e-11 per step over ~10^2 steps of an O(1)
    # contraction: 1e-8 bounds the global error with a margin, and a wrong speed moves gamma by O(0.1).
    np.testing.assert_allclose(result.variables["gamma_mean"][0], gamma, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.variables["gamma_min"][0], gamma, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.variables["radius_mean"][0], r, rtol=1e-8)
    assert np.all(result.variables["radius_spread"][0] < 1e-10)
    rate = theory.equiangular_scheme_rates(gamma, r, LAMBDAS, BETA, N, geometry, 0.7)[0]
    np.testing.assert_allclose(result.variables["gamma_mean_rate"][0], rate, rtol=0, atol=1e-8)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_the_pre_ln_clustering_time_is_the_quadrature(engine_name):
    # T_pre(0.99) = 8.0755298814 and T_post = 2.067354 (docs/model.md, result 12, from particles).
    t_pre = theory.equiangular_scheme_time(GAMMA0, 0.99, LAMBDAS, BETA, N, "pre_ln")
    assert t_pre == pytest.approx(8.0755298814, abs=1e-9)
    assert theory.equiangular_scheme_time(GAMMA0, 0.99, LAMBDAS, BETA, N, "sphere") == pytest.approx(
        2.067354, abs=1e-6)
    assert theory.equiangular_scheme_time(GAMMA0, 0.99, LAMBDAS, BETA, N, "sphere") == pytest.approx(
        float(theory.equiangular_time(GAMMA0, 0.99, LAMBDAS, BETA, N)), rel=1e-10)
    x0 = equiangular_tokens(N, D, GAMMA0)[None]
    problem = Problem(x0, Heads(diagonal=np.repeat(LAMBDAS[None, :, None], D, axis=2)), "softmax", BETA,
                      "pre_ln")
    result = _solver(engine_name)(problem, Controller(1e-11, 1e-13, 100_000), SaveAt(np.linspace(0, 10, 11)),
                                  ClusterEvent("gamma_mean", 0.99))
    # Located by bisection on the dense output at rtol 1e-11: far inside 1e-7.
    assert result.t_cluster[0] == pytest.approx(t_pre, abs=1e-7)


def test_the_stored_clustering_time_of_a_pre_ln_cell_is_the_quadrature():
    # The cell's route (lambda = (1, 0.6) as linear strengths: lambda_bar 0.8, spread 0.25).
    cell = Cell(H=2, n=N, d=D, beta=BETA, attention="softmax", heads="scalar", lambda_dist="linear",
                lambda_bar=0.8, spread=0.25, init="equiangular", gamma0=GAMMA0, geometry="pre_ln", seeds=1,
                t_max=10.0, n_samples=11, rtol=1e-10, atol=1e-12, cluster_metric="gamma_mean",
                cluster_threshold=0.99, observables=["radius"])
    ds = simulate(cell, certify=False)
    np.testing.assert_allclose(ds.lam.values[0], LAMBDAS[::-1], rtol=1e-15)
    t_pre = theory.equiangular_scheme_time(GAMMA0, 0.99, LAMBDAS, BETA, N, "pre_ln")
    assert float(ds.t_cluster[0]) == pytest.approx(t_pre, abs=1e-6)
    assert ds.radius.attrs["units"] == "1" and "||x_i||" in ds.radius.attrs["description"]
    assert float(ds.radius_mean[0, -1]) > 2.0  # the radii grow, about linearly


def test_pre_ln_epsilon_falls_like_t_to_the_minus_two():
    # Result 12: epsilon(t) t^2 -> const (0.614 at t = 500-4000 in the case above); on the scalar ODEs.
    t = np.array([0.0, 500.0, 1000.0, 2000.0, 4000.0])
    gamma, _ = theory.solve_equiangular_scheme(GAMMA0, LAMBDAS, BETA, N, t, "pre_ln", rtol=1e-11, atol=1e-16)
    product = (1.0 - gamma[1:]) * t[1:] ** 2
    np.testing.assert_allclose(product, 0.614, rtol=0.01)


def test_cells_name_their_geometry_and_keep_alpha_only_under_ngpt():
    assert Cell(geometry="pre_ln", ngpt_alpha=2.0).ngpt_alpha == 1.0  # not read: the default
    assert Cell(geometry="ngpt", ngpt_alpha=2.0).ngpt_alpha == 2.0
    assert "ngpt_alpha" not in Cell(geometry="sphere").to_dict()  # existing cells keep their ids
    assert Cell(geometry="ngpt", ngpt_alpha=2.0).to_dict()["ngpt_alpha"] == 2.0
    with pytest.raises(ValueError, match=r"Cell.ngpt_alpha = -1.0: must be > 0"):
        Cell(geometry="ngpt", ngpt_alpha=-1.0)
    with pytest.raises(ValueError, match=r"Cell.geometry = 'torus': must be one of sphere, flat, pre_ln"):
        Cell(geometry="torus")


@pytest.mark.parametrize("geometry", [g for g in GEOMETRIES.names() if GEOMETRIES.get(g).radii])
def test_the_per_step_energy_path_is_refused_where_the_state_carries_radii(geometry):
    """The engines' per-step rates (energy_path) read the state; with radii it is not the directions."""
    with pytest.raises(ValueError, match="energy_path is not recorded under geometry"):
        Cell(geometry=geometry, observables=["energy", "energy_path"])
    Cell(geometry="sphere", observables=["energy", "energy_path"])  # where the state is the directions


def test_identity_values_move_tokens_by_v_equal_to_i(rng):
    # values: identity is V_h = I for every head structure: the cell's heads carry identity value
    # matrices, and the field is the reference's with V_h = I (not M_h).
    cell = Cell(H=2, n=5, d=4, heads="random", values="identity", seeds=1, init="uniform")
    assert cell.values == "identity"
    assert Cell(values="trained").values == "aligned"  # trained values only under trained heads
    from attnflow.heads import head_matrices

    built = head_matrices(cell, cell.seeds)
    np.testing.assert_array_equal(built.values[0], np.broadcast_to(np.eye(4), (2, 4, 4)))
    m = built.score_matrices[0]
    x = random_sphere(rng, 5, 4)
    got = observe(x[None], m[None], attention="softmax", beta=1.2, values=built.values,
                  groups=("velocity",))["kinetic"][0]
    want = velocity(x, m, 1.2, "softmax", "sphere", values=np.broadcast_to(np.eye(4), (2, 4, 4)))
    assert got == pytest.approx(np.mean(np.sum(want**2, axis=1)), rel=1e-12)
    aligned = velocity(x, m, 1.2, "softmax", "sphere")
    assert not np.allclose(want, aligned)  # a different flow
    ds = simulate(cell.replace(t_max=0.5, n_samples=3), certify=False)
    assert ds.attrs["values_source"] == "identity"


@pytest.mark.parametrize("geometry", list(GEOMETRIES.names()))
def test_the_cost_model_prices_every_geometry_above_its_steps(geometry):
    # resources.steps is an upper estimate for every scheme: Pre-LN and Peri-LN slow the directions, so
    # they take fewer steps than the sphere (measured 45-145 against 208-400 on the normalization grid).
    from attnflow import resources

    for init, beta in (("equiangular", 1.3), ("uniform", 4.0)):
        cell = Cell(H=2, n=6, d=8, beta=beta, lambda_dist="linear", lambda_bar=0.8, spread=0.25, gamma0=0.05,
                    init=init, geometry=geometry, t_max=20.0 if geometry == "flat" else 100.0, n_samples=11,
                    sample_spacing="log", seeds=2, observables=["radius"], max_steps=20_000)
        ds = simulate(cell, certify=False)
        assert not ds.failed.any() or geometry == "flat"
        assert resources.steps(cell) >= ds.n_steps.max(), (geometry, init)
        assert resources.recorded_bytes(cell) >= sum(v.nbytes for v in ds.data_vars.values()
                                                     if "time" in v.dims)


def test_the_cost_model_counts_the_value_products():
    from attnflow import resources

    aligned = Cell(H=2, n=8, d=64, heads="scalar")
    identity = aligned.replace(values="identity")
    # V_h = I: a d x d product per head and call, and no integration in the tokens' span
    assert resources.flops_per_call(identity) >= 2 * 2 * 8 * 64 * 64 > resources.flops_per_call(aligned)
    assert resources.head_entries(identity) == resources.head_entries(aligned) + 2 * 64 * 64
