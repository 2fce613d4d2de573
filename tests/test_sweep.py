import numpy as np
import pytest
import xarray as xr

from attnflow import Cell
from attnflow.sweep import (
    ConfigError,
    cell_id,
    estimated_memory_mb,
    estimated_seconds,
    experiment_batches,
    experiment_cells,
    validate_config,
    write_store,
)

CONFIG = {
    "defaults": {"seeds": 2, "t_max": 1.0},
    "experiments": {
        "beta_star": {
            "fixed": {"heads": "block", "d": 4},
            "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0, 2.0]},
            "batch_over": ["beta"],
        }
    },
}


def test_cells_are_the_grid_product_with_coordinates():
    cells = experiment_cells(CONFIG, "beta_star")
    assert len(cells) == 6
    coords, cell = cells[0]
    assert coords == {"H": 2, "n": 4, "beta": 0.5}
    assert cell.heads == "block" and cell.seeds == (0, 1) and cell.t_max == 1.0


def test_cell_id_depends_on_every_field_and_nothing_else():
    a = Cell(H=2, n=4, d=4)
    assert cell_id(a) == cell_id(Cell(H=2, n=4, d=4))
    for change in ({"beta": 1.5}, {"seeds": 3}, {"rtol": 1e-7}, {"save_positions": True}):
        assert cell_id(a.replace(**change)) != cell_id(a)


def test_batches_group_the_fast_axis_and_are_stable_under_new_values():
    batches = experiment_batches(CONFIG, "beta_star")
    assert sorted(len(v) for v in batches.values()) == [3, 3]
    grown = {**CONFIG, "experiments": {"beta_star": {
        **CONFIG["experiments"]["beta_star"],
        "grid": {"H": [2], "n": [4, 6, 8], "beta": [0.5, 1.0, 2.0]}}}}
    new = experiment_batches(grown, "beta_star")
    # Existing batches keep their names and cells; the new n only adds one.
    for name, cells in batches.items():
        assert [cell_id(c) for c in new[name]] == [cell_id(c) for c in cells]
    assert len(new) == 3


@pytest.mark.parametrize("experiments, match", [
    ({}, "experiments: empty"),
    ({"phase": {"grid": {"beta": [1.0]}}}, "experiments.phase: unknown experiment"),
    ({"energy": {"grid": {"beta": []}}}, r"experiments.energy.grid.beta = \[\]"),
    ({"energy": {"fixed": {"heads": "block", "H": 3, "d": 4}}}, "Cell.d = 4"),
    ({"energy": {"fixed": {"bogus": 1}}}, "bogus"),
])
def test_config_errors_name_the_key(experiments, match):
    with pytest.raises(ConfigError, match=match):
        validate_config({"experiments": experiments})


def test_resource_estimates_grow_with_the_work():
    small, big = Cell(n=8, d=8, seeds=4), Cell(n=64, d=32, seeds=64)
    base = estimated_seconds([])  # start-up allowance
    ratio = (estimated_seconds([big]) - base) / (estimated_seconds([small]) - base)
    # The model is linear in seeds x n^2 d at fixed H, beta, t_max: 16 x 256 here.
    assert ratio == pytest.approx(16 * 256)
    assert estimated_seconds([small, big]) == pytest.approx(
        estimated_seconds([small]) + estimated_seconds([big]) - base)
    assert estimated_memory_mb([big]) > estimated_memory_mb([small]) >= 600


def test_write_store_is_atomic(tmp_path, monkeypatch):
    ds = xr.Dataset({"a": ("x", np.arange(3.0))})
    path = tmp_path / "s.zarr"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if killed while writing

    monkeypatch.setattr(xr.Dataset, "to_zarr", crash)
    with pytest.raises(KeyboardInterrupt):
        write_store(ds, path)
    assert not path.exists()
    monkeypatch.undo()
    write_store(ds, path)
    assert path.exists() and not (tmp_path / "s.zarr.partial").exists()
    np.testing.assert_array_equal(xr.open_zarr(path).a.values, [0, 1, 2])
