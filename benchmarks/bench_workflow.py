"""Workflow benchmark: wall time of a sweep from scratch, split into simulation compute and the rest.

Run: ``python benchmarks/bench_workflow.py [--configfile config/config.yaml] [--cores 2]``

It runs the workflow in a fresh temporary results directory and reads back
(a) each simulation's compute time, logged by ``run_batch`` around
``attnflow.simulate`` ("computed in X s"), and (b) every job's wall time from
Snakemake's ``benchmark:`` files. "Everything else" is job time not spent in
``simulate``: interpreter and import start-up, numba cache loading, zarr I/O,
aggregation and plotting.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from attnflow.layout import RULES, STORE_SUFFIX, Layout
from attnflow.store import record_of

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--keep", help="results directory to keep (default: a temporary one)")
    args = parser.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="attnflow-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(Path(args.configfile).read_text())
    config["results"] = str(work / "results")
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(work), "--configfile", str(config_path),
                           "--cores", str(args.cores)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        sys.exit("workflow failed")

    layout = Layout(work / "results")
    compute = sum(float(m) for log in layout.logs("simulate").rglob("*.log")
                  for m in re.findall(r"computed in ([0-9.]+) s", log.read_text()))
    job_time = {}
    for rule in RULES:
        for tsv in layout.benchmarks(rule).rglob("*.tsv"):
            with tsv.open() as fh:
                row = next(csv.DictReader(fh, delimiter="\t"))
            job_time.setdefault(rule, []).append(float(row["s"]))
    total_jobs = sum(sum(v) for v in job_time.values())
    n_cells = sum(len(record_of(p).get("cells") or ()) for p in layout.stores.glob(f"*{STORE_SUFFIX}"))

    print(f"config: {args.configfile}  cores: {args.cores}  cells: {n_cells}")
    print(f"wall time, from scratch:            {wall:8.1f} s")
    for rule, times in sorted(job_time.items()):
        print(f"  {rule:10} jobs: {len(times):4d}   job time {sum(times):8.1f} s")
    print(f"sum of job times:                   {total_jobs:8.1f} s")
    print(f"  simulation compute (simulate()):  {compute:8.1f} s  ({100 * compute / total_jobs:.0f}%)")
    print(f"  everything else:                  {total_jobs - compute:8.1f} s  "
          f"({100 * (1 - compute / total_jobs):.0f}%; target < 25%)")
    print(f"cores x wall:                       {args.cores * wall:8.1f} core-s "
          f"(compute fills {100 * compute / (args.cores * wall):.0f}%)")
    print_cost_model(config_path, layout)


def print_cost_model(config_path: Path, layout: Layout) -> None:
    """The cost model against the cells' measured compute, per experiment and in total: the numbers
    ``attnflow plan``'s constants come from (``plan.MODEL_OVER_CPU``, ``resources.stable_steps``). A cell
    logged as compiling the engine is left out (its time is the compilation)."""
    from attnflow import plan
    from attnflow.config import load, validate

    sweep = validate(load(config_path), reach_scheduler=False)
    model, measured, modelled_cells = {}, {}, set()
    for batch, cells in sweep.batches.items():
        log = layout.logs("simulate") / f"{batch}.log"
        if not log.exists():
            continue
        lines = [line for line in log.read_text().splitlines() if "computed in" in line]
        if len(lines) != len(cells) or any("compiling" in line for line in lines):
            continue  # a batch partly computed before, or the one that compiled the engine
        experiment = batch.split("-")[0]
        model[experiment] = model.get(experiment, 0.0) + sum(plan.cell_expected_cpu(c) for c in cells)
        measured[experiment] = measured.get(experiment, 0.0) + sum(
            float(re.search(r"computed in ([0-9.]+) s", line).group(1)) for line in lines)
        modelled_cells.update(id(c) for c in cells)
    print("plan's expected simulate() time over the measured (per experiment, batches fully computed here, "
          "the compiling one left out):")
    for experiment in sorted(model):
        ratio = model[experiment] / max(measured[experiment], 1e-9)
        print(f"  {experiment:24} {model[experiment]:8.1f} s expected / {measured[experiment]:8.1f} s "
              f"measured = {ratio:.2f}")
    total_model, total_measured = sum(model.values()), sum(measured.values())
    if total_measured:
        ratio = total_model / total_measured
        print(f"  {'total':24} {total_model:8.1f} s expected / {total_measured:8.1f} s measured = "
              f"{ratio:.2f}: plan.MODEL_OVER_CPU {plan.MODEL_OVER_CPU:g} x {ratio:.2f} = "
              f"{plan.MODEL_OVER_CPU * ratio:.3g} would make it 1 (cells priced by their stable steps aside)")


if __name__ == "__main__":
    main()
