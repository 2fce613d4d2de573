"""One grid cell of a sweep: an immutable, validated parameter object."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from numbers import Integral, Real

ATTENTIONS = ("softmax", "usa", "relu")
HEAD_STRUCTURES = ("scalar", "block", "perturbed_block", "random")
LAMBDA_DISTS = ("equal", "linear", "dirichlet")
INITS = ("uniform", "orthogonal", "equiangular")
GEOMETRIES = ("sphere", "flat")
CLUSTER_METRICS = ("epsilon", "gamma_mean")

# exp(beta * s) must stay finite for every observable (energies use it for all
# attention types) and summed over n^2 pairs: exp(600) * 1e8 < float64 max.
MAX_EXPONENT = 600.0


def _fail(field: str, value, why: str):
    raise ValueError(f"Cell.{field} = {value!r}: {why}")


@dataclasses.dataclass(frozen=True)
class Cell:
    """Parameters of one grid cell; all seeds of a cell run as one batch.

    Every field is validated on construction; an invalid value or combination
    raises ``ValueError`` naming the field and the value. Conventions follow
    MODEL.md. ``seeds`` is a count (seeds ``0..count-1``) or a list of
    non-negative ints; after construction it is always a tuple of ints.
    """

    H: int = 2
    n: int = 8
    d: int = 8
    beta: float = 1.0
    attention: str = "softmax"
    heads: str = "scalar"
    delta: float = 0.0
    lambda_dist: str = "equal"
    lambda_bar: float = 1.0
    spread: float = 0.0
    concentration: float = 1.0
    init: str = "uniform"
    gamma0: float = 0.0
    geometry: str = "sphere"
    seeds: int | Sequence[int] = 4
    t_max: float = 10.0
    n_samples: int = 101
    rtol: float = 1e-6
    atol: float = 1e-9
    cluster_metric: str = "epsilon"
    cluster_threshold: float = 1e-3
    save_positions: bool = False
    max_steps: int = 100_000

    def __post_init__(self):
        for name in ("H", "n", "d", "n_samples", "max_steps"):
            _check_int(name, getattr(self, name), minimum=1)
        if self.n < 2:
            _fail("n", self.n, "need at least 2 tokens")
        if self.n_samples < 2:
            _fail("n_samples", self.n_samples, "need at least 2 samples (t = 0 and t_max)")
        for name in ("beta", "lambda_bar", "concentration", "t_max", "rtol", "atol"):
            _check_real(name, getattr(self, name), positive=True)
        for name in ("delta", "spread", "gamma0", "cluster_threshold"):
            _check_real(name, getattr(self, name), positive=False)
        for name, allowed in (
            ("attention", ATTENTIONS),
            ("heads", HEAD_STRUCTURES),
            ("lambda_dist", LAMBDA_DISTS),
            ("init", INITS),
            ("geometry", GEOMETRIES),
            ("cluster_metric", CLUSTER_METRICS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                _fail(name, value, f"must be one of {', '.join(allowed)}")
        if not isinstance(self.save_positions, bool):
            _fail("save_positions", self.save_positions, "must be true or false")
        object.__setattr__(self, "seeds", _normalise_seeds(self.seeds))

        if self.heads in ("block", "perturbed_block") and self.d % self.H:
            _fail("d", self.d, f"{self.heads} heads need d to be a multiple of H = {self.H}")
        if self.delta < 0:
            _fail("delta", self.delta, "the perturbation norm must be >= 0")
        if self.heads != "perturbed_block" and self.delta != 0:
            _fail("delta", self.delta, f"only perturbed_block heads take a delta, not {self.heads}")
        if not 0.0 <= self.spread < 1.0:
            _fail("spread", self.spread, "must lie in [0, 1) so every lambda_h stays positive")
        if self.lambda_dist == "linear" and self.H == 1 and self.spread:
            _fail("spread", self.spread, "a spread needs H >= 2")
        if self.init in ("orthogonal", "equiangular") and self.d < self.n:
            _fail("d", self.d, f"{self.init} tokens need d >= n = {self.n}")
        if self.init == "equiangular" and not -1.0 / (self.n - 1) < self.gamma0 < 1.0:
            _fail("gamma0", self.gamma0, f"the Gram matrix needs -1/(n-1) < gamma0 < 1 for n = {self.n}")
        if self.rtol >= 1.0:
            _fail("rtol", self.rtol, "must be < 1")
        if self.cluster_metric == "epsilon" and not 0.0 < self.cluster_threshold < 2.0:
            _fail("cluster_threshold", self.cluster_threshold, "epsilon = 1 - gamma_min lies in (0, 2)")
        if self.cluster_metric == "gamma_mean" and not -1.0 < self.cluster_threshold < 1.0:
            _fail("cluster_threshold", self.cluster_threshold, "gamma_mean lies in (-1, 1)")
        exponent = self.beta * self.max_score_norm
        if exponent > MAX_EXPONENT:
            _fail(
                "beta",
                self.beta,
                f"beta * max ||M_h|| = {exponent:.4g} exceeds {MAX_EXPONENT:g}: "
                "exp(beta s) would overflow float64",
            )

    @property
    def max_score_norm(self) -> float:
        """Upper bound on ``||M_h||_op`` over heads and seeds for the cell's generators."""
        if self.lambda_dist == "equal":
            lam_max = self.lambda_bar
        elif self.lambda_dist == "linear":
            lam_max = self.lambda_bar * (1.0 + self.spread)
        else:  # a Dirichlet draw can put the whole total on one head
            lam_max = self.H * self.lambda_bar
        return lam_max + self.delta

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    def replace(self, **changes) -> Cell:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable fields (seeds as a list)."""
        out = dataclasses.asdict(self)
        out["seeds"] = list(self.seeds)
        return out


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, Integral):
        _fail(name, value, "must be an integer")
    if value < minimum:
        _fail(name, value, f"must be >= {minimum}")


def _check_real(name, value, positive):
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        _fail(name, value, "must be a finite number")
    if positive and value <= 0:
        _fail(name, value, "must be > 0")


def _normalise_seeds(seeds) -> tuple[int, ...]:
    if isinstance(seeds, Integral) and not isinstance(seeds, bool):
        if seeds < 1:
            _fail("seeds", seeds, "a seed count must be >= 1")
        return tuple(range(int(seeds)))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        _fail("seeds", seeds, "must be a count or a list of non-negative integers")
    out = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, Integral) or s < 0:
            _fail("seeds", seeds, f"entry {s!r} is not a non-negative integer")
        out.append(int(s))
    if not out:
        _fail("seeds", seeds, "the list is empty")
    if len(set(out)) != len(out):
        _fail("seeds", seeds, "seeds must be distinct")
    return tuple(out)
