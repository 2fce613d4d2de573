"""Stores that plain xarray opens by path (README, "Results in plain xarray"): grid values as coordinates
along ``cell``, groups named by what tells them apart, CF attributes, a layout-1 store read and written
again without computing; the export's CSVW metadata loaded by a CSVW reader, counts as integers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from attnflow.cell import Cell
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.pack import as_cells, group_cells
from attnflow.run.batch import run_batch
from attnflow.run.stored import stored_cells
from attnflow.store import record_of, write
from attnflow.versions import store_versions


def _open(path, **kwargs) -> xr.Dataset:
    """The README's call: plain xarray, the store's path behind fsspec's zip:: protocol."""
    return xr.open_zarr(f"zip::{path}", **kwargs)


def _cells():
    base = dict(H=2, d=4, heads="block", t_max=0.5, n_samples=5, seeds=2)
    return [Cell(n=n, beta=beta, **base) for n in (4, 6) for beta in (0.5, 1.0)]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    layout = Layout(tmp_path_factory.mktemp("open") / "results")
    result = run_batch(_cells(), "b", layout, log=lambda _line: None)
    return layout, result.path


def test_a_batch_store_opens_by_path_its_grid_values_coordinates(batch):
    _, path = batch
    tree = xr.open_datatree(f"zip::{path}", engine="zarr")
    assert sorted(tree.children) == ["n=4", "n=6"]  # named by what tells the groups apart
    ds = _open(path, group="n=6")
    assert ds.n.values.tolist() == [6, 6] and sorted(ds.beta.values.tolist()) == [0.5, 1.0]
    picked = ds.sel(cell=ds.beta == 1.0)  # plain xarray selects by a grid value
    assert picked.sizes["cell"] == 1
    assert picked.cell.item() == cell_id(Cell(n=6, beta=1.0, H=2, d=4, heads="block", t_max=0.5, n_samples=5,
                                              seeds=2))
    assert ds.set_xindex("beta").sel(beta=[0.5]).sizes["cell"] == 1  # or as an index of its own
    assert ds.set_xindex(["n", "beta"]).sel(n=6, beta=0.5).energy.dims[0] == "seed"  # one cell
    # CF: units and long_name on quantities; none on labels and flags; the store's own global attributes.
    assert ds.beta.attrs["units"] == "1" and ds.beta.attrs["long_name"] == "inverse temperature"
    assert ds.energy.attrs["units"] == "1" and ds.energy.attrs["long_name"]
    for label in ("cell", "attention", "heads", "failed", "censored", "stop_at_cluster"):
        assert "units" not in ds[label].attrs and ds[label].attrs["long_name"], label
    assert ds.attrs["Conventions"].startswith("CF-") and "batch b" in ds.attrs["title"]
    assert ds.attrs["history"]
    # On the sphere the drift off it; never a flat-space quantity under that name.
    assert "norm_drift" in ds and "norm_change" not in ds


def test_the_documented_zarr_call_opens_it_too(batch):
    import zarr

    _, path = batch
    ds = xr.open_zarr(zarr.storage.ZipStore(path, mode="r"), group="n=4")
    assert ds.sizes["cell"] == 2 and ds.beta.attrs["long_name"] == "inverse temperature"


def test_a_layout_1_store_is_read_and_written_again_computing_nothing(batch, tmp_path):
    layout, path = batch
    cells = stored_cells(path)
    old = Layout(tmp_path / "results")
    # Layout 1 as attnflow wrote it: groups g0, g1, the grid values in each cell's JSON attributes alone,
    # no layout in the record.
    legacy = {f"g{k}": as_cells(group) for k, group in enumerate(group_cells(cells).values())}
    versions = {k: v for k, v in store_versions().items() if k != "store_layout"}
    placed = {cid: name for name, ds in legacy.items() for cid in ds.cell.values.tolist()}
    write(legacy, old.store("b"), versions=versions, meta={"batch": "b", "cells": placed})
    lines = []
    run_batch(_cells(), "b", old, log=lines.append)
    assert not [line for line in lines if "computed in" in line], lines  # nothing simulated
    assert record_of(old.store("b"))["store_layout"] == store_versions()["store_layout"]
    again = stored_cells(old.store("b"))
    assert set(again) == set(cells)
    for cid, ds in cells.items():
        xr.testing.assert_identical(again[cid].drop_attrs(), ds.drop_attrs())
        assert again[cid].attrs["cell_beta"] == ds.attrs["cell_beta"]


def test_in_flat_geometry_the_norms_change_is_not_called_drift(tmp_path):
    cell = Cell(n=4, H=1, d=3, beta=1.0, attention="usa", heads="random", geometry="flat", t_max=0.1,
                n_samples=3, seeds=1)
    result = run_batch([cell], "f", Layout(tmp_path / "results"), log=lambda _line: None)
    ds = _open(result.path)
    assert "norm_drift" not in ds and ds.norm_change.attrs["long_name"] == "largest change of a token's norm"
    assert ds.geometry.values.tolist() == ["flat"]
    # A layout-1 store named it norm_drift: written again in this layout, it says norm_change.
    cells = {cid: c.rename(norm_change="norm_drift") for cid, c in stored_cells(result.path).items()}
    old = Layout(tmp_path / "old")
    versions = {k: v for k, v in store_versions().items() if k != "store_layout"}
    write({"g0": as_cells(next(iter(group_cells(cells).values())))}, old.store("f"), versions=versions,
          meta={"batch": "f", "cells": dict.fromkeys(cells, "g0")})
    lines = []
    run_batch([cell], "f", old, log=lines.append)
    assert not [line for line in lines if "computed in" in line], lines
    again = _open(old.store("f"))
    assert "norm_drift" not in again and again.norm_change.values.tolist() == ds.norm_change.values.tolist()


@pytest.mark.workflow
def test_a_summary_opens_by_path_and_selects_by_grid_value(beta_star_run):
    _, _, results = beta_star_run
    summary = _open(results / "summaries" / "beta_star.zarr.zip")
    assert summary.attrs["Conventions"].startswith("CF-") and summary.attrs["history"]
    assert summary.frac_mono_path.attrs["units"] == "1" and summary.frac_mono_path.attrs["long_name"]
    line = summary.frac_mono_path.sel(attention="softmax", H=2, heads="block", n=6)
    assert line.dims == ("beta",) and line.beta.attrs["long_name"] == "inverse temperature"
    assert "units" not in summary.attention.attrs  # a label


@pytest.mark.workflow
def test_the_csvw_metadata_loads_with_counts_as_integers(beta_star_run, tmp_path):
    csvw = pytest.importorskip("csvw")
    from attnflow.cli import main as attnflow_main
    from attnflow.tables import is_count

    _, config, _ = beta_star_run
    csv = tmp_path / "beta_star.csv"
    assert attnflow_main(["export", "beta_star", "--configfile", str(config), "--csv", str(csv)]) == 0
    table = csvw.Table.from_file(f"{csv}-metadata.json")
    rows = list(table.iterdicts())
    assert rows
    meta = json.loads((tmp_path / "beta_star.csv-metadata.json").read_text())
    types = {c["name"]: c["datatype"] for c in meta["tableSchema"]["columns"]}
    counts = [name for name in types if is_count(name)]
    assert "seeds" in counts and "beta_mono_seeds" in counts
    for name in counts:
        assert types[name] == "integer", name
        assert all(row[name] is None or type(row[name]) is int for row in rows), name
    for row in rows:  # the reader parses the doubles, infinities included (INF: an unbounded interval)
        assert isinstance(row["beta_mono_high"], float)
        assert row["beta_mono_low"] <= row["beta_mono_high"] or np.isnan(row["beta_mono_low"])
