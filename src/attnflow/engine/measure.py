"""Observables of one trajectory at one sample, compiled (docs/model.md, "Observables").

``measure`` runs right after ``field`` evaluated the velocity at the sample, and
reuses what that evaluation left in the workspace: the weights, the rows
``M_h x_j``, the head outputs ``f^h_i``, the softmax shift and normaliser.
Exponentials of the scores are recovered from the softmax parts
(``exp(beta s_ij) = Z_i e^{beta m_i} p_ij``) instead of being taken again.
"""

from __future__ import annotations

from collections import namedtuple
from enum import IntEnum

import numba
import numpy as np

from ..attention import Energy, Entropy, MaskRule, Weights
from .field import attended, unit_rows_into
from .machinery import borrow, copy_into, dereference, exp_inplace, lane_sum, matmul, transpose_into


class Group(IntEnum):
    """Index of each observable group in the engine's ``want`` flags (``observables.GROUPS``)."""

    COSINES = 0
    CLUSTERS = 1
    VELOCITY = 2
    ENERGY = 3
    RADIAL = 4
    ENTROPY = 5
    POSITIONS = 6
    ENERGY_PATH = 7  # written by the integration loop at every accepted step (dopri.step_rates), not here
    RADIUS = 8


class Metric(IntEnum):
    """Clustering criteria (``Cell.cluster_metric``)."""

    EPSILON = 0  # 1 - gamma_min <= threshold
    GAMMA_MEAN = 1  # gamma_mean >= threshold


# Output arrays of the batch, (B, T, ...) each, empty when their group is off.
Outputs = namedtuple(
    "Outputs",
    "gamma_mean gamma_min cluster_count kinetic gamma_mean_rate energy energy_rate radial_shadow "
    "tangential_power rd_margin rd_margin_sufficient entropy entropy_rate x energy_rate_min radius "
    "radius_mean radius_spread",
)

# Scratch of one trajectory's measurements.
#   row (n,): one row's terms, summed by ``lane_sum``
#   p (n, n), m, z (n,): row-stochastic softmax weights, their shift and normaliser (``_softmax_parts``)
#   sdot (H, n, n): score rates ds^h_ij/dt of every head (``_score_rates``), sdot_rows (H n, n) a view
#   with the heads' rows stacked;  xdt (d, n): (dX/dt)^T
#   seen, stack (n,) int64: ``count_clusters``' search
#   theta, theta_dot (n, d): the directions and their velocity where the state carries radii
Scratch = namedtuple("Scratch",
                     "gram p py sdot sdot_rows xdt fnorm radial seen stack row m z theta theta_dot")


@numba.njit(cache=True)
def scratch(n, d, H):
    sdot = np.empty((H, n, n))
    return Scratch(np.empty((n, n)), np.empty((n, n)), np.empty((n, d)), sdot, sdot.reshape(H * n, n),
                   np.empty((d, n)), np.empty((H, n)), np.empty((H, n)), np.empty(n, np.int64),
                   np.empty(n, np.int64), np.empty(n), np.empty(n), np.empty(n), np.empty((n, d)),
                   np.empty((n, d)))


@numba.njit(cache=True)
def gamma_mean(x):
    """Mean of ``<x_i, x_j>`` over pairs ``i < j``, as ``(|sum x|^2 - sum |x_i|^2) / (n (n-1))``."""
    x = borrow(x)
    n, d = x.shape
    total_sq, self_sq = 0.0, 0.0
    for k in range(d):
        col = 0.0
        for i in range(n):
            col += x[i, k]
            self_sq += x[i, k] * x[i, k]
        total_sq += col * col
    return (total_sq - self_sq) / (n * (n - 1))


@numba.njit(cache=True)
def gram_min(x, xt, gram):
    """``gram = X X^T``; returns the smallest off-diagonal entry."""
    x, xt, gram = borrow((x, xt, gram))
    matmul(x, xt, gram)
    n = x.shape[0]
    low = np.inf
    for i in range(n):
        for j in range(i + 1, n):
            low = min(low, gram[i, j])
    return low


@numba.njit(cache=True)
def criterion_value(x, xt, gram, metric, threshold, radii, theta):
    """The clustering metric at ``x``: epsilon = 1 - gamma_min, or gamma_mean; of the directions
    (into ``theta``) where the state carries radii (``radii``).

    For epsilon, ``1 - gamma_mean`` is a lower bound (the minimum is at most the
    mean): while it is above ``threshold`` the criterion cannot hold and the
    O(n^2 d) Gram matrix is skipped.
    """
    x, xt, gram, theta = borrow((x, xt, gram, theta))
    if radii:
        unit_rows_into(x, theta)
        x = theta
    mean = gamma_mean(x)
    if metric == Metric.EPSILON:
        if 1.0 - mean > threshold:
            return 1.0 - mean
        transpose_into(x, xt)
        return 1.0 - gram_min(x, xt, gram)
    if metric == Metric.GAMMA_MEAN:
        return mean
    return np.nan  # unreachable: every Metric has a branch (checked at import); NaN never meets one


@numba.njit(cache=True)
def count_clusters(gram, level, seen, stack):
    """Connected components of the graph with an edge where ``gram_ij >= level`` (``i < j``: the
    upper triangle decides, for both directions), by depth-first search.

    Each token's row is scanned once, when it leaves the stack: n^2 comparisons
    and no finds (a union-find over the pairs is slow once the tokens cluster and
    every pair is an edge).
    ``seen`` and ``stack``: (n,) int64 scratch.
    """
    gram, seen, stack = borrow((gram, seen, stack))
    n = gram.shape[0]
    for i in range(n):
        seen[i] = 0
    count = 0
    for root in range(n):
        if seen[root]:
            continue
        count += 1
        seen[root] = 1
        stack[0] = root
        top = 1
        while top > 0:
            top -= 1
            i = stack[top]
            for j in range(i):
                if not seen[j] and gram[j, i] >= level:
                    seen[j] = 1
                    stack[top] = j
                    top += 1
            for j in range(i + 1, n):
                if not seen[j] and gram[i, j] >= level:
                    seen[j] = 1
                    stack[top] = j
                    top += 1
    return count


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


# The rules with a branch in ``measure``: ``engine.check_declarations`` refuses any other.
# Metrics: branches of criterion_value, dopri._met and dopri._sampled_value.
COMPILED_METRICS = frozenset({Metric.EPSILON, Metric.GAMMA_MEAN})
COMPILED_ENERGIES = frozenset({Energy.EXP, Energy.SOFTPLUS})
COMPILED_ENTROPIES = frozenset({Entropy.SOFTMAX, Entropy.SIGMOID})


@numba.njit(cache=True, inline="always")
def _softmax_parts(flow, h, beta, mask, ws, sc):
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
def _exp_energy(flow, h, beta, xdot, shared_rows, ws, sc):
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
    _softmax_parts(flow, h, beta, MaskRule.NONE, ws, sc)
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
def _softplus_energy(flow, h, beta, xdot, shared_rows, ws, sc):
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
def _score_rates(xdot, ws, sc):
    """``ds^h_ij/dt = <xdot_i, y^h_j> + <xdot_j, y^h_i>`` (symmetric M_h) of every head into ``sc.sdot``.

    One product for all heads, ``D = [Y_1; ...; Y_H] (dX/dt)^T`` with ``D^h_ij = <y^h_i, xdot_j>``,
    on a transposed copy of dX/dt: a transposed operand, or a product per head, is slower.
    """
    H = ws.y.shape[0]
    transpose_into(xdot, sc.xdt)
    matmul(ws.y_rows, sc.xdt, sc.sdot_rows)
    for h in range(H):
        _add_transpose(sc.sdot[h])


@numba.njit(cache=True, inline="always")
def _softmax_entropy(flow, h, beta, xdot, ws, sc, out, b, t):
    """Entropy of ``p = softmax_j(beta s_ij)`` (over ``j <= i`` under a mask) and Thm 27's exact rate."""
    n = xdot.shape[0]
    _softmax_parts(flow, h, beta, flow.mask, ws, sc)
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
def _sigmoid_entropy(flow, h, beta, xdot, ws, sc, out, b, t):
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


@numba.njit(cache=True, inline="always")
def _radius(x, out, b, t):
    """The radii ``r_k = ||x_k||``, their mean and their spread (standard deviation over the tokens)."""
    n, d = x.shape
    total = 0.0
    for i in range(n):
        norm = 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
        r = np.sqrt(norm)
        out.radius[b, t, i] = r
        total += r
    mean = total / n
    spread = 0.0
    for i in range(n):
        spread += (out.radius[b, t, i] - mean) ** 2
    out.radius_mean[b, t] = mean
    out.radius_spread[b, t] = np.sqrt(spread / n)


@numba.njit(cache=True, inline="always")
def _directions(x, xdot, velocity, theta, theta_dot):
    """``theta_k = x_k / r_k`` and, with a ``velocity``, ``dtheta_k/dt = P_{theta_k}(dx_k/dt) / r_k``."""
    unit_rows_into(x, theta)
    if not velocity:
        return
    n, d = x.shape
    for i in range(n):
        norm, radial = 0.0, 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
            radial += xdot[i, k] * theta[i, k]
        inv = 1.0 / np.sqrt(norm)
        for k in range(d):
            theta_dot[i, k] = (xdot[i, k] - radial * theta[i, k]) * inv


@numba.njit(cache=True)
def measure(x, xdot, sampling, flow, beta, shared_rows, cluster_level, work_ref, scratch_ref, out_ref, b, t):
    """Write the variables of the groups ``sampling`` wants at state ``x`` (velocity ``xdot``) into
    the ``Outputs``' ``[b, t]``.

    ``work_ref``, ``scratch_ref`` and ``out_ref`` are references (``machinery.by_reference``) to the
    trajectory's ``Workspace``, its ``Scratch`` and the batch's ``Outputs``.
    When ``sampling.field``, ``ws`` must hold the evaluation of the field at
    ``x`` (with the raw scores if ``sampling.keep_scores``, and the rows). ``shared_rows``: the head
    outputs are ``W_h`` times the rows ``M_h x_j`` (value alignment), so
    ``sum_j exp(beta s_ij) M_h x_j`` follows from ``f`` without a product.
    The energies run over all pairs whatever the mask: they are functions of
    the positions, and their rates exact derivatives along any flow.
    Where the state carries radii (``flow.radii``) every group but ``radius`` reads the directions
    ``theta_k = x_k / ||x_k||`` and their velocity ``P_{theta_k}(dx_k/dt) / r_k``.
    Returns the largest ``| ||x_i|| - 1 |`` (of the directions, where the state carries radii).
    """
    x, xdot, sampling = borrow((x, xdot, sampling))
    ws, sc, out = dereference(work_ref), dereference(scratch_ref), dereference(out_ref)
    n, d = x.shape
    H = ws.f.shape[0]
    want = sampling.want
    if want[Group.RADIUS.value]:
        _radius(x, out, b, t)
    if flow.radii:
        _directions(x, xdot, sampling.field, sc.theta, sc.theta_dot)
        x, xdot = sc.theta, sc.theta_dot
    drift = 0.0
    for i in range(n):
        norm = 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
        drift = max(drift, abs(np.sqrt(norm) - 1.0))

    out.gamma_mean[b, t] = gamma_mean(x)
    # The flags by each group's int (.value): numba before 0.68 takes no IntEnum member as an index.
    if want[Group.COSINES.value] or want[Group.CLUSTERS.value]:
        if not sampling.field:
            transpose_into(x, ws.xt)  # otherwise the field evaluation at x left it there
        out.gamma_min[b, t] = gram_min(x, ws.xt, sc.gram)
    if want[Group.CLUSTERS.value]:
        out.cluster_count[b, t] = count_clusters(sc.gram, cluster_level, sc.seen, sc.stack)
    if want[Group.POSITIONS.value]:
        copy_into(out.x[b, t], x)

    if want[Group.VELOCITY.value]:
        kinetic, self_rate = 0.0, 0.0
        for i in range(n):
            for k in range(d):
                kinetic += xdot[i, k] * xdot[i, k]
                self_rate += xdot[i, k] * x[i, k]
        cross = 0.0
        for k in range(d):
            sx, sv = 0.0, 0.0
            for i in range(n):
                sx += x[i, k]
                sv += xdot[i, k]
            cross += sx * sv
        out.kinetic[b, t] = kinetic / n
        # d/dt sum_{i<j} <x_i, x_j> = <sum xdot, sum x> - sum_i <xdot_i, x_i>
        out.gamma_mean_rate[b, t] = 2.0 * (cross - self_rate) / (n * (n - 1))

    for h in range(H if want[Group.ENERGY.value] else 0):
        if flow.energy == Energy.EXP:
            energy, rate = _exp_energy(flow, h, beta, xdot, shared_rows, ws, sc)
        elif flow.energy == Energy.SOFTPLUS:
            energy, rate = _softplus_energy(flow, h, beta, xdot, shared_rows, ws, sc)
        else:  # unreachable after engine.check_declarations; poison, not raise (field.attention_weights)
            energy, rate = np.nan, np.nan
        out.energy[b, t, h] = energy
        out.energy_rate[b, t, h] = rate
    if want[Group.ENTROPY.value]:
        _score_rates(xdot, ws, sc)
    for h in range(H if want[Group.ENTROPY.value] else 0):
        if flow.entropy == Entropy.SOFTMAX:
            _softmax_entropy(flow, h, beta, xdot, ws, sc, out, b, t)
        elif flow.entropy == Entropy.SIGMOID:
            _sigmoid_entropy(flow, h, beta, xdot, ws, sc, out, b, t)
        else:  # unreachable after engine.check_declarations; poison rather than raise
            out.entropy[b, t, h] = np.nan
            out.entropy_rate[b, t, h] = np.nan

    if want[Group.RADIAL.value]:
        for h in range(H):
            f = ws.f[h]
            for i in range(n):
                a, norm2 = 0.0, 0.0
                for k in range(d):
                    a += f[i, k] * x[i, k]
                    norm2 += f[i, k] * f[i, k]
                sc.radial[h, i] = a
                sc.fnorm[h, i] = np.sqrt(norm2)
        for h in range(H):
            f = ws.f[h]
            for i in range(n):
                a = sc.radial[h, i]
                tangential = 0.0
                for k in range(d):
                    u = f[i, k] - a * x[i, k]
                    tangential += u * u
                others, largest = 0.0, 0.0
                for g in range(H):
                    if g != h:
                        others += sc.radial[g, i]
                        largest = max(largest, sc.fnorm[g, i])
                out.radial_shadow[b, t, h, i] = a
                out.tangential_power[b, t, h, i] = tangential
                out.rd_margin[b, t, h, i] = tangential - a * others
                out.rd_margin_sufficient[b, t, h, i] = tangential - (H - 1) * abs(a) * largest
    return drift
