"""The cost model's constants measured on a config's cells: ``plan.CALLS_OVER_MEASURED``, and the
certificate's cost against ``plan.certificate_over_run``.

Run: ``python benchmarks/bench_plan.py [--configfile config/paper.yaml] [--per 5] [--seeds 2]``

Per experiment it simulates ``--per`` cells spread over the cost model's range (the cheapest, the dearest
and quantiles between), each cut to its first ``--seeds`` seeds (seeds are independent trajectories, and
the model is linear in them), once without the accuracy certificate and once with it, in this one
process (the engine compiled first, outside the timings). It prints, per experiment and weighted by the
model's cost over all of the config's cells: the model's field evaluations over the engine's
(``CALLS_OVER_MEASURED``), and the certificate's CPU time over the stored run's beside the plan's
(``certificate_over_run``, in field evaluations). Ratios of CPU times in one process: steady on a shared
machine, where wall times are not. Cells the model prices above a minute (for the seeds kept) are left
out.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from attnflow import Cell, resources, simulate
from attnflow.config import load, validate
from attnflow.plan import certificate_over_run

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default=str(ROOT / "config" / "paper.yaml"))
    parser.add_argument("--per", type=int, default=5, help="cells measured per experiment")
    parser.add_argument("--seeds", type=int, default=2, help="seeds kept of each measured cell")
    args = parser.parse_args(argv)

    config = load(Path(args.configfile))
    config["results"] = tempfile.mkdtemp(prefix="attnflow-bench-plan-")
    sweep = validate(config, reach_scheduler=False)
    simulate(Cell(H=2, n=4, d=4, beta=0.5, heads="block", seeds=2, t_max=0.5, n_samples=3))  # compile
    weighted = {"model": 0.0, "calls": 0.0, "run": 0.0, "certificate": 0.0, "planned": 0.0}
    print(f"{'experiment':24} {'cells':>5} {'model calls / engine':>21} {'certificate / run':>18} "
          f"{'plan':>6}")
    for name, points in sweep.points.items():
        cells = sorted({id(p.cell): p.cell for p in points}.values(), key=resources.cell_seconds)
        total = sum(resources.cell_seconds(c) for c in cells)
        picks = sorted({int(round(q * (len(cells) - 1))) for q in np.linspace(0, 1, args.per)})
        model = calls = run = certified = planned = 0.0
        for i in picks:
            cell = cells[i]
            if cell.n_seeds > args.seeds:
                cell = cell.replace(seeds=cell.seeds[:args.seeds])
            if resources.cell_seconds(cell) > 60.0:
                continue
            start = time.process_time()
            plain = simulate(cell, certify=False)
            middle = time.process_time()
            simulate(cell)
            end = time.process_time()
            # Each measured cell stands for its share of the experiment's modelled cost.
            weight = 1.0 / resources.cell_seconds(cell)
            model += 1.0
            calls += weight * resources.cell_seconds(cell) * int(plain.attrs["solver_rhs_calls"]) / (
                resources.calls(cell) * cell.n_seeds)
            run += weight * (middle - start)
            certified += weight * (end - middle)
            planned += weight * (middle - start) * certificate_over_run(cell)
        if not model:
            continue
        print(f"{name:24} {len(picks):5d} {model / calls:21.1f} {(certified - run) / run:18.2f} "
              f"{planned / run:6.2f}")
        measured = {"model": model, "calls": calls, "run": run, "certificate": certified - run,
                    "planned": planned}
        for key, value in measured.items():
            weighted[key] += total * value / model
    print(f"{'weighted by cost':24} {'':5} {weighted['model'] / weighted['calls']:21.1f} "
          f"{weighted['certificate'] / weighted['run']:18.2f} {weighted['planned'] / weighted['run']:6.2f}")


if __name__ == "__main__":
    main()
