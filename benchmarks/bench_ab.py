"""A/B of source trees of attnflow: ``simulate()`` at ``bench_peers.py``'s cells S / M / L in one worker
process per tree, called in turn (the order rotating each round), best of N by wall time and by the
process's CPU time (every thread: steadier than wall time on a shared machine).

Run: ``python benchmarks/bench_ab.py 9 before=/path/to/clone after=.`` (each tree a checkout with
``src/``; the first is the reference). Each worker keeps its numba cache in
``/tmp/attnflow_ab_cache_<name>``; its first S call (compilation where that cache is empty, and a run)
is reported. docs/performance.md, "Engine machinery", gives figures measured this way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CELLS = {"S": dict(n=8, d=8, H=2, seeds=64), "M": dict(n=32, d=32, H=4, seeds=64),
         "L": dict(n=128, d=64, H=4, seeds=8)}
WORKER = f"""
import json, sys, time
from attnflow import Cell, simulate
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    size = {CELLS!r}[line.strip()]
    cell = Cell(heads="random", beta=1.0, t_max=10.0, n_samples=101, rtol=1e-6, atol=1e-9, **size)
    wall, cpu = time.perf_counter(), time.process_time()
    simulate(cell)
    print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]), flush=True)
"""


def main(rounds: int, trees: dict[str, str]) -> None:
    workers = {name: subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=f"{tree}/src", NUMBA_CACHE_DIR=f"/tmp/attnflow_ab_cache_{name}"))
        for name, tree in trees.items()}

    def call(name, cell):
        workers[name].stdin.write(cell + "\n")
        workers[name].stdin.flush()
        return json.loads(workers[name].stdout.readline())

    for worker in workers.values():
        worker.stdout.readline()
    first = {}
    for name in workers:  # one at a time, so that the compilations do not overlap
        first[name] = call(name, "S")
        for cell in list(CELLS)[1:]:
            call(name, cell)
    names = list(workers)
    times = {(name, cell): [] for name in names for cell in CELLS}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for cell in CELLS:
            for name in order[::-1] if r % 2 else order:
                times[name, cell].append(call(name, cell))
    reference = names[0]
    for column, label in ((1, "process CPU time (every thread)"), (0, "wall time")):
        print(f"--- best of {rounds}, {label}; first S call (wall, CPU) from each worker's cache")
        for name in names:
            best = {cell: min(t[column] for t in times[name, cell]) for cell in CELLS}
            ratio = {cell: best[cell] / min(t[column] for t in times[reference, cell]) for cell in CELLS}
            row = "   ".join(f"{cell} {best[cell] * 1e3:9.1f} ms ({ratio[cell]:.3f})" for cell in CELLS)
            print(f"{name:10s} {first[name][0]:6.1f} s {first[name][1]:6.1f} s   {row}")
    for name in names:
        runs = {cell: [[round(t * 1e3, 1) for t in pair] for pair in times[name, cell]] for cell in CELLS}
        print(name, "every round, ms (wall, CPU):", runs)
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()


if __name__ == "__main__":
    main(int(sys.argv[1]), dict(arg.split("=", 1) for arg in sys.argv[2:]))
