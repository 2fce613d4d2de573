"""Seeded generators of head strengths, head matrices and initial tokens (MODEL.md).

Each seed owns independent random streams, so a seed's run does not depend on
which other seeds share its batch.
"""

from __future__ import annotations

import numpy as np

from .cell import Cell

_STREAM_LAMBDA, _STREAM_HEADS, _STREAM_INIT = 1, 2, 3


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def head_strengths(cell: Cell, seed: int) -> np.ndarray:
    """``lambda_h`` for one seed, shape ``(H,)``, summing to ``H * lambda_bar``."""
    H, lam = cell.H, cell.lambda_bar
    if cell.lambda_dist == "equal":
        return np.full(H, lam)
    if cell.lambda_dist == "linear":
        if H == 1:
            return np.full(1, lam)
        return lam * (1.0 + cell.spread * (2.0 * np.arange(H) / (H - 1) - 1.0))
    weights = _rng(seed, _STREAM_LAMBDA).dirichlet(np.full(H, cell.concentration))
    return H * lam * weights


def _unit_symmetric(rng: np.random.Generator, d: int) -> np.ndarray:
    g = rng.standard_normal((d, d))
    s = 0.5 * (g + g.T)
    return s / np.linalg.norm(s, 2)


def score_matrices(cell: Cell, lambdas: np.ndarray, seed: int) -> np.ndarray:
    """Head score matrices ``M_h`` for one seed, shape ``(H, d, d)``, each symmetric."""
    H, d = cell.H, cell.d
    if cell.heads == "scalar":
        return lambdas[:, None, None] * np.eye(d)[None]
    if cell.heads == "random":
        rng = _rng(seed, _STREAM_HEADS)
        return np.stack([lam * _unit_symmetric(rng, d) for lam in lambdas])
    k = d // H
    m = np.zeros((H, d, d))
    for h in range(H):
        idx = np.arange(h * k, (h + 1) * k)
        m[h, idx, idx] = lambdas[h]
    if cell.heads == "perturbed_block":
        rng = _rng(seed, _STREAM_HEADS)
        m += cell.delta * np.stack([_unit_symmetric(rng, d) for _ in range(H)])
    return m


def initial_tokens(cell: Cell, seed: int) -> np.ndarray:
    """Initial positions on the unit sphere for one seed, shape ``(n, d)``."""
    n, d = cell.n, cell.d
    if cell.init == "uniform":
        x = _rng(seed, _STREAM_INIT).standard_normal((n, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    x = np.zeros((n, d))
    if cell.init == "orthogonal":
        x[:, :n] = np.eye(n)
        return x
    g = cell.gamma0
    gram = (1.0 - g) * np.eye(n) + g * np.ones((n, n))
    x[:, :n] = np.linalg.cholesky(gram)
    # Rows of the Cholesky factor have unit norm up to round-off; make it exact.
    return x / np.linalg.norm(x, axis=1, keepdims=True)
