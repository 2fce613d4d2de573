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
import functools
import json
import math
import operator
from collections.abc import Sequence

from .attention import ATTENTIONS, MASKS
from .cellvalues import (
    INT64_MAX,
    _check_int,
    _check_real,
    _fail,
    _normalise_groups,
    _normalise_seeds,
    _normalise_subset,
)
from .geometry import GEOMETRIES
from .heads import HEADS, VALUES
from .observables import CLUSTER_METRICS, DEFAULT_GROUPS, GROUPS
from .strengths import STRENGTHS
from .tokens import INITS

# exp(beta * s) must stay finite for every observable (energies use it for all
# attention types) and summed over n^2 pairs: exp(600) * 1e8 < float64 max.
MAX_EXPONENT = 600.0
# sample_spacing: log puts the first positive sample this many decades below t_max.
LOG_DECADES = 6
SAMPLE_SPACINGS = ("linear", "log")
# Which engine integrates the cell: the compiled numba engine on the CPU cores, the JAX engine
# (attnflow.jaxengine, on diffrax; an accelerator where jax sees one), or auto (``engines.engine_for``).
ENGINES = ("numba", "jax", "auto")
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
    values: str = _doc("aligned", "value matrices: aligned (V_h = M_h), identity (V_h = I; the energy "
                       "identities then need not hold), or trained (W_O^h W_V^h of trained heads only)",
                       _choices(VALUES))
    model_heads: int = _doc(0, "heads per layer in the weights file; 0: num_attention_heads of the "
                            "config.json beside it")
    lambda_dist: str = _doc("equal", "distribution of the head strengths lambda_h", _choices(STRENGTHS))
    lambda_bar: float = _doc(1.0, "mean head strength; the total is Lambda = H lambda_bar")
    spread: float = _doc(0.0, "spread s in [0, 1) of the linear distribution (linear only)")
    concentration: float = _doc(1.0, "Dirichlet concentration (dirichlet only)")
    init: str = _doc("uniform", "initial tokens", _choices(INITS))
    gamma0: float = _doc(0.0, "initial common cosine (equiangular only)")
    geometry: str = _doc("sphere", "how the attention velocity moves the tokens: sphere (Post-LN), flat, "
                         "pre_ln, peri_ln or ngpt (docs/model.md, result 12)", _choices(GEOMETRIES))
    ngpt_alpha: float = _doc(1.0, "nGPT's step size alpha (> 0; geometry: ngpt only)")
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
                                 "samples are NaN, cluster counts -1): for experiments that only look up "
                                 "to T_eps")
    observables: Sequence[str] = _doc(DEFAULT_GROUPS, "observable groups to record (cosines always); in a "
                                      "config, each experiment adds the groups its figure reads to those "
                                      "listed, and records only those when none are", _choices(GROUPS))
    max_steps: int = _doc(100_000, "step budget per trajectory (a stiff cell fails naming itself)")
    engine: str = _doc("numba", "numba: the compiled engine on the CPU cores; jax: the JAX engine on diffrax "
                       "(pip install 'attnflow[jax]'; a GPU where jax sees one); auto: jax where jax sees "
                       "a GPU and the cost model calls the cell large, else numba. Not part of the cell's "
                       "id (nor a grid axis): a store records the engine of each cell, and a cell computed "
                       "by another engine than it names is computed again (auto takes either)", ENGINES)

    def __post_init__(self):
        # A sweep builds every cell at each workflow start (10^5 cells and more), so this runs
        # from precomputed tables (``_CHECKS``...) instead of dataclasses.fields(), reads and
        # writes the instance __dict__ (a frozen dataclass without slots keeps its fields there;
        # writing it is what object.__setattr__ does), and tests the exact builtin type before
        # the slow ABC checks (numbers.Real, Integral).
        values = self.__dict__
        _check_fields(values)
        for name, minimum in _MINIMUMS:
            if values[name] < minimum:
                _fail(name, values[name], f"must be >= {minimum}")
        if values["max_steps"] > INT64_MAX:
            _fail("max_steps", values["max_steps"], "exceeds 2^63 - 1 (the engine counts steps in int64)")
        for name in _POSITIVE:
            if values[name] <= 0:
                _fail(name, values[name], "must be > 0")
        values["seeds"] = _normalise_seeds(values["seeds"])
        values["observables"] = _normalise_groups(values["observables"])
        values["head_subset"] = _normalise_subset(values["head_subset"])
        # Before canonicalising: a value out of its field's range is refused even where no choice reads it.
        if values["delta"] < 0:
            _fail("delta", values["delta"], "the perturbation norm must be >= 0")
        if not 0.0 <= values["spread"] < 1.0:
            _fail("spread", values["spread"], "must lie in [0, 1) so every lambda_h stays positive")
        if not 0.0 < values["cluster_eps"] < 2.0:
            _fail("cluster_eps", values["cluster_eps"], "must lie in (0, 2)")
        self._canonicalise()
        # After canonicalising: a cell that reads no weights has the default here, whatever it was given.
        if not isinstance(values["weights"], str):
            _fail("weights", values["weights"], "must be a string: a file path, 'minilm', or '' for none")

        if not MIN_RTOL <= self.rtol < 1.0:
            _fail("rtol", self.rtol, f"must lie in [{MIN_RTOL:g}, 1): float64 cannot resolve less")
        metric = CLUSTER_METRICS.get(self.cluster_metric)
        low, high = metric.bounds
        if not low < self.cluster_threshold < high:
            _fail("cluster_threshold", self.cluster_threshold,
                  f"{metric.quantity} lies in ({low:g}, {high:g})")
        for declaration in (HEADS.get(self.heads), INITS.get(self.init)):
            problem = declaration.check(self) if declaration.check else None
            if problem:
                field, why = problem
                _fail(field, getattr(self, field), why)
        if "energy_path" in self.observables and GEOMETRIES.get(self.geometry).radii:
            # The engines' per-step rates read the state itself; where it carries radii the energy is
            # the directions' (measure's route), which the per-step hook does not take.
            _fail("observables", list(self.observables),
                  f"energy_path is not recorded under geometry {self.geometry!r} (its state carries radii); "
                  "energy_rate at the samples is")
        exponent = self.beta * self.max_score_matrix_norm
        if exponent > MAX_EXPONENT:
            _fail("beta", self.beta, f"beta * max ||M_h|| = {exponent:.4g} exceeds {MAX_EXPONENT:g}: "
                  "exp(beta s) would overflow float64")

    def _canonicalise(self):
        """Reset fields that the cell's choices do not read to their defaults.

        A cell with no random input (no declaration draws from the seed) keeps
        only its first seed: the others would be copies of it.
        """
        values = self.__dict__  # see __post_init__
        for name in CONDITIONAL_FIELDS.difference(self.used_fields()):
            values[name] = _DEFAULTS[name]
        if not self.is_random:
            values["seeds"] = values["seeds"][:1]

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
        strengths, structure, init = (STRENGTHS.get(self.lambda_dist), HEADS.get(self.heads),
                                      INITS.get(self.init))
        return strengths.seeded or structure.seeded or init.seeded

    def used_fields(self) -> tuple[str, ...]:
        """The conditional fields this cell's choices read (see ``CONDITIONAL_FIELDS``)."""
        structure = HEADS.get(self.heads)
        used = structure.uses + INITS.get(self.init).uses + GEOMETRIES.get(self.geometry).uses
        if VALUES.get(self.values).reads(structure):
            used += ("values",)
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
        """Plain, JSON-serialisable fields (sequences as lists); a new dict at each call."""
        # The instance __dict__ (see __post_init__) may also hold the cached canonical JSON.
        out = dict(zip(_FIELD_NAMES, _FIELD_VALUES(self.__dict__), strict=True))
        for name in _SEQUENCE_FIELDS:
            out[name] = list(out[name])
        if self.engine != _DEFAULT_ENGINE:  # at its default, absent: jobs' parameters stay as they were
            out["engine"] = self.engine
        out.update(self._later_fields())
        return out

    def _later_fields(self) -> dict:
        """The fields added after stores existed (``_LATER_FIELDS``) that are away from their defaults:
        only these enter ``to_dict`` and the id, so every cell that existed before keeps its id."""
        values = self.__dict__
        return {name: values[name] for name in _LATER_FIELDS if values[name] != _DEFAULTS[name]}

    def canonical_json(self) -> str:
        """Exactly ``json.dumps(self.to_dict(), sort_keys=True)``, computed once per cell: what a job is
        given of its cells (``engine`` there only away from its default)."""
        return self._canonical_json

    def identity_json(self) -> str:
        """The text its id (``attnflow.ids.cell_id``) hashes, so it must never change for a given
        cell: ``canonical_json`` less ``engine``, computed once per cell. The engine is no part of what
        a cell is: the store records which engine computed it (``versions.engine_staleness``), so a
        config that moves from ``numba`` to ``auto`` keeps its cells."""
        return self._identity_json

    # A cell is immutable once built, so its JSON is too. cached_property stores it in the
    # instance __dict__ (allowed on a frozen dataclass); it is no field, so equality, hashing,
    # repr and replace() ignore it.
    @functools.cached_property
    def _identity_json(self) -> str:
        # The same text as json.dumps of to_dict() less engine, sort_keys=True, built faster: the keys
        # are put in sorted order here once instead of sorted per call, and the tuple fields are
        # encoded as is (JSON writes a tuple as a list) instead of being copied to lists.
        fields = dict(zip(_SORTED_NAMES, _SORTED_VALUES(self.__dict__), strict=True))
        later = self._later_fields()
        return json.dumps(dict(sorted({**fields, **later}.items())) if later else fields)

    @functools.cached_property
    def _canonical_json(self) -> str:
        if self.engine == _DEFAULT_ENGINE:
            return self._identity_json
        fields = dict(zip(_SORTED_NAMES, _SORTED_VALUES(self.__dict__), strict=True))
        return json.dumps(dict(sorted({**fields, **self._later_fields(), "engine": self.engine}.items())))

    def input_digest(self) -> str:
        """A digest of the files the cell reads (its weights), '' if none: part of its store's name."""
        if not self.weights:
            return ""
        from .trained import digest

        return digest(self.weights)


FIELD_DOCS = {f.name: f.metadata["doc"] for f in dataclasses.fields(Cell)}
FIELD_CHOICES = {f.name: f.metadata["choices"] for f in dataclasses.fields(Cell) if f.metadata["choices"]}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell)}
# Fields added after stores existed: to_dict() and the JSON (hence the id) carry them only away from their
# defaults, so the cells that existed before keep their ids (tests/test_cell_ids.py).
_LATER_FIELDS = ("ngpt_alpha",)
# The fields of to_dict() and the canonical JSON, less engine (there only where it is not its default) and
# the later fields.
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Cell) if f.name not in ("engine",) + _LATER_FIELDS)
_DEFAULT_ENGINE = _DEFAULTS["engine"]
_FIELD_VALUES = operator.itemgetter(*_FIELD_NAMES)
_SEQUENCE_FIELDS = ("seeds", "observables", "head_subset")  # tuples on the cell, lists in to_dict()
# What __post_init__ checks of each field, in declaration order: (name, bool | int | float, None)
# for typed fields, (name, str, choices) for fields with a fixed set of values. Annotations are
# strings here (``from __future__ import annotations``). Other fields (weights, the sequences)
# are checked elsewhere or not at all.
_CHECKS = tuple(
    (f.name, {"bool": bool, "int": int, "float": float, "str": str}[f.type], f.metadata["choices"])
    for f in dataclasses.fields(Cell)
    if f.type in ("bool", "int", "float") or (f.type == "str" and f.metadata["choices"] is not None)
)
_MINIMUMS = (("H", 1), ("n", 2), ("d", 1), ("n_samples", 2), ("max_steps", 1), ("layer", 0),
             ("model_heads", 0))
_POSITIVE = ("beta", "lambda_bar", "concentration", "t_max", "atol", "ngpt_alpha")
_SORTED_NAMES = tuple(sorted(_FIELD_NAMES))  # the key order of json.dumps(..., sort_keys=True)
_SORTED_VALUES = operator.itemgetter(*_SORTED_NAMES)
# Fields read only under some choices: the union of what the declarations say they read.
CONDITIONAL_FIELDS = frozenset(
    {u for registry in (STRENGTHS, HEADS, INITS, GEOMETRIES) for item in registry for u in item.uses}
    | {"cluster_eps", "lambda_dist", "lambda_bar", "values"}
)


def _check_fields(values: dict) -> None:
    """Check each field of ``_CHECKS`` in declaration order (so the first bad field is the one
    named), then store accepted numbers of other types (numpy, Fraction; 10 for a float field) as
    float or int, so equal values hash equally."""
    cast = []
    for name, kind, choices in _CHECKS:
        value = values[name]
        if kind is bool:
            if not isinstance(value, bool):
                _fail(name, value, "must be true or false")
        elif kind is int:
            if type(value) is not int:
                _check_int(name, value)
                cast.append((name, int))
        elif kind is float:
            if type(value) is not float or not math.isfinite(value):
                _check_real(name, value)
                cast.append((name, float))
        elif value not in choices:
            _fail(name, value, f"must be one of {', '.join(choices)}")
    for name, kind in cast:
        values[name] = kind(values[name])


def readers_of(field: str) -> str:
    """Which choices read a conditional field (``CONDITIONAL_FIELDS``), as a person reads it: "under
    init: equiangular", say."""
    if field == "cluster_eps":
        return "where the clusters observable is recorded"
    if field == "values":
        return "with the value matrices it names: " + "; ".join(
            f"{v.name} under heads: {', '.join(v.heads)}" for v in VALUES if v.heads)
    readers = [f"{key}: {', '.join(item.name for item in registry if field in item.uses)}"
               for key, registry in (("heads", HEADS), ("init", INITS), ("lambda_dist", STRENGTHS),
                                     ("geometry", GEOMETRIES))
               if any(field in item.uses for item in registry)]
    strengths = ", ".join(item.name for item in HEADS if item.reads_strengths)
    if field in ("lambda_dist", "lambda_bar"):
        readers.append(f"heads: {strengths}")
    elif any(field in item.uses for item in STRENGTHS):  # a distribution is read only by these heads
        readers[-1] += f" with heads: {strengths}"
    return "under " + "; ".join(readers)
