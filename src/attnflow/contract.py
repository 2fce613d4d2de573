"""The one seam between ``simulate`` and an engine: what to integrate, how, and what comes back.

Every engine (``attnflow.engine``, the compiled numba engine; ``attnflow.jaxengine``,
on diffrax) has one entry point,

    solve(problem, controller, saveat, event=ClusterEvent(), *, tableau=DOPRI5, in_span=True,
          strict=True) -> EngineResult

whose options are the frozen objects below, in the manner of diffrax's
``SaveAt``, step-size controller and ``Event``, each validated here once:

- ``Problem``: the batch of initial tokens, its ``Heads`` (the score matrices in
  one ``heads.Form``, and the value matrices), the attention type, the mask,
  the geometry (and nGPT's step size) and beta;
- ``Controller``: the error control's tolerances and the step budget (or fixed
  steps with no error control);
- ``SaveAt``: the sample times and the observable groups measured there;
- ``ClusterEvent``: the clustering criterion whose first crossing is
  ``t_cluster``, and whether a trajectory ends there.

Declarations (attention rules, mask rules, motion rules, head forms, clustering
metrics, observable groups) are made once, in ``attnflow.attention``,
``geometry``, ``heads`` and ``observables``. Each engine keeps a table per kind of declaration, keyed by the
declared values (``declarations()``), and ``check_engine`` refuses, naming it, a
declared value without its entry or an attention type or mask whose rule has
none (likewise a geometry): an engine runs every declaration or refuses it at import, and dispatches
through those tables, never through a default branch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import IntEnum

import numpy as np

from .attention import ATTENTIONS, MASKS, AttentionType, Energy, Entropy, Mask, MaskRule, Weights
from .geometry import GEOMETRIES, Geometry, Motion
from .heads import Form
from .observables import CLUSTER_METRICS, GROUPS, ClusterMetric, canonical_groups

__all__ = ["ClusterEvent", "Controller", "EngineResult", "Heads", "IntegrationError", "Problem", "SaveAt",
           "TrajectoryStatus", "check_attention", "check_batch", "check_engine", "check_geometry",
           "check_mask",
           "declarations",
           "failure_reason", "head_form", "raise_first_failure"]


# --- the declarations an engine implements --------------------------------------------------------

def declarations() -> dict[str, tuple]:
    """Every declared value an engine must implement, by kind: the key sets of an engine's tables."""
    return {"weight rule": tuple(Weights), "energy rule": tuple(Energy), "entropy rule": tuple(Entropy),
            "mask rule": tuple(MaskRule), "motion rule": tuple(Motion), "head form": tuple(Form),
            "clustering metric": CLUSTER_METRICS.names(), "observable group": GROUPS.names()}


def _label(value) -> str:
    return repr(value.name if isinstance(value, IntEnum) else value)


def _has(table: Mapping, rule, enum: type) -> bool:
    """Whether ``rule`` is a member of ``enum`` with an entry in ``table`` (a bool or an int equal to a
    member's value is no member: it would otherwise pass for that member)."""
    return isinstance(rule, enum) and rule in table


def check_attention(engine: str, kernels: Mapping[str, Mapping], kind: AttentionType) -> None:
    """Refuse an attention declaration whose rules have no entry in ``engine``'s tables, naming the rule."""
    for rule, enum, table in ((kind.weights, Weights, "weight rule"), (kind.energy, Energy, "energy rule"),
                              (kind.entropy, Entropy, "entropy rule")):
        if not _has(kernels[table], rule, enum):
            raise NotImplementedError(f"attention {kind.name!r} declares {type(rule).__name__} rule "
                                      f"{rule!r}, which has no kernel in engine {engine!r}")


def check_mask(engine: str, kernels: Mapping[str, Mapping], mask: Mask) -> None:
    """Refuse a mask declaration whose rule has no entry in ``engine``'s tables, naming the mask and rule."""
    if not _has(kernels["mask rule"], mask.rule, MaskRule):
        raise NotImplementedError(f"mask {mask.name!r} declares {type(mask.rule).__name__} rule "
                                  f"{mask.rule!r}, which has no kernel in engine {engine!r}")


def check_geometry(engine: str, kernels: Mapping[str, Mapping], geometry: Geometry) -> None:
    """Refuse a geometry whose motion rule has no entry in ``engine``'s tables, naming it and the rule."""
    if not _has(kernels["motion rule"], geometry.motion, Motion):
        rule = geometry.motion
        raise NotImplementedError(f"geometry {geometry.name!r} declares {type(rule).__name__} rule {rule!r}, "
                                  f"which has no kernel in engine {engine!r}")


def check_engine(engine: str, kernels: Mapping[str, Mapping]) -> None:
    """Refuse, by name, any declaration ``engine`` has no kernel for: ``kernels`` holds the engine's table
    for each kind of declaration (``declarations()``), keyed by the declared values; a key that is not
    declared is refused too (a kernel nothing reaches). Then every declared attention type and mask."""
    declared = declarations()
    if set(kernels) != set(declared):
        raise NotImplementedError(f"engine {engine!r} has tables for {sorted(kernels)}; the declarations are "
                                  f"{sorted(declared)}")
    for kind, values in declared.items():
        missing = [_label(v) for v in values if v not in kernels[kind]]
        if missing:
            raise NotImplementedError(f"engine {engine!r} has no {kind} kernel for {', '.join(missing)}")
        stray = [_label(k) for k in kernels[kind] if k not in values]
        if stray:
            raise NotImplementedError(f"engine {engine!r} has a kernel for {kind} {', '.join(stray)}, "
                                      "which is not declared")
    for kind in ATTENTIONS:
        check_attention(engine, kernels, kind)
    for mask in MASKS:
        check_mask(engine, kernels, mask)
    for geometry in GEOMETRIES:
        check_geometry(engine, kernels, geometry)


# --- the problem -----------------------------------------------------------------------------------

def head_form(score_matrices, diagonal, factors, d: int) -> Form:
    """The cheapest exact form to apply the score matrices in: factored when ``r <= d/2``, diagonal
    (also dense matrices that are diagonal), or dense. Both engines apply the heads in this form."""
    if factors is not None:
        return Form.FACTORED if factors[1].shape[-1] <= d // 2 else Form.DENSE
    if diagonal is not None:
        return Form.DIAGONAL
    if score_matrices is not None:
        return Form.DIAGONAL if np.all(score_matrices == score_matrices * np.eye(d)) else Form.DENSE
    raise ValueError("give the score matrices in exactly one form: score_matrices, diagonal or factors")


@dataclasses.dataclass(frozen=True, eq=False)
class Heads:
    """The heads of a batch: the score matrices ``M_h`` in exactly one form (``heads.Form``) and the
    value matrices. Each array has a leading axis of B (one per trajectory) or 1 (shared by all).

    score_matrices : (B, H, d, d) symmetric ``M_h`` (dense), or
    diagonal : (B, H, d), ``M_h = diag(diagonal)``, or
    factors : ``(U, e)``, (B, H, d, r) and (B, H, r), with ``M_h = U diag(e) U^T`` (factored)
    values : (B, H, d, d) ``V_h``, or None for ``V_h = M_h``
    """

    score_matrices: np.ndarray | None = None
    diagonal: np.ndarray | None = None
    factors: tuple[np.ndarray, np.ndarray] | None = None
    values: np.ndarray | None = None

    def __post_init__(self):
        if sum(a is not None for a in (self.score_matrices, self.diagonal, self.factors)) != 1:
            raise ValueError("give the score matrices in exactly one form: score_matrices, diagonal or "
                             "factors")

    @property
    def given(self) -> np.ndarray:
        """The array of the given form whose axes are (B or 1, H, ...): the matrices, diagonals or e."""
        return next(a for a in (self.score_matrices, self.diagonal, None if self.factors is None
                                else self.factors[1]) if a is not None)

    def form(self, d: int) -> Form:
        """The form the engines apply these heads in, in dimension ``d`` (``head_form``)."""
        return head_form(self.score_matrices, self.diagonal, self.factors, d)

    def in_form(self, d: int) -> tuple[Form, Heads]:
        """The form the engines apply these heads in, and the heads given in that form: dense matrices
        that are diagonal as their diagonals, factors of too high a rank as dense products."""
        form = self.form(d)
        if form == Form.DIAGONAL and self.diagonal is None:
            diagonal = np.diagonal(self.score_matrices, axis1=-2, axis2=-1)
            return form, Heads(diagonal=diagonal, values=self.values)
        if form == Form.DENSE and self.factors is not None:  # rank too high to pay: dense products
            u, e = self.factors
            return form, Heads(score_matrices=np.einsum("bhdr,bhr,bher->bhde", u, e, u), values=self.values)
        return form, self

    def rows(self, trajectories) -> Heads:
        """These heads for the trajectories ``trajectories`` (indices): the rows of per-trajectory arrays,
        shared arrays as they are."""
        def take(a):
            if a is None:
                return None
            if isinstance(a, tuple):
                return tuple(take(part) for part in a)
            return a[trajectories] if a.shape[0] > 1 else a

        return Heads(*(take(a) for a in (self.score_matrices, self.diagonal, self.factors, self.values)))


def check_batch(x, heads: Heads, beta, name: str = "x0") -> None:
    """Shapes and values of a batch, each refused in one line naming the argument (an engine would fail
    on them without a name, or run on a broadcast it should not)."""
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"{name}: shape {x.shape}, expected (B, n, d)")
    B, n, d = x.shape
    lead = f"B = {B} or 1"

    def check(label, a, tail, ndim):
        a = np.asarray(a)
        if a.ndim != ndim or a.shape[0] not in (1, B) or a.shape[2:] != tail[1:] or a.shape[1] != tail[0]:
            want = ", ".join(map(str, tail))
            raise ValueError(f"{label}: shape {a.shape}, expected ({lead}, {want}) for {name} of shape "
                             f"{x.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{label}: contains non-finite entries")

    H = np.shape(heads.given)[1] if np.ndim(heads.given) >= 2 else 0
    if heads.score_matrices is not None:
        check("score_matrices", heads.score_matrices, (H, d, d), 4)
    if heads.diagonal is not None:
        check("diagonal", heads.diagonal, (H, d), 3)
    if heads.factors is not None:
        u, e = heads.factors
        check("factors[1] (e)", e, (H, np.shape(e)[-1] if np.ndim(e) else 0), 3)
        check("factors[0] (U)", u, (H, d, np.shape(e)[-1]), 4)
    if heads.values is not None:
        check("values", heads.values, (H, d, d), 4)
    b = np.asarray(beta, dtype=float)
    if b.ndim > 1 or (b.ndim == 1 and b.size != B) or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"beta: {beta!r}, expected a finite number > 0 or {B} of them (one per trajectory)")


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """What is integrated: ``x0`` (B, n, d) initial tokens under ``heads``, an attention type and a mask
    (declarations, or their names in ``attnflow.attention``), in a geometry (``attnflow.geometry``: a
    declaration or its name; ``ngpt_alpha`` is read by ``ngpt`` only), at inverse temperature ``beta``
    (one for all, or (B,) one per trajectory). Where the geometry carries radii the rows of ``x0`` are
    ``r_k theta_k``; on the sphere they have unit norm."""

    x0: np.ndarray
    heads: Heads
    attention: AttentionType | str
    beta: float | np.ndarray
    geometry: Geometry | str = "sphere"
    mask: Mask | str = "none"
    ngpt_alpha: float = 1.0

    def __post_init__(self):
        if not isinstance(self.attention, AttentionType):
            object.__setattr__(self, "attention", ATTENTIONS.get(self.attention))
        if not isinstance(self.mask, Mask):
            object.__setattr__(self, "mask", MASKS.get(self.mask))
        if not isinstance(self.geometry, Geometry):
            object.__setattr__(self, "geometry", GEOMETRIES.get(self.geometry))
        if not (np.isfinite(self.ngpt_alpha) and self.ngpt_alpha > 0):
            raise ValueError(f"ngpt_alpha: {self.ngpt_alpha!r}, expected a finite number > 0")
        check_batch(self.x0, self.heads, self.beta)

    @property
    def form(self) -> Form:
        """The form the engines apply the heads in."""
        return self.heads.form(np.shape(self.x0)[2])

    def rows(self, trajectories) -> Problem:
        """The same problem for the trajectories ``trajectories`` (indices) alone."""
        beta = np.asarray(self.beta)
        return dataclasses.replace(self, x0=np.asarray(self.x0)[trajectories],
                                   heads=self.heads.rows(trajectories),
                                   beta=beta[trajectories] if beta.ndim else self.beta)


# --- the options -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Controller:
    """The step-size control: ``rtol`` and ``atol`` of the error control, and ``max_steps``, accepted and
    rejected steps per trajectory; ``fixed_step``: steps of that size with no error control
    (convergence tests; the tolerances are then not read); ``max_step``: no step longer than this (the
    certificate's capped companion, ``certificate.py``)."""

    rtol: float
    atol: float
    max_steps: int
    fixed_step: float | None = None
    max_step: float | None = None

    def __post_init__(self):
        if self.fixed_step is None and not (0.0 < self.rtol < 1.0 and self.atol > 0.0):
            raise ValueError(f"rtol = {self.rtol!r}, atol = {self.atol!r}: need 0 < rtol < 1 and atol > 0")
        if self.fixed_step is not None and not self.fixed_step > 0.0:
            raise ValueError(f"fixed_step = {self.fixed_step!r}: need a step > 0")
        if self.max_step is not None and not self.max_step > 0.0:
            raise ValueError(f"max_step = {self.max_step!r}: need a step > 0")
        if int(self.max_steps) < 1:
            raise ValueError(f"max_steps = {self.max_steps!r}: need at least 1")
        object.__setattr__(self, "max_steps", int(self.max_steps))


@dataclasses.dataclass(frozen=True, eq=False)
class SaveAt:
    """Where and what to record: the variables of the observable ``groups`` (``attnflow.observables``;
    ``cosines`` always) at the sample ``times`` (at least two, strictly increasing; the integration runs
    from the first to the last). ``cluster_eps``: ``cluster_count`` joins tokens with
    ``<x_i, x_j> >= 1 - cluster_eps``."""

    times: np.ndarray
    groups: tuple[str, ...] = ("cosines",)
    cluster_eps: float = 1e-2

    def __post_init__(self):
        times = np.ascontiguousarray(self.times, dtype=np.float64)
        if times.ndim != 1 or times.size < 2 or not np.all(np.diff(times) > 0):
            raise ValueError(f"SaveAt.times: needs at least two strictly increasing times, got "
                             f"{self.times!r}")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "groups", canonical_groups(self.groups))

    @property
    def level(self) -> float:
        """The cosine from which two tokens count as one cluster: ``1 - cluster_eps``."""
        return 1.0 - float(self.cluster_eps)


@dataclasses.dataclass(frozen=True)
class ClusterEvent:
    """The clustering criterion (``observables.CLUSTER_METRICS``) whose first crossing, located on the
    integrator's dense output, is ``t_cluster``; ``stop``: each trajectory ends there, its later samples
    NaN (cluster counts -1)."""

    metric: ClusterMetric | str = "epsilon"
    threshold: float = 1e-3
    stop: bool = False

    def __post_init__(self):
        if not isinstance(self.metric, ClusterMetric):
            if self.metric not in CLUSTER_METRICS:
                raise ValueError(f"cluster_metric: {self.metric!r}, expected one of "
                                 f"{', '.join(CLUSTER_METRICS.names())}")
            object.__setattr__(self, "metric", CLUSTER_METRICS.get(self.metric))
        if not np.isfinite(self.threshold):
            raise ValueError(f"cluster_threshold: {self.threshold!r}, expected a finite number")


# The event of a solve that names none: epsilon <= 1e-3 located, no stop.
DEFAULT_EVENT = ClusterEvent()


# --- the result ------------------------------------------------------------------------------------

class TrajectoryStatus(IntEnum):
    """How a trajectory ended (``EngineResult.status``; the stored ``failure`` uses the same numbers)."""

    OK = 0
    UNDERFLOW = 1  # step size below round-off of t: non-finite or stiff
    BUDGET = 2  # max_steps accepted + rejected steps spent


class IntegrationError(RuntimeError):
    """A trajectory could not reach the end of the interval (``solve(..., strict=True)``)."""


def failure_reason(status: int, max_steps: int) -> str:
    """What a trajectory's ``EngineResult.status`` says, in words ("" for ``TrajectoryStatus.OK``)."""
    return {TrajectoryStatus.OK: "", TrajectoryStatus.UNDERFLOW: "step size underflow (non-finite or stiff)",
            TrajectoryStatus.BUDGET: f"step budget of {max_steps} exhausted"}[TrajectoryStatus(int(status))]


@dataclasses.dataclass
class EngineResult:
    variables: dict[str, np.ndarray]  # name -> (B, T, ...) for every variable of the wanted groups
    n_steps: np.ndarray  # (B,) accepted steps
    n_rejected: np.ndarray  # (B,) rejected steps
    n_rhs_calls: np.ndarray  # (B,) field evaluations, samples included
    t_cluster: np.ndarray  # (B,) first time the criterion holds, NaN if never
    norm_drift: np.ndarray  # (B,) largest | ||x_i|| - 1 | over the samples
    max_retraction: np.ndarray  # (B,) largest | ||x_i|| - 1 | removed by a retraction
    t_stop: np.ndarray  # (B,) where the integration ended: the last sample time, t_cluster when stopping
    # there, or where the trajectory failed (``status``)
    form: str  # the form the score matrices were applied in (``Form.label``)
    status: np.ndarray  # (B,) ``TrajectoryStatus``: OK, UNDERFLOW or BUDGET (``failure_reason``)


def raise_first_failure(status: np.ndarray, t_stop: np.ndarray, t_end: float, max_steps: int) -> None:
    """``IntegrationError`` naming the first trajectory whose ``status`` is not ``TrajectoryStatus.OK``,
    where it stopped and why (``solve(..., strict=True)``); nothing where all reached ``t_end``."""
    failed = np.flatnonzero(np.asarray(status) != TrajectoryStatus.OK)
    if failed.size:
        b = int(failed[0])
        raise IntegrationError(f"trajectory {b}: {failure_reason(status[b], max_steps)} at "
                               f"t = {t_stop[b]:.6g} of {t_end:g}")
