"""Which engine integrates a cell (``Cell.engine``): the numba engine or the JAX engine.

Both implement one contract (``attnflow.contract``): ``solve(problem, controller, saveat, event)``
returning an ``EngineResult``. ``auto`` sends a cell to the JAX engine where jax sees a GPU and the cost model
(``resources.cell_seconds``, the numba engine's expected time) calls it large,
else to the numba engine.
"""

from __future__ import annotations

import functools

from .cell import ENGINES, Cell

# Cost-model seconds (numba, the host's cores) above which ``auto`` takes the GPU: the JAX engine
# compiles once per static configuration of a cell (its rules, groups, tolerances and shapes), seconds to
# tens of seconds, which a smaller cell would not win back.
AUTO_GPU_SECONDS = 30.0


@functools.lru_cache(maxsize=1)
def _gpu_visible() -> bool:
    from .jaxengine import gpu_visible

    return gpu_visible()


def _auto(cell: Cell) -> str:
    from .resources import cell_seconds

    return "jax" if _gpu_visible() and cell_seconds(cell) > AUTO_GPU_SECONDS else "numba"


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
