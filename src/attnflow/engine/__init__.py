"""The compiled engine: batched, adaptive integration of the attention flow with exact observables.

``solve`` prepares the score matrices in the form that is cheapest to apply
(``heads.Form``), allocates the variables of the wanted observable groups, and
runs the compiled loop (``dopri.solve_batch``) on the cores (``threads``), with
single-threaded BLAS. ``observe`` measures the same variables at given
configurations, without integrating.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..attention import ATTENTIONS, MASKS, AttentionType, Energy, Entropy, Mask, MaskRule, Weights
from ..heads import Form
from ..numerics import NUMERICS_VERSION  # noqa: F401  (re-exported: attnflow.engine.NUMERICS_VERSION)
from ..observables import GROUPS, canonical_groups, variables
from ..tableau import DOPRI5, ButcherTableau
from .dopri import (
    CALLS,
    DRIFT,
    REJECTED,
    RETRACTION,
    STATUS,
    STEPS,
    T_CLUSTER,
    T_STOP,
    Control,
    Criterion,
    Method,
    Sampling,
    Stats,
    Status,
    observe_batch,
    solve_batch,
)
from .field import COMPILED_FORMS, COMPILED_MASKS, COMPILED_WEIGHTS, Flow, HeadArrays
from .machinery import loaded_blas, run_threads
from .measure import COMPILED_ENERGIES, COMPILED_ENTROPIES, COMPILED_METRICS, Group, Metric, Outputs

__all__ = ["EngineResult", "IntegrationError", "Status", "check_compiled", "check_mask", "compilations",
           "criterion_text", "failure_reason", "observe", "solve"]


METRICS = {"epsilon": Metric.EPSILON, "gamma_mean": Metric.GAMMA_MEAN}
# How each metric meets its threshold (``dopri._met``'s branches), as the stored descriptions say it.
COMPARISONS = {Metric.EPSILON: "<=", Metric.GAMMA_MEAN: ">="}


def check_compiled(kind: AttentionType) -> None:
    """Refuse an attention declaration whose rules have no compiled branch, naming the rule.

    The compiled dispatch has no default branch: a rule without its own would
    otherwise stop the run inside the loop, or, in a careless edit, run as another.
    A rule must be a member of its enum: a bool or an int equal to a member's
    value would otherwise pass for that member.
    """
    for rule, enum, compiled, where in ((kind.weights, Weights, COMPILED_WEIGHTS, "field.attention_weights"),
                                        (kind.energy, Energy, COMPILED_ENERGIES, "measure.measure"),
                                        (kind.entropy, Entropy, COMPILED_ENTROPIES, "measure.measure")):
        if not isinstance(rule, enum) or rule not in compiled:
            raise NotImplementedError(
                f"attention {kind.name!r} declares {type(rule).__name__} rule {rule!r}, which has no "
                f"compiled branch in attnflow.engine.{where}")


def check_mask(mask: Mask) -> None:
    """Refuse a mask declaration whose rule has no compiled branch, naming the mask and the rule
    (as ``check_compiled`` for attention types): the compiled mask dispatch has no default branch,
    so a new mask never runs as another."""
    if not isinstance(mask.rule, MaskRule) or mask.rule not in COMPILED_MASKS:
        raise NotImplementedError(
            f"mask {mask.name!r} declares {type(mask.rule).__name__} rule {mask.rule!r}, which has no "
            "compiled branch in attnflow.engine.field.attended and _mask_rows")


def _metric(name: str) -> Metric:
    if name not in METRICS:
        raise ValueError(f"cluster_metric: {name!r}, expected one of {', '.join(METRICS)}")
    return METRICS[name]


def criterion_text(metric: str, threshold: float) -> str:
    """The clustering criterion in words, as ``epsilon <= 0.001``."""
    return f"{metric} {COMPARISONS[_metric(metric)]} {threshold:g}"


def _check_groups() -> None:
    """The engine's ``Group`` flags follow the declared observable groups one to one."""
    if [g.name.lower() for g in Group] != list(GROUPS.names()):
        raise NotImplementedError(f"engine.measure.Group {[g.name for g in Group]} does not match the "
                                  f"declared observable groups {list(GROUPS.names())}")


def _check_enums() -> None:
    """Every head form, clustering metric and mask rule has its compiled branch (those branches have no
    default), and every metric its comparison."""
    for enum, compiled in ((Form, COMPILED_FORMS), (Metric, COMPILED_METRICS), (MaskRule, COMPILED_MASKS),
                           (Metric, COMPARISONS)):
        missing = [member.name for member in enum if member not in compiled]
        if missing:
            raise NotImplementedError(f"engine {enum.__name__} {missing} has no compiled branch")


# At import: every declared attention type, mask, observable group, head form and metric has its
# compiled part.
for _kind in ATTENTIONS:
    check_compiled(_kind)
for _mask in MASKS:
    check_mask(_mask)
_check_groups()
_check_enums()


def flow_of(attention: str | AttentionType, spherical: bool, mask: str | Mask = "none") -> Flow:
    """The compiled flow record of an attention type and a mask (each a name or a declaration) and
    geometry."""
    kind = attention if isinstance(attention, AttentionType) else ATTENTIONS.get(attention)
    check_compiled(kind)
    masking = mask if isinstance(mask, Mask) else MASKS.get(mask)
    check_mask(masking)
    return Flow(int(kind.weights), bool(kind.normalised), bool(kind.velocity_over_n), int(kind.energy),
                int(kind.entropy), int(masking.rule), bool(spherical))


def _sampling(groups) -> Sampling:
    """What the samples record, and what that needs (from the groups' declarations)."""
    declared = [GROUPS.get(g) for g in groups]
    return Sampling(_want(groups), any(g.needs_velocity for g in declared),
                    any(g.needs_scores for g in declared))


def _method(tableau: ButcherTableau) -> Method:
    return Method(tableau.a, tableau.b, tableau.e, tableau.dense, int(tableau.error_order),
                  bool(tableau.fsal))


class IntegrationError(RuntimeError):
    """A trajectory could not reach the end of the interval (``solve(..., strict=True)``)."""


def failure_reason(status: int, max_steps: int) -> str:
    """What a trajectory's ``EngineResult.status`` says, in words ("" for ``Status.OK``)."""
    return {Status.OK: "", Status.UNDERFLOW: "step size underflow (non-finite or stiff)",
            Status.BUDGET: f"step budget of {max_steps} exhausted"}[Status(int(status))]


@dataclasses.dataclass
class EngineResult:
    variables: dict[str, np.ndarray]  # name -> (B, T, ...) for every variable of the wanted groups
    n_steps: np.ndarray  # (B,) accepted steps
    n_rejected: np.ndarray  # (B,) rejected steps
    n_rhs_calls: np.ndarray  # (B,) field evaluations, samples included
    t_cluster: np.ndarray  # (B,) first time the criterion holds, NaN if never
    norm_drift: np.ndarray  # (B,) largest | ||x_i|| - 1 | over the samples
    max_retraction: np.ndarray  # (B,) largest | ||x_i|| - 1 | removed by a retraction
    t_stop: np.ndarray  # (B,) where the integration ended: t_eval[-1], t_cluster when stopping there,
    # or where the trajectory failed (``status``)
    form: str  # the form the score matrices were applied in (``Form.label``)
    status: np.ndarray  # (B,) ``dopri.Status`` per trajectory: OK, UNDERFLOW or BUDGET (``failure_reason``)


def head_form(score_matrices, diagonal, factors, d: int) -> Form:
    """The cheapest exact form to apply the score matrices in: factored when ``r <= d/2``, diagonal
    (also dense matrices that are diagonal), or dense."""
    if factors is not None:
        return Form.FACTORED if factors[1].shape[-1] <= d // 2 else Form.DENSE
    if diagonal is not None:
        return Form.DIAGONAL
    if score_matrices is not None:
        return Form.DIAGONAL if np.all(score_matrices == score_matrices * np.eye(d)) else Form.DENSE
    raise ValueError("give the score matrices in exactly one form: score_matrices, diagonal or factors")


def _head_arrays(x0, score_matrices, diagonal, factors, values):
    """The batch's ``HeadArrays``: form, diagonal, dense, U, U^T, e, V^T, shared (unused arrays empty), H.

    Each array has one row per trajectory, or a single row all trajectories share.
    """
    B, d = 1, x0.shape[2]  # the unused arrays: one empty row
    # Exactly one form, of the batch's shapes: _check_batch said so before.
    H = next(a for a in (score_matrices, diagonal, None if factors is None else factors[1])
             if a is not None).shape[1]
    form = head_form(score_matrices, diagonal, factors, d)
    empty2, empty3 = np.empty((B, 0, 0)), np.empty((B, 0, 0, 0))
    if factors is not None and form != Form.FACTORED:  # rank too high to pay: dense products
        u, e = factors
        score_matrices, factors = np.einsum("bhdr,bhr,bher->bhde", u, e, u), None
    diag = dense = u = ut = eig = None
    if form == Form.DIAGONAL:
        diag = diagonal if diagonal is not None else np.diagonal(score_matrices, axis1=-2, axis2=-1)
    elif form == Form.DENSE:
        dense = score_matrices
    elif form == Form.FACTORED:
        u, eig = factors
        ut = np.swapaxes(u, -1, -2)
    else:  # every Form has its branch here (COMPILED_FORMS, checked at import)
        raise NotImplementedError(f"engine: head form {form!r} has no arrays")
    as_array = lambda a, empty: empty if a is None else _writable(a)  # noqa: E731
    values_t = None if values is None else np.swapaxes(values, -1, -2)
    return form, HeadArrays(int(form), as_array(diag, empty2), as_array(dense, empty3), as_array(u, empty3),
                            as_array(ut, empty3), as_array(eig, empty2), as_array(values_t, empty3),
                            values is None, H)


def _span_basis(x0, form, head_arrays) -> np.ndarray | None:
    """(B, d, n) orthonormal bases of the spans of the trajectories' initial tokens, where the flow
    stays in them; None elsewhere.

    With every ``M_h = lambda_h I`` and ``V_h = M_h``, each velocity ``dx_i/dt`` is a combination of
    the tokens (the head outputs ``sum_j w_ij lambda_h x_j``, minus the radial part along ``x_i``),
    so a trajectory never leaves the span of its initial tokens. In coordinates ``c_i = Q^T x_i`` on
    an orthonormal basis ``Q`` of that span every inner product, hence every weight, observable and
    norm, is the one in R^d: the flow is integrated on n coordinates instead of d (a 128x smaller
    state at n = 32, d = 4096). The error control then acts on those coordinates.
    """
    B, n, d = x0.shape
    if form != Form.DIAGONAL or not head_arrays.shared or n >= d:
        return None
    diag = head_arrays.diagonal
    if not np.all(diag == diag[..., :1]):  # diagonal, but not a multiple of the identity
        return None
    with loaded_blas().limit(limits=1):  # the same arithmetic whatever the machine's BLAS threads
        return np.stack([np.linalg.qr(x.T)[0] for x in x0])


def _outputs(groups, B, T, H, n, d) -> Outputs:
    """Output arrays of the wanted groups, uninitialised, the others empty: the compiled code writes every
    sample a trajectory reaches, and ``_blank_unreached`` the rest. (Filling them with NaN first cost
    1.2 ms of the 19 ms ``simulate()`` of 64 seeds at n = d = 8, measured.)"""
    arrays = {}
    for group in GROUPS:
        wanted = group.name in groups
        for var in group.variables:
            shape = (B, T) + tuple({"head": H, "token": n, "dim": d}[dim] for dim in var.dims)
            arrays[var.name] = np.empty(shape if wanted else (0,) * len(shape), dtype=var.dtype)
    return Outputs(**arrays)


def _blank_unreached(out: Outputs, reached: np.ndarray) -> None:
    """NaN (-1 for counts) at the samples a trajectory never reached: ``reached`` is (B, T)."""
    if reached.all():
        return
    unreached = ~reached
    for array in out:
        if array.size:
            array[unreached] = np.nan if array.dtype.kind == "f" else -1


def _writable(a) -> np.ndarray:
    """``a`` as a C-contiguous float64 array, writable (a copy where ``a`` is a read-only view).

    numba compiles a separate specialization of the solver for a read-only array (a
    broadcast or a diagonal view, say): one type of array for every call, one compilation.
    """
    a = np.ascontiguousarray(a, dtype=np.float64)
    return a if a.flags.writeable else a.copy()


def _check_batch(x0, score_matrices, diagonal, factors, values, beta, name="x0") -> None:
    """Shapes and values of a batch, each refused in one line naming the argument (the compiled code
    would fail on them without a name, or run on a broadcast it should not)."""
    x0 = np.asarray(x0)
    if x0.ndim != 3:
        raise ValueError(f"{name}: shape {x0.shape}, expected (B, n, d)")
    B, n, d = x0.shape
    lead = f"B = {B} or 1"

    def check(label, a, tail, ndim):
        a = np.asarray(a)
        if a.ndim != ndim or a.shape[0] not in (1, B) or a.shape[2:] != tail[1:] or a.shape[1] != tail[0]:
            want = ", ".join(map(str, tail))
            raise ValueError(f"{label}: shape {a.shape}, expected ({lead}, {want}) for {name} of shape "
                             f"{x0.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{label}: contains non-finite entries")

    given = [a for a in (score_matrices, diagonal, None if factors is None else factors[1]) if a is not None]
    if len(given) != 1:
        raise ValueError("give the score matrices in exactly one form: score_matrices, diagonal or factors")
    H = np.shape(given[0])[1] if np.ndim(given[0]) >= 2 else 0
    if score_matrices is not None:
        check("score_matrices", score_matrices, (H, d, d), 4)
    if diagonal is not None:
        check("diagonal", diagonal, (H, d), 3)
    if factors is not None:
        u, e = factors
        check("factors[1] (e)", e, (H, np.shape(e)[-1] if np.ndim(e) else 0), 3)
        check("factors[0] (U)", u, (H, d, np.shape(e)[-1]), 4)
    if values is not None:
        check("values", values, (H, d, d), 4)
    b = np.asarray(beta, dtype=float)
    if b.ndim > 1 or (b.ndim == 1 and b.size != B) or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"beta: {beta!r}, expected a finite number > 0 or {B} of them (one per trajectory)")


def _per_trajectory(beta, B: int) -> np.ndarray:
    return _writable(np.broadcast_to(np.asarray(beta, dtype=np.float64), (B,)))


def _want(groups) -> np.ndarray:
    return np.array([group.name.lower() in groups for group in Group])


def solve(
    x0: np.ndarray,
    score_matrices: np.ndarray | None = None,
    *,
    diagonal: np.ndarray | None = None,
    attention: str | AttentionType,
    beta: float | np.ndarray,
    spherical: bool,
    t_eval: np.ndarray,
    mask: str | Mask = "none",
    rtol: float,
    atol: float,
    max_steps: int,
    values: np.ndarray | None = None,
    factors: tuple[np.ndarray, np.ndarray] | None = None,
    groups=("cosines",),
    cluster_metric: str = "epsilon",
    cluster_threshold: float = 1e-3,
    cluster_eps: float = 1e-2,
    stop_at_cluster: bool = False,
    fixed_step: float | None = None,
    tableau: ButcherTableau = DOPRI5,
    in_span: bool = True,
    strict: bool = True,
) -> EngineResult:
    """Integrate a batch of trajectories and measure the wanted observable groups at ``t_eval``.

    Parameters
    ----------
    x0 : (B, n, d) initial tokens
    beta : inverse temperature, one for all or (B,) one per trajectory
    The score matrices ``M_h`` in one form (``heads.Form``):
    score_matrices : (B, H, d, d) symmetric score matrices per trajectory (dense), or
    diagonal : (B, H, d), ``M_h = diag(diagonal)``, or
    factors : ``(U, e)``, (B, H, d, r) and (B, H, r), with ``M_h = U diag(e) U^T`` (factored)
    values : (B, H, d, d) value matrices, or None for ``V_h = M_h``
    A leading dimension of 1 instead of B shares the heads among all trajectories.
    groups : observable groups to record (``attnflow.observables``)
    cluster_metric, cluster_threshold : the criterion whose first crossing is ``t_cluster``
    stop_at_cluster : end each trajectory there; its later samples stay NaN
    mask : a name in ``attnflow.attention.MASKS`` (``none``, or ``causal``: token i attends to j <= i)
        or a ``Mask`` declaration
    fixed_step : take steps of this size with no error control (convergence tests)
    in_span : where every head is a multiple of the identity (``M_h = lambda_h I``, values aligned)
        and n < d, integrate in the n-dimensional span of each trajectory's initial tokens, which
        the flow never leaves (``_span_basis``); False: in all d coordinates

    strict : raise ``IntegrationError`` naming the first trajectory that stopped early (step budget,
        step-size underflow); False: return every trajectory, a failed one with ``status`` saying why
        and its samples after ``t_stop`` (where it failed) NaN (-1 for counts)
    """
    flow = flow_of(attention, spherical, mask)
    _check_batch(x0, score_matrices, diagonal, factors, values, beta)
    metric = _metric(cluster_metric)
    if fixed_step is None and not (0.0 < rtol < 1.0 and atol > 0.0):  # fixed steps control no error
        raise ValueError(f"rtol = {rtol!r}, atol = {atol!r}: need 0 < rtol < 1 and atol > 0")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps = {max_steps!r}: need at least 1")
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    B, n, d = x0.shape
    t_eval = np.ascontiguousarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size < 2 or not np.all(np.diff(t_eval) > 0):
        raise ValueError(f"t_eval: needs at least two strictly increasing times, got {t_eval!r}")
    groups = canonical_groups(groups)
    form, head_arrays = _head_arrays(x0, score_matrices, diagonal, factors, values)
    basis = _span_basis(x0, form, head_arrays) if in_span else None
    if basis is not None:  # coordinates in the span, and the same scalar heads on n dimensions
        x0 = np.ascontiguousarray(np.einsum("bnd,bdk->bnk", x0, basis))
        d = n
        head_arrays = head_arrays._replace(diagonal=_writable(head_arrays.diagonal[..., :n]))
    out = _outputs(groups, B, t_eval.size, head_arrays.H, n, d)
    stats = Stats(np.zeros((B, 4), dtype=np.int64), np.zeros((B, 4)))
    control = Control(float(rtol), float(atol), int(max_steps),
                      0.0 if fixed_step is None else float(fixed_step))
    criterion = Criterion(int(metric), float(cluster_threshold), 1.0 - float(cluster_eps),
                          bool(stop_at_cluster))
    with loaded_blas().limit(limits=1):
        run_threads(solve_batch, B, x0, head_arrays, flow, _per_trajectory(beta, B), t_eval, _method(tableau),
                    control, criterion, _sampling(groups), out, stats)
    counts, times = stats
    failed = np.flatnonzero(counts[:, STATUS] != Status.OK)
    if strict and failed.size:
        b = int(failed[0])
        raise IntegrationError(f"trajectory {b}: {failure_reason(counts[b, STATUS], max_steps)} at "
                               f"t = {times[b, T_STOP]:.6g} of {t_eval[-1]:g}")
    # A stop at the clustering criterion, or where a trajectory failed.
    _blank_unreached(out, t_eval[None, :] <= times[:, T_STOP, None])
    recorded = {var.name: getattr(out, var.name) for var in variables(groups)}
    label = form.label
    if basis is not None:
        label += f" in the span of the initial tokens ({n} of {basis.shape[1]} dimensions)"
        if "x" in recorded:  # positions back in the d coordinates: x_i = sum_k c_ik q_k
            recorded["x"] = np.einsum("btnk,bdk->btnd", recorded["x"], basis)
    return EngineResult(recorded, counts[:, STEPS].copy(), counts[:, REJECTED].copy(),
                        counts[:, CALLS].copy(), times[:, T_CLUSTER].copy(), times[:, DRIFT].copy(),
                        times[:, RETRACTION].copy(), times[:, T_STOP].copy(), label,
                        counts[:, STATUS].astype(np.int8))


def observe(
    x: np.ndarray,
    score_matrices: np.ndarray | None = None,
    *,
    diagonal: np.ndarray | None = None,
    attention: str | AttentionType,
    beta: float,
    spherical: bool = True,
    mask: str | Mask = "none",
    values: np.ndarray | None = None,
    factors=None,
    groups=("cosines", "velocity", "energy", "radial", "entropy"),
    cluster_eps: float = 1e-2,
) -> dict[str, np.ndarray]:
    """The variables of ``groups`` at configurations ``x`` (B, n, d), score matrices as in ``solve``,
    without integrating.

    Returns name -> array of shape (B, ...) for every variable of ``groups``.
    """
    flow = flow_of(attention, spherical, mask)
    _check_batch(x, score_matrices, diagonal, factors, values, beta, name="x")
    x = np.ascontiguousarray(x, dtype=np.float64)
    B, n, d = x.shape
    groups = canonical_groups(groups)
    _, head_arrays = _head_arrays(x, score_matrices, diagonal, factors, values)
    out = _outputs(groups, B, 1, head_arrays.H, n, d)
    drift = np.zeros(B)
    with loaded_blas().limit(limits=1):
        run_threads(observe_batch, B, x, head_arrays, flow, _per_trajectory(beta, B), _sampling(groups),
                      1.0 - float(cluster_eps), out, drift)
    return {var.name: getattr(out, var.name)[:, 0] for var in variables(groups)}


def compilations() -> int:
    """How many times this process compiled the engine's entry points (numba's cache missed): a
    job's log says so, since the first job on a machine spends 25-50 s there (``plan.COMPILE_SECONDS``)."""
    return sum(sum(f.stats.cache_misses.values()) for f in (solve_batch, observe_batch))
