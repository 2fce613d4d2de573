"""Head structures (docs/model.md, "Head structures and strengths"): how the score matrices M_h are built,
one declaration each.

A declaration builds the score matrices of a batch of seeds from their
strengths (one call for the batch: numpy's per-call cost, an eigenvalue
decomposition per seed, was half the Python time of a small cell), says which
cell fields it reads, checks the cell's shape, and bounds ``||M_h||_op``
(which the cell uses to refuse a beta whose exponentials would overflow). Each
declares the *form* its matrices come in (``Form``, shared with the engine):
``diagonal`` (applied as scalings), ``dense`` (``d x d`` products) or
``factored`` (``M_h = U_h diag(e_h) U_h^T``, applied through the factors when
their rank is small, else as dense products).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import IntEnum

import numpy as np

from .registry import Registry
from .streams import seed_batch, stream


class Form(IntEnum):
    """How the score matrices ``M_h`` of a set of heads are represented, and how the engine applies them.

    The one set of form names: a structure declares the form it builds (``HeadStructure.form``),
    the engine applies a form (``engine.field``) and records the one it used (the store attr
    ``solver_heads_form``, ``Form.label``), and the cost model prices each (``resources``).
    """

    DIAGONAL = 0  # M_h diagonal (scalar and block heads): a scaling of columns
    DENSE = 1  # the d x d matrices: one product with M_h
    FACTORED = 2  # M_h = U_h diag(e_h) U_h^T of rank r: products through the factors (when r <= d/2)

    @property
    def label(self) -> str:
        """The form's name in stores, docs and messages: ``diagonal``, ``dense`` or ``factored``."""
        return self.name.lower()

    @property
    def array(self) -> str:
        """The ``HeadMatrices`` attribute (and ``contract.Heads`` field) that carries this form."""
        return _FORM_ARRAYS[self]


_FORM_ARRAYS = {Form.DIAGONAL: "diagonal", Form.DENSE: "score_matrices", Form.FACTORED: "factors"}

FORMS = tuple(form.label for form in Form)


@dataclasses.dataclass
class HeadMatrices:
    """The score and value matrices of a batch of seeds' heads, in the cheapest exact form the structure
    has.

    Every array but ``antisymmetric_share`` has a leading axis ``S``: one entry per seed, or 1 where
    the structure draws nothing from the seed (every seed shares them). Exactly one of ``diagonal``,
    ``score_matrices`` and ``factors`` describes ``M_h`` (``form``):

    diagonal : (S, H, d), ``M_h = diag(diagonal[s, h])`` (no d x d matrix is ever formed)
    score_matrices : (S, H, d, d) symmetric ``M_h``
    factors : ``(U, e)`` with ``U`` (S, H, d, r) and ``e`` (S, H, r): ``M_h = U_h diag(e_h) U_h^T``
    values : (S or 1, H, d, d) ``V_h``, or None for value alignment ``V_h = M_h``
    strengths : (S, H) the head strengths the matrices were built from
    """

    strengths: np.ndarray
    score_matrices: np.ndarray | None = None
    diagonal: np.ndarray | None = None
    factors: tuple[np.ndarray, np.ndarray] | None = None
    values: np.ndarray | None = None
    antisymmetric_share: np.ndarray | None = None  # (H,) ||M_h - M_h^T||_F / (2 ||M_h||_F) discarded

    @property
    def form(self) -> Form:
        """The form the score matrices are given in."""
        given = [form for form in Form if getattr(self, form.array) is not None]
        if len(given) != 1:
            raise ValueError(f"HeadMatrices: give M_h in exactly one form, got {[f.label for f in given]}")
        return given[0]

    def dense(self) -> np.ndarray:
        """``M_h`` as (S, H, d, d) matrices (the dense form), whatever the form given."""
        if self.score_matrices is not None:
            return self.score_matrices
        if self.diagonal is not None:
            return self.diagonal[..., None] * np.eye(self.diagonal.shape[-1])
        u, e = self.factors
        return np.einsum("shdr,shr,sher->shde", u, e, u)


@dataclasses.dataclass(frozen=True)
class HeadStructure:
    name: str
    build: Callable  # (cell, strengths (S, H), seeds (S ints)) -> HeadMatrices
    form: Form  # the form build returns (the cost model reads it)
    norm_bound: Callable  # (cell, largest strength) -> bound on ||M_h||_op
    uses: tuple[str, ...]  # cell fields it reads besides H, d and the strengths
    description: str
    check: Callable | None = None  # cell -> (field, why) when the cell cannot be built, else None
    seeded: bool = False  # draws from the seed's random stream
    reads_strengths: bool = True  # built from lambda_dist / lambda_bar (trained heads bring their own)
    rank: Callable | None = None  # cell -> rank of each head's factors (factored form only)
    # every M_h a multiple of the identity: a trajectory stays in the span of its initial tokens, where
    # the engine integrates it when n < d (engine._span_basis decides from the arrays; the cost
    # model reads this)
    isotropic: bool = False


def _unit_symmetric(seeds, count: int, d: int) -> np.ndarray:
    """Per seed, from its heads stream, ``count`` symmetric Gaussian matrices scaled to operator norm 1:
    (S, count, d, d)."""
    # In place where it can be: a whole cell's matrices at large d are the memory the cost model
    # budgets, so at most two copies of them live at once (the products as 0.5 (g + g^T) were).
    g = np.stack([stream(seed, "heads").standard_normal((count, d, d)) for seed in seeds])
    s = g + np.swapaxes(g, -1, -2)
    del g
    s *= 0.5
    # The operator norm of a symmetric matrix is its largest |eigenvalue|.
    s /= np.abs(np.linalg.eigvalsh(s)).max(axis=-1)[..., None, None]
    return s


def _scalar(cell, lambdas, seeds):
    return HeadMatrices(lambdas, diagonal=np.repeat(lambdas[:, :, None], cell.d, axis=2))


def _random(cell, lambdas, seeds):
    m = _unit_symmetric(seeds, cell.H, cell.d)
    m *= lambdas[:, :, None, None]
    return HeadMatrices(lambdas, score_matrices=m)


def _block_diagonal(cell, lambdas):
    """(S, H, d): row h lambda_h on the h-th block of d/H coordinates, 0 elsewhere; ``lambdas`` (S, H)."""
    k = cell.d // cell.H
    diag = np.zeros(lambdas.shape + (cell.d,))
    for h in range(cell.H):
        diag[:, h, h * k:(h + 1) * k] = lambdas[:, h, None]
    return diag


def _block(cell, lambdas, seeds):
    return HeadMatrices(lambdas, diagonal=_block_diagonal(cell, lambdas))


def _perturbed_block(cell, lambdas, seeds):
    perturbation = _unit_symmetric(seeds, cell.H, cell.d)
    perturbation *= cell.delta
    perturbation += _block_diagonal(cell, lambdas)[..., None] * np.eye(cell.d)
    return HeadMatrices(lambdas, score_matrices=perturbation)


def _blocks_fit(cell):
    if cell.d % cell.H:
        return "d", f"{cell.heads} heads need d to be a multiple of H = {cell.H}"
    return None


def _trained_subset(cell) -> tuple[int, ...]:
    return cell.head_subset or tuple(range(cell.H))


def _trained_matrices(cell):
    from .trained import build

    return build(cell.weights, cell.layer, _trained_subset(cell), cell.values, cell.model_heads)


def _trained(cell, lambdas, seeds):
    # The layer's matrices, shared by every seed (leading axis 1).
    layer = _trained_matrices(cell)
    u, e = layer.factors
    return HeadMatrices(layer.norms[None], factors=(u[None], e[None]),
                        values=None if layer.values is None else layer.values[None],
                        antisymmetric_share=layer.antisymmetric_share)


def _trained_orthogonal(cell, lambdas, seeds):
    strength = float(np.mean(_trained_matrices(cell).norms))
    strengths = np.full((1, cell.H), strength)
    return HeadMatrices(strengths, diagonal=_block_diagonal(cell, strengths))


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
    if max(subset) >= layer.n_heads:
        return "head_subset", f"layer {cell.layer} has heads 0..{layer.n_heads - 1}"
    return None


def _trained_orthogonal_check(cell):
    return _trained_check(cell) or _blocks_fit(cell)


_TRAINED = ("weights", "layer", "head_subset", "model_heads")


@dataclasses.dataclass(frozen=True)
class ValueMatrices:
    """A choice of value matrices (``Cell.values``)."""

    name: str
    # V_h = M_h: the energy identities (Thm 11, 16-17, results 8 and 12) can hold; elsewhere the energies
    # and their rates are still exact, but the flow is no gradient flow of them
    aligned: bool
    heads: tuple[str, ...]  # the head structures that provide them; () for every one
    description: str

    def reads(self, structure: HeadStructure) -> bool:
        """Whether heads of ``structure`` take these values (elsewhere the cell keeps the default)."""
        return not self.heads or structure.name in self.heads


VALUES: Registry[ValueMatrices] = Registry("values", [
    ValueMatrices("aligned", True, (), "value alignment V_h = M_h (the paper's gradient-flow setting)"),
    ValueMatrices("identity", False, (), "V_h = I: the standard model of Geshkovski et al. and of Karagodin "
                  "et al.'s causal-mask theorem; not a gradient flow of the energies"),
    ValueMatrices("trained", False, ("trained",), "W_O^h W_V^h of the trained layer (heads: trained only)"),
])

HEADS: Registry[HeadStructure] = Registry("heads", [
    HeadStructure("scalar", _scalar, Form.DIAGONAL, lambda c, lam: lam, (),
                  "M_h = lambda_h I (where the closed forms of Thm 19, 22, 25, 27 are derived)",
                  isotropic=True),
    HeadStructure("block", _block, Form.DIAGONAL, lambda c, lam: lam, (),
                  "exactly orthogonal heads: M_h = lambda_h P_h, P_h the projector on the h-th block "
                  "of d/H coordinates", check=_blocks_fit),
    HeadStructure("perturbed_block", _perturbed_block, Form.DENSE, lambda c, lam: lam + c.delta, ("delta",),
                  "block heads plus a seeded symmetric perturbation of operator norm delta "
                  "(approximate orthogonality, Thm 39)", check=_blocks_fit, seeded=True),
    HeadStructure("random", _random, Form.DENSE, lambda c, lam: lam, (),
                  "M_h = lambda_h G / ||G||_op, G a seeded symmetric Gaussian matrix", seeded=True),
    HeadStructure("trained", _trained, Form.FACTORED,
                  lambda c, lam: float(np.max(_trained_matrices(c).norms)),
                  _TRAINED,
                  "one layer of a trained transformer: M_h = sym(W_Q^h^T W_K^h) / sqrt(d_head), strengths "
                  "||M_h||_op (attnflow.trained)", check=_trained_check, reads_strengths=False,
                  rank=lambda c: _trained_matrices(c).factors[1].shape[-1]),
    HeadStructure("trained_orthogonal", _trained_orthogonal, Form.DIAGONAL,
                  lambda c, lam: float(np.mean(_trained_matrices(c).norms)), _TRAINED,
                  "the idealisation of a trained layer: exactly orthogonal block heads, all of the mean "
                  "||M_h||_op of the layer's selected heads (head_subset, or the first H)",
                  check=_trained_orthogonal_check, reads_strengths=False),
])


def head_matrices(cell, seeds) -> HeadMatrices:
    """The score (and value) matrices of ``seeds`` (a sequence of ints), built in one call: each seed's
    strengths from the cell's distribution, then the cell's head structure (``HeadMatrices``: a
    leading axis of one entry per seed, or 1 where every seed shares them)."""
    from .strengths import head_strengths

    seeds = seed_batch(seeds, "head_matrices")
    built = HEADS.get(cell.heads).build(cell, np.stack([head_strengths(cell, s) for s in seeds]), seeds)
    if cell.values == "identity":  # shared by every seed (leading axis 1)
        built.values = np.broadcast_to(np.eye(cell.d), (1, cell.H, cell.d, cell.d))
    return built
