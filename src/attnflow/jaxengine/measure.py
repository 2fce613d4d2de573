"""Observables of one trajectory at one sample in jax.numpy (docs/model.md, "Observables").

The definitions are those of the numba engine's ``engine/measure.py``, written
from the positions and one field evaluation at the sample. Each group, energy
rule, entropy rule and clustering metric has its own entry in a table
(``field.kernel`` refuses a missing one by name).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..attention import Energy, Entropy
from .field import KEPT, kernel


def gamma_mean(x):
    """Mean of ``<x_i, x_j>`` over pairs ``i < j``."""
    n = x.shape[0]
    total = jnp.sum(x, axis=0)
    return (jnp.dot(total, total) - jnp.sum(x * x)) / (n * (n - 1))


def _upper(n):
    return jnp.triu(jnp.ones((n, n), dtype=bool), 1)


def gamma_min(x):
    """Smallest ``<x_i, x_j>``, ``i < j``."""
    return jnp.min(jnp.where(_upper(x.shape[0]), x @ x.T, jnp.inf))


def cluster_count(x, level):
    """Connected components of the graph with an edge where ``<x_i, x_j> >= level`` (the upper triangle
    decides, as in the numba engine): every token takes the smallest label among its neighbours until
    none changes; each component keeps the label of its first token."""
    n = x.shape[0]
    edge = _upper(n) & (x @ x.T >= level)
    linked = edge | edge.T | jnp.eye(n, dtype=bool)
    labels = jnp.arange(n)

    def spread(state):
        labels, _ = state
        new = jnp.min(jnp.where(linked, labels[None, :], n), axis=1)
        return new, jnp.any(new != labels)

    labels, _ = lax.while_loop(lambda state: state[1], spread, spread((labels, True)))
    return jnp.sum(labels == jnp.arange(n)).astype(jnp.int32)


def _cosines(x, parts, beta, rules, level, radius):
    return {"gamma_mean": gamma_mean(x), "gamma_min": gamma_min(x)}


def _clusters(x, parts, beta, rules, level, radius):
    return {"cluster_count": cluster_count(x, level)}


def _velocity(x, parts, beta, rules, level, radius):
    n = x.shape[0]
    xdot = parts.velocity
    # d/dt sum_{i<j} <x_i, x_j> = <sum xdot, sum x> - sum_i <xdot_i, x_i>
    cross = jnp.dot(jnp.sum(xdot, axis=0), jnp.sum(x, axis=0)) - jnp.sum(xdot * x)
    return {"kinetic": jnp.sum(xdot * xdot) / n, "gamma_mean_rate": 2.0 * cross / (n * (n - 1))}


def _exp_energy(parts, beta, n):
    """``E_h = sum_ij exp(beta s_ij) / (2 beta n^2)``, ``dE_h/dt = (1/n^2) sum_i <dx_i/dt, g_i>``,
    ``g_i = sum_j exp(beta s_ij) M_h x_j``, over all pairs whatever the mask."""
    e = jnp.exp(beta * parts.pair_scores)
    g = e @ parts.rows
    return (jnp.sum(e, axis=(1, 2)) / (2.0 * beta * n * n),
            jnp.sum(parts.velocity[None] * g, axis=(1, 2)) / (n * n))


def _softplus_energy(parts, beta, n):
    """``E_h = sum_ij softplus(a_ij) / (2 beta n)``, ``a = beta s - log n``, and
    ``dE_h/dt = (1/n) sum_i <dx_i/dt, sum_j sigma(a_ij) M_h x_j>`` (result 8)."""
    a = beta * parts.pair_scores - jnp.log(n)
    g = jax.nn.sigmoid(a) @ parts.rows
    return (jnp.sum(jax.nn.softplus(a), axis=(1, 2)) / (2.0 * beta * n),
            jnp.sum(parts.velocity[None] * g, axis=(1, 2)) / n)


ENERGIES = {Energy.EXP: _exp_energy, Energy.SOFTPLUS: _softplus_energy}


def _energy(x, parts, beta, rules, level, radius):
    energy, rate = kernel(ENERGIES, rules.energy, "energy rule")(parts, beta, x.shape[0])
    return {"energy": energy, "energy_rate": rate}


def head_rates(x, parts, beta, rules):
    """The per-head energy rates at ``x`` (H,)."""
    return kernel(ENERGIES, rules.energy, "energy rule")(parts, beta, x.shape[0])[1]


def _energy_path(x, parts, beta, rules, level, radius):
    """The sample's own rates; the integration lowers them to the accepted steps' since the previous
    sample (``integrate._integrate``)."""
    return {"energy_rate_min": head_rates(x, parts, beta, rules)}


def _score_rates(parts):
    """``ds^h_ij/dt = <xdot_i, y^h_j> + <xdot_j, y^h_i>`` (symmetric M_h)."""
    d = jnp.einsum("hid,jd->hij", parts.rows, parts.velocity)  # <y_i, xdot_j>
    return d + jnp.swapaxes(d, -1, -2)


def _entropy_of(logits, logit_rates, kept):
    """Entropy of ``p = softmax_j(l_j)`` over the kept pairs and its rate ``-Cov_p(l, dl/dt)``."""
    top = jnp.max(jnp.where(kept, logits, -jnp.inf), axis=-1, keepdims=True)
    u = jnp.where(kept, logits - top, 0.0)  # <= 0, 0 at the largest
    e = jnp.where(kept, jnp.exp(u), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = e / total
    mean_u = jnp.sum(p * u, axis=-1, keepdims=True)
    entropy = jnp.log(total[..., 0]) - mean_u[..., 0]
    rate = -jnp.sum(p * (u - mean_u) * jnp.where(kept, logit_rates, 0.0), axis=-1)
    return entropy, rate


def _softmax_entropy(parts, beta, kept):
    """Thm 27: the logits are ``beta s_ij``, their rates ``beta ds_ij/dt``."""
    return _entropy_of(beta * parts.pair_scores, beta * _score_rates(parts), kept)


def _sigmoid_entropy(parts, beta, kept):
    """Logits ``l_j = log sigma(a_j)``, ``a = beta s - log n``, with
    ``dl_j/dt = (1 - sigma(a_j)) beta ds_j/dt``."""
    n = parts.pair_scores.shape[-1]
    a = beta * parts.pair_scores - jnp.log(n)
    return _entropy_of(jax.nn.log_sigmoid(a), (1.0 - jax.nn.sigmoid(a)) * beta * _score_rates(parts), kept)


ENTROPIES = {Entropy.SOFTMAX: _softmax_entropy, Entropy.SIGMOID: _sigmoid_entropy}


def _entropy(x, parts, beta, rules, level, radius):
    kept = kernel(KEPT, rules.mask, "mask rule")(x.shape[0])
    entropy, rate = kernel(ENTROPIES, rules.entropy, "entropy rule")(parts, beta, kept)
    return {"entropy": entropy, "entropy_rate": rate}


def _radial(x, parts, beta, rules, level, radius):
    f = parts.outputs
    H = f.shape[0]
    a = jnp.sum(f * x[None], axis=-1)  # (H, n)
    norms = jnp.sqrt(jnp.sum(f * f, axis=-1))
    tangential = jnp.sum((f - a[..., None] * x[None]) ** 2, axis=-1)
    others = jnp.sum(a, axis=0, keepdims=True) - a
    # largest ||f^g_i|| over the other heads g != h (0 with one head)
    largest = jnp.max(jnp.where(jnp.eye(H, dtype=bool)[:, :, None], 0.0, norms[None, :, :]), axis=1)
    return {"radial_shadow": a, "tangential_power": tangential, "rd_margin": tangential - a * others,
            "rd_margin_sufficient": tangential - (H - 1) * jnp.abs(a) * largest}


def _positions(x, parts, beta, rules, level, radius):
    return {"x": x}


def _radius(x, parts, beta, rules, level, radius):
    mean = jnp.mean(radius)
    return {"radius": radius, "radius_mean": mean, "radius_spread": jnp.sqrt(jnp.mean((radius - mean) ** 2))}


# Each observable group's variables (observables.GROUPS), by name.
GROUP_KERNELS = {"cosines": _cosines, "clusters": _clusters, "velocity": _velocity, "energy": _energy,
                 "radial": _radial, "entropy": _entropy, "positions": _positions, "energy_path": _energy_path,
                 "radius": _radius}


def _epsilon_gap(x, threshold):
    return 1.0 - gamma_min(x) - threshold


def _gamma_mean_gap(x, threshold):
    return threshold - gamma_mean(x)


# How far each clustering metric is from its threshold: the criterion holds where this is <= 0
# (epsilon = 1 - gamma_min <= threshold; gamma_mean >= threshold).
METRIC_GAPS = {"epsilon": _epsilon_gap, "gamma_mean": _gamma_mean_gap}


def measure(x, parts, beta, groups, rules, level, radius) -> dict:
    """The variables of ``groups`` at ``x`` (the directions, where the state carries radii) with the
    field's ``parts`` there (None if no group needs the field); ``radius``: the state's r_k."""
    out = {}
    for group in groups:
        out.update(kernel(GROUP_KERNELS, group, "observable group")(x, parts, beta, rules, level, radius))
    return out
