"""A batch's manifest: what its simulate job leaves (``BatchResult``: the cells its store holds, the store's
size and time, the cells that failed), the record every later start of the workflow checks the batch
against."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sweep import Sweep

MANIFEST_FORMAT = 2  # 1: attnflow 0.1, a store per cell (its manifests listed them under "stores")


def read_manifest(sweep: Sweep, batch: str) -> dict | None:
    """A batch's manifest: None if it has none; ``{}`` if it has one that is unreadable or not what a
    simulate job writes (``batch_health`` sends such a batch to run again)."""
    path = sweep.layout.manifest(batch)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if _well_formed(record) else {}


def _well_formed(record) -> bool:
    """A manifest as ``simulate_job`` writes it (of either format: the old one is stale, not damaged)."""
    if not isinstance(record, dict):
        return False
    if record.get("format") != MANIFEST_FORMAT:
        return "stores" in record
    return (isinstance(record.get("cells"), dict) and isinstance(record.get("failed"), dict)
            and all(isinstance(record.get(k), int) for k in ("size", "mtime_ns") if record.get("cells")))


@dataclasses.dataclass
class BatchResult:
    """What ``run_batch`` leaves: the batch's store, the cells it holds, those that failed whole (id ->
    error) and those that hold failed seeds (id -> ``simulate``'s ``seed_failures`` line)."""

    path: Path
    cells: dict[str, str]  # cell id -> its group in the store
    failed: dict[str, str]
    seed_failures: dict[str, str] = dataclasses.field(default_factory=dict)
    engines: dict[str, str] = dataclasses.field(default_factory=dict)  # cell id -> engine
    engine_numerics: dict[str, int] = dataclasses.field(default_factory=dict)  # cell id -> its version


def write_manifest(output: str | Path, batch: str, result: BatchResult) -> None:
    """Write a batch's manifest from what its job left (``run_batch``): the cells its store holds, the
    store's size and time (what the start-up check compares), the cells that failed whole (errors by
    cell id), those holding failed seeds (their ``seed_failures`` line), each stored cell's engine, and
    the numerics version they failed under."""
    stat = result.path.stat() if result.cells else None
    Path(output).write_text(json.dumps({
        "format": MANIFEST_FORMAT,
        "batch": batch,
        "store": result.path.name if result.cells else None,
        "size": stat.st_size if stat else None,
        "mtime_ns": stat.st_mtime_ns if stat else None,
        "cells": result.cells,
        "failed": result.failed,
        "seed_failures": result.seed_failures,
        "engines": result.engines,
        "engine_numerics": result.engine_numerics,
        "numerics_version": _numerics_version(),
    }, indent=1))


def _numerics_version() -> int:
    from ..numerics import NUMERICS_VERSION

    return NUMERICS_VERSION


__all__ = ["MANIFEST_FORMAT", "BatchResult", "read_manifest", "write_manifest"]
