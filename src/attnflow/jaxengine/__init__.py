"""The JAX engine: the contract of ``attnflow.contract`` on diffrax, for accelerators.

``solve`` takes the same options and returns the same ``EngineResult`` as the
numba engine. Each trajectory is integrated by diffrax's Dopri5 under a PID
controller (an integral controller with the numba engine's safety factor,
bounds and error norm, the RMS of the error over ``atol + rtol max(|y0|,
|y1|)``, at the cell's tolerances times ``integrate.ERROR_SCALE``, so that it
takes the numba engine's steps), retracted onto the sphere after every
accepted step; the samples at ``t_eval`` come from the dense output, scaled
back onto the sphere, and every observable is computed from those positions
(``measure.py``; from their directions where the geometry carries radii). The
clustering stop is a diffrax ``Event``. Trajectories are
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

from ..contract import (
    DEFAULT_EVENT,
    ClusterEvent,
    Controller,
    EngineResult,
    Heads,
    Problem,
    SaveAt,
    TrajectoryStatus,
    check_attention,
    check_engine,
    check_geometry,
    check_mask,
    raise_first_failure,
)
from ..heads import Form
from ..observables import GROUPS, variables
from ..tableau import DOPRI5, ButcherTableau

__all__ = ["available", "check_declarations", "gpu_visible", "kernels", "solve"]

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


def kernels() -> dict:
    """This engine's table for each kind of declaration (``jaxengine.tables``); needs jax."""
    from .tables import KERNELS

    return KERNELS


def check_declarations() -> None:
    """Refuse, by name, any declaration without its kernel here (``contract.check_engine``; the kernels'
    tables have no default entry), as the first import of ``jaxengine.tables`` does."""
    check_engine("jax", kernels())


def _x64():
    """float64 for this engine's calls only, leaving jax's global setting alone."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # jax before 0.6

    return enable_x64()


def _diagonal_heads(heads: Heads, as_float):
    from .field import TrajectoryHeads

    return TrajectoryHeads(as_float(heads.diagonal), None, None, None, as_float(heads.values))


def _dense_heads(heads: Heads, as_float):
    from .field import TrajectoryHeads

    return TrajectoryHeads(None, as_float(heads.score_matrices), None, None, as_float(heads.values))


def _factored_heads(heads: Heads, as_float):
    from .field import TrajectoryHeads

    u, e = heads.factors
    return TrajectoryHeads(None, None, as_float(u), as_float(e), as_float(heads.values))


# Each head form's arrays (one entry per ``heads.Form``, no default: tests/test_contract.py).
HEAD_ARRAYS = {Form.DIAGONAL: _diagonal_heads, Form.DENSE: _dense_heads, Form.FACTORED: _factored_heads}


def _head_arrays(heads: Heads, d: int):
    """(form, TrajectoryHeads of numpy arrays with a leading axis of B or 1) in the form the numba engine
    applies too (``contract.head_form``)."""
    form, heads = heads.in_form(d)
    as_float = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    return form, HEAD_ARRAYS[form](heads, as_float)


def solve(problem: Problem, controller: Controller, saveat: SaveAt, event: ClusterEvent = DEFAULT_EVENT, *,
          tableau: ButcherTableau = DOPRI5, in_span: bool = True, strict: bool = True) -> EngineResult:
    """``attnflow.engine.solve`` on diffrax: the same options (``attnflow.contract``), the same
    ``EngineResult`` (module docstring for the differences). ``strict``: raises ``IntegrationError``
    naming the first trajectory that stopped early; else each trajectory comes back with its ``status``
    (``contract.TrajectoryStatus``), its samples after the failure NaN."""
    _require()
    from .integrate import Rules, Tolerances, batch_solver

    if tableau is not DOPRI5:
        raise NotImplementedError(f"engine 'jax': tableau {tableau!r} (only DOPRI5, diffrax's Dopri5)")
    kind, masking = problem.attention, problem.mask
    check_attention("jax", kernels(), kind)
    check_mask("jax", kernels(), masking)
    geometry = problem.geometry
    check_geometry("jax", kernels(), geometry)
    x0 = np.ascontiguousarray(problem.x0, dtype=np.float64)
    B, n, d = x0.shape
    t_eval, groups = saveat.times, saveat.groups
    form, heads = _head_arrays(problem.heads, d)
    declared = [GROUPS.get(g) for g in groups]
    fixed_step = controller.fixed_step
    rules = Rules(form, kind.weights, masking.rule, bool(kind.normalised), bool(kind.velocity_over_n),
                  geometry.motion, bool(geometry.radii), bool(geometry.on_sphere),
                  float(problem.ngpt_alpha),
                  kind.energy, kind.entropy, groups,
                  any(g.needs_velocity or g.needs_scores for g in declared), event.metric.name,
                  bool(event.stop), controller.max_steps, None if fixed_step is None else float(fixed_step),
                  None if controller.max_step is None else float(controller.max_step),
                  tuple(None if a is None or a.shape[0] == 1 else 0 for a in heads))
    # shared arrays (a leading axis of 1) enter every trajectory whole
    heads = type(heads)(*(a if a is None or a.shape[0] != 1 else a[0] for a in heads))
    beta = np.broadcast_to(np.asarray(problem.beta, dtype=np.float64), (B,)).copy()
    with _x64():
        tolerances = Tolerances(*(np.float64(v) for v in (controller.rtol, controller.atol, event.threshold,
                                                          saveat.level)))
        recorded, reached, stats = batch_solver(rules)(x0, heads, beta, t_eval, tolerances)
        if recorded["gamma_mean"].dtype != np.float64:  # never silently in float32
            raise RuntimeError(f"engine 'jax': computed in {recorded['gamma_mean'].dtype}, not float64")
        recorded = {name: np.asarray(value) for name, value in recorded.items()}
        reached = np.asarray(reached)
        stats = {name: np.asarray(value) for name, value in stats.items()}
    status = np.where(stats["ok"], TrajectoryStatus.OK,
                      np.where(stats["budget"], TrajectoryStatus.BUDGET, TrajectoryStatus.UNDERFLOW))
    if strict:
        raise_first_failure(status, stats["t_stop"], t_eval[-1], controller.max_steps)
    # a failed trajectory's samples after it stopped were never reached
    reached = reached & (t_eval[None, :] <= np.asarray(stats["t_stop"])[:, None])
    out = {}
    for var in variables(groups):
        value = np.array(recorded[var.name], dtype=var.dtype)
        value[~reached] = np.nan if value.dtype.kind == "f" else -1  # after a stop at the criterion
        out[var.name] = value
    return EngineResult(out, stats["n_steps"].astype(np.int64), stats["n_rejected"].astype(np.int64),
                        stats["n_rhs_calls"].astype(np.int64), stats["t_cluster"], stats["norm_drift"],
                        stats["max_retraction"], stats["t_stop"], form.label, status.astype(np.int8))
