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
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Iterable

import numpy as np

from .attention import ATTENTIONS
from .cell import Cell
from .heads import HEADS, Form
from .observables import GROUPS, variables

# Measured: peak RSS of a job simulating a tiny cell: 250 MB with the compiled
# kernels cached, up to 700 MB when it compiles them (LLVM), as a fresh node does.
BASELINE_MB = 800
# A job's peak over its largest cell's arrays: the arrays themselves, the Dataset
# that wraps them (no copy), and zarr's encoded buffers while writing (<= 1x).
ARRAY_FACTOR = 2.5
# Measured engine throughput on one core (tests/test_resources.py keeps the
# estimate above the measured runtime): dense products run at 20-45 GFLOP/s;
# small fields are dominated by ~2 us of fixed cost per evaluation.
FLOPS_PER_SECOND = 1.0e10
SECONDS_PER_CALL = 5e-6
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
    return cell.H * per_head[structure.form] * (cell.n_seeds if cell.heads_per_seed else 1)


def rank(cell: Cell) -> int:
    """The rank of each head's score matrix as the engine applies it (d but for the factored form)."""
    structure = HEADS.get(cell.heads)
    return structure.rank(cell) if structure.rank else cell.d


# What a cell's memory depends on. ``size`` is the one place that reads it from a cell; the byte counts
# below are functions of it alone, so cells of one size need the same memory (a grid of 10^5 cells has
# a handful of sizes, and config validation sizes each once).
Size = namedtuple("Size", "n_seeds n_samples n d H observables head_entries")


def size(cell: Cell) -> Size:
    """The ``Size`` of a cell (1.1 us: config validation takes it for every grid point)."""
    return Size(cell.n_seeds, cell.n_samples, cell.n, cell.d, cell.H, cell.observables, head_entries(cell))


def _recorded(of: Size) -> int:
    sizes = {"head": of.H, "token": of.n, "dim": of.d}
    # math.prod: exact for any size (an absurd config must be sized, not overflow int64), and fast
    per_sample = sum(math.prod(sizes[d] for d in v.dims) * np.dtype(v.dtype).itemsize
                     for v in variables(of.observables))
    return of.n_seeds * of.n_samples * per_sample


def _held(of: Size) -> int:
    matrices = 3 * of.head_entries * 8  # building (two copies at its peak), then stored
    buffers = 2 * (4 * of.H * of.n * of.n + 8 * of.H * of.n * of.d) * 8  # two threads
    return int(_recorded(of) + matrices + buffers)


def recorded_bytes(cell: Cell) -> int:
    """Bytes of the variables one cell records (what its store holds)."""
    return _recorded(size(cell))


def cell_bytes(cell: Cell) -> int:
    """Bytes of the arrays one cell's simulation holds: recorded variables, score matrices, buffers."""
    return _held(size(cell))


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


def memory_mb(cells: Iterable[Cell], attempt: int = 1) -> int:
    """Peak memory request of a job simulating ``cells`` (one after another), doubled per retry.

    The job keeps every finished cell until it writes its batch's store (one file): three copies
    of what the cells record (the datasets, their stack by shape, the encoded bytes)."""
    cells = list(cells)
    worst = max((cell_bytes(c) for c in cells), default=0)
    held = 3 * sum(recorded_bytes(c) for c in cells)
    return int((BASELINE_MB + (ARRAY_FACTOR * worst + held) / 2**20) * 2 ** (attempt - 1)) + 1


def stiffness(cell: Cell) -> float:
    """Relative step count against ``s = beta ||M||``, as the attention type declares it.

    Normalised weights keep the velocity bounded whatever beta, so steps grow like
    ``1 + log(1 + s)``; unnormalised usa weights like ``e^s`` (``attnflow.attention``).
    """
    return ATTENTIONS.get(cell.attention).stiffness(cell.beta * cell.max_score_matrix_norm)


def steps(cell: Cell) -> float:
    """An upper estimate of a trajectory's accepted steps.

    A 5th-order method takes ~rtol^(-1/5) steps per unit of variation; the flow's
    variation is front-loaded (clustering, then exponential convergence), so the
    count grows like log t_max, times the stiffness. Fitted above the steps
    measured over the default config's 435 cells (2 to 44,000 steps; at least 1.2x
    each, 6x at the median), and capped by the step budget ``max_steps``.
    """
    model = 70.0 * (1e-6 / cell.rtol) ** 0.2 * (1.0 + np.log1p(cell.t_max)) * stiffness(cell)
    # No trajectory takes more than its budget (accepted and rejected): e^s stiffness at usa's large
    # beta would otherwise plan 10^14 core-hours for cells that fail in seconds.
    return min(model, float(cell.max_steps))


def cell_seconds(cell: Cell) -> float:
    """Expected compute time of one cell (no margin)."""
    structure = HEADS.get(cell.heads)
    form = structure.form
    if form == Form.DIAGONAL:
        d = min(cell.d, cell.n) if structure.isotropic else cell.d  # integrated in the tokens' span
        flops = cell.H * (cell.n * d + 4 * cell.n * cell.n * d)
    elif form == Form.FACTORED:
        r = rank(cell)
        flops = cell.H * (4 * cell.n * cell.d * r + 4 * cell.n * cell.n * r)
    else:  # Form.DENSE
        flops = cell.H * (2 * cell.n * cell.d * cell.d + 4 * cell.n * cell.n * cell.d)
    per_call = flops / FLOPS_PER_SECOND + SECONDS_PER_CALL
    sampled = any(GROUPS.get(g).needs_velocity for g in cell.observables)
    calls = 6.0 * steps(cell) + (cell.n_samples if sampled else 0) + 2
    return cell.n_seeds * calls * per_call


def runtime_minutes(cells: Iterable[Cell], attempt: int = 1) -> int:
    """Wall-time request of a job, in minutes: ``SAFETY`` x the model plus start-up, doubled per retry."""
    seconds = STARTUP_SECONDS + SAFETY * sum(cell_seconds(c) for c in cells)
    return max(MIN_MINUTES, int(np.ceil(seconds / 60.0))) * 2 ** (attempt - 1)


__all__ = ["MAX_CELL_BYTES", "Size", "cell_bytes", "cell_seconds", "memory_mb", "oversized", "recorded_bytes",
           "runtime_minutes", "size", "steps"]
