"""The accuracy certificate of every seed of a cell (docs/model.md, "Numerics"): companion runs of the
seeds and the deviation of their recorded variables from the stored run's."""

from __future__ import annotations

import dataclasses
from enum import IntEnum

import numpy as np

from . import resources
from .attention import ATTENTIONS
from .cell import INT64_MAX, MIN_RTOL
from .contract import Controller, Problem
from .engines import integrate
from .observables import GROUPS, canonical_groups, variables

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
# Where neither companion's steps followed its tolerance (stability sizes the stored run's steps), the capped
# companion: the tighter tolerance, and no step longer than CERTIFICATE_CAP times the seed's mean step
# (one run a group of seeds whose caps lie within a factor sqrt 2, at the group's smallest cap: each seed's
# 0.5-0.7 of its mean, near 0.7 where a cell's seeds step alike; a grid of caps sqrt 2 apart before
# NUMERICS_VERSION 8 put most seeds near 0.5 and cost 1.76 of the run's evaluations, not 1.37-1.39).
# Where the stored run's steps sit at the edge of the method's stability region, its steps sit well
# inside, and where accuracy sizes them, its error test is 100 times tighter: its error is then far below
# the stored run's, and CERTIFICATE_SAFETY times their deviation bounds the stored error wherever its own
# is at most half of it (measured: certificate / true error 1.98-2.03 on three of config/paper.yaml's
# metastability cells at t_max 30,000, three seeds each, none of which the other companions certified;
# tests/test_certificate.py at t_max 10,000). 0.7, not 0.5: the same ratios to three digits on those cells
# and the usa seed of tests/test_certificate.py's matrix that takes this route (its error is as negligible
# either way; a step at 0.7 of DOPRI5's stability edge damps a stiff mode as one at 0.5 does, |R(z)| ~ 0.2
# on the negative axis) for 1.76 of the stored run's field evaluations instead of 2.49 (on the grid of caps
# before 8). A cell the cost model says stability sizes (resources.stability_sized) gets it alone: the
# others' steps cannot move.
CERTIFICATE_CAP = 0.7
_CAP_GROUP_SPAN = np.sqrt(2.0)
# Where two runs differ by this much of a variable's largest value, the error no longer follows the
# tolerance (it saturates at the size of the variable): measured, a looser companion then read 2.7x under a
# seed's error (usa, beta 6, rtol 1e-3). Such a seed is uncertified; the cell is far above CERTIFICATE_BOUND.
CERTIFICATE_SATURATION = 0.1


class Certified(IntEnum):
    """How a seed's certificate was obtained, or why it has none (the stored ``certificate_flag``; CF
    ``flag_values``/``flag_meanings``). Every seed not ``LOOSER``, ``TIGHTER`` or ``CAPPED`` stores NaN."""

    FAILED_SEED = 0  # the seed's own run failed: nothing to certify
    LOOSER = 1  # the deviation from a looser run whose steps followed the tolerance
    TIGHTER = 2  # CERTIFICATE_SAFETY times the deviation from a tighter run whose steps followed it
    STEPS_IGNORE_TOLERANCE = 3  # neither companion's step count moved with its tolerance (stability-limited)
    COMPANION_FAILED = 4  # the tighter companion run failed (step budget, step-size underflow)
    NO_TIGHTER_TOLERANCE = 5  # rtol too close to MIN_RTOL for a measurably tighter run
    SATURATED = 6  # the runs differ by more than CERTIFICATE_SATURATION of a variable's scale
    CAPPED = 7  # CERTIFICATE_SAFETY times the deviation from a tighter run with capped steps


def _compared(cell) -> tuple[str, ...]:
    """The cell's observable groups with a variable the certificate compares (``_certified``): a companion
    records only these. Left out: ``energy_path`` (a field evaluation at every accepted step, 1 in 7 of
    the companion's, for a least over the integrator's own steps) and ``clusters`` (a count)."""
    certified = _certified(cell)
    return tuple(g for g in canonical_groups(cell.observables)
                 if any(v.name in certified for v in GROUPS.get(g).variables))


def _certified(cell) -> set[str]:
    """The names of the recorded float variables the certificate covers (an integer count flips when a
    pair sits at the threshold, whatever the accuracy)."""
    return {v.name for v in variables(cell.observables) if v.certified and v.dtype.startswith("float")}


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
    companion = integrate(cell, rows, times, Controller(rtol, atol, max_steps), strict=False,
                          groups=_compared(cell))
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


def _capped(cell, problem, seeds, times, result):
    """The capped companion runs of ``seeds`` (``CERTIFICATE_CAP``), as ``_companion`` returns them: (a
    result per seed's row, assembled from one run a group of seeds with the same cap, its rtol, per seed
    whether its steps were capped and whether it failed)."""
    rtol, atol = max(cell.rtol / CERTIFICATE_TIGHTER, MIN_RTOL), cell.atol / CERTIFICATE_TIGHTER
    max_steps = min(_CERTIFICATE_STEP_FACTOR * cell.max_steps, INT64_MAX)
    cap = CERTIFICATE_CAP / _steps_per_time(result, times)[seeds]
    groups = _compared(cell)
    parts = []
    for group in _cap_groups(cap):
        rows = problem.rows(seeds[group])
        run = integrate(cell, rows, times, Controller(rtol, atol, max_steps, max_step=cap[group].min()),
                        strict=False, groups=groups)
        parts.append((group, run))
    companion = _assemble(parts, seeds.size)
    failed = companion.status != 0
    # Every step at most CERTIFICATE_CAP of the seed's mean: at least 1/CERTIFICATE_CAP of its steps.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = _steps_per_time(companion, times) / _steps_per_time(result, times)[seeds]
    return companion, rtol, (ratio >= 0.95 / CERTIFICATE_CAP) & ~failed, failed


def _cap_groups(cap) -> list[np.ndarray]:
    """Seeds whose caps lie within ``_CAP_GROUP_SPAN`` of the smallest among them, one run a group at that
    smallest cap (each seed's at most its own): from the smallest cap up."""
    if not np.all(cap > 0.0):  # a cap is 0.7 over steps per unit time: > 0 (inf for no step), never NaN
        raise ValueError(f"capped companion: caps must be > 0, got {cap[~(cap > 0.0)][:3]}")
    order = np.argsort(cap, kind="stable")
    groups, start = [], 0
    while start < order.size:
        end = start + int(np.searchsorted(cap[order[start:]], cap[order[start]] * _CAP_GROUP_SPAN, "right"))
        groups.append(np.sort(order[start:end]))
        start = end
    return groups


def _assemble(parts, size):
    """One result of ``size`` rows from ``(rows, result)`` parts (the capped companion's groups)."""
    first = parts[0][1]

    def gather(get):
        out = None
        for rows, run in parts:
            value = np.asarray(get(run))
            if out is None:
                out = np.empty((size,) + value.shape[1:], dtype=value.dtype)
            out[rows] = value
        return out

    per_row = [f.name for f in dataclasses.fields(first) if isinstance(getattr(first, f.name), np.ndarray)]
    return dataclasses.replace(
        first, variables={name: gather(lambda r, k=name: r.variables[k]) for name in first.variables},
        **{name: gather(lambda r, k=name: getattr(r, k)) for name in per_row})


def companion_routes(cell) -> tuple[str, ...]:
    """The companions a cell's seeds may take, in order (``certify_seeds``): looser (a smooth field with
    room below rtol = 1), tighter, capped; the capped one alone where the cost model expects stability to
    size the steps, which the others' could not follow."""
    if resources.stability_sized(cell):
        return ("capped",)
    smooth = ATTENTIONS.get(cell.attention).smooth
    if smooth and cell.rtol * CERTIFICATE_LOOSER <= _LOOSEST_COMPANION_RTOL:
        return ("looser", "tighter", "capped")
    return ("tighter", "capped")


def certify_seeds(cell, result, problem: Problem, times, skip=None) -> tuple[dict, dict]:
    """The accuracy certificate of every seed (see ``simulate`` and the constants above).

    Returns the store's attrs and its per-seed variables ``certificate_error`` and ``certificate_flag``
    (``Certified``). Seeds in ``skip`` (a boolean per seed: failed runs) and seeds with no finite
    recorded sample are not integrated again and certify nothing (NaN). A smooth field's seeds get a
    looser companion; those whose steps did not follow its tolerance, and every relu seed, a tighter one;
    those whose steps did not follow that either, the capped one (``CERTIFICATE_CAP``), which is all a
    cell gets where the cost model says stability sizes its steps. A seed whose companion failed, or
    whose capped companion's steps did not move either, is uncertified (NaN, and ``certificate_flag``
    says why), as is the cell's ``certificate_error``.
    Integer variables (the cluster count) are left out: a count flips when a pair sits at the threshold,
    whatever the accuracy.
    """
    routes = companion_routes(cell)
    measured = _has_samples(result.variables) & (True if skip is None else ~np.asarray(skip, dtype=bool))
    errors = np.full(cell.n_seeds, np.nan)
    variable = np.full(cell.n_seeds, "", dtype=object)  # per seed, the variable its certificate comes from
    flags = np.full(cell.n_seeds, Certified.FAILED_SEED, dtype=np.int8)
    out = {"certificate_route": routes[0], "certificate_seeds": int(measured.sum()),
           "certificate_rhs_calls": 0}
    reasons = {}
    pending = np.flatnonzero(measured)
    certified = _certified(cell)
    no_room = max(cell.rtol / CERTIFICATE_TIGHTER, MIN_RTOL) > cell.rtol / CERTIFICATE_LOOSER
    for route in routes:
        if not pending.size:
            break
        if route != "looser" and no_room:
            # MIN_RTOL leaves no measurably better run
            flags[pending] = Certified.NO_TIGHTER_TOLERANCE
            reasons[Certified.NO_TIGHTER_TOLERANCE] = f"rtol {cell.rtol:g}: no tighter run above {MIN_RTOL:g}"
            break
        if route == "capped":
            companion, rtol, moved, failed = _capped(cell, problem, pending, times, result)
        else:
            companion, rtol, moved, failed = _companion(cell, problem, pending, times, result,
                                                        route == "looser")
        out[f"certificate_{route}_rtol"] = rtol
        out["certificate_rhs_calls"] += int(companion.n_rhs_calls.sum())
        done = pending[moved]
        if done.size:
            errors[done], variable[done] = _deviations(result, companion, moved, done, route == "looser",
                                                       certified)
        flags[done] = {"looser": Certified.LOOSER, "tighter": Certified.TIGHTER,
                       "capped": Certified.CAPPED}[route]
        saturated = done[errors[done] > CERTIFICATE_SATURATION]
        if saturated.size:
            flags[saturated], errors[saturated] = Certified.SATURATED, np.nan
            reasons[Certified.SATURATED] = (f"runs differ by more than {CERTIFICATE_SATURATION:g} of a "
                                            "variable's scale, where errors stop following the tolerance")
        # A failed looser companion leaves the tighter one to try; any other failure is final, and what
        # the last companion did not certify is uncertified.
        none = np.zeros_like(failed)
        final_failure = failed if route != "looser" else none
        ignored = ~moved & ~failed if route == routes[-1] else none
        for kind, where, reason in (
                (Certified.COMPANION_FAILED, final_failure,
                 "its companion run failed (step budget or step-size underflow)"),
                (Certified.STEPS_IGNORE_TOLERANCE, ignored,
                 "steps did not follow the tolerance nor the cap: no companion measures the error")):
            flags[pending[where]] = kind
            if where.any():
                reasons[kind] = reason
        pending = pending[~moved & ~final_failure]
    out["certificate_rtol"] = out.get(f"certificate_{routes[0]}_rtol", float("nan"))
    certified = np.isin(flags, (Certified.LOOSER, Certified.TIGHTER, Certified.CAPPED))
    uncertified = measured & ~certified
    out["certificate_uncertified"] = int(uncertified.sum())
    per_seed = _per_seed_variables(errors, flags)
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


def _per_seed_variables(errors, flags) -> dict:
    """The store's per-seed ``certificate_error`` and ``certificate_flag``."""
    return {
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
