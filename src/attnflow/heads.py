"""Head structures (MODEL.md, "Head structures"): how the score matrices M_h are built, one declaration each.

A declaration builds the heads of one seed from its strengths, says which cell
fields it reads, checks the cell's shape, and bounds ``||M_h||_op`` (which the
cell uses to refuse a beta whose exponentials would overflow). The engine picks
how to apply the heads from what the builder returns: diagonal heads as
scalings, factored heads ``M_h = U_h diag(e_h) U_h^T`` through their factors
when their rank is small, any other as dense products.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .registry import Registry
from .streams import stream


@dataclasses.dataclass
class HeadSet:
    """The heads of one seed, in the cheapest exact representation the structure has.

    Exactly one of ``scores``, ``diagonal`` and ``factors`` describes ``M_h``:

    scores : (H, d, d) symmetric ``M_h``
    diagonal : (H, d), ``M_h = diag(diagonal[h])`` (no d x d matrix is ever formed)
    factors : ``(U, e)`` with ``U`` (H, d, r) and ``e`` (H, r): ``M_h = U_h diag(e_h) U_h^T``
    values : (H, d, d) ``V_h``, or None for value alignment ``V_h = M_h``
    strengths : (H,) the head strengths the heads were built from
    """

    strengths: np.ndarray
    scores: np.ndarray | None = None
    diagonal: np.ndarray | None = None
    factors: tuple[np.ndarray, np.ndarray] | None = None
    values: np.ndarray | None = None
    antisymmetric_share: np.ndarray | None = None  # (H,) ||M_h - M_h^T||_F / (2 ||M_h||_F) discarded

    def dense(self) -> np.ndarray:
        """``M_h`` as (H, d, d) matrices, whatever the representation."""
        if self.scores is not None:
            return self.scores
        if self.diagonal is not None:
            return self.diagonal[:, :, None] * np.eye(self.diagonal.shape[1])[None]
        u, e = self.factors
        return np.einsum("hdr,hr,her->hde", u, e, u)


@dataclasses.dataclass(frozen=True)
class HeadStructure:
    name: str
    build: Callable  # (cell, strengths (H,), seed) -> HeadSet
    form: str  # what build returns: "diagonal", "scores" or "factors" (the cost model reads it)
    norm_bound: Callable  # (cell, largest strength) -> bound on ||M_h||_op
    uses: tuple[str, ...]  # cell fields it reads besides H, d and the strengths
    description: str
    check: Callable | None = None  # cell -> (field, why) when the cell cannot be built, else None
    seeded: bool = False  # draws from the seed's random stream
    reads_strengths: bool = True  # built from lambda_dist / lambda_bar (trained heads bring their own)
    rank: Callable | None = None  # cell -> rank of each head's factors (factors form only)


def _unit_symmetric(rng: np.random.Generator, count: int, d: int) -> np.ndarray:
    """``count`` symmetric Gaussian matrices scaled to operator norm 1, (count, d, d)."""
    g = rng.standard_normal((count, d, d))
    s = 0.5 * (g + np.swapaxes(g, -1, -2))
    # The operator norm of a symmetric matrix is its largest |eigenvalue|.
    return s / np.abs(np.linalg.eigvalsh(s)).max(axis=-1)[:, None, None]


def _scalar(cell, lambdas, seed):
    return HeadSet(lambdas, diagonal=np.repeat(lambdas[:, None], cell.d, axis=1))


def _random(cell, lambdas, seed):
    rng = stream(seed, "heads")
    return HeadSet(lambdas, scores=lambdas[:, None, None] * _unit_symmetric(rng, cell.H, cell.d))


def _block_diagonal(cell, lambdas):
    """Row h: lambda_h on the h-th block of d/H coordinates, 0 elsewhere."""
    k = cell.d // cell.H
    diag = np.zeros((cell.H, cell.d))
    for h in range(cell.H):
        diag[h, h * k:(h + 1) * k] = lambdas[h]
    return diag


def _block(cell, lambdas, seed):
    return HeadSet(lambdas, diagonal=_block_diagonal(cell, lambdas))


def _perturbed_block(cell, lambdas, seed):
    rng = stream(seed, "heads")
    diag = _block_diagonal(cell, lambdas)
    m = diag[:, :, None] * np.eye(cell.d)[None]
    m += cell.delta * _unit_symmetric(rng, cell.H, cell.d)
    return HeadSet(lambdas, scores=m)


def _blocks_fit(cell):
    if cell.d % cell.H:
        return "d", f"{cell.heads} heads need d to be a multiple of H = {cell.H}"
    return None


def _trained_subset(cell) -> tuple[int, ...]:
    return cell.head_subset or tuple(range(cell.H))


def _trained_heads(cell):
    from .trained import build

    return build(cell.weights, cell.layer, _trained_subset(cell), cell.values, cell.model_heads)


def _trained(cell, lambdas, seed):
    heads = _trained_heads(cell)
    return HeadSet(heads.norms, factors=heads.factors, values=heads.values,
                   antisymmetric_share=heads.antisymmetric_share)


def _trained_orthogonal(cell, lambdas, seed):
    strength = float(np.mean(_trained_heads(cell).norms))
    strengths = np.full(cell.H, strength)
    return HeadSet(strengths, diagonal=_block_diagonal(cell, strengths))


def _trained_check(cell):
    from .trained import WeightsError, load_layer

    if not cell.weights:
        return "weights", f"{cell.heads} heads need a weights file (a .safetensors path, or 'minilm')"
    try:
        layer = load_layer(cell.weights, cell.layer, cell.model_heads)
    except WeightsError as err:
        return "weights", str(err)
    if cell.d != layer.d:
        return "d", f"the weights' hidden size is {layer.d}"
    subset = _trained_subset(cell)
    if len(subset) != cell.H:
        return "head_subset", f"names {len(subset)} heads but H = {cell.H}"
    if max(subset) >= layer.heads:
        return "head_subset", f"layer {cell.layer} has heads 0..{layer.heads - 1}"
    return None


def _trained_orthogonal_check(cell):
    return _trained_check(cell) or _blocks_fit(cell)


_TRAINED = ("weights", "layer", "head_subset", "model_heads")

HEADS: Registry[HeadStructure] = Registry("heads", [
    HeadStructure("scalar", _scalar, "diagonal", lambda c, lam: lam, (),
                  "M_h = lambda_h I (where the closed forms of Thm 19, 22, 25, 27 are derived)"),
    HeadStructure("block", _block, "diagonal", lambda c, lam: lam, (),
                  "exactly orthogonal heads: M_h = lambda_h P_h, P_h the projector on the h-th block "
                  "of d/H coordinates", check=_blocks_fit),
    HeadStructure("perturbed_block", _perturbed_block, "scores", lambda c, lam: lam + c.delta, ("delta",),
                  "block heads plus a seeded symmetric perturbation of operator norm delta "
                  "(approximate orthogonality, Thm 39)", check=_blocks_fit, seeded=True),
    HeadStructure("random", _random, "scores", lambda c, lam: lam, (),
                  "M_h = lambda_h G / ||G||_op, G a seeded symmetric Gaussian matrix", seeded=True),
    HeadStructure("trained", _trained, "factors", lambda c, lam: float(np.max(_trained_heads(c).norms)),
                  _TRAINED + ("values",),
                  "one layer of a trained transformer: M_h = sym(W_Q^h^T W_K^h) / sqrt(d_head), strengths "
                  "||M_h||_op (attnflow.trained)", check=_trained_check, reads_strengths=False,
                  rank=lambda c: _trained_heads(c).factors[1].shape[-1]),
    HeadStructure("trained_orthogonal", _trained_orthogonal, "diagonal",
                  lambda c, lam: float(np.mean(_trained_heads(c).norms)), _TRAINED,
                  "the idealisation of a trained layer: exactly orthogonal block heads, all of the layer's "
                  "mean ||M_h||_op", check=_trained_orthogonal_check, reads_strengths=False),
])


def build_heads(cell, seed: int) -> HeadSet:
    """The heads of one seed: strengths from the cell's distribution, then its structure."""
    from .strengths import head_strengths

    return HEADS.get(cell.heads).build(cell, head_strengths(cell, seed), seed)
