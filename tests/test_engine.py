"""The compiled engine against independent routes: scipy, mpmath, closed forms."""

import math

import numpy as np
import pytest
from reference import random_sphere, random_symmetric, velocity
from scipy.integrate import solve_ivp

from attnflow import Cell, simulate, theory
from attnflow.contract import ClusterEvent, Controller, Heads, Problem, SaveAt
from attnflow.engine import observe, solve
from attnflow.engine.machinery.expo import exp_inplace
from attnflow.engine.measure import Group
from attnflow.observables import GROUPS
from attnflow.tableau import DOPRI5, ButcherTableau


def _reference(x0, m, beta, attention, t, geometry="sphere", values=None, rtol=1e-12):
    n, d = x0.shape
    sol = solve_ivp(lambda _t, y: velocity(y.reshape(n, d), m, beta, attention, geometry, values).ravel(),
                    (0, t[-1]), x0.ravel(), method="DOP853", rtol=rtol, atol=1e-14, t_eval=t)
    return sol.y.T.reshape(-1, n, d)


def test_exp_within_one_ulp_of_the_correctly_rounded_value():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-700, 600, 3000), rng.uniform(-1, 1, 1000), [0.0, -1e-300, 1e-12]])
    got = x.copy()
    exp_inplace(got)
    exact = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x])
    assert np.max(np.abs(got - exact) / np.spacing(exact)) <= 1.0


def test_exp_in_vectors_and_one_entry_at_a_time_agree_bit_for_bit():
    # The loop runs in vectors of 8 (wide_vectors) with a scalar tail: the same arithmetic, so an
    # entry's exp may not depend on whether it fell in a vector or in the tail.
    x = np.random.default_rng(4).uniform(-700, 700, 1003)
    whole = x.copy()
    exp_inplace(whole)
    one_by_one = x.copy()
    for j in range(x.size):
        exp_inplace(one_by_one[j:j + 1])
    assert np.array_equal(whole, one_by_one)


def test_wide_vectors_mark_the_function_for_512_bit_registers():
    import llvmlite.binding as llvm
    import numba

    from attnflow.engine.machinery.expo import WIDE_VECTORS, wide_vectors

    @numba.njit(fastmath={"contract"})
    def axpy(a, b):
        wide_vectors()
        for j in range(a.size):
            a[j] = 2.0 * a[j] + b[j]

    a = np.ones(64)
    axpy(a, a.copy())
    assert np.all(a == 3.0)
    (ir,) = axpy.inspect_llvm().values()
    assert WIDE_VECTORS in ir
    if llvm.get_host_cpu_features().get("avx512f"):  # then the loop must run in zmm registers
        (asm,) = axpy.inspect_asm().values()
        assert "zmm" in asm


def test_tableau_checks_its_own_consistency():
    assert DOPRI5.order == 5 and DOPRI5.error_order == 4
    broken = dict(name="x", a=DOPRI5.a.copy(), b=DOPRI5.b, c=DOPRI5.c, e=DOPRI5.e, dense=DOPRI5.dense,
                  order=5, error_order=4)
    broken["a"][3, 1] += 1e-3
    with pytest.raises(ValueError, match="rows of a do not sum to c"):
        ButcherTableau(**broken)
    with pytest.raises(ValueError, match="weights b sum"):
        ButcherTableau(**{**broken, "a": DOPRI5.a, "b": DOPRI5.b * 1.01})
    with pytest.raises(ValueError, match="error weights e sum"):
        ButcherTableau(**{**broken, "a": DOPRI5.a, "e": DOPRI5.e + 1e-6})


def test_group_flags_follow_the_declarations():
    assert [g.name.lower() for g in Group] == list(GROUPS.names())


def fixed_step_convergence(tableau=DOPRI5):
    """Fixed steps, flat geometry (no retraction): (slope of log error against log h, the runs).

    The reference is scipy's DOP853 at rtol 1e-13 (errors here are >= 1e-11).
    """
    rng = np.random.default_rng(1)
    n, d, H, beta = 5, 4, 2, 0.7
    m = random_symmetric(rng, H, d)
    x0 = random_sphere(rng, n, d)
    t = np.array([0.0, 2.0])
    ref = _reference(x0, m, beta, "softmax", t, geometry="flat", rtol=1e-13)[-1]
    steps = np.array([0.2, 0.1, 0.05, 0.025])
    problem = Problem(x0[None], Heads(m[None]), "softmax", beta, geometry="flat")
    runs = [solve(problem, Controller(1, 1, 10_000, fixed_step=h), SaveAt(t, ("positions",)), tableau=tableau)
            for h in steps]
    errors = [np.max(np.abs(r.variables["x"][0, -1] - ref)) for r in runs]
    return np.polyfit(np.log(steps), np.log(errors), 1)[0], runs


def test_convergence_order_is_five():
    # The global error of a 5th-order method falls as h^5: slope 5. Pre-asymptotic terms
    # at h = 0.2 move it by < 0.3.
    slope, _ = fixed_step_convergence()
    assert slope == pytest.approx(5.0, abs=0.3)


@pytest.mark.parametrize("attention", ["softmax", "relu", "usa"])
def test_positions_agree_with_scipy_dop853(attention):
    # scipy's DOP853 at rtol 1e-12 on the plain reference field. attnflow at rtol
    # 1e-9 must agree to 1e-6: the budget is ~1e-8 from the tolerances, amplified by
    # the flow's Lipschitz constant over t in [0, 5]; relu's kink at s = 0 costs
    # accuracy where a score changes sign (seen: 1.5e-7 for relu, ~1e-9 for the others).
    rng = np.random.default_rng(7)
    n, d, H, beta = 6, 5, 2, 1.5
    m = random_symmetric(rng, H, d)
    x0 = random_sphere(rng, n, d)
    cell = Cell(H=H, n=n, d=d, beta=beta, attention=attention, seeds=1, t_max=5.0, n_samples=11,
                rtol=1e-9, atol=1e-11, observables=["positions"])
    ds = simulate(cell, x0=x0, score_matrices=m)
    np.testing.assert_allclose(ds.x.values[0], _reference(x0, m, beta, attention, ds.time.values),
                               rtol=0, atol=1e-6)


def test_explicit_value_matrices_agree_with_scipy():
    # V_h != M_h takes a separate path in the field (its own value rows).
    rng = np.random.default_rng(11)
    n, d, H, beta = 5, 4, 3, 0.8
    m = random_symmetric(rng, H, d)
    v = rng.standard_normal((H, d, d)) / 2
    x0 = random_sphere(rng, n, d)
    cell = Cell(H=H, n=n, d=d, beta=beta, seeds=1, t_max=3.0, n_samples=7, rtol=1e-9, atol=1e-11,
                observables=["positions"])
    ds = simulate(cell, x0=x0, score_matrices=m, value_matrices=v)
    ref = _reference(x0, m, beta, "softmax", ds.time.values, values=v)
    # Same budget as above: tolerances ~1e-9, amplified over t in [0, 3].
    np.testing.assert_allclose(ds.x.values[0], ref, rtol=0, atol=1e-6)


def test_head_forms_agree():
    # Diagonal heads go through scalings, factored heads through their factors, the
    # rest through dense products: the same field to round-off.
    rng = np.random.default_rng(5)
    n, d, H, r = 6, 8, 2, 3
    x = random_sphere(rng, n, d)[None]
    u = np.linalg.qr(rng.standard_normal((H, d, r)))[0]
    e = rng.uniform(-1, 1, (H, r))
    m = np.einsum("hdr,hr,her->hde", u, e, u)
    dense = observe(x, m[None], attention="softmax", beta=1.3)
    factored = observe(x, attention="softmax", beta=1.3, factors=(u[None], e[None]))
    diag = rng.uniform(0.5, 1.5, (H, d))
    as_diag = observe(x, diagonal=diag[None], attention="relu", beta=1.3)
    with_zeros = diag[:, :, None] * np.eye(d) + 1e-300 * (1 - np.eye(d))  # not diagonal: dense products
    as_dense = observe(x, with_zeros[None], attention="relu", beta=1.3)
    for key in dense:
        # Sums in another order over d terms: agreement to ~1e-14 of O(1) values.
        np.testing.assert_allclose(dense[key], factored[key], rtol=1e-11, atol=1e-13, err_msg=key)
    for key in as_diag:
        np.testing.assert_allclose(as_diag[key], as_dense[key], rtol=1e-11, atol=1e-13, err_msg=key)


def test_dense_output_samples_match_the_reference_between_steps():
    # 401 samples over far fewer steps: the quartic interpolant's error is O(h^5),
    # at rtol 1e-10 well below 1e-7.
    rng = np.random.default_rng(2)
    n, d, H, beta = 6, 4, 2, 1.0
    m = random_symmetric(rng, H, d)
    x0 = random_sphere(rng, n, d)
    t = np.linspace(0, 4, 401)
    r = solve(Problem(x0[None], Heads(m[None]), "softmax", beta), Controller(1e-10, 1e-12, 10_000),
              SaveAt(t, ("positions",)))
    assert r.n_steps[0] < 200
    np.testing.assert_allclose(r.variables["x"][0], _reference(x0, m, beta, "softmax", t), atol=1e-7)


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_time_to_a_level_matches_the_closed_form_integral(attention):
    # Equiangular tokens with scalar heads stay equiangular; the time for the common
    # cosine to reach 1/2 is the integral of 1/(dgamma/dt) (partial fractions for
    # relu, quadrature for softmax). The crossing is located by bisection on the
    # dense output; at rtol 1e-11 the particles agree to ~1e-9, the issue asks 1e-6.
    n, d = 6, 16
    cell = Cell(H=2, n=n, d=d, beta=1.2, attention=attention, lambda_dist="linear", spread=0.4,
                init="equiangular_typical", t_max=200.0, n_samples=3, rtol=1e-11, atol=1e-13,
                cluster_metric="gamma_mean", cluster_threshold=0.5, observables=[])
    ds = simulate(cell)
    closed = theory.equiangular_time(1 / np.sqrt(d), 0.5, ds.lam.values[0], 1.2, n, attention)
    assert float(ds.t_cluster[0]) == pytest.approx(float(closed), rel=1e-6)


def test_relu_equiangular_rate_matches_particles_to_round_off():
    n, d, beta = 7, 9, 0.8
    cell = Cell(H=2, n=n, d=d, beta=beta, attention="relu", lambda_dist="linear", spread=0.5,
                init="equiangular", gamma0=0.3, observables=["velocity"], t_max=1.0, n_samples=2)
    ds = simulate(cell)
    rate = float(ds.gamma_mean_rate.isel(seed=0, time=0))
    # Exact velocities at t = 0 against the closed form: sums of O(1) terms.
    assert rate == pytest.approx(float(theory.equiangular_rate(0.3, ds.lam.values[0], beta, n, "relu")),
                                 rel=1e-13)


def test_bit_identical_per_seed_whatever_the_batch():
    base = dict(H=2, n=6, d=6, heads="random", t_max=2.0, observables=["positions", "energy", "entropy"])
    one = simulate(Cell(seeds=[3], **base))
    many = simulate(Cell(seeds=4, **base))
    for var in ("x", "energy", "entropy_rate", "t_cluster"):
        np.testing.assert_array_equal(one[var].sel(seed=3).values, many[var].sel(seed=3).values)


def test_stable_at_large_beta_softmax_and_relu():
    for attention in ("softmax", "relu"):
        ds = simulate(Cell(H=2, n=8, d=8, beta=50.0, attention=attention, heads="random",
                           seeds=2, t_max=5.0, n_samples=11))
        assert np.all(np.isfinite(ds.energy_rate.values))
        assert float(ds.norm_drift.max()) < 1e-14


def test_cluster_count_matches_scipy_components():
    """The engine's search against scipy's connected components of the same thresholded graph, on
    Gram matrices of random tokens: from no edge to every pair an edge."""
    from scipy.sparse.csgraph import connected_components

    from attnflow.engine.cosines import count_clusters

    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 40, 130):
        for d in (2, 3, 16):
            x = random_sphere(rng, n, d)
            gram = x @ x.T
            for level in (-1.1, -0.5, 0.0, 0.6, 0.95, 1.1):
                upper = np.triu(gram >= level, k=1)  # the engine reads the upper triangle
                want = connected_components(upper, directed=False)[0]
                got = count_clusters(gram, level, np.empty(n, np.int64), np.empty(n, np.int64))
                assert got == want, (n, d, level)


def test_cluster_count_counts_components():
    # Two tight pairs at right angles: 2 clusters at eps = 0.01, 1 at eps = 1.5
    # (edges where the cosine >= -0.5), and a fifth token opposite: 3 clusters.
    x = np.zeros((1, 5, 3))
    x[0, 0], x[0, 1] = [1, 0, 0], [np.cos(0.01), np.sin(0.01), 0]
    x[0, 2], x[0, 3] = [0, 1, 0], [np.sin(0.01), np.cos(0.01), 0]
    x[0, 4] = [-1, 0, 0]
    m = np.eye(3)[None, None]
    assert observe(x, m, attention="softmax", beta=1.0, groups=("clusters",))["cluster_count"][0] == 3
    assert observe(x, m, attention="softmax", beta=1.0, groups=("clusters",),
                   cluster_eps=1.5)["cluster_count"][0] == 1
    assert math.isclose(observe(x, m, attention="softmax", beta=1.0)["gamma_min"][0], -1.0)


# A kernel compiled by a child process through compile_once: it prints "locking" just before, "ready" after.
CHILD = """
import numba, numpy as np
from attnflow.engine.machinery.threads import compile_once

@numba.njit
def add_one(a):
    a[0] += 1

print("locking", flush=True)
compile_once(add_one, (np.zeros(1),))
print("ready", len(add_one.overloads), flush=True)
"""


def test_a_kernel_compiles_under_the_machine_wide_lock():
    """While another process holds the compile lock, a process about to compile waits; it compiles
    once the lock is free. A kernel already compiled for the arguments never waits."""
    import fcntl
    import subprocess
    import sys

    import numba

    from attnflow.engine.machinery.threads import compile_lock, compile_once

    @numba.njit
    def add_one(a):
        a[0] += 1

    ready = (np.zeros(1),)
    add_one(*ready)
    with open(compile_lock(), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        compile_once(add_one, ready)  # compiled already: returns at once (else it would wait on us)
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "locking"
        # Compiling add_one takes well under a second; 3 s later the child must still be waiting.
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=3)
    assert child.wait(timeout=120) == 0
    assert child.stdout.read().split() == ["ready", "1"]
    assert "waiting for another process compiling the engine" in child.stderr.read()


def test_the_compile_lock_is_per_numba_cache(monkeypatch):
    # Processes writing different caches would each compile anyway: they must not wait for each other.
    import numba

    from attnflow.engine.machinery.threads import compile_lock

    monkeypatch.setattr(numba.config, "CACHE_DIR", "/tmp/one-cache")
    first, again = compile_lock(), compile_lock()
    monkeypatch.setattr(numba.config, "CACHE_DIR", "/tmp/another-cache")
    assert first == again and compile_lock() != first


def test_the_compile_lock_lives_in_the_users_own_cache_directory(monkeypatch, tmp_path):
    # On 24e6db2 it was a predictable name in the shared temporary directory, opened for append:
    # another user could create or hold it, and every job of ours waited.
    import os
    import stat

    import numba

    from attnflow.engine.machinery.threads import compile_lock, compile_once

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    own = tmp_path / "cache" / "attnflow"
    assert compile_lock().parent == own
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.stat().st_uid == os.getuid()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_lock().parent == tmp_path / "home" / ".cache" / "attnflow"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kernel = numba.njit(lambda a: a[0] + 1.0)
    compile_once(kernel, (np.zeros(1),))
    assert kernel.overloads
    assert stat.S_IMODE(compile_lock().stat().st_mode) == 0o600


def test_a_cache_directory_others_may_write_in_is_not_used_for_the_lock(monkeypatch, tmp_path, capfd):
    import numba

    from attnflow.engine.machinery.threads import compile_lock, compile_once

    shared = tmp_path / "cache" / "attnflow"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(PermissionError, match=rf"{shared}: not this user's own directory"):
        compile_lock()
    kernel = numba.njit(lambda a: a[0] + 2.0)
    compile_once(kernel, (np.zeros(1),))  # compiles all the same: the lock only saves time
    assert kernel.overloads
    assert "compiling the engine without the compile lock" in capfd.readouterr().err
    assert list(shared.iterdir()) == []


def _flat_sigmoid_rows():
    """Four tokens in R^3, far from the sphere, scored by M = -I at beta = 1 (a = -<x_i, x_j> - log 4):
    every sigmoid weight of row 0 underflows to 0, row 1's sum is subnormal, rows 2 and 3 are normal
    (asserted below)."""
    unit = lambda v: np.asarray(v, float) / np.linalg.norm(v)  # noqa: E731
    x = np.array([[40.0, 0.0, 0.0], 35.7 * unit([1, 0.1, 0]), 20.0 * unit([1, 0, 0.05]),
                  20.06 * unit([1, -0.04, 0.03])])
    return x, -np.eye(3)[None]


def _mp_entropies(x, m, beta):
    """(entropy, entropy_rate) of each row of the row-normalised sigmoid weights, in mpmath at 40
    digits, where nothing underflows: the rate as the derivative of the entropy along the flat
    velocity v_i = sum_j w_ij M x_j."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    n, d = x.shape
    X = mpmath.matrix(x.tolist())
    M = mpmath.matrix(m[0].tolist())

    def weights(y):
        s = y * M * y.T
        return [[1 / (1 + mpmath.exp(mpmath.log(n) - beta * s[i, j])) for j in range(n)] for i in range(n)]

    def entropy(y, i):
        w = weights(y)[i]
        total = mpmath.fsum(w)
        return -mpmath.fsum((wj / total) * mpmath.log(wj / total) for wj in w)

    w = weights(X)
    v = mpmath.matrix(n, d)
    for i in range(n):
        for k in range(d):
            v[i, k] = mpmath.fsum(w[i][j] * (M * X.T)[k, j] for j in range(n))
    h = [entropy(X, i) for i in range(n)]
    c = 1 / max(abs(e) for e in v)  # the velocities are ~1e-173: differentiate along v / |v| instead
    rate = [mpmath.diff(lambda tau, i=i: entropy(X + tau * c * v, i), 0) / c for i in range(n)]
    return np.array([float(e) for e in h]), np.array([float(r) for r in rate])


def test_sigmoid_entropy_in_flat_space_where_the_weights_underflow_matches_mpmath():
    # On 24e6db2 a row whose weights all underflow (far from the sphere, flat geometry) raised
    # ZeroDivisionError in a worker thread; now such rows are taken in the log domain.
    x, m = _flat_sigmoid_rows()
    a = -(x @ x.T) - np.log(4)
    sums = np.exp(a).sum(axis=1)
    assert sums[0] == 0.0 and 0.0 < sums[1] < np.finfo(float).tiny and np.all(sums[2:] > 1e-200)
    got = observe(x[None], m[None], attention="sigmoid", beta=1.0, geometry="flat", groups=("entropy",))
    want, want_rate = _mp_entropies(x, m, 1.0)
    # The float64 scores, ~1e3, carry up to d eps |x_i||x_j| ~ 5e-13 absolute: so do the logits, and
    # the entropies (sums of p_j (l_j - mean), with p summing to 1) to within a few times that.
    np.testing.assert_allclose(got["entropy"][0, 0], want, rtol=0, atol=2e-12)
    # The rates: that error relative to every logit difference and score rate, summed over a row of
    # 4 terms, against the largest rate (a margin of 2.5 over 4 x 5e-13).
    scale = np.max(np.abs(want_rate))
    np.testing.assert_allclose(got["entropy_rate"][0, 0], want_rate, rtol=0, atol=5e-12 * scale)
    assert np.all(want_rate != 0.0)


def test_a_flat_sigmoid_cell_recording_the_entropy_runs_where_the_weights_underflow():
    # The same tokens as a cell: the flat flow is frozen there (every velocity below 1e-170), so each
    # sample's entropies are those at x0.
    x, m = _flat_sigmoid_rows()
    cell = Cell(H=1, n=4, d=3, attention="sigmoid", geometry="flat", beta=1.0, seeds=1, t_max=1.0,
                n_samples=3, observables=["entropy"])
    ds = simulate(cell, x0=x, score_matrices=m)
    want, _ = _mp_entropies(x, m, 1.0)
    np.testing.assert_allclose(ds.entropy.values[0, :, 0], np.broadcast_to(want, (3, 4)), rtol=0, atol=2e-12)
    assert np.all(np.isfinite(ds.entropy_rate.values))


def test_batch_inputs_of_the_wrong_shape_are_refused_naming_the_argument():
    # The compiled code would fail on these without a name, or broadcast what it should not.
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((2, 3, 4))
    x0 /= np.linalg.norm(x0, axis=2, keepdims=True)
    M = np.broadcast_to(np.eye(4), (1, 2, 4, 4)).copy()

    def run(x0=x0, score_matrices=M, diagonal=None, factors=None, values=None, beta=1.0, rtol=1e-6,
            cluster_metric="epsilon"):
        return solve(Problem(x0, Heads(score_matrices, diagonal, factors, values), "softmax", beta),
                     Controller(rtol, 1e-9, 1000), SaveAt(np.linspace(0, 1, 5)), ClusterEvent(cluster_metric))

    cases = [
        (dict(x0=x0[0]), r"^x0: shape \(3, 4\), expected \(B, n, d\)"),
        (dict(score_matrices=np.ones((1, 2, 5, 5))), r"^score_matrices: shape \(1, 2, 5, 5\)"),
        (dict(score_matrices=np.ones((3, 2, 4, 4))), r"^score_matrices: shape \(3, 2, 4, 4\)"),
        (dict(score_matrices=None, diagonal=np.ones((1, 2, 7))), r"^diagonal: shape \(1, 2, 7\)"),
        (dict(values=np.ones((1, 5, 4, 4))), r"^values: shape \(1, 5, 4, 4\)"),
        (dict(score_matrices=None, factors=(np.ones((1, 2, 4, 1)), np.ones((1, 2, 3)))),
         r"^factors\[0\] \(U\)"),
        (dict(beta=np.ones(5)), r"^beta: .* or 2 of them"),
        (dict(beta=np.nan), r"^beta: nan"),
        (dict(rtol=-1), r"^rtol = -1"),
        (dict(cluster_metric="bogus"), r"^cluster_metric: 'bogus', expected one of epsilon, gamma_mean"),
    ]
    for edits, match in cases:
        with pytest.raises(ValueError, match=match):
            run(**edits)
    with pytest.raises(ValueError, match=r"^x: shape \(3, 4\)"):
        observe(x0[0], M, attention="softmax", beta=1.0)
