"""``simulate(cell)``: integrate every seed of a cell as one batch and measure it."""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import xarray as xr

from .attention import ATTENTIONS
from .cell import INT64_MAX, MAX_EXPONENT, MIN_RTOL, Cell
from .contract import ClusterEvent, Controller, Heads, Problem, SaveAt, failure_reason
from .engines import engine_for, solver_for
from .geometry import GEOMETRIES
from .heads import Form, head_matrices
from .metadata import COORDINATES
from .numerics import ENGINE_NUMERICS
from .observables import CLUSTER_METRICS, variables
from .resources import oversized
from .tokens import initial_tokens, unit_rows
from .units import FLOW_TIME, TIME_UNITS
from .version import __version__

# Explicit tokens this close to the sphere are round-off and get normalised.
_SPHERE_TOLERANCE = 1e-8
_SYMMETRY_TOLERANCE = 1e-12
# Largest | ||x_i|| - 1 | accepted on the sphere: the retraction keeps it at round-off.
_MAX_SPHERE_DRIFT = 1e-10


# Accuracy certificate (docs/model.md, "Numerics"): every seed is integrated a second time, all seeds in
# one batch, and a seed's ``certificate_error`` is the largest deviation of its recorded variables between
# the two runs. A smooth field's companion run is CERTIFICATE_LOOSER times looser (rtol and atol): where
# accuracy sizes the steps its error is about that many times the stored run's (DOPRI5's global error is
# proportional to the tolerance), and wherever it is at least twice the stored run's, the deviation bounds
# the stored error (|e| <= |e_loose| - |e| <= deviation). Where stability sizes the steps, the looser run
# takes the same steps and errs alike: its step count tells (``_STEPS_MOVED_LOOSER``), and such a seed
# gets the tighter companion below. It costs about CERTIFICATE_LOOSER^(-1/5) ~ 0.63 of the stored run's
# steps and all of its samples. Every seed: the worst seed of a smooth cell exceeded the worst of its first
# four up to 108x (stiff usa; docs/model.md, Numerics).
CERTIFICATE_LOOSER = 10.0
# A non-smooth field (relu: a kink where a score changes sign) breaks that proportionality: a step across a
# kink has an error its embedded estimate understates 10-20x, and the error of one seed moved by 0.2x-100x
# for a 10x change of the tolerance (measured). Its companion run is CERTIFICATE_TIGHTER times tighter
# (floored at MIN_RTOL) and the certificate CERTIFICATE_SAFETY times the deviation, which bounds the stored
# error wherever the tighter run's error is at most half of it (measured: certificate / true error 1.9-2.2
# on every relu seed).
CERTIFICATE_TIGHTER = 100.0
CERTIFICATE_SAFETY = 2.0
# The looser companion needs room below rtol = 1: a smooth cell with rtol above this gets the tighter one.
_LOOSEST_COMPANION_RTOL = 1e-2
# A variable's scale, per seed, is max |value| over that seed's samples in the more accurate run, floored
# here, so a variable that is zero throughout (up to round-off) does not divide by zero.
CERTIFICATE_SCALE_FLOOR = 1e-12
# Steps the tighter run may take, relative to the cell's budget (DOPRI5 needs ~100^(1/5) = 2.5x).
_CERTIFICATE_STEP_FACTOR = 4
# A companion's steps per unit time over the stored run's, where accuracy sizes the steps, is the ratio of
# their tolerances to the power -1/5 (DOPRI5: 0.63 looser, 2.5 tighter). A looser run must get half way
# (in logarithm: 0.79): short of that, stability sized some of its steps, and there it errs as the stored
# run does. A tighter run need only move (1.05): its error test holds every step 100x lower whatever sizes
# the steps, which is what the tighter bound needs (measured: certificate / true error 1.9-2.0 on every
# seed it certified, tests/test_certificate.py); one that takes the stored run's steps computes its numbers.
_STEPS_MOVED_LOOSER = 0.5
_STEPS_MOVED_TIGHTER = 0.05
# Where two runs differ by this much of a variable's largest value, the error no longer follows the
# tolerance (it saturates at the size of the variable): measured, a looser companion then read 2.7x under a
# seed's error (usa, beta 6, rtol 1e-3). Such a seed is uncertified; the cell is far above CERTIFICATE_BOUND.
CERTIFICATE_SATURATION = 0.1
# The store attr ``values_source`` of value alignment V_h = M_h (the config's ``values: aligned``):
# the spelling stores have always carried, kept so stores stay alike; the one place `scores`
# names the score matrices (docs/model.md, "Names").
_ALIGNED_VALUES_SOURCE = "scores"


# What a store keeps of the score matrices, by form: (variable, its trailing dims, attrs), or None where the
# store keeps none (factored: trained heads are not copied into every store; the attrs name the weights
# file and its digest).
_STORED_HEADS = {
    Form.DENSE: ("score_matrix", ("dim", "dim_col"),
                 {"units": "1", "long_name": "score matrix", "description": "score matrix M_h used"}),
    Form.DIAGONAL: ("score_diagonal", ("dim",),
                    {"units": "1", "long_name": "score matrix diagonal",
                     "description": "diagonal of the (diagonal) score matrix M_h used"}),
    Form.FACTORED: None,
}


class SimulationError(RuntimeError):
    """A cell's simulation produced no trustworthy result; the message names the cell."""


def simulate(
    cell: Cell,
    *,
    x0: np.ndarray | None = None,
    score_matrices: np.ndarray | None = None,
    value_matrices: np.ndarray | None = None,
    certify: bool = True,
) -> xr.Dataset:
    """Integrate all seeds of ``cell`` as one batch and record its observable groups.

    Parameters
    ----------
    cell : Cell
        The grid cell; its declarations give tokens and heads per seed, and
        ``cell.observables`` the groups to record (``attnflow.observables``).
    x0 : ndarray, optional
        Initial tokens, ``(n, d)`` (shared by all seeds) or ``(seeds, n, d)``,
        replacing the cell's ``init``. On the sphere each row must have unit
        norm to ``1e-8`` (then it is normalised exactly) or ``ValueError``; where the geometry
        carries radii the rows are ``r_k theta_k`` (any norm but 0).
    score_matrices : ndarray, optional
        ``(H, d, d)`` symmetric score matrices ``M_h`` replacing the cell's head structure (``heads``).
    value_matrices : ndarray, optional
        ``(H, d, d)`` ``V_h``; default ``V_h = M_h`` (value alignment).
    certify : bool
        Record the accuracy certificate (default): every seed integrated a second time, at a looser
        tolerance for a smooth field and a tighter one for relu or where the steps did not follow the
        tolerance, see ``certificate_error``.

    Returns
    -------
    xarray.Dataset
        Dims ``seed, time, head, token`` (and ``dim``, ``dim_col``); the
        variables of the recorded groups; per seed
        ``t_cluster`` (the first time the clustering criterion holds, located
        on the integrator's dense output), ``censored``, ``norm_drift`` and the
        solver's step counts. The attrs hold every cell field and the package
        version, and the accuracy certificate: per seed ``certificate_error``, the
        largest deviation of that seed's recorded variables between the stored run
        and a companion run at ``certificate_rtol`` (``CERTIFICATE_LOOSER`` times
        looser for a smooth field; ``CERTIFICATE_TIGHTER`` times tighter for a
        non-smooth one, the deviation times ``CERTIFICATE_SAFETY``), each float
        variable's deviation divided by its scale, the largest |value| of that
        variable over the seed's samples in the more accurate run, floored at
        ``CERTIFICATE_SCALE_FLOOR``; samples reached by one integration only left
        out; ``t_cluster`` the same way, a censoring that differs counting 1. The
        attrs hold the largest over the seeds (``certificate_error``; NaN when a seed
        is uncertified, counted in ``certificate_uncertified``), the seed and
        variable it comes from (``certificate_seed``, ``certificate_variable``),
        ``certificate_route`` (the first companion: looser or tighter), the companions'
        tolerances and ``certificate_rhs_calls``, their cost in field evaluations. Every variable and
        coordinate has ``units`` (CF; ``"1"``: every quantity is dimensionless, time
        included), ``long_name`` and ``description`` attrs (``attnflow.metadata``).
    """
    if not isinstance(cell, Cell):
        raise TypeError(f"simulate expects a Cell, got {type(cell).__name__}")
    if not isinstance(certify, (bool, np.bool_)):
        raise TypeError(f"simulate: certify = {certify!r}: must be True or False")
    too_large = oversized(cell)
    if too_large:
        raise ValueError(f"{describe(cell)}: {too_large}")
    n_seeds, n, d, H = cell.n_seeds, cell.n, cell.d, cell.H

    values = None
    if score_matrices is None:
        # Score matrices that do not depend on the seed are built once and shared by the batch.
        built = head_matrices(cell, cell.seeds if cell.heads_per_seed else cell.seeds[:1])
        lambdas = np.broadcast_to(built.strengths, (n_seeds, H))
        form = built.form
        stacked = getattr(built, form.array)  # (seeds or 1, H, ...); the factored form a pair (U, e)
        values = built.values
        discarded = built.antisymmetric_share
    else:
        discarded = None
        form, stacked = Form.DENSE, _check_score_matrices(cell, score_matrices)[None]
        lambdas = np.broadcast_to(np.linalg.norm(stacked, ord=2, axis=(-2, -1)), (n_seeds, H))
    if value_matrices is not None:
        values = _check_matrices("value_matrices", value_matrices, (H, d, d))[None]
    if x0 is None:
        x_init = initial_tokens(cell, cell.seeds)
    else:
        x_init = _check_x0(cell, x0)

    times = cell.sample_times()
    # The heads in the form's field of ``Heads`` (``Form.array``).
    problem = Problem(x_init, Heads(**{form.array: stacked}, values=values), cell.attention, cell.beta,
                      cell.geometry, cell.mask, cell.ngpt_alpha)
    result = _integrate(cell, problem, times, Controller(cell.rtol, cell.atol, cell.max_steps), strict=False)
    recorded = result.variables
    failure, t_failed, reasons = _seed_failures(cell, result, times)
    failed = failure != SeedFailure.OK
    # A failed seed has nothing to certify: the certificate covers the seeds that succeeded.
    certificate, certificate_per_seed = ({}, {}) if not certify else \
        _certificate(cell, result, problem, times, skip=failed)
    if failed.all():  # nothing to certify: the cell carries no certificate (its per-seed one is NaN)
        certificate = {}

    data_vars = {}
    attention = ATTENTIONS.get(cell.attention)
    for var in variables(cell.observables):
        data_vars[var.name] = (("seed", "time") + var.dims, recorded[var.name], var.attrs(attention))
    criterion = CLUSTER_METRICS.get(cell.cluster_metric).text(cell.cluster_threshold)
    data_vars["t_cluster"] = ("seed", result.t_cluster, {
        "units": TIME_UNITS, "long_name": "clustering time",
        "description": f"first time {criterion} holds, in {FLOW_TIME}, located by bisection on the "
                       "integrator's dense output; NaN when censored",
    })
    data_vars["censored"] = ("seed", np.isnan(result.t_cluster) & ~failed, {  # a flag: CF gives it no units
        "long_name": "not clustered by t_max",
        "description": f"{criterion} never held up to t_max (False for a failed seed)",
    })
    data_vars["failed"] = ("seed", failed, {
        "long_name": "run failed",
        "description": "the seed's run failed (see failure, t_failed): its samples from t_failed on are NaN "
                       "and the reductions leave the seed out"})
    data_vars["failure"] = ("seed", failure.astype(np.int8), {
        "units": "1", "long_name": "failure kind", "description": "why the seed's run failed (0: it did not)",
        "flag_values": [f.value for f in SeedFailure],
        "flag_meanings": " ".join(f.name.lower() for f in SeedFailure)})
    data_vars["t_failed"] = ("seed", t_failed, {
        "units": TIME_UNITS, "long_name": "failure time",
        "description": f"time at which the seed's run failed, in {FLOW_TIME}; NaN where it did not"})
    if cell.stop_at_cluster:
        data_vars["t_stop"] = ("seed", result.t_stop, {
            "units": TIME_UNITS, "long_name": "stopping time",
            "description": f"where the run stopped (t_cluster, or t_max if censored), in {FLOW_TIME}; "
                           "samples after it are NaN (cluster counts -1)"})
    name, attrs = norm_variable(GEOMETRIES.get(cell.geometry).on_sphere)
    data_vars[name] = ("seed", result.norm_drift, attrs)
    data_vars.update(certificate_per_seed)
    data_vars["n_steps"] = ("seed", result.n_steps, {"units": "1", "long_name": "accepted steps",
                                                     "description": "steps the integrator accepted"})
    data_vars["n_rejected"] = ("seed", result.n_rejected, {"units": "1", "long_name": "rejected steps",
                                                           "description": "steps the integrator rejected"})
    data_vars["lam"] = (("seed", "head"), lambdas, {
        "units": "1", "long_name": "head strength",
        "description": "head strength lambda_h (operator norm for explicit heads)",
    })
    # The score matrices themselves: per seed where they are drawn, once where they are not.
    stored_heads = _STORED_HEADS[form]
    if stored_heads is not None:
        name, trailing, attrs = stored_heads
        data_vars[name] = (*_per_head(stacked, trailing), attrs)
    if discarded is not None:
        data_vars["antisymmetric_share"] = ("head", discarded, {
            "units": "1", "long_name": "discarded antisymmetric share",
            "description": "||antisym(M_h)||_F / ||M_h||_F of the trained W_Q^T W_K, discarded"})
    if values is not None and not cell.weights:
        # By its own leading axis: explicit values are shared even where the heads are drawn per seed.
        data_vars["value_matrix"] = (*_per_head(values, ("dim", "dim_col")),
                                     {"units": "1", "long_name": "value matrix",
                                      "description": "value matrix V_h used"})

    attrs = {f"cell_{k}": v for k, v in cell.to_dict().items()}
    if cell.weights:
        from .trained import digest, resolve

        attrs.update({"weights_file": str(resolve(cell.weights)), "weights_sha256": digest(cell.weights)})
    attrs.update({
        "attnflow_version": __version__,
        "x0_source": "cell" if x0 is None else "explicit",
        "heads_source": "cell" if score_matrices is None else "explicit",
        "values_source": "explicit" if value_matrices is not None else (
            cell.values if cell.values == "identity" else "heads" if values is not None
            else _ALIGNED_VALUES_SOURCE),
        "solver": "Dormand-Prince 5(4), per-trajectory error control, retraction onto the sphere",
        "engine": engine_for(cell),  # the engine that ran: numba or jax (Cell.engine may say auto)
        "engine_numerics": ENGINE_NUMERICS[engine_for(cell)],  # that engine's own numerics version
        "solver_heads_form": result.form,
        "solver_rhs_calls": int(result.n_rhs_calls.sum()),
        "solver_max_retraction": float(result.max_retraction.max()),
        **certificate,
        # Per failed seed, its error in words; "" where none failed (the pack keeps what cells share once).
        "n_seeds_failed": int(failed.sum()),
        "seed_failures": _failure_summary(cell, failure, reasons),
    })
    coords = {name: (name, values, COORDINATES[name].attrs()) for name, values in (
        ("seed", np.array(cell.seeds, dtype=np.int64)), ("time", times), ("head", np.arange(H)),
        ("token", np.arange(n)))}
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def norm_variable(on_sphere: bool) -> tuple[str, dict]:
    """The name and attributes under which a cell stores max_t,i | ||x_i|| - 1 |. On the sphere it is the
    integrator's drift off it (round-off); where the geometry moves the norms (flat space, the radii of
    pre_ln and peri_ln) the same number is dynamics, under a name of its own."""
    if on_sphere:
        return "norm_drift", {"units": "1", "long_name": "norm drift",
                              "description": "max_t,i | ||x_i|| - 1 | over the samples: the integrator's "
                                             "drift off the sphere"}
    return "norm_change", {"units": "1", "long_name": "largest change of a token's norm",
                           "description": "max_t,i | ||x_i|| - 1 | over the samples: off the sphere (flat, "
                                          "pre_ln, peri_ln) the flow moves the norms from 1 (no drift)"}


def _integrate(cell, problem: Problem, times, controller: Controller, strict=True):
    """The cell's engine on ``problem`` with the cell's samples and criterion: the one spelling of the
    call (the certificate's rerun differs in the controller and the seeds alone). ``strict``: a
    trajectory that fails raises ``IntegrationError``; else it comes back with its ``status``."""
    return solver_for(cell)(problem, controller, SaveAt(times, cell.observables, cell.cluster_eps),
                            ClusterEvent(cell.cluster_metric, cell.cluster_threshold, cell.stop_at_cluster),
                            strict=strict)


class SeedFailure(IntEnum):
    """Why a seed's run failed (the stored ``failure``; CF ``flag_values``/``flag_meanings``)."""

    OK = 0
    STEP_SIZE_UNDERFLOW = 1  # the engine's Status.UNDERFLOW: non-finite or stiff
    STEP_BUDGET_EXHAUSTED = 2  # the engine's Status.BUDGET: max_steps spent
    NON_FINITE_VALUES = 3  # a recorded variable not finite where the run reached
    LEFT_THE_SPHERE = 4  # | ||x_i|| - 1 | above _MAX_SPHERE_DRIFT


def _seed_failures(cell, result, times):
    """Per seed: ``SeedFailure`` code, time of failure (NaN where none) and the error in words.

    The engine's failures (step budget, step-size underflow) stop a trajectory at ``t_stop``, its
    later samples already NaN; a non-finite recorded value fails its seed at the first sample
    holding one, and the samples from there on are blanked here; a drift off the sphere (measured
    over the whole run) fails the seed at the end of its run. A failed seed keeps its samples
    before the failure: what it computed there is right, and the reductions leave it out anyway.
    """
    failure = np.zeros(cell.n_seeds, dtype=np.int8)
    t_failed = np.full(cell.n_seeds, np.nan)
    reasons = [""] * cell.n_seeds
    for b in np.flatnonzero(result.status != 0):
        failure[b] = SeedFailure(int(result.status[b]))  # the engine's codes, the same numbers
        t_failed[b] = result.t_stop[b]
        reasons[b] = (f"{failure_reason(result.status[b], cell.max_steps)} at t = {result.t_stop[b]:.6g} "
                      f"of {times[-1]:g}")
    floats = [v for v in result.variables.values() if v.dtype.kind == "f"]
    # Where every seed reached the end, a finite sum says every entry is finite in one pass (no mask): the
    # common case, a tenth of a small cell's call otherwise (bench_peers' S).
    clean = not result.status.any() and all(np.isfinite(np.add.reduce(v, axis=None)) for v in floats)
    measured = times[None, :] <= result.t_stop[:, None]  # (seed, time): samples the run reached
    first_bad = np.full(cell.n_seeds, times.size)
    bad_name = [""] * cell.n_seeds
    for name, v in ({} if clean else result.variables).items():
        if v.dtype.kind != "f":
            continue
        bad = ~np.isfinite(v).reshape(v.shape[:2] + (-1,)).all(-1) & measured
        for b in np.flatnonzero(bad.any(1)):
            k = int(np.argmax(bad[b]))
            if k < first_bad[b]:
                first_bad[b], bad_name[b] = k, name
    for b in np.flatnonzero(first_bad < times.size):
        k = first_bad[b]
        if failure[b] == SeedFailure.OK or times[k] < t_failed[b]:
            failure[b], t_failed[b] = SeedFailure.NON_FINITE_VALUES, times[k]
            reasons[b] = f"non-finite values in {bad_name[b]} at t = {times[k]:.6g} of {times[-1]:g}"
        for v in result.variables.values():
            v[b, k:] = np.nan if v.dtype.kind == "f" else -1
    if GEOMETRIES.get(cell.geometry).unit_rows:  # the tokens, or their directions, on the sphere
        for b in np.flatnonzero((result.norm_drift > _MAX_SPHERE_DRIFT) & (failure == SeedFailure.OK)):
            failure[b], t_failed[b] = SeedFailure.LEFT_THE_SPHERE, result.t_stop[b]
            reasons[b] = f"tokens left the sphere (drift {result.norm_drift[b]:.3g})"
    return failure, t_failed, reasons


def _failure_summary(cell, failure, reasons) -> str:
    """The failed seeds in one line, by kind of error: ``"3 of 16 seeds failed: step budget of 100
    exhausted (seeds 2, 5, 9; the first at t = 3.1 of 8)"``; ``""`` when none did."""
    failed = np.flatnonzero(failure != SeedFailure.OK)
    if not failed.size:
        return ""
    by_kind: dict[str, list] = {}
    for b in failed:
        kind, _, when = reasons[b].partition(" at ")
        by_kind.setdefault(kind, []).append((int(cell.seeds[b]), when))
    parts = []
    for kind, seeds in by_kind.items():
        listed = ", ".join(str(seed) for seed, _ in seeds[:5]) + (", ..." if len(seeds) > 5 else "")
        first = f"; the first at {seeds[0][1]}" if seeds[0][1] else ""
        parts.append(f"{kind} (seed{'s' if len(seeds) > 1 else ''} {listed}{first})")
    return f"{failed.size} of {cell.n_seeds} seeds failed: " + "; ".join(parts)


class Certified(IntEnum):
    """How a seed's certificate was obtained, or why it has none (the stored ``certificate_flag``; CF
    ``flag_values``/``flag_meanings``). Every seed not ``LOOSER`` or ``TIGHTER`` stores NaN."""

    FAILED_SEED = 0  # the seed's own run failed: nothing to certify
    LOOSER = 1  # the deviation from a looser run whose steps followed the tolerance
    TIGHTER = 2  # CERTIFICATE_SAFETY times the deviation from a tighter run whose steps followed it
    STEPS_IGNORE_TOLERANCE = 3  # neither companion's step count moved with its tolerance (stability-limited)
    COMPANION_FAILED = 4  # the tighter companion run failed (step budget, step-size underflow)
    NO_TIGHTER_TOLERANCE = 5  # rtol too close to MIN_RTOL for a measurably tighter run
    SATURATED = 6  # the runs differ by more than CERTIFICATE_SATURATION of a variable's scale


def _steps_per_time(result, times) -> np.ndarray:
    """Accepted steps per unit of the time a run covered (runs that stop at their criterion stop apart)."""
    return result.n_steps / np.maximum(result.t_stop - times[0], np.finfo(float).tiny)


def _companion(cell, problem, seeds, times, result, looser: bool):
    """One companion run of ``seeds``: (its result, its rtol, per seed whether its step count followed the
    tolerance, per seed whether it failed)."""
    if looser:
        rtol, atol, max_steps = cell.rtol * CERTIFICATE_LOOSER, cell.atol * CERTIFICATE_LOOSER, cell.max_steps
    else:
        rtol, atol = max(cell.rtol / CERTIFICATE_TIGHTER, MIN_RTOL), cell.atol / CERTIFICATE_TIGHTER
        # Clamped to int64, the engine's step counter (Cell allows max_steps up to its maximum).
        max_steps = min(_CERTIFICATE_STEP_FACTOR * cell.max_steps, INT64_MAX)
    rows = problem if seeds.size == result.n_steps.size else problem.rows(seeds)  # every seed: no copies
    companion = _integrate(cell, rows, times, Controller(rtol, atol, max_steps), strict=False)
    failed = companion.status != 0
    # DOPRI5 sizes its steps like tol^(1/5) where accuracy limits them: the companion's step count over
    # the stored run's is then (rtol ratio)^(-1/5) (0.63 looser, 2.5 tighter). Where it stays near 1 the
    # step is limited by stability, both runs err alike, and their deviation measures nothing
    # (docs/model.md, Numerics).
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = _steps_per_time(companion, times) / _steps_per_time(result, times)[seeds]
        moved = np.log(ratio) / np.log((rtol / cell.rtol) ** -0.2) >= (
            _STEPS_MOVED_LOOSER if looser else _STEPS_MOVED_TIGHTER)
    moved |= result.n_steps[seeds] == 0  # no step taken (clustered at t = 0 and stopped): nothing to follow
    return companion, rtol, moved & ~failed, failed


def _certificate(cell, result, problem: Problem, times, skip=None) -> tuple[dict, dict]:
    """The accuracy certificate of every seed (see ``simulate`` and the constants above).

    Returns the store's attrs and its per-seed variables ``certificate_error`` and ``certificate_flag``
    (``Certified``). Seeds in ``skip`` (a boolean per seed: failed runs) and seeds with no finite
    recorded sample are not integrated again and certify nothing (NaN). A smooth field's seeds get a
    looser companion; those whose steps did not follow its tolerance, and every relu seed, a tighter one;
    a seed whose tighter companion's steps did not follow it either, or whose companion failed, is
    uncertified (NaN, and ``certificate_flag`` says why), as is the cell's ``certificate_error``.
    Integer variables (the cluster count) are left out: a count flips when a pair sits at the threshold,
    whatever the accuracy.
    """
    smooth = ATTENTIONS.get(cell.attention).smooth
    looser = smooth and cell.rtol * CERTIFICATE_LOOSER <= _LOOSEST_COMPANION_RTOL
    measured = _has_samples(result.variables) & (True if skip is None else ~np.asarray(skip, dtype=bool))
    errors = np.full(cell.n_seeds, np.nan)
    variable = np.full(cell.n_seeds, "", dtype=object)  # per seed, the variable its certificate comes from
    flags = np.full(cell.n_seeds, Certified.FAILED_SEED, dtype=np.int8)
    out = {"certificate_route": "looser" if looser else "tighter", "certificate_seeds": int(measured.sum()),
           "certificate_rhs_calls": 0}
    reasons = {}
    pending = np.flatnonzero(measured)
    certified = {v.name for v in variables(cell.observables) if v.certified and v.dtype.startswith("float")}
    for route in ((True, False) if looser else (False,)):
        if not pending.size:
            break
        if not route and max(cell.rtol / CERTIFICATE_TIGHTER, MIN_RTOL) > cell.rtol / CERTIFICATE_LOOSER:
            # MIN_RTOL leaves no measurably better run
            flags[pending] = Certified.NO_TIGHTER_TOLERANCE
            reasons[Certified.NO_TIGHTER_TOLERANCE] = f"rtol {cell.rtol:g}: no tighter run above {MIN_RTOL:g}"
            break
        companion, rtol, moved, failed = _companion(cell, problem, pending, times, result, route)
        out["certificate_looser_rtol" if route else "certificate_tighter_rtol"] = rtol
        out["certificate_rhs_calls"] += int(companion.n_rhs_calls.sum())
        done = pending[moved]
        if done.size:
            errors[done], variable[done] = _deviations(result, companion, moved, done, route, certified)
        flags[done] = Certified.LOOSER if route else Certified.TIGHTER
        saturated = done[errors[done] > CERTIFICATE_SATURATION]
        if saturated.size:
            flags[saturated], errors[saturated] = Certified.SATURATED, np.nan
            reasons[Certified.SATURATED] = (f"runs differ by more than {CERTIFICATE_SATURATION:g} of a "
                                            "variable's scale, where errors stop following the tolerance")
        if not route:  # the last companion: what it did not certify is uncertified
            for kind, which, reason in (
                    (Certified.STEPS_IGNORE_TOLERANCE, ~moved & ~failed,
                     "steps did not follow the tolerance (stability-limited): no companion measures the "
                     "error"),
                    (Certified.COMPANION_FAILED, failed, "its companion run failed (step budget or step-size "
                                                         "underflow)")):
                flags[pending[which]] = kind
                if which.any():
                    reasons[kind] = reason
        pending = pending[~moved]  # a failed looser companion: the tighter one may still certify
    out["certificate_rtol"] = out.get("certificate_looser_rtol" if looser else "certificate_tighter_rtol",
                                      float("nan"))
    certified = np.isin(flags, (Certified.LOOSER, Certified.TIGHTER))
    uncertified = measured & ~certified
    out["certificate_uncertified"] = int(uncertified.sum())
    per_seed = {
        "certificate_error": ("seed", errors, {
            "units": "1", "long_name": "accuracy certificate",
            "description": "accuracy certificate of this seed: the largest deviation of a recorded variable "
                           "from a companion run (certificate_flag says which; a tighter one's times "
                           f"{CERTIFICATE_SAFETY:g}), relative to the variable's largest |value| in this "
                           "seed (docs/model.md, Numerics); NaN: not certified (certificate_flag says why)"}),
        "certificate_flag": ("seed", flags, {
            "units": "1", "long_name": "accuracy certificate route",
            "description": "how the seed was certified, or why it was not (docs/model.md, Numerics)",
            "flag_values": [f.value for f in Certified],
            "flag_meanings": " ".join(f.name.lower() for f in Certified)}),
    }
    if not measured.any():
        return {**out, "certificate_error": float("nan"), "certificate_variable": "no seed to certify"}, \
            per_seed
    if uncertified.any():
        first = int(np.flatnonzero(uncertified)[0])
        return {**out, "certificate_error": float("nan"), "certificate_seed": int(cell.seeds[first]),
                "certificate_variable": f"{int(uncertified.sum())} of {int(measured.sum())} seeds "
                                        "uncertified: " + "; ".join(reasons.values())}, per_seed
    worst = int(np.nanargmax(np.where(certified, errors, -np.inf)))
    return {**out, "certificate_error": float(errors[worst]),
            "certificate_variable": variable[worst],
            "certificate_seed": int(cell.seeds[worst])}, per_seed


def _deviations(result, companion, rows, seeds, looser, certified):
    """Per seed of ``seeds`` (the companion's ``rows``): its certificate and the variable it comes from;
    ``certified``: the names of the float variables the certificate covers."""
    # Every seed, every row (the common case): the arrays themselves, not copies.
    every = seeds.size == result.n_steps.size and rows.all()
    take = (lambda a, _: a) if every else (lambda a, index: a[index])  # noqa: E731
    pairs = {name: (take(result.variables[name], seeds), take(companion.variables[name], rows))
             for name in companion.variables if name in certified}
    pairs["t_cluster"] = (take(result.t_cluster, seeds), take(companion.t_cluster, rows))
    names = list(pairs)
    # The scale is the more accurate run's: the stored one against a looser companion.
    deviations = np.stack([seed_deviations(*(pairs[name][::-1] if looser else pairs[name]),
                                           censoring=name == "t_cluster") for name in names])
    safety = 1.0 if looser else CERTIFICATE_SAFETY
    return safety * deviations.max(axis=0), np.array(names, dtype=object)[deviations.argmax(axis=0)]


def _has_samples(recorded) -> np.ndarray:
    """Per seed: some recorded float sample is finite (a failed run records none)."""
    floats = [v for v in recorded.values() if v.dtype.kind == "f"]
    return np.logical_or.reduce([np.isfinite(v).reshape(v.shape[0], -1).any(axis=1) for v in floats])


def seed_deviations(got, ref, *, censoring: bool = False) -> np.ndarray:
    """Per seed (the leading axis): ``max |got - ref| / scale`` over the entries finite in both,
    ``scale = max |ref|`` there (floored at ``CERTIFICATE_SCALE_FLOOR``); 0 where nothing is finite in both.

    ``censoring`` (for ``t_cluster``): a seed finite in one and not the other (clustered in one
    integration only) counts 1. Per-sample variables leave such entries out: a run that stops at
    its clustering criterion ends at the end of an integrator step, which moves with the tolerance.
    """
    got, ref = np.asarray(got, dtype=float), np.asarray(ref, dtype=float)
    got, ref = got.reshape(got.shape[0], -1), ref.reshape(ref.shape[0], -1)
    if np.isfinite(np.add.reduce(got, axis=None) + np.add.reduce(ref, axis=None)):
        # Every entry finite (a finite sum says so in one pass): no masks, the same numbers.
        scale = np.maximum(np.abs(ref).max(axis=1), CERTIFICATE_SCALE_FLOOR)
        return np.abs(got - ref).max(axis=1) / scale
    both = np.isfinite(got) & np.isfinite(ref)
    magnitude = np.where(both, np.abs(ref), 0.0).max(axis=1)
    scale = np.maximum(magnitude, CERTIFICATE_SCALE_FLOOR)
    deviation = np.where(both, np.abs(got - ref), 0.0).max(axis=1) / scale
    if censoring:
        deviation[np.any(np.isfinite(got) != np.isfinite(ref), axis=1)] = 1.0
    return deviation


def _per_head(array, trailing):
    """Dims and data of a stored (seeds or 1, H, ...) array: per seed, or once where the seeds share it."""
    if array.shape[0] > 1:
        return ("seed", "head") + trailing, array
    return ("head",) + trailing, array[0]


def describe(cell: Cell) -> str:
    """A one-line identification of a cell for error messages."""
    keys = ("H", "n", "d", "beta", "attention", "mask", "heads", "lambda_dist", "init", "geometry")
    return "cell(" + ", ".join(f"{k}={getattr(cell, k)!r}" for k in keys) + f", seeds={list(cell.seeds)})"


def _as_real(name, a):
    try:
        a = np.asarray(a)
    except ValueError as err:  # a ragged nesting of lists
        raise ValueError(f"{name}: not an array of one shape ({err})") from None
    if np.iscomplexobj(a):
        raise ValueError(f"{name}: complex entries; the model is real")
    if not np.issubdtype(a.dtype, np.number) or a.dtype == bool:
        raise ValueError(f"{name}: dtype {a.dtype} is not a real number type")
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite entries")
    return a


def _check_matrices(name, a, shape):
    a = _as_real(name, a)
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape} does not match (H, d, d) = {shape}")
    return a


def _check_score_matrices(cell, m):
    m = _check_matrices("score_matrices", m, (cell.H, cell.d, cell.d))
    asym = np.max(np.abs(m - np.swapaxes(m, -1, -2)))
    if asym > _SYMMETRY_TOLERANCE * max(1.0, np.max(np.abs(m))):
        raise ValueError(f"score_matrices: not symmetric (max |M - M^T| = {asym:.3g}); "
                         "the gradient-flow structure needs symmetric M_h")
    worst = cell.beta * np.max(np.linalg.norm(m, ord=2, axis=(-2, -1)))
    if worst > MAX_EXPONENT:
        raise ValueError(f"score_matrices: beta * max ||M_h|| = {worst:.4g} exceeds "
                         f"{MAX_EXPONENT:g}; exp(beta s) would overflow float64")
    return m


def _check_x0(cell, x0):
    x0 = _as_real("x0", x0)
    if x0.shape == (cell.n, cell.d):
        x0 = np.broadcast_to(x0, (cell.n_seeds, cell.n, cell.d))
    if x0.shape != (cell.n_seeds, cell.n, cell.d):
        raise ValueError(f"x0: shape {x0.shape}, expected (n, d) = {(cell.n, cell.d)} "
                         f"or (seeds, n, d) = {(cell.n_seeds, cell.n, cell.d)}")
    x0 = np.array(x0)
    geometry = GEOMETRIES.get(cell.geometry)
    if geometry.radii and np.any(np.linalg.norm(x0, axis=-1) == 0.0):
        raise ValueError(f"x0: a token of norm 0 has no direction (geometry {cell.geometry}: "
                         "x_k = r_k theta_k)")
    if geometry.on_sphere:
        off = np.max(np.abs(np.linalg.norm(x0, axis=-1) - 1.0))
        if off > _SPHERE_TOLERANCE:
            raise ValueError(f"x0: tokens are not on the unit sphere (max | ||x_i|| - 1 | = {off:.3g})")
        x0 = unit_rows(x0)
    return x0
