"""An independent reference integrator for the certificate tests: DOP853 (scipy's tableau and error
norm), its own step size per trajectory, every trajectory of a batch stepped in lockstep.

For a field with kinks (relu: a kink where a score s_ij changes sign) a step never crosses one: a step
in which a score changes sign is taken again, shortened to the secant estimate of the first crossing,
until the crossing lies within ``KINK_TOLERANCE`` of one of its ends. Both sides of a kink are smooth,
so each step keeps DOP853's order; a kink at distance delta inside a step would add an error of order
delta^2 (the ramp its velocity has), which the tolerance keeps at round-off.
"""

import numpy as np
from scipy.integrate._ivp import dop853_coefficients as tableau

STAGES = tableau.N_STAGES
A, B, C = tableau.A[:STAGES, :STAGES], tableau.B, tableau.C[:STAGES]
E3, E5 = tableau.E3, tableau.E5
KINK_TOLERANCE = 1e-10  # time units: a kink this close to a step's end adds an error ~1e-20
SAFETY, MIN_FACTOR, MAX_FACTOR = 0.9, 0.2, 10.0  # scipy's controller


def _error_norms(K, h, scale):
    """scipy's DOP853 error norm per trajectory: K (stages + 1, B, N), h (B,), scale (B, N)."""
    err5 = np.tensordot(E5, K, axes=1) / scale
    err3 = np.tensordot(E3, K, axes=1) / scale
    e5, e3 = np.sum(err5 ** 2, axis=1), np.sum(err3 ** 2, axis=1)
    denom = np.where(e5 + e3 > 0, e5 + 0.01 * e3, 1.0)
    return np.abs(h) * e5 / np.sqrt(denom * scale.shape[1])


def integrate(fun, y0, times, *, rtol, atol, kinks=None, retract=None, event=None):
    """The states at ``times`` of dy/dt = fun(y) for a batch y0 (B, N).

    kinks(y) -> (B, K): quantities whose sign changes are the field's kinks (None: a smooth field).
    retract(y) -> y: applied after every accepted step (the sphere's normalisation).
    event(y) -> (B,) booleans: a criterion; returns, besides the states, per trajectory the first
    accepted step at whose end it holds, as (t_start, y_start, t_end) (NaN where it never does).
    """
    y = np.array(y0, dtype=float)
    nb = y.shape[0]
    t = np.full(nb, times[0])
    out = np.full((nb, times.size) + y.shape[1:], np.nan)
    out[:, 0] = y
    following = np.ones(nb, dtype=int)  # index of the next sample time
    f = fun(y)
    h = np.full(nb, 1e-3 * (times[-1] - times[0]))
    found = np.zeros(nb, dtype=bool) if event is None else event(y)
    t_event = np.where(found, times[0], np.nan)
    y_event, t_event_end = y.copy(), t_event.copy()
    K = np.empty((STAGES + 1,) + y.shape)
    while np.any(following < times.size):
        live = following < times.size
        target = times[np.minimum(following, times.size - 1)]
        step = np.where(live, np.minimum(h, target - t), 0.0)
        K[0] = f
        for s in range(1, STAGES):
            K[s] = fun(y + step[:, None] * np.tensordot(A[s, :s], K[:s], axes=1))
        y_new = y + step[:, None] * np.tensordot(B, K[:STAGES], axes=1)
        f_new = fun(y_new)
        K[STAGES] = f_new
        scale = atol + np.maximum(np.abs(y), np.abs(y_new)) * rtol
        norm = _error_norms(K, step, scale)
        accept = live & (norm < 1.0)
        grow = np.where(norm == 0, MAX_FACTOR, np.clip(SAFETY * np.where(norm > 0, norm, 1.0) ** (-1 / 8),
                                                       MIN_FACTOR, MAX_FACTOR))
        h_next = np.where(accept, step * np.minimum(grow, MAX_FACTOR), step * np.maximum(grow, MIN_FACTOR))
        if kinks is not None:
            before, after = kinks(y), kinks(y_new)
            crossed = (np.sign(before) != np.sign(after)) & (before != 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(crossed, before / (before - after), np.inf).min(axis=1)
            share = np.where(accept, share, np.inf)
            finite = share < np.inf
            inside = finite & (np.where(finite, np.minimum(share, 1 - share), 0.0) * step > KINK_TOLERANCE)
            accept &= ~inside
            h_next = np.where(inside, np.where(inside, share, 1.0) * step, h_next)  # to the first crossing
        y_acc = y_new if retract is None else retract(y_new)
        if event is not None:
            now = accept & ~found & event(y_acc)
            t_event[now], t_event_end[now], y_event[now] = t[now], (t + step)[now], y[now]
            found |= now
        y = np.where(accept[:, None], y_acc, y)
        f = np.where(accept[:, None], f_new if retract is None else fun(y), f)
        landed = accept & (step >= target - t)  # the step was cut to end on the sample time
        t = np.where(landed, target, np.where(accept, t + step, t))
        for b in np.flatnonzero(landed):
            out[b, following[b]] = y[b]
            following[b] += 1
        h = np.where(live, h_next, h)
    return out, (t_event, y_event, t_event_end)


def single_step(fun, y, h):
    """One DOP853 step of size h (B,) from y (B, N) (for locating an event inside an accepted step)."""
    K = np.empty((STAGES + 1,) + y.shape)
    K[0] = fun(y)
    for s in range(1, STAGES):
        K[s] = fun(y + h[:, None] * np.tensordot(A[s, :s], K[:s], axes=1))
    return y + h[:, None] * np.tensordot(B, K[:STAGES], axes=1)
