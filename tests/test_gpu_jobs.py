"""The workflow and the JAX engine: which jobs ask for a GPU, stores stale by engine, the plan of a large
config without a GPU. Nothing here needs a GPU: the workflow's decisions are checked on the CPU."""

import json
import re

import pytest
from sweep_helpers import NOT_BETA_STAR, ROOT, run, write_config

from attnflow import Cell, engines, resources
from attnflow.access import load_sweep
from attnflow.cli import main as attnflow_main
from attnflow.config import load, validate
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.numerics import ENGINE_NUMERICS
from attnflow.plan import jobs as plan_jobs
from attnflow.plan import plan
from attnflow.run.health import batch_health, cell_states, other_engines
from attnflow.run.jobs import batch_params, simulate_job
from attnflow.run.tickets import issue_repairs

LARGE = ROOT / "config" / "large.yaml"
SMALL_AUTO = Cell(engine="auto", n=4, d=4, seeds=2)
LARGE_AUTO = Cell(engine="auto", n=512, d=128, H=4, heads="random", seeds=64)


def _only_energy(tmp_path, **edits):
    """The tiny config's energy experiment alone (two cells, one batch)."""
    dropped = [name for name in (*NOT_BETA_STAR, "beta_star") if name != "energy"]
    return write_config(tmp_path, **{f"experiments.{name}": None for name in dropped}, **edits)


def _one_cell_run(tmp_path):
    """The energy experiment's one cell on the sphere, simulated by its job on numba: (config, sweep,
    batch, cells, manifest path, manifest record)."""
    config = _only_energy(tmp_path, **{"experiments.energy.grid.geometry": ["sphere"]})
    sweep = validate(load(config), reach_scheduler=False)
    (batch, cells), = sweep.batches.items()
    manifest = sweep.layout.manifest(batch)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    simulate_job(batch_params(sweep, batch), batch, sweep.config, str(manifest), log=lambda *_: None)
    return config, sweep, batch, cells, manifest, json.loads(manifest.read_text())


def _resources_by_batch(printed: str) -> dict[str, str]:
    """batch -> the resources line a dry run prints for its simulate job."""
    blocks = printed.split("rule simulate:")[1:]
    return {re.search(r"wildcards: batch=(\S+)", b).group(1): re.search(r"resources: ([^\n]+)", b).group(1)
            for b in blocks}


@pytest.mark.parametrize("gpu", [True, False])
def test_job_engine_is_engines_rule_given_the_jobs_gpu(monkeypatch, gpu):
    # The workflow decides a job's engines where it plans the job (resources.job_engine); the job resolves
    # them itself (engines.engine_for). The two rules must agree, or a store is stale at every start.
    monkeypatch.setattr(engines, "_gpu_visible", lambda: gpu)
    for cell in (SMALL_AUTO, LARGE_AUTO, Cell(engine="jax"), Cell()):
        assert resources.job_engine(cell, gpu) == engines.engine_for(cell), cell


def test_only_jobs_with_a_cell_on_jax_ask_for_a_gpu():
    assert resources.gpu_request([Cell(), SMALL_AUTO], gpus=True) == 0
    assert resources.gpu_request([Cell(), Cell(engine="jax")], gpus=False) == 1
    # auto takes the GPU only where the jobs get one, and only for a large cell
    assert resources.gpu_request([LARGE_AUTO], gpus=True) == 1
    assert resources.gpu_request([LARGE_AUTO], gpus=False) == 0
    # --resources gpu=0: no job asks (the JAX engine runs on the CPU), and auto stays on numba
    assert resources.gpu_request([Cell(engine="jax"), LARGE_AUTO], gpus=False, declared=0) == 0
    gpu = bool(resources.gpu_request([LARGE_AUTO, SMALL_AUTO], gpus=True))
    assert [resources.job_engine(c, gpu) for c in (LARGE_AUTO, SMALL_AUTO)] == ["jax", "numba"]
    assert resources.jobs_get_gpus(4) and not resources.jobs_get_gpus(0)


def test_a_gpu_job_asks_for_its_gpu_time_and_the_jax_libraries():
    # On the GPU the large cell's request is its GPU model (seconds), not numba's hours.
    numba, gpu = resources.runtime_minutes([LARGE_AUTO]), resources.runtime_minutes([LARGE_AUTO], gpu=1)
    assert gpu * 60 >= resources.STARTUP_SECONDS + resources.SAFETY * resources.gpu_cell_seconds(LARGE_AUTO)
    assert gpu < numba / 10
    assert resources.memory_mb([LARGE_AUTO], gpu=1) - resources.memory_mb([LARGE_AUTO]) == \
        resources.GPU_BASELINE_MB - resources.BASELINE_MB


def test_the_dry_run_gives_jax_batches_a_gpu_and_numba_batches_none(tmp_path):
    config = write_config(tmp_path, **{"experiments.energy.fixed.engine": "jax"})
    sweep = validate(load(config), reach_scheduler=False)
    printed = run(tmp_path, config, "-n").stdout
    asked = _resources_by_batch(printed)
    assert set(asked) == set(sweep.batches), printed[-3000:]
    for batch, line in asked.items():
        want = 1 if batch.startswith("energy") else 0
        assert f"gpu={want}," in line, (batch, line)
    # Told there is none (--resources gpu=0), no job asks: the JAX engine runs on the CPU cores.
    asked = _resources_by_batch(run(tmp_path, config, "-n", "--resources", "gpu=0").stdout)
    assert all("gpu=0," in line for line in asked.values()), asked


def test_the_slurm_plugin_turns_the_gpu_resource_into_a_gpu_request():
    # The resource's name is the one snakemake-executor-plugin-slurm reads (its set_gres_string): a job
    # with gpu=1 is submitted with --gpus=1 (with a gpu_model, --gpus=<model>:1); one with gpu=0 without.
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Job:
        def __init__(self, **resources):
            self.resources = type("Resources", (dict,), {"__getattr__": dict.__getitem__})(resources)

    assert set_gres_string(Job(gpu=1)).strip() == "--gpus=1"
    assert set_gres_string(Job(gpu=1, gpu_model="h100")).strip() == "--gpus=h100:1"
    assert set_gres_string(Job(gpu=0)).strip() == ""


def test_a_job_given_a_gpu_that_jax_cannot_see_fails_naming_it(tmp_path, monkeypatch):
    # Computing the large auto cell on numba instead would leave a store stale at every start.
    from attnflow import jobparams

    monkeypatch.setattr(engines, "_gpu_visible", lambda: False)
    layout = Layout(tmp_path / "results")
    key = jobparams.put(layout, json.dumps([LARGE_AUTO.to_dict()]))
    with pytest.raises(RuntimeError, match=r"given 1 GPU .* but jax sees no GPU .*attnflow\[jax-cuda\]"):
        simulate_job(key, "clustering_time-x", {"results": str(tmp_path / "results")},
                     str(tmp_path / "manifest.json"), gpu=1)
    assert not (tmp_path / "manifest.json").exists() and not list(layout.stores.glob("*"))


def test_a_store_of_another_engine_is_stale_and_recomputed(tmp_path, monkeypatch, capsys):
    # One cell (one jit compilation when the JAX engine computes it again below).
    config, sweep, batch, cells, manifest, record = _one_cell_run(tmp_path)
    assert set(record["engines"].values()) == {"numba"} and set(record["engines"]) == set(record["cells"])
    assert {s.status for s in cell_states(sweep).values()} == {"done"}
    # The same cells computed by the JAX engine (results brought from a machine where they ran there):
    # this config asks for numba, so they are stale, say so, and the next run recomputes them.
    record["engines"] = {cid: "jax" for cid in record["cells"]}
    manifest.write_text(json.dumps(record))
    states = cell_states(sweep)
    assert {s.status for s in states.values()} == {"stale"}
    assert {s.detail for s in states.values()} == {"computed by jax, this config asks for numba"}
    (path, state), = batch_health(sweep, batch, record)
    assert state.status == "stale" and state.detail.startswith(f"{len(cells)} of its cells computed by jax")
    assert issue_repairs(sweep) and list(sweep.layout.repairs(batch).glob("*.ticket"))
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    assert "computed by jax, this config asks for numba (the next `snakemake` recomputes it)" in out, out
    # The job computes again a stored cell whose engine is not the one it resolves for it.
    from attnflow.run.batch import run_batch

    monkeypatch.setattr(engines, "engine_for", lambda cell: "jax")
    logs = []
    # Which engine computes is what this checks, not its numbers: XLA's optimisation passes (half of a
    # compilation, tests/test_jax_engine.py) are skipped.
    import jax
    optimised = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        result = run_batch(cells, batch, sweep.layout, log=logs.append)
    finally:
        jax.config.update("jax_disable_most_optimizations", optimised)
    assert sum("computed by numba, this config asks for jax: computed again" in line for line in logs) == \
        len(cells), logs
    assert sum("computed in" in line for line in logs) == len(cells), logs
    assert set(result.cells) == {cell_id(c) for c in cells}


def test_auto_cells_keep_a_store_of_either_engine(tmp_path):
    # large.yaml's largest batch: auto leaves the engine to the machine, so its cells computed by numba (a
    # machine with no GPU) or by jax (results brought from a GPU machine) are current wherever the jobs
    # run; recomputing them would throw hours away. An explicit engine must match (the test above).
    sweep = load_sweep(LARGE, results=tmp_path / "results")
    batch = max(sweep.batches, key=lambda b: sum(resources.cell_seconds(c) for c in sweep.batches[b]))
    record = {"cells": {cell_id(c): "" for c in sweep.batches[batch]}}
    assert {resources.job_engine(c, True) for c in sweep.batches[batch]} == {"jax"}  # a GPU would take them
    for engine in ("numba", "jax"):
        held = {**record, "engines": dict.fromkeys(record["cells"], engine),
                "engine_numerics": dict.fromkeys(record["cells"], ENGINE_NUMERICS[engine])}
        assert other_engines(sweep, batch, held) == {}
        # ... under that engine's current numerics only: a jax store from before its version 2 is stale
        older = {**held, "engine_numerics": dict.fromkeys(record["cells"], ENGINE_NUMERICS[engine] - 1)}
        assert set(other_engines(sweep, batch, older).values()) == {
            f"computed by {engine} under its numerics {ENGINE_NUMERICS[engine] - 1}, now "
            f"{ENGINE_NUMERICS[engine]}"}
    # A record from before engines had their own numerics reads as version 1 of each: stale once that
    # engine's numbers moved (numba 2: its register tiles), current while they have not.
    numba_record = {**record, "engines": dict.fromkeys(record["cells"], "numba")}
    unversioned = other_engines(sweep, batch, numba_record)
    assert ENGINE_NUMERICS["numba"] > 1 and unversioned and set(unversioned) <= set(record["cells"])
    now = ENGINE_NUMERICS["numba"]
    assert set(unversioned.values()) == {f"computed by numba under its numerics 1, now {now}"}
    with_numba_1 = {**ENGINE_NUMERICS, "numba": 1}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("attnflow.numerics.ENGINE_NUMERICS", with_numba_1)
        assert other_engines(sweep, batch, numba_record) == {}


def test_a_change_of_one_engines_numerics_recomputes_only_its_cells(tmp_path, monkeypatch, capsys):
    # ENGINE_NUMERICS lets the JAX engine's numbers move (GPU tuning) without recomputing every numba
    # store, as a NUMERICS_VERSION bump would: here numba's entry moves and its cells are stale.
    from attnflow.run.batch import run_batch

    config, sweep, batch, cells, manifest, record = _one_cell_run(tmp_path)
    assert record["engine_numerics"] == dict.fromkeys(record["cells"], ENGINE_NUMERICS["numba"])
    monkeypatch.setitem(ENGINE_NUMERICS, "jax", ENGINE_NUMERICS["jax"] + 1)  # another engine's: no effect
    assert {s.status for s in cell_states(sweep).values()} == {"done"}
    now = ENGINE_NUMERICS["numba"] + 1
    monkeypatch.setitem(ENGINE_NUMERICS, "numba", now)
    why = f"computed by numba under its numerics {now - 1}, now {now}"
    assert {(s.status, s.detail) for s in cell_states(sweep).values()} == {("stale", why)}
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    assert f"{why} (the next `snakemake` recomputes it)" in capsys.readouterr().out
    logs = []
    result = run_batch(cells, batch, sweep.layout, log=logs.append)
    assert sum(f"{why}: computed again" in line for line in logs) == len(cells), logs
    assert result.engine_numerics == dict.fromkeys(result.cells, now)


def test_a_job_keeps_an_auto_cell_computed_by_the_other_engine(tmp_path, monkeypatch):
    from attnflow.run.batch import run_batch

    cell = Cell(engine="auto", n=4, d=4, seeds=2, t_max=0.5, n_samples=3)
    layout = Layout(tmp_path / "results")
    run_batch([cell], "energy-auto", layout, log=lambda *_: None)
    monkeypatch.setattr(engines, "_gpu_visible", lambda: True)  # auto would now pick jax for a large cell
    monkeypatch.setattr(resources, "AUTO_GPU_SECONDS", 0.0)
    logs = []
    result = run_batch([cell], "energy-auto", layout, log=logs.append)
    assert not any("computed again" in line or "computed in" in line for line in logs), logs
    assert result.engines == {cell_id(cell): "numba"}


def test_a_config_moved_to_auto_keeps_its_cells_and_one_moved_to_jax_recomputes_them(tmp_path):
    # The engine is no part of a cell's id: the cells numba computed are auto's too; jax names another
    # engine than the store's, so they are stale (the store records who computed them).
    config, sweep, batch, cells, manifest, record = _one_cell_run(tmp_path)
    for engine, status in (("auto", "done"), ("jax", "stale")):
        moved = _only_energy(tmp_path, **{"experiments.energy.grid.geometry": ["sphere"],
                                          "defaults.engine": engine})
        sweep = validate(load(moved), reach_scheduler=False)
        assert {cell_id(c) for c in sweep.batches[batch]} == set(record["cells"])
        assert {s.status for s in cell_states(sweep).values()} == {status}
        assert bool(batch_health(sweep, batch, record)) == (status == "stale")


def test_a_store_written_with_the_engine_in_ids_keeps_its_cells(tmp_path, monkeypatch):
    # Stores written while a non-default engine was part of cell ids (2026-12-04/05) hold their cells
    # under those ids: the job takes them and writes the store again under today's ids.
    from attnflow import ids
    from attnflow.run import batch as batch_module
    from attnflow.run.stored import stored_cells

    cell = Cell(engine="auto", n=4, d=4, seeds=2, t_max=0.5, n_samples=3)
    layout = Layout(tmp_path / "results")
    today = ids.cell_id
    with monkeypatch.context() as patch:
        patch.setattr(batch_module, "cell_id", lambda c: ids._id_with_engine(c) or today(c))
        old = batch_module.run_batch([cell], "energy-auto", layout, log=lambda *_: None)
    assert set(old.cells) == {ids._id_with_engine(cell)} != {cell_id(cell)}
    logs = []
    result = batch_module.run_batch([cell], "energy-auto", layout, log=logs.append)
    assert set(result.cells) == {cell_id(cell)} == set(stored_cells(layout.store("energy-auto")))
    assert any("complete (stored under its id with the engine), skipped" in line for line in logs), logs
    assert any(line.endswith(": 1 cell written (0 new)") for line in logs), logs  # one cell, not "1 cells"
    assert not any("computed in" in line for line in logs), logs
    logs.clear()
    batch_module.run_batch([cell], "energy-auto", layout, log=logs.append)
    assert any("complete, skipped" in line for line in logs) and not any("written" in line for line in logs)


def test_status_and_plan_count_cells_stored_under_their_id_with_the_engine_done(tmp_path, monkeypatch):
    # Such a store (2026-12-04/05) is taken by the next job, computing nothing (the test above): status
    # says done, not missing, and plan counts no cell to compute.
    from attnflow import ids
    from attnflow.run import batch as batch_module
    from attnflow.run import jobs as jobs_module

    config = _only_energy(tmp_path, **{"experiments.energy.grid.geometry": ["sphere"],
                                       "defaults.engine": "auto"})
    sweep = validate(load(config), reach_scheduler=False)
    (batch, cells), = sweep.batches.items()
    manifest = sweep.layout.manifest(batch)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    today = ids.cell_id

    def with_engine(cell):
        return ids._id_with_engine(cell) or today(cell)

    with monkeypatch.context() as patch:
        patch.setattr(batch_module, "cell_id", with_engine)
        patch.setattr(jobs_module, "cell_id", with_engine)
        simulate_job(batch_params(sweep, batch), batch, sweep.config, str(manifest), log=lambda *_: None)
    assert set(json.loads(manifest.read_text())["cells"]) == {with_engine(c) for c in cells} != \
        {cell_id(c) for c in cells}
    assert {s.status for s in cell_states(sweep).values()} == {"done"}
    assert [job.to_compute for job in plan_jobs(sweep).values()] == [0]


def test_large_config_plans_on_the_cpu_and_suggests_the_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(resources, "gpu_visible_here", lambda: False)
    assert attnflow_main(["plan", "--configfile", str(LARGE), "--results", str(tmp_path / "r"),
                          "--cores", "2"]) == 0
    out = capsys.readouterr().out
    sweep = load_sweep(LARGE, results=tmp_path / "r")
    cells = {cell_id(c): c for cs in sweep.batches.values() for c in cs}
    large = sum(resources.job_engine(c, True) == "jax" for c in cells.values())
    assert 0 < large < len(cells)  # the small cells stay on numba even with a GPU
    assert max(c.n for c in cells.values()) == 2048
    note = next(line for line in out.splitlines() if "JAX engine" in line)
    assert note.startswith(f"note: {large} cells would run on the JAX engine; no GPU is visible here: on "
                           "numba this is "), note
    assert "core-hours" in note and "pip install 'attnflow[jax-cuda]'" in note
    # On a cluster the note's numba time is on the cores its jobs run on at once, as the table's.
    clustered = plan(sweep, cores=2, threads=2, cluster_jobs=50, gpus=False)
    assert any("on 100 cores); run on a machine with a GPU" in n for n in clustered.notes), clustered.notes
    # With a GPU the same cells take minutes of it, beside the numba jobs: the wall time drops.
    cpu, gpu = plan(sweep, cores=2, gpus=False), plan(sweep, cores=2, gpus=True)
    assert gpu.rows["total"]["wall_seconds"] < cpu.rows["total"]["wall_seconds"] / 10
    assert any(f"{large} cells run on the JAX engine" in n for n in gpu.notes)


def test_status_eta_prices_the_jax_cells_on_the_gpu(tmp_path, monkeypatch):
    # Nothing computed yet: the ETA is the plan's wall time of the simulate jobs. With --gpus 1 the JAX
    # cells' jobs take their GPU time, one at a time beside the numba jobs; without, numba's hours.
    from attnflow.plan import jobs, makespan
    from attnflow.progress import progress

    monkeypatch.setattr(resources, "gpu_visible_here", lambda: False)
    sweep = load_sweep(LARGE, results=tmp_path / "r")
    cpu, _, _ = progress(sweep, cores=2)
    gpu, _, _ = progress(sweep, cores=2, declared=1)
    planned = jobs(sweep, gpus=True, declared=1)
    on_gpu = [j.expected_seconds for j in planned.values() if j.gpu]
    on_cpu = [j.expected_seconds for j in planned.values() if not j.gpu]
    assert on_gpu and on_cpu
    assert gpu["total"].eta_seconds == pytest.approx(max(makespan(on_cpu, 2), makespan(on_gpu, 1)))
    assert gpu["total"].eta_seconds < cpu["total"].eta_seconds / 10
    assert cpu["total"].eta_seconds == pytest.approx(makespan([j.expected_seconds for j in jobs(
        sweep, gpus=False).values()], 2))


def test_without_jax_gpu_build_no_child_process_is_asked(monkeypatch):
    # The controller's look for a GPU: at once False where jax has no GPU backend installed.
    import subprocess

    resources.gpu_visible_here.cache_clear()
    monkeypatch.setattr(resources, "_gpu_backend_installed", lambda: False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child process was started"))
    try:
        assert resources.gpu_visible_here() is False
    finally:
        resources.gpu_visible_here.cache_clear()


def test_a_cluster_plan_takes_its_gpus_from_the_profile_or_the_command_line(tmp_path, monkeypatch):
    # A login node sees no GPU: the profile's resources (or --gpus) say how many GPU jobs may run.
    from attnflow.profile import profile_settings

    monkeypatch.setattr(resources, "gpu_visible_here", lambda: pytest.fail("a GPU was looked for"))
    (tmp_path / "config.yaml").write_text("executor: slurm\njobs: 50\nresources:\n  - gpu=4\n")
    assert profile_settings(tmp_path)["gpus"] == 4
    sweep = load_sweep(LARGE, results=tmp_path / "r")
    on_gpus = plan(sweep, cores=2, cluster_jobs=50, declared=4)
    assert any(j.gpu for j in _jobs(sweep, 4))
    assert any("4 GPU jobs at a time" in note for note in on_gpus.notes), on_gpus.notes
    # gpu=0: no job asks for one, and the auto cells stay on numba (the note says what they cost there)
    assert not any(j.gpu for j in _jobs(sweep, 0))
    assert any("would run on the JAX engine; the run is given none (gpu=0)" in note
               for note in plan(sweep, cores=2, declared=0).notes)


def _jobs(sweep, declared):
    from attnflow.plan import jobs

    return list(jobs(sweep, gpus=resources.jobs_get_gpus(declared), declared=declared).values())
