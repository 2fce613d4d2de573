"""The adaptive Runge-Kutta loop, compiled: one trajectory per thread, no Python per step.

Each trajectory takes its own steps with its own error control (so one stiff
trajectory never shrinks another's steps), samples its observables from the
tableau's dense output at the requested times, retracts onto the sphere after
each accepted step, and locates the first time its clustering criterion holds
by bisection on the dense output. The step-size controller mirrors scipy's
RK45 (an integral controller with the same safety factor and bounds), so the
two take comparable steps at the same tolerance.
"""

from __future__ import annotations

from enum import IntEnum

import numba
import numpy as np

from .field import Heads, field, workspace
from .measure import Group, Metric, criterion_value, measure, scratch

_SAFETY, _MIN_FACTOR, _MAX_FACTOR = 0.9, 0.2, 10.0
_EPS = np.finfo(np.float64).eps
_BISECTIONS = 60


class Status(IntEnum):
    OK = 0
    UNDERFLOW = 1  # step size below round-off of t: non-finite or stiff
    BUDGET = 2  # max_steps accepted + rejected steps spent


# Columns of the per-trajectory statistics.
STEPS, REJECTED, CALLS, STATUS = 0, 1, 2, 3
T_STOP, T_CLUSTER, RETRACTION, DRIFT = 0, 1, 2, 3


@numba.njit(cache=True)
def _accumulate(row, base, stages, h, coeffs):
    """``row = base + sum_j (h coeffs[j]) stages[j]``, stage by stage (vectorising axpys)."""
    n, d = row.shape
    for i in range(n):
        for k in range(d):
            row[i, k] = base[i, k]
    for j in range(coeffs.size):
        c = h * coeffs[j]
        if c != 0.0:
            k_j = stages[j]
            for i in range(n):
                for k in range(d):
                    row[i, k] += c * k_j[i, k]


@numba.njit(cache=True)
def _retract(x):
    """Scale every row (token) to unit norm; return the largest ``| ||x_i|| - 1 |`` removed."""
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
def _dense(out, y, stages, h, sigma, poly, weights, spherical):
    """The dense output at ``t + sigma h`` (retracted on the sphere)."""
    n_stages, degree = poly.shape
    for j in range(n_stages):
        acc, power = 0.0, 1.0
        for k in range(degree):
            power *= sigma
            acc += poly[j, k] * power
        weights[j] = acc
    _accumulate(out, y, stages, h, weights)
    if spherical:
        _retract(out)


@numba.njit(cache=True)
def _rms_scaled(a, y, rtol, atol):
    total = 0.0
    n, d = a.shape
    for i in range(n):
        for k in range(d):
            r = a[i, k] / (atol + abs(y[i, k]) * rtol)
            total += r * r
    return np.sqrt(total / a.size)


@numba.njit(cache=True)
def _met(value, metric, threshold):
    if metric == Metric.EPSILON:
        return value <= threshold
    return value >= threshold


@numba.njit(cache=True)
def solve_one(b, x0, hd, H, kind, beta, over_n, spherical, t_eval, rtol, atol, max_steps, fixed_step,
              a, bw, e, poly, order, want, metric, threshold, cluster_level, stop_at_cluster, out, counts,
              times):
    n, d = x0.shape
    r = hd.eig.shape[1]
    n_stages = a.shape[0]
    # Typed flags and indices (np.bool_, np.int64): a literal True/False/0 argument would
    # compile one more specialisation of field and measure for each call site.
    off, first = np.bool_(False), np.int64(0)
    sample_field = want[Group.VELOCITY] or want[Group.ENERGY] or want[Group.RADIAL] or want[Group.ENTROPY]
    keep_scores = want[Group.ENTROPY] or want[Group.ENERGY]
    ws = workspace(n, d, H, r, keep_scores, not hd.shared)
    sc = scratch(n, d, H)
    stages = np.empty((n_stages, n, d))
    y, y_new, stage, err = x0.copy(), np.empty((n, d)), np.empty((n, d)), np.empty((n, d))
    xs, xs_dot = np.empty((n, d)), np.empty((n, d))
    weights = np.empty(n_stages)
    t_first, t_end = t_eval[0], t_eval[-1]
    n_times = t_eval.size
    calls, steps, rejected = 0, 0, 0
    drift, retraction = 0.0, 0.0
    t_cluster = np.nan
    status = Status.OK

    field(y, stages[0], hd, kind, beta, over_n, spherical, keep_scores, sample_field, ws)
    calls += 1
    if sample_field:
        drift = measure(y, stages[0], want, kind, beta, hd.shared, cluster_level, ws, sc, out, b, first)
    else:
        drift = measure(y, y, want, kind, beta, hd.shared, cluster_level, ws, sc, out, b, first)
    found = _met(criterion_value(y, ws.xt, sc.gram, metric, threshold), metric, threshold)
    if found:
        t_cluster = t_first
        if stop_at_cluster:
            next_sample = n_times  # nothing left to integrate

    if fixed_step > 0.0:
        h = fixed_step
    else:  # Hairer, Norsett & Wanner, Solving ODEs I, Sec. II.4 (as scipy)
        f0 = stages[0]
        d0, d1 = _rms_scaled(y, y, rtol, atol), _rms_scaled(f0, y, rtol, atol)
        h0 = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / max(d1, 1e-300)
        h0 = min(h0, t_end - t_first)
        for i in range(n):
            for k in range(d):
                stage[i, k] = y[i, k] + h0 * f0[i, k]
        field(stage, y_new, hd, kind, beta, over_n, spherical, off, off, ws)
        calls += 1
        y_new -= f0
        d2 = _rms_scaled(y_new, y, rtol, atol) / h0
        if d1 <= 1e-15 and d2 <= 1e-15:
            h1 = max(1e-6, h0 * 1e-3)
        else:
            h1 = (0.01 / max(max(d1, d2), 1e-300)) ** (1.0 / (order + 1))
        h = min(min(100.0 * h0, h1), t_end - t_first)

    t = t_first
    next_sample = 1
    last_rejected = False
    exponent = -1.0 / (order + 1)
    while next_sample < n_times:
        remaining = t_end - t
        # Never leave a sliver of the interval that would need a round-off-sized step.
        if remaining - h < 100.0 * _EPS * max(abs(t_end), 1.0):
            h = remaining
        for s in range(1, n_stages - 1):
            _accumulate(stage, y, stages[:s], h, a[s, :s])
            field(stage, stages[s], hd, kind, beta, over_n, spherical, off, off, ws)
        _accumulate(y_new, y, stages[: n_stages - 1], h, bw[: n_stages - 1])
        field(y_new, stages[n_stages - 1], hd, kind, beta, over_n, spherical, off, off, ws)
        calls += n_stages - 1

        err[:, :] = 0.0
        _accumulate(err, err, stages, h, e)
        total = 0.0
        for i in range(n):
            for k in range(d):
                ratio = err[i, k] / (atol + rtol * max(abs(y[i, k]), abs(y_new[i, k])))
                total += ratio * ratio
        err_norm = np.sqrt(total / (n * d))
        accepted = err_norm < 1.0  # False for NaN, so a blow-up is retried smaller
        if fixed_step > 0.0:
            accepted = True
            err_norm = _SAFETY ** (order + 1)  # factor 1

        if err_norm == 0.0:
            factor = _MAX_FACTOR
        else:
            factor = _SAFETY * err_norm**exponent
        if accepted:
            factor = min(1.0 if last_rejected else _MAX_FACTOR, factor)
        else:
            if np.isnan(factor):
                factor = _MIN_FACTOR
            factor = min(max(factor, _MIN_FACTOR), 1.0)

        if accepted:
            steps += 1
            # A step clipped to the end lands on t_end exactly, not t + h rounded.
            t_new = t_end if h == t_end - t else t + h
            sigma_unmet = 0.0
            while next_sample < n_times and t_eval[next_sample] <= t_new:
                sigma = (t_eval[next_sample] - t) / h
                _dense(xs, y, stages, h, sigma, poly, weights, spherical)
                if sample_field:
                    field(xs, xs_dot, hd, kind, beta, over_n, spherical, keep_scores, sample_field, ws)
                    calls += 1
                    drift = max(drift, measure(xs, xs_dot, want, kind, beta, hd.shared, cluster_level,
                                               ws, sc, out, b, next_sample))
                else:
                    drift = max(drift, measure(xs, xs, want, kind, beta, hd.shared, cluster_level,
                                               ws, sc, out, b, next_sample))
                if not found:
                    value = (1.0 - out.gamma_min[b, next_sample] if metric == Metric.EPSILON
                             else out.gamma_mean[b, next_sample])
                    if _met(value, metric, threshold):
                        t_cluster = _locate(y, stages, h, t, sigma_unmet, sigma, poly, weights, spherical,
                                            metric, threshold, xs, ws, sc)
                        found = True
                    else:
                        sigma_unmet = sigma
                next_sample += 1
            if spherical:
                retraction = max(retraction, _retract(y_new))
            value = threshold if found else criterion_value(y_new, ws.xt, sc.gram, metric, threshold)
            if not found and _met(value, metric, threshold):
                t_cluster = _locate(y, stages, h, t, sigma_unmet, 1.0, poly, weights, spherical,
                                    metric, threshold, xs, ws, sc)
                found = True
            y[:, :] = y_new
            stages[0][:, :] = stages[n_stages - 1]
            # FSAL: the last stage is f at the unretracted point, an O(local error) offset.
            t = t_new
        else:
            rejected += 1
        h = h * factor
        last_rejected = not accepted

        if next_sample >= n_times or (stop_at_cluster and found):
            break
        if h < 16.0 * _EPS * max(abs(t), 1.0):
            status = Status.UNDERFLOW
            break
        if steps + rejected >= max_steps:
            status = Status.BUDGET
            break

    counts[b, STEPS] = steps
    counts[b, REJECTED] = rejected
    counts[b, CALLS] = calls
    counts[b, STATUS] = status
    times[b, T_STOP] = t
    times[b, T_CLUSTER] = t_cluster
    times[b, RETRACTION] = retraction
    times[b, DRIFT] = drift


@numba.njit(cache=True)
def _locate(y, stages, h, t, lo, hi, poly, weights, spherical, metric, threshold, xs, ws, sc):
    """First time in ``(t + lo h, t + hi h]`` where the criterion holds, by bisection on the dense output."""
    for _ in range(_BISECTIONS):
        if (hi - lo) * h <= 4.0 * _EPS * max(abs(t), 1.0):
            break
        mid = 0.5 * (lo + hi)
        _dense(xs, y, stages, h, mid, poly, weights, spherical)
        if _met(criterion_value(xs, ws.xt, sc.gram, metric, threshold), metric, threshold):
            hi = mid
        else:
            lo = mid
    return t + hi * h


@numba.njit(cache=True)
def _row(a, b):
    """Trajectory ``b``'s slice of a head array; one row is shared by every trajectory."""
    return a[b] if a.shape[0] > 1 else a[0]


@numba.njit(cache=True, parallel=True)
def solve_batch(x0, form, diag, dense, u, ut, eig, values_t, shared, H, kind, beta, over_n, spherical,
                t_eval, rtol, atol, max_steps, fixed_step, a, bw, e, poly, order, want, metric,
                threshold, cluster_level, stop_at_cluster, out, counts, times):
    """Integrate every trajectory of the batch (``prange``: one per thread at a time); ``beta`` is (B,)."""
    for b in numba.prange(x0.shape[0]):
        hd = Heads(form, _row(diag, b), _row(dense, b), _row(u, b), _row(ut, b), _row(eig, b),
                   _row(values_t, b), shared)
        solve_one(np.int64(b), np.ascontiguousarray(x0[b]), hd, H, kind, beta[b], over_n, spherical, t_eval,
                  rtol, atol,
                  max_steps, fixed_step, a, bw, e, poly, order, want, metric, threshold, cluster_level,
                  stop_at_cluster, out, counts, times)


@numba.njit(cache=True, parallel=True)
def observe_batch(x, form, diag, dense, u, ut, eig, values_t, shared, H, kind, beta, over_n, spherical,
                  want, cluster_level, out, drift):
    """The wanted observables of every configuration ``x[b]``, as sample 0 of ``out``."""
    for b in numba.prange(x.shape[0]):
        hd = Heads(form, _row(diag, b), _row(dense, b), _row(u, b), _row(ut, b), _row(eig, b),
                   _row(values_t, b), shared)
        xb = np.ascontiguousarray(x[b])
        n, d = xb.shape
        ws = workspace(n, d, H, hd.eig.shape[1], True, not shared)
        sc = scratch(n, d, H)
        xdot = np.empty((n, d))
        on = np.bool_(True)
        field(xb, xdot, hd, kind, beta[b], over_n, spherical, on, on, ws)
        drift[b] = measure(xb, xdot, want, kind, beta[b], shared, cluster_level, ws, sc, out, np.int64(b),
                           np.int64(0))
