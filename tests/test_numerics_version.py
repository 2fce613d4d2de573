"""The numerics version: golden values that catch a forgotten bump, and stale stores and summaries.

Every store records ``attnflow.engine.NUMERICS_VERSION``. If a change to the
engine moves the numbers, the version must change with it, or old stores are
reused and mixed with new ones. ``test_golden_values`` computes a few cheap
cells and compares them with ``tests/golden/numerics.json`` (relative 1e-10):
it fails when the numbers move while the version stays. After a deliberate
change, bump the version and regenerate the file::

    python tests/test_numerics_version.py --regenerate
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from attnflow.numerics import NUMERICS_VERSION
from attnflow.store import open_verified

GOLDEN = Path(__file__).parent / "golden" / "numerics.json"
RTOL = 1e-10
BUMP = "bump attnflow.engine.NUMERICS_VERSION and regenerate the golden values " \
       "(python tests/test_numerics_version.py --regenerate)"

# Cheap cells covering softmax and relu weights, block, scalar and random heads, the
# sphere and the flat geometry, a cluster time found on the dense output.
CELLS = {
    "softmax_block": dict(H=2, n=4, d=4, beta=1.0, heads="block", attention="softmax", seeds=2, t_max=4.0,
                          n_samples=5, observables=["energy"]),
    "relu_equiangular": dict(H=1, n=4, d=16, beta=1.0, attention="relu", init="equiangular_typical",
                             cluster_threshold=0.5, t_max=100.0, n_samples=5, rtol=1e-10, atol=1e-13,
                             observables=["energy"]),
    "softmax_random_cluster": dict(H=2, n=5, d=3, beta=0.5, heads="random", attention="softmax", seeds=2,
                                   t_max=40.0, n_samples=5, observables=["energy"]),
    "usa_flat": dict(H=2, n=5, d=4, beta=1.0, heads="random", attention="usa", geometry="flat", seeds=1,
                     t_max=0.3, n_samples=4, observables=["energy"]),
    # Products above 10^6 multiply-adds (in panels of rows where BLAS has the unpacked kernels) and
    # tokens transposed by rows of eight (n d > 4096, n not a multiple of 8).
    "softmax_random_300_tokens": dict(H=1, n=300, d=16, beta=1.0, heads="random", attention="softmax",
                                      seeds=1, t_max=0.2, n_samples=3, observables=["energy"]),
}
VARIABLES = ("t_cluster", "energy", "gamma_mean", "n_steps")


def compute() -> dict:
    from attnflow import Cell, simulate

    out = {}
    for name, fields in CELLS.items():
        ds = simulate(Cell(**fields))
        out[name] = {var: np.asarray(ds[var].values, dtype=float).tolist() for var in VARIABLES}
    return out


def regenerate() -> None:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"numerics_version": NUMERICS_VERSION, "cells": CELLS, "values": compute()},
                                 indent=1) + "\n")


def test_golden_values():
    golden = json.loads(GOLDEN.read_text())
    assert golden["numerics_version"] == NUMERICS_VERSION, (
        f"NUMERICS_VERSION is {NUMERICS_VERSION}, the golden values were made under "
        f"{golden['numerics_version']}: regenerate them (python tests/test_numerics_version.py --regenerate)")
    assert golden["cells"] == json.loads(json.dumps(CELLS)), "the golden cells changed: regenerate the values"
    now = compute()
    for name, values in golden["values"].items():
        for var, expected in values.items():
            got, want = np.asarray(now[name][var]), np.asarray(expected, dtype=float)
            assert got.shape == want.shape, f"{name}.{var}: shape {got.shape}, golden {want.shape}; {BUMP}"
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=0, equal_nan=True,
                                       err_msg=f"{name}.{var} moved while NUMERICS_VERSION stayed "
                                               f"{NUMERICS_VERSION}: {BUMP}")


def test_the_golden_cells_cluster():
    """The golden file holds finite cluster times (else a changed crossing would go unseen)."""
    golden = json.loads(GOLDEN.read_text())["values"]
    assert np.isfinite(golden["relu_equiangular"]["t_cluster"]).all()
    assert np.isfinite(golden["softmax_random_cluster"]["t_cluster"]).any()


def test_the_version_is_one_int_reexported_by_the_engine():
    import attnflow.engine

    assert attnflow.engine.NUMERICS_VERSION is NUMERICS_VERSION and isinstance(NUMERICS_VERSION, int)


# --- stale stores and summaries in the workflow ------------------------------------------------------
def _beta_star_only(tmp):
    from sweep_helpers import beta_star_config

    return beta_star_config(tmp)


def _set_record(store: Path, **values) -> None:
    """Rewrite a store's completion record as an older attnflow would have written it.

    The zip is written again with the other members as they were; the file keeps its modification
    time, and a batch manifest that records the store records its new size (as that attnflow's would)."""
    import os
    import zipfile

    from attnflow.store import RECORD

    stat = store.stat()
    with zipfile.ZipFile(store) as zf:
        members = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(store, "w", zipfile.ZIP_STORED) as zf:
        for info, data in members:
            if info.filename == RECORD:
                record = json.loads(data)
                for key, value in values.items():
                    if value is None:
                        record.pop(key, None)
                    else:
                        record[key] = value
                data = json.dumps(record, indent=1, sort_keys=True).encode()
            zf.writestr(info, data)
    os.utime(store, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    for manifest in (store.parent.parent / "manifests").glob("*.json"):
        record = json.loads(manifest.read_text())
        if record.get("store") == store.name:
            seen = manifest.stat()
            record.update(size=store.stat().st_size, mtime_ns=store.stat().st_mtime_ns)
            manifest.write_text(json.dumps(record, indent=1))
            os.utime(manifest, ns=(seen.st_atime_ns, seen.st_mtime_ns))


# beta_star_run (tests/conftest.py): the config of _beta_star_only, run once per session; each test
# below copies its results directory before changing anything.


@pytest.mark.workflow
@pytest.mark.parametrize("old_version", ["previous", "none"])
def test_stale_stores_are_listed_and_exactly_they_are_recomputed(beta_star_run, tmp_path, capsys,
                                                                  old_version):
    import shutil

    from sweep_helpers import dry_run, jobs_of, planned, point_name, run, snapshot, stored

    from attnflow.cli import main as attnflow_main
    from attnflow.engine import NUMERICS_VERSION
    from attnflow.store import record_of

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    stores = sorted((results / "simulations").glob("*.zarr.zip"))
    assert len(stores) == 2 and len(stored(results)) == 4  # 2 batches of 2 cells
    # One batch's store as if written before the last change to the numerics (or with no version at all).
    old = stores[0]
    _set_record(old, numerics_version=NUMERICS_VERSION - 1 if old_version == "previous" else None)
    old_cells = set(record_of(old)["cells"])
    assert len(old_cells) == 2
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    named = {line[len("stale "):].split(":")[0] for line in out.splitlines()
             if line.startswith("stale beta_star (")}
    assert {point_name(config, cid, "beta_star") for cid in old_cells} == named
    assert f"now {NUMERICS_VERSION}" in out
    row = next(line for line in out.splitlines() if line.startswith("beta_star"))
    assert row.split()[1:3] == ["4", "2"] and row.split()[-1] == "2"  # cells, done ... stale
    # Judged stale at start-up, whatever the old version: the dry run says so and plans that batch.
    dry = dry_run(tmp_path, config)
    assert jobs_of(dry) == {"ticket": 1, "simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    assert dry.stderr.count("is stale (") == 1 and f"{old.name} is stale" in dry.stderr
    if old_version == "none":
        return  # the run that follows is the one "previous" makes (one run shows the recomputation)
    before = snapshot(results / "simulations")
    proc = run(tmp_path, config)
    assert proc.stderr.count("is stale (written under numerics_version") == 1
    assert f"{old.name} is stale" in proc.stderr
    after = snapshot(results / "simulations")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {old.name}
    # Exactly the stale cells were computed again (the other batch's store is untouched above).
    log = (results / "logs" / "simulate" / f"{record_of(old)['batch']}.log").read_text()
    assert log.count("computed in") == 2 and "complete, skipped" not in log
    for store in stores:
        assert record_of(store)["numerics_version"] == NUMERICS_VERSION
    cells = stored(results)
    assert len(cells) == 4 and all(ds.attrs["numerics_version"] == NUMERICS_VERSION for ds in cells.values())
    summary = open_verified(results / "summaries" / "beta_star.zarr.zip")
    from attnflow.experiments import registry

    assert summary.attrs["numerics_version"] == NUMERICS_VERSION
    assert summary.attrs["reduction_version"] == registry().get("beta_star").reduction_version
    assert planned(tmp_path, config) == {}
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    assert "stale" not in capsys.readouterr().out.split("\n", 1)[1]


# A summary of another reduction version, of other numerics, or of no recorded version: one summary
# of the tiny run's each, so that one run rebuilds the three (each summary is judged on its own).
STALE_SUMMARIES = {"beta_star": {"reduction_version": 0}, "energy": {"numerics_version": 0},
                   "entropy": {"reduction_version": None}}


@pytest.mark.workflow
def test_stale_summaries_are_rebuilt_with_their_figures(tiny_run, tmp_path):
    import shutil

    from sweep_helpers import planned, run, write_config

    shutil.copytree(tiny_run[2], tmp_path / "results")
    config = write_config(tmp_path)
    results = tmp_path / "results"
    figures = {}
    for name, record in STALE_SUMMARIES.items():
        _set_record(results / "summaries" / f"{name}.zarr.zip", **record)
        figures[name] = (results / "figures" / f"{name}.png").stat().st_mtime_ns
    stale = len(STALE_SUMMARIES)
    assert planned(tmp_path, config) == {"ticket": stale, "aggregate": stale, "plot": stale, "all": 1}
    proc = run(tmp_path, config)
    for name, figure in figures.items():
        assert f"the summary of {name} is stale" in proc.stderr
        assert (results / "figures" / f"{name}.png").stat().st_mtime_ns > figure
    assert planned(tmp_path, config) == {}


@pytest.mark.workflow
def test_aggregation_never_mixes_numerics_versions(beta_star_run, tmp_path):
    import shutil

    from attnflow.aggregate import summarise
    from attnflow.config import load, validate
    from attnflow.store import StaleStore

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    sweep = validate(load(config), reach_scheduler=False)
    entries = sweep.entries("beta_star")
    _set_record(Path(entries[0][1]), numerics_version=0)
    with pytest.raises(StaleStore, match=rf"1 stores are stale \(written under numerics_version 0, now "
                                         rf"{NUMERICS_VERSION}\).*"
                                         r"never mixes"):
        summarise(sweep.experiments.get("beta_star"), sweep.specs["beta_star"], entries)


@pytest.mark.workflow
def test_deleted_bookkeeping_is_rebuilt_by_the_next_run(beta_star_run, tmp_path):
    """The summary (its figure stays), then the manifests, deleted by hand: each is planned for, and
    the next plain run rebuilds both (and the figure), recomputing no store; then nothing is left to
    do, and the same damage again is healed again."""
    import shutil

    from sweep_helpers import planned, run, snapshot

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    summary = results / "summaries" / "beta_star.zarr.zip"
    summary.unlink()
    assert planned(tmp_path, config) == {"ticket": 1, "aggregate": 1, "plot": 1, "all": 1}
    shutil.rmtree(results / "manifests")
    assert planned(tmp_path, config) == {"ticket": 1, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    before = snapshot(results / "simulations")
    proc = run(tmp_path, config)
    assert "the summary of beta_star is" in proc.stderr
    assert snapshot(results / "simulations") == before
    assert len(list((results / "manifests").glob("*.json"))) == 2
    assert summary.exists()
    assert planned(tmp_path, config) == {}
    summary.unlink()  # the same damage again, after the rebuild: healed again
    assert planned(tmp_path, config) == {"ticket": 1, "aggregate": 1, "plot": 1, "all": 1}


@pytest.mark.workflow
def test_a_new_batch_is_no_deleted_manifest(beta_star_run, tmp_path):
    """Adding a grid value makes batches that never ran: no ticket (they run anyway; a ticket written
    by a dry run of a config never run would rerun them later for nothing)."""
    import shutil

    from sweep_helpers import beta_star_config

    from attnflow.config import load, validate
    from attnflow.run.summaries import outdated_summaries

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = beta_star_config(tmp_path, **{"experiments.beta_star.grid.n": [4, 6, 8]})
    assert outdated_summaries(validate(load(config), reach_scheduler=False)) == {}


@pytest.mark.workflow
def test_a_cell_moved_to_a_batch_that_never_ran_is_not_missing(tiny_run, tmp_path):
    """beta_star's beta 2.0 edited to 3.0: toy_margin's cell at beta 2.0, which a beta_star batch held,
    gets a batch of toy_margin's own that never ran. It runs anyway: no ticket, never said missing, and
    toy_margin's summary not said built from it (it read beta_star's store). The two beta_star batches
    are said changed, a line each, in words."""
    from sweep_helpers import write_config

    from attnflow.config import load, validate
    from attnflow.run.health import damage_line, unhealthy
    from attnflow.run.summaries import outdated_summaries

    edited = write_config(tmp_path, results=str(tiny_run[2]),
                          **{"experiments.beta_star.grid.beta": [0.5, 3.0]})
    sweep = validate(load(edited), reach_scheduler=False)
    new = [b for b in sweep.batches_of("toy_margin") if not sweep.layout.manifest(b).exists()]
    assert len(new) == 1 and not sweep.layout.store(new[0]).exists()
    damage = unhealthy(sweep)  # reads the session's results, writes nothing
    assert outdated_summaries(sweep) == {} and sorted(damage) == sorted(sweep.batches_of("beta_star"))
    lines = sorted(damage_line(sweep, b, path, state) for b, found in damage.items() for path, state in found)
    assert lines == [f"attnflow: batch {b} changed (its store holds 1 of its 2 cells, and keeps 1 it no "
                     "longer has, off the grid: a grid value added, edited, or written for another config or "
                     "input file): it runs, computing only the cells its store lacks" for b in sorted(damage)]


@pytest.mark.workflow
@pytest.mark.parametrize("damage", ["empty manifest", "manifest not a dict", "failed not a dict",
                                    "no cells recorded"])
def test_a_batch_whose_bookkeeping_is_lost_runs_again(beta_star_run, tmp_path, damage):
    """A manifest unreadable, or not what a job writes: the batch runs again (never a crash at start-up,
    never "nothing to be done" with cells missing)."""
    import shutil

    from sweep_helpers import planned, run

    from attnflow.cli import main as attnflow_main
    from attnflow.config import load, validate
    from attnflow.run.health import cell_states

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    manifest = sorted((results / "manifests").glob("*.json"))[0]
    record = json.loads(manifest.read_text())
    manifest.write_text({"empty manifest": "", "manifest not a dict": "[]",
                         "failed not a dict": json.dumps({**record, "failed": ["x"]}),
                         "no cells recorded": json.dumps({**record, "cells": {}})}[damage])
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    assert planned(tmp_path, config)["simulate"] == 1
    if damage != "empty manifest":
        return  # the same repair ticket as any damage: one run shows it heals
    run(tmp_path, config)
    states = cell_states(validate(load(config), reach_scheduler=False), checksums=True)
    assert all(s.ok for s in states.values()), states
    assert planned(tmp_path, config) == {}


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    regenerate()
    print(f"wrote {GOLDEN}")


@pytest.mark.workflow
def test_stores_of_the_per_cell_layout_are_reported_and_never_read(beta_star_run, tmp_path, capsys):
    """attnflow 0.1 wrote a directory per cell and manifests listing them: such a batch is stale (its cells
    computed again into one file), and the old directories are counted, never read or mixed in."""
    import shutil

    from sweep_helpers import planned

    from attnflow.cli import main as attnflow_main

    _, _, reference = beta_star_run
    shutil.copytree(reference, tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    manifest = sorted((results / "manifests").glob("*.json"))[0]
    cells = list(json.loads(manifest.read_text())["cells"])
    manifest.write_text(json.dumps({"batch": manifest.stem, "stores": {c: f"{c}.zarr" for c in cells},
                                    "failed": {}}))
    (results / "simulations" / f"{cells[0]}.zarr").mkdir()  # an old store directory
    assert attnflow_main(["status", "--json", "--configfile", str(config)]) == 0
    captured = capsys.readouterr()
    assert "1 stores in" in captured.err and "layout of attnflow 0.1" in captured.err
    report = json.loads(captured.out)["beta_star"]
    assert set(report["stale"]) == set(cells) and len(report["done"]) == 2
    assert planned(tmp_path, config) == {"ticket": 1, "simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
