"""Closed forms of the paper (docs/model.md, results 3-5 and 12), vectorised over numpy arrays.

Every function broadcasts its array arguments against each other, so a whole
phase diagram is one call.

scipy is imported inside the functions that use it (root finding, quadrature,
the ODE reference): ``import attnflow`` loads this module, and every Snakemake
job imports the package, most without calling any of them.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "c_star",
    "beta_star",
    "phi",
    "lambda_c",
    "early_sign",
    "equiangular_rate",
    "equiangular_time",
    "time_ratio",
    "crossover_beta",
    "solve_equiangular",
    "late_rate",
    "equiangular_scheme_parts",
    "equiangular_scheme_rates",
    "solve_equiangular_scheme",
    "equiangular_scheme_time",
]


def c_star(H):
    """Critical cosine ``c*(H)``, the positive root of ``c^2 + (H-1) c - 1 = 0`` (Thm 19).

    Parameters
    ----------
    H : array_like
        Number of heads (>= 1).

    Returns
    -------
    ndarray
        ``(sqrt((H-1)^2 + 4) - (H-1)) / 2``; ``c*(1) = 1``, ``c*(2) = 1/golden ratio``.
    """
    H = np.asarray(H, dtype=float)
    m = H - 1.0
    # Rationalised form of (sqrt(m^2+4) - m)/2: no cancellation for large H.
    return 2.0 / (np.sqrt(m * m + 4.0) + m)


def beta_star(H, n, alpha=1.0):
    """Critical inverse temperature ``beta*(H, n, alpha)`` of Thm 19.

    Radial Dominance in its sufficient form holds at orthogonal tokens with
    equal scalar heads ``M_h = alpha I`` exactly when ``beta <= beta*``.

    Returns
    -------
    ndarray
        ``ln(c*^2 (n-1) / (1 - c*^2)) / (2 alpha)``. A value ``<= 0`` means no
        positive beta satisfies the condition (e.g. H=4, n=8); ``H = 1`` gives
        ``+inf`` (a single head is always radially dominant).
    """
    H, n, alpha = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (H, n, alpha)))
    c2 = c_star(H) ** 2
    with np.errstate(divide="ignore"):
        return np.log(c2 * (n - 1.0) / (1.0 - c2)) / (2.0 * alpha)


def phi(lam, beta, n):
    """Early-time clustering drive of one scalar head, ``2 lam / (exp(lam beta) + n - 1)`` (Thm 22)."""
    lam = np.asarray(lam, dtype=float)
    return 2.0 * lam / (np.exp(lam * np.asarray(beta, dtype=float)) + np.asarray(n) - 1.0)


def _inflection_u(m: float) -> float:
    """Root ``u > 2`` of ``(u - 2) e^u = m (u + 2)``: where ``u / (e^u + m)`` changes convexity."""
    from scipy.optimize import brentq

    if m <= 0.0:
        return 2.0
    # log form is monotone in u on (2, inf) and cannot overflow.
    def g(u):
        return np.log(u - 2.0) + u - np.log(m) - np.log(u + 2.0)
    hi = 3.0
    while g(hi) < 0.0:
        hi *= 2.0
    return brentq(g, 2.0 * (1.0 + 4 * np.finfo(float).eps), hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)


def lambda_c(beta, n):
    """Inflection point of ``phi(., beta, n)`` in lambda (Thm 22), computed by root finding.

    With ``u = lambda beta``, ``phi'' = 0`` reduces to ``(u - 2) e^u = (n - 1)(u + 2)``;
    ``phi`` is concave below ``lambda_c`` and convex above it.
    """
    beta, n = np.broadcast_arrays(np.asarray(beta, dtype=float), np.asarray(n, dtype=float))
    u = np.vectorize(_inflection_u, otypes=[float])(n - 1.0)
    return u / beta


def early_sign(lambdas, beta, n):
    """``sign(sum_h phi(lambda_h) - H phi(lambda_bar))``: +1 where unequal heads start faster (Thm 22).

    ``lambdas`` has the heads on its last axis; ``lambda_bar`` is their mean.
    """
    lambdas = np.asarray(lambdas, dtype=float)
    beta = np.asarray(beta, dtype=float)[..., None]
    n = np.asarray(n, dtype=float)[..., None]
    H = lambdas.shape[-1]
    mean = lambdas.mean(axis=-1, keepdims=True)
    gap = phi(lambdas, beta, n).sum(axis=-1) - H * phi(mean, beta, n)[..., 0]
    return np.sign(gap)


def _equiangular_attention(attention: str) -> str:
    """``attention`` where the equiangular ODE is derived (softmax, relu); else a ValueError naming it."""
    if attention not in ("softmax", "relu"):
        raise ValueError(f"attention = {attention!r}: the equiangular ODE is derived for softmax and relu")
    return attention


def equiangular_rate(gamma, lambdas, beta, n, attention="softmax"):
    """Right-hand side of the equiangular ODE for the common cosine (scalar heads).

    softmax (Thm 22): ``2 (1 - g)(1 + (n-1) g) sum_h lambda_h / (exp(beta lambda_h (1-g)) + n - 1)``;
    relu (Thm 25): ``(2 beta / n) g (1 - g)(1 + (n-1) g) sum_h lambda_h^2``, no drive at ``g = 0``.

    Parameters
    ----------
    gamma : array_like
        Common pairwise cosine.
    lambdas : array_like, shape (..., H)
        Head strengths; the last axis is summed over.
    attention : "softmax" | "relu"
    """
    gamma = np.asarray(gamma, dtype=float)[..., None]
    lambdas = np.asarray(lambdas, dtype=float)
    beta = np.asarray(beta, dtype=float)[..., None]
    n = np.asarray(n, dtype=float)
    g = gamma[..., 0]
    if _equiangular_attention(attention) == "softmax":
        # gamma, beta and n gain the heads axis so that lambdas' last axis lines up with it alone.
        drive = lambdas / (np.exp(beta * lambdas * (1.0 - gamma)) + n[..., None] - 1.0)
        return 2.0 * (1.0 - g) * (1.0 + (n - 1.0) * g) * drive.sum(axis=-1)
    return (2.0 * beta[..., 0] / n) * g * (1.0 - g) * (1.0 + (n - 1.0) * g) * (lambdas**2).sum(axis=-1)


def _relu_antiderivative(g, n):
    """Partial fractions: d/dg of this is ``1 / (g (1 - g)(1 + (n-1) g))``."""
    return np.log(g) - np.log1p(-g) / n - (n - 1.0) / n * np.log1p((n - 1.0) * g)


def equiangular_time(gamma0, gamma1, lambdas, beta, n, attention="softmax"):
    """Time for the common cosine to go from ``gamma0`` to ``gamma1`` on the equiangular ODE.

    The integral of ``1 / (dgamma/dt)`` from ``gamma0`` to ``gamma1``: in closed
    form by partial fractions for relu, by adaptive Gauss-Kronrod quadrature
    (relative tolerance 1e-12) for softmax. ``inf`` where the drive vanishes
    (relu from ``gamma0 = 0``). Broadcasts over ``gamma0``, ``gamma1``,
    ``beta``, ``n`` and the leading axes of ``lambdas``.
    """
    from scipy.integrate import quad

    _equiangular_attention(attention)
    lambdas = np.asarray(lambdas, dtype=float)
    g0, g1, beta_b, n_b = np.broadcast_arrays(
        *(np.asarray(a, dtype=float) for a in (gamma0, gamma1, beta, n)))
    shape = np.broadcast_shapes(g0.shape, lambdas.shape[:-1])
    g0, g1, beta_b, n_b = (np.broadcast_to(a, shape) for a in (g0, g1, beta_b, n_b))
    lam = np.broadcast_to(lambdas, shape + lambdas.shape[-1:])
    out = np.empty(shape)
    for idx in np.ndindex(shape):
        a, b, bt, nn, lm = float(g0[idx]), float(g1[idx]), float(beta_b[idx]), float(n_b[idx]), lam[idx]
        if attention == "relu":
            if a <= 0.0:
                out[idx] = np.inf
                continue
            out[idx] = (nn / (2.0 * bt * np.sum(lm**2))) * (_relu_antiderivative(b, nn)
                                                           - _relu_antiderivative(a, nn))
        else:
            out[idx] = quad(_softmax_inverse_rate, a, b, args=(tuple(map(float, lm)), bt, nn),
                            epsabs=0.0, epsrel=1e-12, limit=200)[0]
    return out


_EXP_OVERFLOWS = math.log(np.finfo(float).max)  # 709.78: math.exp raises above it, np.exp gives inf


def _softmax_inverse_rate(g, lambdas, beta, n):
    """``1 / equiangular_rate(g, lambdas, beta, n, "softmax")`` on floats: the quadrature's integrand.
    quad calls it some 200 times an interval and the figures integrate thousands of intervals; through
    numpy's broadcasting a call cost 20 us, most of a crossover summary's time. Where numpy's exp
    overflows to inf (a head's term 0) and the rate is 0 (1 / rate inf), so does this, without raising."""
    drive = 0.0
    for lam in lambdas:
        exponent = beta * lam * (1.0 - g)
        drive += lam / (math.exp(exponent) + n - 1.0) if exponent < _EXP_OVERFLOWS else 0.0
    rate = 2.0 * (1.0 - g) * (1.0 + (n - 1.0) * g) * drive
    return 1.0 / rate if rate != 0.0 else math.inf


def time_ratio(gamma0, gamma1, lambdas, beta, n):
    """``T_relu / T_softmax``: the ratio of the exact equiangular times from ``gamma0`` to ``gamma1``
    (docs/model.md, result 11, from the two ODEs of result 4-5).

    Both times are :func:`equiangular_time` (partial fractions for relu, quadrature at relative
    tolerance 1e-12 for softmax), so the ratio is exact to about 1e-11. Below 1 relu reaches the
    level first. Broadcasts like :func:`equiangular_time`.
    """
    relu = equiangular_time(gamma0, gamma1, lambdas, beta, n, "relu")
    return relu / equiangular_time(gamma0, gamma1, lambdas, beta, n, "softmax")


def crossover_beta(gamma0, gamma1, lambdas, n, bracket=(1e-3, 1e2)):
    """The beta at which relu and softmax reach ``gamma1`` at the same time (``time_ratio = 1``).

    Found by Brent's method in ``log beta`` inside ``bracket``; NaN where the ratio does not
    cross 1 there. Scalar ``gamma0``, ``gamma1``, ``n``; ``lambdas`` one head vector.
    """
    from scipy.optimize import brentq

    def gap(log_beta):
        return float(np.log(time_ratio(gamma0, gamma1, lambdas, np.exp(log_beta), n)))

    lo, hi = np.log(bracket[0]), np.log(bracket[1])
    if gap(lo) * gap(hi) > 0:
        return np.nan
    return float(np.exp(brentq(gap, lo, hi, xtol=1e-12, rtol=1e-12)))


def solve_equiangular(gamma0, lambdas, beta, n, t, *, attention="softmax", rtol=1e-12, atol=1e-14):
    """Integrate the equiangular ODE from ``gamma0``; returns ``gamma`` at the times ``t``.

    Uses scipy's DOP853 at tight tolerance, so it serves as the reference for
    the particle simulation.
    """
    from scipy.integrate import solve_ivp

    t = np.asarray(t, dtype=float)
    lambdas = np.asarray(lambdas, dtype=float)
    sol = solve_ivp(
        lambda _t, g: equiangular_rate(g, lambdas, beta, n, attention),
        (float(t[0]), float(t[-1])),
        [float(gamma0)],
        method="DOP853",
        t_eval=t,
        rtol=rtol,
        atol=atol,
    )
    if not sol.success:
        raise RuntimeError(f"equiangular ODE failed: {sol.message}")
    return sol.y[0]


def late_rate(lambdas):
    """Late-time exponential rate ``2 Lambda = 2 sum_h lambda_h`` of ``epsilon(t)`` (Thm 22)."""
    return 2.0 * np.sum(np.asarray(lambdas, dtype=float), axis=-1)


# --- normalization schemes from equiangular starts (docs/model.md, result 12) ----------------------

def equiangular_scheme_parts(gamma, lambdas, beta, n):
    """``(G, g, ||u||)`` at the common cosine ``gamma`` (scalar heads, softmax, equiangular tokens).

    ``G`` is the speed-1 rate of result 4 (:func:`equiangular_rate`); ``g = <theta_k, u_k>`` and
    ``||u_k||`` follow from ``u_k = a theta_k + b sum_{j != k} theta_j`` with
    ``a = sum_h lambda_h e^{beta lambda_h} / Z_h``, ``b = sum_h lambda_h e^{beta lambda_h gamma} / Z_h``,
    ``Z_h = e^{beta lambda_h} + (n-1) e^{beta lambda_h gamma}``.
    """
    gamma = np.asarray(gamma, dtype=float)
    return _scheme_parts(gamma, 1.0 + (n - 1.0) * gamma, lambdas, beta, n)[:3]


def _scheme_parts(gamma, e, lambdas, beta, n):
    """:func:`equiangular_scheme_parts` and ``log b`` (``b`` underflows from ``beta lambda (1 - gamma)``
    ~ 745; its log does not), given ``e = 1 + (n-1) gamma`` as well: near ``gamma = -1/(n-1)`` ``e`` from
    a rounded ``gamma`` keeps only 1e-16 / e of its digits, and ``||u||`` turns on it where ``beta
    lambda`` is small (noise that held the scheme time's DOP853 to 1e-5 steps, 40 s)."""
    lambdas = np.asarray(lambdas, dtype=float)
    # weights relative to the self weight: e^{beta lambda (gamma - 1)} <= 1, no overflow
    exponent = beta * lambdas * (gamma[..., None] - 1.0)
    w = np.exp(exponent)
    z = 1.0 + (n - 1.0) * w
    b = np.sum(lambdas * w / z, axis=-1)
    # A head of strength 0 adds nothing (log 0 = -inf); every strength 0 leaves log b NaN, b itself 0.
    with np.errstate(divide="ignore", invalid="ignore"):
        log_terms = np.log(lambdas) + exponent - np.log(z)  # log(lambda_h w_h / z_h)
        top = log_terms.max(axis=-1)
        log_b = top + np.log(np.sum(np.exp(log_terms - top[..., None]), axis=-1))
    # g and ||u|| in a - b (summed as such) and e = 1 + (n-1) gamma >= 0, every term >= 0: as a + b (n-1)
    # gamma they cancelled near gamma = -1/(n-1), to a relative 1e-16 / (beta lambda)^2 in ||u|| (found by
    # a hostile tester: the noise held the scheme time's DOP853 to 1e-5 steps, 40 s at beta lambda 2e-3).
    gap = np.sum(-lambdas * np.expm1(exponent) / z, axis=-1)  # a - b
    rate = 2.0 * b * (1.0 - gamma) * e
    radial = gap + b * e
    norm = np.sqrt(gap * gap + b * e * (2.0 * gap + n * b))
    return rate, radial, norm, log_b


def equiangular_scheme_rates(gamma, r, lambdas, beta, n, geometry, ngpt_alpha=1.0):
    """``(dgamma/dt, dr/dt)`` from an equiangular start in ``geometry`` (a name or a declaration of
    ``attnflow.geometry``): ``dgamma/dt = s G``, ``dr/dt = s r g`` where the state carries radii (0
    elsewhere), ``s`` the geometry's speed at ``(r, ||u||)``. ``ValueError`` for flat space, no sphere
    flow (its tokens leave the sphere)."""
    from .geometry import GEOMETRIES, Geometry

    shape = geometry if isinstance(geometry, Geometry) else GEOMETRIES.get(geometry)
    if shape.speed is None:
        raise ValueError(f"geometry = {shape.name!r}: no sphere flow, no equiangular ODE of the directions")
    rate, radial, norm = equiangular_scheme_parts(gamma, lambdas, beta, n)
    r = np.asarray(r, dtype=float)
    s = shape.speed(r, norm, ngpt_alpha)
    return s * rate, (s * r * radial if shape.radii else 0.0 * r)


def solve_equiangular_scheme(gamma0, lambdas, beta, n, t, geometry, *, ngpt_alpha=1.0, rtol=1e-12,
                             atol=1e-14):
    """``(gamma(t), r(t))`` on the scalar ODEs of :func:`equiangular_scheme_rates` from ``gamma0``,
    ``r = 1``, by scipy's DOP853 at tight tolerance: the reference for the particles."""
    from scipy.integrate import solve_ivp

    t = np.asarray(t, dtype=float)

    def rhs(_t, y):
        return np.array(equiangular_scheme_rates(y[0], y[1], lambdas, beta, n, geometry, ngpt_alpha))

    sol = solve_ivp(rhs, (float(t[0]), float(t[-1])), [float(gamma0), 1.0], method="DOP853", t_eval=t,
                    rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"equiangular ODE ({geometry}) failed: {sol.message}")
    return sol.y[0], sol.y[1]


def equiangular_scheme_time(gamma0, gamma1, lambdas, beta, n, geometry, ngpt_alpha=1.0):
    """Time for the common cosine to go from ``gamma0`` to ``gamma1`` in ``geometry``, a quadrature in
    ``gamma``: ``T = int dgamma / (s G)`` with ``log r(gamma) = int g / G`` where the state carries
    radii (the speed drops out of ``dr/dgamma``), ``r = 1`` elsewhere. For pre_ln that is
    ``T_pre = int r(gamma) / G(gamma) dgamma`` (docs/model.md, result 12). The integrals run on scipy's
    DOP853 at rtol 1e-13 in ``x = log((gamma + 1/(n-1)) / (1 - gamma))``, in logarithms; ``inf`` where the
    time is past float64's largest (pre_ln and peri_ln from beta ~ 16 at lambda ~ 1). Scalar arguments,
    ``lambdas`` one head vector (>= 0, not all 0); ``ValueError`` unless -1/(n-1) < gamma0 <= gamma1 < 1."""
    from scipy.integrate import solve_ivp
    from scipy.special import expit

    from .geometry import GEOMETRIES, Geometry

    shape = geometry if isinstance(geometry, Geometry) else GEOMETRIES.get(geometry)
    if shape.speed is None:
        raise ValueError(f"geometry = {shape.name!r}: no sphere flow, no equiangular ODE of the directions")
    lambdas = np.asarray(lambdas, dtype=float)
    if not (np.isfinite(n) and n >= 2 and n == int(n)):
        raise ValueError(f"equiangular time: n = {n!r}: needs a whole number n >= 2 of tokens")
    if not (np.isfinite(ngpt_alpha) and ngpt_alpha > 0):  # 0, < 0 or NaN: a warning, NaN or a stall
        raise ValueError(f"equiangular time: ngpt_alpha = {ngpt_alpha!r}: must be finite and > 0")
    if not (lambdas.ndim == 1 and np.all(np.isfinite(lambdas) & (lambdas >= 0)) and lambdas.sum() > 0):
        raise ValueError(f"equiangular time: lambdas = {lambdas!r}: finite, >= 0 and not all 0")
    if not (np.isfinite(beta) and beta > 0):
        raise ValueError(f"equiangular time: beta = {beta!r}: must be finite and > 0")
    low = -1.0 / (n - 1.0)  # the equiangular cosine's least value
    if not low < gamma0 <= gamma1 < 1.0:
        raise ValueError(f"equiangular time: gamma0 = {gamma0!r}, gamma1 = {gamma1!r}: needs "
                         f"-1/(n-1) = {low:.6g} < gamma0 <= gamma1 < 1")
    if gamma0 == gamma1:
        return 0.0

    # In x, dgamma/dx = (gamma - low)(1 - gamma) / (1 - low) cancels the rate's zeros at both ends
    # (G = 2 b (1 - gamma)(n - 1)(gamma - low), (n - 1)(1 - low) = n): dS/dx = 1 / (2 n b s r) with S the
    # time per unit radius (the time itself where r = 1; s r is free of r, geometry.Geometry.speed), and
    # dlog r/dx = g / (2 n b). b ~ e^{-beta lambda (1 - gamma)} spans up to e^{-600}: kept as log b, and
    # every rate scaled by its value at gamma0 (ell0 below), where the rates are largest (b grows with gamma).
    log_2n = np.log(2.0 * n)

    def terms(x):
        """(log of 1 / (2 n b s r), log b, g) at x."""
        gamma = low + (1.0 - low) * expit(x)
        # e = 1 + (n-1) gamma = n expit(x) exactly; b may underflow (log b does not): harmless
        _, radial, norm, log_b = _scheme_parts(np.asarray(gamma), n * expit(x), lambdas, beta, n)
        return -log_2n - log_b - np.log(shape.speed(1.0, norm, ngpt_alpha)), log_b, radial

    span = (float(np.log(gamma0 - low) - np.log1p(-gamma0)), float(np.log(gamma1 - low) - np.log1p(-gamma1)))
    ell0, log_b0, _ = terms(span[0])
    ode = dict(method="DOP853", rtol=1e-13, atol=1e-15)
    plain = solve_ivp(lambda x, y: [np.exp(terms(x)[0] - ell0)], span, [0.0], dense_output=shape.radii, **ode)
    if not plain.success:
        raise RuntimeError(f"equiangular time ({shape.name}) failed: {plain.message}")
    if not shape.radii:
        log_time = ell0 + np.log(plain.y[0, -1])
        return float(np.exp(log_time)) if log_time < _LOG_LARGEST else float("inf")
    # With radii T = int r dS grows with r (pre_ln: dT/dgamma = r / G), past float64 at large beta (log r
    # ~ 1e6 at beta = 16) long before the level. First log r alone (its rate does not depend on it),
    # scaled: log r = q e^{-log(2 n b0)}, dq/dx = g b0 / b. T exceeds r(x) (S(x1) - S(x)) at every x (r
    # grows), so T = inf once that leaves float64. Otherwise log r and w = T / (r e^{ell0}), both of float
    # size while T is (dw/dx = dS/dx e^{-ell0} - w dlog r/dx), and T = inf if log T leaves float64 on the
    # way. (w alongside log r from the start: its decay rate dlog r/dx, up to e^{beta lambda}, would outrun
    # any explicit step where the time is far out of range.)
    if -log_2n - log_b0 >= _LOG_LARGEST:
        # log r grows from gamma0 at g / (2 n b0) > 1.8e308 g per unit x (beta lambda (1 - gamma0) > 709,
        # gamma0 < -0.18 within the cells' beta lambda <= 600): past float64 on the least step of x between
        # two levels (the scale below overflowed: a RuntimeError and 400 overflow warnings, found by a
        # hostile tester).
        return float("inf")
    radius_scale = np.exp(-log_2n - log_b0)

    def rest(x):  # (S(x1) - S(x)) e^{-ell0}
        return plain.y[0, -1] - plain.sol(x)[0]

    def bound_beyond_range(x, y):
        return _LOG_LARGEST - y[0] * radius_scale - ell0 - np.log(max(rest(x), np.finfo(float).tiny))

    def time_beyond_range(x, y):
        return _LOG_LARGEST - y[0] - ell0 - np.log(max(y[1], np.finfo(float).tiny))

    def scaled_growth(x, y):
        _, log_b, radial = terms(x)
        return [radial * np.exp(log_b0 - log_b)]

    def scaled_time(x, y):
        ell, log_b, radial = terms(x)
        growth = radial * np.exp(-log_2n - log_b)
        return [growth, np.exp(ell - ell0) - y[1] * growth]

    bound_beyond_range.terminal = time_beyond_range.terminal = True
    radius = solve_ivp(scaled_growth, span, [0.0], events=bound_beyond_range, **ode)
    if radius.status == 1:
        return float("inf")
    if not radius.success:
        raise RuntimeError(f"equiangular time ({shape.name}) failed: {radius.message}")
    sol = solve_ivp(scaled_time, span, [0.0, 0.0], events=time_beyond_range, **ode)
    if sol.status == 1:
        return float("inf")
    if not sol.success:
        raise RuntimeError(f"equiangular time ({shape.name}) failed: {sol.message}")
    log_r, scaled = sol.y[:, -1]
    log_time = log_r + ell0 + np.log(scaled)
    return float(np.exp(log_time)) if log_time < _LOG_LARGEST else float("inf")


# log T past which a time leaves float64 (e^709.78 ~ 1.8e308).
_LOG_LARGEST = float(np.log(np.finfo(float).max))
