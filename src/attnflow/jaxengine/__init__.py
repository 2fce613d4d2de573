"""The JAX engine: the contract of ``attnflow.engine.solve`` on diffrax, for accelerators.

``solve`` takes the same arguments and returns the same ``EngineResult`` as the
numba engine. Each trajectory is integrated by diffrax's Dopri5 under a PID
controller (an integral controller with the numba engine's safety factor,
bounds and error norm, the RMS of the error over ``atol + rtol max(|y0|,
|y1|)``, at the cell's tolerances times ``integrate.ERROR_SCALE``, so that it
takes the numba engine's steps), retracted onto the sphere after every
accepted step; the samples at ``t_eval`` come from the dense output, scaled
back onto the sphere, and every observable is computed from those positions
(``measure.py``). The clustering stop is a diffrax ``Event``. Trajectories are
batched with ``jax.vmap``, in float64 (x64 is switched on for this engine's
calls only).

jax, diffrax and equinox are an optional dependency (``pip install
'attnflow[jax]'``): ``attnflow`` imports and runs without them, and
``available()`` says whether this engine can run.

Differences from the numba engine, all within the integration's tolerance:
``stop_at_cluster`` ends a trajectory at ``t_cluster`` itself (the numba engine
at the end of that step, measuring the samples of that step past
``t_cluster``); without the stop, ``t_cluster`` is located by integrating
again from the last sample before the first sample where the criterion
holds, so a crossing that comes and goes between two samples is not seen;
``max_retraction`` is the largest ``| ||x_i|| - 1 |`` removed at the samples;
the integration always runs in all d coordinates (``in_span`` is accepted and
has no effect: the span is the numba engine's saving, not another flow).
"""

from __future__ import annotations

import importlib.util

import numpy as np

from ..attention import ATTENTIONS, MASKS, AttentionType, Energy, Entropy, Mask, MaskRule, Weights
from ..heads import Form
from ..observables import GROUPS, canonical_groups, variables
from ..tableau import DOPRI5, ButcherTableau

__all__ = ["available", "check_declarations", "gpu_visible", "solve"]

_REQUIRED = ("jax", "diffrax", "equinox", "optimistix")


def _missing() -> list[str]:
    missing = []
    for name in _REQUIRED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ValueError:  # a module set to None in sys.modules: blocked
            found = False
        if not found:
            missing.append(name)
    return missing


def available() -> bool:
    """Whether jax, diffrax and equinox are installed (without importing them)."""
    return not _missing()


def _require() -> None:
    missing = _missing()
    if missing:
        raise ImportError(f"engine 'jax' needs {', '.join(missing)}: pip install 'attnflow[jax]'")


def gpu_visible() -> bool:
    """Whether jax is installed and sees a GPU (False without jax)."""
    if not available():
        return False
    import jax

    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:  # no GPU backend
        return False


def check_declarations() -> None:
    """Refuse, by name, any declared attention rule, mask rule, head form, clustering metric or
    observable group without its kernel here (the kernels' tables have no default entry)."""
    from ..engine import METRICS
    from .field import KEPT, ROWS, WEIGHTS
    from .measure import ENERGIES, ENTROPIES, GROUP_KERNELS, METRIC_GAPS

    for table, members, what in ((WEIGHTS, list(Weights), "weight rule"), (KEPT, list(MaskRule), "mask rule"),
                                 (ROWS, list(Form), "head form"), (ENERGIES, list(Energy), "energy rule"),
                                 (ENTROPIES, list(Entropy), "entropy rule"),
                                 (METRIC_GAPS, list(METRICS.values()), "clustering metric"),
                                 (GROUP_KERNELS, list(GROUPS.names()), "observable group")):
        missing = [m for m in members if m not in table]
        if missing:
            raise NotImplementedError(f"attnflow.jaxengine has no {what} kernel for {missing}")
    for kind in ATTENTIONS:
        for rule, table in ((kind.weights, WEIGHTS), (kind.energy, ENERGIES), (kind.entropy, ENTROPIES)):
            if rule not in table:
                raise NotImplementedError(f"attention {kind.name!r}: {rule!r} has no kernel in "
                                          "attnflow.jaxengine")
    for mask in MASKS:
        if mask.rule not in KEPT:
            raise NotImplementedError(f"mask {mask.name!r}: {mask.rule!r} has no kernel in "
                                      "attnflow.jaxengine")


def _x64():
    """float64 for this engine's calls only, leaving jax's global setting alone."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # jax before 0.6

    return enable_x64()


def _head_arrays(score_matrices, diagonal, factors, values, d):
    """(form, Heads of numpy arrays with a leading axis of B or 1) in the numba engine's choice of form."""
    from ..engine import head_form
    from .field import Heads

    form = head_form(score_matrices, diagonal, factors, d)
    if factors is not None and form != Form.FACTORED:  # rank too high to pay: dense products
        u, e = factors
        score_matrices, factors = np.einsum("bhdr,bhr,bher->bhde", u, e, u), None
    as_float = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    if form == Form.DIAGONAL:
        diag = diagonal if diagonal is not None else np.diagonal(score_matrices, axis1=-2, axis2=-1)
        heads = Heads(as_float(diag), None, None, None, as_float(values))
    elif form == Form.DENSE:
        heads = Heads(None, as_float(score_matrices), None, None, as_float(values))
    elif form == Form.FACTORED:
        heads = Heads(None, None, as_float(factors[0]), as_float(factors[1]), as_float(values))
    else:
        raise NotImplementedError(f"attnflow.jaxengine: head form {form!r} has no arrays")
    return form, heads


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
):
    """``attnflow.engine.solve`` on diffrax: the same arguments, the same ``EngineResult`` (module
    docstring for the differences). ``strict``: raises ``IntegrationError`` naming the first trajectory
    that stopped early; else each trajectory comes back with its ``status`` (``engine.Status``), its
    samples after the failure NaN."""
    _require()
    from ..engine import EngineResult, IntegrationError, Status, _check_batch, _metric
    from .integrate import Rules, Tolerances, batch_solver

    kind = attention if isinstance(attention, AttentionType) else ATTENTIONS.get(attention)
    masking = mask if isinstance(mask, Mask) else MASKS.get(mask)
    check_declarations()
    _check_batch(x0, score_matrices, diagonal, factors, values, beta)
    metric = _metric(cluster_metric)
    if tableau is not DOPRI5:
        raise NotImplementedError(f"engine 'jax': tableau {tableau!r} (only DOPRI5, diffrax's Dopri5)")
    if fixed_step is None and not (0.0 < rtol < 1.0 and atol > 0.0):
        raise ValueError(f"rtol = {rtol!r}, atol = {atol!r}: need 0 < rtol < 1 and atol > 0")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps = {max_steps!r}: need at least 1")
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    B, n, d = x0.shape
    t_eval = np.ascontiguousarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size < 2 or not np.all(np.diff(t_eval) > 0):
        raise ValueError(f"t_eval: needs at least two strictly increasing times, got {t_eval!r}")
    groups = canonical_groups(groups)
    form, heads = _head_arrays(score_matrices, diagonal, factors, values, d)
    declared = [GROUPS.get(g) for g in groups]
    rules = Rules(form, kind.weights, masking.rule, bool(kind.normalised), bool(kind.velocity_over_n),
                  bool(spherical), kind.energy, kind.entropy, groups,
                  any(g.needs_velocity or g.needs_scores for g in declared), metric, bool(stop_at_cluster),
                  int(max_steps), None if fixed_step is None else float(fixed_step),
                  tuple(None if a is None or a.shape[0] == 1 else 0 for a in heads))
    # shared arrays (a leading axis of 1) enter every trajectory whole
    heads = type(heads)(*(a if a is None or a.shape[0] != 1 else a[0] for a in heads))
    beta = np.broadcast_to(np.asarray(beta, dtype=np.float64), (B,)).copy()
    with _x64():
        tolerances = Tolerances(*(np.float64(v) for v in (rtol, atol, cluster_threshold, 1.0 - cluster_eps)))
        recorded, reached, stats = batch_solver(rules)(x0, heads, beta, t_eval, tolerances)
        if recorded["gamma_mean"].dtype != np.float64:  # never silently in float32
            raise RuntimeError(f"engine 'jax': computed in {recorded['gamma_mean'].dtype}, not float64")
        recorded = {name: np.asarray(value) for name, value in recorded.items()}
        reached = np.asarray(reached)
        stats = {name: np.asarray(value) for name, value in stats.items()}
    failed = np.flatnonzero(~stats["ok"])
    status = np.where(stats["ok"], Status.OK, np.where(stats["budget"], Status.BUDGET, Status.UNDERFLOW))
    if failed.size and not strict:  # a failed trajectory's samples after it stopped were never reached
        reached = reached & (np.asarray(t_eval)[None, :] <= np.asarray(stats["t_stop"])[:, None])
    if failed.size and strict:
        b = int(failed[0])
        why = (f"step budget of {max_steps} exhausted" if stats["budget"][b]
               else "diffrax stopped early (non-finite or stiff)")
        raise IntegrationError(f"trajectory {b}: {why} at t = {stats['t_stop'][b]:.6g} of {t_eval[-1]:g}")
    out = {}
    for var in variables(groups):
        value = np.array(recorded[var.name], dtype=var.dtype)
        value[~reached] = np.nan if value.dtype.kind == "f" else -1  # after a stop at the criterion
        out[var.name] = value
    return EngineResult(out, stats["n_steps"].astype(np.int64), stats["n_rejected"].astype(np.int64),
                        stats["n_rhs_calls"].astype(np.int64), stats["t_cluster"], stats["norm_drift"],
                        stats["max_retraction"], stats["t_stop"], form.label, status.astype(np.int8))
