"""Where every output of a sweep lives under its results directory: the one owner of those paths.

The Snakefile and its rules, the rule scripts' helpers, ``refine``, ``status``,
``plan``, ``progress`` and the access API all build their paths from a
``Layout``; a second spelling of a path is where two of them drift apart
(``tests/test_layout.py`` greps for one). Methods that take a name also accept
a Snakemake wildcard such as ``"{experiment}"``, so rules spell their patterns
through the same methods.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

STORE_SUFFIX = ".zarr"
FAILURE_SUFFIX = ".failed.json"
FIGURE_FORMATS = ("png", "pdf")
RULES = ("simulate", "aggregate", "plot")  # the workflow's job rules, each with its logs and benchmarks


@dataclasses.dataclass(frozen=True)
class Layout:
    """The paths of one results directory."""

    results: Path

    def __post_init__(self):
        object.__setattr__(self, "results", Path(self.results))

    @property
    def stores(self) -> Path:
        """The simulation stores, one per cell, named by cell id."""
        return self.results / "simulations"

    def store(self, cell_id: str) -> Path:
        return self.stores / f"{cell_id}{STORE_SUFFIX}"

    def failure(self, cell_id: str) -> Path:
        """A failed cell's error record (removed once the cell succeeds)."""
        return self.stores / f"{cell_id}{FAILURE_SUFFIX}"

    def manifest(self, batch: str) -> Path:
        """What a batch's simulate job finished and which of its cells failed: the job's output."""
        return self.results / "manifests" / f"{batch}.json"

    def summary(self, experiment: str) -> Path:
        return self.results / "summaries" / f"{experiment}{STORE_SUFFIX}"

    def figure(self, experiment: str, ext: str) -> Path:
        return self.results / "figures" / f"{experiment}.{ext}"

    def figures(self, experiment: str) -> list[Path]:
        return [self.figure(experiment, ext) for ext in FIGURE_FORMATS]

    def benchmarks(self, rule: str) -> Path:
        """Snakemake's benchmark files of one rule (``progress`` reads the simulate ones)."""
        return self.results / "benchmarks" / rule

    def benchmark(self, rule: str, name: str) -> Path:
        return self.benchmarks(rule) / f"{name}.tsv"

    def logs(self, rule: str) -> Path:
        """The job logs of one rule."""
        return self.results / "logs" / rule

    def log(self, rule: str, name: str) -> Path:
        return self.logs(rule) / f"{name}.log"

    def repairs(self, batch: str) -> Path:
        """A batch's repair tickets: inputs of its simulate job."""
        return self.results / "repairs" / batch

    def summary_tickets(self, experiment: str) -> Path:
        """An experiment's summary tickets: inputs of its aggregate and plot jobs. "_summaries": no batch
        name holds "_", so no batch's repair directory is this one."""
        return self.results / "repairs" / "_summaries" / experiment

    @property
    def lock(self) -> Path:
        """Held by the one workflow controller that may run on this results directory."""
        return self.results / ".attnflow.lock"


def store_id(store: str | Path) -> str:
    """The cell id a simulation store's path names."""
    return Path(store).name.removesuffix(STORE_SUFFIX)


__all__ = ["FAILURE_SUFFIX", "FIGURE_FORMATS", "RULES", "STORE_SUFFIX", "Layout", "store_id"]
