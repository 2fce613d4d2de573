"""Which config owns a results directory (``run.owner.foreign_owner``), without running the workflow:
a damaged or missing owner record, the same config named by another path, moved with its results or run
with other run-time switches, and a config whose keys are reordered (which batch owns a shared cell)."""

import json
import os
import shutil

import pytest
import yaml
from sweep_helpers import NOT_BETA_STAR, TINY, beta_star_config

from attnflow.access import load_sweep
from attnflow.config import load, validate
from attnflow.ids import cell_id
from attnflow.run.jobs import batch_params
from attnflow.run.owner import claim_results, foreign_owner, owner_of

ROOT = TINY.parents[1]


def _manifest(sweep, batch, cells):
    """A finished batch's manifest as another config's run leaves it: it records ``cells``."""
    path = sweep.layout.manifest(batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 2, "cells": {c: "g0" for c in cells}, "failed": {},
                                "size": 1, "mtime_ns": 1}))


@pytest.mark.parametrize("text", ["", '{"config": "a.yaml", "pa', "[]", "3", "{}", '"config"'])
def test_an_unreadable_owner_record_is_a_refusal_never_a_takeover(tmp_path, text):
    config = beta_star_config(tmp_path)
    sweep = load_sweep(config)
    sweep.layout.owner.parent.mkdir(parents=True)
    sweep.layout.owner.write_text(text)
    why = foreign_owner(sweep, config)
    # Names the file, says the owner is unknown and how to go on (delete it if ours, or take over).
    assert why is not None and str(sweep.layout.owner) in why and "unknown" in why
    assert f"delete {sweep.layout.owner}" in why and "share_results" in why
    # Taking the directory over is still possible, on purpose.
    shared = validate({**load(config), "share_results": True}, reach_scheduler=False, configfile=config)
    assert foreign_owner(shared, config) is None


def test_a_deleted_owner_record_lets_no_other_grid_drop_cells(tmp_path):
    config = beta_star_config(tmp_path)
    sweep = load_sweep(config)
    batch = next(iter(sweep.batches))
    # Nothing there yet, or only this config's own cells: the first run (or a folder of an attnflow that
    # wrote no record) goes on.
    assert foreign_owner(sweep, config) is None
    _manifest(sweep, batch, [cell_id(c) for c in sweep.batches[batch]])
    assert foreign_owner(sweep, config) is None
    # Cells of another grid in a batch of the same name, and no record: refused, naming the loss.
    _manifest(sweep, batch, [cell_id(c) for c in sweep.batches[batch]] + ["0123456789abcdef"])
    why = foreign_owner(sweep, config)
    assert why and "has no owner record" in why and "would drop 1 of its cells" in why


def test_the_owner_is_the_same_file_by_any_path(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = beta_star_config(tmp_path / "a", name="exp.yaml")
    claim_results(load_sweep(config), config)
    edited = beta_star_config(tmp_path / "a", name="exp.yaml",
                              **{"experiments.beta_star.grid.beta": [0.5, 4.0]})
    other_path = tmp_path / "b" / ".." / "a" / "exp.yaml"
    os.symlink(tmp_path / "a", tmp_path / "linked")
    for path in (edited, other_path, tmp_path / "linked" / "exp.yaml"):
        sweep = load_sweep(path)
        _manifest(sweep, next(iter(sweep.batches)), ["0123456789abcdef"])  # something it would drop
        assert foreign_owner(sweep, path) is None, path


@pytest.mark.parametrize("switch", [{"retry_failures": True}, {"dask_scheduler": "threads"},
                                    {"figure_width": 3.5}])
def test_run_time_switches_are_no_other_config(tmp_path, switch):
    config = beta_star_config(tmp_path)
    claim_results(load_sweep(config), config)
    # A copy elsewhere (another working copy) with a switch set: the same grids, so the same config.
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "config.yaml"
    copy.write_text(yaml.safe_dump({**load(config), **switch}))
    sweep = validate({**load(copy)}, reach_scheduler=False, configfile=copy)
    _manifest(sweep, next(iter(sweep.batches)), ["0123456789abcdef"])
    assert foreign_owner(sweep, copy) is None
    # Another grid from that copy is another config.
    block = load(config)["experiments"]["beta_star"]
    block["grid"]["beta"] = [0.5, 4.0]
    copy.write_text(yaml.safe_dump({**load(config), **switch, "experiments": {"beta_star": block}}))
    assert "belongs to config" in foreign_owner(load_sweep(copy), copy)


def test_a_project_moved_with_its_results_accepts_its_own_edited_config(tmp_path):
    project = tmp_path / "project"
    (project / "config").mkdir(parents=True)
    config = project / "config" / "exp.yaml"
    cfg = yaml.safe_load(TINY.read_text())
    for other in NOT_BETA_STAR:
        cfg["experiments"].pop(other, None)
    cfg["results"] = "results/exp"  # relative to the working directory: the project
    config.write_text(yaml.safe_dump(cfg))
    os.chdir(project)
    try:
        claim_results(load_sweep("config/exp.yaml"), "config/exp.yaml")
        assert json.loads((project / "results" / "exp" / "attnflow-owner.json").read_text())["path"] == \
            str(config.resolve())
    finally:
        os.chdir(ROOT)
    moved = tmp_path / "scratch" / "project"
    moved.parent.mkdir()
    shutil.move(project, moved)
    cfg["experiments"]["beta_star"]["grid"]["beta"] = [0.5, 4.0]  # edited after the move
    (moved / "config" / "exp.yaml").write_text(yaml.safe_dump(cfg))
    os.chdir(moved)
    try:
        sweep = load_sweep("config/exp.yaml")
        _manifest(sweep, next(iter(sweep.batches)), ["0123456789abcdef"])
        assert owner_of(sweep.results)["path"] != str((moved / "config" / "exp.yaml").resolve())
        assert foreign_owner(sweep, "config/exp.yaml") is None
        # Another config file beside it is still another config.
        (moved / "config" / "other.yaml").write_text(yaml.safe_dump(cfg))
        assert "belongs to config" in foreign_owner(load_sweep("config/other.yaml"), "config/other.yaml")
    finally:
        os.chdir(ROOT)


def _sorted_keys(value):
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value, reverse=True)}
    return value


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_reordering_a_configs_keys_changes_no_batch_and_no_job(tmp_path, name):
    # Every mapping's keys in reverse order (experiments, blocks, grids, fixed fields): what a formatter
    # that sorts keys does, the other way round so that sorted and shipped orders both differ from it.
    cfg = load(ROOT / "config" / name)
    shuffled = tmp_path / name
    shuffled.write_text(yaml.safe_dump(_sorted_keys(cfg), sort_keys=False))
    a = validate(cfg, reach_scheduler=False, configfile=ROOT / "config" / name)
    b = validate(load(shuffled), reach_scheduler=False, configfile=shuffled)
    assert list(load(shuffled)["experiments"]) != list(cfg["experiments"])
    assert a.owner == b.owner  # every cell in the same batch
    assert {k: batch_params(a, k, write=False) for k in a.batches} == \
        {k: batch_params(b, k, write=False) for k in b.batches}  # the same simulate jobs' params
