"""Stores are complete or absent, one file each: completion records, verification, racing writers."""

import multiprocessing
import os
import socket
import struct
import subprocess
import zipfile

import numpy as np
import pytest
import xarray as xr

from attnflow.store import (
    RECORD,
    CorruptStore,
    load,
    open_groups,
    open_verified,
    partials,
    record_of,
    verify,
    write,
)


def _dataset(value=1.0):
    rng = np.random.default_rng(0)
    return xr.Dataset({"energy": (("seed", "time"), value * rng.random((3, 50))),
                       "t_cluster": ("seed", value * rng.random(3))}, attrs={"cell_n": 4})


def _span(path, member):
    """Where a member's bytes lie in a store file: (offset, size)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def _chunk(path, var):
    with zipfile.ZipFile(path) as zf:
        return next(n for n in zf.namelist()
                    if n.startswith(f"{var}/") and not n.split("/")[-1].startswith("."))


def test_round_trip_and_record(tmp_path):
    path = tmp_path / "a.zarr.zip"
    assert write(_dataset(), path) is True
    assert path.is_file()  # one file per store, whatever its variables
    record = record_of(path)
    assert record["groups"] == [""] and RECORD not in record["members"]
    assert all(len(meta["sha256"]) == 64 for meta in record["members"].values())
    assert verify(path).ok and verify(path, checksums=False).ok
    with open_verified(path) as ds:
        np.testing.assert_array_equal(ds.energy.values, _dataset().energy.values)
        assert ds.attrs["cell_n"] == 4
    assert verify(tmp_path / "b.zarr.zip").status == "missing"


def test_the_same_data_gives_the_same_bytes(tmp_path):
    write(_dataset(), tmp_path / "a.zarr.zip")
    write(_dataset(), tmp_path / "b.zarr.zip")
    assert (tmp_path / "a.zarr.zip").read_bytes() == (tmp_path / "b.zarr.zip").read_bytes()


def test_truncated_flipped_and_rewritten_stores_are_named(tmp_path):
    for damage in ("truncate", "flip", "garbage"):
        path = tmp_path / f"{damage}.zarr.zip"
        write(_dataset(), path)
        chunk = _chunk(path, "energy")
        offset, size = _span(path, chunk)
        data, st = bytearray(path.read_bytes()), path.stat()
        if damage == "truncate":
            path.write_bytes(bytes(data[: len(data) // 2]))
        elif damage == "flip":
            data[offset + size // 2] ^= 1
            path.write_bytes(bytes(data))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            path.write_bytes(b"not a zip file")
        state = verify(path)
        assert state.status == "corrupt", state
        if damage == "flip":
            # Silent corruption (same size, same time): only the full checksum sees it, and names it.
            assert "variable 'energy' chunk" in state.detail and "checksum" in state.detail, state
            assert verify(path, checksums=False).ok
        else:
            assert not verify(path, checksums=False).ok
        if damage == "garbage":  # said in words, as the workflow prints it: no exception class
            assert state.detail == "not a readable zip file: File is not a zip file", state
        with pytest.raises(CorruptStore, match=f"{damage}.zarr.zip: corrupt"):
            open_verified(path)


def test_groups_opened_together_are_those_opened_one_by_one(tmp_path):
    """open_groups reads each group from its own metadata (not the store's consolidated metadata, which
    every group would parse again): the same datasets as open_verified gives group by group."""
    path = tmp_path / "a.zarr.zip"
    groups = {f"g{k}": _dataset(k + 1.0).assign_attrs(cell_n=k) for k in range(3)}
    write(groups, path)
    _, members = load(path)
    opened = [ds.load() for ds in open_groups(members, ["g2", "g0"], chunks=None)]
    for ds, name in zip(opened, ["g2", "g0"], strict=True):
        with open_verified(path, group=name) as one:
            xr.testing.assert_identical(ds, one.load())
        xr.testing.assert_equal(ds, groups[name])


def test_a_damaged_group_is_named_and_the_others_stay_readable(tmp_path):
    path = tmp_path / "a.zarr.zip"
    write({"g0": _dataset(1.0), "g1": _dataset(2.0)}, path)
    offset, size = _span(path, _chunk(path, "g1/energy"))
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 1
    path.write_bytes(bytes(data))
    state = verify(path)
    assert state.status == "corrupt" and state.damaged == ("g1",), state
    assert "of group g1" in state.detail


def test_a_store_without_record_is_not_complete(tmp_path):
    path = tmp_path / "a.zarr.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(".zgroup", "{}")
    assert verify(path).status == "corrupt"
    assert write(_dataset(2.0), path) is True  # replaced
    with open_verified(path) as ds:
        np.testing.assert_array_equal(ds.energy.values, _dataset(2.0).energy.values)


def test_interrupted_write_leaves_nothing_complete(tmp_path, monkeypatch):
    path = tmp_path / "a.zarr.zip"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if interrupted while writing

    monkeypatch.setattr(xr.Dataset, "to_zarr", crash)
    with pytest.raises(KeyboardInterrupt):
        write(_dataset(), path)
    assert not path.exists() and not partials(path)
    # A writer killed outright leaves its temporary file: "interrupted". The next
    # complete write removes it (its writer, on this host, is dead); one of a live
    # writer or of another host stays.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"a.zarr.zip.partial-{socket.gethostname()}-{dead.pid}-abc").write_bytes(b"PK")
    (tmp_path / "a.zarr.zip.partial-elsewhere-1-abc").write_bytes(b"PK")
    assert verify(path).status == "interrupted"
    monkeypatch.undo()
    write(_dataset(), path)
    assert verify(path).ok
    assert [p.name for p in partials(path)] == ["a.zarr.zip.partial-elsewhere-1-abc"]


def test_a_complete_store_wins_unless_replaced(tmp_path):
    path = tmp_path / "a.zarr.zip"
    write(_dataset(1.0), path)
    assert write(_dataset(2.0), path) is False
    with open_verified(path) as ds:
        assert float(ds.t_cluster[0]) == float(_dataset(1.0).t_cluster[0])
    assert write(_dataset(2.0), path, replace=True) is True
    with open_verified(path) as ds:
        assert float(ds.t_cluster[0]) == float(_dataset(2.0).t_cluster[0])


def _race(path, barrier, results):
    barrier.wait()
    results.put((os.getpid(), write(_dataset(), path)))


def test_two_writers_of_one_cell_leave_one_complete_store(tmp_path):
    # Many rounds: the race window is the rename; either order must end complete.
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        path = tmp_path / f"r{round_}.zarr.zip"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(path, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        outcomes = [results.get(timeout=5)[1] for _ in procs]
        assert outcomes.count(True) >= 1
        assert verify(path).ok and not partials(path)
        with open_verified(path) as ds:
            np.testing.assert_array_equal(ds.energy.values, _dataset().energy.values)


@pytest.mark.parametrize("field, offset", [("version needed", 6), ("compression method", 10), ("flags", 8)])
def test_a_damaged_zip_directory_is_corrupt_not_a_crash(tmp_path, field, offset):
    """zipfile raises NotImplementedError or RuntimeError for some damaged headers (a flipped version,
    compression method or encryption flag): the store is corrupt, named, and nothing raises."""
    path = tmp_path / "a.zarr.zip"
    write({"g0": _dataset()}, path)
    with zipfile.ZipFile(path) as zf:
        directory = zf.start_dir
        infos = zf.infolist()
    data = bytearray(path.read_bytes())
    # Every central directory entry of the store: 46-byte headers, each followed by its name and extras.
    pos = directory
    for _ in infos:
        data[pos + offset] ^= 0x40 if field != "flags" else 0x01
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[pos + 28:pos + 34])
        pos += 46 + name_len + extra_len + comment_len
    path.write_bytes(bytes(data))
    state = verify(path)
    assert state.status == "corrupt", state
    assert verify(path, checksums=False).status == "corrupt"
    assert record_of(path) == {}
    with pytest.raises(CorruptStore):
        open_verified(path)

