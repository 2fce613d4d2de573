"""One-line access on a finished tiny run: summaries and stores by experiment name and grid values."""

import os
import shlex
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from sweep_helpers import ENV, ROOT, write_config

import attnflow
from attnflow.access import NotBuiltError, NotOnGrid
from attnflow.errors import ConfigError
from attnflow.ids import cell_id
from attnflow.run.stored import stored_cells
from attnflow.store import RECORD, CorruptStore, open_verified

pytestmark = pytest.mark.workflow


def test_open_summary_is_the_verified_summary_with_closed_forms(tiny_run):
    _, config, results = tiny_run
    summary = attnflow.open_summary("beta_star", configfile=config)
    on_disk = open_verified(results / "summaries" / "beta_star.zarr.zip").load()
    assert set(summary.data_vars) == set(on_disk.data_vars)
    for var in ("beta_star_closed", "frac_mono_path", "beta_mono_mean"):
        np.testing.assert_array_equal(summary[var].values, on_disk[var].values)
    assert summary.attrs["experiment"] == "beta_star"
    # closed forms are part of it, on the measurement's grid
    closed = float(attnflow.theory.beta_star(2, 4))
    assert float(summary.beta_star_closed.sel(H=2, n=4)) == pytest.approx(closed)


def test_open_summary_errors_name_the_problem(tiny_run, tmp_path):
    _, config, _ = tiny_run
    with pytest.raises(ConfigError, match=r"'nope': unknown \(this config runs: .*beta_star"):
        attnflow.open_summary("nope", configfile=config)
    with pytest.raises(ConfigError, match="trained_heads: not in"):
        attnflow.open_summary("trained_heads", configfile=config)
    fresh = write_config(tmp_path)  # the same grids, results elsewhere: nothing built
    with pytest.raises(NotBuiltError,
                       match=r"no summary at .*energy\.zarr\.zip yet; build it with `snakemake"):
        attnflow.open_summary("energy", configfile=fresh)


def test_open_summary_verifies_the_store(tiny_run, tmp_path):
    import shutil

    _, config, results = tiny_run
    copy = tmp_path / "results"
    shutil.copytree(results / "summaries", copy / "summaries")
    store = copy / "summaries" / "energy.zarr.zip"
    with zipfile.ZipFile(store) as zf:  # a data chunk, not metadata nor the record
        info = next(i for i in zf.infolist() if i.filename != RECORD and "/" in i.filename
                    and not i.filename.split("/")[-1].startswith("."))
    with open(store, "r+b") as fh:  # its last byte flipped in place, inside the zip
        fh.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", fh.read(30)[26:30])
        fh.seek(info.header_offset + 30 + name_len + extra_len + info.file_size - 1)
        last = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CorruptStore, match="energy.zarr"):
        attnflow.open_summary("energy", configfile=config, results=copy)


def test_open_cells_combines_the_stores_along_the_grid_axes(tiny_run):
    _, config, _ = tiny_run
    sweep = attnflow.access.load_sweep(config)
    ds = attnflow.open_cells("superadditivity", configfile=config, beta=[1, 2.0], lambda_dist="linear")
    assert ds.sizes["beta"] == 2 and ds.sizes["lambda_dist"] == 1 and ds.sizes["lambda_bar"] == 2
    assert set(sweep.specs["superadditivity"].grid) <= set(ds.dims)
    # each slice is the store of that grid point, number for number
    for point in sweep.points["superadditivity"]:
        if point.coords["lambda_dist"] != "linear":
            continue
        one = stored_cells(sweep.store_of(point.cell))[cell_id(point.cell)]
        got = ds.sel(point.coords)
        np.testing.assert_array_equal(got.t_cluster.values, one.t_cluster.values)
        np.testing.assert_array_equal(got.gamma_min.values, one.gamma_min.values)
    # no coordinates: every grid point
    everything = attnflow.open_cells("beta_star", configfile=config)
    assert everything.sizes["n"] == 2 and everything.sizes["beta"] == 2


def test_open_cells_serves_no_cell_another_engine_computed_than_the_config_names(tiny_run, tmp_path):
    # The engine is no part of a cell's id: the numba run's stores hold the cells of a config moved to jax,
    # stale until `snakemake` recomputes them (status says so); never served as the config's numbers.
    from attnflow.access import OutdatedCells

    _, config, results = tiny_run
    assert attnflow.open_cells("beta_star", configfile=config).attrs["engines"] == "numba: 4"
    moved = write_config(tmp_path, **{"defaults.engine": "jax"})
    with pytest.raises(OutdatedCells, match=r"^beta_star: 4 of 4 cells are stale \(first: .*computed by "
                                            r"numba, this config asks for jax\); `snakemake .* --configfile"):
        attnflow.open_cells("beta_star", configfile=moved, results=results)
    # auto takes either engine's cells.
    auto = write_config(tmp_path, "auto.yaml", **{"defaults.engine": "auto"})
    assert attnflow.open_cells("beta_star", configfile=auto, results=results).attrs["engines"] == "numba: 4"


def test_open_cells_names_values_not_on_the_grid(tiny_run):
    _, config, _ = tiny_run
    with pytest.raises(NotOnGrid, match=r"n = 5 is not on the grid \(n: \[4, 6\]\)"):
        attnflow.open_cells("beta_star", configfile=config, n=5)
    with pytest.raises(NotOnGrid, match="d is fixed at 4"):
        attnflow.open_cells("beta_star", configfile=config, d=8)
    with pytest.raises(NotOnGrid, match="foo is not a cell field"):
        attnflow.open_cells("beta_star", configfile=config, foo=1)
    # a fixed field at its own value selects everything
    assert attnflow.open_cells("beta_star", configfile=config, d=4, n=4).sizes["n"] == 1


def test_open_cells_refuses_an_empty_selection(tmp_path):
    # An empty list selects no value: said with the axis named, before any store is read (it was
    # xarray's "must supply at least one object to concatenate", or every cell for a fixed field).
    fresh = write_config(tmp_path)
    with pytest.raises(NotOnGrid, match=r"^beta_star: n = \[\]: no value given \(n: \[4, 6\]\)$"):
        attnflow.open_cells("beta_star", configfile=fresh, n=[])
    with pytest.raises(NotOnGrid, match=r"^beta_star: d = \[\]: no value given \(d is fixed at 4\)$"):
        attnflow.open_cells("beta_star", configfile=fresh, d=[])


def test_open_cells_of_a_run_not_done(tiny_run, tmp_path):
    fresh = write_config(tmp_path)
    with pytest.raises(NotBuiltError, match=r"4 of 4 cells have no store yet .*`snakemake .* --configfile"):
        attnflow.open_cells("beta_star", configfile=fresh)


def test_the_build_command_an_error_names_is_one_snakemake_runs(tmp_path):
    # A promise: the command in NotBuiltError's message must plan the target (dry run here).
    fresh = write_config(tmp_path)
    with pytest.raises(NotBuiltError) as err:
        attnflow.open_summary("beta_star", configfile=fresh)
    program, *args = shlex.split(str(err.value).split("`")[1])
    assert program == "snakemake"
    # From tmp_path with the Snakefile named, so the dry run leaves nothing in the checkout.
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args, "--snakefile", str(ROOT / "Snakefile"),
                           "-n", "--cores", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "aggregate" in proc.stdout + proc.stderr


def test_open_summary_refuses_a_summary_of_another_grid(tiny_run, tmp_path):
    from attnflow.access import OutdatedSummary

    _, _, results = tiny_run
    edited = write_config(tmp_path, **{"experiments.energy.grid.geometry": ["sphere"]})
    # The summary on disk holds sphere and flat: not this grid's numbers, so never served (issue 39.1).
    with pytest.raises(OutdatedSummary, match=r"built from another grid .*`snakemake .* --configfile"):
        attnflow.open_summary("energy", configfile=edited, results=results)



def test_open_cells_joins_cells_of_another_dimension(tiny_run):
    # clustering_time's cells of d = 16 and d = 64 hold per-dimension variables of two sizes: joined outward
    # (NaN past d = 16), where concatenating them refused to align a dimension without a coordinate.
    _, config, _ = tiny_run
    ds = attnflow.open_cells("clustering_time", configfile=config)
    assert ds.sizes["d"] == 2 and ds.sizes["dim"] == 64
    per_dim = [name for name, v in ds.data_vars.items() if "dim" in v.dims]
    assert per_dim, "no per-dimension variable to join"
    small = ds[per_dim[0]].sel(d=16)
    assert np.isfinite(small.isel(dim=slice(0, 16))).all() and np.isnan(small.isel(dim=slice(16, None))).all()
    assert np.isfinite(ds[per_dim[0]].sel(d=64)).all()
