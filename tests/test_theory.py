import numpy as np
import pytest

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


def test_equiangular_rate_early_and_late():
    lam = np.array([0.5, 1.0, 1.5])
    beta, n = 2.0, 16
    assert theory.equiangular_rate(0.0, lam, beta, n) == pytest.approx(
        theory.phi(lam, beta, n).sum(), rel=1e-14
    )
    # Near gamma = 1: dgamma/dt ~ 2 Lambda (1 - gamma).
    eps = 1e-9
    rate = theory.equiangular_rate(1 - eps, lam, beta, n)
    assert rate / eps == pytest.approx(theory.late_rate(lam), rel=1e-6)


def test_solve_equiangular_converges_to_one():
    t = np.linspace(0, 8, 50)
    g = theory.solve_equiangular(0.0, [1.0, 1.0], 1.0, 8, t)
    # Monotone while 1 - gamma is well above the solver's atol of 1e-14.
    assert g[0] == 0.0 and np.all(np.diff(g) > 0) and g[-1] > 1 - 1e-6
