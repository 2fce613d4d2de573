"""From a validated config to cells, batches and stores.

Nothing here checks a config: ``attnflow.config.validate`` does, and then calls
``Sweep.expand`` with what it resolved (this module never imports ``config``).
Given a config ``validate`` has not accepted, the functions here may fail with
whatever error the bad value causes (a ``Cell``'s own ``ValueError``, say).

Each experiment's grid is the Cartesian product of its axes; each cell's
store is named by a hash of all its fields, so adding a value to an axis adds
stores and changes none. Cells are grouped into batches (one simulation job
each): cells differing only along ``batch_over`` share one. A cell that
several experiments (or grid points) share is owned by exactly one batch, the
first that needs it, so one job writes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path

from .cell import Cell
from .experiments import Spec
from .layout import FAILURE_SUFFIX, STORE_SUFFIX, Layout, store_id
from .store import StoreState, write
from .store import verify as verify_store


def config_digest(config: dict) -> str:
    """SHA-256 of a config (as canonical JSON): the provenance tag of stores, summaries and figures."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def cell_id(cell: Cell) -> str:
    """Stable short name of a cell: a hash of every field (values normalised by ``Cell``) and of
    the content of any file it reads (so editing a weights file in place makes new stores)."""
    text = json.dumps(cell.to_dict(), sort_keys=True) + cell.input_digest()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def store_versions() -> dict:
    """What a simulation store's completion record must hold to be current: the numerics version
    (``attnflow.engine.NUMERICS_VERSION``). A store written under another is ``stale``."""
    from .engine.version import NUMERICS_VERSION

    return {"numerics_version": NUMERICS_VERSION}


def summary_versions(experiment) -> dict:
    """What a summary's record must hold to be current: its stores' numerics version and its
    experiment's ``reduction_version``."""
    return {**store_versions(), "reduction_version": experiment.reduction_version}


def verify_cell(path: str | Path, *, checksums: bool = True) -> StoreState:
    """``store.verify`` of a simulation store, which is also ``stale`` when another numerics wrote it."""
    return verify_store(path, checksums=checksums, expect=store_versions())


def store_path(root: str | Path, cell: Cell) -> Path:
    return Path(root) / f"{cell_id(cell)}{STORE_SUFFIX}"


def failure_path(root: str | Path, cell: Cell) -> Path:
    """Where a failed cell's error is recorded (removed once the cell succeeds)."""
    return Path(root) / f"{cell_id(cell)}{FAILURE_SUFFIX}"


def failure_of(store: str | Path) -> dict | None:
    """The failure record beside a simulation store's path (None if its cell has not failed)."""
    store = Path(store)
    try:
        return json.loads(store.with_name(store_id(store) + FAILURE_SUFFIX).read_text())
    except (OSError, ValueError):
        return None


def describe_failures(failed: list[dict]) -> str:
    """Failed grid points for a caption: ``coords (error)``, the error without the cell's repetition."""
    def short(error: str) -> str:
        return error.split("): ", 1)[1] if error.startswith("cell(") and "): " in error else error

    return "; ".join(", ".join(f"{k}={v}" for k, v in f["coords"].items()) + f" ({short(f['error'])})"
                     for f in failed)


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point of an experiment: its coordinates along the grid axes and its cell."""

    coords: dict
    cell: Cell


def resolve(config: dict, experiments) -> tuple[dict[str, Spec], dict[str, str]]:
    """Every experiment block resolved to its ``Spec``, and those experiments that cannot run on
    this machine (name -> the experiment's ``unavailable`` reason)."""
    specs, skipped = {}, {}
    for name, block in (config.get("experiments") or {}).items():
        experiment = experiments.get(name)
        specs[name] = spec = experiment.spec(block, config.get("defaults"))
        reason = experiment.unavailable(spec)
        if reason:
            skipped[name] = reason
    return specs, skipped


def point(spec: Spec, coords: dict) -> Point:
    """The grid point of a spec at ``coords``: its fixed fields and the coordinates, as a ``Cell``
    (whose own ``ValueError`` names a field it refuses)."""
    return Point(coords, Cell(**{**spec.fixed, **coords}))


def spec_points(spec: Spec) -> list[Point]:
    """The grid points of a resolved spec (the product, then any extra points, each once)."""
    return [point(spec, coords) for coords in spec.coordinates()]


def _batch_key(spec: Spec, coords: dict) -> str:
    key = {k: v for k, v in coords.items() if k not in spec.batch_over}
    label = "-".join(f"{k}{v}" for k, v in key.items()) or "all"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{spec.name}-{label}-{digest}" if len(label) < 60 else f"{spec.name}-{digest}"


@dataclasses.dataclass
class Sweep:
    """A validated config: its experiments' specs and grid points, and the simulation batches."""

    config: dict
    experiments: object  # Registry[Experiment]
    specs: dict[str, Spec]
    points: dict[str, list[Point]]
    batches: dict[str, list[Cell]]  # batch name -> cells it owns (each cell id in one batch)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # experiment -> why it cannot run

    @classmethod
    def from_config(cls, config: dict, experiments) -> Sweep:
        """The sweep of a config ``attnflow.config.validate`` accepts (which is what callers should
        call: it checks the config first and returns this)."""
        specs, skipped = resolve(config, experiments)
        points = {name: spec_points(spec) for name, spec in specs.items() if name not in skipped}
        return cls.expand(config, experiments, specs, points, skipped)

    @classmethod
    def expand(cls, config: dict, experiments, specs: dict[str, Spec], points: dict[str, list[Point]],
               skipped: dict[str, str]) -> Sweep:
        """The sweep of checked specs: the ``skipped`` experiments left out, the others' grid points
        (``points``: name -> its points) grouped into batches, each cell owned by the first batch that
        needs it."""
        specs = {name: spec for name, spec in specs.items() if name not in skipped}
        batches: dict[str, list[Cell]] = {}
        owned: set[str] = set()
        for name, spec in specs.items():
            for p in points[name]:
                cid = cell_id(p.cell)
                if cid not in owned:
                    owned.add(cid)
                    batches.setdefault(_batch_key(spec, p.coords), []).append(p.cell)
        return cls(config, experiments, specs, points, batches, skipped)

    @property
    def results(self) -> Path:
        return Path(self.config.get("results", "results"))

    @property
    def layout(self) -> Layout:
        """Where every output of this sweep lives."""
        return Layout(self.results)

    @property
    def stores(self) -> Path:
        return self.layout.stores

    def entries(self, name: str) -> list[tuple[dict, str]]:
        """``(grid coordinates, store path)`` of every grid point of an experiment."""
        return [(p.coords, str(store_path(self.stores, p.cell))) for p in self.points[name]]

    def batches_of(self, name: str) -> list[str]:
        """The batches holding an experiment's cells (its own and those it shares)."""
        ids = {cell_id(p.cell) for p in self.points[name]}
        return sorted(b for b, cells in self.batches.items() if ids & {cell_id(c) for c in cells})


@dataclasses.dataclass
class BatchResult:
    """What ``run_batch`` leaves: every cell's store path, and the cells that failed (id -> error)."""

    paths: list[Path]
    failed: dict[str, str]


# Errors that fail one cell, named, and let its batch go on: the simulation's own, and the
# arithmetic ones the compiled code can still raise (numba reports some as SystemError).
CELL_ERRORS = (ArithmeticError, SystemError)


def run_batch(cells: Iterable[Cell], root: str | Path, log=print, provenance=None) -> BatchResult:
    """Simulate every cell whose store under ``root`` is not complete; every cell's store path and
    the failures.

    A complete store (its completion record matches, every byte checked) is skipped;
    a missing, interrupted, corrupt or stale one (another numerics version) is
    computed again. A cell that fails (``SimulationError``: step budget,
    non-finite values; or an arithmetic error in the compiled code) leaves no
    store and a failure record (``Layout.failure``) with its error, and the batch goes on:
    one bad cell costs its own point of the figure, not the figure.
    """
    from .simulation import SimulationError, describe, simulate  # the engine loads only where it runs

    paths, failed = [], {}
    cells = list(cells)
    Path(root).mkdir(parents=True, exist_ok=True)
    for i, cell in enumerate(cells, 1):
        path = store_path(root, cell)
        paths.append(path)
        # Every byte: a job reads its own stores once. The start-up check reads sizes and
        # times only; bit rot reaches this job through the ticket `attnflow status` writes.
        state = verify_cell(path, checksums=True)
        if state.ok:
            log(f"[{i}/{len(cells)}] {path.name}: complete, skipped")
            continue
        if state.status in ("corrupt", "stale"):
            log(f"[{i}/{len(cells)}] {path.name}: {state.status} ({state.detail}), recomputing")
        start = time.perf_counter()
        try:
            ds = simulate(cell)
        except (SimulationError, *CELL_ERRORS) as err:
            error = str(err) if isinstance(err, SimulationError) else \
                f"{describe(cell)}: {type(err).__name__} in the simulation: {err}"
            failure_path(root, cell).write_text(json.dumps(
                {"cell_id": cell_id(cell), "cell": cell.to_dict(), "error": error}, indent=1))
            failed[cell_id(cell)] = error
            log(f"[{i}/{len(cells)}] {path.name}: FAILED: {error}")
            continue
        elapsed = time.perf_counter() - start
        ds.attrs.update({"cell_id": cell_id(cell), **store_versions(), **(provenance or {})})
        # A store found corrupt is replaced even where the publisher's cheap check (sizes and
        # times) would take it for complete, as it does bit rot.
        fresh = write(ds, path, versions=store_versions(), replace=state.status == "corrupt")
        failure_path(root, cell).unlink(missing_ok=True)
        log(f"[{i}/{len(cells)}] {path.name}: {cell.n_seeds} seeds, {int(ds.n_steps.max())} steps, "
            f"computed in {elapsed:.3f} s, " + ("written" if fresh else "already written by another job"))
    if failed:
        log(f"{len(failed)} of {len(cells)} cells FAILED (recorded in the manifest; the next snakemake "
            "retries them once)")
    return BatchResult(paths, failed)


__all__ = ["BatchResult", "CELL_ERRORS", "Point", "STORE_SUFFIX", "Sweep", "cell_id", "config_digest",
           "describe_failures", "failure_of", "failure_path", "point", "resolve", "run_batch", "spec_points",
           "store_path", "store_versions", "summary_versions", "verify_cell"]
