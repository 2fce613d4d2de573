"""One step of an explicit Runge-Kutta pair with its embedded error estimate, the step-size controller
(scipy's RK45's: an integral controller, the same safety factor and bounds), the first step's size, the
dense output and the retraction onto the sphere, compiled (the loop: ``dopri``)."""

from __future__ import annotations

import numba
import numpy as np

from .field import field
from .machinery import borrow, copy_into, flat

SAFETY, _MIN_FACTOR, _MAX_FACTOR = 0.9, 0.2, 10.0


@numba.njit(cache=True)
def accumulate(row, base, stages, h, coeffs):
    """``row = base + sum_j (h coeffs[j]) stages[j]``, stage by stage (vectorising axpys over the flat
    entries)."""
    row, base, stages, coeffs = borrow((row, base, stages, coeffs))
    copy_into(row, base)
    out = flat(row)
    for j in range(coeffs.size):
        c = h * coeffs[j]
        if c != 0.0:
            k_j = flat(stages[j])
            for i in range(out.size):
                out[i] += c * k_j[i]


@numba.njit(cache=True)
def retract(x):
    """Scale every row (token) to unit norm; return the largest ``| ||x_i|| - 1 |`` removed."""
    x = borrow(x)
    worst = 0.0
    n, d = x.shape
    for i in range(n):
        norm = 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
        norm = np.sqrt(norm)
        worst = max(worst, abs(norm - 1.0))
        inv = 1.0 / norm
        for k in range(d):
            x[i, k] *= inv
    return worst


@numba.njit(cache=True)
def dense(out, y, stages, h, sigma, poly, weights, on_sphere):
    """The dense output at ``t + sigma h`` (retracted where the state lies on the sphere)."""
    out, y, stages, poly, weights = borrow((out, y, stages, poly, weights))
    n_stages, degree = poly.shape
    for j in range(n_stages):
        acc, power = 0.0, 1.0
        for k in range(degree):
            power *= sigma
            acc += poly[j, k] * power
        weights[j] = acc
    accumulate(out, y, stages, h, weights)
    if on_sphere:
        retract(out)


@numba.njit(cache=True)
def rms_scaled(a, y, rtol, atol):
    a, y = borrow((a, y))
    total = 0.0
    n, d = a.shape
    for i in range(n):
        for k in range(d):
            r = a[i, k] / (atol + abs(y[i, k]) * rtol)
            total += r * r
    return np.sqrt(total / a.size)


@numba.njit(cache=True, inline="always")
def initial_step(y, f0, hd_ref, flow, beta, method, control, span, buf, ws_ref):
    """First step size: Hairer, Norsett & Wanner, Solving ODEs I, Sec. II.4 (as scipy's RK45).

    Evaluates the field once, at ``y + h0 f0``. Returns 0 where no step can be
    sized: a field too large for float64 (the caller reports an underflow).
    """
    n, d = y.shape
    rtol, atol = control.rtol, control.atol
    off = np.bool_(False)
    d0, d1 = rms_scaled(y, y, rtol, atol), rms_scaled(f0, y, rtol, atol)
    h0 = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / max(d1, 1e-300)
    h0 = min(h0, span)
    if not (h0 > 0.0 and np.isfinite(d1)):
        return 0.0
    probe, f1 = buf.stage, buf.y_new
    for i in range(n):
        for k in range(d):
            probe[i, k] = y[i, k] + h0 * f0[i, k]
    field(probe, f1, hd_ref, flow, beta, off, off, ws_ref)
    f1 -= f0
    d2 = rms_scaled(f1, y, rtol, atol) / h0
    if d1 <= 1e-15 and d2 <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / max(max(d1, d2), 1e-300)) ** (1.0 / (method.error_order + 1))
    return min(min(100.0 * h0, h1), span)


@numba.njit(cache=True, inline="always")
def rk_step(y, h, hd_ref, flow, beta, method, control, buf, ws_ref):
    """One attempted step from ``y``: stages 1.. into ``buf.stages``, the solution into ``buf.y_new``.

    Stage 0 must hold ``f(y)``. With FSAL the last stage is evaluated at the
    new solution (its weights are ``b``), so it doubles as the next step's
    stage 0; without it, ``y_new`` is its own sum. Returns the scaled RMS norm
    of the embedded error estimate (NaN for a non-finite step).
    """
    stages, stage, y_new, err = buf.stages, buf.stage, buf.y_new, buf.err
    n_stages = method.a.shape[0]
    off = np.bool_(False)
    for s in range(1, n_stages):
        if method.fsal and s == n_stages - 1:
            accumulate(y_new, y, stages[:s], h, method.b[:s])
            field(y_new, stages[s], hd_ref, flow, beta, off, off, ws_ref)
        else:
            accumulate(stage, y, stages[:s], h, method.a[s, :s])
            field(stage, stages[s], hd_ref, flow, beta, off, off, ws_ref)
    if not method.fsal:
        accumulate(y_new, y, stages, h, method.b)
    e, start, end = flat(err), flat(y), flat(y_new)
    for i in range(e.size):
        e[i] = 0.0
    accumulate(err, err, stages, h, method.e)
    total = 0.0
    for i in range(e.size):  # the entries in memory order, token by token
        ratio = e[i] / (control.atol + control.rtol * max(abs(start[i]), abs(end[i])))
        total += ratio * ratio
    return np.sqrt(total / e.size)


@numba.njit(cache=True, inline="always")
def step_factor(err_norm, accepted, last_rejected, method):
    """The integral controller (as scipy's RK45): the next step over this one."""
    if err_norm == 0.0:
        factor = _MAX_FACTOR
    else:
        factor = SAFETY * err_norm ** (-1.0 / (method.error_order + 1))
    if accepted:
        return min(1.0 if last_rejected else _MAX_FACTOR, factor)
    if np.isnan(factor):
        return _MIN_FACTOR
    return min(max(factor, _MIN_FACTOR), 1.0)
