"""Sigmoid attention and causal masking (docs/model.md, results 8-9), and the engine's declared parts.

Every check compares with an independent route: the plain reference of
``tests/reference.py``, scipy's DOP853 on it, finite differences, or an exact
fact of the dynamics.
"""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from reference import (
    random_sphere,
    random_symmetric,
    softplus_energies,
    velocity,
    weight_entropies,
)
from scipy.integrate import solve_ivp

from attnflow import Cell, engine, simulate
from attnflow.attention import ATTENTIONS
from attnflow.contract import Controller, Heads, Problem, SaveAt, check_attention
from attnflow.engine import observe, solve
from attnflow.tableau import DOPRI5, ButcherTableau

ATTENTION_TYPES = ATTENTIONS.names()


def _obs(x, m, beta, attention, geometry="sphere", mask="none"):
    out = observe(x[None], m[None], attention=attention, beta=beta, geometry=geometry, mask=mask)
    return {k: v[0] for k, v in out.items()}


def _along(fn, x, xdot, eps=1e-5):
    """Central difference of ``fn`` along ``xdot``: error O(eps^2 |fn'''|) ~ 1e-10 here."""
    return (fn(x + eps * xdot) - fn(x - eps * xdot)) / (2 * eps)


# --- sigmoid attention (result 8) -----------------------------------------------------------------

@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_sigmoid_is_the_gradient_flow_of_the_softplus_energy(rng, geometry):
    # Result 8: with symmetric M_h and V_h = M_h, dE/dt = (1/n) sum_i ||dx_i/dt||^2 exactly,
    # E_h = sum_ij softplus(beta s_ij - log n) / (2 beta n): n = 7, d = 5, H = 3 as in docs/model.md.
    n, d, H, beta = 7, 5, 3, 1.3
    for m in random_symmetric(rng, 4 * H, d).reshape(4, H, d, d):
        x = random_sphere(rng, n, d)
        o = _obs(x, m, beta, "sigmoid", geometry)
        xdot = velocity(x, m, beta, "sigmoid", geometry)
        kinetic = np.mean(np.sum(xdot**2, axis=1))
        # Sums of O(1) terms: a few ulps of the total.
        assert o["kinetic"] == pytest.approx(kinetic, rel=1e-12)
        assert o["energy_rate"].sum() == pytest.approx(kinetic, rel=1e-12)
        np.testing.assert_allclose(o["energy"], softplus_energies(x, m, beta), rtol=1e-13)
        fd = _along(lambda y, m=m: softplus_energies(y, m, beta), x, xdot)
        np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)


def test_sigmoid_entropy_is_that_of_the_row_normalised_weights(rng):
    n, d, H, beta = 6, 5, 2, 1.7
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    o = _obs(x, m, beta, "sigmoid")
    np.testing.assert_allclose(o["entropy"], weight_entropies(x, m, beta, "sigmoid"), rtol=1e-12)
    xdot = velocity(x, m, beta, "sigmoid")
    fd = _along(lambda y: weight_entropies(y, m, beta, "sigmoid"), x, xdot)
    np.testing.assert_allclose(o["entropy_rate"], fd, rtol=1e-6, atol=1e-9)


def test_sigmoid_energy_with_explicit_value_matrices(rng):
    # V_h != M_h: the head outputs are not the energy's gradient rows; the rate is still the
    # exact derivative of the softplus energy along the flow.
    n, d, H, beta = 6, 5, 2, 1.1
    m = random_symmetric(rng, H, d)
    v = rng.standard_normal((H, d, d)) / 2
    x = random_sphere(rng, n, d)
    out = observe(x[None], m[None], attention="sigmoid", beta=beta, values=v[None])
    xdot = velocity(x, m, beta, "sigmoid", "sphere", v)
    fd = _along(lambda y: softplus_energies(y, m, beta), x, xdot)
    np.testing.assert_allclose(out["energy_rate"][0], fd, rtol=1e-7, atol=1e-9)


# --- causal masking (result 9) --------------------------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTION_TYPES)
def test_masked_trajectories_match_the_reference(attention):
    # scipy's DOP853 at rtol 1e-12 on the plain reference field with the mask. Budget as in
    # test_engine: ~1e-8 from attnflow's tolerances, amplified over t in [0, 3].
    rng = np.random.default_rng(3)
    n, d, H, beta = 6, 5, 2, 1.2
    m = random_symmetric(rng, H, d)
    x0 = random_sphere(rng, n, d)
    cell = Cell(H=H, n=n, d=d, beta=beta, attention=attention, mask="causal", seeds=1, t_max=3.0, n_samples=7,
                rtol=1e-9, atol=1e-11, observables=["positions"])
    ds = simulate(cell, x0=x0, score_matrices=m)
    sol = solve_ivp(lambda _t, y: velocity(y.reshape(n, d), m, beta, attention, mask="causal").ravel(),
                    (0, 3.0), x0.ravel(), method="DOP853", rtol=1e-12, atol=1e-14, t_eval=ds.time.values)
    np.testing.assert_allclose(ds.x.values[0], sol.y.T.reshape(-1, n, d), rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention", ATTENTION_TYPES)
def test_masked_observables_match_the_reference(rng, attention):
    # The energy is a function of the positions (all pairs), its rate the exact derivative along
    # the masked flow; the entropy is that of the attention each token pays (j <= i).
    n, d, H, beta = 6, 5, 2, 0.9
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    o = _obs(x, m, beta, attention, mask="causal")
    xdot = velocity(x, m, beta, attention, mask="causal")
    assert o["kinetic"] == pytest.approx(np.mean(np.sum(xdot**2, axis=1)), rel=1e-12)
    energy = softplus_energies if attention == "sigmoid" else _exp_energies
    fd = _along(lambda y: energy(y, m, beta), x, xdot)
    np.testing.assert_allclose(o["energy_rate"], fd, rtol=1e-7, atol=1e-9)
    entropy_of = "sigmoid" if attention == "sigmoid" else "softmax"
    np.testing.assert_allclose(o["entropy"], weight_entropies(x, m, beta, entropy_of, "causal"), rtol=1e-12,
                               atol=1e-15)
    fd = _along(lambda y: weight_entropies(y, m, beta, entropy_of, "causal"), x, xdot)
    np.testing.assert_allclose(o["entropy_rate"], fd, rtol=1e-6, atol=1e-9)


def _exp_energies(x, m, beta):
    n = x.shape[0]
    return np.array([np.exp(beta * (x @ mh @ x.T)).sum() / (2 * beta * n * n) for mh in m])


@pytest.mark.parametrize("attention", ATTENTION_TYPES)
def test_causal_token_zero_never_moves_with_scalar_heads(attention):
    # With M_h = lambda_h I, token 0 attends only to itself: its velocity is the projection of a
    # multiple of x_0 onto its own tangent space, exactly 0.
    cell = Cell(H=2, n=7, d=5, beta=1.7, attention=attention, mask="causal", seeds=3, t_max=5.0, n_samples=6,
                lambda_dist="linear", spread=0.3, observables=["positions"])
    x = simulate(cell).x.values
    assert np.max(np.abs(x[:, :, 0] - x[:, :1, 0])) <= 1e-15


def test_causal_tokens_converge_to_token_zero():
    # docs/model.md, result 9 (Karagodin, Polyanskiy, Rigollet 2024): n = 7, d = 5, softmax,
    # lambda = 1.3, beta = 1.7, uniform starts: every token within 4e-11 of token 0 at t = 40.
    # Allow 1e-8: the approach is exponential, and the integrator's tolerance sits near 1e-9.
    cell = Cell(H=1, n=7, d=5, beta=1.7, lambda_bar=1.3, mask="causal", seeds=4, t_max=40.0, n_samples=5,
                rtol=1e-10, atol=1e-12, observables=["positions"])
    x = simulate(cell).x.values[:, -1]
    assert np.max(np.linalg.norm(x - x[:, :1], axis=-1)) < 1e-8


def test_mask_breaks_the_energy_identity_and_the_residual_shows_it(rng):
    # usa with V_h = M_h is a gradient flow unmasked (residual at round-off); masked it is not.
    n, d, H, beta = 7, 5, 3, 1.3
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    plain = _obs(x, m, beta, "usa")
    masked = _obs(x, m, beta, "usa", mask="causal")
    assert abs(plain["energy_rate"].sum() - plain["kinetic"]) < 1e-12 * plain["kinetic"]
    assert abs(masked["energy_rate"].sum() - masked["kinetic"]) > 1e-3 * masked["kinetic"]


# --- the engine's parts ---------------------------------------------------------------------------

def test_a_declaration_without_its_compiled_branch_is_refused_by_name(rng):
    x = random_sphere(rng, 4, 3)[None]
    m = random_symmetric(rng, 1, 3)[None]
    for rule in ("weights", "energy", "entropy"):
        mystery = dataclasses.replace(ATTENTIONS.get("softmax"), name="mystery", **{rule: 99})
        with pytest.raises(NotImplementedError, match="attention 'mystery' declares .* rule 99"):
            check_attention("numba", engine.KERNELS, mystery)
        with pytest.raises(NotImplementedError, match="'mystery'"):
            solve(Problem(x, Heads(m), mystery, 1.0), Controller(1e-6, 1e-9, 100),
                  SaveAt(np.array([0.0, 1.0])))


def test_registering_a_declaration_without_its_kernel_fails_at_import():
    # A new entry in the registry, before the engine is imported: the import itself refuses it.
    code = (
        "import dataclasses\n"
        "from attnflow.attention import ATTENTIONS, Weights\n"
        "ATTENTIONS._items['tanh'] = dataclasses.replace(ATTENTIONS.get('softmax'), name='tanh', weights=7)\n"
        "import attnflow.engine\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "attention 'tanh' declares int rule 7, which has no kernel in engine 'numba'" in run.stderr


@pytest.mark.parametrize("kind, member", [("head form", "DENSE"), ("clustering metric", "GAMMA_MEAN")])
def test_a_head_form_or_metric_without_its_compiled_branch_is_refused(monkeypatch, kind, member):
    # The compiled head_rows and criterion_value have no default branch either: the check the
    # engine runs at import refuses a code whose branch is not listed as compiled.
    table = {"head form": "COMPILED_FORMS", "clustering metric": "COMPILED_METRICS"}[kind]
    monkeypatch.setattr(engine, table, frozenset(x for x in getattr(engine, table) if x.name != member))
    with pytest.raises(NotImplementedError, match=rf"engine 'numba': {kind} \['{member}'\] has no compiled "
                                                  "branch"):
        engine.check_declarations()


def test_borrowed_views_share_the_data_and_carry_no_owner():
    import numba

    from attnflow.engine.machinery.borrow import borrow

    @numba.njit
    def write_through(a, record):
        views = borrow((a, record))
        views[0][1] = 5.0
        views[1][0][0] = 7.0
        return views[1][1]

    a, b = np.zeros(3), np.zeros(2)
    assert write_through(a, (b, 3)) == 3
    assert a[1] == 5.0 and b[0] == 7.0


# Cash & Karp (1990): 5th-order weights with a 4th-order embedded pair; not FSAL. Its dense
# output here is linear (degree 1), so samples are taken only at step ends below.
_CK_B5 = np.array([37 / 378, 0, 250 / 621, 125 / 594, 0, 512 / 1771])
_CK_B4 = np.array([2825 / 27648, 0, 18575 / 48384, 13525 / 55296, 277 / 14336, 1 / 4])
CASH_KARP = ButcherTableau(
    name="Cash-Karp 5(4)",
    a=np.array([
        [0, 0, 0, 0, 0, 0],
        [1 / 5, 0, 0, 0, 0, 0],
        [3 / 40, 9 / 40, 0, 0, 0, 0],
        [3 / 10, -9 / 10, 6 / 5, 0, 0, 0],
        [-11 / 54, 5 / 2, -70 / 27, 35 / 27, 0, 0],
        [1631 / 55296, 175 / 512, 575 / 13824, 44275 / 110592, 253 / 4096, 0],
    ]),
    b=_CK_B5, c=np.array([0, 1 / 5, 3 / 10, 3 / 5, 1, 7 / 8]), e=_CK_B5 - _CK_B4, dense=_CK_B5[:, None],
    order=5, error_order=4, fsal=False,
)


def test_a_tableau_without_fsal_integrates_correctly():
    # Fixed steps, flat geometry: Cash-Karp's global error falls as h^5 against DOP853 at
    # rtol 1e-13 (an FSAL loop would reuse a stage that is not f(y_new) and lose the order).
    from test_engine import fixed_step_convergence

    slope, runs = fixed_step_convergence(CASH_KARP)
    for r in runs:  # six stages per step, none reused: 6 per step, the initial field and none else
        assert r.n_rhs_calls[0] == 6 * r.n_steps[0] + 1
    assert slope == pytest.approx(5.0, abs=0.3)
    rng = np.random.default_rng(1)
    n, d, H, beta = 5, 4, 2, 0.7
    m = random_symmetric(rng, H, d)
    x0 = random_sphere(rng, n, d)
    t = np.array([0.0, 2.0])
    # Adaptive: the same end point as Dormand-Prince at the same tolerance, to its budget.
    problem = Problem(x0[None], Heads(m[None]), "softmax", beta)
    ends = [solve(problem, Controller(1e-10, 1e-12, 10_000), SaveAt(t, ("positions",)),
                  tableau=tab).variables["x"][0, -1]
            for tab in (CASH_KARP, DOPRI5)]
    np.testing.assert_allclose(ends[0], ends[1], rtol=0, atol=1e-8)


def test_variants_reduction_reads_the_statements():
    # The experiment's reduction on two cells with known answers: usa unmasked is a gradient flow
    # (residual at round-off, total energy never falls); softmax under a causal mask with scalar
    # heads ends on token 0's starting point.
    from attnflow.experiments.variants import EXPERIMENT

    base = dict(H=2, n=6, d=5, lambda_dist="linear", spread=0.5, seeds=4, n_samples=21, rtol=1e-10,
                atol=1e-12, observables=list(EXPERIMENT.observables))
    usa = EXPERIMENT.reduce(simulate(Cell(attention="usa", beta=1.0, t_max=5.0, heads="random", **base)))
    # Sums of O(n^2) terms of O(1): round-off is far below 1e-10 of the kinetic term.
    assert float(usa.energy_residual) < 1e-10
    assert float(usa.frac_total_monotone) == 1.0
    causal = EXPERIMENT.reduce(simulate(Cell(mask="causal", beta=2.0, t_max=60.0, **base)))
    assert float(causal.distance_from_token0) < 1e-6
    plain = EXPERIMENT.reduce(simulate(Cell(beta=2.0, t_max=60.0, **base)))
    assert float(plain.distance_from_token0) > 1e-2


# --- defects found by a hostile review, each pinned ------------------------------------------------

def test_exp_saturates_to_inf_instead_of_wrapping_the_sign_bit():
    from attnflow.engine.machinery.expo import exp_inplace

    a = np.array([709.0, 711.0, 720.0, 1e4])
    exp_inplace(a)
    assert a[0] == pytest.approx(np.exp(709.0), rel=1e-15)
    assert np.all(np.isposinf(a[1:]))


def test_sigmoid_weights_vanish_for_very_negative_scores_in_flat_space():
    # log n - beta s = 720: the weight is sigma(-720) = 0, not 1 (a wrapped exp gave 1).
    x = np.array([[np.sqrt(720.0)], [-np.sqrt(720.0)]])
    m = np.ones((1, 1, 1))
    o = _obs(x, m, 1.0, "sigmoid", geometry="flat")
    xdot = velocity(x, m, 1.0, "sigmoid", geometry="flat")
    assert o["kinetic"] == pytest.approx(np.mean(np.sum(xdot**2, axis=1)), rel=1e-12)


def test_usa_too_stiff_to_start_fails_its_seeds_by_name():
    # beta ||M|| = 400 is admitted (exp(400) is finite), but the field's squared norm is not: the
    # seeds fail, recorded (step size underflow at t = 0), not as a SystemError from the compiled code.
    ds = simulate(Cell(H=2, n=5, d=4, beta=400.0, attention="usa", seeds=1, t_max=2.0))
    assert ds.failed.values.tolist() == [True] and ds.t_failed.values.tolist() == [0.0]
    assert "step size underflow" in ds.attrs["seed_failures"]


def test_the_sample_times_must_be_increasing_with_two_times():
    for t in (np.array([0.0]), np.array([0.0, 1.0, 1.0])):
        with pytest.raises(ValueError, match="^SaveAt.times: needs at least two strictly increasing"):
            SaveAt(t)


@pytest.mark.parametrize("attention", ["relu", "usa", "sigmoid"])
def test_a_declaration_that_normalises_any_rule_gets_its_energy_right(rng, attention):
    # Rules combine: a declaration may normalise relu, exp or sigmoid rows. The field then divides
    # each head output by its row sum, and the energy rate stays the exact derivative of the
    # declared energy along that flow (no fast path may assume normalised == softmax).
    kind = dataclasses.replace(ATTENTIONS.get(attention), name=f"{attention}_normalised", normalised=True,
                               velocity_over_n=False)
    n, d, H, beta = 6, 5, 2, 0.8
    m = random_symmetric(rng, H, d)
    x = random_sphere(rng, n, d)
    o = observe(x[None], m[None], attention=kind, beta=beta)
    outputs = []
    for mh in m:
        s = x @ mh @ x.T
        w = {"relu": np.maximum(beta * s, 0.0) / n, "usa": np.exp(beta * s),
             "sigmoid": 1.0 / (1.0 + np.exp(np.log(n) - beta * s))}[attention]
        outputs.append((w / w.sum(axis=1, keepdims=True)) @ (x @ mh))
    v = sum(outputs)
    xdot = v - np.sum(v * x, axis=1, keepdims=True) * x
    assert o["kinetic"][0] == pytest.approx(np.mean(np.sum(xdot**2, axis=1)), rel=1e-12)
    energy = softplus_energies if attention == "sigmoid" else _exp_energies
    fd = _along(lambda y: energy(y, m, beta), x, xdot)
    np.testing.assert_allclose(o["energy_rate"][0], fd, rtol=1e-7, atol=1e-9)


def test_stores_describe_the_energy_and_entropy_they_hold():
    cell = Cell(H=1, n=4, d=3, attention="sigmoid", seeds=1, t_max=1.0, n_samples=3)
    ds = simulate(cell)
    assert "softplus" in ds.energy.attrs["description"]
    assert "row-normalised weights sigma" in ds.entropy.attrs["description"]
    assert "exp(beta" in simulate(cell.replace(attention="usa")).energy.attrs["description"]


@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
def test_the_certificate_reruns_the_same_masked_flow(attention):
    # The certificate's tighter rerun must integrate the cell's own flow, mask included: an
    # unmasked rerun would differ by O(1) and certify nothing.
    cell = Cell(H=2, n=6, d=5, attention=attention, mask="causal", seeds=2, t_max=5.0, n_samples=11)
    assert simulate(cell).attrs["certificate_error"] < 1e-3


def test_thm11_residual_is_judged_against_its_round_off_bound_per_run():
    # At beta = 4 with random heads the heads' outputs are almost radial and usa's residual reaches
    # 1e-11 to 1e-10 (10^-9.8 over the default grid's 16 seeds): float64 round-off of a rate whose
    # terms are |f|^2 against a tangential part far smaller, not a failure of Thm 11. Each run's bound
    # (n + d) eps R, R the radial-to-tangential ratio, holds the gradient flows' residuals (with
    # room: the k-term summation bound is a worst case) and no other's: softmax and a causal mask
    # break the identity by O(1), 12 orders of magnitude above any bound here.
    from attnflow.experiments.variants import EXPERIMENT

    base = dict(H=2, n=8, d=8, lambda_dist="linear", spread=0.5, seeds=4, t_max=20.0, n_samples=41,
                heads="random", beta=4.0, observables=list(EXPERIMENT.observables))
    usa = EXPERIMENT.reduce(simulate(Cell(attention="usa", **base)))
    assert 1e-13 < float(usa.energy_residual) < float(usa.energy_residual_bound) < 1e-8
    assert float(usa.energy_residual_excess) <= 1.0  # every seed within its own bound
    sigmoid = EXPERIMENT.reduce(simulate(Cell(attention="sigmoid", **base)))
    assert float(sigmoid.energy_residual_excess) <= 1.0
    for kwargs in ({"attention": "softmax"}, {"attention": "usa", "mask": "causal"}):
        other = EXPERIMENT.reduce(simulate(Cell(**kwargs, **base)))
        assert float(other.energy_residual_excess) > 1e6, kwargs


def test_thm11_residual_at_d_1_is_nan_and_says_why():
    # On the sphere at d = 1 the tokens sit at +-1: no tangent space, K = 0, the residual 0/0 in every
    # cell. The summary's residual variables say so instead of holding a silent NaN.
    from attnflow.experiments import Spec
    from attnflow.experiments.variants import EXPERIMENT

    cell = Cell(attention="usa", H=2, n=2, d=1, beta=1.0, seeds=2, t_max=2.0, n_samples=5,
                observables=list(EXPERIMENT.observables))
    reduced = EXPERIMENT.reduce(simulate(cell))
    assert np.isnan(float(reduced.energy_residual)) and np.isnan(float(reduced.energy_residual_bound))
    spec = Spec("variants", {**EXPERIMENT.defaults["fixed"], "n": 2, "d": 1}, {}, ())
    derived = EXPERIMENT.derive(reduced, spec)
    for var in ("energy_residual", "energy_residual_bound", "energy_residual_excess"):
        assert "undefined at d = 1" in derived[var].attrs["comment"]
    spec = Spec("variants", {**EXPERIMENT.defaults["fixed"], "d": 8}, {}, ())
    assert "comment" not in EXPERIMENT.derive(EXPERIMENT.reduce(simulate(dataclasses.replace(cell, d=8))),
                                              spec).energy_residual.attrs


def test_export_says_whether_each_line_holds_thm11_to_round_off():
    import xarray as xr

    from attnflow.experiments import Spec
    from attnflow.experiments.variants import EXPERIMENT

    grid = {"heads": ["random"], "attention": ["usa", "softmax"], "mask": ["none"], "beta": [1.0, 4.0]}
    dims = tuple(grid)
    excess = np.array([[[[0.1, 0.9]], [[1e13, 1e14]]]])  # usa within its bound at both betas; softmax not
    ones = np.ones(excess.shape)
    summary = xr.Dataset({"energy_residual_excess": (dims, excess), "energy_residual": (dims, 1e-11 * excess),
                          "frac_total_monotone": (dims, ones), "frac_heads_monotone": (dims, ones)},
                         coords=grid, attrs={"experiment": "variants", "experiment_spec": Spec(
                             "variants", EXPERIMENT.defaults["fixed"], grid, ()).to_json()})
    df = EXPERIMENT.export_table(summary).set_index("attention")
    assert df.loc["usa", "energy_residual_roundoff"] == 1.0
    assert df.loc["softmax", "energy_residual_roundoff"] == 0.0
