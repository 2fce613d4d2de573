"""What makes stored numbers current: the versions a store's or summary's record must hold, and which
engine computed a stored cell under which version of its own numbers.

A store written under other versions is ``stale``; so is a cell another engine computed than the one its
cell names. Jobs (``run.batch``), the start-up check (``run.health``), summaries (``aggregate``) and readers
(``access``) ask here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .pack import LAYOUT
from .store import StoreState
from .store import verify as verify_store

if TYPE_CHECKING:
    import xarray as xr


def store_versions() -> dict:
    """What a simulation store's completion record must hold to be current: the numerics version
    (``attnflow.engine.NUMERICS_VERSION``) and the stored layout (``attnflow.pack.LAYOUT``). A store
    written under another is ``stale``: another numerics' cells are computed again, another layout's
    are read and written again in this one (``run_batch``), nothing computed."""
    from .numerics import NUMERICS_VERSION

    return {"numerics_version": NUMERICS_VERSION, "store_layout": LAYOUT}


def summary_versions(experiment) -> dict:
    """What a summary's record must hold to be current: its stores' numerics version and its
    experiment's ``reduction_version``."""
    return {**store_versions(), "reduction_version": experiment.reduction_version}


def verify_batch(path: str | Path, *, checksums: bool = True) -> StoreState:
    """``store.verify`` of a batch's store, which is also ``stale`` when another numerics wrote it."""
    return verify_store(path, checksums=checksums, expect=store_versions())


def stored_engine(ds: xr.Dataset) -> str:
    """The engine that computed a stored cell (its ``engine`` attribute): ``numba`` or ``jax``; a cell
    stored before the JAX engine existed has none, and was computed by numba."""
    return str(ds.attrs.get("engine", "numba"))


def stored_engine_numerics(ds: xr.Dataset) -> int:
    """The version of its engine's own numbers a stored cell was computed under (``engine_numerics``;
    1 for a cell stored before engines had their own)."""
    return int(ds.attrs.get("engine_numerics", 1))


def recorded_engines(record: dict) -> dict[str, str]:
    """A store record's or manifest's engines by cell id (``run_batch`` records them): every cell it
    holds, ``numba`` for a cell recorded before the JAX engine existed."""
    engines = record.get("engines") if isinstance(record.get("engines"), dict) else {}
    return {cid: str(engines.get(cid, "numba")) for cid in record.get("cells") or ()}


def recorded_engine_numerics(record: dict) -> dict[str, int]:
    """A store record's or manifest's engine numerics versions by cell id (1 where none is recorded)."""
    versions = record.get("engine_numerics") if isinstance(record.get("engine_numerics"), dict) else {}
    return {cid: int(versions.get(cid, 1)) for cid in record.get("cells") or ()}


def engine_staleness(stored: str, numerics: int, wanted: str | None) -> str | None:
    """Why a cell that engine ``stored`` computed under its numerics version ``numerics`` is stale (status
    says so), or None: another engine than the one its cell names (``wanted``; None for ``auto``, which
    takes either), or another version of that engine's own numbers (``numerics.ENGINE_NUMERICS``)."""
    from .numerics import ENGINE_NUMERICS

    if wanted is not None and stored != wanted:
        return f"computed by {stored}, this config asks for {wanted}"
    current = ENGINE_NUMERICS.get(stored)
    if numerics != current:
        return f"computed by {stored} under its numerics {numerics}, now {current}"
    return None


__all__ = ["engine_staleness", "recorded_engine_numerics", "recorded_engines", "store_versions",
           "stored_engine", "stored_engine_numerics", "summary_versions", "verify_batch"]
