"""The per-head energies and their exact rates at a sample, compiled (``measure``; ``dopri.step_rates`` at
every accepted step). Exponentials of the scores come from the field's softmax parts."""

from __future__ import annotations

import numba
import numpy as np

from ..attention import Energy, MaskRule, Weights
from .field import attended
from .machinery import borrow, exp_inplace, matmul, transpose_into

# The energies with a branch in ``measure``: ``engine.check_declarations`` refuses any other.
COMPILED_ENERGIES = frozenset({Energy.EXP, Energy.SOFTPLUS})


@numba.njit(cache=True, inline="always")
def softmax_parts(flow, h, beta, mask, ws, sc):
    """Row-stochastic ``p`` with ``exp(beta s_ij) = Z_i e^{beta m_i} p_ij`` into ``sc.p``, ``sc.m``, ``sc.z``.

    From the field's weights where they are exponentials under the same mask,
    else from the raw scores. ``mask`` (``MaskRule``): rows over the pairs it keeps, the rest 0.
    """
    n = ws.w.shape[1]
    p = sc.p
    if (flow.weights == Weights.SOFTMAX or flow.weights == Weights.EXP) and mask == flow.mask:
        for i in range(n):
            inv = 1.0 / ws.rowsum[h, i]
            sc.m[i] = ws.rowmax[h, i]
            sc.z[i] = ws.rowsum[h, i]
            for j in range(n):
                p[i, j] = ws.w[h, i, j] * inv
        return
    s = ws.sraw[h]
    for i in range(n):
        active = attended(mask, i, n)
        m = s[i, 0]
        for j in range(1, active):
            m = max(m, s[i, j])
        row = p[i]
        for j in range(active):
            row[j] = beta * (s[i, j] - m)
        exp_inplace(row[:active])
        total = 0.0
        for j in range(active):
            total += row[j]
        inv = 1.0 / total
        for j in range(active):
            row[j] *= inv
        for j in range(active, n):
            row[j] = 0.0
        sc.m[i] = m
        sc.z[i] = total


@numba.njit(cache=True, inline="always")
def exp_energy(flow, h, beta, xdot, shared_rows, ws, sc):
    """``E_h = sum_ij exp(beta s_ij) / (2 beta n^2)`` and its exact rate (docs/model.md, "Observables"),
    over all pairs.

    ``g_i = sum_j exp(beta s_ij) M_h x_j = c_i (P Y)_i`` with ``c_i = Z_i e^{beta m_i}``.
    With value alignment and unmasked exponential weights ``exp(beta (s - m))``
    the head output already is ``P Y`` (rows normalised) or ``e^{-beta m_i} g_i``
    (not), so no product is needed.
    """
    exponential = flow.weights == Weights.SOFTMAX or flow.weights == Weights.EXP
    if shared_rows and flow.mask == MaskRule.NONE and exponential:
        return _exp_energy_sums(beta, ws.rowmax[h], ws.rowsum[h], ws.f[h], flow.normalised, xdot)
    softmax_parts(flow, h, beta, MaskRule.NONE, ws, sc)
    matmul(sc.p, ws.y[h], sc.py)
    return _exp_energy_sums(beta, sc.m, sc.z, sc.py, True, xdot)


@numba.njit(cache=True, inline="always")
def _exp_energy_sums(beta, m, z, py, scale_rows, xdot):
    """The sums of ``_exp_energy``: ``c_i = Z_i e^{beta m_i}`` and ``g_i = c_i (P Y)_i``, or
    ``g_i = e^{beta m_i} py_i`` when ``py`` is unnormalised (``scale_rows`` False)."""
    n, d = xdot.shape
    energy, rate = 0.0, 0.0
    for i in range(n):
        shift = np.exp(beta * m[i])  # exactly 1 for exp weights (m = 0)
        c = z[i] * shift
        energy += c
        dot = 0.0
        for k in range(d):
            dot += xdot[i, k] * py[i, k]
        rate += (c if scale_rows else shift) * dot
    return energy / (2.0 * beta * n * n), rate / (n * n)


@numba.njit(cache=True, inline="always")
def softplus_energy(flow, h, beta, xdot, shared_rows, ws, sc):
    """``E_h = sum_ij softplus(a_ij) / (2 beta n)``, ``a = beta s - log n``, and its exact rate.

    ``dE_h/dt = (1/n) sum_i <dx_i/dt, g_i>`` with ``g_i = sum_j sigma(a_ij) M_h x_j``
    (symmetric scores), which is the head output itself for unmasked sigmoid
    weights with value alignment (docs/model.md, result 8).
    """
    n, d = xdot.shape
    s = ws.sraw[h]
    bias = np.log(n)
    coeff = sc.p
    energy = 0.0
    for i in range(n):
        for j in range(n):
            a = beta * s[i, j] - bias
            e = np.exp(-abs(a))
            energy += max(a, 0.0) + np.log1p(e)
            coeff[i, j] = 1.0 / (1.0 + e) if a >= 0.0 else e / (1.0 + e)
    if shared_rows and flow.mask == MaskRule.NONE and not flow.normalised and flow.weights == Weights.SIGMOID:
        rate = _frobenius(xdot, ws.f[h])
    else:
        matmul(coeff, ws.y[h], sc.py)
        rate = _frobenius(xdot, sc.py)
    return energy / (2.0 * beta * n), rate / n


@numba.njit(cache=True, inline="always")
def _frobenius(a, b):
    """``sum_ik a_ik b_ik``."""
    n, d = a.shape
    total = 0.0
    for i in range(n):
        for k in range(d):
            total += a[i, k] * b[i, k]
    return total


@numba.njit(cache=True, inline="always")
def score_rates(xdot, ws, sc):
    """``ds^h_ij/dt = <xdot_i, y^h_j> + <xdot_j, y^h_i>`` (symmetric M_h) of every head into ``sc.sdot``.

    One product for all heads, ``D = [Y_1; ...; Y_H] (dX/dt)^T`` with ``D^h_ij = <y^h_i, xdot_j>``,
    on a transposed copy of dX/dt: a transposed operand, or a product per head, is slower.
    """
    H = ws.y.shape[0]
    transpose_into(xdot, sc.xdt)
    matmul(ws.y_rows, sc.xdt, sc.sdot_rows)
    for h in range(H):
        _add_transpose(sc.sdot[h])


@numba.njit(cache=True)
def _add_transpose(c):
    """``c <- c + c^T`` in place, by tiles (a plain column walk misses the cache at large n)."""
    c = borrow(c)
    n = c.shape[0]
    tile = 16
    for i0 in range(0, n, tile):
        i1 = min(i0 + tile, n)
        for j0 in range(i0, n, tile):
            j1 = min(j0 + tile, n)
            for i in range(i0, i1):
                for j in range(max(j0, i), j1):
                    total = c[i, j] + c[j, i]
                    c[i, j] = total
                    c[j, i] = total
