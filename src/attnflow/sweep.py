"""From a sweep config to cells, batches and stores.

A config has ``defaults`` (cell fields shared by every experiment) and
``experiments``: each with ``fixed`` cell fields, a ``grid`` (cell field ->
list of values; cells are the Cartesian product) and ``batch_over`` (grid axes
whose values share one job). A cell's store is named by a hash of all its
fields, so adding a value to an axis adds stores and changes none; a batch job
computes only the stores of its cells that do not exist yet.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import xarray as xr

from .cell import Cell

EXPERIMENTS = ("energy", "beta_star", "superadditivity", "clustering_time", "entropy", "orthogonality")
STORE_SUFFIX = ".zarr"


class ConfigError(ValueError):
    """A sweep config that cannot run; the message names the key and value."""


def config_digest(config: dict) -> str:
    """SHA-256 of a config (as canonical JSON): the provenance tag of stores, summaries and figures."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def cell_id(cell: Cell) -> str:
    """Stable short name of a cell: a hash of every field (values as JSON)."""
    text = json.dumps(cell.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def experiment_cells(config: dict, experiment: str) -> list[tuple[dict, Cell]]:
    """All cells of an experiment, each with its grid coordinates (axis -> value)."""
    spec = config["experiments"][experiment]
    grid = spec.get("grid", {})
    base = {**config.get("defaults", {}), **spec.get("fixed", {})}
    axes = list(grid)
    for axis in axes:
        if not isinstance(grid[axis], list) or not grid[axis]:
            raise ConfigError(f"experiments.{experiment}.grid.{axis} = {grid[axis]!r}: "
                              "must be a non-empty list")
        if axis in base and axis in spec.get("fixed", {}):
            raise ConfigError(f"experiments.{experiment}: {axis!r} is both fixed and a grid axis")
    cells = []
    for values in itertools.product(*(grid[a] for a in axes)):
        coords = dict(zip(axes, values, strict=False))
        fields = {**base, **coords}
        try:
            cell = Cell(**fields)
        except TypeError as err:  # unknown field name
            raise ConfigError(f"experiments.{experiment}: {err}") from None
        except ValueError as err:
            raise ConfigError(f"experiments.{experiment} (cell {coords}): {err}") from None
        cells.append((coords, cell))
    return cells


def experiment_batches(config: dict, experiment: str) -> dict[str, list[Cell]]:
    """Cells of an experiment grouped into jobs: cells differing only along ``batch_over`` share one."""
    spec = config["experiments"][experiment]
    batch_over = [a for a in spec.get("batch_over", []) if a in spec.get("grid", {})]
    groups: dict[str, list[Cell]] = {}
    for coords, cell in experiment_cells(config, experiment):
        key = {k: v for k, v in coords.items() if k not in batch_over}
        label = "-".join(f"{k}{v}" for k, v in key.items()) or "all"
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
        groups.setdefault(f"{label}-{digest}" if len(label) < 60 else digest, []).append(cell)
    return groups


def validate_config(config: dict) -> None:
    """Build every cell of every enabled experiment; raise ``ConfigError`` on the first bad one."""
    experiments = config.get("experiments") or {}
    if not experiments:
        raise ConfigError("experiments: empty, nothing to run")
    for name in experiments:
        if name not in EXPERIMENTS:
            raise ConfigError(f"experiments.{name}: unknown experiment (known: {', '.join(EXPERIMENTS)})")
        if not experiment_cells(config, name):
            raise ConfigError(f"experiments.{name}: the grid has no cells")


def store_path(root: str | Path, cell: Cell) -> Path:
    return Path(root) / f"{cell_id(cell)}{STORE_SUFFIX}"


def write_store(ds: xr.Dataset, path: Path) -> None:
    """Write ``ds`` so that ``path`` exists only once complete: a temporary store, then a rename."""
    tmp = path.with_name(path.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    encoding = {name: {"chunks": var.shape} for name, var in ds.data_vars.items() if var.ndim}
    # Zarr format 2: string coordinates and consolidated metadata are stable there
    # (zarr 3 warns that both are not yet part of the v3 spec).
    ds.to_zarr(tmp, mode="w", encoding=encoding, consolidated=True, zarr_format=2)
    if os.environ.get("ATTNFLOW_FAULT") == "hang-before-rename":
        # Fault injection for the kill-and-resume test: a job stuck mid-write.
        time.sleep(3600)
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def with_cell_coords(ds: xr.Dataset, cell: Cell, fields: Iterable[str] | None = None) -> xr.Dataset:
    """Attach cell fields as scalar coordinates (all but ``seeds``, the ``seed`` dimension, by default).

    Every field is also in the attrs (``cell_*``); each coordinate costs a zarr
    array of its own (measured: 22 of them doubled a store's write time), so the
    workflow keeps only its experiment's grid axes as coordinates.
    """
    values = cell.to_dict()
    names = [f for f in (values if fields is None else fields) if f != "seeds"]
    return ds.assign_coords({k: np.asarray(values[k]) for k in names})


def failure_path(root: str | Path, cell: Cell) -> Path:
    """Where a failed cell's error is recorded (removed once the cell succeeds)."""
    return Path(root) / f"{cell_id(cell)}.failed.json"


def run_batch(cells: Iterable[Cell], root: str | Path, log=print, provenance=None,
              coord_fields: Iterable[str] | None = None) -> list[Path]:
    """Simulate every cell whose store is missing under ``root``; return all store paths.

    ``coord_fields``: the cell fields stored as coordinates (default: all).

    Stores that exist are complete (see ``write_store``) and are skipped. A cell
    that fails leaves no store, a ``.failed.json`` record naming it, and stops
    the batch with ``SimulationError``; cells finished before it keep their stores.
    """
    from .simulation import SimulationError, simulate  # the engine loads only where it runs

    paths = []
    cells = list(cells)
    Path(root).mkdir(parents=True, exist_ok=True)
    for i, cell in enumerate(cells, 1):
        path = store_path(root, cell)
        paths.append(path)
        if path.exists():
            log(f"[{i}/{len(cells)}] {path.name}: exists, skipped")
            continue
        start = time.perf_counter()
        try:
            ds = simulate(cell)
        except SimulationError as err:
            failure_path(root, cell).write_text(json.dumps(
                {"cell_id": cell_id(cell), "cell": cell.to_dict(), "error": str(err)}, indent=1))
            log(f"[{i}/{len(cells)}] {path.name}: FAILED: {err}")
            raise
        ds.attrs.update({"cell_id": cell_id(cell), **(provenance or {})})
        write_store(with_cell_coords(ds, cell, coord_fields), path)
        failure_path(root, cell).unlink(missing_ok=True)
        log(f"[{i}/{len(cells)}] {path.name}: {cell.n_seeds} seeds, {int(ds.n_steps.max())} steps, "
            f"computed in {time.perf_counter() - start:.3f} s, written")
    return paths


def estimated_seconds(cells: Iterable[Cell]) -> float:
    """A generous wall-time estimate for simulating ``cells`` (for cluster resources).

    Model: cost ~ seeds x t_max x H n^2 d x stiffness per cell, the constant
    measured on the engine benchmark (cell M: 64 seeds, t_max 10, about 0.5 s
    on one 2-core node), times 10 for safety, plus 20 s of start-up. Stiffness
    is ``1 + beta ||M||`` (the step count grows with the scores' scale); usa's
    unnormalised weights make it ``e^{beta ||M||} / 10`` when that is larger
    (measured: 12,000 steps at beta ||M|| = 8 against 40 for softmax).
    """
    per_unit = 6e-9 * 10
    total = 20.0
    for c in cells:
        scale = c.beta * c.max_score_norm
        stiffness = 1.0 + scale
        if c.attention == "usa":
            stiffness = max(stiffness, np.exp(scale) / 10.0)
        total += per_unit * c.n_seeds * c.t_max * c.H * c.n**2 * c.d * stiffness
    return total


def estimated_memory_mb(cells: Iterable[Cell]) -> int:
    """Peak memory estimate of a batch job: the largest cell's outputs, 3x, plus 600 MB of runtime."""
    worst = 0
    for c in cells:
        per_sample = c.H * c.n * 8 + (c.n * c.d if c.save_positions else 0)
        worst = max(worst, c.n_seeds * c.n_samples * per_sample * 8)
    return int(600 + 3 * worst / 2**20)


__all__ = [
    "ConfigError",
    "estimated_memory_mb",
    "estimated_seconds",
    "failure_path",
    "EXPERIMENTS",
    "cell_id",
    "config_digest",
    "experiment_batches",
    "experiment_cells",
    "run_batch",
    "store_path",
    "validate_config",
    "write_store",
]
