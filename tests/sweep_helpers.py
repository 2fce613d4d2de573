"""Shared helpers for the tests that run the Snakemake workflow end to end."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from attnflow.store import open_verified, verify

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "config_tiny.yaml"
# The tests' own experiment modules (toy_experiment) are importable in every job.
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))}


def set_dotted(cfg: dict, path: str, value) -> None:
    """``cfg["a"]["b"] = value`` for ``path = "a.b"``, creating levels; ``None`` removes the key."""
    node = cfg
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(leaf, None)
    else:
        node[leaf] = value


def write_config(tmp: Path, name: str = "config.yaml", **edits) -> Path:
    """The tiny config with results under ``tmp/results``; ``edits`` use dotted keys."""
    cfg = yaml.safe_load(TINY.read_text().replace("RESULTS_DIR", str(tmp / "results")))
    for path, value in edits.items():
        set_dotted(cfg, path, value)
    out = tmp / name
    out.write_text(yaml.safe_dump(cfg))
    return out


# Every experiment of the tiny config but beta_star: dropped from it, beta_star runs alone.
NOT_BETA_STAR = ("energy", "superadditivity", "clustering_time", "clustering_probability", "entropy",
                 "orthogonality", "toy_margin")


def beta_star_config(tmp: Path, name: str = "config.yaml", **edits) -> Path:
    """The tiny config's beta_star alone (2 batches of 2 cells), results under ``tmp/results``."""
    return write_config(tmp, name, **{f"experiments.{e}": None for e in NOT_BETA_STAR}, **edits)


def snakemake_cmd(workdir: Path, config: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
            "--directory", str(workdir), "--configfile", str(config), *extra]


def run(workdir, config, *extra, check=True, env=None, cores=2):
    args = list(extra)
    if not any(a.startswith("--profile") or a == "--cores" for a in args):
        args = ["--cores", str(cores), *args]
    proc = subprocess.run(snakemake_cmd(workdir, config, *args), capture_output=True, text=True,
                          env={**os.environ, **ENV, **(env or {})})
    if check and proc.returncode:
        raise AssertionError(proc.stdout[-6000:] + proc.stderr[-6000:])
    return proc


def planned(workdir, config, *targets) -> dict[str, int]:
    """Jobs a dry run would execute, by rule."""
    return jobs_of(dry_run(workdir, config, *targets))


def dry_run(workdir, config, *targets, quiet=True):
    """The dry run ``planned`` makes, its output whole (what the Snakefile says at start-up on stderr);
    ``quiet`` False: every job printed too, as ``snakemake -n`` prints them."""
    return run(workdir, config, *targets, "-n", *(("--quiet", "rules") if quiet else ()))


def jobs_of(dry) -> dict[str, int]:
    """Jobs a dry run (``dry_run``) would execute, by rule: its table of job counts (none: nothing to do)."""
    table = re.search(r"^job\s+count\n-+\s+-+\n(.*?)^total\s+\d+$", dry.stdout, flags=re.M | re.S)
    counts = re.findall(r"^(\w+)\s+(\d+)$", table.group(1), flags=re.M) if table else []
    return {k: int(v) for k, v in counts}


def snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    """mtime and bytes of every file under ``directory``, by relative path."""
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_same_results(a: Path, b: Path, within: bool = False):
    """Every simulated cell and every summary in results dirs ``a`` and ``b`` holds identical numbers.
    ``within``: ``b`` may hold more (a run of a larger config); every one of ``a``'s is in it."""
    cells_a, cells_b = stored(a), stored(b)
    assert cells_a and (set(cells_a) <= set(cells_b) if within else set(cells_a) == set(cells_b))
    for cid in cells_a:
        assert set(cells_a[cid].data_vars) == set(cells_b[cid].data_vars), cid
    assert_same_cells(cells_a, cells_b)
    summaries = sorted(p.name for p in (a / "summaries").glob("*.zarr.zip"))
    in_b = {p.name for p in (b / "summaries").glob("*.zarr.zip")}
    assert summaries and (set(summaries) <= in_b if within else set(summaries) == in_b)
    for name in summaries:
        assert verify(a / "summaries" / name).ok and verify(b / "summaries" / name).ok, name
        da = open_verified(a / "summaries" / name).load()
        db = open_verified(b / "summaries" / name).load()
        assert set(da.data_vars) == set(db.data_vars)
        for var in da.data_vars:
            np.testing.assert_array_equal(da[var].values, db[var].values, err_msg=f"{name}:{var}")


def stored(results: Path) -> dict:
    """Every cell stored under a results directory (cell id -> dataset, loaded), from its batches' stores."""
    from attnflow.run.stored import stored_cells

    cells = {}
    for path in sorted((Path(results) / "simulations").glob("*.zarr.zip")):
        cells.update(stored_cells(path))
    return cells


def assert_same_cells(a: dict, b: dict, ids=None):
    """The cells ``ids`` (default: every cell of ``a``) hold bit-identical variables in ``a`` and ``b``."""
    import numpy as np

    for cid in ids if ids is not None else a:
        for var in a[cid].data_vars:
            np.testing.assert_array_equal(a[cid][var].values, b[cid][var].values, err_msg=f"{cid} {var}")


def place_batch(sweep, batch: str, cells: dict, failed: dict | None = None):
    """A finished batch as its simulate job leaves it: a store of ``cells`` (id -> dataset) and a
    manifest recording them and the ``failed`` cells (id -> error)."""
    import json

    from attnflow.pack import group_cells, placement
    from attnflow.run.batch import _engines_of
    from attnflow.run.manifest import MANIFEST_FORMAT
    from attnflow.store import write
    from attnflow.versions import store_versions

    path = sweep.layout.store(batch)
    groups = group_cells(cells)
    placed = placement(groups)
    # Each cell's engine and the version of that engine's numbers, as run_batch records them (a record
    # without them reads as numba's first numerics: stale once that engine's numbers move).
    engines = _engines_of(cells)
    write(groups, path, versions=store_versions(), replace=True,
          meta={"batch": batch, "cells": placed, **engines})
    manifest = sweep.layout.manifest(batch)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "batch": batch, "store": path.name,
                                    "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns,
                                    "cells": placed, "failed": failed or {}, **engines}))


def point_name(config: Path, cid: str, experiment: str | None = None) -> str:
    """How ``attnflow status`` names a cell of ``config``: its grid point (``Sweep.name_of``)."""
    from attnflow.config import load, validate

    return validate(load(config), reach_scheduler=False).name_of(cid, experiment)
