"""Batched Dormand-Prince 5(4) integrator with per-trajectory error control.

All trajectories advance together, each with its own step size and its own
accept/reject decision, so one trajectory's stiffness never shrinks another's
steps. Output comes from the method's quartic dense output (Shampine 1986) at
the requested sample times. Tableau and dense-output coefficients: Dormand &
Prince (1980), as in scipy's ``RK45``, whose step-size controller this mirrors
so the two take comparable steps at the same tolerance.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .kernels import dense_state, error_norm, normalise_rows_inplace, stage_state

_A = np.array([
    [0, 0, 0, 0, 0, 0],
    [1 / 5, 0, 0, 0, 0, 0],
    [3 / 40, 9 / 40, 0, 0, 0, 0],
    [44 / 45, -56 / 15, 32 / 9, 0, 0, 0],
    [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0, 0],
    [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0],
])
_B = np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84])
_E = np.array([-71 / 57600, 0.0, 71 / 16695, -71 / 1920, 17253 / 339200, -22 / 525, 1 / 40])
_P = np.array(
    [
        [1, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432],
        [0, 0, 0, 0],
        [0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799],
        [0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072],
        [0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632],
        [0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844],
        [0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
    ]
)
_ORDER = 4  # of the error estimator
_SAFETY, _MIN_FACTOR, _MAX_FACTOR = 0.9, 0.2, 10.0


class IntegrationError(RuntimeError):
    """The integrator could not reach the end of the interval."""


@dataclasses.dataclass
class SolverStats:
    n_steps: np.ndarray  # accepted steps per trajectory
    n_rejected: np.ndarray  # rejected steps per trajectory
    n_rhs_calls: int  # batched right-hand-side evaluations
    max_retraction: float  # largest |‖x‖ - 1| removed by a retraction


class BatchedField:
    """A vector field over a batch; ``restrict`` narrows it to a subset of trajectories.

    Subclasses implement ``__call__(y)`` for the current subset. The default
    keeps no per-trajectory state.
    """

    def __call__(self, y: np.ndarray) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def restrict(self, indices: np.ndarray) -> None:
        """Subsequent calls see only trajectories ``indices`` of the current subset."""


def _rms(a: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(a.reshape(a.shape[0], -1) ** 2, axis=1))


def _bcast(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape(v.shape + (1,) * (ndim - 1))


def _initial_step(field, y0, f0, t_span, rtol, atol):
    """Hairer, Norsett & Wanner, Solving ODEs I, Sec. II.4, per trajectory (as scipy)."""
    scale = atol + np.abs(y0) * rtol
    d0, d1 = _rms(y0 / scale), _rms(f0 / scale)
    h0 = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
    h0 = np.minimum(h0, t_span)
    y1 = y0 + _bcast(h0, y0.ndim) * f0
    d2 = _rms((field(y1) - f0) / scale) / h0
    small = (d1 <= 1e-15) & (d2 <= 1e-15)
    h1 = np.where(
        small,
        np.maximum(1e-6, h0 * 1e-3),
        (0.01 / np.maximum(np.maximum(d1, d2), 1e-300)) ** (1.0 / (_ORDER + 1)),
    )
    return np.minimum(np.minimum(100 * h0, h1), t_span)


def integrate(
    field: BatchedField,
    y0: np.ndarray,
    t_eval: np.ndarray,
    *,
    rtol: float,
    atol: float,
    max_steps: int,
    unit_rows: bool = False,
    fixed_step: float | None = None,
) -> tuple[np.ndarray, SolverStats]:
    """Integrate ``dy/dt = field(y)`` for a batch of trajectories.

    Parameters
    ----------
    field : BatchedField
        Autonomous vector field, evaluated on arrays of shape ``(b, ...)``.
    y0 : ndarray, shape (B, ...)
        Initial states at ``t_eval[0]``.
    t_eval : ndarray, shape (T,)
        Increasing sample times; the first is the initial time.
    unit_rows : bool
        Keep every row (last axis) on the unit sphere: accepted steps and
        dense-output samples are retracted by normalising each row.
    fixed_step : float, optional
        Take steps of this size with no error control (for convergence-order
        tests); the last step is shortened to land on ``t_eval[-1]``.

    Returns
    -------
    ys : ndarray, shape (B, T, ...)
    stats : SolverStats
    """
    t_eval = np.asarray(t_eval, dtype=float)
    n_batch, shape = y0.shape[0], y0.shape[1:]
    t0, t_end = float(t_eval[0]), float(t_eval[-1])
    ys = np.empty((n_batch, t_eval.size) + shape)
    ys[:, 0] = y0
    n_steps = np.zeros(n_batch, dtype=np.int64)
    n_rejected = np.zeros(n_batch, dtype=np.int64)
    max_retraction = 0.0
    n_calls = 0

    def call(y):
        nonlocal n_calls
        n_calls += 1
        return field(y)

    active = np.arange(n_batch)  # global ids of the trajectories still running
    y = y0.copy()
    t = np.full(n_batch, t0)
    f = call(y)
    if fixed_step is None:
        h = _initial_step(call, y, f, t_end - t0, rtol, atol)
    else:
        h = np.full(n_batch, float(fixed_step))
    next_sample = np.ones(n_batch, dtype=np.int64)
    last_rejected = np.zeros(n_batch, dtype=bool)
    stages = np.empty((7,) + y.shape)
    work = np.empty_like(y)
    exponent = -1.0 / (_ORDER + 1)

    while active.size:
        remaining = t_end - t
        # Never leave a sliver of the interval that would need a round-off-sized step.
        h = np.where(remaining - h < 100 * np.finfo(float).eps * max(abs(t_end), 1.0), remaining, h)
        stages[0] = f
        for s in range(1, 6):
            stages[s] = call(stage_state(y, h, stages[:s], _A[s, :s], work))
        y_new = stage_state(y, h, stages[:6], _B, np.empty_like(y))
        stages[6] = call(y_new)
        err_norm = error_norm(y, y_new, h, stages, _E, rtol, atol)
        accepted = err_norm < 1.0  # False for NaN, so a blow-up is retried smaller
        if fixed_step is not None:
            accepted = np.ones_like(accepted)
            err_norm = np.full_like(err_norm, _SAFETY ** (_ORDER + 1))  # factor 1

        with np.errstate(divide="ignore", invalid="ignore"):
            factor = _SAFETY * err_norm**exponent
        factor = np.where(err_norm == 0.0, _MAX_FACTOR, factor)
        factor = np.where(
            accepted,
            np.minimum(np.where(last_rejected, 1.0, _MAX_FACTOR), factor),
            np.clip(np.nan_to_num(factor, nan=_MIN_FACTOR), _MIN_FACTOR, 1.0),
        )
        n_steps[active] += accepted
        n_rejected[active] += ~accepted

        acc = np.flatnonzero(accepted)
        if acc.size:
            every = acc.size == accepted.size  # common case: plain slices, no gathers
            sel = slice(None) if every else acc
            # A step clipped to the end lands on t_end exactly, not t + h rounded.
            t_new = np.where(h[sel] == t_end - t[sel], t_end, t[sel] + h[sel])
            gids = active[sel]
            while True:
                idx = np.minimum(next_sample[gids], t_eval.size - 1)
                due = (next_sample[gids] < t_eval.size) & (t_eval[idx] <= t_new)
                if not due.any():
                    break
                rows = np.flatnonzero(due)
                local = rows if every else acc[rows]
                sigma = (t_eval[idx[rows]] - t[local]) / h[local]
                dense = dense_state(y, h, stages, local, sigma, _P, unit_rows)
                ys[gids[rows], idx[rows]] = dense
                next_sample[gids[rows]] += 1
            moved = y_new if every else y_new[acc]
            if unit_rows:
                max_retraction = max(max_retraction, normalise_rows_inplace(moved))
            if every:
                y, f = moved, stages[6].copy()
            else:
                y[acc] = moved
                f[acc] = stages[6][acc]
            # FSAL: the last stage is f at the unretracted point, an O(local error) offset.
            t[sel] = t_new
        h = h * factor
        last_rejected = ~accepted

        running = next_sample[active] < t_eval.size
        too_small = running & (h < 16 * np.finfo(float).eps * np.maximum(np.abs(t), 1.0))
        over_budget = running & ((n_steps[active] + n_rejected[active]) >= max_steps)
        if too_small.any() or over_budget.any():
            bad = int(active[np.flatnonzero(too_small | over_budget)[0]])
            why = "step size underflow (non-finite or stiff)" if too_small.any() else (
                f"step budget of {max_steps} exhausted"
            )
            k = int(np.flatnonzero(active == bad)[0])
            raise IntegrationError(f"trajectory {bad}: {why} at t = {t[k]:.6g} of {t_end:g}")

        done = ~running
        if done.all():
            break
        if done.any():
            keep = np.flatnonzero(~done)
            active, y, t, h, f = active[keep], y[keep], t[keep], h[keep], f[keep]
            last_rejected = last_rejected[keep]
            stages = np.empty((7,) + y.shape)
            work = np.empty_like(y)
            field.restrict(keep)

    stats = SolverStats(n_steps, n_rejected, n_calls, max_retraction)
    return ys, stats
