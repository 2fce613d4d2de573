import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow import theory


def test_c_star_is_root_of_quadratic():
    H = np.arange(1, 50)
    c = theory.c_star(H)
    # Rationalised closed form vs the defining quadratic: round-off only.
    np.testing.assert_allclose(c**2 + (H - 1) * c - 1, 0.0, atol=1e-14)
    assert theory.c_star(2) == pytest.approx(2 / (1 + np.sqrt(5)), rel=1e-15)
    assert theory.c_star(1) == 1.0


def test_beta_star_matches_cosine_condition():
    # At beta*, the orthogonal-token cosine c = e^{ab}/sqrt(e^{2ab}+n-1) equals c*(H).
    for H, n, alpha in [(2, 8, 1.0), (2, 32, 0.5), (3, 100, 2.0)]:
        b = theory.beta_star(H, n, alpha)
        c = np.exp(alpha * b) / np.sqrt(np.exp(2 * alpha * b) + n - 1)
        assert c == pytest.approx(theory.c_star(H), rel=1e-12)


def test_beta_star_nonpositive_reported_and_h1_infinite():
    assert theory.beta_star(4, 8) <= 0
    assert np.isinf(theory.beta_star(1, 8))
    grid = theory.beta_star(np.array([[2], [3]]), np.array([8, 16, 32]))
    assert grid.shape == (2, 3)


def test_lambda_c_is_inflection_of_phi():
    # Independent route: centred second difference of phi changes sign at lambda_c.
    for beta, n in [(1.0, 8), (2.5, 32), (0.3, 3)]:
        lc = float(theory.lambda_c(beta, n))
        h = 1e-3 * lc

        def second(lam, h=h, beta=beta, n=n):
            return (theory.phi(lam + h, beta, n) - 2 * theory.phi(lam, beta, n)
                    + theory.phi(lam - h, beta, n))
        assert second(0.9 * lc) < 0 < second(1.1 * lc)
        # Second difference is O(h^2) accurate; at lambda_c it vanishes up to that.
        assert abs(second(lc)) / h**2 < 1e-4 * abs(second(0.5 * lc)) / h**2 + 1e-9
    assert theory.lambda_c(np.array([1.0, 2.0]), 8).shape == (2,)


def test_early_sign_follows_convexity_of_phi():
    # Small spreads: Jensen's sign is the sign of phi'' at lambda_bar.
    beta, n = 1.0, 8
    lc = float(theory.lambda_c(beta, n))
    spread = 0.05
    for lam_bar, expected in [(0.5 * lc, -1.0), (2.0 * lc, 1.0)]:
        lam = lam_bar * np.array([1 - spread, 1 + spread])
        assert theory.early_sign(lam, beta, n) == expected
    grid = theory.early_sign(np.ones((3, 4, 2)), np.ones((3, 4)), 8)
    assert grid.shape == (3, 4) and np.all(grid == 0)


def test_equiangular_rate_early_and_late():
    lam = np.array([0.5, 1.0, 1.5])
    beta, n = 2.0, 16
    assert theory.equiangular_rate(0.0, lam, beta, n) == pytest.approx(
        theory.phi(lam, beta, n).sum(), rel=1e-14)
    # Near gamma = 1: dgamma/dt ~ 2 Lambda (1 - gamma).
    eps = 1e-9
    rate = theory.equiangular_rate(1 - eps, lam, beta, n)
    assert rate / eps == pytest.approx(theory.late_rate(lam), rel=1e-6)
    # relu: no drive at gamma = 0; linear growth rate 2 beta sum lambda^2 / n near it.
    assert theory.equiangular_rate(0.0, lam, beta, n, "relu") == 0.0
    g = 1e-8
    assert theory.equiangular_rate(g, lam, beta, n, "relu") / g == pytest.approx(
        2 * beta * np.sum(lam**2) / n, rel=1e-6)
    with pytest.raises(ValueError, match="usa"):
        theory.equiangular_rate(0.1, lam, beta, n, "usa")


@pytest.mark.parametrize("attention", ["softmax", "relu"])
@pytest.mark.parametrize("n_count", [3, 4])
def test_closed_forms_broadcast_n_like_a_scalar(attention, n_count):
    # A grid over (n, gamma) in one call must equal the call per grid point. n_count = 4 = the gamma
    # count is the case where a misaligned n axis broadcasts silently instead of raising.
    lam, beta = np.array([0.6, 1.4]), 1.5
    n = np.array([2.0, 5.0, 9.0, 30.0][:n_count])
    gamma = np.array([0.05, 0.2, 0.5, 0.9])
    grid = theory.equiangular_rate(gamma[None, :], lam, beta, n[:, None], attention)
    loop = [[theory.equiangular_rate(g, lam, beta, m, attention) for g in gamma] for m in n]
    np.testing.assert_array_equal(grid, np.array(loop))
    lams = np.array([[0.2, 1.8], [1.0, 1.0], [3.0, 5.0], [0.5, 0.7]])
    signs = theory.early_sign(lams[None, :, :], beta, n[:, None])
    np.testing.assert_array_equal(signs, [[theory.early_sign(lm, beta, m) for lm in lams] for m in n])


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_equiangular_time_inverts_the_ode(attention):
    # Independent route: integrate the ODE with DOP853 and stop at gamma1 (an event).
    lam, beta, n, g0, g1 = np.array([0.7, 1.3]), 1.5, 12, 0.05, 0.5
    event = lambda _t, g: g[0] - g1  # noqa: E731
    event.terminal = True
    sol = solve_ivp(lambda _t, g: theory.equiangular_rate(g, lam, beta, n, attention), (0, 1e4), [g0],
                    method="DOP853", rtol=1e-13, atol=1e-15, events=event)
    t_ref = sol.t_events[0][0]
    # Both sides are converged to ~1e-12 relative.
    assert theory.equiangular_time(g0, g1, lam, beta, n, attention) == pytest.approx(t_ref, rel=1e-9)


def test_the_quadratures_integrand_is_one_over_the_public_rate(rng):
    # equiangular_time integrates a float-only copy of the softmax rate (speed): it must be the same
    # function, to round-off, over head counts, strengths, temperatures and token counts.
    for _ in range(200):
        lam = rng.uniform(0.1, 3.0, rng.integers(1, 7))
        beta, n, g = rng.uniform(0.05, 12.0), int(rng.integers(2, 300)), rng.uniform(-0.2, 0.9999)
        assert theory._softmax_inverse_rate(g, tuple(lam), beta, n) == pytest.approx(
            1.0 / float(theory.equiangular_rate(g, lam, beta, n)), rel=1e-13)
    with pytest.raises(ValueError, match="usa"):
        theory.equiangular_time(0.1, 0.5, [1.0], 1.0, 8, "usa")
    # Where exp overflows numpy gives inf, math.exp raises: the integrand goes on as numpy's rate does (a
    # head's term 0, and a rate of 0 an infinite inverse) instead of raising inside the quadrature.
    with np.errstate(over="ignore", divide="ignore"):
        assert theory._softmax_inverse_rate(0.1, (1.0,), 2000.0, 8) == 1.0 / theory.equiangular_rate(
            0.1, [1.0], 2000.0, 8) == np.inf
        assert theory._softmax_inverse_rate(0.1, (1.0, 0.001), 2000.0, 8) == pytest.approx(
            1.0 / float(theory.equiangular_rate(0.1, [1.0, 0.001], 2000.0, 8)), rel=1e-13)


def test_equiangular_time_broadcasts_and_relu_needs_a_start():
    t = theory.equiangular_time(np.array([0.01, 0.1])[:, None], 0.5, [1.0], np.array([1.0, 2.0]), 8)
    assert t.shape == (2, 2) and np.all(np.diff(t, axis=0) < 0)
    assert np.isinf(theory.equiangular_time(0.0, 0.5, [1.0], 1.0, 8, "relu"))


def test_solve_equiangular_converges_to_one():
    t = np.linspace(0, 8, 50)
    g = theory.solve_equiangular(0.0, [1.0, 1.0], 1.0, 8, t)
    # Monotone while 1 - gamma is well above the solver's atol of 1e-14.
    assert g[0] == 0.0 and np.all(np.diff(g) > 0) and g[-1] > 1 - 1e-6


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_initial_drive_bounds_the_time_to_one_half(attention):
    # Thm 25's O(n) / O(n log d) are read off the drive at gamma0; the drive only grows
    # up to gamma = 1/2 (relu needs n >= 3), so the linear time bounds the exact one.
    from attnflow.experiments.clustering_time import initial_drive_bound

    for n in (3, 8, 64):
        for d in (16, 4096):
            g0 = 1 / np.sqrt(d)
            exact = theory.equiangular_time(g0, 0.5, [0.7, 1.3], 1.0, n, attention)
            assert initial_drive_bound(attention, g0, 0.5, n, 1.0, [0.7, 1.3]) >= exact


def _log_scheme_time_by_nested_quadrature(gamma0, gamma1, lambdas, beta, n, speed_times_r):
    """log T by scipy's QUADPACK, in log space: log r(gamma) an inner quadrature of g / G, and
    T = e^M int e^{log r - M} / (s r G) dgamma with M = log r(gamma1), the largest (g > 0: r grows)."""
    from scipy.integrate import quad

    def parts(gamma):
        return theory.equiangular_scheme_parts(gamma, lambdas, beta, n)

    def log_r(gamma):
        return quad(lambda g: parts(g)[1] / parts(g)[0], gamma0, gamma, epsabs=0, epsrel=1e-12, limit=200)[0]

    top = log_r(gamma1)
    integral = quad(lambda g: np.exp(log_r(g) - top) / (speed_times_r(parts(g)[2]) * parts(g)[0]), gamma0,
                    gamma1, epsabs=0, epsrel=1e-11, limit=400)[0]
    return np.log(integral) + top


@pytest.mark.parametrize("geometry, speed_times_r",
                         [("pre_ln", lambda u: 1.0), ("peri_ln", lambda u: 1.0 / u)])
def test_the_equiangular_time_of_a_radius_beyond_float_range_is_infinite(geometry, speed_times_r):
    # Pre-LN and Peri-LN: log r grows like e^{beta lambda (1 - gamma)}, and the time with it. Up to the end
    # of float64 (T ~ 5e297 at beta 15.5) the time is the nested quadrature's, an independent route (QUADPACK
    # in log space, rtol 1e-11: 1e-9 in log T leaves a margin over both); past it, inf. The quadrature in T
    # itself overflowed and raised from beta 20 (and before that at 16, where paper.yaml's summary failed).
    lambdas, n = np.array([0.6, 1.0]), 6
    for beta in (4.0, 15.5):
        expected = _log_scheme_time_by_nested_quadrature(0.05, 0.99, lambdas, beta, n, speed_times_r)
        got = theory.equiangular_scheme_time(0.05, 0.99, lambdas, beta, n, geometry)
        assert np.log(got) == pytest.approx(expected, abs=1e-9), (beta, got)
    assert expected > 680.0  # beta 15.5 is near the end of float64 (log 1.8e308 = 709.8)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # none reaches numpy unguarded
        for beta in (16.0, 20.0, 100.0, 599.0):  # 599: the last beta a cell allows (beta lambda <= 600)
            assert theory.equiangular_scheme_time(0.05, 0.99, lambdas, beta, n, geometry) == np.inf, beta
    assert np.isfinite(theory.equiangular_scheme_time(0.05, 0.99, lambdas, 16.0, n, "sphere"))


def _sphere_time_by_quadpack(gamma0, gamma1, lambdas, beta, n):
    """``int dgamma / G`` by QUADPACK in ``u = log((gamma - low) / (1 - gamma))`` (smooth at both ends), the
    rate ``G`` straight from ``equiangular_scheme_parts`` and scaled by its value at ``gamma0`` (the
    integrand stays near 1 where ``1 / G`` reaches 1e257)."""
    from scipy.integrate import quad

    low = -1.0 / (n - 1.0)

    def rate(gamma):
        return theory.equiangular_scheme_parts(gamma, np.asarray(lambdas, dtype=float), beta, n)[0]

    scale = rate(gamma0)

    def integrand(u):
        gamma = low + (1.0 - low) / (1.0 + np.exp(-u))
        return scale * (gamma - low) * (1.0 - gamma) / (1.0 - low) / rate(gamma)

    ends = [np.log(g - low) - np.log1p(-g) for g in (gamma0, gamma1)]
    return quad(integrand, *ends, epsabs=0, epsrel=1e-12, limit=400)[0] / scale


@pytest.mark.parametrize("gamma0, gamma1, lambdas, beta, n", [
    (0.0, 0.5, [1.0], 599.0, 2),  # beta lambda at the cells' limit (600): T ~ 1e257
    (0.0, 0.99, [1.0], 500.0, 6),
    (-0.25 + 1e-9, 0.99, [0.7, 1.3], 2.0, 5),  # 1e-9 from the least cosine, -1/(n-1)
    (0.05, 1.0 - 1e-12, [0.7, 1.3], 2.0, 5),  # 1e-12 from 1
])
def test_the_scheme_time_holds_at_the_largest_beta_and_at_the_cosine_ends(gamma0, gamma1, lambdas, beta, n):
    # Found by a hostile tester: each of these raised (step size below spacing) or ran on for minutes: the
    # quadrature ran in gamma, where the rate vanishes at both ends, and in b ~ e^{-beta lambda (1 - gamma)}
    # itself. The reference is QUADPACK at rtol 1e-12: 1e-10 leaves a margin over it and DOP853's 1e-13.
    expected = _sphere_time_by_quadpack(gamma0, gamma1, lambdas, beta, n)
    loud = dict(over="raise", divide="raise", invalid="raise")  # underflow: b to 0 where it is negligible
    with np.errstate(**loud):
        got = theory.equiangular_scheme_time(gamma0, gamma1, lambdas, beta, n, "sphere")
    assert got == pytest.approx(expected, rel=1e-10)
    with np.errstate(**loud):
        pre_ln = theory.equiangular_scheme_time(gamma0, gamma1, lambdas, beta, n, "pre_ln")
    # Pre-LN's speed 1/r <= 1 (r grows from 1): slower than Post-LN; at beta lambda = 500-600 past float64.
    assert pre_ln == np.inf if beta >= 500 else got < pre_ln < np.inf


@pytest.mark.parametrize("args, named", [
    ((0.9, 0.3, [1.0], 1.0, 6), "gamma0 = 0.9, gamma1 = 0.3"),  # a level below the start
    ((-0.5, 0.9, [1.0], 1.0, 3), "gamma0 = -0.5"),  # the least cosine itself: never leaves it
    ((0.1, 1.2, [1.0], 1.0, 2), "gamma1 = 1.2"),
    ((float("nan"), 0.9, [1.0], 1.0, 6), "gamma0 = nan"),  # looped for ever
    ((0.1, 0.9, [-1.0], 1.0, 6), "lambdas"),
    ((0.1, 0.9, [0.0, 0.0], 1.0, 6), "lambdas"),
    ((0.1, 0.9, [1.0], float("nan"), 6), "beta = nan"),
    ((0.1, 0.9, [1.0], 1.0, 1), "n = 1"),
    ((0.1, 0.9, [1.0], 1.0, float("inf")), "n = inf"),  # a warning, then a time
    ((0.1, 0.9, [1.0], 1.0, 2.5), "n = 2.5"),
    ((0.1, 0.9, [1.0], 1.0, 6, 0.0), "ngpt_alpha = 0.0"),  # divide by zero, then inf
    ((0.1, 0.9, [1.0], 1.0, 6, float("nan")), "ngpt_alpha = nan"),  # a RuntimeError from the stepper
])
def test_the_scheme_time_refuses_what_has_no_time(args, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        theory.equiangular_scheme_time(*args[:5], "pre_ln", *args[5:])


@pytest.mark.parametrize("geometry", ["pre_ln", "peri_ln"])
@pytest.mark.parametrize("gamma0, n", [(-0.5, 2), (-0.2, 2), (-0.9999999845814465, 2)])
def test_a_start_whose_radius_rate_is_past_float_range_has_an_infinite_time(geometry, gamma0, n):
    # Found by a hostile tester: beta lambda (1 - gamma0) > 709 (here up to 1200, inside the cells' beta
    # lambda <= 600) overflowed the radius scale 1 / (2 n b0): a RuntimeError after 400 overflow warnings.
    # log r grows at > 1e306 per unit x from there, so the time is past float64 (QUADPACK cannot tell).
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        assert theory.equiangular_scheme_time(gamma0, 0.9, [1.0], 600.0, n, geometry) == np.inf


@pytest.mark.parametrize("n, beta", [(3, 1e-4), (5, 1e-3), (17, 2e-3)])  # -1/(n-1) and (n-1) gamma exact
def test_the_scheme_parts_hold_their_digits_at_the_least_cosine(n, beta):
    # Found by a hostile tester: ||u|| = sqrt(a^2 + 2ab(n-1) gamma + ...) cancelled near gamma = -1/(n-1)
    # at small beta lambda (a - b ~ beta lambda a), leaving 1e-16 / (beta lambda)^2 of noise that held the
    # scheme time's DOP853 to 1e-5 steps (40 s). Reference: |c^T Theta| from the Gram matrix
    # (1 - gamma) I + gamma 11^T at 40 digits, c = (a, b, ..., b), at the float gamma passed; 1e-13 is a
    # few hundred ulps (the cancelling form was 1e-9 off at beta lambda 1e-4).
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    lambdas = [0.5, 1.5]
    low = mp.mpf(-1) / (n - 1)
    for gamma in (mp.mpf(float(low + dg)) for dg in (0, mp.mpf("1e-9"), mp.mpf("1e-6"))):
        w = [mp.exp(beta * lam * (gamma - 1)) for lam in lambdas]
        z = [1 + (n - 1) * wi for wi in w]
        a = sum(lam / zi for lam, zi in zip(lambdas, z, strict=True))
        b = sum(lam * wi / zi for lam, wi, zi in zip(lambdas, w, z, strict=True))
        c = mp.matrix([a] + [b] * (n - 1))
        gram = mp.matrix(n, n)
        for i in range(n):
            for j in range(n):
                gram[i, j] = 1 if i == j else gamma
        norm = mp.sqrt((c.T * gram * c)[0])
        radial = (gram * c)[0]  # <theta_k, u_k>
        _, got_radial, got_norm = theory.equiangular_scheme_parts(float(gamma), lambdas, beta, n)
        assert float(got_norm) == pytest.approx(float(norm), rel=1e-13, abs=0), float(gamma)
        assert float(got_radial) == pytest.approx(float(radial), rel=1e-13, abs=0), float(gamma)
