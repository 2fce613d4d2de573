"""Cell.engine: which engine integrates a cell (attnflow.engines)."""

import pytest

from attnflow import Cell, engines
from attnflow.resources import cell_seconds


def test_named_engines_are_taken_as_named():
    assert engines.engine_for(Cell()) == "numba"
    assert engines.engine_for(Cell(engine="jax")) == "jax"


@pytest.mark.parametrize("gpu", [True, False])
def test_auto_takes_the_gpu_for_large_cells_only(monkeypatch, gpu):
    monkeypatch.setattr(engines, "_gpu_visible", lambda: gpu)
    small = Cell(engine="auto", n=4, d=4, seeds=2)
    large = Cell(engine="auto", n=512, d=128, H=4, heads="random", seeds=64)
    # the two sit on either side of the threshold, by the cost model itself
    assert cell_seconds(small) < engines.AUTO_GPU_SECONDS < cell_seconds(large)
    assert engines.engine_for(small) == "numba"
    assert engines.engine_for(large) == ("jax" if gpu else "numba")
