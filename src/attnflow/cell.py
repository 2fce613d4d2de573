"""One grid cell of a sweep: an immutable, validated parameter object.

Every field carries its description (``FIELD_DOCS``), from which the config
schema and the docs are generated. Fields whose meaning depends on another
choice (``spread`` only for ``lambda_dist: linear``, ``gamma0`` only for
``init: equiangular``, ...) are reset to their default when that choice does not
read them: the declarations in ``strengths``, ``heads`` and ``tokens`` say which
fields each choice reads. Two cells that simulate the same thing are therefore
equal, and share one store.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from numbers import Integral, Real

from .attention import ATTENTIONS, MASKS
from .heads import HEADS
from .observables import DEFAULT_GROUPS, GROUPS, canonical_groups
from .strengths import STRENGTHS
from .tokens import INITS

GEOMETRIES = {"sphere": "tokens on the unit sphere: dx_i/dt = P_{x_i}(v_i)",
              "flat": "flat space: dx_i/dt = v_i (only to contrast with the sphere)"}
_SPHERICAL = {"sphere": True, "flat": False}  # one entry per geometry, no default
CLUSTER_METRICS = {"epsilon": "epsilon = 1 - gamma_min <= cluster_threshold (every pair within)",
                   "gamma_mean": "mean pairwise cosine gamma_mean >= cluster_threshold"}

# exp(beta * s) must stay finite for every observable (energies use it for all
# attention types) and summed over n^2 pairs: exp(600) * 1e8 < float64 max.
MAX_EXPONENT = 600.0
# sample_spacing: log puts the first positive sample this many decades below t_max.
LOG_DECADES = 6
SAMPLE_SPACINGS = ("linear", "log")
# Below this, the error control asks for more than float64 can deliver.
MIN_RTOL = 1e-14


def _doc(default, doc: str, choices=None):
    return dataclasses.field(default=default, metadata={"doc": doc, "choices": choices})


def _choices(registry_or_dict):
    return tuple(registry_or_dict.names() if hasattr(registry_or_dict, "names") else registry_or_dict)


@dataclasses.dataclass(frozen=True)
class Cell:
    """Parameters of one grid cell; all seeds of a cell run as one batch.

    Every field is validated on construction; an invalid value or combination
    raises ``ValueError`` naming the field and the value. Conventions follow
    ``docs/model.md``. ``seeds`` is a count (seeds ``0..count-1``) or a list of
    non-negative ints; after construction it is always a tuple of ints. Numbers
    are normalised (``10`` and ``10.0`` are one value of a float field).
    """

    H: int = _doc(2, "number of heads")
    n: int = _doc(8, "number of tokens (>= 2)")
    d: int = _doc(8, "dimension of the token space")
    beta: float = _doc(1.0, "inverse temperature (> 0; beta * max ||M_h|| <= 600)")
    attention: str = _doc("softmax", "attention type", _choices(ATTENTIONS))
    mask: str = _doc("none", "attention mask: none, or causal (token i attends to j <= i only)",
                     _choices(MASKS))
    heads: str = _doc("scalar", "head structure (how M_h is built)", _choices(HEADS))
    delta: float = _doc(0.0, "operator norm of the perturbation (perturbed_block heads only)")
    weights: str = _doc("", "BERT-style .safetensors file of a trained transformer, or 'minilm' (the "
                        "packaged all-MiniLM-L6-v2): trained heads and embedding tokens")
    layer: int = _doc(0, "layer of the weights file (trained heads)")
    head_subset: Sequence[int] = _doc((), "heads of the layer to use (trained heads); empty: heads 0..H-1")
    values: str = _doc("aligned", "V_h of trained heads: aligned (V_h = M_h) or trained (W_O^h W_V^h)",
                       ("aligned", "trained"))
    model_heads: int = _doc(0, "heads per layer in the weights file; 0: num_attention_heads of the "
                            "config.json beside it")
    lambda_dist: str = _doc("equal", "distribution of the head strengths lambda_h", _choices(STRENGTHS))
    lambda_bar: float = _doc(1.0, "mean head strength; the total is Lambda = H lambda_bar")
    spread: float = _doc(0.0, "spread s in [0, 1) of the linear distribution (linear only)")
    concentration: float = _doc(1.0, "Dirichlet concentration (dirichlet only)")
    init: str = _doc("uniform", "initial tokens", _choices(INITS))
    gamma0: float = _doc(0.0, "initial common cosine (equiangular only)")
    geometry: str = _doc("sphere", "sphere (projected flow) or flat dynamics", _choices(GEOMETRIES))
    seeds: int | Sequence[int] = _doc(4, "seed count (seeds 0..count-1) or a list of distinct seeds; "
                                      "a cell with no random input keeps its first seed only")
    t_max: float = _doc(10.0, "integration horizon")
    n_samples: int = _doc(101, "sample times in [0, t_max], first 0 and last t_max (>= 2); spaced as "
                          "sample_spacing says")
    sample_spacing: str = _doc("linear", "linear: samples evenly spaced in [0, t_max]; log: t = 0, then "
                               f"n_samples - 1 samples evenly spaced in log t from t_max / 10^{LOG_DECADES} "
                               "to t_max (long horizons, metastable plateaus)", SAMPLE_SPACINGS)
    rtol: float = _doc(1e-6, f"relative tolerance of the integrator (>= {MIN_RTOL:g})")
    atol: float = _doc(1e-9, "absolute tolerance of the integrator")
    cluster_metric: str = _doc("epsilon", "clustering criterion", _choices(CLUSTER_METRICS))
    cluster_threshold: float = _doc(1e-3, "threshold of the clustering criterion")
    cluster_eps: float = _doc(1e-2, "cluster_count joins tokens with <x_i, x_j> >= 1 - cluster_eps "
                              "(clusters observable only)")
    stop_at_cluster: bool = _doc(False, "end each trajectory once its clustering criterion holds (later "
                                 "samples are NaN): for experiments that only look up to T_eps")
    observables: Sequence[str] = _doc(DEFAULT_GROUPS, "observable groups to record (cosines always)",
                                      _choices(GROUPS))
    max_steps: int = _doc(100_000, "step budget per trajectory (a stiff cell fails naming itself)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                _fail(f.name, value, "must be true or false")
            if f.type == "int":
                _check_int(f.name, value)
            elif f.type == "float":
                _check_real(f.name, value)
            choices = f.metadata["choices"]
            if f.type == "str" and choices is not None and value not in choices:
                _fail(f.name, value, f"must be one of {', '.join(choices)}")
        _normalise_numbers(self)
        for name, minimum in (("H", 1), ("n", 2), ("d", 1), ("n_samples", 2), ("max_steps", 1), ("layer", 0),
                              ("model_heads", 0)):
            if getattr(self, name) < minimum:
                _fail(name, getattr(self, name), f"must be >= {minimum}")
        for name in ("beta", "lambda_bar", "concentration", "t_max", "atol"):
            if getattr(self, name) <= 0:
                _fail(name, getattr(self, name), "must be > 0")
        object.__setattr__(self, "seeds", _normalise_seeds(self.seeds))
        object.__setattr__(self, "observables", _normalise_groups(self.observables))
        object.__setattr__(self, "head_subset", _normalise_subset(self.head_subset))
        self._canonicalise()

        if self.delta < 0:
            _fail("delta", self.delta, "the perturbation norm must be >= 0")
        if not 0.0 <= self.spread < 1.0:
            _fail("spread", self.spread, "must lie in [0, 1) so every lambda_h stays positive")
        if not MIN_RTOL <= self.rtol < 1.0:
            _fail("rtol", self.rtol, f"must lie in [{MIN_RTOL:g}, 1): float64 cannot resolve less")
        if self.cluster_metric == "epsilon" and not 0.0 < self.cluster_threshold < 2.0:
            _fail("cluster_threshold", self.cluster_threshold, "epsilon = 1 - gamma_min lies in (0, 2)")
        if self.cluster_metric == "gamma_mean" and not -1.0 < self.cluster_threshold < 1.0:
            _fail("cluster_threshold", self.cluster_threshold, "gamma_mean lies in (-1, 1)")
        if not 0.0 < self.cluster_eps < 2.0:
            _fail("cluster_eps", self.cluster_eps, "must lie in (0, 2)")
        for declaration in (HEADS.get(self.heads), INITS.get(self.init)):
            problem = declaration.check(self) if declaration.check else None
            if problem:
                field, why = problem
                _fail(field, getattr(self, field), why)
        exponent = self.beta * self.max_score_matrix_norm
        if exponent > MAX_EXPONENT:
            _fail("beta", self.beta, f"beta * max ||M_h|| = {exponent:.4g} exceeds {MAX_EXPONENT:g}: "
                  "exp(beta s) would overflow float64")

    def _canonicalise(self):
        """Reset fields that the cell's choices do not read to their defaults.

        A cell with no random input (no declaration draws from the seed) keeps
        only its first seed: the others would be copies of it.
        """
        used = set(self.used_fields())
        for name in CONDITIONAL_FIELDS - used:
            object.__setattr__(self, name, _DEFAULTS[name])
        if not self.is_random:
            object.__setattr__(self, "seeds", self.seeds[:1])

    @property
    def spherical(self) -> bool:
        """Whether the flow is projected onto the sphere (``geometry``)."""
        return _SPHERICAL[self.geometry]

    @property
    def heads_per_seed(self) -> bool:
        """Whether each seed draws its own heads (the structure, or the strengths it reads, are seeded).

        The one owner of this rule: the simulation builds the score matrices per
        seed or once from it, and the cost model counts them the same way.
        """
        structure = HEADS.get(self.heads)
        return structure.seeded or (structure.reads_strengths and STRENGTHS.get(self.lambda_dist).seeded)

    @property
    def is_random(self) -> bool:
        """Whether any of the cell's choices draws from the seed's random streams."""
        return any(declaration.seeded for declaration in
                   (STRENGTHS.get(self.lambda_dist), HEADS.get(self.heads), INITS.get(self.init)))

    def used_fields(self) -> tuple[str, ...]:
        """The conditional fields this cell's choices read (see ``CONDITIONAL_FIELDS``)."""
        structure = HEADS.get(self.heads)
        used = structure.uses + INITS.get(self.init).uses
        if structure.reads_strengths:
            used += ("lambda_dist", "lambda_bar") + STRENGTHS.get(self.lambda_dist).uses
        if "clusters" in self.observables:
            used += ("cluster_eps",)
        return used

    def sample_times(self):
        """The sample times (numpy array): ``n_samples`` times from 0 to ``t_max`` as ``sample_spacing`` says.

        ``linear``: evenly spaced. ``log``: ``t = 0``, then ``n_samples - 1`` times evenly spaced in
        ``log t`` from ``t_max / 10^LOG_DECADES`` to ``t_max`` (just ``[0, t_max]`` for two samples).
        """
        import numpy as np

        if self.sample_spacing == "linear":
            return np.linspace(0.0, self.t_max, self.n_samples)
        if self.n_samples == 2:
            return np.array([0.0, self.t_max])
        return np.concatenate([[0.0], np.geomspace(self.t_max * 10.0**-LOG_DECADES, self.t_max,
                                                   self.n_samples - 1)])

    @property
    def max_score_matrix_norm(self) -> float:
        """Upper bound on ``||M_h||_op`` over heads and seeds for the cell's generators."""
        largest = STRENGTHS.get(self.lambda_dist).largest(self)
        return HEADS.get(self.heads).norm_bound(self, largest)

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    def replace(self, **changes) -> Cell:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable fields (sequences as lists)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("seeds", "observables", "head_subset"):
            out[name] = list(out[name])
        return out

    def input_digest(self) -> str:
        """A digest of the files the cell reads (its weights), '' if none: part of its store's name."""
        if not self.weights:
            return ""
        from .trained import digest

        return digest(self.weights)


FIELD_DOCS = {f.name: f.metadata["doc"] for f in dataclasses.fields(Cell)}
FIELD_CHOICES = {f.name: f.metadata["choices"] for f in dataclasses.fields(Cell) if f.metadata["choices"]}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell)}
# Fields read only under some choices: the union of what the declarations say they read.
CONDITIONAL_FIELDS = frozenset(
    {u for registry in (STRENGTHS, HEADS, INITS) for item in registry for u in item.uses}
    | {"cluster_eps", "lambda_dist", "lambda_bar"}
)


def _fail(field: str, value, why: str):
    raise ValueError(f"Cell.{field} = {value!r}: {why}")


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, Integral):
        _fail(name, value, "must be an integer")


def _check_real(name, value):
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        _fail(name, value, "must be a finite real number")


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


def _normalise_groups(groups) -> tuple[str, ...]:
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        _fail("observables", groups, f"must be a list of groups ({', '.join(GROUPS.names())})")
    try:
        return canonical_groups(groups)
    except ValueError as err:
        _fail("observables", list(groups), str(err))


def _normalise_subset(subset) -> tuple[int, ...]:
    if isinstance(subset, (str, bytes)) or not isinstance(subset, Sequence):
        _fail("head_subset", subset, "must be a list of head indices")
    for h in subset:
        if isinstance(h, bool) or not isinstance(h, Integral) or h < 0:
            _fail("head_subset", list(subset), f"entry {h!r} is not a non-negative integer")
    if len(set(subset)) != len(subset):
        _fail("head_subset", list(subset), "heads must be distinct")
    return tuple(int(h) for h in subset)


def _normalise_numbers(cell: Cell) -> None:
    """Store float fields as float and int fields as int, so equal values hash equally."""
    for f in dataclasses.fields(cell):
        value = getattr(cell, f.name)
        if f.type == "float":
            object.__setattr__(cell, f.name, float(value))
        elif f.type == "int":
            object.__setattr__(cell, f.name, int(value))

