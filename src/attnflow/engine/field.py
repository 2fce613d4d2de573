"""The attention vector field of one trajectory, compiled (docs/model.md, "State and dynamics").

One trajectory per call, so the integrator can run one trajectory per thread
with single-threaded BLAS for the products: the arithmetic of a trajectory is
the same whatever its batch or the core count, hence bit-identical results.
The weights are computed here and only here (``attention_weights``); the
measurements (``measure``) read them from the workspace of the last evaluation.
"""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np

from ..attention import MaskRule, Weights
from ..geometry import Motion
from ..heads import Form
from .machinery import (
    borrow,
    copy_into,
    dereference,
    exp_inplace,
    flat,
    lane_max,
    lane_sum,
    matmul,
    transpose_into,
)

# The score and value matrices of one trajectory's heads as the compiled code applies them (or of a
# batch, each array with a leading axis of B or 1), in the form ``form`` (``heads.Form``: how the
# rows ``X M_h`` are computed). Arrays the form does not use are empty.
#   diagonal (H, d), dense (H, d, d) = M_h, u (H, d, r), ut (H, r, d), eig (H, r): M_h = U diag(e) U^T
#   values_t (H, d, d) = V_h^T;  shared: value alignment V_h = M_h (values_t unused);  H: the number of heads
HeadArrays = namedtuple("HeadArrays", "form diagonal dense u ut eig values_t shared H")

# The flow and what its observable groups measure, from the attention declaration
# (``attnflow.attention``), the mask and the geometry (``attnflow.geometry``); plain ints, bools and
# one float, so every flow compiles to the same specialisation.
#   weights, energy, entropy: the rules (``Weights``, ``Energy``, ``Entropy``)
#   normalised, over_n: rows divided by Z_i; v = (1/n) sum_h f^h
#   mask: which pairs attend (``MaskRule``);  motion: dx/dt from v (``Motion``, ``motion``)
#   radii: the state is x_k = r_k theta_k, attention reads theta_k;  on_sphere: retract after each step
#   alpha: nGPT's step size (read by Motion.UNIT_TANGENT only)
Flow = namedtuple("Flow", "weights normalised over_n energy entropy mask motion radii on_sphere alpha")

# Buffers of one trajectory, reused by every evaluation. After ``field`` they hold
# that evaluation's intermediate results, which ``measure`` reads.
#   xt (d, n)      X^T (the right operand of the scores)
#   y (H, n, d)    rows y^h_j = M_h x_j
#   z, zl (H, n, r), zt (H, r, n), wz (n, r)   factored heads: Z = X U_h, ZL = Z diag(e_h)
#   w (H, n, n)    weights w^h_ij, softmax's times Z_i (scores before ``attention_weights``)
#   sraw (H, n, n) raw scores s^h_ij (kept only when asked)
#   rowmax, rowsum (H, n)  softmax shift m_i and normaliser Z_i (see ``attention_weights``)
#   f (H, n, d)    head outputs f^h_i;  v (n, d) velocity before projection;  xv (n, d) X V_h^T
#   y_rows (H n, d)  y with the heads' rows stacked, for the score rates (a view made once: numba's
#                  reshape calls a C helper, which a small cell feels when taken per evaluation)
#   theta (n, d)   the directions x_k / ||x_k|| where the state carries radii (``Flow.radii``)
Workspace = namedtuple("Workspace", "xt y z zl zt wz w sraw rowmax rowsum f v xv y_rows theta")


@numba.njit(cache=True)
def workspace(n, d, H, r, keep_scores, separate_values):
    y = np.empty((H, n, d))
    return Workspace(
        np.empty((d, n)), y, np.empty((H, n, r)), np.empty((H, n, r)),
        np.empty((H, r, n)), np.empty((n, r)), np.empty((H, n, n)),
        np.empty((H, n, n)) if keep_scores else np.empty((0, 0, 0)),
        np.zeros((H, n)), np.zeros((H, n)), np.empty((H, n, d)), np.empty((n, d)),
        np.empty((n, d)) if separate_values else np.empty((0, 0)),
        y.reshape(H * n, d), np.empty((n, d)),
    )


# The weight rules with a branch in ``attention_weights``: ``contract.check_attention`` refuses any other.
COMPILED_WEIGHTS = frozenset({Weights.SOFTMAX, Weights.EXP, Weights.RELU, Weights.SIGMOID})
# The head forms with a branch in ``head_rows`` and ``field``.
COMPILED_FORMS = frozenset({Form.DIAGONAL, Form.DENSE, Form.FACTORED})
# The mask rules with a branch in ``attended`` and ``_mask_rows``: ``contract.check_mask`` refuses any other.
COMPILED_MASKS = frozenset({MaskRule.NONE, MaskRule.CAUSAL})
# The motion rules with a branch in ``motion``: ``contract.check_geometry`` refuses any other.
COMPILED_MOTIONS = frozenset({Motion.TANGENT, Motion.FREE, Motion.UNIT, Motion.UNIT_TANGENT})


@numba.njit(cache=True, inline="always")
def unit_rows_into(x, out):
    """``out_k = x_k / ||x_k||`` for every row (the directions of a state with radii)."""
    n, d = x.shape
    for i in range(n):
        norm = 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
        inv = 1.0 / np.sqrt(norm)
        for k in range(d):
            out[i, k] = x[i, k] * inv


@numba.njit(cache=True, inline="always")
def motion(flow, v, x, out):
    """``dx/dt`` into ``out`` from the attention velocity ``v`` read at the unit rows ``x`` (the tokens on
    the sphere, or the directions), by the geometry's motion rule (``geometry.Motion``)."""
    n, d = v.shape
    rule = flow.motion
    tangent = rule == Motion.TANGENT or rule == Motion.UNIT_TANGENT
    unit = rule == Motion.UNIT or rule == Motion.UNIT_TANGENT
    known = tangent or rule == Motion.FREE or rule == Motion.UNIT
    for i in range(n):
        radial = 0.0
        if tangent:
            for k in range(d):
                radial += v[i, k] * x[i, k]
        scale = 1.0
        if unit:
            norm = 0.0
            for k in range(d):
                norm += v[i, k] * v[i, k]
            scale = (flow.alpha if rule == Motion.UNIT_TANGENT else 1.0) / np.sqrt(norm)
        if not known:  # unreachable: check_geometry refuses a rule without its branch; poison
            scale = np.nan
        if unit or not known:
            for k in range(d):
                out[i, k] = scale * (v[i, k] - radial * x[i, k])
        else:  # the sphere and flat space as they always were, to the last bit
            for k in range(d):
                out[i, k] = v[i, k] - radial * x[i, k]


@numba.njit(cache=True, inline="always")
def attended(mask, i, n):
    """How many tokens token ``i`` attends to, the first ones (j < attended), under the mask rule."""
    if mask == MaskRule.NONE:
        return n
    if mask == MaskRule.CAUSAL:
        return i + 1
    return 0  # unreachable: check_mask refuses a rule without its branch; an empty row gives NaN


@numba.njit(cache=True, inline="always")
def _mask_rows(s, mask):
    """Zero the weights the mask removes, after the rule computed them."""
    if mask == MaskRule.NONE:
        return
    n = s.shape[0]
    if mask == MaskRule.CAUSAL:  # j > i
        for i in range(n):
            for j in range(i + 1, n):
                s[i, j] = 0.0
    else:  # unreachable: check_mask refuses a rule without its branch; poison, as attention_weights
        s[:, :] = np.nan


@numba.njit(cache=True, inline="always")
def attention_weights(flow, s, beta, rowmax, rowsum):
    """Turn the scores ``s`` (n, n) into weights in place, softmax's up to a row factor.

    softmax: ``exp(beta (s_ij - m_i))`` with ``m_i`` the row maximum (no
    overflow), and ``Z_i`` the row sum; the weights are these over ``Z_i``, a
    division ``field`` applies to the n rows of each head output instead of
    the n^2 weights (``row_scale``). exp: ``exp(beta s_ij)`` (``Cell`` bounds
    ``beta ||M_h||``), ``Z_i`` kept for the observables. relu: ``max(beta
    s_ij, 0) / n``. sigmoid: ``1 / (1 + exp(log n - beta s_ij))``, ``Z_i`` kept
    for the entropy (``Cell``'s bound keeps the exponent below 709). Under a
    mask, ``m_i`` and ``Z_i`` run over the pairs it keeps (``j <= i``: causal)
    and the other weights are 0. Whole-matrix passes, so each loop is long enough to vectorise.
    ``rowmax``/``rowsum`` keep ``m_i`` (0 but for softmax) and ``Z_i``.
    """
    n = s.shape[0]
    kind = flow.weights
    if kind == Weights.RELU:
        inv_n = 1.0 / n
        for i in range(n):
            rowmax[i] = 0.0
            for j in range(n):
                s[i, j] = max(beta * s[i, j], 0.0) * inv_n
        _mask_rows(s, flow.mask)
        if flow.normalised:  # a declaration may ask to normalise any rule's rows
            for i in range(n):
                rowsum[i] = lane_sum(s[i])
        return
    if kind == Weights.SOFTMAX:
        for i in range(n):
            if flow.mask == MaskRule.NONE:
                m = lane_max(s[i])
            elif flow.mask == MaskRule.CAUSAL:  # a plain loop: lane_max on a slice is slower
                m = s[i, 0]
                for j in range(1, i + 1):
                    m = max(m, s[i, j])
            else:  # unreachable: check_mask refuses a rule without its branch; poison
                m = np.nan
            rowmax[i] = m
            for j in range(n):
                s[i, j] = beta * (s[i, j] - m)
    elif kind == Weights.EXP:
        for i in range(n):
            rowmax[i] = 0.0
            for j in range(n):
                s[i, j] = beta * s[i, j]
    elif kind == Weights.SIGMOID:
        bias = np.log(n)
        for i in range(n):
            rowmax[i] = 0.0
            for j in range(n):
                s[i, j] = bias - beta * s[i, j]
    else:
        # Unreachable: contract.check_attention refuses such a declaration by name before any compiled code
        # runs. Poison, not raise: a raise here slows every field evaluation.
        s[:, :] = np.nan
    _mask_rows(s, flow.mask)  # masked entries may exceed exp's range: never exponentiate them
    exp_inplace(flat(s))  # not s.ravel(): numba's reshape helper costs a call per evaluation
    if kind == Weights.SIGMOID:
        for i in range(n):
            for j in range(n):
                s[i, j] = 1.0 / (1.0 + s[i, j])
    _mask_rows(s, flow.mask)
    for i in range(n):
        rowsum[i] = lane_sum(s[i])


@numba.njit(cache=True, inline="always")
def row_scale(flow, f, rowsum):
    """Divide a normalised head output's rows by ``Z_i`` (see ``attention_weights``)."""
    if not flow.normalised:
        return
    n, d = f.shape
    for i in range(n):
        inv = 1.0 / rowsum[i]
        for k in range(d):
            f[i, k] *= inv


@numba.njit(cache=True, inline="always")
def head_rows(x, hd, h, ws):
    """``y^h_j = M_h x_j`` for every token into ``ws.y[h]`` (the factored form goes through Z)."""
    n, d = x.shape
    y = ws.y[h]
    if hd.form == Form.DIAGONAL:
        for j in range(n):
            for k in range(d):
                y[j, k] = x[j, k] * hd.diagonal[h, k]
    elif hd.form == Form.DENSE:
        matmul(x, hd.dense[h], y)
    elif hd.form == Form.FACTORED:
        matmul(ws.zl[h], hd.ut[h], y)
    else:  # unreachable: every Form has a branch (checked at import); poison, as attention_weights
        y[:, :] = np.nan


@numba.njit(cache=True)
def field(x, out, heads_ref, flow, beta, keep_scores, need_rows, work_ref):
    """Write ``dx/dt`` at ``x`` (n, d) into ``out``; intermediate results stay in the ``Workspace``.

    ``heads_ref`` and ``work_ref`` are references (``machinery.by_reference``) to the trajectory's
    ``HeadArrays`` and ``Workspace``. ``keep_scores`` keeps the raw scores s^h_ij in ``ws.sraw``;
    ``need_rows`` makes sure ``ws.y`` holds the rows ``M_h x_j`` also in the factored form (both for the
    observable groups). Where the state carries radii (``flow.radii``), attention reads the directions
    ``ws.theta``, and the workspace holds their scores and rows.
    """
    x, out = borrow((x, out))
    hd, ws = dereference(heads_ref), dereference(work_ref)
    if flow.radii:
        unit_rows_into(x, ws.theta)
        x = ws.theta
    n, d = x.shape
    H = ws.f.shape[0]
    transpose_into(x, ws.xt)
    v = ws.v
    v[:] = 0.0
    for h in range(H):
        s = ws.w[h]
        if hd.form == Form.FACTORED:
            r = hd.eig.shape[1]
            z, zl, zt = ws.z[h], ws.zl[h], ws.zt[h]
            matmul(x, hd.u[h], z)
            for j in range(n):
                for k in range(r):
                    zl[j, k] = z[j, k] * hd.eig[h, k]
                    zt[k, j] = z[j, k]
            matmul(zl, zt, s)  # s_ij = <x_i, M_h x_j> = z_i^T diag(e) z_j
            if need_rows:
                head_rows(x, hd, h, ws)
        elif hd.form == Form.DIAGONAL or hd.form == Form.DENSE:
            # A product per head, not one for every head ([Y_1; ...; Y_H] X^T): OpenBLAS computes
            # rows at the tail of a block with another kernel, so a head's scores would depend on
            # where its rows sit in the stack (last bits, at n = 3 or 17, say).
            head_rows(x, hd, h, ws)
            matmul(ws.y[h], ws.xt, s)  # s_ij = <M_h x_i, x_j>
        else:  # unreachable: every Form has a branch (checked at import); poison, as attention_weights
            s[:, :] = np.nan
        if keep_scores:
            copy_into(ws.sraw[h], s)
        attention_weights(flow, s, beta, ws.rowmax[h], ws.rowsum[h])
        f = ws.f[h]
        if not hd.shared:
            matmul(x, hd.values_t[h], ws.xv)  # rows V_h x_j
            matmul(s, ws.xv, f)
        elif hd.form == Form.FACTORED:
            matmul(s, ws.zl[h], ws.wz)
            matmul(ws.wz, hd.ut[h], f)
        elif hd.form == Form.DIAGONAL or hd.form == Form.DENSE:
            matmul(s, ws.y[h], f)
        else:  # unreachable, as above
            f[:, :] = np.nan
        row_scale(flow, f, ws.rowsum[h])
        for i in range(n):
            for k in range(d):
                v[i, k] += f[i, k]
    if flow.over_n:
        v *= 1.0 / n
    motion(flow, v, x, out)
