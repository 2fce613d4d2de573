"""Which seeds of a cell's run failed, when and why: the stored ``failure``, ``t_failed`` and the
``seed_failures`` line (``simulate``)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .contract import failure_reason
from .geometry import GEOMETRIES

# Largest | ||x_i|| - 1 | accepted on the sphere: the retraction keeps it at round-off.
MAX_SPHERE_DRIFT = 1e-10


class SeedFailure(IntEnum):
    """Why a seed's run failed (the stored ``failure``; CF ``flag_values``/``flag_meanings``)."""

    OK = 0
    STEP_SIZE_UNDERFLOW = 1  # the engine's Status.UNDERFLOW: non-finite or stiff
    STEP_BUDGET_EXHAUSTED = 2  # the engine's Status.BUDGET: max_steps spent
    NON_FINITE_VALUES = 3  # a recorded variable not finite where the run reached
    LEFT_THE_SPHERE = 4  # | ||x_i|| - 1 | above MAX_SPHERE_DRIFT


def seed_failures(cell, result, times):
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
        for b in np.flatnonzero((result.norm_drift > MAX_SPHERE_DRIFT) & (failure == SeedFailure.OK)):
            failure[b], t_failed[b] = SeedFailure.LEFT_THE_SPHERE, result.t_stop[b]
            reasons[b] = f"tokens left the sphere (drift {result.norm_drift[b]:.3g})"
    return failure, t_failed, reasons


def failure_summary(cell, failure, reasons) -> str:
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
