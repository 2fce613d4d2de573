"""The JAX engine (attnflow.jaxengine) against the numba engine: the same cells, every recorded variable.

CPU JAX; skipped where jax, diffrax or equinox is not installed. Each distinct combination of
rules is one jit compilation (seconds each), so the default matrix is a pairwise covering of
attention type x mask x head form x geometry (12 cells: every pair of levels of any two factors
appears); ATTNFLOW_JAX_FULL_MATRIX=1 runs the whole product (48 cells).
"""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("diffrax")
pytest.importorskip("equinox")

import jax  # noqa: E402

from attnflow import engine, jaxengine  # noqa: E402
from attnflow.attention import ATTENTIONS, MASKS  # noqa: E402
from attnflow.contract import ClusterEvent, Controller, Heads, Problem, SaveAt  # noqa: E402
from attnflow.geometry import GEOMETRIES  # noqa: E402
from attnflow.observables import GROUPS  # noqa: E402

ATTENTION_NAMES = list(ATTENTIONS.names())
MASK_NAMES = list(MASKS.names())
FORMS = ["diagonal", "dense", "factored"]
GEOMETRY_NAMES = list(GEOMETRIES.names())
ALL_GROUPS = tuple(GROUPS.names())
RTOL, ATOL = 1e-10, 1e-12
# Both engines hold each step's local error to atol + rtol |y| (the same norm and controller) but take
# different steps (their own first step, the retraction, diffrax's event handling), so a sample differs
# by the sum of the two global errors: ~10^2 steps of local error rtol, grown by the flow's Lipschitz
# constant (beta ||M_h|| <= 1) over t <= 6. 1000 rtol of the variable's scale bounds that with a margin,
# and is far below what a modelling slip (a missing 1/n, a wrong mask, a sign) would move, O(1e-2).
AGREE = 1e3 * RTOL


@pytest.fixture(autouse=True, scope="module")
def _quick_compilation():
    """Compilation is most of this file's time (one per cell: each has its own rules), and XLA's
    optimisation passes half of that (measured); they fuse and schedule the same operations, moving
    results by round-off at most, far below these tolerances. For this file only."""
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


def _covering():
    """(attention, mask, form, geometry): every attention type with every form; the mask and the sphere
    and flat geometries alternate so that every pair of levels of any two of these factors appears once
    at least; then each other geometry once, each with another attention type, mask and form."""
    cases = []
    for a, f in itertools.product(range(len(ATTENTION_NAMES)), range(len(FORMS))):
        geometry = ("sphere", "flat")[(a // 2 + f) % 2]
        cases.append((ATTENTION_NAMES[a], MASK_NAMES[(a + f) % 2], FORMS[f], geometry))
    for k, geometry in enumerate(g for g in GEOMETRY_NAMES if g not in ("sphere", "flat")):
        cases.append((ATTENTION_NAMES[k % len(ATTENTION_NAMES)], MASK_NAMES[k % 2], FORMS[k % len(FORMS)],
                      geometry))
    return cases


CASES = (list(itertools.product(ATTENTION_NAMES, MASK_NAMES, FORMS, GEOMETRY_NAMES))
         if os.environ.get("ATTNFLOW_JAX_FULL_MATRIX") == "1" else _covering())


def _heads(rng, form, B, H, d):
    """Positive definite heads (so cells on the sphere cluster) in ``form``; the dense form shared by the
    batch (a leading axis of 1), the others one per seed."""
    def eigen(S):
        return rng.uniform(0.3, 1.0, (S, H, d))
    if form == "diagonal":
        return Heads(diagonal=eigen(B))
    q = np.linalg.qr(rng.standard_normal((B, H, d, d)))[0]
    if form == "dense":
        e = eigen(1)
        return Heads(score_matrices=np.einsum("shdk,shk,shek->shde", q[:1], e, q[:1]))
    r = d // 2  # factored form applies when r <= d/2
    return Heads(factors=(np.ascontiguousarray(q[..., :r]), eigen(B)[..., :r]))


def _cell(index, attention, mask, form, geometry):
    rng = np.random.default_rng(1000 + index)
    B, n, d, H = 2, 4, 4, 2
    x0 = rng.standard_normal((B, n, d))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    t_max = 0.25 if geometry == "flat" else 6.0  # flat usa blows up in finite time (t ~ 0.4 in one of these)
    t_eval = (np.linspace(0.0, t_max, 7) if index % 2 == 0
              else np.concatenate([[0.0], np.geomspace(1e-2, t_max, 6)]))
    problem = Problem(x0, _heads(rng, form, B, H, d), attention, 1.0, geometry, mask)
    # half the cells stop at the criterion (both spacings, both geometries): a run that does not stop
    # compiles a second solve, which locates t_cluster after the samples
    event = ClusterEvent("gamma_mean" if index % 3 == 0 else "epsilon", 0.7 if index % 3 == 0 else 0.3,
                         stop=index % 4 in (0, 3))
    return problem, Controller(RTOL, ATOL, 100_000), SaveAt(t_eval, ALL_GROUPS), event


def _gradient_flow(attention, mask):
    return ATTENTIONS.get(attention).gradient_flow and not MASKS.get(mask).masked


@pytest.mark.parametrize("index, case", list(enumerate(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_jax_engine_agrees_with_numba(index, case):
    attention, mask, form, geometry = case
    problem, controller, saveat, event = _cell(index, *case)
    ours = jaxengine.solve(problem, controller, saveat, event, in_span=False)
    theirs = engine.solve(problem, controller, saveat, event, in_span=False)
    assert ours.form == theirs.form == form
    assert set(ours.variables) == set(theirs.variables) == {v.name for g in GROUPS for v in g.variables}
    scale = lambda a: 1.0 + np.max(np.abs(a), initial=0.0, where=np.isfinite(a))  # noqa: E731
    # t_cluster: both NaN or both located to the samples' agreement (the metric moves at O(1) rates).
    assert np.array_equal(np.isnan(ours.t_cluster), np.isnan(theirs.t_cluster))
    np.testing.assert_allclose(ours.t_cluster, theirs.t_cluster, rtol=0, atol=AGREE * scale(theirs.t_cluster))
    # The JAX engine stops at t_cluster, the numba engine at the end of that step: the samples the JAX
    # engine reached are the numba engine's up to there.
    reached = ~np.isnan(ours.variables["gamma_mean"])
    assert np.all(~np.isnan(theirs.variables["gamma_mean"])[reached])
    if event.stop:
        np.testing.assert_array_equal(ours.t_stop, np.where(np.isnan(ours.t_cluster), saveat.times[-1],
                                                            ours.t_cluster))
    else:
        assert reached.all()
    per_step = {v.name for v in GROUPS.get("energy_path").variables}
    for name, value in ours.variables.items():
        other = theirs.variables[name][reached]
        if name in per_step:  # each engine's least rate over its own steps: below its samples' rates
            for result in (ours, theirs):
                least, rate = result.variables[name][reached], result.variables["energy_rate"][reached]
                assert np.all(least <= rate), name
                at_start = result.variables[name][:, 0], result.variables["energy_rate"][:, 0]
                np.testing.assert_array_equal(*at_start, err_msg=name)  # no step before sample 0
        elif value.dtype.kind == "i":
            np.testing.assert_array_equal(value[reached], other, err_msg=name)
            assert np.all(value[~reached] == -1)
        else:
            np.testing.assert_allclose(value[reached], other, rtol=0, atol=AGREE * scale(other), err_msg=name)
            assert np.all(np.isnan(value[~reached]))
    for result in (ours, theirs):
        if GEOMETRIES.get(geometry).unit_rows:  # the tokens (directions) stay on the sphere to round-off
            norms = np.linalg.norm(result.variables["x"][reached], axis=-1)
            np.testing.assert_allclose(norms, 1.0, rtol=0, atol=1e-12)
            assert np.all(result.norm_drift <= 1e-12)
        if _gradient_flow(attention, mask) and geometry in ("sphere", "flat"):  # speed 1 (result 12)
            # Thm 11 (usa) and result 8 (sigmoid): sum_h dE_h/dt = (1/n) sum_i ||dx_i/dt||^2 at every
            # sample, two sums of O(1) terms: a few ulps of their size.
            total = np.nansum(result.variables["energy_rate"], axis=-1)[reached]
            kinetic = result.variables["kinetic"][reached]
            np.testing.assert_allclose(total, kinetic, rtol=1e-12, atol=1e-14)


def test_undeclared_rule_is_refused_by_name(monkeypatch):
    from attnflow.attention import Weights
    from attnflow.jaxengine import field

    with pytest.raises(NotImplementedError, match="SIGMOID"):
        field.kernel({}, Weights.SIGMOID, "weight rule")
    monkeypatch.delitem(field.WEIGHTS, Weights.SIGMOID)
    with pytest.raises(NotImplementedError, match="engine 'jax' has no weight rule kernel for 'SIGMOID'"):
        jaxengine.check_declarations()


def test_attnflow_runs_without_jax(tmp_path):
    # With jax, diffrax and equinox unimportable, attnflow imports, the numba engine simulates, and
    # the JAX engine says what to install.
    script = (
        "import sys\n"
        "for name in ('jax', 'diffrax', 'equinox', 'optimistix'): sys.modules[name] = None\n"
        "import attnflow, attnflow.simulation, attnflow.jaxengine as j\n"
        "assert not j.available() and not j.gpu_visible()\n"
        "try:\n    j.solve(None, None, None)\n"
        "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "pip install 'attnflow[jax]'" in out.stdout


def test_simulate_runs_a_cell_on_the_engine_it_names():
    from attnflow import Cell, simulate

    cell = Cell(n=4, d=4, H=2, seeds=2, heads="random", t_max=2.0, n_samples=5, rtol=RTOL, atol=ATOL)
    ours, theirs = simulate(cell.replace(engine="jax")), simulate(cell)
    assert ours.attrs["engine"] == "jax" and theirs.attrs["engine"] == "numba"
    assert ours.attrs["cell_engine"] == "jax" and "cell_engine" not in theirs.attrs
    for name in ("gamma_mean", "energy", "entropy_rate", "rd_margin"):
        np.testing.assert_allclose(ours[name].values, theirs[name].values, rtol=0,
                                   atol=AGREE * (1.0 + np.abs(theirs[name].values).max()), err_msg=name)
    # the certificate reruns on the cell's engine, at 100x tighter tolerances
    assert ours.attrs["certificate_error"] < 1e-6


def test_samples_measured_in_chunks_agree_with_all_at_once(monkeypatch):
    # On a CPU the samples are measured a cache-sized chunk at a time (jaxengine.integrate._sample_bytes):
    # 3 of 7 (two full chunks and a remainder of 1) against all 7 at once. The same arithmetic, vectorised
    # over other shapes by XLA: the sums may differ in their last bits, far below a modelling slip.
    chunk = 3
    from attnflow.jaxengine import integrate

    problem, controller, saveat, _ = _cell(0, "softmax", "none", "dense", "sphere")
    B, n, d = problem.x0.shape
    per_sample = 8 * B * 2 * n * (8 * n + 4 * d)  # integrate's estimate, H = 2
    # Two groups (one reads the field) and a stop never reached (no second solve to locate t_cluster):
    # the smallest program that measures, two jit compilations of it.
    saveat = SaveAt(saveat.times, ("cosines", "energy"))
    never = ClusterEvent("gamma_mean", 2.0, stop=True)

    def solve(budget):
        monkeypatch.setattr(integrate, "_sample_bytes", lambda: budget)
        integrate.batch_solver.cache_clear()  # the chunk is fixed where the solver is traced
        return jaxengine.solve(problem, controller, saveat, never)

    whole, chunked = solve(2 ** 40), solve(chunk * per_sample)
    integrate.batch_solver.cache_clear()
    assert np.isfinite(whole.variables["energy"]).all()  # every sample reached and measured
    for name, value in whole.variables.items():
        if value.dtype.kind == "i":
            np.testing.assert_array_equal(chunked.variables[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(chunked.variables[name], value, rtol=0,
                                       atol=1e-13 * (1.0 + np.nanmax(np.abs(value))), err_msg=name)


def test_both_engines_take_no_step_longer_than_max_step():
    """Controller.max_step (the certificate's capped companion): a loose tolerance would take a few long
    steps; capped, every step is at most the cap, so the accepted steps cover [0, t] in at least t / cap,
    on both engines, and the capped runs agree with each other."""
    from attnflow import Cell
    from attnflow.heads import head_matrices
    from attnflow.tokens import initial_tokens

    cell = Cell(n=4, d=4, H=2, seeds=2, heads="random", t_max=4.0, n_samples=5)
    problem = Problem(initial_tokens(cell, cell.seeds), Heads(head_matrices(cell, cell.seeds).score_matrices),
                      "softmax", 1.0)
    saveat = SaveAt(np.linspace(0.0, 4.0, 5), ("cosines",))
    cap = 0.05
    runs = {}
    for name, solve in (("numba", engine.solve), ("jax", jaxengine.solve)):
        free = solve(problem, Controller(1e-4, 1e-7, 10_000), saveat)
        capped = solve(problem, Controller(1e-4, 1e-7, 10_000, max_step=cap), saveat)
        assert np.all(free.n_steps < 4.0 / cap / 2), (name, free.n_steps)  # the cap binds
        assert np.all(capped.n_steps >= 4.0 / cap), (name, capped.n_steps)
        runs[name] = capped.variables["gamma_mean"]
    np.testing.assert_allclose(runs["jax"], runs["numba"], rtol=0, atol=1e-6)
