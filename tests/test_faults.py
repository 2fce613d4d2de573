"""Fault tolerance: kills mid-write, NaN, failed cells, shared cells, determinism across core counts."""

import importlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from sweep_helpers import ENV, assert_same_cells, planned, run, snakemake_cmd, stored, write_config

from attnflow import Cell, simulate
from attnflow.cli import main as attnflow_main
from attnflow.config import validate
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.run.batch import run_batch
from attnflow.store import record_of, verify

simulate_module = importlib.import_module("attnflow.simulation")
engines_module = importlib.import_module("attnflow.engines")

pytestmark = pytest.mark.workflow


def _poisoned_solvers(poison):
    """``engines.solver_for`` whose stored runs are poisoned (at the cell's rtol: not the certificate's
    companion run, at another)."""
    real_for = engines_module.solver_for

    def solver_for(cell):
        real = real_for(cell)

        def solve(problem, controller, *args, **kwargs):
            result = real(problem, controller, *args, **kwargs)
            if controller.rtol == cell.rtol:
                poison(result)
            return result
        return solve
    return solver_for


def _nan(result):
    result.variables["gamma_mean"][0, -1] = np.nan


def _off_sphere(result):
    result.norm_drift[0] = 0.5


@pytest.mark.parametrize("poison, message, when", [
    (_nan, "non-finite values in gamma_mean at t = 1 of 1", 1.0),  # the last of 5 samples
    (_off_sphere, "tokens left the sphere (drift 0.5)", 1.0),  # measured over the run: its end
])
def test_bad_numbers_fail_their_seed_and_the_cell_keeps_the_others(tmp_path, monkeypatch, poison, message,
                                                                     when):
    monkeypatch.setattr(engines_module, "solver_for", _poisoned_solvers(poison))
    cell = Cell(H=2, n=5, d=4, beta=0.7, seeds=2, t_max=1.0, n_samples=5)
    ds = simulate(cell)
    assert ds.failed.values.tolist() == [True, False] and ds.t_failed.values[0] == when
    assert ds.attrs["seed_failures"] == f"1 of 2 seeds failed: {message.split(' at t')[0]} (seed 0" + (
        f"; the first at {message.split(' at ')[1]})" if " at t" in message else ")")
    assert np.isfinite(ds.gamma_mean.values[1]).all() and np.isfinite(ds.gamma_mean.values[0, :-1]).all()
    # The batch stores the cell with its failed seed (issue 39): nothing to retry, nothing lost.
    layout = Layout(tmp_path)
    result = run_batch([cell], "b", layout, log=lambda *_: None)
    assert not result.failed and list(result.seed_failures) == [cell_id(cell)]
    assert set(result.cells) == {cell_id(cell)} and layout.store("b").exists()


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
    while not list(sims.rglob("*.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the job is now mid-write
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = list(sims.rglob("*.partial-*"))
    assert len(partial) == 1, "the job should have been killed while writing one store"
    assert not list(sims.glob("*.zarr.zip")), "no store may look complete after the kill"
    target_store = partial[0].with_name(partial[0].name.split(".partial-")[0])
    assert verify(target_store).status == "interrupted"

    run(tmp_path, config, "--unlock")
    # Exactly the killed job reruns (with its summary and figure downstream).
    assert planned(tmp_path, config, target) == {"simulate": 1, "aggregate": 1, "plot": 1}
    # The killed job runs again (its summary and figure, planned above, are any run's: not drawn here).
    run(tmp_path, config, "--cores", "1", target, "--until", "simulate")
    assert not list(sims.rglob("*.partial-*"))  # the dead writer's file is cleaned up
    assert not (sims / ".pending").exists() or not any((sims / ".pending").iterdir())
    got = stored(tmp_path / "results")
    assert got
    assert_same_cells(got, stored(reference))


def _resumes(cells, layout, kept, monkeypatch, real):
    """The batch "b" run again with the real ``simulate``: the ``kept`` cells a stopped job checkpointed
    are skipped, the others computed, every cell stored and the checkpoints gone."""
    monkeypatch.setattr(simulate_module, "simulate", real)
    log = []
    result = run_batch(cells, "b", layout, log=log.append)
    assert sum("finished by a killed job" in line for line in log) == kept
    assert sum("computed in" in line for line in log) == len(cells) - kept
    assert set(result.cells) == {cell_id(c) for c in cells} and not layout.pending("b").exists()


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_an_interrupted_job_keeps_every_cell_it_finished(tmp_path, monkeypatch, stop):
    """Ctrl-C (SIGINT to the job) or SIGTERM (SLURM's time limit, scancel, kill) mid-batch: the cells
    finished since the last checkpoint are checkpointed on the way out, and the next run computes none of
    them again (before, up to CHECKPOINT_SECONDS of finished cells were lost)."""
    from attnflow.run.jobs import stop_on_sigterm

    cells = [Cell(H=1, n=3, d=3, beta=beta, seeds=1, t_max=0.5, n_samples=2) for beta in (0.5, 1.0, 2.0, 4.0)]
    layout = Layout(tmp_path / "stopped")
    real, calls = simulate_module.simulate, []

    def stopped_at_the_third(cell, **kwargs):
        calls.append(cell)
        if len(calls) == 3:
            if stop == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next bytecode, in this frame
        return real(cell, **kwargs)

    monkeypatch.setattr(simulate_module, "simulate", stopped_at_the_third)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt if stop == "ctrl-c" else SystemExit) as err, stop_on_sigterm():
        run_batch(cells, "b", layout, log=lambda *_: None)  # CHECKPOINT_SECONDS: none before the stop
    assert signal.getsignal(signal.SIGTERM) is previous  # simulate_job's handler is its own
    if stop == "sigterm":
        assert err.value.code == 128 + signal.SIGTERM  # what a shell reports for a job killed by SIGTERM
    assert not layout.store("b").exists() and len(list(layout.pending("b").iterdir())) == 1
    _resumes(cells, layout, kept=2, monkeypatch=monkeypatch, real=real)


def test_failed_seeds_are_stored_reported_and_never_recomputed(tmp_path, capsys):
    # Flat usa blows up in finite time: t_max = 5 makes the delta = 0.1 cell's seeds fail (step-size
    # underflow) while t_max = 0.2 finishes. Every cell is stored, its failed seeds marked.
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
    assert first.returncode == 0  # a failed seed fails neither the run nor its cell (issue 39)
    assert "cells hold failed seeds" in first.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert "orthogonality (t_max=5, delta=0.1): 2 of 2 seeds failed: step size underflow" in logs
    sims = tmp_path / "results" / "simulations"
    done = {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr.zip")}
    cells = stored(tmp_path / "results")
    assert len(cells) == 4 and sum(int(ds.failed.sum()) for ds in cells.values()) >= 2
    for ds in cells.values():  # what was written is trustworthy: a seed that did not fail is finite
        assert np.isfinite(ds.energy.values[~ds.failed.values]).all()

    second = run(tmp_path, config, check=False)
    assert second.returncode == 0 and "Nothing to be done" in second.stdout + second.stderr
    assert second.stderr.count("skipping known failures") == 1
    assert {p.name: p.stat().st_mtime_ns for p in sims.glob("*.zarr.zip")} == done

    capsys.readouterr()
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("orthogonality"))
    # cells, done, missing, failed (whole, or every seed: stored, but no number to use)
    assert [int(v) for v in row.split()[1:5]] == [4, 2, 0, 2]
    assert "failed seeds orthogonality (t_max=5, delta=0.1): 2 of 2 seeds failed" in out


def test_status_without_a_config_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnflow.cli", "status", "--configfile",
                           str(tmp_path / "nowhere.yaml")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "nowhere.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_same_seeds_bit_identical_on_one_and_two_threads(beta_star_run, tiny_run):
    # tiny_run's simulate jobs ran at one thread each; beta_star_run (the tiny config's beta_star
    # alone) at two, the rule's own: the same cells, the same numbers.
    _, _, one_thread = tiny_run
    workdir, config, results = beta_star_run
    two_threads = stored(results)
    assert two_threads
    assert_same_cells(two_threads, stored(one_thread))
    assert planned(workdir, config) == {}


def shared_cells_config(tmp: "os.PathLike") -> "os.PathLike":
    """Two experiments whose grids hold the same cells (beta_star and toy_margin at n = 4)."""
    # Tolerances named: the experiments' defaults differ (each fitted to its own block).
    cell = {"heads": "block", "d": 4, "seeds": 2, "t_max": 2.0, "n_samples": 11, "stop_at_cluster": False,
            "rtol": 1e-6, "atol": 1e-9}
    return write_config(tmp, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {
            "beta_star": {"fixed": {**{k: v for k, v in cell.items() if k != "heads"},  # heads on its grid
                                    "observables": ["radial", "energy"]},
                          "grid": {"H": [2], "n": [4, 6], "attention": ["softmax"], "heads": ["block"],
                                   "beta": [0.5, 1.0, 2.0]}, "batch_over": ["beta"]},
            "toy_margin": {"fixed": {**cell, "init": "uniform", "H": 2,
                                     "observables": ["energy", "energy_path"]},
                           "grid": {"beta": [0.5, 1.0, 2.0], "n": [4]}, "batch_over": []},
        },
    })


def test_two_experiments_sharing_cells_write_each_store_once(tmp_path):
    config = shared_cells_config(tmp_path)
    proc = run(tmp_path, config, cores=4)
    sims = tmp_path / "results" / "simulations"
    stores = sorted(sims.glob("*.zarr.zip"))
    assert stores and all(verify(s).ok for s in stores)
    held = [cid for s in stores for cid in record_of(s)["cells"]]
    assert len(held) == len(set(held)) == 6  # 2 n x 3 beta, toy's 3 shared: each cell in one store
    assert not list(sims.rglob("*.partial-*"))
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs" / "simulate").rglob("*.log"))
    assert logs.count("computed in") == 6
    assert "Directory not empty" not in proc.stdout + proc.stderr
    # The same numbers as the first experiment's batches alone, simulated here as its jobs simulate them
    # (run_batch; its stores are what is compared).
    alone = tmp_path / "alone"
    cfg = yaml.safe_load(config.read_text())
    cfg["results"] = str(alone / "results")
    del cfg["experiments"]["toy_margin"]
    sweep = validate(cfg, reach_scheduler=False)
    for batch, cells in sweep.batches.items():
        run_batch(cells, batch, sweep.layout, log=lambda *_: None)
    shared, first_alone = stored(tmp_path / "results"), stored(alone / "results")
    assert set(shared) == set(first_alone)
    assert_same_cells(shared, first_alone)


def test_a_killed_job_resumes_from_its_checkpoints(tmp_path, monkeypatch):
    """A job killed mid-batch keeps the cells it checkpointed; its successor computes only the others,
    and the batch's store holds the numbers an uninterrupted job writes."""
    import attnflow.run.batch as batch_module

    cells = [Cell(H=1, n=3, d=3, beta=beta, seeds=1, t_max=0.5, n_samples=2) for beta in (0.5, 1.0, 2.0, 4.0)]
    layout = Layout(tmp_path / "killed")
    monkeypatch.setattr(batch_module, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every cell
    real, calls = simulate_module.simulate, []

    def killed_at_the_third(cell, **kwargs):
        calls.append(cell)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the job dies mid-batch
        return real(cell, **kwargs)

    monkeypatch.setattr(simulate_module, "simulate", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_batch(cells, "b", layout, log=lambda *_: None)
    assert not layout.store("b").exists() and len(list(layout.pending("b").iterdir())) == 2
    _resumes(cells, layout, kept=2, monkeypatch=monkeypatch, real=real)
    whole = Layout(tmp_path / "whole")
    run_batch(cells, "b", whole, log=lambda *_: None)
    assert_same_cells(stored(tmp_path / "killed"), stored(tmp_path / "whole"))
