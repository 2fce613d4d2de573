"""attnflow: multi-head self-attention as a flow on the sphere, simulated over parameter grids."""

from . import theory
from .cell import Cell
from .version import __version__

__all__ = ["Cell", "SimulationError", "open_cells", "open_summary", "simulate", "theory", "__version__"]


def __getattr__(name):
    # The engine (numba, compiled kernels) loads on first use, so the workflow's
    # aggregation and plotting jobs do not pay for it at start-up.
    if name in ("simulate", "SimulationError"):
        from . import simulation

        return getattr(simulation, name)
    # One-line access to a finished sweep (attnflow.access): xarray and zarr load on first use.
    if name in ("open_summary", "open_cells"):
        from . import access

        return getattr(access, name)
    raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
