"""A batch's cells in one store (attnflow.pack): exact round trips, and reductions over every cell at once
that equal the reductions of each cell alone."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from attnflow.config import load, validate
from attnflow.ids import cell_id
from attnflow.pack import CELL, as_cells, cell_values, group_attrs, group_cells, placement, select, split
from attnflow.store import open_members, read_members, record_of, write


def _cell(n: int, beta: float, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        # Variable attributes as simulate() gives them: one description naming the cell's own beta.
        {"energy": (("seed", "time", "token"), rng.random((2, 5, n)),
                    {"units": "1", "long_name": "energy", "description": f"energy at beta = {beta}"}),
         "count": (("seed", "time"), rng.integers(0, 9, (2, 5)).astype("int32")),
         "censored": ("seed", np.array([True, False]))},
        coords={"seed": [0, 1], "time": np.linspace(0, 1, 5), "token": np.arange(n)},
        attrs={"cell_beta": beta, "cell_n": n, "solver": "dopri", "cell_seeds": [0, 1]})


def test_cells_of_one_shape_share_a_group_and_come_back_exactly(tmp_path):
    cells = {"a": _cell(3, 0.5, 0), "b": _cell(4, 0.5, 1), "c": _cell(3, 2.0, 2)}
    groups = group_cells(cells)
    # Groups named by what tells them apart; the grid values coordinates along cell.
    assert {name: ds[CELL].values.tolist() for name, ds in groups.items()} == {"n=3": ["a", "c"],
                                                                               "n=4": ["b"]}
    assert groups["n=3"].attrs["solver"] == "dopri"  # shared attributes once, per group
    assert groups["n=3"].beta.values.tolist() == [0.5, 2.0] and "cell_beta" not in groups["n=3"].attrs
    assert cell_values(groups["n=3"], "cell_beta").values.tolist() == [0.5, 2.0]
    # Variable attributes the group's cells share stay on the group's variable; one that differs is each
    # cell's value joined there (and each cell's own comes back with it, below).
    assert groups["n=3"].energy.attrs == {"units": "1", "long_name": "energy",
                                         "description": "energy at beta = 0.5 | energy at beta = 2.0"}
    write(groups, tmp_path / "batch.zarr.zip")
    members = read_members(tmp_path / "batch.zarr.zip")
    back = {}
    for name in record_of(tmp_path / "batch.zarr.zip")["groups"]:
        with open_members(members, name, chunks=None) as ds:
            back.update(split(ds.load()))
    assert set(back) == set(cells)
    for cid, ds in cells.items():
        xr.testing.assert_identical(back[cid], ds)  # values, dtypes, coordinates and attributes


def test_group_attrs_gives_each_cell_its_own_attributes(tmp_path):
    # The store's record lists its cells sorted by id; a group holds them in the batch's order. Ids not
    # in sorted order catch a pairing by the record's order (attnflow status once named a block-heads
    # cell's certificate after a scalar-heads cell this way).
    cells = {"z": _cell(3, 0.5, 0), "b": _cell(3, 1.0, 1), "m": _cell(3, 2.0, 2)}
    groups = group_cells(cells)
    write(groups, tmp_path / "batch.zarr.zip", meta={"cells": placement(groups)})
    attrs = group_attrs(tmp_path / "batch.zarr.zip")
    assert {cid: a["cell_beta"] for cid, a in attrs.items()} == {"z": 0.5, "b": 1.0, "m": 2.0}


def test_select_keeps_each_cells_attributes():
    group = group_cells({"a": _cell(3, 0.5, 0), "c": _cell(3, 2.0, 2)})[""]  # one group: the root
    picked = select(group, ["c", "a", "c"])
    assert picked[CELL].values.tolist() == ["c", "a", "c"]
    assert cell_values(picked, "cell_beta").values.tolist() == [2.0, 0.5, 2.0]


def _groups(results):
    """Every group of a finished run's stores, with a twin of its first cell added: the same shape,
    other numbers and another ``cell_beta``, so that every group holds cells that differ."""
    rng = np.random.default_rng(0)
    for path in sorted((results / "simulations").glob("*.zarr.zip")):
        members = read_members(path)
        for name in record_of(path)["groups"]:
            with open_members(members, name, chunks=None) as ds:
                cells = split(ds.load())
            first = next(iter(cells.values()))
            twin = first.copy(deep=True)
            for var in twin.data_vars.values():
                if var.dtype.kind == "f":
                    var.values = var.values * rng.uniform(0.5, 1.5, var.shape)
            twin.attrs["cell_beta"] = 2.0 * first.attrs["cell_beta"]
            yield as_cells(group_cells({**cells, "twin": twin})[""])  # as the aggregation reads it


def test_every_experiment_reduces_all_cells_at_once_as_each_alone(tiny_run):
    """The aggregation reduces a group's cells in one call; each experiment's reduction must give what it
    gives one cell at a time (a reduction over a dimension it did not name, or a cell's attribute read as
    the group's, would differ)."""
    _, config, results = tiny_run
    sweep = validate(load(config))
    owner = {cell_id(p.cell): name for name, points in sweep.points.items() for p in points}
    checked = set()
    for group in _groups(results):
        ids = group[CELL].values.tolist()
        experiment = sweep.experiments.get(owner[ids[0]])
        with np.errstate(all="ignore"):
            together = experiment.reduce(group).load()
            for cid in ids:
                alone = experiment.reduce(select(group, [cid])).load()
                xr.testing.assert_allclose(together.sel({CELL: [cid]}), alone, rtol=0, atol=0)
        checked.add(experiment.name)
    assert checked == set(sweep.specs), set(sweep.specs) - checked


@pytest.mark.parametrize("configfile", ["config/config.yaml", "config/paper.yaml"])
def test_a_batch_is_one_file_and_a_cell_is_under_two_files(configfile):
    """Files at rest per cell: a store, a manifest, a log and a benchmark per batch; a summary, two
    figures, and a log and a benchmark of its aggregate and plot jobs per experiment."""
    sweep = validate(load(configfile), reach_scheduler=False)
    cells = sum(len(c) for c in sweep.batches.values())
    files = 4 * len(sweep.batches) + 7 * len(sweep.specs)
    assert files / cells <= 2.0, (files, cells)
