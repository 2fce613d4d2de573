"""One batch's integration with diffrax, jitted: Dopri5 and a PID controller at the cell's tolerances,
samples at ``t_eval``, the clustering stop as an ``Event``, trajectories batched with ``vmap``.

``batch_solver(config)`` builds (once per static configuration) a function of the batch's arrays
that returns the samples' variables and the per-trajectory statistics.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import optimistix as optx

from ..attention import Energy, Entropy, MaskRule, Weights
from ..geometry import Motion
from ..heads import Form
from .field import TrajectoryHeads, directions, evaluate, kernel, unit
from .measure import METRIC_GAPS, head_rates, measure
from .tables import KERNELS  # noqa: F401  (every declaration has its kernel, or is refused by name)


def _sample_bytes() -> int:
    """How many bytes of measurement run at once: observables are measured for as many samples at once
    (vmapped over the batch) as fit, the rest waiting in a sequential map, so the scores of a large cell
    (H n^2 per trajectory) never exist for every sample at once. On a CPU the measurement's elementwise
    passes over the scores are bound by memory: a cache-sized working set, one sample at a time from
    bench_peers' M up, pays (docs/performance.md, "The JAX engine"); an accelerator takes large chunks."""
    return 2 ** 22 if jax.default_backend() == "cpu" else 2 ** 30


def _error_scale() -> float:
    """diffrax's Dopri5 error weights over the numba engine's (``tableau.DOPRI5.e``): 2/3 in diffrax 0.7.

    diffrax estimates the local error with Dormand and Prince's other embedded solution, whose
    weights are a constant multiple of the ones the numba engine (and scipy, and Hairer's DOPRI5)
    uses; with both tolerances times that constant, its controller (the same RMS norm over
    ``atol + rtol max(|y0|, |y1|)``, safety 0.9, exponent -1/5, factors in [0.2, 10]) accepts and sizes
    steps as the numba engine does at the tolerances themselves.
    """
    import numpy as np

    from ..tableau import DOPRI5

    theirs, ours = np.asarray(diffrax.Dopri5.tableau.b_error, dtype=float), DOPRI5.e
    largest = np.argmax(np.abs(ours))
    ratio = theirs[largest] / ours[largest]
    if not np.allclose(theirs, ratio * ours, rtol=1e-12, atol=1e-15):
        raise NotImplementedError("diffrax's Dopri5 error weights are no multiple of tableau.DOPRI5.e: "
                                  "attnflow.jaxengine cannot match the numba engine's error control")
    return float(abs(ratio))


ERROR_SCALE = _error_scale()


class Rules(NamedTuple):
    """The static part of a batch: what the jitted function is compiled for. The tolerances, the
    criterion's threshold and the cluster level are arguments (``Tolerances``), so the certificate's
    tighter rerun reuses the compilation."""

    form: Form
    weights: Weights
    mask: MaskRule
    normalised: bool
    over_n: bool
    motion: Motion  # the geometry's rule
    radii: bool  # the state carries radii: attention and the observables read the directions
    on_sphere: bool  # the state lies on the sphere: retracted after each step
    alpha: float  # nGPT's step size (Motion.UNIT_TANGENT only)
    energy: Energy
    entropy: Entropy
    groups: tuple  # canonical observable groups
    needs_field: bool  # some group reads the field at the samples
    metric: str  # the clustering metric's name (observables.CLUSTER_METRICS)
    stop: bool
    max_steps: int
    fixed_step: float | None
    max_step: float | None  # no step longer (diffrax's dtmax)
    head_axes: tuple  # per TrajectoryHeads array: 0 (one per trajectory) or None (shared, or absent)


class _Retracted(diffrax.AbstractAdaptiveSolver, diffrax.AbstractWrappedSolver):
    """Dopri5 with every accepted solution scaled back onto the sphere, token by token (the numba
    engine's retraction). The error estimate and dense output are the wrapped solver's.

    With a ``probe`` (the ``energy_path`` group) the solver state carries a running record beside the
    wrapped solver's, ``probe(t1, y1, record)`` updated at each step's end: diffrax keeps a rejected
    step's state out, so the record sees the accepted steps only."""

    solver: diffrax.AbstractSolver
    on_sphere: bool
    probe: object = None
    record: object = None  # the probe's record before the first step

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def scan_kind(self):
        return self.solver.scan_kind

    def order(self, terms):
        return self.solver.order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        state = self.solver.init(terms, t0, t1, y0, args)
        return state if self.probe is None else (state, self.record)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner = solver_state if self.probe is None else solver_state[0]
        y1, error, dense, state, result = self.solver.step(terms, t0, t1, y0, args, inner, made_jump)
        if self.on_sphere:
            y1 = y1 / jnp.linalg.norm(y1, axis=-1, keepdims=True)
        if self.probe is not None:
            state = (state, self.probe(t1, y1, solver_state[1]))
        return y1, error, dense, state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


def _field(rules: Rules, x, heads, beta):
    return evaluate(x, heads, beta, form=rules.form, weights=rules.weights, mask=rules.mask,
                    normalised=rules.normalised, over_n=rules.over_n, motion=rules.motion, radii=rules.radii,
                    alpha=rules.alpha)


def _on_sphere(rules: Rules, x):
    """The state as sampled: retracted onto the sphere where it lies there."""
    return unit(x) if rules.on_sphere else x


def _unit_rows(rules: Rules, x):
    """What the clustering criterion reads: the tokens on the sphere, or the directions of a state with
    radii (flat space: the state itself)."""
    return unit(x) if rules.on_sphere or rules.radii else x


class Tolerances(NamedTuple):
    rtol: float
    atol: float
    threshold: float  # the clustering criterion's
    level: float  # 1 - cluster_eps: the cluster count's edges


def _integrate(rules: Rules, tol: Tolerances, x0, heads, beta, t0, t1, ts, gap, least=None):
    """diffeqsolve from (t0, x0) to t1 with samples at ``ts`` (and t1); ``gap``: the event's condition, or
    None for no event. ``least`` (T, H): where given, the solution's ``solver_state[1]`` is it lowered,
    at each sample ``k``, to the least per-head energy rate at the accepted step ends in
    ``(ts[k-1], ts[k]]`` (the ``energy_path`` group)."""
    term = diffrax.ODETerm(lambda t, x, args: _field(rules, x, heads, beta).velocity)
    if rules.fixed_step is None:
        # A step below round-off of t ends the run as the numba engine's does (step-size underflow: a
        # blow-up or a stiffness no step resolves), not after max_steps rejected or round-off-sized steps.
        # 16 eps max(|t|, 1) at the interval's far end: numba's bound at the time reached, or above it.
        dtmin = 16.0 * jnp.finfo(jnp.float64).eps * jnp.maximum(jnp.maximum(jnp.abs(t0), jnp.abs(t1)), 1.0)
        controller = diffrax.PIDController(rtol=tol.rtol * ERROR_SCALE, atol=tol.atol * ERROR_SCALE,
                                           dtmin=dtmin, dtmax=rules.max_step, force_dtmin=False)
        dt0 = None
    else:
        controller, dt0 = diffrax.ConstantStepSize(), rules.fixed_step
    event = None
    if gap is not None:
        # The criterion starts to hold where its gap falls to 0 or below (a downcrossing), located on the
        # (retracted) dense output by bisection, as the numba engine does. flip: the function bisected
        # falls through 0 (the gap; or, in a trajectory of the batch whose event did not trigger,
        # diffrax's distance to the step's end), so no sign check at the ends, which round-off between
        # the retracted step end and the dense output there could fail.
        event = diffrax.Event(lambda t, y, args, **kwargs: gap(_unit_rows(rules, y)),
                              root_finder=optx.Bisection(rtol=1e-14, atol=1e-14, flip=True), direction=False)
    probe = None
    if least is not None:
        def probe(t, y, record):
            k = jnp.searchsorted(ts, t, side="left")  # the sample whose interval holds the step's end
            rate = head_rates(y, _field(rules, y, heads, beta), beta, rules)
            row = jnp.minimum(k, ts.shape[0] - 1)
            return record.at[row].set(jnp.where(k < ts.shape[0], jnp.minimum(record[row], rate), record[row]))
    return diffrax.diffeqsolve(
        term, _Retracted(diffrax.Dopri5(), rules.on_sphere, probe, least), t0, t1, dt0, x0,
        saveat=diffrax.SaveAt(ts=ts, t1=True, solver_state=least is not None), stepsize_controller=controller,
        event=event,
        max_steps=rules.max_steps, throw=False, adjoint=diffrax.ForwardMode())


def _end(sol):
    """Where the integration ended: after an event diffrax saves the end right after the samples it
    reached and fills the rest with inf."""
    return jnp.max(jnp.where(jnp.isfinite(sol.ts), sol.ts, -jnp.inf))


def _ok(result):
    return (result == diffrax.RESULTS.successful) | (result == diffrax.RESULTS.event_occurred)


def _clustering_times(rules: Rules, met, event, t_stop, reached, t_eval, locate):
    """Per trajectory: the clustering time, where it stopped and the samples it reached. ``met`` (B, T):
    the criterion holds at a reached sample; ``locate(k)``: the first crossing between samples k - 1 and k,
    integrated again."""
    met_at_start = met[:, 0]
    if rules.stop:
        # Met at t0: no integration counts; otherwise the event's time.
        t_cluster = jnp.where(met_at_start, t_eval[0], jnp.where(event, t_stop, jnp.nan))
        t_stop = jnp.where(met_at_start, t_eval[0], t_stop)
        return t_cluster, t_stop, reached & (t_eval[None, :] <= t_stop[:, None])
    first = jnp.argmax(met, axis=1)
    crossed = jnp.any(met, axis=1)
    located = locate(jnp.maximum(first, 1))
    return jnp.where(~crossed, jnp.nan, jnp.where(first == 0, t_eval[0], located)), t_stop, reached


def _measured(rules: Rules, x, heads, on_batch) -> dict:
    """The variables at every sample of ``x`` (B, T, n, d), measured by ``on_batch`` (one sample of the
    batch): samples in chunks (each vmapped over the batch and the chunk) under a sequential map."""
    B, T = x.shape[:2]
    # a trajectory's heads have H first; a batch's, after the trajectory axis (rules.head_axes: 0)
    H = next(a.shape[1] if axis == 0 else a.shape[0]
             for a, axis in zip(heads, rules.head_axes, strict=True) if a is not None)
    # bytes of one sample's measurement for the batch: about eight (H, n, n) and four (H, n, d) arrays
    per_sample = 8 * B * H * x.shape[2] * (8 * x.shape[2] + 4 * x.shape[3])
    chunk = int(max(1, min(T, _sample_bytes() // per_sample)))
    recorded = jax.lax.map(on_batch, jnp.swapaxes(x, 0, 1), batch_size=chunk)  # over (T, B, n, d)
    return {name: jnp.swapaxes(value, 0, 1) for name, value in recorded.items()}


@functools.lru_cache(maxsize=64)
def batch_solver(rules: Rules):
    """The jitted solver of a batch for ``rules``: (x0 (B, n, d), heads, beta (B,), t_eval (T,)) ->
    (variables name -> (B, T, ...), statistics name -> (B,))."""
    metric_gap = kernel(METRIC_GAPS, rules.metric, "clustering metric")

    path = "energy_path" in rules.groups

    def trajectory(x0, heads, beta, t_eval, tol, gap):
        event_gap = gap if rules.stop else None
        least = None
        if path:  # a trajectory's heads have H first
            H = next(a.shape[0] for a in heads if a is not None)
            least = jnp.full((t_eval.shape[0], H), jnp.inf)
        sol = _integrate(rules, tol, x0, heads, beta, t_eval[0], t_eval[-1], t_eval, event_gap, least)
        raw = sol.ys[:-1]  # the samples; the last row is the end of the integration
        t_stop = _end(sol)
        event = sol.result == diffrax.RESULTS.event_occurred
        return raw, t_stop, event, sol

    def refine(x_before, heads, beta, t_before, t_after, tol, gap):
        """The first crossing in (t_before, t_after], integrating again from the sample before it."""
        sol = _integrate(rules, tol, x_before, heads, beta, t_before, t_after, jnp.stack([t_after]), gap)
        return jnp.where(sol.result == diffrax.RESULTS.event_occurred, _end(sol), t_after)

    def observe(x, heads, beta, level):
        parts = _field(rules, x, heads, beta) if rules.needs_field else None
        radius = jnp.linalg.norm(x, axis=-1)
        if rules.radii:  # every group but radius reads the directions
            x, parts = directions(x, parts)
        return measure(x, parts, beta, rules.groups, rules, level, radius)

    head_axes = TrajectoryHeads(*rules.head_axes)

    def batch(x0, heads, beta, t_eval, tol):
        gap = functools.partial(metric_gap, threshold=tol.threshold)
        solved = jax.vmap(functools.partial(trajectory, tol=tol, gap=gap), in_axes=(0, head_axes, 0, None))
        raw, t_stop, event, sol = solved(x0, heads, beta, t_eval)
        B, T = raw.shape[:2]
        reached = t_eval[None, :] <= t_stop[:, None]
        # samples past a stop (inf) stand in as x0 until they are blanked
        raw = jnp.where(reached[..., None, None], raw, x0[:, None])
        x = _on_sphere(rules, raw)

        def largest_off_one(a):  # largest | ||x_i|| - 1 | over the reached samples
            off = jnp.abs(jnp.linalg.norm(a, axis=-1) - 1.0)
            return jnp.max(jnp.where(reached[..., None], off, 0.0), axis=(1, 2))

        removed = largest_off_one(raw) if rules.on_sphere else jnp.zeros(B)
        seen = unit(x) if rules.radii else x  # what the observables read: x is retracted on the sphere
        drift = largest_off_one(seen)
        met = (jax.vmap(jax.vmap(gap))(seen) <= 0.0) & reached
        locate = jax.vmap(functools.partial(refine, tol=tol, gap=gap), in_axes=(0, head_axes, 0, 0, 0))
        t_cluster, t_stop, reached = _clustering_times(rules, met, event, t_stop, reached, t_eval,
                                                       lambda k: locate(x[jnp.arange(B), k - 1], heads, beta,
                                                                        t_eval[k - 1], t_eval[k]))
        on_batch = jax.vmap(functools.partial(observe, level=tol.level), in_axes=(0, head_axes, 0))
        recorded = _measured(rules, x, heads, lambda xt: on_batch(xt, heads, beta))
        if path:  # the samples' own rates and the steps' since the previous sample
            recorded["energy_rate_min"] = jnp.minimum(recorded["energy_rate_min"], sol.solver_state[1])
        stats = sol.stats
        accepted, rejected = stats["num_accepted_steps"], stats["num_rejected_steps"]
        return recorded, reached, {
            "n_steps": accepted, "n_rejected": rejected,
            # Dopri5 evaluates six new stages a step (FSAL), plus the first stage, the initial step's probe
            # and one evaluation per sample where a group reads the field.
            # energy_path: one more at each step's end (rejected steps' too: the probe runs before the
            # verdict)
            "n_rhs_calls": (6 + path) * (accepted + rejected) + 2 + (T if rules.needs_field else 0),
            "t_cluster": t_cluster, "t_stop": t_stop, "norm_drift": drift, "max_retraction": removed,
            # dtmin flagged as the run ended (a last sliver of a step, within round-off of the end): it
            # reached the end, so it did not underflow
            "ok": _ok(sol.result) | ((sol.result == diffrax.RESULTS.dt_min_reached) & (t_stop >= t_eval[-1])),
            "budget": sol.result == diffrax.RESULTS.max_steps_reached}

    return jax.jit(batch)
