"""Scale benchmark: a sweep of cheap cells at 10,000 and 100,000 cells, what it costs to keep them.

Run: ``python benchmarks/bench_scale.py [--cells 10000 100000] [--cores 2] [--keep DIR]``

For each size it writes a config of tiny cells (``scale_probe.py``'s
experiment: n = 2, d = 2, one seed, two samples, over a grid of lambda_bar x
beta, 500 cells per batch), runs the workflow once from scratch, then reports
what a sweep of that size costs at rest and at every start:

- files and bytes under the results directory (stores, manifests, logs,
  benchmarks, summary, figures), and files per cell;
- ``start``: a ``snakemake`` run with nothing to do (config, sweep, the
  start-up check of every batch's store, the DAG);
- ``dry run``: ``snakemake -n``;
- ``status``: ``attnflow status`` (each batch's store against its manifest, as
  every start does); ``status --deep``: every byte of every store verified;
- ``aggregate``: the aggregation job's wall time (Snakemake's benchmark file),
  every store read and reduced.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from attnflow.layout import Layout

HERE = Path(__file__).resolve().parent  # scale_probe.py, the benchmark's experiment
ROOT = HERE.parent
CELLS_PER_BATCH = 500


def config_of(cells: int, results: Path) -> dict:
    """``cells`` tiny cells: lambda_bar (one batch per value) x beta (batched)."""
    batches = max(1, cells // CELLS_PER_BATCH)
    per_batch = cells // batches
    return {
        "results": str(results),
        "experiment_modules": ["scale_probe"],
        "experiments": {"scale_probe": {
            "grid": {"lambda_bar": [round(float(v), 9) for v in np.geomspace(0.5, 2.0, batches)],
                     "beta": [round(float(v), 9) for v in np.geomspace(0.1, 10.0, per_batch)]},
        }},
    }


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, proc


def measure(cells: int, work: Path, cores: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results"
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(config_of(cells, results)))
    snakemake = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory",
                 str(work), "--configfile", str(config), "--cores", str(cores)]
    print(f"{cells} cells: running the sweep from scratch ...", file=sys.stderr, flush=True)
    run_seconds, _ = timed(snakemake, work)
    files = [p for p in results.rglob("*") if p.is_file()]
    start_seconds, proc = timed(snakemake, work)
    if "Nothing to be done" not in proc.stdout + proc.stderr:
        raise SystemExit(f"a second run had work to do:\n{proc.stderr[-3000:]}")
    dry_seconds, _ = timed([*snakemake, "-n"], work)
    status = [sys.executable, "-m", "attnflow.cli", "status", "--configfile", str(config)]
    status_seconds, _ = timed(status, work)
    deep_seconds, _ = timed([*status, "--deep"], work)
    with open(Layout(results).benchmark("aggregate", "scale_probe")) as fh:
        aggregate_seconds = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    return {"cells": cells, "run_s": run_seconds, "files": len(files),
            "bytes": sum(p.stat().st_size for p in files), "start_s": start_seconds, "dry_run_s": dry_seconds,
            "status_s": status_seconds, "deep_s": deep_seconds, "aggregate_s": aggregate_seconds}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--keep", help="directory to keep the sweeps in (default: a temporary one)")
    args = parser.parse_args(argv)
    base = Path(args.keep or tempfile.mkdtemp(prefix="attnflow-scale-"))
    rows = [measure(n, base / f"cells{n}", args.cores) for n in args.cells]
    print(f"\n{args.cores} cores, {CELLS_PER_BATCH} cells per batch; times in seconds\n")
    print("| cells | files | files/cell | MB | start, nothing to do | dry run | status | status --deep "
          "| aggregation | first run |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cells']:,} | {r['files']:,} | {r['files'] / r['cells']:.3f} | {r['bytes'] / 1e6:.0f} "
              f"| {r['start_s']:.1f} | {r['dry_run_s']:.1f} | {r['status_s']:.1f} | {r['deep_s']:.1f} "
              f"| {r['aggregate_s']:.1f} | {r['run_s']:.0f} |")


if __name__ == "__main__":
    main()
