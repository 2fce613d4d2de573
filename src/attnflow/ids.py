"""The hashes that name things: a cell's id (the key of its numbers in every store) and a config's digest
(the provenance tag of stores, summaries and figures).

A leaf: it imports nothing of attnflow but ``Cell``'s type. What ``cell_id`` hashes must never change for
a given cell (``tests/data/cell_ids.json`` holds ids of every kind of cell): a changed id orphans every
stored cell.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cell import Cell


def config_digest(config: dict) -> str:
    """SHA-256 of a config (as canonical JSON): the provenance tag of stores, summaries and figures."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def cell_id(cell: Cell) -> str:
    """Stable short name of a cell: a hash of every field but its engine (values normalised by
    ``Cell``) and of the content of any file it reads (so editing a weights file in place makes new
    stores). Two engines' results of one cell share its id; the store records the engine."""
    return _hashed(cell.identity_json() + cell.input_digest())  # the JSON cached on the cell


def _id_with_engine(cell: Cell) -> str | None:
    """The id a cell of a non-default engine had while the engine was part of ids (stores written
    from 2026-12-04 to 2026-12-05), None for a default one: ``run_batch`` takes such a cell from its store."""
    if cell.canonical_json() == cell.identity_json():
        return None
    return _hashed(cell.canonical_json() + cell.input_digest())


def _hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["cell_id", "config_digest"]
