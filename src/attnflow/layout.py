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
import os
from pathlib import Path

STORE_SUFFIX = ".zarr.zip"  # one file per store (attnflow.store); zarr's own name for a zipped hierarchy
OLD_STORE_SUFFIX = ".zarr"  # attnflow 0.1: a directory per cell (or summary), no longer read
FIGURE_FORMATS = ("png", "pdf")
RULES = ("simulate", "aggregate", "plot")  # the workflow's job rules, each with its logs and benchmarks


FIGURE_PART_SEP = "-"  # <experiment>-<part>: no experiment name holds "-" (they are Python identifiers)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The paths of one results directory.

    ``figure_parts`` holds, for each experiment that draws more than one figure,
    the parts it draws (``Experiment.figures``): ``""`` is ``<experiment>.png``,
    ``"x"`` is ``<experiment>-x.png``. An experiment not named draws one figure.
    """

    results: Path
    figure_parts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "results", Path(self.results))
        object.__setattr__(self, "figure_parts",
                           tuple((name, tuple(parts)) for name, parts in self.figure_parts))

    @property
    def stores(self) -> Path:
        """The simulation stores, one file per batch (its cells inside, by cell id)."""
        return self.results / "simulations"

    def store(self, batch: str) -> Path:
        return self.stores / f"{batch}{STORE_SUFFIX}"

    def old_stores(self) -> list[Path]:
        """Stores of attnflow 0.1, a directory per cell, which nothing reads now (one listing)."""
        try:
            return sorted(p for p in self.stores.iterdir()
                          if p.name.endswith(OLD_STORE_SUFFIX) and p.is_dir())
        except OSError:
            return []

    def pending(self, batch: str) -> Path:
        """The cells a running (or killed) simulate job has finished, one store each, until it packs
        them into its batch's store: a killed job's successor resumes from them."""
        return self.stores / ".pending" / batch

    @property
    def manifests(self) -> Path:
        """The folder of the batches' manifests (``manifest``)."""
        return self.results / "manifests"

    def manifest(self, batch: str) -> Path:
        """What a batch's simulate job finished (its store's cells, size and time) and which of its
        cells failed, with their errors: the job's output."""
        return self.manifests / f"{batch}.json"

    def job_params(self, digest: str) -> Path:
        """Job parameters too long for a rule's params (a batch's cells, an experiment's grid points), in a
        file named by their digest, which the rules pass instead (``attnflow.jobparams``)."""
        return self.results / "params" / f"{digest}.json"

    def summary(self, experiment: str) -> Path:
        return self.results / "summaries" / f"{experiment}{STORE_SUFFIX}"

    def figure(self, figure: str, ext: str) -> Path:
        """One figure file; ``figure`` is an experiment's name (its first figure) or one of
        ``figure_names``."""
        return self.results / "figures" / f"{figure}.{ext}"

    def figure_names(self, experiment: str) -> list[str]:
        """The names of the figures an experiment draws: its own name first, then ``<name>-<part>``."""
        parts = dict(self.figure_parts).get(experiment, ("",))
        return [f"{experiment}{FIGURE_PART_SEP}{part}" if part else experiment for part in parts]

    def figures(self, experiment: str) -> list[Path]:
        """Every file of every figure an experiment draws (PNG and PDF each)."""
        return [self.figure(name, ext) for name in self.figure_names(experiment) for ext in FIGURE_FORMATS]

    @staticmethod
    def part_of(figure: str) -> tuple[str, str]:
        """``(experiment, part)`` a figure name stands for (``figure_names`` backwards)."""
        experiment, _, part = figure.partition(FIGURE_PART_SEP)
        return experiment, part

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

    @property
    def owner(self) -> Path:
        """Which config last ran on this results directory (its name, path and digest): a run of
        another config here is refused unless told to take it over (``run.owner.foreign_owner``)."""
        return self.results / "attnflow-owner.json"

    @property
    def refinement(self) -> Path:
        """The grid points ``attnflow refine`` added, by experiment: part of the grid of every later
        run on this results directory (``config.validate`` merges them into ``extra_points``)."""
        return self.results / "refinement.json"


RESULTS_ROOT = "results"  # a config without `results:` writes under results/<its file's stem>
DEFAULT_NAME = "default"  # ... and a config given as a mapping, with no file, under results/default


def results_of(config: dict, configfile: str | Path | None = None) -> Path:
    """A config's results directory: its ``results`` (``~`` expanded; relative to the working
    directory), else ``results/<stem of configfile>`` (``results/default`` without a file).

    The one place this is decided: the workflow, the ``attnflow`` commands and the notebook API
    (``open_summary``, ``open_cells``) all resolve it here, through ``config.validate``.
    """
    value = config.get("results")
    if value is None:
        value = f"{RESULTS_ROOT}/{Path(configfile).stem if configfile else DEFAULT_NAME}"
    return Path(os.path.expanduser(value)) if isinstance(value, str) else value


def store_id(store: str | Path) -> str:
    """The batch (or experiment, for a summary) a store's path names."""
    return Path(store).name.removesuffix(STORE_SUFFIX)


__all__ = ["DEFAULT_NAME", "FIGURE_FORMATS", "FIGURE_PART_SEP", "OLD_STORE_SUFFIX", "RESULTS_ROOT", "RULES",
           "STORE_SUFFIX", "Layout", "results_of", "store_id"]
