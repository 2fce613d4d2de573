"""Compiled right-hand side of the attention flow, batched over trajectories.

Profiling (benchmarks/bench_engine.py) showed that batched numpy broadcasting
loses to a per-trajectory loop at n=32 because of temporaries and
multi-threaded BLAS on tiny matrices. Here numba runs one trajectory per
thread (``prange``) and each trajectory's matrix products go to single-threaded
BLAS (callers wrap the integration in ``threadpool_limits(1)``): the same
arithmetic for a trajectory whatever the batch or the core count, hence
bit-identical results. Exponentials are left to numpy (see ``velocity``).
"""

from __future__ import annotations

import numba
import numpy as np

ATTENTION_CODES = {"softmax": 0, "usa": 1, "relu": 2}


@numba.njit(cache=True, parallel=True)
def _scores_phase(x, scores, beta, attention, logits, rows):
    """Per trajectory and head: ``rows = X M_h`` and the weights' exponents (or relu weights)."""
    n_batch, n, _ = x.shape
    n_heads = scores.shape[1]
    for b in numba.prange(n_batch):
        xb = np.ascontiguousarray(x[b])
        xb_t = np.ascontiguousarray(xb.T)
        for h in range(n_heads):
            # Products straight into the workspace: no temporaries, no copies.
            y = rows[b, h]
            np.dot(xb, scores[b, h], y)  # row j: M_h x_j
            out = logits[b, h]
            np.dot(y, xb_t, out)  # s_ij = <x_i, M_h x_j>, turned into exponents in place
            if attention == 0:  # softmax: subtract the row maximum so exp cannot overflow
                for i in range(n):
                    m = out[i, 0]
                    for j in range(1, n):
                        m = max(m, out[i, j])
                    for j in range(n):
                        out[i, j] = beta * (out[i, j] - m)
            elif attention == 1:  # usa: the Cell bounds beta ||M_h|| so exp stays finite
                for i in range(n):
                    for j in range(n):
                        out[i, j] = beta * out[i, j]
            else:  # relu: the weights themselves
                for i in range(n):
                    for j in range(n):
                        out[i, j] = max(beta * out[i, j], 0.0) / n


@numba.njit(cache=True, parallel=True)
def _output_phase(x, weights, rows, values_t, shared_values, attention, spherical, out):
    """``dx/dt`` from the weights: sum over heads of ``W_h (X V_h^T)``, then ``P_x``."""
    n_batch, n, d = x.shape
    n_heads = weights.shape[1]
    for b in numba.prange(n_batch):
        xb = x[b]
        v = np.zeros((n, d))
        head_out = np.empty((n, d))  # one buffer per trajectory, reused across heads
        for h in range(n_heads):
            w = weights[b, h]
            if attention == 0:
                for i in range(n):
                    inv = 1.0 / np.sum(w[i])
                    for j in range(n):
                        w[i, j] *= inv
            if shared_values:
                np.dot(w, rows[b, h], head_out)
            else:
                np.dot(w, np.dot(np.ascontiguousarray(xb), values_t[b, h]), head_out)
            v += head_out
        if attention == 1:
            v *= 1.0 / n
        for i in range(n):
            radial = 0.0
            if spherical:
                for k in range(d):
                    radial += v[i, k] * xb[i, k]
            for k in range(d):
                out[b, i, k] = v[i, k] - radial * xb[i, k]


class Workspace:
    """Buffers reused across calls for a batch shape ``(B, H, n, d)``."""

    def __init__(self):
        self.shape = None

    def get(self, n_batch, n_heads, n, d):
        if self.shape != (n_batch, n_heads, n, d):
            self.shape = (n_batch, n_heads, n, d)
            self.logits = np.empty((n_batch, n_heads, n, n))
            self.rows = np.empty((n_batch, n_heads, n, d))
        return self.logits, self.rows


def velocity(x, scores, values_t, shared_values, beta, attention, spherical, out, workspace=None):
    """Write ``dx/dt`` of every trajectory into ``out`` and return it.

    Parameters
    ----------
    x : (B, n, d) float64, C-contiguous
    scores : (B, H, d, d) float64, symmetric ``M_h`` per trajectory
    values_t : (B, H, d, d) float64, ``V_h^T`` (ignored when ``shared_values``)
    shared_values : bool, ``V_h = M_h`` (reuses ``X M_h``)
    attention : int, code from ``ATTENTION_CODES``
    spherical : bool, project onto the tangent space (MODEL.md ``P_x``)

    The exponentials run in numpy between two compiled phases: numpy's exp is
    SIMD-vectorised, numba's (without SVML) is scalar and cost half the time.
    (Splitting the exp over threads was measured and gained nothing.)
    """
    n_batch, n, d = x.shape
    logits, rows = (workspace or Workspace()).get(n_batch, scores.shape[1], n, d)
    _scores_phase(x, scores, beta, attention, logits, rows)
    if attention != 2:
        np.exp(logits, out=logits)
    _output_phase(x, logits, rows, values_t, shared_values, attention, spherical, out)
    return out


def flops_per_trajectory(n: int, d: int, H: int, shared_values: bool = True) -> int:
    """Floating-point operations of the matrix products in one ``velocity`` call."""
    per_head = 2 * n * d * d + 2 * n * n * d + 2 * n * n * d
    if not shared_values:
        per_head += 2 * n * d * d
    return H * per_head


@numba.njit(cache=True, inline="always")
def _accumulate(row, flat_k, b, scale, coeffs):
    """``row += scale * sum_j coeffs[j] K_j[b]``, one stage at a time.

    Stage by stage over contiguous rows, so the inner loop vectorises (a
    branch-free axpy; measured 3x faster than summing over stages per element).
    """
    for j in range(coeffs.size):
        c = scale * coeffs[j]
        if c != 0.0:
            k = flat_k[j, b]
            for e in range(row.size):
                row[e] += c * k[e]


@numba.njit(cache=True, inline="always")
def _normalise_blocks(row, width):
    """Scale each consecutive ``width``-block of ``row`` (a token) to unit norm; return max | norm - 1 |."""
    worst = 0.0
    for start in range(0, row.size, width):
        norm = 0.0
        for e in range(start, start + width):
            norm += row[e] * row[e]
        norm = np.sqrt(norm)
        worst = max(worst, abs(norm - 1.0))
        inv = 1.0 / norm
        for e in range(start, start + width):
            row[e] *= inv
    return worst


@numba.njit(cache=True, parallel=True)
def stage_state(y, h, stages, coeffs, out):
    """``out[b] = y[b] + h[b] * sum_j coeffs[j] stages[j, b]`` (RK stage input)."""
    n_batch = y.shape[0]
    flat_y = y.reshape(n_batch, -1)
    flat_k = stages.reshape(stages.shape[0], n_batch, -1)
    flat_out = out.reshape(n_batch, -1)
    for b in numba.prange(n_batch):
        row = flat_out[b]
        row[:] = flat_y[b]
        _accumulate(row, flat_k, b, h[b], coeffs)
    return out


@numba.njit(cache=True, parallel=True)
def error_norm(y, y_new, h, stages, weights, rtol, atol):
    """RMS over each trajectory of ``h sum_j weights[j] K_j / (atol + rtol max(|y|, |y_new|))``."""
    n_batch = y.shape[0]
    flat_y = y.reshape(n_batch, -1)
    flat_new = y_new.reshape(n_batch, -1)
    flat_k = stages.reshape(stages.shape[0], n_batch, -1)
    size = flat_y.shape[1]
    result = np.empty(n_batch)
    for b in numba.prange(n_batch):
        err = np.zeros(size)
        _accumulate(err, flat_k, b, h[b], weights)
        total = 0.0
        for e in range(size):
            r = err[e] / (atol + rtol * max(abs(flat_y[b, e]), abs(flat_new[b, e])))
            total += r * r
        result[b] = np.sqrt(total / size)
    return result


@numba.njit(cache=True, parallel=True)
def dense_state(y, h, stages, indices, sigma, poly, normalise):
    """Dense output ``y + h sum_s K_s sum_k poly[s, k] sigma^(k+1)`` for trajectories ``indices``.

    With ``normalise``, each row (token) is scaled to unit norm (the retraction).
    Scalar loops on purpose: a BLAS call here would round differently with the
    number of rows, and a trajectory's output must not depend on its batch.
    """
    n_batch = y.shape[0]
    n_stages, degree = poly.shape
    flat_y = y.reshape(n_batch, -1)
    flat_k = stages.reshape(n_stages, n_batch, -1)
    out = np.empty((indices.size,) + y.shape[1:])
    flat_out = out.reshape(indices.size, -1)
    for r in numba.prange(indices.size):
        b = indices[r]
        weights = np.empty(n_stages)
        for j in range(n_stages):
            acc, power = 0.0, 1.0
            for k in range(degree):
                power *= sigma[r]
                acc += poly[j, k] * power
            weights[j] = acc
        row = flat_out[r]
        row[:] = flat_y[b]
        _accumulate(row, flat_k, b, h[b], weights)
        if normalise:
            _normalise_blocks(row, y.shape[-1])
    return out


@numba.njit(cache=True, parallel=True)
def normalise_rows_inplace(a):
    """Scale every row (last axis) of ``a`` to unit norm; return the largest ``| ||row|| - 1 |``."""
    n_batch = a.shape[0]
    flat = a.reshape(n_batch, -1)
    worst = np.zeros(n_batch)
    for b in numba.prange(n_batch):
        worst[b] = _normalise_blocks(flat[b], a.shape[-1])
    return worst.max()
