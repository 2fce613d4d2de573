"""The attention vector field of one trajectory in jax.numpy (docs/model.md, "State and dynamics").

Each declared rule (weight rule, mask rule, head form) has its own function in
a table; ``kernel`` looks a rule up by name and refuses one without an entry,
so there is no default branch (``attnflow.jaxengine`` checks every table
against the declarations at import).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..attention import MaskRule, Weights
from ..geometry import Motion
from ..heads import Form


class TrajectoryHeads(NamedTuple):
    """One trajectory's heads in one form; the arrays of the other forms are None.

    diagonal (H, d); dense (H, d, d) symmetric; u (H, d, r) and eig (H, r) with
    ``M_h = U diag(e) U^T``; values (H, d, d) or None for ``V_h = M_h``.
    """

    diagonal: jax.Array | None
    dense: jax.Array | None
    u: jax.Array | None
    eig: jax.Array | None
    values: jax.Array | None


class Parts(NamedTuple):
    """What one field evaluation computes, kept for the observables."""

    rows: jax.Array  # (H, n, d) y^h_j = M_h x_j
    pair_scores: jax.Array  # (H, n, n) the scores s^h_ij = <x_i, M_h x_j>
    outputs: jax.Array  # (H, n, d) head outputs f^h_i (rows divided by Z_i where normalised)
    velocity: jax.Array  # (n, d) dx/dt (of the directions, once ``directions`` has turned them)


def kernel(table: dict, rule, what: str):
    """The entry of ``table`` for ``rule``, or a ``NotImplementedError`` naming the rule."""
    if rule not in table:
        raise NotImplementedError(f"attnflow.jaxengine has no {what} kernel for {rule!r}")
    return table[rule]


def _diagonal_rows(x, heads):
    return x[None, :, :] * heads.diagonal[:, None, :]


def _dense_rows(x, heads):
    return jnp.einsum("nd,hed->hne", x, heads.dense)


def _factored_rows(x, heads):
    z = jnp.einsum("nd,hdr->hnr", x, heads.u) * heads.eig[:, None, :]
    return jnp.einsum("hnr,hdr->hnd", z, heads.u)


# y^h_j = M_h x_j in each form (the factored form through the r factors).
ROWS = {Form.DIAGONAL: _diagonal_rows, Form.DENSE: _dense_rows, Form.FACTORED: _factored_rows}


def _keep_all(n):
    return jnp.ones((n, n), dtype=bool)


def _keep_causal(n):
    return jnp.tril(jnp.ones((n, n), dtype=bool))


# Which pairs (i attends to j) each mask rule keeps.
KEPT = {MaskRule.NONE: _keep_all, MaskRule.CAUSAL: _keep_causal}


def _softmax_weights(s, beta, kept):
    a = jnp.where(kept, beta * s, -jnp.inf)
    return jnp.exp(a - jnp.max(a, axis=-1, keepdims=True))  # rows normalised by the caller


def _exp_weights(s, beta, kept):
    return jnp.where(kept, jnp.exp(jnp.where(kept, beta * s, 0.0)), 0.0)


def _relu_weights(s, beta, kept):
    n = s.shape[-1]
    return jnp.where(kept, jnp.maximum(beta * s, 0.0) / n, 0.0)


def _sigmoid_weights(s, beta, kept):
    n = s.shape[-1]
    return jnp.where(kept, jax.nn.sigmoid(beta * s - jnp.log(n)), 0.0)


# The weights w^h_ij of each rule (attention.Weights), zero outside the mask.
WEIGHTS = {Weights.SOFTMAX: _softmax_weights, Weights.EXP: _exp_weights, Weights.RELU: _relu_weights,
           Weights.SIGMOID: _sigmoid_weights}


def _tangent(v, x, alpha):
    return v - jnp.sum(v * x, axis=-1, keepdims=True) * x


def _free(v, x, alpha):
    return v


def _unit(v, x, alpha):
    return v / jnp.linalg.norm(v, axis=-1, keepdims=True)


def _unit_tangent(v, x, alpha):
    return alpha * _tangent(v, x, alpha) / jnp.linalg.norm(v, axis=-1, keepdims=True)


# dx/dt from the attention velocity v at the unit rows x, by each motion rule (geometry.Motion).
MOTIONS = {Motion.TANGENT: _tangent, Motion.FREE: _free, Motion.UNIT: _unit,
           Motion.UNIT_TANGENT: _unit_tangent}


def unit(x):
    """Every row of ``x`` scaled to unit norm."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def directions(x, parts: Parts | None):
    """The directions ``theta_k = x_k / r_k`` of a state with radii, and ``parts`` with the velocity
    ``dtheta_k/dt = P_{theta_k}(dx_k/dt) / r_k`` (None stays None)."""
    theta = unit(x)
    if parts is None:
        return theta, None
    r = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return theta, parts._replace(velocity=_tangent(parts.velocity, theta, 1.0) / r)


def evaluate(x, heads: TrajectoryHeads, beta, *, form: Form, weights: Weights, mask: MaskRule,
             normalised: bool, over_n: bool, motion: Motion, radii: bool, alpha: float) -> Parts:
    """The field at ``x`` (n, d) and its parts; the rules are static (Python) values. Where the state
    carries radii (``radii``) attention reads the directions, and the parts are theirs."""
    n = x.shape[0]
    if radii:
        x = unit(x)
    rows = kernel(ROWS, form, "head form")(x, heads)
    pair_scores = jnp.einsum("hid,jd->hij", rows, x)  # <M_h x_i, x_j> = <x_i, M_h x_j>, M_h symmetric
    w = kernel(WEIGHTS, weights, "weight rule")(pair_scores, beta, kernel(KEPT, mask, "mask rule")(n))
    carried = rows if heads.values is None else jnp.einsum("hed,nd->hne", heads.values, x)
    outputs = w @ carried
    if normalised:
        outputs = outputs / jnp.sum(w, axis=-1, keepdims=True)
    v = jnp.sum(outputs, axis=0)
    if over_n:
        v = v / n
    return Parts(rows, pair_scores, outputs, kernel(MOTIONS, motion, "motion rule")(v, x, alpha))
