"""Zarr stores that are complete or absent.

A store is written into a temporary directory of its own, finished with a
completion record (every file's size and SHA-256, every variable's shape and
dtype), and published by one atomic rename. Completeness is that record, never
the directory's name: ``verify`` checks a store against it and names the
variable or chunk that differs. When two writers race on one cell, the first
rename wins; the other finds a complete store and discards its copy.
Summaries are written the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import stat
import time
import uuid
from pathlib import Path

import xarray as xr
import zarr

RECORD = "attnflow-complete.json"
_FORMAT = 1
PARTIAL = ".partial-"


class CorruptStore(RuntimeError):
    """A store that does not match its completion record; the message names it and what differs."""


class StaleStore(RuntimeError):
    """A complete store written under other versions (of the numerics, of a reduction) than the current."""


@dataclasses.dataclass(frozen=True)
class StoreState:
    status: str  # done | missing | corrupt | interrupted | stale
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "done"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Snakemake stamps the directories it declares as outputs; not part of the data.
_IGNORED = (RECORD, ".snakemake_timestamp")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in _IGNORED)


def partials(path: Path) -> list[Path]:
    """Temporary directories of writers of ``path`` (finished, running or killed)."""
    return sorted(path.parent.glob(path.name + PARTIAL + "*"))


def write(ds: xr.Dataset, path: str | Path, *, chunks: str = "whole", replace: bool = False,
          versions: dict | None = None) -> bool:
    """Write ``ds`` so that ``path`` exists only complete; return False if another writer got there first.

    ``chunks="whole"`` stores each variable as one chunk (a store is one cell,
    read whole). An existing store at ``path`` that is not complete, or whose
    record holds other ``versions`` (stale), is always replaced; a complete,
    current one only with ``replace`` (summaries), otherwise it wins (two
    writers of one cell write the same numbers). ``versions`` (say the numerics
    version) go into the completion record, where ``verify(expect=...)`` reads them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{PARTIAL}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    encoding = {name: {"chunks": var.shape} for name, var in ds.data_vars.items() if var.ndim} \
        if chunks == "whole" else None
    # The store is encoded in memory (zarr's per-operation overhead on a local
    # directory doubled the cost), then written file by file and checksummed from
    # the same bytes. Zarr format 2: string coordinates and consolidated metadata
    # are stable there (zarr 3 warns that both are not yet part of the v3 spec).
    buffers: dict = {}
    ds.to_zarr(zarr.storage.MemoryStore(store_dict=buffers), mode="w", encoding=encoding,
               consolidated=True, zarr_format=2)
    try:
        files = {}
        for key, buffer in sorted(buffers.items()):
            data = buffer.to_bytes()
            target = tmp / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            files[key] = {"size": len(data), "mtime_ns": target.stat().st_mtime_ns,
                          "sha256": hashlib.sha256(data).hexdigest()}
        if os.environ.get("ATTNFLOW_FAULT") == "hang-before-rename":
            time.sleep(3600)  # fault injection for the kill-and-resume test: a writer stuck mid-write
        _write_record(ds, tmp, files, versions or {})
        return _publish(tmp, path, replace, versions or {})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if path.exists():
            _remove_dead_partials(path)


def _write_record(ds: xr.Dataset, root: Path, files: dict, versions: dict) -> None:
    record = {
        **versions,
        "format": _FORMAT,
        "variables": {name: {"shape": list(var.shape), "dtype": str(var.dtype)}
                      for name, var in ds.variables.items()},
        "files": files,
    }
    tmp = root / (RECORD + ".tmp")
    with tmp.open("w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.rename(root / RECORD)


def _publish(tmp: Path, path: Path, replace: bool, versions: dict) -> bool:
    for _ in range(3):
        try:
            tmp.rename(path)  # atomic; fails if path exists (and is not empty)
        except OSError:
            if not replace and verify(path, checksums=False, expect=versions).ok:
                return False  # another writer finished first: its store is the same cell
            # A stale, damaged or replaced store: move it aside, then retry.
            trash = path.with_name(f"{path.name}.trash-{uuid.uuid4().hex[:8]}")
            try:
                path.rename(trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
            continue
        _remove_dead_partials(path)
        return True
    raise OSError(f"{path}: could not publish the store (another writer keeps replacing it)")


def _remove_dead_partials(path: Path) -> None:
    """Remove temporary directories left by killed writers of ``path`` on this host.

    A live writer's directory is left alone (it will find the store complete and
    discard its copy); so is one from another host, whose writer this process
    cannot check.
    """
    host = socket.gethostname()
    for stale in partials(path):
        writer = stale.name[len(path.name) + len(PARTIAL):]
        name, _, rest = writer.rpartition("-")  # host-pid-random
        writer_host, _, pid = name.rpartition("-")
        if writer_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


def verify(path: str | Path, *, checksums: bool = True, expect: dict | None = None) -> StoreState:
    """Check a store against its completion record.

    ``checksums=False`` is the cheap check the workflow runs at every start:
    sizes, plus the checksum of any file whose modification time is not the
    recorded one (it was written since, or copied without its times). With
    ``checksums`` every byte is read. ``expect``: versions the record must hold
    (a record without one holds none); an intact store that differs is
    ``stale``, its detail naming the version it was written under.
    """
    path = Path(path)
    if not path.exists():
        return StoreState("interrupted" if partials(path) else "missing")
    record_path = path / RECORD
    try:
        record = json.loads(record_path.read_text())
        files = record["files"]
    except (OSError, ValueError, KeyError):
        return StoreState("corrupt", f"no readable completion record ({RECORD})")
    for rel, meta in files.items():
        f = path / rel
        try:
            st = f.stat()  # once per file: the workflow runs this over every store at each start
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            return StoreState("corrupt", f"{_describe(rel)} is missing")
        if st.st_size != meta["size"]:
            return StoreState("corrupt", f"{_describe(rel)} has {st.st_size} bytes, "
                                         f"{meta['size']} were written")
        touched = st.st_mtime_ns != meta.get("mtime_ns")
        if (checksums or touched) and _sha256(f) != meta["sha256"]:
            return StoreState("corrupt", f"{_describe(rel)} does not match its checksum")
    extra = [str(p.relative_to(path)) for p in _files(path) if str(p.relative_to(path)) not in files]
    if extra:
        return StoreState("corrupt", f"unrecorded file {extra[0]}")
    for key, want in (expect or {}).items():
        if record.get(key) != want:
            return StoreState("stale", f"written under {key} {record.get(key)}, now {want}")
    return StoreState("done")


def record_of(path: str | Path) -> dict:
    """A store's completion record (empty if it has none readable)."""
    try:
        return json.loads((Path(path) / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _describe(rel: str) -> str:
    parts = Path(rel).parts
    if len(parts) >= 2 and not parts[-1].startswith("."):
        return f"variable {parts[0]!r} chunk {parts[-1]}"
    if len(parts) >= 2:
        return f"variable {parts[0]!r} metadata {parts[-1]}"
    return f"file {rel}"


def quarantine(path: str | Path) -> Path:
    """Move a corrupt store aside (``<name>.corrupt-<tag>``), so the next run recomputes it."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.corrupt-{uuid.uuid4().hex[:8]}")
    path.rename(aside)
    return aside


def open_verified(path: str | Path, expect: dict | None = None, **kwargs) -> xr.Dataset:
    """Open a store after verifying it; ``CorruptStore`` (``StaleStore`` for other ``expect``ed
    versions) naming it and what differs otherwise."""
    state = verify(path, expect=expect)
    if state.status == "stale":
        raise StaleStore(f"{path}: stale ({state.detail})")
    if not state.ok:
        raise CorruptStore(f"{path}: {state.status}" + (f" ({state.detail})" if state.detail else ""))
    return xr.open_zarr(path, consolidated=True, **kwargs)


__all__ = ["CorruptStore", "RECORD", "StaleStore", "StoreState", "open_verified", "partials", "quarantine",
           "record_of", "verify", "write"]
