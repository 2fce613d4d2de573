"""The entropy of each token's attention row and its exact rate (Thm 27) at a sample, compiled
(``measure``)."""

from __future__ import annotations

import numba
import numpy as np

from ..attention import Entropy
from .energy import softmax_parts
from .field import attended
from .machinery import borrow, lane_sum

# The entropies with a branch in ``measure``: ``engine.check_declarations`` refuses any other.
COMPILED_ENTROPIES = frozenset({Entropy.SOFTMAX, Entropy.SIGMOID})


@numba.njit(cache=True, inline="always")
def softmax_entropy(flow, h, beta, xdot, ws, sc, out, b, t):
    """Entropy of ``p = softmax_j(beta s_ij)`` (over ``j <= i`` under a mask) and Thm 27's exact rate."""
    n = xdot.shape[0]
    softmax_parts(flow, h, beta, flow.mask, ws, sc)
    p, m, z = sc.p, sc.m, sc.z
    s, s_rate = ws.sraw[h], sc.sdot[h]
    row = sc.row
    for i in range(n):
        # H_i = -sum_j p log p = log Z_i - beta sum_j p_ij (s_ij - m_i)
        for j in range(n):
            row[j] = p[i, j] * s[i, j]
        mean_s = lane_sum(row)
        for j in range(n):
            row[j] = p[i, j] * (s[i, j] - m[i])
        out.entropy[b, t, h, i] = np.log(z[i]) - beta * lane_sum(row)
        for j in range(n):
            row[j] = p[i, j] * (s[i, j] - mean_s) * s_rate[i, j]
        out.entropy_rate[b, t, h, i] = -beta * beta * lane_sum(row)


@numba.njit(cache=True, inline="always")
def sigmoid_entropy(flow, h, beta, xdot, ws, sc, out, b, t):
    """Entropy of the row-normalised sigmoid weights ``p_ij = w_ij / Z_i`` and its exact rate.

    With logits ``l_j = log sigma(a_j)``, ``a = beta s - log n``: ``H_i = log Z_i -
    sum_j p_j l_j`` and ``dH_i/dt = -Cov_p(l, dl/dt)``, ``dl_j/dt = (1 - sigma(a_j))
    beta ds_j/dt`` (Thm 27's argument, with these logits). A row whose sum ``Z_i`` is
    not a normal float (every score of the row far below ``log n / beta``, as in the
    flat geometry) is taken in the log domain (``_sigmoid_entropy_row_logs``).
    """
    n = xdot.shape[0]
    s = ws.sraw[h]
    bias = np.log(n)
    logit, rate = sc.p, sc.sdot[h]  # rate overwrites the score rate s_rate it reads, entry by entry
    s_rate = rate
    for i in range(n):
        active = attended(flow.mask, i, n)
        total = 0.0
        for j in range(active):
            a = beta * s[i, j] - bias
            e = np.exp(-abs(a))
            w = 1.0 / (1.0 + e) if a >= 0.0 else e / (1.0 + e)
            logit[i, j] = -(max(-a, 0.0) + np.log1p(e))  # log sigma(a) = -softplus(-a)
            rate[i, j] = (1.0 - w) * beta * s_rate[i, j]
            sc.row[j] = w
            total += w
        if not total >= _SMALLEST_NORMAL:  # zero or subnormal: 1 / Z_i overflows or loses its digits
            entropy, entropy_rate = _sigmoid_entropy_row_logs(logit[i, :active], rate[i, :active],
                                                              sc.row[:active])
            out.entropy[b, t, h, i] = entropy
            out.entropy_rate[b, t, h, i] = entropy_rate
            continue
        mean_l = 0.0
        for j in range(active):
            mean_l += sc.row[j] / total * logit[i, j]
        cov = 0.0
        for j in range(active):
            cov += sc.row[j] / total * (logit[i, j] - mean_l) * rate[i, j]
        out.entropy[b, t, h, i] = np.log(total) - mean_l
        out.entropy_rate[b, t, h, i] = -cov


_SMALLEST_NORMAL = np.finfo(np.float64).tiny


@numba.njit(cache=True, inline="never")
def _sigmoid_entropy_row_logs(logit, rate, p):
    """One row's (entropy, rate) of ``_sigmoid_entropy`` from its logits alone, shifted by their
    maximum ``l*``: ``u_j = l_j - l*`` (<= 0, one of them 0), ``S = sum_j e^{u_j}`` in [1, n],
    ``p_j = e^{u_j} / S``, ``H_i = log S - sum_j p_j u_j`` and ``dH_i/dt = -Cov_p(u, dl/dt)``
    (shifting the logits changes neither). ``rate``: ``dl_j/dt``; ``p``: scratch of the row's length.
    Not inlined: rows this small are rare."""
    logit, rate, p = borrow((logit, rate, p))
    top = logit[0]
    for j in range(1, logit.size):
        top = max(top, logit[j])
    total = 0.0
    for j in range(logit.size):
        p[j] = np.exp(logit[j] - top)
        total += p[j]
    mean_u = 0.0
    for j in range(logit.size):
        p[j] /= total
        mean_u += p[j] * (logit[j] - top)
    cov = 0.0
    for j in range(logit.size):
        cov += p[j] * (logit[j] - top - mean_u) * rate[j]
    return np.log(total) - mean_u, -cov
