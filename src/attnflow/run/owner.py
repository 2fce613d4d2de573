"""Which config owns a results directory: its owner record (``Layout.owner``), what identifies a config,
and why a run must not use a directory another config owns (``foreign_owner``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..ids import cell_id, config_digest
from ..layout import Layout
from ..store import root_attrs
from .manifest import read_manifest

if TYPE_CHECKING:
    from ..sweep import Sweep


# A config's identity: where its file is and what identifies its grids. Editing a config keeps its file (the
# same config, changed); two working copies of one config hold the same grids (they may share results); a
# project moved or copied with its results keeps its config where it was beside them (the same relative path).
# Run-time switches (where results go, share_results, retry_failures, the dask scheduler, the figures' width)
# and the order of keys identify nothing.
GRID_KEYS = ("experiments", "defaults", "experiment_modules")


def grids_digest(config: dict) -> str:
    """SHA-256 of what identifies a config's grids (``GRID_KEYS``, keys in any order), nothing else."""
    return config_digest({key: config.get(key) for key in GRID_KEYS})


def _legacy_digest(config: dict) -> str:
    """The digest owner records written before 2026-12-07 hold: the content but for ``results`` and
    ``share_results`` (run-time switches included)."""
    return config_digest({k: v for k, v in config.items() if k not in ("results", "share_results")})


def _beside(configfile: Path, results: Path) -> str:
    """The config's path from its results directory, both resolved: what a moved project keeps."""
    return os.path.relpath(configfile.resolve(), Path(results).resolve())


def config_identity(sweep: Sweep, configfile: str | Path | None) -> dict:
    """What ``Layout.owner`` records of the config a run uses: its name as given, its resolved path, that
    path from the results directory, and the digest of what identifies its grids (``grids_digest``)."""
    return {"config": str(configfile) if configfile else None,
            "path": str(Path(configfile).resolve()) if configfile else None,
            "from_results": _beside(Path(configfile), sweep.results) if configfile else None,
            "grids_sha256": grids_digest(sweep.config),
            "config_sha256": _legacy_digest(sweep.config)}


class UnreadableOwner(ValueError):
    """A results directory's owner record exists but is no record: truncated, empty, not a mapping."""


def owner_of(results: str | Path) -> dict | None:
    """The config recorded as the owner of a results directory; None when no record is there.
    Raises ``UnreadableOwner`` for a record that cannot be read: a damaged record names no owner,
    and is no licence to take the directory over."""
    path = Layout(results).owner
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UnreadableOwner(f"{path} cannot be read ({err})") from None
    if not isinstance(record, dict) or not {"path", "config_sha256", "grids_sha256"} & set(record):
        raise UnreadableOwner(f"{path} is not an owner record ({json.dumps(record)[:60]})")
    return record


def claim_results(sweep: Sweep, configfile: str | Path | None) -> None:
    """Record this run's config as the results directory's owner (a run, never a dry run, writes it)."""
    path = sweep.layout.owner
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(config_identity(sweep, configfile), indent=1) + "\n")
    os.replace(tmp, path)


def would_drop(sweep: Sweep) -> tuple[dict[str, int], list[str]]:
    """What this sweep's run would take from its results directory as another config left it: per batch
    of the same name, the cells its manifest records that this sweep's batch does not hold (kept in the
    store off the grid, out of the summaries); the experiments whose summary (and figure) was built from
    another grid."""
    cells = {}
    for batch, batch_cells in sweep.batches.items():
        record = read_manifest(sweep, batch) or {}
        recorded = set(record.get("cells") or ()) | set(record.get("failed") or ())
        lost = recorded - {cell_id(c) for c in batch_cells}
        if lost:
            cells[batch] = len(lost)
    summaries = [name for name, spec in sweep.specs.items() if sweep.layout.summary(name).exists()
                 and root_attrs(sweep.layout.summary(name)).get("experiment_spec") != spec.to_json()]
    return cells, summaries


def same_config(owner: dict, ours: dict) -> bool:
    """Whether an owner record names this config: the same file (paths resolved: ``b/../a/c.yaml`` and a
    symlinked folder are one file), the same file beside its results (a project moved or copied whole),
    or the same grids (a copy of the config, or one run with other run-time switches)."""
    recorded = owner.get("path")
    if recorded and ours["path"] and (recorded == ours["path"] or _resolved(recorded) == ours["path"]):
        return True
    if owner.get("from_results") and owner.get("from_results") == ours["from_results"]:
        return True
    return (owner.get("grids_sha256") == ours["grids_sha256"]
            or owner.get("config_sha256") == ours["config_sha256"])


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a symlink loop: compared as written
        return path


def foreign_owner(sweep: Sweep, configfile: str | Path | None) -> str | None:
    """Why this run must not use its results directory, or None when it may (the message names the other
    config, what this run would drop and how to go on). Refused, unless the config says
    ``share_results: true``: another config owns it (``Layout.owner``); its owner record cannot be read
    (never a takeover); no record is there but the directory holds what this run would drop (the record
    deleted, or left by another config's run)."""
    if sweep.config.get("share_results"):
        return None
    name = str(configfile) if configfile else "this config"
    take_over = (f"take the directory over with `share_results: true` in {name} or "
                 "`--config share_results=True`")
    try:
        owner = owner_of(sweep.results)
    except UnreadableOwner as err:
        return (f"results directory {sweep.results}: its owner record {err}, so which config owns the "
                f"directory is unknown; if {name} does, delete {sweep.layout.owner} (the next run records "
                f"{name} as its owner), else restore it; or {take_over}")
    ours = config_identity(sweep, configfile)
    if owner is not None and same_config(owner, ours):
        return None
    cells, summaries = would_drop(sweep)
    dropped = []
    if cells:
        first = sorted(cells)[0]
        # Stores keep cells off the grid (run_batch), but the summaries and figures leave them out.
        dropped.append(f"{sum(cells.values())} of its cells from the summaries of {len(cells)} stores "
                       f"(first: {first}, {cells[first]} cell{'s' if cells[first] > 1 else ''}; they stay "
                       "stored, off the grid)")
    if summaries:
        dropped.append(f"its summaries and figures of {', '.join(summaries)}")
    if owner is None:  # no record: what the directory holds decides (older attnflow wrote none)
        if not dropped:
            return None
        return (f"results directory {sweep.results} has no owner record ({sweep.layout.owner} deleted, or "
                f"never written) and holds results of other grids: {name} running there would drop "
                f"{' and '.join(dropped)}. Give {name} its own `results:`, or {take_over}")
    what = " and ".join(dropped) or "no cell or summary of it yet, but would take the directory over"
    return (f"results directory {sweep.results} belongs to config {owner.get('config')} (digest "
            f"{str(owner.get('grids_sha256') or owner.get('config_sha256'))[:12]}, recorded in "
            f"{sweep.layout.owner}); {name} running there would drop {what}. Give {name} its own "
            f"`results:` (or leave it out: results/<its file name>), or {take_over}, or delete "
            f"{sweep.results}")


__all__ = ["GRID_KEYS", "UnreadableOwner", "claim_results", "config_identity", "foreign_owner",
           "grids_digest", "owner_of", "same_config", "would_drop"]
