"""``attnflow plan``: what a sweep will cost before it is submitted.

Per experiment and in total: its cells by state (new, done, failed, stale),
its simulation jobs and how many of them will run, core-hours and wall time on
the given cores, and the largest job's memory. The numbers come from the cost
model the simulate rule asks SLURM with (``attnflow.resources``), read two ways:

- *requested*: what the rule asks for (``runtime_minutes`` and ``memory_mb``,
  attempt 1): the model times ``resources.SAFETY`` plus a start-up allowance
  that covers compiling the engine on a fresh node. This is what a cluster
  charges against an allocation.
- *expected*: the model without its margins (``cell_expected_cpu``): the stored
  run's cost, ``resources.cell_seconds`` divided by ``MODEL_OVER_CPU`` (the
  model's step count is an upper estimate by design) or, where stability
  bounds the steps (``resources.stable_steps``), those steps at the measured
  cost of a field evaluation, whichever is larger; then the accuracy
  certificate's companion run on top (``CERTIFICATE_OVER_RUN``); divided by
  the threads a cell's seeds keep busy, plus a job's measured start-up, and
  the engine's compilation once where numba's cache is empty. This is what
  the run should take; ``tests/test_plan.py`` checks it against the
  benchmarks of a measured run, and ``benchmarks/bench_workflow.py`` prints it
  against every cell's measured compute.

Aggregation and plotting (local jobs) are costed at their measured times on the
tiny config, per experiment.

Cells on the JAX engine (``engine: jax``, or ``auto`` and large where the jobs
get a GPU: ``resources.job_engine``) are costed on one GPU
(``resources.gpu_cell_seconds``, its compute scaled by ``GPU_MODEL_OVER_MEASURED``),
their jobs one at a time on a machine. Where ``auto`` would send cells to a GPU
that this machine does not have, a note says what they cost here on numba and
suggests the GPU.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from pathlib import Path

from . import resources
from .certificate import CERTIFICATE_LOOSER, CERTIFICATE_TIGHTER, companion_routes
from .ids import cell_id
from .sweep import Sweep

# A simulate job's time outside simulate() (interpreter, imports, cached kernels loaded, stores encoded
# and written, manifest): 3.9-4.0 s a job on average over the default config's 22 and config/paper.yaml's
# 69 (2-core AMD EPYC, AVX2; benchmarks/bench_workflow.py).
JOB_START_SECONDS = 4.0
# resources.cell_seconds over the measured CPU time of a cell's stored run: its field evaluations are
# CALLS_OVER_MEASURED as many as the engine's (below), and its price per evaluation a ceiling
# (resources.SECONDS_PER_CALL, FLOPS_PER_SECOND) above what the engine takes. Fitted on a 2-core AMD EPYC
# (AVX2) with the certificate priced by its route (certificate_over_run), between the two configs'
# measured compute (benchmarks/bench_workflow.py, which prints the plan's expected time of every
# experiment against the measured, to set it again): 18.3 would fit the default config's 299 s, 23.7
# config/paper.yaml's 3973 s; at 21 the plan is 11% short of one and 12% long of the other. (69 before,
# fitted on a Xeon with AVX-512 before the certificate's tighter companions; 18 before that.)
MODEL_OVER_CPU = 21.0
# The model's field evaluations (resources.calls) over those the engine made, weighted by cost over
# config/paper.yaml's cells (benchmarks/bench_plan.py: 48 measured, two seeds each): 18.2 (6x for
# clustering_time to 31x for trained heads; 0.2x for metastability's long horizons, before
# resources.stable_steps).
CALLS_OVER_MEASURED = 18.2
# The accuracy certificate's companion runs over the stored run are priced by their route
# (``certificate_over_run``), in field evaluations: their price per evaluation is the stored run's.
# The capped companion's steps over the stored run's, where stability sizes them: each seed's cap is 0.5-0.7
# of its mean step, near 0.7 (certificate.CERTIFICATE_CAP), 1.4-2x the steps (measured: 1.37-1.39x the
# field evaluations on three of config/paper.yaml's metastability cells).
CAPPED_STEPS = 1.4
# A cell expected to exhaust its step budget (resources.exhausts_budget) takes exactly that many steps
# per seed: its model is an upper estimate only in its cost per field evaluation, SECONDS_PER_CALL
# against the measured fixed cost (its stiff cells are small fields, where that cost dominates).
BUDGET_OVER_CPU = resources.SECONDS_PER_CALL / resources.MEASURED_SECONDS_PER_CALL
# Compiling the engine where numba's cache is empty (resources.STARTUP_SECONDS
# allows for it in every request), once per node and cache: measured 24 s on a Skylake-X, 38-42 s on
# an AMD Zen 4 and 46-48 s on a 2-core AMD EPYC (AVX2) with numba 0.68 (docs/performance.md). The plan
# allows for the slowest.
COMPILE_SECONDS = 48.0
# resources.gpu_compute_seconds over diffrax measured on one H200 (issue 40; H = 4 dense heads, float64,
# compilation excluded): 13x at n = 128 (8 seeds), 16x at n = 512 (64 seeds), 18x at n = 2048 (16 seeds).
# The smallest, so that a plan on another GPU errs long.
GPU_MODEL_OVER_MEASURED = 13.0
# Measured per job over the default config and config/paper.yaml (2-core AMD EPYC): aggregating an
# experiment 3-22 s (8 on average), drawing a figure 7-12 s (9 on average).
LOCAL_SECONDS = {"aggregate": 8.0, "plot": 9.0}
# The simulate rule's threads (workflow/rules/simulate.smk), unless a profile sets them.
SIMULATE_THREADS = 1
STATES = ("new", "done", "failed", "stale")
# Above this many simulate jobs, Snakemake's DAG alone costs minutes and gigabytes (measured: 157 s and
# 2.6 GB for a dry run of 100,000 one-cell batches, 18 s for the same cells in 4): plan says so.
MANY_JOBS = 10_000


def cell_states(sweep: Sweep, checksums: bool = False) -> dict[str, str]:
    """Every cell id of the sweep -> new | done | failed | stale (the cheap check of every start, or
    every byte with ``checksums``; missing, interrupted or corrupt cells are new: the next run computes
    them)."""
    from .run.health import cell_states as states_of

    return {cid: state.status if state.status in ("done", "failed", "stale") else "new"
            for cid, state in states_of(sweep, checksums).items()}


def jobs_get_gpus(sweep: Sweep, declared: int | None = None) -> bool:
    """Whether the sweep's jobs would get a GPU (``resources.jobs_get_gpus``: as ``declared``, the
    ``--resources gpu`` given, says, else where jax sees one here, asked only where a cell's engine is
    auto: no other cell's engine depends on it)."""
    if any(c.engine == "auto" for cells in sweep.batches.values() for c in cells):
        return resources.jobs_get_gpus(declared)
    return bool(declared)


@dataclasses.dataclass
class Job:
    """One simulate job (a batch): what it asks for and what it should take."""

    name: str
    cells: int
    to_compute: int
    runs: bool  # the next run executes it (cells to compute, or no manifest)
    expected_seconds: float  # start-up plus the cells it computes (the model without its margins)
    requested_minutes: int  # resources.runtime_minutes, attempt 1
    memory_mb: int  # resources.memory_mb, attempt 1
    gpu: int = 0  # resources.gpu_request: 1 where a cell runs on the JAX engine


def gpu_seconds(cell) -> float:
    """What a cell on the JAX engine should take on one GPU: its compilation, and its compute as the model
    puts it (``resources.gpu_compute_seconds``) scaled to the measured."""
    return resources.GPU_COMPILE_SECONDS + resources.gpu_compute_seconds(cell) / GPU_MODEL_OVER_MEASURED


def certificate_over_run(cell) -> float:
    """The field evaluations of a cell's accuracy certificate over its stored run's (``certificate``).

    Priced by the first of the cell's companions (``certificate.companion_routes``): one takes (its
    tolerance over the cell's)^(-1/5) as many steps where accuracy sizes them (0.63x looser, 2.5x
    tighter); the capped one, where stability sizes them, ``CAPPED_STEPS`` times them. Each measures
    every sample again. The steps are the engine's: the model's over ``STEPS_OVER_MEASURED``.
    """
    stepping = resources.STEP_CALLS * max(resources.steps(cell) / resources.STEPS_OVER_MEASURED,
                                          resources.stable_steps(cell))
    ratio = {"looser": CERTIFICATE_LOOSER ** -0.2, "tighter": CERTIFICATE_TIGHTER ** 0.2,
             "capped": CAPPED_STEPS}[companion_routes(cell)[0]]
    others = resources.sample_calls(cell)
    return (stepping * ratio + others) / (stepping + others)


def cell_expected_cpu(cell) -> float:
    """What one cell should take on the numba engine, one thread: its stored run (the accuracy model
    scaled to the measured, or the steps stability asks at the measured cost of a field evaluation,
    whichever is larger) and its certificate's companion runs (``certificate_over_run``). A cell expected
    to exhaust its step budget takes the budget per seed, and certifies nothing (its seeds fail)."""
    if resources.exhausts_budget(cell):
        return resources.cell_seconds(cell) / BUDGET_OVER_CPU
    model = resources.cell_seconds(cell)
    # The stable steps are a count, not an upper estimate: in the model's units, CALLS_OVER_MEASURED as many.
    stable = model * CALLS_OVER_MEASURED * resources.stable_steps(cell) / resources.steps(cell)
    return max(model, stable) / MODEL_OVER_CPU * (1.0 + certificate_over_run(cell))


def expected_seconds(cells, threads: int, gpu: bool = False) -> float:
    """What a simulate job computing ``cells`` on ``threads`` threads should take: its start-up, and
    each cell's expected CPU time spread over the threads its seeds can keep busy (the engine runs a
    cell's trajectories in parallel, one per thread at a time); with a GPU (``gpu``), the cells on the
    JAX engine take their time there (``resources.gpu_cell_seconds``, scaled to the measured)."""
    def seconds(c) -> float:
        if gpu and resources.job_engine(c, True) == "jax":
            return gpu_seconds(c)
        return cell_expected_cpu(c) / min(threads, c.n_seeds)

    return JOB_START_SECONDS + sum(seconds(c) for c in cells)


def stiff_notes(sweep: Sweep, states: dict[str, str], threads: int = SIMULATE_THREADS) -> list[str]:
    """Per experiment, a warning for the cells still to compute that the cost model expects to exhaust
    their step budget: how many, at which attention and beta, the compute they will spend failing,
    and the remedy."""
    notes = []
    for name, points in sweep.points.items():
        stiff = {}
        for p in points:
            cid = cell_id(p.cell)
            if states.get(cid) != "done" and resources.exhausts_budget(p.cell) and sweep.owner.get(cid):
                stiff[cid] = p.cell
        if not stiff:
            continue
        cells = list(stiff.values())
        where = sorted({(c.attention, c.beta) for c in cells}, key=lambda k: (k[0], k[1]))
        at = ", ".join(f"{a} at beta = {b:g}" for a, b in where[:4]) + (", ..." if len(where) > 4 else "")
        budgets = sorted({c.max_steps for c in cells})
        seconds = expected_seconds(cells, threads) - JOB_START_SECONDS
        notes.append(f"{name}: {len(cells)} cells are expected to exhaust their step budget (max_steps "
                     f"{', '.join(map(str, budgets))}): {at} is too stiff; their seeds will fail (stored as "
                     f"failed, not retried) after ~{_duration(seconds)} of compute; drop those values, or "
                     "raise max_steps to compute them")
    return notes


def jobs(sweep: Sweep, states: dict[str, str] | None = None, threads: int = SIMULATE_THREADS,
         gpus: bool = False, declared: int | None = None) -> dict[str, Job]:
    """Every simulate job; ``gpus``: whether the jobs get a GPU (``jobs_get_gpus``), ``declared``: the
    ``--resources gpu`` given."""
    states = cell_states(sweep) if states is None else states
    out = {}
    for name, cells in sweep.batches.items():
        todo = [c for c in cells if states[cell_id(c)] != "done"]
        runs = bool(todo) or not sweep.layout.manifest(name).exists()
        gpu = resources.gpu_request(cells, gpus, declared)
        expected = expected_seconds(todo, threads, bool(gpu and gpus))
        out[name] = Job(name, len(cells), len(todo), runs, expected,
                        resources.runtime_minutes(cells, gpu=gpu), resources.memory_mb(cells, gpu=gpu), gpu)
    return out


def gpu_notes(sweep: Sweep, states: dict[str, str], gpus: bool, threads: int, cores: int,
              gpu_slots: int = 1, declared: int | None = None) -> list[str]:
    """What the plan says of the JAX engine: the cells ``auto`` would send to a GPU this machine lacks
    (their cost here on numba, and the GPU to run them on), or the GPU time of those it sends to one."""
    todo = [c for cells in sweep.batches.values() for c in cells if states[cell_id(c)] != "done"]
    would = [c for c in todo if resources.job_engine(c, True) == "jax" and c.engine == "auto"]
    gpu_minutes = sum(gpu_seconds(c) for c in would) / 60
    notes = []
    if would and not gpus:
        numba = expected_seconds(would, threads) - JOB_START_SECONDS
        none = "no GPU is visible here" if declared is None else "the run is given none (gpu=0)"
        notes.append(f"{len(would)} cells would run on the JAX engine; {none}: on numba this "
                     f"is {threads * numba / 3600:.3g} core-hours (~{_duration(numba * threads / cores)} on "
                     f"{cores} cores); run on a machine with a GPU (pip install 'attnflow[jax-cuda]'), where "
                     f"the cost model puts them at ~{gpu_minutes:.0f} min of one GPU (with compiling each "
                     "cell's shape), or on a cluster: snakemake --profile profiles/slurm --resources gpu=N")
    elif would:
        at_once = "one GPU job at a time" if gpu_slots == 1 else f"{gpu_slots} GPU jobs at a time"
        notes.append(f"{len(would)} cells run on the JAX engine, {at_once}: ~{gpu_minutes:.0f} min of GPU "
                     "time (with compiling each cell's shape)")
    explicit = [c for c in todo if c.engine == "jax"]
    if explicit and not gpus:
        notes.append(f"{len(explicit)} cells ask for the JAX engine (engine: jax) and no GPU is visible "
                     "here: their jobs ask for one (gpu=1); run here, they run on the CPU cores (costed as "
                     "numba)")
    return notes


def makespan(durations: list[float], slots: int) -> float:
    """Wall time of independent jobs on ``slots`` parallel slots, longest first (as a scheduler
    filling free cores would, to within 4/3 of the best order)."""
    loads = [0.0] * max(1, slots)
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + d)
    return max(loads)


def makespan_beside_gpus(durations: list[tuple[float, bool]], slots: int, gpu_slots: int) -> float:
    """Wall time of jobs ``(seconds, asks for a GPU)``: those asking for a GPU run one per GPU slot
    (Snakemake's ``gpu`` resource), beside the others on ``slots``."""
    return max(makespan([s for s, gpu in durations if not gpu], slots),
               makespan([s for s, gpu in durations if gpu], gpu_slots))


def engine_cached() -> bool:
    """Whether numba's cache of the engine's kernels exists here (no compilation on the first job)."""
    where = [Path(__file__).parent / "engine" / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        where.append(Path(os.environ["NUMBA_CACHE_DIR"]))
    return any(any(p.rglob("*.nbi")) for p in where if p.is_dir())


@dataclasses.dataclass
class Plan:
    rows: dict[str, dict]  # experiment -> numbers; "total" last
    cores: int
    threads: int
    slots: int
    compile_seconds: float
    notes: list[str]


def _summarise(selected: list[Job], states: list[str], slots: int, threads: int, local_jobs: int,
               cores: int, compile_seconds: float, gpu_slots: int = 1) -> dict:
    running = [j for j in selected if j.runs]
    expected = sum(j.expected_seconds for j in running) + (compile_seconds if running else 0.0)
    local = local_jobs * sum(LOCAL_SECONDS.values())  # aggregate + plot of each experiment rebuilt
    # Jobs given a GPU run beside the others, one per GPU slot (one at a time on a machine).
    wall = makespan_beside_gpus([(j.expected_seconds, bool(j.gpu)) for j in running], slots, gpu_slots) \
        + (compile_seconds if running else 0.0)
    return {
        "cells": len(states), **{s: states.count(s) for s in STATES},
        "jobs": len(selected), "jobs_to_run": len(running),
        "core_hours": threads * expected / 3600 + local / 3600,
        "core_hours_requested": sum(threads * j.requested_minutes / 60 for j in running),
        "wall_seconds": wall + local / max(1, cores),
        "simulate_seconds": sum(j.expected_seconds for j in running) + (compile_seconds if running else 0.0),
        "max_memory_mb": max((j.memory_mb for j in selected), default=0),
        "max_runtime_minutes": max((j.requested_minutes for j in selected), default=0),
        "rebuild": bool(local_jobs),
    }


def plan(sweep: Sweep, cores: int, threads: int = SIMULATE_THREADS, compile: bool | None = None,
         cluster_jobs: int | None = None, gpus: bool | None = None, declared: int | None = None) -> Plan:
    """The cost of running ``sweep`` from its current state on ``cores`` cores (``threads`` per simulate
    job; Snakemake runs ``cores // threads`` of them at a time, or ``cluster_jobs`` on a cluster, each
    on cores of its own; queueing not counted). ``compile``: whether the engine must be compiled first
    (default: numba's cache is not found here). ``gpus``: whether the jobs get a GPU (default:
    ``jobs_get_gpus``); ``declared``: GPU jobs at once, as ``snakemake --resources gpu=N`` (0: none)."""
    gpus = jobs_get_gpus(sweep, declared) if gpus is None else gpus
    states = cell_states(sweep)
    all_jobs = jobs(sweep, states, threads, gpus, declared)
    slots = cluster_jobs or max(1, cores // threads)
    gpu_slots = declared or cluster_jobs or 1
    compile_seconds = COMPILE_SECONDS if (not engine_cached() if compile is None else compile) else 0.0
    rows = {}
    for name in sweep.specs:
        ids = list(dict.fromkeys(cell_id(p.cell) for p in sweep.points[name]))
        summary = sweep.layout.summary(name)
        selected = [all_jobs[b] for b in sweep.batches_of(name)]
        rebuild = any(j.runs for j in selected) or not summary.exists()
        rows[name] = _summarise(selected, [states[i] for i in ids], slots, threads, int(rebuild), cores,
                                compile_seconds, gpu_slots)
        rows[name]["rebuild"] = rebuild
    rebuilds = sum(1 for name in sweep.specs if rows[name]["rebuild"])
    rows["total"] = _summarise(list(all_jobs.values()), list(states.values()), slots, threads, rebuilds,
                               cores, compile_seconds, gpu_slots)
    notes = stiff_notes(sweep, states, threads)
    # the cores the jobs run on at once: a cluster's jobs, each on cores of its own, or this machine's
    notes += gpu_notes(sweep, states, gpus, threads, slots * threads, gpu_slots, declared)
    if compile_seconds:
        notes.append(f"numba's cache of the engine is not found here: {COMPILE_SECONDS:.0f} s to compile it "
                     "are counted once")
    if len(all_jobs) > MANY_JOBS:
        coarse = [n for n, spec in sweep.specs.items() if len(sweep.batches_of(n)) > MANY_JOBS / 10]
        notes.append(f"{len(all_jobs):,} simulate jobs: Snakemake's plan of that many takes minutes and "
                     "gigabytes before the first job; add grid axes to `batch_over` (more cells a job) in "
                     + (", ".join(f"experiments.{n}" for n in coarse) or "the largest experiments"))
    shared = len(sweep.batches) < sum(len(sweep.batches_of(n)) for n in sweep.specs)
    if shared:
        notes.append("experiments that share cells share their jobs: each row counts them, the total once")
    return Plan(rows, cores, threads, slots, compile_seconds, notes)


def _duration(seconds: float) -> str:
    """A wall time as a person reads it (plan and status alike)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render(result: Plan) -> str:
    head = (f"{'experiment':24} {'cells':>6}" + "".join(f" {s:>6}" for s in STATES)
            + f" {'jobs':>5} {'to run':>6} {'core-h':>8} {'requested':>10} {'wall':>8} {'max mem':>9}")
    lines = [head]
    for name, row in result.rows.items():
        if name == "total":
            lines.append("-" * len(head))
        lines.append(f"{name:24} {row['cells']:6d}" + "".join(f" {row[s]:6d}" for s in STATES)
                     + f" {row['jobs']:5d} {row['jobs_to_run']:6d} {row['core_hours']:8.3f}"
                     f" {row['core_hours_requested']:10.2f} {_duration(row['wall_seconds']):>8}"
                     f" {row['max_memory_mb']:6d} MB")
    threads = f"{result.threads} thread{'s' if result.threads > 1 else ''}"
    lines.append(f"wall: simulate jobs {result.slots} at a time ({threads} each), then "
                 f"aggregation and plotting on {result.cores} local cores. core-h: expected (the cost model "
                 "without its margins, scaled to measured runs); requested: what the simulate jobs ask "
                 "SLURM for (attempt 1). max mem: the largest simulate job's request.")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def to_json(result: Plan) -> str:
    return json.dumps(dataclasses.asdict(result), indent=1)


__all__ = ["CALLS_OVER_MEASURED", "COMPILE_SECONDS", "GPU_MODEL_OVER_MEASURED",
           "JOB_START_SECONDS", "MANY_JOBS", "MODEL_OVER_CPU", "Job", "Plan", "cell_expected_cpu",
           "certificate_over_run", "cell_states", "engine_cached", "expected_seconds", "gpu_notes",
           "gpu_seconds", "jobs", "jobs_get_gpus", "makespan", "makespan_beside_gpus", "plan", "render",
           "stiff_notes", "to_json"]
