"""Stores are complete or absent: completion records, verification, racing writers."""

import json
import multiprocessing
import os
import socket
import subprocess

import numpy as np
import pytest
import xarray as xr

from attnflow.store import RECORD, CorruptStore, open_verified, partials, verify, write


def _dataset(value=1.0):
    rng = np.random.default_rng(0)
    return xr.Dataset({"energy": (("seed", "time"), value * rng.random((3, 50))),
                       "t_cluster": ("seed", value * rng.random(3))}, attrs={"cell_n": 4})


def _chunk(path, var):
    return next(p for p in (path / var).iterdir() if not p.name.startswith("."))


def test_round_trip_and_record(tmp_path):
    path = tmp_path / "a.zarr"
    assert write(_dataset(), path) is True
    record = json.loads((path / RECORD).read_text())
    assert record["variables"]["energy"]["shape"] == [3, 50]
    assert all(len(meta["sha256"]) == 64 for meta in record["files"].values())
    assert verify(path).ok and verify(path, checksums=False).ok
    with open_verified(path) as ds:
        np.testing.assert_array_equal(ds.energy.values, _dataset().energy.values)
    assert verify(tmp_path / "b.zarr").status == "missing"


def test_missing_truncated_and_flipped_chunks_are_named(tmp_path):
    for damage in ("delete", "truncate", "flip"):
        path = tmp_path / f"{damage}.zarr"
        write(_dataset(), path)
        chunk = _chunk(path, "energy")
        data, stat = chunk.read_bytes(), chunk.stat()
        if damage == "delete":
            chunk.unlink()
        elif damage == "truncate":
            chunk.write_bytes(data[: len(data) // 2])
        else:
            chunk.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        state = verify(path)
        assert state.status == "corrupt" and "variable 'energy' chunk" in state.detail, state
        # The cheap check sees sizes, and the bytes of files rewritten since the record.
        assert not verify(path, checksums=False).ok
        if damage == "flip":
            # Silent corruption (same size, same time): only the full checksum sees it.
            os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            assert verify(path, checksums=False).ok and not verify(path).ok
        with pytest.raises(CorruptStore, match=f"{damage}.zarr: corrupt"):
            open_verified(path)


def test_a_store_without_record_is_not_complete(tmp_path):
    path = tmp_path / "a.zarr"
    _dataset().to_zarr(path, zarr_format=2, consolidated=True)
    assert verify(path).status == "corrupt"
    assert write(_dataset(2.0), path) is True  # replaced
    with open_verified(path) as ds:
        np.testing.assert_array_equal(ds.energy.values, _dataset(2.0).energy.values)


def test_interrupted_write_leaves_nothing_complete(tmp_path, monkeypatch):
    path = tmp_path / "a.zarr"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if interrupted while writing

    monkeypatch.setattr(xr.Dataset, "to_zarr", crash)
    with pytest.raises(KeyboardInterrupt):
        write(_dataset(), path)
    assert not path.exists() and not partials(path)
    # A writer killed outright leaves its temporary directory: "interrupted". The
    # next complete write removes it (its writer, on this host, is dead); one of a
    # live writer or of another host stays.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"a.zarr.partial-{socket.gethostname()}-{dead.pid}-abc").mkdir()
    (tmp_path / "a.zarr.partial-elsewhere-1-abc").mkdir()
    assert verify(path).status == "interrupted"
    monkeypatch.undo()
    write(_dataset(), path)
    assert verify(path).ok
    assert [p.name for p in partials(path)] == ["a.zarr.partial-elsewhere-1-abc"]


def test_a_complete_store_wins_unless_replaced(tmp_path):
    path = tmp_path / "a.zarr"
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
        path = tmp_path / f"r{round_}.zarr"
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
