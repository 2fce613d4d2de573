"""The cells a batch's store holds that can be trusted, read once with every byte checked; the other
stores and a killed job's checkpoints that hold cells a batch needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..layout import STORE_SUFFIX, Layout
from ..store import StoreState
from ..versions import store_versions

if TYPE_CHECKING:
    import xarray as xr


def stored_cells(path: str | Path) -> dict[str, xr.Dataset]:
    """The cells of a batch's store that can be trusted (id -> dataset, loaded): all of a complete
    store's, those of a corrupt store's intact groups, none of a stale or unreadable one's."""
    return _read_cells(path)[1]


def _read_cells(path: str | Path) -> tuple[StoreState, dict[str, xr.Dataset]]:
    """A batch's store read once, every byte checked: its state and its trusted cells."""
    from ..pack import split
    from ..store import open_groups, read

    state, record, members = read(path, expect=store_versions())
    layout_only = state.status == "stale" and _layout_only(record)
    if layout_only:
        # Stale in its layout alone: the same numbers, read (pack reads either layout) and written again.
        state = StoreState("stale", state.detail + "; its cells are read and written again in this layout")
    elif state.status not in ("done", "corrupt") or "" in state.damaged:  # "": the root's metadata
        return state, {}
    cells = {}
    intact = [group for group in record.get("groups", []) if group not in state.damaged]
    for ds in open_groups(members, intact, chunks=None):
        cells.update(split(ds.load()))
    if layout_only:
        cells = {cid: _renamed_norm(ds) for cid, ds in cells.items()}
    return state, cells


def _renamed_norm(ds: xr.Dataset) -> xr.Dataset:
    """A layout-1 cell as layout 2 stores it: a flat cell's norm_drift (no drift there) as norm_change."""
    from ..simulation import norm_variable

    if "norm_drift" not in ds or ds.attrs.get("cell_geometry") == "sphere":
        return ds
    name, attrs = norm_variable(False)
    ds = ds.rename({"norm_drift": name})
    ds[name].attrs = attrs
    return ds


def _layout_only(record: dict) -> bool:
    """Whether a store's record differs from the current versions in its layout alone."""
    return all(record.get(key) == want for key, want in store_versions().items() if key != "store_layout")


def _stores_holding(layout: Layout, path: Path, wanted: set[str]) -> list[Path]:
    """The other batches' stores whose manifest lists one of the ``wanted`` cell ids. The manifests (small
    JSON files, 20 times cheaper to read than a store's record) only point the way: the caller reads
    each store it names, every byte checked. Every job with a new cell asks, a fresh sweep's included."""
    found = set()
    for manifest in layout.manifests.glob("*.json"):
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # unreadable: its batch runs again, and the workflow says so
        cells = record.get("cells") if isinstance(record, dict) else None
        if isinstance(cells, dict) and isinstance(record.get("store"), str) and not wanted.isdisjoint(cells):
            found.add(layout.stores / record["store"])
    return [store for store in sorted(found) if store != path and store.exists()]


def _pending_cells(directory: Path) -> dict[str, xr.Dataset]:
    """The cells a killed job checkpointed before it could write its batch's store (complete,
    current stores only)."""
    cells = {}
    for path in sorted(directory.glob(f"*{STORE_SUFFIX}")):
        cells.update(stored_cells(path))
    return cells


__all__ = ["stored_cells"]
