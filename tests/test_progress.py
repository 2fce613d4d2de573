"""Progress in ``attnflow status``: the share of cells done and an ETA mid-run (a partial tiny run)."""

import shutil

import numpy as np
import pytest

from attnflow.access import load_sweep
from attnflow.cli import main as attnflow_main
from attnflow.plan import jobs, makespan
from attnflow.progress import benchmark_seconds, progress

pytestmark = pytest.mark.workflow


def _half_run(tiny_run, tmp_path):
    """The tiny run as it stands when only beta_star's jobs have finished (stores and benchmarks)."""
    _, config, results = tiny_run
    sweep = load_sweep(config, results=tmp_path / "results")
    finished = sweep.batches_of("beta_star")
    for sub in ("simulations", "manifests", "benchmarks/simulate"):
        (sweep.results / sub).mkdir(parents=True)
    for batch in finished:
        for path in (f"simulations/{batch}.zarr.zip", f"manifests/{batch}.json",
                     f"benchmarks/simulate/{batch}.tsv"):
            shutil.copy2(results / path, sweep.results / path)  # with its time, as the manifest recorded it
    return sweep, finished


def test_share_done_and_eta_mid_run(tiny_run, tmp_path):
    sweep, finished = _half_run(tiny_run, tmp_path)
    report, scale, measured = progress(sweep, cores=2)
    assert measured == len(finished)
    expected = {name: job.expected_seconds for name, job in jobs(load_sweep(
        tiny_run[1], results=tmp_path / "nothing")).items()}  # every job from scratch
    seconds = benchmark_seconds(sweep.results)
    assert scale == pytest.approx(np.median([seconds[b] / expected[b] for b in finished]))
    assert report["beta_star"].share == 1.0 and report["beta_star"].eta_seconds == 0
    assert report["toy_margin"].share == 1.0  # its cells are beta_star's
    assert report["energy"].share == 0.0 and report["energy"].eta_seconds > 0
    left = [expected[b] * scale for b in sweep.batches if b not in finished]
    # 2 cores: two one-thread jobs at a time, longest first; more than the longest, less than all in turn
    assert report["total"].eta_seconds == pytest.approx(makespan(left, 2))
    assert max(left) < report["total"].eta_seconds < sum(left)
    assert report["total"].done == sum(len(sweep.batches[b]) for b in finished)


def test_status_prints_progress(tiny_run, tmp_path, capsys):
    sweep, finished = _half_run(tiny_run, tmp_path)
    assert attnflow_main(["status", "--configfile", str(tiny_run[1]), "--results", str(sweep.results),
                          "--cores", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert next(line for line in lines if line.startswith("beta_star")).split()[1:3] == ["4", "4"]
    assert any(line.startswith("progress beta_star") and "100.0% (4/4 cells), done" in line for line in lines)
    assert any(line.startswith("progress energy") and "0.0% (0/2 cells), ETA" in line for line in lines)
    assert f"{len(finished)} finished jobs ran" in out
