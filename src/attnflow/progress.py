"""Progress of a running sweep: per experiment the share of cells done and an ETA.

The ETA is the cost model's expected time of the cells still to compute
(``attnflow.plan.jobs``: the model without its margins, plus each job's
start-up; a job given a GPU prices its cells on the JAX engine by the GPU's
model), scaled by how the finished jobs of the same kind (CPU, GPU) compared
with the same model: the median over the jobs whose benchmark Snakemake has
written (``Layout.benchmarks("simulate")``) of measured / expected. The median
keeps a job that compiled the engine from inflating the whole estimate.
Without a finished job of that kind, the model alone. GPU jobs run one per GPU
slot beside the CPU jobs, as ``attnflow plan`` counts them. Aggregation and
plotting are not counted (seconds each, at the end).
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import numpy as np

from .ids import cell_id
from .layout import Layout
from .plan import (
    SIMULATE_THREADS,
    _duration,
    cell_states,
    expected_seconds,
    jobs,
    jobs_get_gpus,
    makespan_beside_gpus,
)
from .sweep import Sweep


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
             checksums: bool = False, declared: int | None = None):
    """``({experiment: Progress, "total": Progress}, scale, jobs measured)``: ``scale`` is the median
    measured / expected time of the finished CPU jobs (1.0 without any; GPU jobs get their own).
    ``checksums``: cells judged by every byte of their stores (``status --deep``), so a cell found
    damaged is never counted done. ``declared``: GPU jobs at once, as ``snakemake --resources gpu=N``
    (default: one where jax sees a GPU here and a cell's engine is auto)."""
    states = cell_states(sweep, checksums)
    gpus = jobs_get_gpus(sweep, declared)
    planned = jobs(sweep, states, threads, gpus, declared)
    measured = benchmark_seconds(sweep.results)
    on_gpu = {b: bool(job.gpu and gpus) for b, job in planned.items()}
    ratios = {kind: [measured[b] / expected_seconds(sweep.batches[b], threads, kind)
                     for b in planned if b in measured and on_gpu[b] == kind] for kind in (False, True)}
    scale = {kind: float(np.median(r)) if r else 1.0 for kind, r in ratios.items()}
    slots = max(1, (cores or os.cpu_count() or 1) // threads)
    remaining = {b: scale[on_gpu[b]] * job.expected_seconds for b, job in planned.items() if job.to_compute}

    def eta(batches) -> float:
        return makespan_beside_gpus([(remaining[b], bool(planned[b].gpu)) for b in batches if b in remaining],
                                    slots, declared or 1)

    out = {}
    for name in sweep.specs:
        ids = set(cell_id(p.cell) for p in sweep.points[name])
        done = sum(states[i] == "done" for i in ids)
        out[name] = Progress(done, len(ids), eta(sweep.batches_of(name)))
    out["total"] = Progress(sum(s == "done" for s in states.values()), len(states), eta(planned))
    return out, scale[False], len(ratios[False])


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
