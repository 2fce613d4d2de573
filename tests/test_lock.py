"""One controller per results directory: a second one fails at once, naming the holder, and runs nothing."""

import socket
import subprocess
import sys

import pytest
from sweep_helpers import ROOT, run, write_config

from attnflow.cli import main
from attnflow.layout import Layout
from attnflow.run.lock import ResultsBusy, lock_results, release_results, results_holder

HOLD = "import sys, time; from attnflow.run.lock import lock_results; lock_results(sys.argv[1]); " \
       "print('held', flush=True); time.sleep(60)"


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of ``tmp_path/results`` (as a running controller does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "results")], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_holder_fails_naming_the_first(tmp_path, holder):
    assert results_holder(tmp_path / "results") == f"pid {holder.pid} on {socket.gethostname()}"
    with pytest.raises(ResultsBusy, match=rf"{tmp_path / 'results'}.*pid {holder.pid}"):
        lock_results(tmp_path / "results")
    holder.kill()
    holder.wait()
    # The kernel releases the lock with its holder, killed or not.
    assert lock_results(tmp_path / "results") == Layout(tmp_path / "results").lock
    assert lock_results(tmp_path / "results")  # again in the same process: a no-op
    assert results_holder(tmp_path / "results") is None  # this process is no other controller
    release_results(tmp_path / "results")
    assert results_holder(tmp_path / "results") is None  # free, and left free
    lock_results(tmp_path / "results")
    release_results(tmp_path / "results")


def test_asking_creates_nothing(tmp_path):
    assert results_holder(tmp_path / "results") is None and not (tmp_path / "results").exists()


def test_refine_fails_while_another_controller_runs(tmp_path, holder, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = write_config(tmp_path, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {"toy_margin": {"grid": {"beta": [0.25, 1.0], "n": [8]}, "batch_over": ["beta"]}},
    })
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    assert main(["refine", "toy_margin", "--configfile", str(config), "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and str(tmp_path / "results") in err
    assert not (tmp_path / "results" / "figures").exists()


@pytest.mark.workflow
def test_a_second_controller_runs_no_job(tmp_path, holder):
    config = write_config(tmp_path)
    dry = run(tmp_path, config, "-n")  # a dry run changes nothing: it takes no lock, and checks no store
    assert f"another controller (pid {holder.pid}" in dry.stderr
    assert "(the jobs listed may lack repairs), and a run with jobs to do stops at its start" in dry.stderr
    assert [p.name for p in (tmp_path / "results").iterdir()] == [".attnflow.lock"]  # no job parameters
    proc = run(tmp_path, config, check=False)
    assert proc.returncode != 0
    assert f"results directory {tmp_path / 'results'} is in use" in proc.stderr
    assert f"pid {holder.pid}" in proc.stderr
    # Only the lock and the job parameters the run wrote for its DAG (attnflow.jobparams): no job's output.
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [".attnflow.lock", "params"]
