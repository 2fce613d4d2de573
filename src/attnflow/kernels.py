"""Compiled right-hand side of the attention flow, batched over trajectories.

Profiling (benchmarks/bench_engine.py) showed that batched numpy broadcasting
loses to a per-trajectory loop at n=32 because of temporaries and
multi-threaded BLAS on tiny matrices. Here numba runs one trajectory per
thread (``prange``) and each trajectory's matrix products go to single-threaded
BLAS (callers wrap the integration in ``threadpool_limits(1)``): the same
arithmetic for a trajectory whatever the batch or the core count, hence
bit-identical results.
"""

from __future__ import annotations

import numba
import numpy as np

ATTENTION_CODES = {"softmax": 0, "usa": 1, "relu": 2}


@numba.njit(cache=True, inline="always")
def _weights_inplace(s, beta, attention, n):
    """Turn raw scores ``s`` (n x n) into attention weights, in place."""
    rows, cols = s.shape
    if attention == 0:
        for i in range(rows):
            m = -np.inf
            for j in range(cols):
                if s[i, j] > m:
                    m = s[i, j]
            total = 0.0
            for j in range(cols):
                e = np.exp(beta * (s[i, j] - m))
                s[i, j] = e
                total += e
            inv = 1.0 / total
            for j in range(cols):
                s[i, j] *= inv
    elif attention == 1:
        for i in range(rows):
            for j in range(cols):
                s[i, j] = np.exp(beta * s[i, j])
    else:
        inv_n = 1.0 / n
        for i in range(rows):
            for j in range(cols):
                v = beta * s[i, j]
                s[i, j] = v * inv_n if v > 0.0 else 0.0


@numba.njit(cache=True, parallel=True)
def velocity(x, scores, values_t, shared_values, beta, attention, spherical, out):
    """Write ``dx/dt`` of every trajectory into ``out``.

    Parameters
    ----------
    x : (B, n, d) float64
    scores : (B, H, d, d) float64, symmetric ``M_h`` per trajectory
    values_t : (B, H, d, d) float64, ``V_h^T`` (ignored when ``shared_values``)
    shared_values : bool, ``V_h = M_h`` (saves one product per head)
    attention : int, code from ``ATTENTION_CODES``
    spherical : bool, project onto the tangent space (MODEL.md ``P_x``)
    """
    n_batch, n, d = x.shape
    n_heads = scores.shape[1]
    for b in numba.prange(n_batch):
        xb = np.ascontiguousarray(x[b])
        xb_t = np.ascontiguousarray(xb.T)
        v = np.zeros((n, d))
        for h in range(n_heads):
            y = np.dot(xb, scores[b, h])  # rows: M_h x_j
            s = np.dot(y, xb_t)  # s_ij = <x_i, M_h x_j>
            _weights_inplace(s, beta, attention, n)
            if shared_values:
                v += np.dot(s, y)
            else:
                v += np.dot(s, np.dot(xb, values_t[b, h]))
        if attention == 1:
            v *= 1.0 / n
        for i in range(n):
            radial = 0.0
            if spherical:
                for k in range(d):
                    radial += v[i, k] * xb[i, k]
            for k in range(d):
                out[b, i, k] = v[i, k] - radial * xb[i, k]
    return out


def flops_per_trajectory(n: int, d: int, H: int, shared_values: bool = True) -> int:
    """Floating-point operations of the matrix products in one ``velocity`` call."""
    per_head = 2 * n * d * d + 2 * n * n * d + 2 * n * n * d
    if not shared_values:
        per_head += 2 * n * d * d
    return H * per_head
