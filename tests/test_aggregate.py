"""Aggregation gives the same numbers on every dask scheduler, distributed included."""

import numpy as np
import pytest
import xarray as xr
import yaml

from attnflow.aggregate import aggregate, summarise
from attnflow.config import validate
from attnflow.store import open_verified

pytestmark = pytest.mark.workflow


def _same(a: xr.Dataset, b: xr.Dataset):
    assert set(a.data_vars) == set(b.data_vars)
    for var in a.data_vars:
        np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)


def _sweep(config_path):
    return validate(yaml.safe_load(config_path.read_text()), reach_scheduler=False)


def test_schedulers_agree(tmp_path, tiny_run):
    _, config_path, results = tiny_run
    sweep = _sweep(config_path)
    exp, spec = sweep.experiments.get("beta_star"), sweep.specs["beta_star"]
    entries = sweep.entries("beta_star")
    reference = open_verified(results / "summaries" / "beta_star.zarr.zip").load()
    local = aggregate(exp, spec, entries, tmp_path / "local.zarr.zip", scheduler="distributed")
    _same(local, reference)
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:
        remote = aggregate(exp, spec, entries, tmp_path / "remote.zarr.zip",
                           scheduler=cluster.scheduler_address)
    _same(remote, reference)
    _same(open_verified(tmp_path / "remote.zarr.zip").load(), reference)


def test_missing_cells_are_nan_and_listed(tmp_path, tiny_run):
    _, config_path, results = tiny_run
    sweep = _sweep(config_path)
    entries = sweep.entries("beta_star")
    coords, _, cid = entries[0]
    entries[0] = (coords, str(tmp_path / "nowhere.zarr.zip"), cid)
    out = summarise(sweep.experiments.get("beta_star"), sweep.specs["beta_star"], entries)
    assert out.attrs["missing_cells"] == [f"{tmp_path / 'nowhere.zarr.zip'}:{cid}"]
    missing = {k: v for k, v in entries[0][0].items()}
    assert np.isnan(out.time_rd.sel(missing).values).all()
    # Per-run booleans too: a missing cell once read True (monotone), bool(NaN).
    for var in ("mono_path", "mono_t0", "rd_t0"):
        assert np.isnan(out[var].sel(missing).values).all(), var
    assert out.sizes["beta"] == len(sweep.specs["beta_star"].grid["beta"])


def test_a_summary_says_which_engines_computed_its_cells(tiny_run, monkeypatch):
    # The engine is no part of a cell's id and engine: auto keeps cells of either engine: the summary
    # (and its export) counts the cells of each, so two engines' numbers never mix unsaid.
    import attnflow.aggregate as aggregate_module

    _, config_path, _ = tiny_run
    sweep = _sweep(config_path)
    exp, spec = sweep.experiments.get("beta_star"), sweep.specs["beta_star"]
    entries = sweep.entries("beta_star")
    assert len({cid for _, _, cid in entries}) == 4
    assert summarise(exp, spec, entries).attrs["engines"] == "numba: 4"
    # A store holding a cell the JAX engine computed (no JAX run here: its record says so).
    recorded, first = aggregate_module.recorded_engines, entries[0][2]
    monkeypatch.setattr(aggregate_module, "recorded_engines", lambda record: {
        cid: "jax" if cid == first else engine for cid, engine in recorded(record).items()})
    assert summarise(exp, spec, entries).attrs["engines"] == "jax: 1, numba: 3"


def test_numeric_axes_come_out_ascending_whatever_the_config_order(tmp_path, tiny_run):
    # A refined grid appends its extra points at the end; the maps are drawn from sorted edges.
    _, config_path, _ = tiny_run
    sweep = _sweep(config_path)
    entries = sweep.entries("beta_star")[::-1]
    out = summarise(sweep.experiments.get("beta_star"), sweep.specs["beta_star"], entries)
    for axis in ("beta", "n"):
        values = out[axis].values
        assert list(values) == sorted(values), axis
    reference = summarise(sweep.experiments.get("beta_star"), sweep.specs["beta_star"], entries[::-1])
    _same(out, reference)


def test_failed_seeds_are_left_out_of_the_reduction():
    # Two cells of one group: the first with its seed 1 marked failed. Its reduction must be that of
    # its other seeds alone (an independent route: the cell without seed 1), per-seed outputs NaN
    # there; the clean cell's as if alone.
    from attnflow import Cell, simulate
    from attnflow.aggregate import _reduce_good_seeds
    from attnflow.experiments import registry
    from attnflow.pack import as_cells, group_cells, select

    energy, beta_star = registry().get("energy"), registry().get("beta_star")
    cells = {f"c{k}": simulate(Cell(H=2, n=4, d=3, beta=beta, seeds=3, t_max=1.0, n_samples=6,
                                     observables=["energy", "velocity", "radial"]))
             for k, beta in enumerate((0.5, 4.0))}
    cells["c0"]["failed"][1] = True
    (group,) = map(as_cells, group_cells(cells).values())  # as the aggregation reads a store's group
    for experiment in (energy, beta_star):
        got = _reduce_good_seeds(experiment, group)
        alone = experiment.reduce(select(group, ["c0"]).isel(seed=[0, 2]))
        clean = experiment.reduce(select(group, ["c1"]))
        for name in got.data_vars:
            first, second = got[name].isel(cell=0), got[name].isel(cell=1)
            want = alone[name].isel(cell=0)
            if "seed" in got[name].dims:
                assert np.isnan(first.sel(seed=1)).all()
                first = first.sel(seed=[0, 2])
            np.testing.assert_array_equal(first.values, want.values.astype(float), err_msg=name)
            np.testing.assert_array_equal(second.values, clean[name].isel(cell=0).values.astype(float),
                                          err_msg=name)
