"""The cost model against a finished run: each simulate job's measured seconds over `attnflow plan`'s.

Run: ``python benchmarks/bench_plan.py --configfile config/config.yaml`` after ``snakemake`` has run
that config (on a quiet machine). It reads the ``benchmark:`` file Snakemake wrote for each
simulate job and prints the job's measured wall seconds beside the plan's expected seconds of the
same job from scratch, without and with the engine's compilation. The estimate is meant to lie
within 2x (what tests/test_plan.py checked before it moved here: a timing is no unit test).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from attnflow.access import load_sweep
from attnflow.plan import COMPILE_SECONDS, jobs

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default=str(ROOT / "config" / "config.yaml"))
    args = parser.parse_args(argv)
    done = load_sweep(args.configfile)
    bench = done.layout.results / "benchmarks" / "simulate"
    measured = {}
    for path in sorted(bench.glob("*.tsv")):
        with path.open() as fh:
            measured[path.stem] = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    fresh = load_sweep(args.configfile, results=Path(tempfile.mkdtemp(prefix="attnflow-plan-")))
    print(f"{'job':40s} {'measured s':>11s} {'expected s':>11s} {'+compile':>9s} {'ratio':>6s}")
    outside = 0
    for name, job in sorted(jobs(fresh).items()):
        if name not in measured:
            continue
        low, high = job.expected_seconds, job.expected_seconds + COMPILE_SECONDS
        within = low / 2 <= measured[name] <= 2 * high
        outside += not within
        print(f"{name:40s} {measured[name]:11.2f} {low:11.2f} {high:9.2f} {measured[name] / low:6.2f}"
              + ("" if within else "  outside 2x"))
    print(f"{outside} of {len(measured)} jobs outside 2x of the estimate")
    return 1 if outside else 0


if __name__ == "__main__":
    raise SystemExit(main())
