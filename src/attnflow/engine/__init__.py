"""The compiled engine: batched, adaptive integration of the attention flow with exact observables.

``solve`` prepares the score matrices in the form that is cheapest to apply
(``heads.Form``), allocates the variables of the wanted observable groups, and
runs the compiled loop (``dopri.solve_batch``) on the cores (``threads``), with
single-threaded BLAS. ``observe`` measures the same variables at given
configurations, without integrating.
"""

from __future__ import annotations

import numpy as np

from ..attention import ATTENTIONS, MASKS, AttentionType, Mask
from ..contract import (
    DEFAULT_EVENT,
    ClusterEvent,
    Controller,
    EngineResult,
    Heads,
    IntegrationError,
    Problem,
    SaveAt,
    TrajectoryStatus,
    check_attention,
    check_batch,
    check_engine,
    check_geometry,
    check_mask,
    failure_reason,
    head_form,  # noqa: F401  (re-exported: attnflow.engine.head_form)
    raise_first_failure,
)
from ..geometry import GEOMETRIES, Geometry
from ..heads import Form
from ..numerics import NUMERICS_VERSION  # noqa: F401  (re-exported: attnflow.engine.NUMERICS_VERSION)
from ..observables import GROUPS, canonical_groups, variables
from ..tableau import DOPRI5, ButcherTableau
from .cosines import COMPILED_METRICS, Metric
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
from .energy import COMPILED_ENERGIES
from .entropy import COMPILED_ENTROPIES
from .field import COMPILED_FORMS, COMPILED_MASKS, COMPILED_MOTIONS, COMPILED_WEIGHTS, Flow, HeadArrays
from .machinery import loaded_blas, run_threads
from .measure import Group, Outputs

__all__ = ["KERNELS", "EngineResult", "IntegrationError", "Status", "check_declarations", "compilations",
           "failure_reason", "observe", "solve"]


def _diagonal_arrays(heads: Heads) -> dict:
    return {"diagonal": heads.diagonal}


def _dense_arrays(heads: Heads) -> dict:
    return {"dense": heads.score_matrices}


def _factored_arrays(heads: Heads) -> dict:
    u, eig = heads.factors
    return {"u": u, "ut": np.swapaxes(u, -1, -2), "eig": eig}


# The compiled engine's part of each declaration (``attnflow.contract``), one entry per declared value: the
# code its compiled dispatch branches on (those branches have no default), or, for a head form, the
# ``HeadArrays`` it fills.
METRICS = {"epsilon": Metric.EPSILON, "gamma_mean": Metric.GAMMA_MEAN}
KERNELS = {
    "weight rule": {rule: int(rule) for rule in COMPILED_WEIGHTS},
    "energy rule": {rule: int(rule) for rule in COMPILED_ENERGIES},
    "entropy rule": {rule: int(rule) for rule in COMPILED_ENTROPIES},
    "mask rule": {rule: int(rule) for rule in COMPILED_MASKS},
    "motion rule": {rule: int(rule) for rule in COMPILED_MOTIONS},
    "head form": {Form.DIAGONAL: _diagonal_arrays, Form.DENSE: _dense_arrays,
                  Form.FACTORED: _factored_arrays},
    "clustering metric": METRICS,
    "observable group": {group.name.lower(): group for group in Group},
}


def check_declarations() -> None:
    """Refuse, by name, a declaration without its compiled part (``contract.check_engine``), and a head form
    or metric code the compiled loop has no branch for, or trajectory codes other than the contract's."""
    check_engine("numba", KERNELS)
    for kind, codes, compiled in (("head form", KERNELS["head form"], COMPILED_FORMS),
                                  ("clustering metric", METRICS.values(), COMPILED_METRICS)):
        missing = [code.name for code in codes if code not in compiled]
        if missing:
            raise NotImplementedError(f"engine 'numba': {kind} {missing} has no compiled branch")
    if {s.name: int(s) for s in Status} != {s.name: int(s) for s in TrajectoryStatus}:
        raise NotImplementedError(f"engine.dopri.Status {list(Status)} is not contract.TrajectoryStatus "
                                  f"{list(TrajectoryStatus)}")


check_declarations()  # at import: every declaration has its compiled part


def flow_of(attention: str | AttentionType, geometry: str | Geometry = "sphere", mask: str | Mask = "none",
            ngpt_alpha: float = 1.0) -> Flow:
    """The compiled flow record of an attention type, a geometry and a mask (each a name or a
    declaration); ``ngpt_alpha`` is read by ``ngpt`` alone."""
    kind = attention if isinstance(attention, AttentionType) else ATTENTIONS.get(attention)
    check_attention("numba", KERNELS, kind)
    masking = mask if isinstance(mask, Mask) else MASKS.get(mask)
    check_mask("numba", KERNELS, masking)
    shape = geometry if isinstance(geometry, Geometry) else GEOMETRIES.get(geometry)
    check_geometry("numba", KERNELS, shape)
    return Flow(KERNELS["weight rule"][kind.weights], bool(kind.normalised), bool(kind.velocity_over_n),
                KERNELS["energy rule"][kind.energy], KERNELS["entropy rule"][kind.entropy],
                KERNELS["mask rule"][masking.rule], KERNELS["motion rule"][shape.motion], bool(shape.radii),
                bool(shape.on_sphere), float(ngpt_alpha))


def _sampling(groups) -> Sampling:
    """What the samples record, and what that needs (from the groups' declarations)."""
    declared = [GROUPS.get(g) for g in groups]
    return Sampling(_want(groups), any(g.needs_velocity for g in declared),
                    any(g.needs_scores for g in declared))


def _method(tableau: ButcherTableau) -> Method:
    return Method(tableau.a, tableau.b, tableau.e, tableau.dense, int(tableau.error_order),
                  bool(tableau.fsal))


def _head_arrays(x0, heads: Heads):
    """The batch's ``HeadArrays``: form, diagonal, dense, U, U^T, e, V^T, shared (unused arrays empty), H.

    Each array has one row per trajectory, or a single row all trajectories share.
    """
    B, d = 1, x0.shape[2]  # the unused arrays: one empty row
    H = heads.given.shape[1]  # of the batch's shapes: check_batch said so before
    form, heads = heads.in_form(d)
    arrays = KERNELS["head form"][form](heads)
    empty2, empty3 = np.empty((B, 0, 0)), np.empty((B, 0, 0, 0))
    as_array = lambda name, empty: _writable(arrays[name]) if name in arrays else empty  # noqa: E731
    values_t = empty3 if heads.values is None else _writable(np.swapaxes(heads.values, -1, -2))
    return form, HeadArrays(int(form), as_array("diagonal", empty2), as_array("dense", empty3),
                            as_array("u", empty3), as_array("ut", empty3), as_array("eig", empty2), values_t,
                            heads.values is None, H)


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
    sample a trajectory reaches, and ``_blank_unreached`` the rest (filling them with NaN first is a
    measurable share of a small cell: docs/performance.md)."""
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


def _per_trajectory(beta, B: int) -> np.ndarray:
    return _writable(np.broadcast_to(np.asarray(beta, dtype=np.float64), (B,)))


def _want(groups) -> np.ndarray:
    """Per ``Group`` flag, in the compiled code's order: whether the group is recorded."""
    wanted = {KERNELS["observable group"][name] for name in groups}
    return np.array([group in wanted for group in Group])


def solve(problem: Problem, controller: Controller, saveat: SaveAt, event: ClusterEvent = DEFAULT_EVENT, *,
          tableau: ButcherTableau = DOPRI5, in_span: bool = True, strict: bool = True) -> EngineResult:
    """Integrate a batch of trajectories (``problem``) under ``controller`` and measure ``saveat``'s
    observable groups at its times; ``t_cluster`` is ``event``'s first crossing (``attnflow.contract``).

    tableau : the embedded Runge-Kutta pair (``attnflow.tableau``)
    in_span : where every head is a multiple of the identity (``M_h = lambda_h I``, values aligned)
        and n < d, integrate in the n-dimensional span of each trajectory's initial tokens, which
        the flow never leaves (``_span_basis``); False: in all d coordinates
    strict : raise ``IntegrationError`` naming the first trajectory that stopped early (step budget,
        step-size underflow); False: return every trajectory, a failed one with ``status`` saying why
        and its samples after ``t_stop`` (where it failed) NaN (-1 for counts)
    """
    flow = flow_of(problem.attention, problem.geometry, problem.mask, problem.ngpt_alpha)
    x0 = np.ascontiguousarray(problem.x0, dtype=np.float64)
    B, n, d = x0.shape
    t_eval, groups = saveat.times, saveat.groups
    form, head_arrays = _head_arrays(x0, problem.heads)
    basis = _span_basis(x0, form, head_arrays) if in_span else None
    if basis is not None:  # coordinates in the span, and the same scalar heads on n dimensions
        x0 = np.ascontiguousarray(np.einsum("bnd,bdk->bnk", x0, basis))
        d = n
        head_arrays = head_arrays._replace(diagonal=_writable(head_arrays.diagonal[..., :n]))
    out = _outputs(groups, B, t_eval.size, head_arrays.H, n, d)
    stats = Stats(np.zeros((B, 4), dtype=np.int64), np.zeros((B, 4)))
    fixed_step = controller.fixed_step
    control = Control(float(controller.rtol), float(controller.atol), controller.max_steps,
                      0.0 if fixed_step is None else float(fixed_step),
                      np.inf if controller.max_step is None else float(controller.max_step))
    criterion = Criterion(int(METRICS[event.metric.name]), float(event.threshold), saveat.level,
                          bool(event.stop), flow.radii)
    with loaded_blas().limit(limits=1):
        run_threads(solve_batch, B, x0, head_arrays, flow, _per_trajectory(problem.beta, B), t_eval,
                    _method(tableau), control, criterion, _sampling(groups), out, stats)
    counts, times = stats
    if strict:
        raise_first_failure(counts[:, STATUS], times[:, T_STOP], t_eval[-1], controller.max_steps)
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
    geometry: str | Geometry = "sphere",
    mask: str | Mask = "none",
    ngpt_alpha: float = 1.0,
    values: np.ndarray | None = None,
    factors=None,
    groups=("cosines", "velocity", "energy", "radial", "entropy"),
    cluster_eps: float = 1e-2,
) -> dict[str, np.ndarray]:
    """The variables of ``groups`` at configurations ``x`` (B, n, d), score matrices as in
    ``contract.Heads``, without integrating. Where the geometry carries radii the rows of ``x`` are
    ``r_k theta_k`` (the observables read the directions, the ``radius`` group the r_k).

    Returns name -> array of shape (B, ...) for every variable of ``groups``.
    """
    flow = flow_of(attention, geometry, mask, ngpt_alpha)
    heads = Heads(score_matrices, diagonal, factors, values)
    check_batch(x, heads, beta, name="x")
    x = np.ascontiguousarray(x, dtype=np.float64)
    B, n, d = x.shape
    groups = canonical_groups(groups)
    _, head_arrays = _head_arrays(x, heads)
    out = _outputs(groups, B, 1, head_arrays.H, n, d)
    drift = np.zeros(B)
    with loaded_blas().limit(limits=1):
        run_threads(observe_batch, B, x, head_arrays, flow, _per_trajectory(beta, B), _sampling(groups),
                      1.0 - float(cluster_eps), out, drift)
    if out.energy_rate_min.size:  # one configuration, no steps: the least rate is the rate
        out.energy_rate_min[...] = out.energy_rate
    return {var.name: getattr(out, var.name)[:, 0] for var in variables(groups)}


def compilations() -> int:
    """How many times this process compiled the engine's entry points (numba's cache missed): a
    job's log says so, since the first job on a machine spends 25-50 s there (``plan.COMPILE_SECONDS``)."""
    return sum(sum(f.stats.cache_misses.values()) for f in (solve_batch, observe_batch))
