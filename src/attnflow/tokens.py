"""Initial token configurations (docs/model.md, "Initial tokens"): one declaration each."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .registry import Registry
from .streams import seed_batch, stream


@dataclasses.dataclass(frozen=True)
class Init:
    name: str
    draw: Callable  # (cell, seeds (S ints)) -> (S, n, d) unit rows
    uses: tuple[str, ...]  # cell fields it reads besides n and d
    description: str
    check: Callable | None = None  # cell -> (field, why) or None
    seeded: bool = False  # draws from the seed's random stream (else every seed starts alike)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """``x`` with every row (a token, the last axis) scaled to unit norm."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _uniform(cell, seeds):
    return unit_rows(np.stack([stream(seed, "tokens").standard_normal((cell.n, cell.d)) for seed in seeds]))


def _every_seed(x, seeds):
    """The same (n, d) tokens for every seed: (S, n, d)."""
    return np.repeat(x[None], len(seeds), axis=0)


def _orthogonal(cell, seeds):
    x = np.zeros((cell.n, cell.d))
    x[:, : cell.n] = np.eye(cell.n)
    return _every_seed(x, seeds)


def equiangular_tokens(n: int, d: int, gamma0: float) -> np.ndarray:
    """Rows of the Cholesky factor of ``(1 - gamma0) I + gamma0 11^T``, padded to ``d`` columns."""
    x = np.zeros((n, d))
    gram = (1.0 - gamma0) * np.eye(n) + gamma0 * np.ones((n, n))
    x[:, :n] = np.linalg.cholesky(gram)
    # Rows of the Cholesky factor have unit norm up to round-off; make it exact.
    return unit_rows(x)


def typical_cosine(d: int) -> float:
    """``1 / sqrt(d)``, the typical |cosine| between two uniform random tokens in ``d`` dimensions."""
    return 1.0 / np.sqrt(d)


def _needs_room(cell):
    if cell.d < cell.n:
        return "d", f"{cell.init} tokens need d >= n = {cell.n}"
    return None


def _equiangular_check(cell):
    if cell.d < cell.n:
        return "d", f"{cell.init} tokens need d >= n = {cell.n}"
    if not -1.0 / (cell.n - 1) < cell.gamma0 < 1.0:
        return "gamma0", f"the Gram matrix needs -1/(n-1) < gamma0 < 1 for n = {cell.n}"
    return None


def _embedding(cell, seeds):
    from .trained import embedding

    table = embedding(cell.weights)
    return unit_rows(np.stack([
        table[np.sort(stream(seed, "embedding").choice(table.shape[0], size=cell.n, replace=False))]
        for seed in seeds]))


def _embedding_check(cell):
    from .trained import WeightsError, embedding

    if not cell.weights:
        return "weights", "embedding tokens need a weights file (a .safetensors path, or 'minilm')"
    try:
        table = embedding(cell.weights)
    except WeightsError as err:
        return "weights", str(err)
    if cell.d != table.shape[1]:
        return "d", f"the embeddings have dimension {table.shape[1]}"
    return None


INITS: Registry[Init] = Registry("init", [
    Init("uniform", _uniform, (), "i.i.d. uniform on the sphere (seeded)", seeded=True),
    Init("orthogonal", _orthogonal, (), "x_i = e_i (needs d >= n)", _needs_room),
    Init("equiangular", lambda c, s: _every_seed(equiangular_tokens(c.n, c.d, c.gamma0), s), ("gamma0",),
         "common pairwise cosine gamma0: Gram matrix (1 - gamma0) I + gamma0 11^T (needs d >= n)",
         _equiangular_check),
    Init("equiangular_typical",
         lambda c, s: _every_seed(equiangular_tokens(c.n, c.d, typical_cosine(c.d)), s), (),
         "equiangular with gamma0 = 1/sqrt(d), the typical cosine of random tokens (Thm 25's start; "
         "needs d >= n)", _needs_room),
    Init("embedding", _embedding, ("weights",),
         "n distinct rows of the weights' token-embedding matrix (seeded choice), normalised",
         _embedding_check, seeded=True),
])


def initial_tokens(cell, seeds) -> np.ndarray:
    """Initial positions on the unit sphere of ``seeds`` (a sequence of ints), drawn in one call:
    shape ``(S, n, d)``."""
    return INITS.get(cell.init).draw(cell, seed_batch(seeds, "initial_tokens"))
