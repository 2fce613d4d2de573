"""One results directory per config; nothing stale or another config's is served; nothing computed is lost.

Issues 39.1 and 42.1-42.4, 42.6-42.7: each test below failed on 24e6db2.
"""

import json
import os
import shutil
import subprocess

import pytest
import yaml
from sweep_helpers import ROOT, beta_star_config, planned, run, snapshot, stored, write_config

import attnflow
from attnflow.access import OutdatedSummary, load_sweep
from attnflow.cli import main as attnflow_main
from attnflow.config import validate
from attnflow.errors import ConfigError
from attnflow.run.jobs import sweep_from_workflow
from attnflow.store import record_of, verify, write


# --- where results go ----------------------------------------------------------------------------------
def _without_results(path, **edits):
    """The tiny beta_star config at ``path`` with no ``results`` key (results/<its stem>)."""
    config = beta_star_config(path.parent, path.name, results=None, **edits)
    assert "results" not in yaml.safe_load(config.read_text())
    return config


def test_a_config_without_results_gets_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _without_results(tmp_path / "paper.yaml")
    # The notebook API, the commands (through load_sweep) and the Snakefile resolve it alike.
    assert load_sweep(config).results == load_sweep("paper.yaml").results
    assert str(load_sweep(config).results) == "results/paper"
    assert sweep_from_workflow(yaml.safe_load(config.read_text()), [str(config)]).results.as_posix() \
        == "results/paper"
    # The shipped configs each name their own, found beside their Snakefile from another directory.
    assert load_sweep(ROOT / "config" / "config.yaml").results == ROOT / "results" / "default"
    assert load_sweep(ROOT / "config" / "paper.yaml").results == ROOT / "results" / "paper"


def test_results_with_a_tilde_is_expanded_and_braces_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    sweep = load_sweep(beta_star_config(tmp_path, results="~/out"))
    assert sweep.results == tmp_path / "out"  # never a directory named "~" in the working copy
    with pytest.raises(ConfigError, match=r"^results = 'res\{x\}': braces"):
        load_sweep(beta_star_config(tmp_path, results="res{x}"))


def test_a_directory_in_the_way_of_a_store_is_moved_aside(tmp_path, capsys):
    import xarray as xr

    path = tmp_path / "b.zarr.zip"
    (path / "inside").mkdir(parents=True)
    assert verify(path).status == "corrupt" and "a directory" in verify(path).detail
    assert write(xr.Dataset({"x": ("t", [1.0, 2.0])}), path, replace=True)
    assert verify(path).ok
    aside = [p for p in tmp_path.iterdir() if ".in-the-way-" in p.name]
    assert len(aside) == 1 and (aside[0] / "inside").is_dir()  # nothing deleted
    assert f"{path} was a directory" in capsys.readouterr().err


def test_refine_puts_the_target_before_the_passthrough_arguments(tmp_path, monkeypatch):
    import attnflow.refine

    config = beta_star_config(tmp_path)
    calls = []
    monkeypatch.setattr(attnflow.refine.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(attnflow.refine, "lock_for_child", lambda results: ({}, ()))
    attnflow.refine.run_workflow(config, "beta_star", ROOT / "Snakefile", ["--cores", "2", "-q"],
                                 log=lambda *_: None)
    cmd = calls[0]
    # `-q` takes the word after it and --configfile every word: the target goes first.
    assert cmd[3].endswith("figures/beta_star.png") and cmd[-3:] == ["--cores", "2", "-q"]


def test_plan_warns_of_a_sweep_of_too_many_jobs(tmp_path, monkeypatch, capsys):
    import attnflow.plan

    config = beta_star_config(tmp_path)
    assert attnflow_main(["plan", "--configfile", str(config), "--cores", "2"]) == 0
    assert "batch_over" not in capsys.readouterr().out
    monkeypatch.setattr(attnflow.plan, "MANY_JOBS", 1)  # the tiny config's 2 jobs stand for 10,000
    assert attnflow_main(["plan", "--configfile", str(config), "--cores", "2"]) == 0
    assert "2 simulate jobs" in (out := capsys.readouterr().out) and "batch_over" in out


# --- summaries: never another grid's, never stale --------------------------------------------------------
def _copy(beta_star_run, tmp_path):
    _, config, results = beta_star_run
    shutil.copytree(results, tmp_path / "results")
    return beta_star_config(tmp_path), tmp_path / "results"


def test_open_summary_raises_on_a_summary_of_another_grid(beta_star_run, tmp_path):
    config, _ = _copy(beta_star_run, tmp_path)
    assert attnflow.open_summary("beta_star", configfile=config).beta.size == 2
    edited = beta_star_config(tmp_path, "edited.yaml", **{"experiments.beta_star.grid.beta": [0.5, 1.0]})
    with pytest.raises(OutdatedSummary, match=r"another grid.*snakemake .*beta_star\.zarr\.zip --configfile"):
        attnflow.open_summary("beta_star", configfile=edited)


def test_open_summary_and_export_raise_on_a_stale_summary(beta_star_run, tmp_path, monkeypatch, capsys):
    import attnflow.numerics

    config, _ = _copy(beta_star_run, tmp_path)
    monkeypatch.setattr(attnflow.numerics, "NUMERICS_VERSION", attnflow.numerics.NUMERICS_VERSION + 1)
    with pytest.raises(OutdatedSummary, match=r"stale \(written under numerics_version .*snakemake "):
        attnflow.open_summary("beta_star", configfile=config)
    assert attnflow_main(["export", "beta_star", "--configfile", str(config)]) == 2
    assert "stale" in capsys.readouterr().err


def test_status_says_replaced_since_for_a_touched_store(beta_star_run, tmp_path, capsys):
    config, results = _copy(beta_star_run, tmp_path)
    store = sorted((results / "simulations").glob("*.zarr.zip"))[0]
    os.utime(store, ns=(store.stat().st_atime_ns, store.stat().st_mtime_ns + 10**9))
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    assert "replaced since" in out and "corrupt beta_star" not in out
    assert "100.0% (4/4 cells)" in out  # intact: every byte was checked


def test_status_never_says_done_beside_damage(beta_star_run, tmp_path, capsys):
    config, results = _copy(beta_star_run, tmp_path)
    store = sorted((results / "simulations").glob("*.zarr.zip"))[0]
    # Bit rot: one byte of a chunk flipped, the size and time kept (only --deep sees it).
    stat, data = store.stat(), bytearray(store.read_bytes())
    members = record_of(store)["members"]
    member = max(members, key=lambda k: members[k]["size"])  # a chunk of data, many bytes long
    data[bytes(data).index(member.encode()) + len(member) + members[member]["size"] // 2] ^= 0xFF
    store.write_bytes(bytes(data))
    os.utime(store, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert attnflow_main(["status", "--configfile", str(config), "--deep"]) == 0
    out = capsys.readouterr().out
    assert "corrupt beta_star" in out and "100.0%" not in out


# --- workflow runs ---------------------------------------------------------------------------------------
def _outputs(results):
    """Every file of a results directory (mtime and bytes) but the controllers' lock, which a dry run
    takes a moment to see who holds it."""
    return {k: v for k, v in snapshot(results).items() if k != ".attnflow.lock"}


@pytest.mark.workflow
def test_two_configs_in_turn_leave_each_other_alone(beta_star_run, tmp_path, monkeypatch, capsys):
    from attnflow.run.owner import claim_results

    monkeypatch.chdir(tmp_path)  # where the configs' results/<name> directories are (Snakemake's --directory)
    # Default-like and paper-like: the same experiment and batch names (H, n, attention, heads), other
    # beta values, neither naming `results`: results/default and results/paper in one working copy.
    default = _without_results(tmp_path / "default.yaml")
    paper = _without_results(tmp_path / "paper.yaml", **{"experiments.beta_star.grid.beta": [0.5, 1.0, 2.0]})
    # The default's run: the session's run of the same grids, copied in (times kept) and claimed as a
    # run of default.yaml claims it.
    shutil.copytree(beta_star_run[2], tmp_path / "results" / "default")
    claim_results(load_sweep(default), default)
    assert planned(tmp_path, default) == {}
    before = _outputs(tmp_path / "results" / "default")
    run(tmp_path, paper)
    assert _outputs(tmp_path / "results" / "default") == before
    paper_before = _outputs(tmp_path / "results" / "paper")
    assert planned(tmp_path, default) == {} and planned(tmp_path, paper) == {}
    assert _outputs(tmp_path / "results" / "paper") == paper_before
    assert attnflow.open_summary("beta_star", configfile=default).beta.size == 2
    assert attnflow.open_summary("beta_star", configfile=paper).beta.size == 3
    assert json.loads((tmp_path / "results" / "default" / "attnflow-owner.json").read_text())["config"] \
        == str(default)

    # A third config pointed at the default's directory on purpose: its run is refused, naming the owner,
    # what it would drop and how to go on; its dry run and plan say so; its summary is never served.
    other = beta_star_config(tmp_path, "other.yaml", results=str(tmp_path / "results" / "default"),
                             **{"experiments.beta_star.grid.beta": [0.5, 4.0]})
    proc = run(tmp_path, other, check=False)
    assert proc.returncode != 0
    assert f"belongs to config {default}" in proc.stderr and "would drop 2 of its cells" in proc.stderr
    assert "share_results" in proc.stderr
    assert f"belongs to config {default}" in run(tmp_path, other, "-n").stderr
    assert _outputs(tmp_path / "results" / "default") == before
    capsys.readouterr()
    assert attnflow_main(["plan", "--configfile", str(other)]) == 0
    assert f"belongs to config {default}" in capsys.readouterr().err
    with pytest.raises(OutdatedSummary, match=f"belongs to config {default}"):
        attnflow.open_summary("beta_star", configfile=other)

    # Taken over on purpose from a second working copy (no Snakemake records of the first): the batches
    # whose manifests record other cells run, and the figure is redrawn; never "Nothing to be done".
    copy = tmp_path / "copy"
    copy.mkdir()
    assert planned(copy, other, "--config", "share_results=True") == \
        {"ticket": 2, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}


@pytest.mark.workflow
def test_a_heal_killed_once_is_healed_by_the_next_plain_run(beta_star_run, tmp_path):
    config, results = _copy(beta_star_run, tmp_path)
    first, second = sorted((results / "simulations").glob("*.zarr.zip"))
    # A truncated store whose healing job was killed (-9): Snakemake deleted that job's manifest.
    first.write_bytes(first.read_bytes()[:1000])
    (results / "manifests" / first.name.replace(".zarr.zip", ".json")).unlink()
    # A directory where the other batch's store goes.
    second.unlink()
    (second / "x").mkdir(parents=True)
    proc = run(tmp_path, config)
    assert verify(first).ok and verify(second).ok
    assert "was a directory" in (results / "logs" / "simulate" / f"{second.name[:-9]}.log").read_text()
    assert len(stored(results)) == 4
    assert planned(tmp_path, config) == {}
    assert "Nothing to be done" not in proc.stdout + proc.stderr


@pytest.mark.workflow
def test_a_weights_file_edited_in_place_reruns_its_cells_and_draws(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import numpy as np

    weights = tmp_path / "model.safetensors"

    def save(seed):
        rng = np.random.default_rng(seed)
        layer = "encoder.layer.0.attention"
        tensors = {f"{layer}.self.query.weight": rng.standard_normal((4, 4)),
                   f"{layer}.self.key.weight": rng.standard_normal((4, 4)),
                   f"{layer}.self.value.weight": rng.standard_normal((4, 4)),
                   f"{layer}.output.dense.weight": rng.standard_normal((4, 4)),
                   "embeddings.word_embeddings.weight": rng.standard_normal((12, 4))}
        safetensors_numpy.save_file({k: v.astype(np.float32) for k, v in tensors.items()}, str(weights))

    save(1)
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
    block = {"fixed": {"weights": str(weights), "H": 2, "d": 4, "n": 4, "init": "embedding", "t_max": 1.0,
                       "n_samples": 5, "seeds": 2},
             "grid": {"layer": [0], "heads": ["trained", "trained_orthogonal"], "beta": [1.0, 4.0]},
             "batch_over": ["beta"]}
    config = write_config(tmp_path, **{f"experiments.{e}": None for e in
                                       ("beta_star", "toy_margin", "superadditivity", "clustering_time",
                                        "clustering_probability", "entropy", "orthogonality")},
                          **{"experiments.trained_heads": block})
    results = tmp_path / "results"
    run(tmp_path, config)
    energy = {p.name: p.read_bytes() for p in (results / "simulations").glob("energy*")}
    figure = (results / "figures" / "trained_heads.png").stat().st_mtime_ns
    old = set(stored(results))
    save(2)  # the same file, edited in place: its cells are other cells now
    run(tmp_path, config)
    new = set(stored(results))
    sweep = validate(yaml.safe_load(config.read_text()), reach_scheduler=False)
    from attnflow.ids import cell_id

    trained = {cell_id(p.cell) for p in sweep.points["trained_heads"]}
    assert trained <= new and not trained & old  # every trained cell computed again
    assert {p.name: p.read_bytes() for p in (results / "simulations").glob("energy*")} == energy  # no other
    assert (results / "figures" / "trained_heads.png").stat().st_mtime_ns > figure
    assert attnflow.open_summary("trained_heads", configfile=config).attrs["experiment"] == "trained_heads"
