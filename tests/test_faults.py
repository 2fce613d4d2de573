"""Fault tolerance: kills mid-write, NaN, failed cells, determinism across core counts."""

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
from sweep_helpers import planned, run, snakemake_cmd, write_config

from attnflow import Cell, SimulationError, simulate
from attnflow.sweep import failure_path, run_batch, store_path

simulate_module = importlib.import_module("attnflow.simulation")

pytestmark = pytest.mark.workflow


def _poisoned_integrate(value):
    real = simulate_module.integrate

    def integrate(*args, **kwargs):
        xs, stats = real(*args, **kwargs)
        xs[0, -1, 0, 0] = value(xs[0, -1, 0, 0])
        return xs, stats
    return integrate


@pytest.mark.parametrize("poison, message", [
    (lambda v: np.nan, "non-finite values in x"),
    (lambda v: 1.5 * v + 0.5, "left the sphere"),
])
def test_bad_numbers_fail_naming_the_cell_and_write_no_store(tmp_path, monkeypatch, poison, message):
    monkeypatch.setattr(simulate_module, "integrate", _poisoned_integrate(poison))
    cell = Cell(H=2, n=5, d=4, beta=0.7, seeds=2, t_max=1.0, n_samples=5)
    with pytest.raises(SimulationError, match=rf"cell\(H=2, n=5, d=4, beta=0.7.*{message}"):
        simulate(cell)
    with pytest.raises(SimulationError):
        run_batch([cell], tmp_path, log=lambda *_: None)
    assert not store_path(tmp_path, cell).exists()
    record = json.loads(failure_path(tmp_path, cell).read_text())
    assert "beta=0.7" in record["error"] and record["cell"]["beta"] == 0.7


def test_killed_job_leaves_no_complete_store_and_resumes(tmp_path, tiny_run):
    _, _, reference = tiny_run
    config = write_config(tmp_path)
    target = str(tmp_path / "results" / "figures" / "orthogonality.png")
    proc = subprocess.Popen(snakemake_cmd(tmp_path, config, "--cores", "1", target),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "ATTNFLOW_FAULT": "hang-before-rename"},
                            start_new_session=True)
    sims = tmp_path / "results" / "simulations"
    deadline = time.monotonic() + 120
    while not list(sims.glob("*.partial")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # let the partial store's metadata land: the job is now mid-write
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = list(sims.glob("*.partial"))
    assert len(partial) == 1, "the job should have been killed while writing one store"
    assert not list(sims.glob("*.zarr")), "no store may look complete after the kill"

    run(tmp_path, config, "--unlock")
    # Exactly the killed job reruns (with its summary and figure downstream).
    assert planned(tmp_path, config, target) == {"simulate": 1, "aggregate": 1, "plot": 1}
    run(tmp_path, config, "--cores", "1", target)
    assert not list(sims.glob("*.partial"))
    for store in sims.glob("*.zarr"):
        a, b = xr.open_zarr(store).load(), xr.open_zarr(reference / "simulations" / store.name).load()
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values)


def test_failed_cell_is_reported_and_finished_cells_never_recomputed(tmp_path):
    # Flat usa blows up in finite time: t_max = 5 makes the delta = 0.1 cell fail
    # (step-size underflow) while delta = 0 is kept short enough to finish.
    config = tmp_path / "config.yaml"
    cfg = {
        "results": str(tmp_path / "results"),
        "defaults": {"seeds": 2, "n_samples": 11},
        "experiments": {"orthogonality": {
            "fixed": {"heads": "perturbed_block", "attention": "usa", "geometry": "flat",
                      "H": 2, "n": 6, "d": 4, "beta": 1.0},
            "grid": {"delta": [0.0, 0.1], "t_max": [0.2, 5.0]},
            "batch_over": ["delta", "t_max"],
        }},
    }
    import yaml

    config.write_text(yaml.safe_dump(cfg))
    first = run(tmp_path, config, check=False)
    assert first.returncode != 0
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert "FAILED: cell(H=2, n=6, d=4, beta=1.0, attention='usa'" in logs
    sims = tmp_path / "results" / "simulations"
    done = {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr")}
    assert len(done) >= 1 and len(list(sims.glob("*.failed.json"))) >= 1
    for store in done:  # what was written is trustworthy
        ds = xr.open_zarr(sims / store)
        assert np.isfinite(ds.energy.values).all()

    second = run(tmp_path, config, check=False)
    assert second.returncode != 0
    assert {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr")} == done
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert "exists, skipped" in logs

    status = subprocess.run([sys.executable, "-m", "attnflow.cli", "status", "--configfile", str(config)],
                            capture_output=True, text=True)
    assert status.returncode == 0
    row = next(line for line in status.stdout.splitlines() if line.startswith("orthogonality"))
    cells, n_done, missing, failed = (int(v) for v in row.split()[1:5])
    assert cells == 4 and n_done == len(done) and failed >= 1
    assert "failed orthogonality/" in status.stdout


def test_same_seeds_bit_identical_on_one_core(tmp_path, tiny_run):
    _, _, reference = tiny_run
    config = write_config(tmp_path, **{"experiments.energy": None, "experiments.superadditivity": None,
                                       "experiments.clustering_time": None, "experiments.entropy": None,
                                       "experiments.orthogonality": None})
    run(tmp_path, config, cores=1)
    for store in (tmp_path / "results" / "simulations").glob("*.zarr"):
        a, b = xr.open_zarr(store).load(), xr.open_zarr(reference / "simulations" / store.name).load()
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)
    assert planned(tmp_path, config) == {}
