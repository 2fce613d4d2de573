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
    from attnflow.engine import NUMERICS_VERSION

    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"numerics_version": NUMERICS_VERSION, "cells": CELLS, "values": compute()},
                                 indent=1) + "\n")


def test_golden_values():
    from attnflow.engine import NUMERICS_VERSION

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
    from attnflow.engine.version import NUMERICS_VERSION

    assert attnflow.engine.NUMERICS_VERSION is NUMERICS_VERSION and isinstance(NUMERICS_VERSION, int)


# --- stale stores and summaries in the workflow ------------------------------------------------------
def _beta_star_only(tmp):
    from sweep_helpers import beta_star_config

    return beta_star_config(tmp)


def _set_record(store: Path, **values) -> None:
    """Rewrite a store's completion record as an older attnflow would have written it."""
    from attnflow.store import RECORD

    record = json.loads((store / RECORD).read_text())
    for key, value in values.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    (store / RECORD).write_text(json.dumps(record))


# beta_star_run (tests/conftest.py): the config of _beta_star_only, run once per session; each test
# below copies its results directory before changing anything.


@pytest.mark.workflow
def test_stale_stores_are_listed_and_exactly_they_are_recomputed(beta_star_run, tmp_path, capsys):
    import shutil

    import xarray as xr
    from sweep_helpers import planned, run, snapshot

    from attnflow.cli import main as attnflow_main
    from attnflow.engine import NUMERICS_VERSION

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    stores = sorted((results / "simulations").glob("*.zarr"))
    assert len(stores) == 4
    old = stores[:2]  # as if written before the last change to the numerics (one has no version at all)
    _set_record(old[0], numerics_version=NUMERICS_VERSION - 1)
    _set_record(old[1], numerics_version=None)
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("stale beta_star/") == 2 and f"now {NUMERICS_VERSION}" in out
    row = next(line for line in out.splitlines() if line.startswith("beta_star"))
    assert row.split()[1:3] == ["4", "2"] and row.split()[-1] == "2"  # cells, done ... stale
    batches = {json.loads(m.read_text())["batch"] for m in (results / "manifests").glob("*.json")
               if {s.name for s in old} & set(json.loads(m.read_text())["stores"].values())}
    assert planned(tmp_path, config) == {"simulate": len(batches), "aggregate": 1, "plot": 1, "all": 1}
    before = snapshot(results / "simulations")
    proc = run(tmp_path, config)
    assert proc.stderr.count("is stale (written under numerics_version") == 2
    after = snapshot(results / "simulations")
    changed = {k.split("/")[0] for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {s.name for s in old}
    for store in stores:
        assert xr.open_zarr(store).attrs["numerics_version"] == NUMERICS_VERSION
    summary = xr.open_zarr(results / "summaries" / "beta_star.zarr")
    assert summary.attrs["numerics_version"] == NUMERICS_VERSION and summary.attrs["reduction_version"] == 1
    assert planned(tmp_path, config) == {}
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    assert "stale" not in capsys.readouterr().out.split("\n", 1)[1]


@pytest.mark.workflow
@pytest.mark.parametrize("record", [{"reduction_version": 0}, {"numerics_version": 0},
                                    {"reduction_version": None}])
def test_a_stale_summary_is_rebuilt_with_its_figure(beta_star_run, tmp_path, record):
    import shutil

    from sweep_helpers import planned, run

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    summary = results / "summaries" / "beta_star.zarr"
    _set_record(summary, **record)
    figure = (results / "figures" / "beta_star.png").stat().st_mtime_ns
    assert planned(tmp_path, config) == {"aggregate": 1, "plot": 1, "all": 1}
    proc = run(tmp_path, config)
    assert "the summary of beta_star is stale" in proc.stderr
    assert (results / "figures" / "beta_star.png").stat().st_mtime_ns > figure
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
    with pytest.raises(StaleStore, match=r"1 stores are stale \(written under numerics_version 0, now 1\).*"
                                         r"never mixes"):
        summarise(sweep.experiments.get("beta_star"), sweep.specs["beta_star"], entries)


@pytest.mark.workflow
@pytest.mark.parametrize("delete", ["manifests", "summary"])
def test_deleted_bookkeeping_is_rebuilt_by_the_next_run(beta_star_run, tmp_path, delete):
    """Manifests, or a summary whose figure stays, deleted by hand: the next plain run rebuilds them
    (and the figure), recomputing no store; then nothing is left to do."""
    import shutil

    from sweep_helpers import planned, run, snapshot

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = _beta_star_only(tmp_path)
    results = tmp_path / "results"
    if delete == "manifests":
        shutil.rmtree(results / "manifests")
        expected = {"simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    else:
        shutil.rmtree(results / "summaries" / "beta_star.zarr")
        expected = {"aggregate": 1, "plot": 1, "all": 1}
    assert planned(tmp_path, config) == expected
    before = snapshot(results / "simulations")
    proc = run(tmp_path, config)
    assert "the summary of beta_star is" in proc.stderr
    assert snapshot(results / "simulations") == before
    assert len(list((results / "manifests").glob("*.json"))) == 2
    assert (results / "summaries" / "beta_star.zarr").exists()
    assert planned(tmp_path, config) == {}
    if delete == "summary":  # the same damage again, after the rebuild: healed again
        shutil.rmtree(results / "summaries" / "beta_star.zarr")
        assert planned(tmp_path, config) == expected


@pytest.mark.workflow
def test_a_new_batch_is_no_deleted_manifest(beta_star_run, tmp_path):
    """Adding a grid value makes batches that never ran: no ticket (they run anyway)."""
    import shutil

    from sweep_helpers import beta_star_config

    from attnflow.workflow import outdated_summaries

    shutil.copytree(beta_star_run[2], tmp_path / "results")
    config = beta_star_config(tmp_path, **{"experiments.beta_star.grid.n": [4, 6, 8]})
    from attnflow.config import load, validate

    assert outdated_summaries(validate(load(config), reach_scheduler=False)) == {}


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    regenerate()
    print(f"wrote {GOLDEN}")
