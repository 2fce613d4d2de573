"""What a simulation job asks the cluster for: memory and runtime from a measured cost model.

Memory counts everything a job holds at its peak, the write of its largest
store: the interpreter and libraries with the compiled kernels loaded
(measured), the recorded variables (from their declarations), the score matrices, the
engine's per-thread buffers, and the encoded copy zarr makes while writing.
Runtime counts field evaluations (steps grow with the stiffness beta ||M_h||,
and exponentially for unnormalised usa weights) times their floating-point
work, at a throughput measured on the engine benchmark, plus start-up.
Both are checked against measured peaks and runtimes of the largest cell of
each shipped config (tests/test_resources.py); a retry asks for more
(``attempt``).

A job whose cells run on the JAX engine asks for one GPU (``gpu_request``):
Snakemake's ``gpu`` resource, which ``--resources gpu=1`` caps on one machine
and snakemake-executor-plugin-slurm turns into ``--gpus=1``. Which engine a
cell takes in a job is ``job_engine``: ``engines.engine_for``'s rule, with the
GPU the workflow gives its jobs instead of the one this process would see.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
import re
import subprocess
import sys
from collections import namedtuple
from collections.abc import Iterable

import numpy as np

from .attention import ATTENTIONS
from .cell import Cell
from .heads import HEADS, VALUES, Form
from .observables import GROUPS, variables

# Measured: peak RSS of a job simulating a tiny cell: 250 MB with the compiled
# kernels cached, up to 700 MB when it compiles them (LLVM), as a fresh node does.
BASELINE_MB = 800
# A job given a GPU: jax, jaxlib, diffrax and the CUDA libraries loaded into the interpreter (peak RSS of a
# small cell on the JAX engine's CPU build: 640 MB; the CUDA build maps its libraries too, not measured
# here: the allowance is generous).
GPU_BASELINE_MB = 3000
# A job's peak over its largest cell's arrays other than the recorded variables (score matrices, the
# engine's buffers, the initial tokens): the arrays themselves and their copies while built.
ARRAY_FACTOR = 2.5
# Copies of what the cells record a job holds at its peak, the write of its store: the datasets, their
# stack by shape, the encoded bytes and zarr's buffers (tracemalloc: 3.8x at 40,000 seeds of one cell).
RECORDED_COPIES = 4
# Drawing a seeded cell's initial tokens: per seed, its own small array and generator (~400 bytes
# beyond the numbers, tracemalloc at 40,000 seeds), and the state words of its stream, which
# ``streams`` keeps for the process (~340 bytes an entry, at most STREAM_CACHE_ENTRIES of them).
DRAW_BYTES_PER_SEED = 400
STREAM_CACHE_BYTES = 340
STREAM_CACHE_ENTRIES = 1 << 16
# Measured engine throughput on one core (tests/test_resources.py keeps the
# estimate above the measured runtime): dense products run at 20-45 GFLOP/s;
# small fields are dominated by ~2 us of fixed cost per evaluation.
FLOPS_PER_SECOND = 1.0e10
SECONDS_PER_CALL = 5e-6
MEASURED_SECONDS_PER_CALL = 2e-6  # the fixed cost measured, of which SECONDS_PER_CALL is the ceiling
# Interpreter and imports (~2 s), plus compiling the kernels on a node without
# numba's cache (measured 24 s since 295a5ad, 30-45 s before; the request keeps the margin).
STARTUP_SECONDS = 90.0
SAFETY = 3.0
MIN_MINUTES = 5
# A cell whose arrays exceed this cannot run on any node we know of: refused before it is built
# (config validation, simulate()), instead of failing in a job at allocation.
MAX_CELL_BYTES = 2**40


def head_entries(cell: Cell) -> int:
    """Numbers that describe a cell's score matrices in the form its structure builds (all seeds)."""
    structure = HEADS.get(cell.heads)
    per_head = {Form.DIAGONAL: cell.d, Form.DENSE: cell.d * cell.d,
                Form.FACTORED: cell.d * rank(cell) + (cell.d * cell.d if cell.values == "trained" else 0)}
    entries = cell.H * per_head[structure.form] * (cell.n_seeds if cell.heads_per_seed else 1)
    if cell.values == "identity":  # V_h = I as (H, d, d) matrices, shared by every seed
        entries += cell.H * cell.d * cell.d
    return entries


def rank(cell: Cell) -> int:
    """The rank of each head's score matrix as the engine applies it (d but for the factored form)."""
    structure = HEADS.get(cell.heads)
    return structure.rank(cell) if structure.rank else cell.d


# What a cell's memory depends on. ``size`` is the one place that reads it from a cell; the byte counts
# below are functions of it alone, so cells of one size need the same memory (a grid of 10^5 cells has
# a handful of sizes, and config validation sizes each once).
Size = namedtuple("Size", "n_seeds n_samples n d H observables head_entries streams")


def size(cell: Cell) -> Size:
    """The ``Size`` of a cell (1.1 us: config validation takes it for every grid point)."""
    return Size(cell.n_seeds, cell.n_samples, cell.n, cell.d, cell.H, cell.observables, head_entries(cell),
                streams(cell))


def streams(cell: Cell) -> int:
    """Random streams a cell draws per seed (``attnflow.streams``): its tokens', if seeded, and its
    heads' and strengths', if drawn per seed."""
    from .tokens import INITS

    return int(INITS.get(cell.init).seeded) + (2 if cell.heads_per_seed else 0)


def _recorded(of: Size) -> int:
    sizes = {"head": of.H, "token": of.n, "dim": of.d}
    # math.prod: exact for any size (an absurd config must be sized, not overflow int64), and fast
    per_sample = sum(math.prod(sizes[d] for d in v.dims) * np.dtype(v.dtype).itemsize
                     for v in variables(of.observables))
    return of.n_seeds * of.n_samples * per_sample


def _tokens(of: Size) -> int:
    """The initial tokens, as drawn and as the engine integrates them (a contiguous or in-span copy)."""
    return 2 * of.n_seeds * of.n * of.d * 8


def _drawing(of: Size) -> int:
    """What drawing the initial tokens holds beyond them for a moment: each seed's own draw (its
    array and generator), the norms, the normalised copy."""
    return of.n_seeds * (DRAW_BYTES_PER_SEED + of.n * of.d * 8 + of.n * 8) if of.streams else 0


def _built(of: Size) -> int:
    matrices = 3 * of.head_entries * 8  # building (two copies at its peak), then stored
    buffers = 2 * (4 * of.H * of.n * of.n + 8 * of.H * of.n * of.d) * 8  # two threads
    return int(matrices + buffers)


def _held(of: Size) -> int:
    return int(_recorded(of) + _built(of) + _tokens(of))


def recorded_bytes(cell: Cell) -> int:
    """Bytes of the variables one cell records (what its store holds)."""
    return _recorded(size(cell))


def cell_bytes(cell: Cell) -> int:
    """Bytes of the arrays one cell's simulation holds: recorded variables, score matrices, buffers,
    initial tokens."""
    return _held(size(cell))


def job_bytes(cells: Iterable[Cell]) -> int:
    """Bytes a job simulating ``cells`` (one after another) holds at its peak beyond the interpreter:
    ``RECORDED_COPIES`` of what every cell records (it keeps each finished cell until it writes its
    batch's store), the largest cell's other arrays (``ARRAY_FACTOR`` of its score matrices and
    buffers, its initial tokens and what drawing them holds), and the streams' state words the
    process keeps."""
    sizes = [size(c) for c in cells]
    recorded = sum(_recorded(of) for of in sizes)
    transient = max((ARRAY_FACTOR * _built(of) + _tokens(of) + _drawing(of) for of in sizes), default=0)
    cached = min(STREAM_CACHE_ENTRIES, max((of.n_seeds * of.streams for of in sizes), default=0))
    return int(RECORDED_COPIES * recorded + transient + cached * STREAM_CACHE_BYTES)


def oversized(cell: Cell | Size) -> str | None:
    """Why a cell's arrays (or those of a cell of this ``Size``) could not fit in any machine's memory
    (``MAX_CELL_BYTES``), or None: checked before anything is allocated, by config validation and by
    ``simulate()``."""
    needed = _held(cell if isinstance(cell, Size) else size(cell))
    if needed <= MAX_CELL_BYTES:
        return None
    return (f"its arrays need {needed / 2**30:.3g} GiB (seeds x n_samples x the recorded variables, the "
            f"heads and the engine's buffers), above {MAX_CELL_BYTES / 2**30:.0f} GiB: record fewer "
            "samples, seeds or observables, or split the cell")


def memory_mb(cells: Iterable[Cell], attempt: int = 1, gpu: int = 0) -> int:
    """Peak memory request of a job simulating ``cells`` (one after another), doubled per retry: the
    interpreter's ``BASELINE_MB`` (``GPU_BASELINE_MB`` in a job given a GPU, ``gpu``) and ``job_bytes``
    (the host's copies: the JAX engine returns its results to the host)."""
    baseline = GPU_BASELINE_MB if gpu else BASELINE_MB
    return int((baseline + job_bytes(cells) / 2**20) * 2 ** (attempt - 1)) + 1


def stiffness(cell: Cell) -> float:
    """Relative step count against ``s = beta ||M||``, as the attention type declares it.

    Normalised weights keep the velocity bounded whatever beta, so steps grow like
    ``1 + log(1 + s)``; unnormalised usa weights like ``e^s`` (``attnflow.attention``).
    """
    return ATTENTIONS.get(cell.attention).stiffness(cell.beta * cell.max_score_matrix_norm)


# resources.steps over the measured steps: 6x at the median cell of the default config (at least 1.2x).
STEPS_OVER_MEASURED = 6.0
# A cell whose modelled steps exceed its budget this many times is expected to exhaust it: the model
# overstates usa's e^s stiffness (at beta = 8 it models 1.3x the default budget, where the default
# run's seeds finish), but not by 10x; at beta = 16 it is 4,000x, and every seed fails (issue 39).
STIFF_FACTOR = 10.0


def model_steps(cell: Cell) -> float:
    """The step model without the budget's cap (``steps``)."""
    return 70.0 * (1e-6 / cell.rtol) ** 0.2 * (1.0 + np.log1p(cell.t_max)) * stiffness(cell)


# An explicit method's step is bounded by stability as well as by accuracy: h <= (the edge of Dopri5's
# stability region, ~3.3) / (the flow's largest rate, which scales with the largest head strength), so a
# trajectory integrated to t_max takes at least t_max times this many steps per unit of strength, whatever
# its tolerance. Measured (softmax, scalar heads, n = 16, config/paper.yaml's metastability: d = 2,
# t_max = 30,000, beta 1 to 6): 0.76-0.77 steps per unit time at strength 1, where the accuracy model
# (model_steps) put those cells at a fifth of their steps.
STABLE_STEPS_PER_TIME = 0.75


def stable_steps(cell: Cell) -> float:
    """The steps stability alone asks of a trajectory integrated to ``t_max`` (0 for one that stops at
    its clustering criterion, whose end the model does not know)."""
    if cell.stop_at_cluster:
        return 0.0
    return STABLE_STEPS_PER_TIME * cell.t_max * cell.max_score_matrix_norm


def stability_sized(cell: Cell) -> bool:
    """Whether stability rather than accuracy is expected to size the cell's steps: the steps it asks of
    the whole horizon exceed the accuracy model's, scaled to the engine's (``STEPS_OVER_MEASURED``)."""
    return stable_steps(cell) > steps(cell) / STEPS_OVER_MEASURED


def steps(cell: Cell) -> float:
    """An upper estimate of a trajectory's accepted steps.

    A 5th-order method takes ~rtol^(-1/5) steps per unit of variation; the flow's
    variation is front-loaded (clustering, then exponential convergence), so the
    count grows like log t_max, times the stiffness. Fitted above the steps
    measured over the default config's 435 cells (2 to 44,000 steps; at least 1.2x
    each, 6x at the median), and capped by the step budget ``max_steps``.
    """
    # No trajectory takes more than its budget (accepted and rejected): e^s stiffness at usa's large
    # beta would otherwise plan 10^14 core-hours for cells that fail in seconds.
    return min(model_steps(cell), float(cell.max_steps))


def exhausts_budget(cell: Cell) -> bool:
    """Whether the cost model expects the cell's seeds to exhaust ``max_steps`` (and fail): its
    modelled steps exceed the budget ``STIFF_FACTOR`` times. Such a cell costs exactly its budget
    per seed: its step count is no longer an upper estimate."""
    return model_steps(cell) > STIFF_FACTOR * cell.max_steps


def flops_per_call(cell: Cell) -> float:
    """Floating-point work of one field evaluation of one trajectory, as the head form applies it."""
    structure = HEADS.get(cell.heads)
    form = structure.form
    aligned = VALUES.get(cell.values).aligned
    if form == Form.DIAGONAL:
        # integrated in the tokens' span where every M_h = lambda_h I and V_h = M_h
        d = min(cell.d, cell.n) if structure.isotropic and aligned else cell.d
        flops = cell.H * (cell.n * d + 4 * cell.n * cell.n * d)
    elif form == Form.FACTORED:
        r = rank(cell)
        flops = cell.H * (4 * cell.n * cell.d * r + 4 * cell.n * cell.n * r)
    else:  # Form.DENSE
        flops = cell.H * (2 * cell.n * cell.d * cell.d + 4 * cell.n * cell.n * cell.d)
    if not aligned:  # the rows V_h x_j: a d x d product per head
        flops += cell.H * 2 * cell.n * cell.d * cell.d
    return float(flops)


# Field evaluations of a step: Dopri5's seven stages, the first the last of the step before.
STEP_CALLS = 6


def sample_calls(cell: Cell) -> float:
    """Field evaluations of one trajectory besides its steps': one per sample where an observable needs
    the velocity, two to start."""
    sampled = any(GROUPS.get(g).needs_velocity for g in cell.observables)
    return (cell.n_samples if sampled else 0) + 2


def calls(cell: Cell) -> float:
    """Field evaluations of one trajectory: ``STEP_CALLS`` per step and ``sample_calls``."""
    return STEP_CALLS * steps(cell) + sample_calls(cell)


def cell_seconds(cell: Cell) -> float:
    """Expected compute time of one cell on the numba engine, one core (no margin)."""
    return cell.n_seeds * calls(cell) * (flops_per_call(cell) / FLOPS_PER_SECOND + SECONDS_PER_CALL)


def runtime_minutes(cells: Iterable[Cell], attempt: int = 1, gpu: int = 0) -> int:
    """Wall-time request of a job, in minutes: ``SAFETY`` x the model plus start-up, doubled per retry.
    In a job given a GPU (``gpu``: its ``gpu_request``) the cells on the JAX engine are priced by
    ``gpu_cell_seconds``, with their compilation."""
    cells = list(cells)
    seconds = STARTUP_SECONDS + SAFETY * sum(
        gpu_cell_seconds(c) if gpu and job_engine(c, True) == "jax" else cell_seconds(c) for c in cells)
    return max(MIN_MINUTES, int(np.ceil(seconds / 60.0))) * 2 ** (attempt - 1)


# --- the JAX engine on a GPU -------------------------------------------------------------------------
# A deliberately slow GPU for requests: float64 throughput and the fixed cost of one vmapped field
# evaluation (a kernel launch and diffrax's loop). Diffrax on one H200 (issue 40's measurements, H = 4
# dense heads, compilation excluded) ran 16x (n = 512, d = 128, 64 seeds: 0.62 s) and 18x (n = 2048,
# 16 seeds: 1.96 s) faster than this model, and 13x at n = 128 (8 seeds: 0.023 s, where the fixed cost
# dominates); a data-centre GPU of an older generation (an A100: a third of the H200's float64) stays
# within it.
GPU_FLOPS_PER_SECOND = 1.0e13
GPU_SECONDS_PER_CALL = 1e-4
# Tracing and compiling the JAX engine's integration for one static configuration (shapes, rules,
# tolerances): every cell of another n, d or seed count compiles anew. Measured on jax's CPU build, with the
# certificate's companion run: 2.6-4.8 s a cell (large.yaml's kinds of cell; docs/performance.md); twice
# that for XLA's GPU compiler, not yet measured on a GPU.
GPU_COMPILE_SECONDS = 10.0


def gpu_compute_seconds(cell: Cell) -> float:
    """Expected compute time of one cell on the JAX engine on one GPU (no margin, no compilation): its
    seeds' field evaluations run as one batch, so the fixed cost is paid per evaluation, not per seed."""
    return calls(cell) * (cell.n_seeds * flops_per_call(cell) / GPU_FLOPS_PER_SECOND + GPU_SECONDS_PER_CALL)


def gpu_cell_seconds(cell: Cell) -> float:
    """Expected time of one cell on the JAX engine on one GPU: its compilation and its compute."""
    return GPU_COMPILE_SECONDS + gpu_compute_seconds(cell)


# Cost-model seconds (numba, the host's cores) above which ``auto`` takes the GPU: the JAX engine
# compiles once per static configuration of a cell (its rules, groups, tolerances and shapes), seconds to
# tens of seconds, which a smaller cell would not win back.
AUTO_GPU_SECONDS = 30.0


def large_for_gpu(cell: Cell) -> bool:
    """Whether the cost model calls ``cell`` large enough for ``auto`` to take a GPU."""
    return cell_seconds(cell) > AUTO_GPU_SECONDS


def job_engine(cell: Cell, gpu: bool) -> str:
    """The engine ``cell`` runs on in a job given a GPU (``gpu``) or not: ``attnflow.engines.engine_for``
    on the job's machine, whose rule for ``auto`` takes the GPU when there is one and the cost model
    calls the cell large. Decided here, where the workflow plans the job: this machine may see no GPU
    (a cluster's login node), and must not wake one (``gpu_visible_here``)."""
    if cell.engine != "auto":  # an explicit choice names its engine
        return cell.engine
    return "jax" if gpu and large_for_gpu(cell) else "numba"


def gpu_request(cells: Iterable[Cell], gpus: bool, declared: int | None = None) -> int:
    """GPUs a simulate job asks for: 1 when one of its cells runs on the JAX engine (``engine: jax``, or
    ``auto`` and large where the workflow's jobs get GPUs, ``gpus``: ``jobs_get_gpus``), else 0; 0 also
    where the workflow was told it has none (``declared``: ``--resources gpu=0``: the JAX engine then
    runs on the job's CPU cores)."""
    if declared == 0:
        return 0
    return int(any(c.engine == "jax" or (c.engine == "auto" and gpus and large_for_gpu(c)) for c in cells))


def jobs_get_gpus(declared: int | None) -> bool:
    """Whether the workflow's jobs may be given a GPU: as ``--resources gpu=N`` declares (N > 0: on a
    cluster, whose login node sees none), else where jax sees one on this machine (``gpu_visible_here``)."""
    if declared is not None:
        return declared > 0
    return gpu_visible_here()


# The distributions that give jax a GPU backend: jax-cuda12-plugin, jax-cuda13-plugin, jax-rocm7-plugin...
# and the older jaxlib builds with CUDA inside (version "0.4.x+cuda12...").
_GPU_PLUGIN = re.compile(r"^jax[-_](cuda|rocm)\d*[-_](plugin|pjrt)$", re.IGNORECASE)


def _gpu_backend_installed() -> bool:
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if _GPU_PLUGIN.match(name) or (name.lower() == "jaxlib" and "cuda" in (dist.version or "")):
            return True
    return False


@functools.lru_cache(maxsize=1)
def gpu_visible_here() -> bool:
    """Whether jax sees a GPU on this machine, asked in a child process: jax's first look at a GPU
    claims most of its memory (XLA preallocates) for the life of the process, which in a workflow's
    controller, that runs no simulation, would starve its jobs. False at once without jax's GPU build."""
    from .jaxengine import available

    if not available() or not _gpu_backend_installed():
        return False
    code = "from attnflow.jaxengine import gpu_visible; print(int(gpu_visible()))"
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout.strip().endswith("1")


__all__ = ["AUTO_GPU_SECONDS", "MAX_CELL_BYTES", "Size", "calls", "cell_bytes",
           "cell_seconds", "large_for_gpu",
           "exhausts_budget", "flops_per_call", "gpu_cell_seconds", "gpu_compute_seconds", "gpu_request",
           "gpu_visible_here", "job_bytes", "job_engine", "jobs_get_gpus", "memory_mb", "model_steps",
           "oversized", "recorded_bytes", "runtime_minutes", "size", "stable_steps", "steps", "streams"]
