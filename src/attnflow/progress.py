"""Progress of a running sweep: per experiment the share of cells done and an ETA.

The ETA is the cost model's expected time of the cells still to compute
(``attnflow.plan``: the model without its margins, plus each job's start-up),
scaled by how the finished jobs compared with the same model: the median over
the jobs whose benchmark Snakemake has written (``Layout.benchmarks("simulate")``)
of measured / expected. The median keeps a job that compiled the engine from
inflating the whole estimate. Without a finished job, the model alone.
Aggregation and plotting are not counted (seconds each, at the end).
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import numpy as np

from .layout import Layout
from .plan import SIMULATE_THREADS, _duration, cell_states, expected_seconds, makespan
from .sweep import Sweep, cell_id


def benchmark_seconds(results: str | Path) -> dict[str, float]:
    """Wall seconds of every finished simulate job, by batch, from Snakemake's benchmark files."""
    out = {}
    for path in sorted(Layout(results).benchmarks("simulate").glob("*.tsv")):
        try:
            with path.open() as fh:
                out[path.stem] = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
        except (OSError, StopIteration, KeyError, ValueError):
            continue  # being written, or not a benchmark
    return out


@dataclasses.dataclass
class Progress:
    done: int
    cells: int
    eta_seconds: float  # 0 when nothing is left

    @property
    def share(self) -> float:
        return self.done / self.cells if self.cells else 1.0


def progress(sweep: Sweep, cores: int | None = None, threads: int = SIMULATE_THREADS,
             checksums: bool = False):
    """``({experiment: Progress, "total": Progress}, scale, jobs measured)``: ``scale`` is the median
    measured / expected time of the finished jobs (1.0 without any). ``checksums``: cells judged by every
    byte of their stores (``status --deep``), so a cell found damaged is never counted done."""
    states = cell_states(sweep, checksums)
    measured = benchmark_seconds(sweep.results)
    ratios = [measured[b] / expected_seconds(cells, threads)
              for b, cells in sweep.batches.items() if b in measured]
    scale = float(np.median(ratios)) if ratios else 1.0
    slots = max(1, (cores or os.cpu_count() or 1) // threads)
    remaining = {}
    for batch, cells in sweep.batches.items():
        todo = [c for c in cells if states[cell_id(c)] != "done"]
        if todo:
            remaining[batch] = scale * expected_seconds(todo, threads)
    out = {}
    for name in sweep.specs:
        ids = set(cell_id(p.cell) for p in sweep.points[name])
        done = sum(states[i] == "done" for i in ids)
        eta = makespan([remaining[b] for b in sweep.batches_of(name) if b in remaining], slots)
        out[name] = Progress(done, len(ids), eta)
    out["total"] = Progress(sum(s == "done" for s in states.values()), len(states),
                            makespan(list(remaining.values()), slots))
    return out, scale, len(ratios)


def render(report: dict[str, Progress], scale: float, measured: int) -> str:
    basis = (f"{measured} finished jobs ran {scale:.2g}x the cost model's expected time" if measured
             else "no finished job yet: the cost model alone")
    lines = []
    for name, p in report.items():
        eta = "done" if not p.eta_seconds else f"ETA {_duration(p.eta_seconds)}"
        lines.append(f"progress {name:24} {100 * p.share:5.1f}% ({p.done}/{p.cells} cells), {eta}")
    lines.append(f"progress: simulations only; {basis}")
    return "\n".join(lines)


__all__ = ["Progress", "benchmark_seconds", "progress", "render"]
