"""Zarr stores that are complete or absent, each one file.

A store is a zip file holding a zarr (format 2) hierarchy: one or more groups
of xarray datasets (a batch's cells, by shape; a summary), their metadata
consolidated. It is encoded in memory, written to a temporary file of its own
with a completion record (every member's size and SHA-256, the versions it was
written under), and published by one atomic rename. Completeness is that
record, never the file's name: ``verify`` checks a store against it and names
the variable or chunk that differs. When two writers race on one store, the
first rename wins; the other finds a complete store and discards its copy.

One file per store, not a directory of ~60: a sweep of 100,000 cells on a
cluster file system would otherwise hold millions of small files (inode quotas,
metadata servers), and every start of the workflow would stat them all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import struct
import sys
import time
import uuid
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import xarray as xr

RECORD = "attnflow-complete.json"
_FORMAT = 2  # 1: a directory per store (attnflow 0.1), no longer read
PARTIAL = ".partial-"
# Fixed member times: the same data gives the same bytes (zip records a time per member).
_EPOCH = (1980, 1, 1, 0, 0, 0)
# What reading a damaged zip raises: besides BadZipFile and OSError, zipfile raises NotImplementedError
# (a flipped compression method or version), RuntimeError (a flipped encryption flag), ValueError,
# EOFError and struct.error for other damaged headers. Any of them means: not a readable store.
UNREADABLE = (OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError, ValueError,
              struct.error, KeyError)


class CorruptStore(RuntimeError):
    """A store that does not match its completion record; the message names it and what differs."""


class StaleStore(RuntimeError):
    """A complete store written under other versions (of the numerics, of a reduction) than the current."""


@dataclasses.dataclass(frozen=True)
class StoreState:
    status: str  # done | missing | corrupt | interrupted | stale (| failed, for a cell: see workflow)
    detail: str = ""
    damaged: tuple[str, ...] = ()  # the groups whose members differ (a corrupt store read whole)

    @property
    def ok(self) -> bool:
        return self.status == "done"


def partials(path: Path) -> list[Path]:
    """Temporary files of writers of ``path`` (finished, running or killed)."""
    path = Path(path)
    return sorted(path.parent.glob(path.name + PARTIAL + "*"))


def _encode(groups: Mapping[str, xr.Dataset], chunks: str) -> dict[str, bytes]:
    """Every group encoded by xarray into one in-memory zarr hierarchy: member name -> bytes."""
    import zarr  # here, not at import: a workflow start judges stores from their records (0.17 s)

    buffers: dict = {}
    memory = zarr.storage.MemoryStore(store_dict=buffers)
    for name, ds in groups.items():
        ds = ds.drop_encoding()  # a dataset read from a store carries that store's chunking
        encoding = {v: {"chunks": var.shape} for v, var in ds.data_vars.items() if var.ndim} \
            if chunks == "whole" else None
        ds.to_zarr(memory, group=name or None, mode="a" if buffers else "w", encoding=encoding,
                   consolidated=False, zarr_format=2)
    # Zarr format 2: string coordinates and consolidated metadata are stable there (zarr 3 warns
    # that both are not yet part of the v3 spec).
    zarr.consolidate_metadata(memory, zarr_format=2)
    return {key: buffer.to_bytes() for key, buffer in sorted(buffers.items())}


def write(data: xr.Dataset | Mapping[str, xr.Dataset], path: str | Path, *, chunks: str = "whole",
          replace: bool = False, versions: dict | None = None, meta: dict | None = None) -> bool:
    """Write a dataset (or named groups of datasets) so that ``path`` exists only complete; return
    False if another writer got there first.

    ``chunks="whole"`` stores each variable as one chunk (stores are read whole).
    An existing store at ``path`` that is not complete, or whose record holds
    other ``versions`` (stale), is always replaced; a complete, current one only
    with ``replace``, otherwise it wins (two writers of one store write the same
    numbers). ``versions`` (say the numerics version) and ``meta`` go into the
    completion record, where ``verify(expect=...)`` and ``record_of`` read them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = {"": data} if isinstance(data, xr.Dataset) else dict(data)
    members = _encode(groups, chunks)
    tmp = path.with_name(f"{path.name}{PARTIAL}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
            for key, data_bytes in members.items():
                zf.writestr(zipfile.ZipInfo(key, _EPOCH), data_bytes)
            if os.environ.get("ATTNFLOW_FAULT") == "hang-before-rename":
                time.sleep(3600)  # fault injection for the kill-and-resume test: a writer stuck mid-write
            record = {**(versions or {}), **(meta or {}), "format": _FORMAT,
                      "groups": sorted(groups),
                      "members": {k: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                                  for k, b in members.items()}}
            zf.writestr(zipfile.ZipInfo(RECORD, _EPOCH), json.dumps(record, indent=1, sort_keys=True))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        return _publish(tmp, path, replace, versions or {})
    finally:
        tmp.unlink(missing_ok=True)
        if path.exists():
            _remove_dead_partials(path)


def _publish(tmp: Path, path: Path, replace: bool, versions: dict) -> bool:
    if path.is_dir() and not path.is_symlink():
        aside = move_aside(path, "in-the-way")
        print(f"attnflow: {path} was a directory, where its store goes: moved aside to {aside.name} (delete "
              "it once you have looked)", file=sys.stderr)
    if not path.exists():
        try:
            os.link(tmp, path)  # atomic, and fails if path exists: the first writer wins
            _remove_dead_partials(path)
            return True
        except FileExistsError:
            pass
    if not replace and verify(path, checksums=False, expect=versions).ok:
        return False  # another writer finished first: its store holds the same numbers
    os.replace(tmp, path)  # a stale, damaged or replaced store: swapped atomically
    _remove_dead_partials(path)
    return True


def _remove_dead_partials(path: Path) -> None:
    """Remove temporary files left by killed writers of ``path`` on this host.

    A live writer's file is left alone (it will find the store complete and
    discard its copy); so is one from another host, whose writer this process
    cannot check.
    """
    host = socket.gethostname()
    for stale in partials(path):
        writer = stale.name[len(path.name) + len(PARTIAL):]
        name, _, _rest = writer.rpartition("-")  # host-pid-random
        writer_host, _, pid = name.rpartition("-")
        if writer_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except PermissionError:
            pass  # alive, another user's


def _read_record(zf: zipfile.ZipFile) -> dict | None:
    try:
        record = json.loads(zf.read(RECORD))
        record["members"].items()
        return record
    except (*UNREADABLE, AttributeError, TypeError):
        return None


def _judge(record: dict | None, sizes: dict[str, int], digest, expect: dict | None) -> StoreState:
    """A store's state from its record, its members' sizes and ``digest(name)`` (their SHA-256, None
    when unreadable; ``digest=None``: sizes only)."""
    if record is None:
        return StoreState("corrupt", f"no readable completion record ({RECORD})")
    bad = {}
    for name, meta in record["members"].items():
        if name not in sizes:
            bad[name] = "is missing"
        elif sizes[name] != meta["size"]:
            bad[name] = f"has {sizes[name]} bytes, {meta['size']} were written"
        elif digest is not None and digest(name) != meta["sha256"]:
            bad[name] = "does not match its checksum"
    if bad:
        first = sorted(bad)[0]
        groups = tuple(sorted({_group_of(name, record["groups"]) for name in bad}))
        return StoreState("corrupt", f"{_describe(first)} {bad[first]}", groups)
    extra = sorted(set(sizes) - set(record["members"]) - {RECORD})
    if extra:
        return StoreState("corrupt", f"unrecorded member {extra[0]}")
    for key, want in (expect or {}).items():
        if record.get(key) != want:
            return StoreState("stale", f"written under {key} {record.get(key)}, now {want}")
    return StoreState("done")


def _absent(path: Path) -> StoreState:
    return StoreState("interrupted" if partials(path) else "missing")


def _unreadable(err: Exception) -> StoreState:
    return StoreState("corrupt", f"not a readable zip file: {err or type(err).__name__}")


def _in_the_way(path: Path) -> StoreState | None:
    if path.is_dir():
        return StoreState("corrupt", "a directory, not a store file (the next run moves it aside)")
    return None


def verify(path: str | Path, *, checksums: bool = True, expect: dict | None = None) -> StoreState:
    """Check a store against its completion record.

    ``checksums=False`` is the cheap check: the zip's directory and the record
    (every member there, with its recorded size). With ``checksums`` every byte
    is read and hashed. ``expect``: versions the record must hold (a record
    without one holds none); an intact store that differs is ``stale``, its
    detail naming the version it was written under.
    """
    path = Path(path)
    if not path.exists():
        return _absent(path)
    if state := _in_the_way(path):
        return state
    try:
        with zipfile.ZipFile(path) as zf:
            sizes = {info.filename: info.file_size for info in zf.infolist()}
            return _judge(_read_record(zf), sizes, (lambda name: _sha256(zf, name)) if checksums else None,
                          expect)
    except UNREADABLE as err:
        return _unreadable(err)


def read(path: str | Path, expect: dict | None = None) -> tuple[StoreState, dict, dict[str, bytes]]:
    """A store read once, every byte checked: ``(state, record, members)``. The members that can be
    read are returned whatever the state (a corrupt store's intact groups are usable); ``{}`` and
    ``{}`` when the file cannot be read at all."""
    path = Path(path)
    if not path.exists():
        return _absent(path), {}, {}
    if state := _in_the_way(path):
        return state, {}, {}
    try:
        with zipfile.ZipFile(path) as zf:
            sizes = {info.filename: info.file_size for info in zf.infolist()}
            record = _read_record(zf)
            members = _read_all(zf, skip_damaged=True)
    except UNREADABLE as err:
        return _unreadable(err), {}, {}
    state = _judge(record, sizes, lambda name: hashlib.sha256(members[name]).hexdigest()
                   if name in members else None, expect)
    return state, record or {}, members


def _sha256(zf: zipfile.ZipFile, name: str) -> str | None:
    try:
        return hashlib.sha256(zf.read(name)).hexdigest()
    except UNREADABLE:  # the zip's own CRC-32 check (or a damaged member header) failed first
        return None


def _group_of(member: str, groups) -> str:
    """The group a member belongs to ("" for the root's, which every group needs)."""
    head = member.split("/", 1)[0]
    return head if "/" in member and head in groups else ""


def _describe(member: str) -> str:
    parts = member.split("/")
    if len(parts) >= 2 and not parts[-1].startswith("."):
        where = f" of group {parts[-3]}" if len(parts) >= 3 else ""
        return f"variable {parts[-2]!r}{where} chunk {parts[-1]}"
    if len(parts) >= 2:
        return f"variable {parts[-2]!r} metadata {parts[-1]}"
    return f"member {member}"


def record_of(path: str | Path) -> dict:
    """A store's completion record (empty if it has none readable)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _read_record(zf) or {}
    except UNREADABLE:
        return {}


def root_attrs(path: str | Path) -> dict:
    """The attributes of a store's root group (a summary's provenance and spec), from its metadata
    only; empty if it has none readable."""
    try:
        with zipfile.ZipFile(path) as zf:
            attrs = json.loads(zf.read(".zattrs"))
    except (*UNREADABLE, TypeError):
        return {}
    return attrs if isinstance(attrs, dict) else {}


def read_members(path: str | Path, *, skip_damaged: bool = False) -> dict[str, bytes]:
    """Every member of a store, read in one pass (zip checks each member's CRC-32); with
    ``skip_damaged`` a member that cannot be read is left out instead of raising."""
    with zipfile.ZipFile(path) as zf:
        return _read_all(zf, skip_damaged)


def _read_all(zf: zipfile.ZipFile, skip_damaged: bool) -> dict[str, bytes]:
    members = {}
    for name in zf.namelist():
        if name == RECORD:
            continue
        try:
            members[name] = zf.read(name)
        except UNREADABLE:
            if not skip_damaged:
                raise
    return members


def _memory_store(members: Mapping[str, bytes]):
    """A read-only zarr store over a store's members already read into memory."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype

    wrap = default_buffer_prototype().buffer.from_bytes
    return zarr.storage.MemoryStore(store_dict={k: wrap(v) for k, v in members.items()}, read_only=True)


def open_members(members: Mapping[str, bytes], group: str = "", **kwargs) -> xr.Dataset:
    """A group of a store already read into memory, opened by xarray (lazily, from memory)."""
    return xr.open_zarr(_memory_store(members), group=group or None, consolidated=True, **kwargs)


def open_groups(members: Mapping[str, bytes], groups: Iterable[str], **kwargs) -> Iterator[xr.Dataset]:
    """Each of ``groups`` of a store already read into memory, opened by xarray
    (lazily, from memory) and closed when the next is asked for.

    The members are wrapped once, and each group is opened from its own metadata: through the store's
    consolidated metadata, every group parses the whole store's again (0.2 s a group in a store of 32;
    measured), which made reading a store quadratic in its groups."""
    memory = _memory_store(members)
    for group in groups:
        with xr.open_zarr(memory, group=group or None, consolidated=False, **kwargs) as ds:
            yield ds


def quarantine(path: str | Path) -> Path:
    """Move a corrupt store aside (``<name>.corrupt-<tag>``), so the next run recomputes it."""
    return move_aside(path, "corrupt")


def move_aside(path: str | Path, why: str) -> Path:
    """Rename ``path`` to ``<name>.<why>-<tag>`` beside it (nothing deleted); return the new path."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.{why}-{uuid.uuid4().hex[:8]}")
    path.rename(aside)
    return aside


def _raise_for(path: Path, state: StoreState) -> None:
    if state.status == "stale":
        raise StaleStore(f"{path}: stale ({state.detail})")
    if not state.ok:
        raise CorruptStore(f"{path}: {state.status}" + (f" ({state.detail})" if state.detail else ""))


def check(path: str | Path, expect: dict | None = None) -> None:
    """Verify a store, every byte; ``CorruptStore`` (``StaleStore`` for other ``expect``ed versions)
    naming it and what differs."""
    _raise_for(Path(path), verify(path, expect=expect))


def load(path: str | Path, expect: dict | None = None) -> tuple[dict, dict[str, bytes]]:
    """A store's record and members, read once and checked against the record, every byte; raises
    as ``check`` does."""
    state, record, members = read(path, expect)
    _raise_for(Path(path), state)
    return record, members


def open_verified(path: str | Path, expect: dict | None = None, group: str = "", **kwargs) -> xr.Dataset:
    """Open a store (one group of it) after verifying it, every byte: see ``check``."""
    return open_members(load(path, expect)[1], group, **kwargs)


__all__ = ["CorruptStore", "RECORD", "StaleStore", "StoreState", "check", "load", "move_aside",
           "open_groups", "open_members", "open_verified", "read",
           "partials", "quarantine", "read_members", "record_of", "root_attrs", "verify", "write"]
