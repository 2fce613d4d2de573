"""Observables of MODEL.md, computed exactly from positions at the sample times.

All functions work on a leading batch of configurations ``(..., n, d)``; heads
come as ``(..., H, d, d)`` arrays broadcast against it.
"""

from __future__ import annotations

import numpy as np

# Largest batch of (config, head, i, j) score entries held at once.
_CHUNK_ENTRIES = 2_000_000


def head_quantities(x, scores, values_t, beta, attention):
    """Scores, head outputs and the pieces every observable needs.

    Parameters
    ----------
    x : (..., n, d)
    scores, values_t : (..., H, d, d) ``M_h`` and ``V_h^T``
    attention : 'softmax' | 'usa' | 'relu'

    Returns
    -------
    dict with ``s`` (..., H, n, n) raw scores, ``y`` (..., H, n, d) rows ``M_h x_j``,
    ``f`` (..., H, n, d) head outputs ``f^h_i``, ``v`` (..., n, d) the velocity
    before projection.
    """
    n = x.shape[-2]
    xh = x[..., None, :, :]
    y = xh @ scores
    s = y @ np.swapaxes(xh, -1, -2)
    z = y if values_t is scores else xh @ values_t
    if attention == "softmax":
        w = np.exp(beta * (s - s.max(axis=-1, keepdims=True)))
        w /= w.sum(axis=-1, keepdims=True)
    elif attention == "usa":
        w = np.exp(beta * s)
    elif attention == "relu":
        w = np.maximum(beta * s, 0.0) / n
    else:
        raise ValueError(f"attention = {attention!r}: must be one of softmax, usa, relu")
    f = w @ z
    v = f.sum(axis=-3)
    if attention == "usa":
        v = v / n
    return {"s": s, "y": y, "f": f, "v": v}


def tangent(x, u):
    """``P_x(u) = u - <u, x> x`` row by row."""
    return u - np.sum(u * x, axis=-1, keepdims=True) * x


def entropy(s, beta):
    """Attention entropy of ``p = softmax_j(beta s_ij)``, via log-sum-exp (no overflow)."""
    z = beta * s
    zmax = z.max(axis=-1, keepdims=True)
    e = np.exp(z - zmax)
    total = e.sum(axis=-1, keepdims=True)
    p = e / total
    log_norm = (zmax + np.log(total))[..., 0]
    return log_norm - np.sum(p * z, axis=-1)


def _max_over_other_heads(a):
    """For each head h, ``max_{h' != h} a[..., h', :]`` along axis -2 (0 when H = 1)."""
    H = a.shape[-2]
    if H == 1:
        return np.zeros_like(a)
    order = np.argsort(a, axis=-2)
    top = np.take_along_axis(a, order[..., -1:, :], axis=-2)
    second = np.take_along_axis(a, order[..., -2:-1, :], axis=-2)
    is_top = np.arange(H)[:, None] == order[..., -1:, :]
    return np.where(is_top, second, top)


def pair_cosines(x, xdot):
    """Mean and minimum of ``<x_i, x_j>`` over pairs ``i < j``, and the exact rate of the mean."""
    n = x.shape[-2]
    gram = x @ np.swapaxes(x, -1, -2)
    cross = xdot @ np.swapaxes(x, -1, -2)
    iu = np.triu_indices(n, k=1)
    pairs = gram[..., iu[0], iu[1]]
    rates = cross[..., iu[0], iu[1]] + cross[..., iu[1], iu[0]]
    return pairs.mean(axis=-1), pairs.min(axis=-1), rates.mean(axis=-1)


def entropy_rate(s, y, xdot, beta):
    """Thm 27: ``dH_i/dt = -beta^2 Cov_p(s_ij, ds_ij/dt)``, ``p = softmax_j(beta s_ij)``.

    With symmetric ``M_h`` and rows ``y_j = M_h x_j``: ``ds_ij/dt = <xdot_i, y_j> + <y_i, xdot_j>``.
    """
    xd = xdot[..., None, :, :]
    sdot = xd @ np.swapaxes(y, -1, -2) + y @ np.swapaxes(xd, -1, -2)
    z = beta * s
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    mean_s = np.sum(p * s, axis=-1, keepdims=True)
    return -(beta**2) * np.sum(p * (s - mean_s) * sdot, axis=-1)


def observables(x, scores, values_t, beta, attention, spherical):
    """Every per-sample observable for configurations ``x`` (..., n, d).

    Returns a dict of arrays; per-head quantities have a head axis at -2
    (per-token) or -1 (per-configuration).
    """
    n = x.shape[-2]
    q = head_quantities(x, scores, values_t, beta, attention)
    s, y, f = q["s"], q["y"], q["f"]
    xdot = tangent(x, q["v"]) if spherical else q["v"]
    xh = x[..., None, :, :]

    boltzmann = np.exp(beta * s)
    energy = boltzmann.sum(axis=(-1, -2)) / (2.0 * beta * n * n)
    g = boltzmann @ y  # g^h_i = sum_j exp(beta s_ij) M_h x_j
    energy_rate = np.sum(xdot[..., None, :, :] * g, axis=(-1, -2)) / (n * n)

    radial = np.sum(f * xh, axis=-1)  # a^h_i
    tangential = np.sum((f - radial[..., None] * xh) ** 2, axis=-1)  # T^h_i
    H = f.shape[-3]
    others_radial = radial.sum(axis=-2, keepdims=True) - radial
    rd_margin = tangential - radial * others_radial
    f_norm = np.linalg.norm(f, axis=-1)
    rd_margin_sufficient = tangential - (H - 1) * np.abs(radial) * _max_over_other_heads(f_norm)

    gamma_mean, gamma_min, gamma_mean_rate = pair_cosines(x, xdot)
    return {
        "energy": energy,
        "energy_rate": energy_rate,
        "kinetic": np.mean(np.sum(xdot * xdot, axis=-1), axis=-1),
        "radial_shadow": radial,
        "tangential_power": tangential,
        "rd_margin": rd_margin,
        "rd_margin_sufficient": rd_margin_sufficient,
        "entropy": entropy(s, beta),
        "entropy_rate": entropy_rate(s, y, xdot, beta),
        "gamma_mean": gamma_mean,
        "gamma_mean_rate": gamma_mean_rate,
        "gamma_min": gamma_min,
    }


def trajectory_observables(xs, scores, values_t, beta, attention, spherical):
    """``observables`` over trajectories ``xs`` (B, T, n, d), in time chunks to bound memory.

    ``scores``/``values_t`` are per trajectory, shape (B, H, d, d).
    """
    n_batch, n_time, n, _ = xs.shape
    H = scores.shape[1]
    step = max(1, _CHUNK_ENTRIES // max(1, n_batch * H * n * n))
    pieces = []
    for start in range(0, n_time, step):
        chunk = xs[:, start : start + step]
        sc = scores[:, None]
        vt = sc if values_t is scores else values_t[:, None]
        pieces.append(observables(chunk, sc, vt, beta, attention, spherical))
    return {k: np.concatenate([p[k] for p in pieces], axis=1) for k in pieces[0]}


def first_crossing(times, metric, threshold, below):
    """First time ``metric`` reaches ``threshold``, by linear interpolation between samples.

    Parameters
    ----------
    metric : (B, T)
    below : bool, the criterion is ``metric <= threshold`` (else ``>=``)

    Returns
    -------
    t_hit : (B,) float, NaN where never reached (censored)
    censored : (B,) bool
    """
    hit = metric <= threshold if below else metric >= threshold
    censored = ~hit.any(axis=1)
    k = np.argmax(hit, axis=1)
    t_hit = np.full(metric.shape[0], np.nan)
    for b in np.flatnonzero(~censored):
        if k[b] == 0:
            t_hit[b] = times[0]
            continue
        m0, m1 = metric[b, k[b] - 1], metric[b, k[b]]
        frac = (threshold - m0) / (m1 - m0) if m1 != m0 else 1.0
        t_hit[b] = times[k[b] - 1] + frac * (times[k[b]] - times[k[b] - 1])
    return t_hit, censored
