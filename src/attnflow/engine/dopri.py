"""The adaptive Runge-Kutta loop, compiled: one trajectory per thread at a time, no Python per step.

Each trajectory takes its own steps with its own error control (so one stiff
trajectory never shrinks another's steps), samples its observables from the
tableau's dense output at the requested times, retracts onto the sphere after
each accepted step, and locates the first time its clustering criterion holds
by bisection on the dense output. The step-size controller mirrors scipy's
RK45 (an integral controller with the same safety factor and bounds), so the
two take comparable steps at the same tolerance.
"""

from __future__ import annotations

from collections import namedtuple
from enum import IntEnum

import numba
import numpy as np

from ..attention import Energy
from .cosines import Metric, criterion_value
from .energy import exp_energy, softplus_energy
from .field import HeadArrays, field, workspace
from .machinery import borrow, by_reference, copy_into, dereference, keep, take_next
from .measure import Group, measure, scratch
from .steps import SAFETY, dense, initial_step, retract, rk_step, step_factor

_EPS = np.finfo(np.float64).eps
_BISECTIONS = 60


class Status(IntEnum):
    OK = 0
    UNDERFLOW = 1  # step size below round-off of t: non-finite or stiff
    BUDGET = 2  # max_steps accepted + rejected steps spent


# Columns of the per-trajectory statistics.
STEPS, REJECTED, CALLS, STATUS = 0, 1, 2, 3
T_STOP, T_CLUSTER, RETRACTION, DRIFT = 0, 1, 2, 3

# The loop's plumbing travels in small records (built by ``attnflow.engine``):
# the method, a tableau's arrays (``attnflow.tableau``); ``poly`` its dense output
Method = namedtuple("Method", "a b e poly error_order fsal")
# step control: tolerances, the step budget, a fixed step (> 0: no error control), the longest step (inf:
# none)
Control = namedtuple("Control", "rtol atol max_steps fixed_step max_step")
# the clustering criterion (``Metric``, threshold), the cluster-count level, whether to stop there, and
# whether it reads the directions of a state with radii (``Flow.radii``)
Criterion = namedtuple("Criterion", "metric threshold level stop radii")
# what the samples record: ``want`` flags by ``Group``; ``field``: evaluate the field there;
# ``keep_scores``: keep the raw scores s^h_ij (both from the groups' declarations)
Sampling = namedtuple("Sampling", "want field keep_scores")
# per-trajectory statistics of the batch: counts (B, 4) int64 and times (B, 4), columns above
Stats = namedtuple("Stats", "counts times")
# one trajectory's buffers: stages (s, n, d), the stage input, the new solution, the error
# estimate, a dense-output sample and its velocity, the dense output's stage weights (s,)
Buffers = namedtuple("Buffers", "stages stage y_new err xs xs_dot weights")


@numba.njit(cache=True, inline="always")
def _sampled_value(out, b, t, metric):
    """The clustering metric at sample ``t`` of trajectory ``b``, from what ``measure`` recorded there."""
    if metric == Metric.EPSILON:
        return 1.0 - out.gamma_min[b, t]
    if metric == Metric.GAMMA_MEAN:
        return out.gamma_mean[b, t]
    return np.nan  # unreachable: every Metric has a branch (checked at import); NaN never meets one


@numba.njit(cache=True)
def _met(value, metric, threshold):
    if metric == Metric.EPSILON:
        return value <= threshold
    if metric == Metric.GAMMA_MEAN:
        return value >= threshold
    return False  # unreachable: every Metric has a branch (checked at import); a raise costs every call


@numba.njit(cache=True, inline="always")
def _holds(x, criterion, ws, sc):
    """Whether the clustering criterion holds at ``x``."""
    return _met(criterion_value(x, ws.xt, sc.gram, criterion.metric, criterion.threshold, criterion.radii,
                                sc.theta), criterion.metric, criterion.threshold)


@numba.njit(cache=True, inline="always")
def sample_step(b, y, t, h, t_new, next_sample, found, t_cluster, hd_ref, flow, beta, method, criterion,
                sampling, t_eval, buf, ws_ref, sc_ref, out_ref):
    """Measure the samples in ``(t, t_new]`` on the step's dense output; locate a crossing among them.

    Returns (next sample, largest norm drift, found, t_cluster, field evaluations,
    the last sample fraction of the step where the criterion did not hold).
    """
    hd, out = dereference(hd_ref), dereference(out_ref)
    drift, calls = 0.0, 0
    sigma_unmet = 0.0
    xs, xs_dot = buf.xs, buf.xs_dot
    while next_sample < t_eval.size and t_eval[next_sample] <= t_new:
        sigma = (t_eval[next_sample] - t) / h
        dense(xs, y, buf.stages, h, sigma, method.poly, buf.weights, flow.on_sphere)
        if sampling.field:
            field(xs, xs_dot, hd_ref, flow, beta, sampling.keep_scores, sampling.field, ws_ref)
            calls += 1
            drift = max(drift, measure(xs, xs_dot, sampling, flow, beta, hd.shared, criterion.level,
                                       ws_ref, sc_ref, out_ref, b, next_sample))
        else:
            drift = max(drift, measure(xs, xs, sampling, flow, beta, hd.shared, criterion.level,
                                       ws_ref, sc_ref, out_ref, b, next_sample))
        if not found:
            value = _sampled_value(out, b, next_sample, criterion.metric)
            if _met(value, criterion.metric, criterion.threshold):
                t_cluster = _locate(y, buf.stages, h, t, sigma_unmet, sigma, method.poly, buf.weights,
                                    flow.on_sphere, criterion, xs, dereference(ws_ref), dereference(sc_ref))
                found = True
            else:
                sigma_unmet = sigma
        next_sample += 1
    return next_sample, drift, found, t_cluster, calls, sigma_unmet


@numba.njit(cache=True)
def step_rates(y, ydot, hd_ref, flow, beta, sampling, ws_ref, sc_ref, least, k):
    """The per-head energy rates at an accepted step's end ``y`` into ``least[0, k]``, the running minimum
    of sample ``k``'s interval (the ``energy_path`` group: per-head monotonicity between samples)."""
    hd, ws, sc = dereference(hd_ref), dereference(ws_ref), dereference(sc_ref)
    field(y, ydot, hd_ref, flow, beta, sampling.keep_scores, sampling.field, ws_ref)
    for h in range(least.shape[2]):
        if flow.energy == Energy.EXP:
            rate = exp_energy(flow, h, beta, ydot, hd.shared, ws, sc)[1]
        elif flow.energy == Energy.SOFTPLUS:
            rate = softplus_energy(flow, h, beta, ydot, hd.shared, ws, sc)[1]
        else:  # unreachable after engine.check_declarations; poison, as measure does
            rate = np.nan
        if not rate >= least[0, k, h]:  # NaN wins
            least[0, k, h] = rate


# Inlined into its one caller, ``solve_batch``: compiled on its own, its code (field and measure included)
# was optimised and turned into machine code twice, once for it and once linked into ``solve_batch``:
# 10% of the engine's first compilation (docs/performance.md, "Compiling the numba engine").
@numba.njit(cache=True, inline="always")
def solve_one(b, x0, hd, flow, beta, t_eval, method, control, criterion, sampling, out, stats):
    """Integrate trajectory ``b`` from ``x0`` and measure it at ``t_eval``; statistics into ``stats``.

    The arguments are borrowed views (``solve_batch``); so are the buffers, owned by ``owned``
    until the end (``machinery.borrow``). The records go to ``field`` and ``measure`` by reference,
    made once here (``machinery.by_reference``: one pointer each instead of every scalar in them).
    """
    x0, hd, t_eval, method, sampling, out, stats = borrow((x0, hd, t_eval, method, sampling, out, stats))
    n, d = x0.shape
    n_stages = method.a.shape[0]
    owned = (workspace(n, d, hd.H, hd.eig.shape[1], sampling.keep_scores, not hd.shared), scratch(n, d, hd.H),
             Buffers(np.empty((n_stages, n, d)), np.empty((n, d)), np.empty((n, d)), np.empty((n, d)),
                     np.empty((n, d)), np.empty((n, d)), np.empty(n_stages)),
             x0.copy())
    ws, sc, buf, y = borrow(owned)
    hd_ref, ws_ref, sc_ref, out_ref = by_reference(hd), by_reference(ws), by_reference(sc), by_reference(out)
    t_first, t_end = t_eval[0], t_eval[-1]
    steps, rejected = 0, 0
    retraction = 0.0
    # energy_path: each sample interval's least per-head rate over the accepted step ends in it
    path = sampling.want[Group.ENERGY_PATH.value]
    least = out.energy_rate_min[b:b + 1]  # (1, T, H); empty when the group is off
    if path:
        least[:] = np.inf

    calls, drift, found, t_cluster, next_sample, h, status = _start(
        b, y, hd_ref, flow, beta, t_eval, method, control, criterion, sampling, buf, ws_ref, sc_ref, out_ref)
    t = t_first
    last_rejected = False
    while next_sample < t_eval.size:
        h = min(h, control.max_step)
        # Never leave a sliver of the interval that would need a round-off-sized step.
        if (t_end - t) - h < 100.0 * _EPS * max(abs(t_end), 1.0):
            h = t_end - t
        err_norm = rk_step(y, h, hd_ref, flow, beta, method, control, buf, ws_ref)
        calls += n_stages - 1
        accepted = err_norm < 1.0  # False for NaN, so a blow-up is retried smaller
        if control.fixed_step > 0.0:
            accepted = True
            err_norm = SAFETY ** (method.error_order + 1)  # factor 1
        factor = step_factor(err_norm, accepted, last_rejected, method)

        if accepted:
            steps += 1
            t, next_sample, found, t_cluster, step_drift, step_retraction, step_calls = _accept(
                b, y, t, h, t_end, next_sample, found, t_cluster, hd_ref, flow, beta, method, criterion,
                sampling, t_eval, buf, ws_ref, sc_ref, out_ref, path, least)
            drift, retraction = max(drift, step_drift), max(retraction, step_retraction)
            calls += step_calls
        else:
            rejected += 1
        h = h * factor
        last_rejected = not accepted

        if next_sample >= t_eval.size or (criterion.stop and found):
            break
        if h < 16.0 * _EPS * max(abs(t), 1.0):
            status = Status.UNDERFLOW
            break
        if steps + rejected >= control.max_steps:
            status = Status.BUDGET
            break

    if path:  # the samples' own rates (unreached samples are blanked by the caller)
        _least_of_samples(least, out.energy_rate[b])
    stats.counts[b, STEPS], stats.counts[b, REJECTED], stats.counts[b, CALLS] = steps, rejected, calls
    stats.counts[b, STATUS] = status
    stats.times[b, T_STOP], stats.times[b, T_CLUSTER] = t, t_cluster
    stats.times[b, RETRACTION], stats.times[b, DRIFT] = retraction, drift
    keep(owned)


@numba.njit(cache=True, inline="always")
def _start(b, y, hd_ref, flow, beta, t_eval, method, control, criterion, sampling, buf, ws_ref, sc_ref,
           out_ref):
    """Sample 0 at ``y`` and the first step's size.

    Returns (field evaluations, drift, found, t_cluster, next sample, step size, status).
    """
    hd, ws, sc, stages = dereference(hd_ref), dereference(ws_ref), dereference(sc_ref), buf.stages
    t_first, t_end = t_eval[0], t_eval[-1]
    status, calls = Status.OK, 1
    # Stage 0 is the field at y, with what the observables of sample 0 read.
    field(y, stages[0], hd_ref, flow, beta, sampling.keep_scores, sampling.field, ws_ref)
    xdot = stages[0] if sampling.field else y
    drift = measure(y, xdot, sampling, flow, beta, hd.shared, criterion.level, ws_ref, sc_ref, out_ref, b,
                    np.int64(0))
    found = _holds(y, criterion, ws, sc)
    t_cluster = t_first if found else np.nan
    next_sample = t_eval.size if found and criterion.stop else 1
    if control.fixed_step > 0.0:
        h = control.fixed_step
    else:
        h = initial_step(y, stages[0], hd_ref, flow, beta, method, control, t_end - t_first, buf, ws_ref)
        calls += 1
        if h == 0.0:
            status = Status.UNDERFLOW
            next_sample = t_eval.size  # nothing can be integrated
    return calls, drift, found, t_cluster, next_sample, h, status


@numba.njit(cache=True, inline="always")
def _accept(b, y, t, h, t_end, next_sample, found, t_cluster, hd_ref, flow, beta, method, criterion, sampling,
            t_eval, buf, ws_ref, sc_ref, out_ref, path, least):
    """Take the accepted step from ``(t, y)`` (its stages and solution in ``buf``): measure the samples it
    covers, retract, record the energy path, locate a crossing, and move ``y`` to its end.

    Returns (the new t, next sample, found, t_cluster, largest drift, retraction, field evaluations).
    """
    ws, sc, stages = dereference(ws_ref), dereference(sc_ref), buf.stages
    # A step clipped to the end lands on t_end exactly, not t + h rounded.
    t_new = t_end if h == t_end - t else t + h
    next_sample, drift, found, t_cluster, calls, sigma_unmet = sample_step(
        b, y, t, h, t_new, next_sample, found, t_cluster, hd_ref, flow, beta, method, criterion,
        sampling, t_eval, buf, ws_ref, sc_ref, out_ref)
    retraction = retract(buf.y_new) if flow.on_sphere else 0.0
    if path and next_sample < t_eval.size and t_new > t_eval[next_sample - 1]:
        step_rates(buf.y_new, buf.xs_dot, hd_ref, flow, beta, sampling, ws_ref, sc_ref, least, next_sample)
        calls += 1
    if not found and _holds(buf.y_new, criterion, ws, sc):
        t_cluster = _locate(y, stages, h, t, sigma_unmet, 1.0, method.poly, buf.weights,
                            flow.on_sphere, criterion, buf.xs, ws, sc)
        found = True
    copy_into(y, buf.y_new)
    if method.fsal:
        # The last stage is f at the unretracted point, an O(local error) offset.
        copy_into(stages[0], stages[stages.shape[0] - 1])
    else:
        field(y, stages[0], hd_ref, flow, beta, np.bool_(False), np.bool_(False), ws_ref)
        calls += 1
    return t_new, next_sample, found, t_cluster, drift, retraction, calls


@numba.njit(cache=True, inline="always")
def _least_of_samples(least, rates):
    """Fold the samples' own per-head rates ``rates`` (T, H) into the running minima ``least`` (1, T, H)."""
    for k in range(least.shape[1]):
        for h in range(least.shape[2]):
            if not rates[k, h] >= least[0, k, h]:  # NaN wins
                least[0, k, h] = rates[k, h]


@numba.njit(cache=True)
def _locate(y, stages, h, t, lo, hi, poly, weights, on_sphere, criterion, xs, ws, sc):
    """First time in ``(t + lo h, t + hi h]`` where the criterion holds, by bisection on the dense output."""
    y, stages, poly, weights, xs, ws, sc = borrow((y, stages, poly, weights, xs, ws, sc))
    for _ in range(_BISECTIONS):
        if (hi - lo) * h <= 4.0 * _EPS * max(abs(t), 1.0):
            break
        mid = 0.5 * (lo + hi)
        dense(xs, y, stages, h, mid, poly, weights, on_sphere)
        if _holds(xs, criterion, ws, sc):
            hi = mid
        else:
            lo = mid
    return t + hi * h


@numba.njit(cache=True)
def _row(a, b):
    """Trajectory ``b``'s slice of a head array; one row is shared by every trajectory."""
    return a[b] if a.shape[0] > 1 else a[0]


@numba.njit(cache=True)
def trajectory_heads(batch, b):
    """Trajectory ``b``'s ``HeadArrays`` from the batch's (arrays of (B or 1, ...))."""
    return HeadArrays(batch.form, _row(batch.diagonal, b), _row(batch.dense, b), _row(batch.u, b),
                      _row(batch.ut, b), _row(batch.eig, b), _row(batch.values_t, b), batch.shared, batch.H)


@numba.njit(cache=True, nogil=True)
def solve_batch(counter, x0, head_arrays, flow, beta, t_eval, method, control, criterion, sampling, out,
                stats):
    """Integrate trajectories of the batch, taking each from ``counter`` until none is left (one thread of
    ``machinery.run_threads``); ``beta`` is (B,).

    The trajectories get borrowed views of the shared arrays, which live for this call: no
    reference counts for threads to contend on (``machinery.borrow``).
    """
    while True:
        b = take_next(counter)
        if b >= x0.shape[0]:
            break
        solve_one(b, np.ascontiguousarray(x0[b]), trajectory_heads(borrow(head_arrays), b), flow,
                  beta[b], borrow(t_eval), borrow(method), control, criterion, borrow(sampling), borrow(out),
                  borrow(stats))


@numba.njit(cache=True, nogil=True)
def observe_batch(counter, x, head_arrays, flow, beta, sampling, level, out, drift):
    """The variables of the wanted groups at configurations ``x[b]`` taken from ``counter``, as sample 0
    of ``out`` (one thread of ``machinery.run_threads``)."""
    while True:
        b = take_next(counter)
        if b >= x.shape[0]:
            break
        hd = trajectory_heads(borrow(head_arrays), b)
        n, d = x.shape[1:]
        owned = (workspace(n, d, hd.H, hd.eig.shape[1], True, not hd.shared), scratch(n, d, hd.H),
                 np.empty((n, d)), np.ascontiguousarray(x[b]))
        ws, sc, xdot, xb = borrow(owned)  # as in solve_one
        ws_ref = by_reference(ws)
        on = np.bool_(True)
        field(xb, xdot, by_reference(hd), flow, beta[b], on, on, ws_ref)
        drift[b] = measure(xb, xdot, borrow(sampling), flow, beta[b], hd.shared, level, ws_ref,
                           by_reference(sc), by_reference(borrow(out)), b, np.int64(0))
        keep(owned)
