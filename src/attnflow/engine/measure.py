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

from ..attention import Energy, Entropy
from .cosines import count_clusters, gamma_mean, gram_min
from .energy import exp_energy, score_rates, softplus_energy
from .entropy import sigmoid_entropy, softmax_entropy
from .field import unit_rows_into
from .machinery import borrow, copy_into, dereference, transpose_into


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


@numba.njit(cache=True, inline="always")
def _drift(x):
    """The largest ``| ||x_i|| - 1 |``."""
    n, d = x.shape
    drift = 0.0
    for i in range(n):
        norm = 0.0
        for k in range(d):
            norm += x[i, k] * x[i, k]
        drift = max(drift, abs(np.sqrt(norm) - 1.0))
    return drift


@numba.njit(cache=True, inline="always")
def _velocity(x, xdot, out, b, t):
    """The kinetic energy per token and the rate of the mean cosine (the ``velocity`` group)."""
    n, d = x.shape
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


@numba.njit(cache=True, inline="always")
def _radial(x, ws, sc, out, b, t):
    """Each head's radial and tangential parts at each token, and the margins (the ``radial`` group)."""
    n, d = x.shape
    H = ws.f.shape[0]
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
    drift = _drift(x)

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
        _velocity(x, xdot, out, b, t)

    for h in range(H if want[Group.ENERGY.value] else 0):
        if flow.energy == Energy.EXP:
            energy, rate = exp_energy(flow, h, beta, xdot, shared_rows, ws, sc)
        elif flow.energy == Energy.SOFTPLUS:
            energy, rate = softplus_energy(flow, h, beta, xdot, shared_rows, ws, sc)
        else:  # unreachable after engine.check_declarations; poison, not raise (field.attention_weights)
            energy, rate = np.nan, np.nan
        out.energy[b, t, h] = energy
        out.energy_rate[b, t, h] = rate
    if want[Group.ENTROPY.value]:
        score_rates(xdot, ws, sc)
    for h in range(H if want[Group.ENTROPY.value] else 0):
        if flow.entropy == Entropy.SOFTMAX:
            softmax_entropy(flow, h, beta, xdot, ws, sc, out, b, t)
        elif flow.entropy == Entropy.SIGMOID:
            sigmoid_entropy(flow, h, beta, xdot, ws, sc, out, b, t)
        else:  # unreachable after engine.check_declarations; poison rather than raise
            out.entropy[b, t, h] = np.nan
            out.entropy_rate[b, t, h] = np.nan

    if want[Group.RADIAL.value]:
        _radial(x, ws, sc, out, b, t)
    return drift
