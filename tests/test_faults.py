"""Fault tolerance: kills mid-write, NaN, failed cells, shared cells, determinism across core counts."""

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
import yaml
from sweep_helpers import ENV, planned, run, snakemake_cmd, write_config

from attnflow import Cell, SimulationError, simulate
from attnflow.store import verify
from attnflow.sweep import failure_path, run_batch, store_path

simulate_module = importlib.import_module("attnflow.simulation")

pytestmark = pytest.mark.workflow


def _poisoned_solve(poison):
    real = simulate_module.solve

    def solve(*args, **kwargs):
        result = real(*args, **kwargs)
        poison(result)
        return result
    return solve


def _nan(result):
    result.variables["gamma_mean"][0, -1] = np.nan


def _off_sphere(result):
    result.norm_drift[0] = 0.5


@pytest.mark.parametrize("poison, message", [
    (_nan, "non-finite values in gamma_mean"),
    (_off_sphere, "left the sphere"),
])
def test_bad_numbers_fail_naming_the_cell_and_write_no_store(tmp_path, monkeypatch, poison, message):
    monkeypatch.setattr(simulate_module, "solve", _poisoned_solve(poison))
    cell = Cell(H=2, n=5, d=4, beta=0.7, seeds=2, t_max=1.0, n_samples=5)
    with pytest.raises(SimulationError, match=rf"cell\(H=2, n=5, d=4, beta=0.7.*{message}"):
        simulate(cell)
    # The batch records the failure and goes on (issue 16): no raise.
    assert list(run_batch([cell], tmp_path, log=lambda *_: None).failed) == [json.loads(
        failure_path(tmp_path, cell).read_text())["cell_id"]]
    assert not store_path(tmp_path, cell).exists()
    record = json.loads(failure_path(tmp_path, cell).read_text())
    assert "beta=0.7" in record["error"] and record["cell"]["beta"] == 0.7


def test_killed_job_leaves_no_complete_store_and_resumes(tmp_path, tiny_run):
    _, _, reference = tiny_run
    config = write_config(tmp_path)
    target = str(tmp_path / "results" / "figures" / "orthogonality.png")
    proc = subprocess.Popen(snakemake_cmd(tmp_path, config, "--cores", "1", target),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **ENV, "ATTNFLOW_FAULT": "hang-before-rename"},
                            start_new_session=True)
    sims = tmp_path / "results" / "simulations"
    deadline = time.monotonic() + 120
    while not list(sims.glob("*.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # let the partial store's metadata land: the job is now mid-write
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = list(sims.glob("*.partial-*"))
    assert len(partial) == 1, "the job should have been killed while writing one store"
    assert not list(sims.glob("*.zarr")), "no store may look complete after the kill"
    stem = partial[0].name.split(".partial-")[0]
    assert verify(sims / stem).status == "interrupted"

    run(tmp_path, config, "--unlock")
    # Exactly the killed job reruns (with its summary and figure downstream).
    assert planned(tmp_path, config, target) == {"simulate": 1, "aggregate": 1, "plot": 1}
    run(tmp_path, config, "--cores", "1", target)
    assert not list(sims.glob("*.partial-*"))  # the dead writer's directory is cleaned up
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
        "experiments": {"orthogonality": {
            "fixed": {"heads": "perturbed_block", "attention": "usa", "geometry": "flat", "init": "uniform",
                      "H": 2, "n": 6, "d": 4, "beta": 1.0, "seeds": 2, "n_samples": 11},
            "grid": {"delta": [0.0, 0.1], "t_max": [0.2, 5.0]},
            "batch_over": ["delta", "t_max"],
        }},
    }
    config.write_text(yaml.safe_dump(cfg))
    first = run(tmp_path, config, check=False)
    assert first.returncode == 0  # a failed cell no longer fails the run (issue 16): it is reported
    assert "cells failed" in first.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert "FAILED: cell(H=2, n=6, d=4, beta=1.0, attention='usa'" in logs
    sims = tmp_path / "results" / "simulations"
    done = {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr")}
    assert len(done) >= 1 and len(list(sims.glob("*.failed.json"))) >= 1
    for store in done:  # what was written is trustworthy
        ds = xr.open_zarr(sims / store)
        assert np.isfinite(ds.energy.values).all()

    second = run(tmp_path, config, check=False)
    assert second.returncode == 0  # the failed cells retried once, the finished ones skipped
    assert {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr")} == done
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert "complete, skipped" in logs

    status = subprocess.run([sys.executable, "-m", "attnflow.cli", "status", "--configfile", str(config)],
                            capture_output=True, text=True)
    assert status.returncode == 0
    row = next(line for line in status.stdout.splitlines() if line.startswith("orthogonality"))
    cells, n_done, missing, failed = (int(v) for v in row.split()[1:5])
    assert cells == 4 and n_done == len(done) and failed >= 1
    assert "failed orthogonality/" in status.stdout


def test_status_without_a_config_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "status", "--configfile",
                           str(tmp_path / "nowhere.yaml")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "nowhere.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_same_seeds_bit_identical_on_one_core(beta_star_run, tiny_run):
    _, _, reference = tiny_run
    # beta_star_run: the tiny config's beta_star alone, run on one core (the session's shared run).
    workdir, config, results = beta_star_run
    for store in (results / "simulations").glob("*.zarr"):
        a, b = xr.open_zarr(store).load(), xr.open_zarr(reference / "simulations" / store.name).load()
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)
    assert planned(workdir, config) == {}


def shared_cells_config(tmp: "os.PathLike") -> "os.PathLike":
    """Two experiments whose grids hold the same cells (beta_star and toy_margin at n = 4)."""
    cell = {"heads": "block", "d": 4, "seeds": 2, "t_max": 2.0, "n_samples": 11, "stop_at_cluster": False}
    return write_config(tmp, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {
            "beta_star": {"fixed": {**cell, "observables": ["radial", "energy"]},
                          "grid": {"H": [2], "n": [4, 6], "attention": ["softmax"], "heads": ["block"],
                                   "beta": [0.5, 1.0, 2.0]}, "batch_over": ["beta"]},
            "toy_margin": {"fixed": {**cell, "init": "uniform", "H": 2, "observables": ["energy"]},
                           "grid": {"beta": [0.5, 1.0, 2.0], "n": [4]}, "batch_over": []},
        },
    })


def test_two_experiments_sharing_cells_write_each_store_once(tmp_path):
    config = shared_cells_config(tmp_path)
    proc = run(tmp_path, config, cores=4)
    sims = tmp_path / "results" / "simulations"
    stores = sorted(sims.glob("*.zarr"))
    assert len(stores) == 6 and all(verify(s).ok for s in stores)  # 2 n x 3 beta, toy's 3 shared
    assert not list(sims.glob("*.partial-*"))
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert logs.count("written") == 6 and "already written" not in logs
    assert "Directory not empty" not in proc.stdout + proc.stderr
    # The same numbers as a run of the first experiment alone.
    alone = tmp_path / "alone"
    alone.mkdir()
    cfg = yaml.safe_load(config.read_text())
    cfg["results"] = str(alone / "results")
    del cfg["experiments"]["toy_margin"]
    (alone / "c.yaml").write_text(yaml.safe_dump(cfg))
    run(alone, alone / "c.yaml", "--until", "simulate")  # its stores are what is compared
    for store in stores:
        a, b = xr.open_zarr(store).load(), xr.open_zarr(alone / "results" / "simulations" / store.name).load()
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)
    assert {p.name for p in (alone / "results" / "simulations").glob("*.zarr")} == {s.name for s in stores}
