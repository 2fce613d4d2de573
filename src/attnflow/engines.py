"""Which engine integrates a cell (``Cell.engine``): the numba engine or the JAX engine.

Both implement one contract (``attnflow.contract``): ``solve(problem, controller, saveat, event)``
returning an ``EngineResult``. ``auto`` sends a cell to the JAX engine where jax sees a GPU and the cost model
(``resources.cell_seconds``, the numba engine's expected time) calls it large,
else to the numba engine.
"""

from __future__ import annotations

import functools

from .cell import ENGINES, Cell
from .contract import ClusterEvent, Controller, Problem, SaveAt
from .resources import AUTO_GPU_SECONDS, large_for_gpu  # noqa: F401  (re-exported)


@functools.lru_cache(maxsize=1)
def _gpu_visible() -> bool:
    from .jaxengine import gpu_visible

    return gpu_visible()


def _auto(cell: Cell) -> str:
    return "jax" if _gpu_visible() and large_for_gpu(cell) else "numba"


def _numba_solver():
    from .engine import solve

    return solve


def _jax_solver():
    from .jaxengine import solve

    return solve


# Each choice of Cell.engine, one entry each (no default: a choice without its entry is refused).
_CHOICES = {"numba": lambda cell: "numba", "jax": lambda cell: "jax", "auto": _auto}
SOLVERS = {"numba": _numba_solver, "jax": _jax_solver}


def engine_for(cell: Cell) -> str:
    """The engine that integrates ``cell``: ``numba`` or ``jax``."""
    if cell.engine not in _CHOICES:
        raise NotImplementedError(f"Cell.engine = {cell.engine!r} has no rule in attnflow.engines")
    return _CHOICES[cell.engine](cell)


def solver_for(cell: Cell):
    """The ``solve`` function of the engine that integrates ``cell``."""
    return SOLVERS[engine_for(cell)]()


if set(_CHOICES) != set(ENGINES):  # every declared choice has its rule
    raise NotImplementedError(f"attnflow.engines: rules for {sorted(_CHOICES)}, Cell.engine has {ENGINES}")


def integrate(cell, problem: Problem, times, controller: Controller, strict=True, groups=None):
    """The cell's engine on ``problem`` with the cell's samples and criterion: the one spelling of the
    call (the certificate's rerun differs in the controller, the seeds and the observable ``groups``
    alone: None, the cell's). ``strict``: a trajectory that fails raises ``IntegrationError``; else it
    comes back with its ``status``."""
    groups = cell.observables if groups is None else groups
    return solver_for(cell)(problem, controller, SaveAt(times, groups, cell.cluster_eps),
                            ClusterEvent(cell.cluster_metric, cell.cluster_threshold, cell.stop_at_cluster),
                            strict=strict)
