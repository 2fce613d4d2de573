"""Grids that refine themselves: attnflow refine brackets a known boundary and computes only new cells."""

import json

import numpy as np
import pytest
import yaml
from sweep_helpers import ENV, ROOT, planned, write_config

import attnflow
from attnflow import theory
from attnflow.config import load, validate
from attnflow.experiments import registry
from attnflow.refine import refine
from attnflow.store import open_verified, record_of

pytestmark = pytest.mark.workflow


ROUNDS = 3


@pytest.fixture(scope="module")
def refined(tmp_path_factory):
    """``attnflow refine`` run for ROUNDS rounds on a toy grid with two lines (n = 8, 12), each line
    one batch (``batch_over: [beta]``): (workdir, config, record of the refined points). The tests only
    read it."""
    tmp_path = tmp_path_factory.mktemp("refine")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
        monkeypatch.chdir(ROOT)  # the default profile lives there
        config = write_config(tmp_path, **{
            "experiment_modules": ["toy_experiment"],
            "experiments": {"toy_margin": {"fixed": {"d": 12}, "grid": {"beta": [0.25, 1.0], "n": [8, 12]},
                                           "batch_over": ["beta"]}},
        })
        text = config.read_text()
        out = refine(config, "toy_margin", rounds=ROUNDS,
                     snakemake_args=["--cores", "2", "--directory", str(tmp_path)], log=lambda *_: None)
        assert config.read_text() == text  # the config is never written
    return tmp_path, config, out


def test_refinement_reaches_a_known_threshold(refined):
    tmp_path, config, out = refined
    assert out == tmp_path / "results" / "refinement.json"
    # Each round is recorded, with the points it added: one per line of the grid.
    entry = json.loads(out.read_text())["experiments"]["toy_margin"]
    record = entry["rounds"]
    assert [r["round"] for r in record] == list(range(1, ROUNDS + 1)) and all(r["added"] == 2 for r in record)
    assert len(entry["points"]) == 2 * ROUNDS
    summary = open_verified(tmp_path / "results" / "summaries" / "toy_margin.zarr.zip").load()
    for n in (8, 12):
        line = summary.sel(n=n)
        beta, holds = line.beta.values, line.holds.values
        # The sufficient margin at orthogonal tokens changes sign exactly at beta*(2, n) (Thm 19).
        target = float(theory.beta_star(2, n))
        lo = beta[(holds == 1) & (beta <= target)].max()
        hi = beta[(holds == 0) & (beta > target)].min()
        assert lo <= target < hi, n
        # Geometric midpoints: the bracket's log-width halves every round.
        assert np.log(hi / lo) <= np.log(1.0 / 0.25) / 2**ROUNDS * (1 + 1e-9), n
    # Every cell once: the batches' stores hold the 2 x 2 starting cells and two per round.
    cells = [cid for path in (tmp_path / "results" / "simulations").glob("*.zarr.zip")
             for cid in record_of(path)["cells"]]
    assert len(cells) == len(set(cells)) == 4 + 2 * ROUNDS
    # The last round's jobs (one per line; its log is the batch's) computed their new cell and
    # skipped the rest.
    logs = sorted((tmp_path / "results" / "logs" / "simulate").glob("*.log"))
    assert len(logs) == 2
    for log in (path.read_text() for path in logs):
        assert log.count("computed in") == 1 and log.count("complete, skipped") == 1 + ROUNDS
        assert f"{2 + ROUNDS} cells written (1 new)" in log
    # And nothing is left to run.
    assert planned(tmp_path, config) == {}


def test_a_plain_run_after_refine_keeps_the_refined_grid(refined):
    # Issue 42.1: the refined points are part of the config's grid from then on. A plain run of the
    # config plans nothing (on 24e6db2 it reran the batches, dropping the refined cells, and redrew the
    # unrefined figure), and the summary and figure on disk are the refined ones.
    tmp_path, config, _ = refined
    assert planned(tmp_path, config) == {}
    sweep = validate(load(config), reach_scheduler=False, configfile=config)
    assert len(sweep.points["toy_margin"]) == 4 + 2 * ROUNDS
    summary = attnflow.open_summary("toy_margin", configfile=config)  # this config's grid: served
    assert summary.beta.size == len(sweep.specs["toy_margin"].values("beta")) > 2
    figure = (tmp_path / "results" / "figures" / "toy_margin.png").stat().st_mtime_ns
    assert figure >= (tmp_path / "results" / "summaries" / "toy_margin.zarr.zip").stat().st_mtime_ns


def test_each_round_plans_only_new_cells(refined):
    tmp_path, config, out = refined
    sweep = validate(load(config), reach_scheduler=False, configfile=config)
    # The next round's points, before it runs: one bracket per line, beta*(2, 8) and beta*(2, 12)
    # both in [0.25, 1].
    exp = registry(["toy_experiment"]).get("toy_margin")
    with open_verified(tmp_path / "results" / "summaries" / "toy_margin.zarr.zip") as summary:
        new = exp.refinement(summary.load(), sweep.specs["toy_margin"])
    assert sorted(p["n"] for p in new) == [8, 12]
    cfg = load(config)
    cfg["experiments"]["toy_margin"]["extra_points"] = new
    cfg["share_results"] = True  # another config file on these results, on purpose (a dry run alone)
    following = tmp_path / "following.yaml"
    following.write_text(yaml.safe_dump(cfg))
    # A dry run plans one job per line (the batch holding its new cell, after the ticket its run writes:
    # its manifest lacks the cell), plus the summary and figure.
    assert planned(tmp_path, following) == {"ticket": 2, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}


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
    monkeypatch.setattr(attnflow.refine, "refine", lambda *a: calls.append(a) or "results/c/refinement.json")
    assert main(argv) == 0
    assert calls == [("c.yaml", "beta_star", 3, expected)]
