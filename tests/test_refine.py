"""Grids that refine themselves: attnflow refine brackets a known boundary and computes only new cells."""

import numpy as np
import pytest
import yaml
from sweep_helpers import ENV, ROOT, planned, write_config

from attnflow import theory
from attnflow.config import load, validate
from attnflow.experiments import registry
from attnflow.refine import refine
from attnflow.store import open_verified, record_of

pytestmark = pytest.mark.workflow


def test_refinement_reaches_a_known_threshold(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    monkeypatch.chdir(ROOT)  # the default profile lives there
    config = write_config(tmp_path, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {"toy_margin": {"grid": {"beta": [0.25, 1.0], "n": [8]}, "batch_over": ["beta"]}},
    })
    rounds = 4
    messages = []
    args = ["--cores", "2", "--directory", str(tmp_path)]
    out = refine(config, "toy_margin", rounds=rounds, snakemake_args=args, log=messages.append)
    refined = load(out)
    # Each round is recorded, with the points it added.
    record = refined["refinement"]
    assert [r["round"] for r in record] == list(range(1, rounds + 1)) and all(r["added"] == 1 for r in record)
    assert len(refined["experiments"]["toy_margin"]["extra_points"]) == rounds
    summary = open_verified(tmp_path / "results" / "summaries" / "toy_margin.zarr.zip").load().isel(n=0)
    beta, holds = summary.beta.values, summary.holds.values
    # The sufficient margin at orthogonal tokens changes sign exactly at beta*(2, 8) (Thm 19).
    target = float(theory.beta_star(2, 8))
    lo = beta[(holds == 1) & (beta <= target)].max()
    hi = beta[(holds == 0) & (beta > target)].min()
    assert lo <= target < hi
    # Geometric midpoints: the bracket's log-width halves every round.
    assert np.log(hi / lo) <= np.log(1.0 / 0.25) / 2**rounds * (1 + 1e-9)
    # Every cell once: the batches' stores hold the 2 starting cells and one per round.
    cells = [cid for path in (tmp_path / "results" / "simulations").glob("*.zarr.zip")
             for cid in record_of(path)["cells"]]
    assert len(cells) == len(set(cells)) == 2 + rounds
    # The last round's job (its log is the batch's) computed its new cell and skipped the rest.
    log = next((tmp_path / "results" / "logs" / "simulate").glob("*.log")).read_text()
    assert log.count("computed in") == 1 and log.count("complete, skipped") == 1 + rounds
    assert f"{2 + rounds} cells written (1 new)" in log
    # And nothing is left to run.
    assert planned(tmp_path, out) == {}


def test_each_round_plans_only_new_cells(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    monkeypatch.chdir(ROOT)
    config = write_config(tmp_path, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {"toy_margin": {"fixed": {"d": 12}, "grid": {"beta": [0.25, 1.0], "n": [8, 12]},
                                       "batch_over": []}},
    })
    refine(config, "toy_margin", rounds=1, snakemake_args=["--cores", "2", "--directory", str(tmp_path)],
           log=lambda *_: None)
    refined = tmp_path / "config.refined.yaml"
    sweep = validate(load(refined), reach_scheduler=False)
    points = yaml.safe_load(refined.read_text())["experiments"]["toy_margin"]["extra_points"]
    # One bracket per n: beta*(2, 8) and beta*(2, 12) both lie in [0.25, 1].
    assert sorted(p["n"] for p in points) == [8, 12]
    # Round 2's points, before it runs: a dry run plans one job per new cell (batch_over is
    # empty, so each cell is its own batch), plus the summary and figure.
    exp = registry(["toy_experiment"]).get("toy_margin")
    with open_verified(tmp_path / "results" / "summaries" / "toy_margin.zarr.zip") as summary:
        new = exp.refinement(summary.load(), sweep.specs["toy_margin"])
    assert len(new) == 2
    cfg = load(refined)
    cfg["experiments"]["toy_margin"]["extra_points"] += new
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(cfg))
    assert planned(tmp_path, second) == {"simulate": 2, "aggregate": 1, "plot": 1, "all": 1}


@pytest.mark.parametrize("argv, expected", [
    (["refine", "beta_star", "--configfile", "c.yaml", "--rounds", "3"], ["--cores", "all"]),
    (["refine", "--rounds", "3", "beta_star", "--configfile", "c.yaml", "--", "--profile", "p", "-n"],
     ["--profile", "p", "-n"]),
])
def test_refine_command_line_as_the_readme_writes_it(monkeypatch, argv, expected):
    # Options after the experiment are attnflow's; only what follows "--" goes to snakemake.
    import attnflow.refine
    from attnflow.cli import main

    calls = []
    monkeypatch.setattr(attnflow.refine, "refine", lambda *a: calls.append(a) or "c.refined.yaml")
    assert main(argv) == 0
    assert calls == [("c.yaml", "beta_star", 3, expected)]
