"""Bit rot (a chunk's bytes change, its size and time stay): what ``attnflow status`` reports corrupt,
the next plain ``snakemake`` recomputes; status and the workflow agree."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest
from sweep_helpers import assert_same_cells, beta_star_config, planned, point_name, run, snapshot, stored

from attnflow.cli import main as attnflow_main
from attnflow.layout import Layout
from attnflow.store import record_of, verify

pytestmark = pytest.mark.workflow



def _config(tmp):
    return beta_star_config(tmp)


@pytest.fixture
def reference(beta_star_run):
    """The results of this config, run once per session (tests/conftest.py); the tests rot a copy."""
    return beta_star_run[2]


def _rot_member(store, member) -> None:
    """Flip one byte of ``member`` of a zip store, keeping the store's size and modification time."""
    with zipfile.ZipFile(store) as zf:
        info = zf.getinfo(member)
    data = bytearray(store.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    st = store.stat()
    data[start + info.file_size // 2] ^= 0x01
    store.write_bytes(bytes(data))
    os.utime(store, ns=(st.st_atime_ns, st.st_mtime_ns))


def _rot(store) -> list[str]:
    """Flip one byte of a chunk, keeping the store's size and modification time; the cells of the
    chunk's group (which the next run recomputes)."""
    record = record_of(store)
    chunk = next(m for m in sorted(record["members"])
                 if m.split("/")[-2:-1] == ["energy"] and not m.endswith((".zarray", ".zattrs")))
    _rot_member(store, chunk)
    group = chunk.split("/")[0] if chunk.count("/") == 2 else ""  # a store of one group holds it at its root
    return sorted(cid for cid, g in record["cells"].items() if g == group)


def test_bit_rot_reported_by_status_is_recomputed_by_the_next_run(reference, tmp_path, capsys):
    shutil.copytree(reference, tmp_path / "results")
    config = _config(tmp_path)
    results = tmp_path / "results"
    manifest = json.loads(sorted((results / "manifests").glob("*.json"))[0].read_text())
    store = results / "simulations" / manifest["store"]
    rotten = _rot(store)
    # The start-up check (sizes, times) cannot see it: nothing to do, until status has looked.
    assert verify(store, checksums=False).ok and verify(store).status == "corrupt"
    assert planned(tmp_path, config) == {}
    assert attnflow_main(["status", "--deep", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    for cid in rotten:
        assert f"corrupt {point_name(config, cid, 'beta_star')}:" in out
        assert "does not match its checksum" in out
    # Status said "the next snakemake recomputes it": it does, that store alone, those cells alone.
    assert planned(tmp_path, config) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    before = snapshot(results / "simulations")
    run(tmp_path, config)
    after = snapshot(results / "simulations")
    assert {k for k in set(before) | set(after) if before.get(k) != after.get(k)} == {store.name}
    log = (results / "logs" / "simulate" / f"{manifest['batch']}.log").read_text()
    assert log.count("computed in") == len(rotten) and all(f"{cid}: complete" not in log for cid in rotten)
    assert verify(store).ok
    assert_same_cells(stored(results), stored(reference))
    assert planned(tmp_path, config) == {}


def test_bit_rot_in_a_summary_is_found_by_status_and_rebuilt(reference, tmp_path, capsys):
    shutil.copytree(reference, tmp_path / "results")
    config = _config(tmp_path)
    summary = tmp_path / "results" / "summaries" / "beta_star.zarr.zip"
    member = next(m for m in sorted(record_of(summary)["members"]) if not m.endswith((".zarray", ".zattrs",
                                                                                      ".zgroup", ".json")))
    _rot_member(summary, member)
    assert verify(summary, checksums=False).ok and verify(summary).status == "corrupt"
    assert planned(tmp_path, config) == {}  # sizes and times cannot see it
    # Status as a table, then as JSON, on one rotten copy (the run that heals it is the same): each
    # reports it and issues the ticket the next snakemake acts on (the table's withdrawn before the JSON
    # status runs, so that the ticket planned for below is the JSON status's own).
    tickets = Layout(tmp_path / "results").summary_tickets("beta_star")
    for json_flag in ([], ["--json"]):
        for ticket in tickets.glob("*.ticket"):
            ticket.unlink()
        assert attnflow_main(["status", "--deep", "--configfile", str(config), *json_flag]) == 0
        captured = capsys.readouterr()
        out = captured.err if json_flag else captured.out  # --json: the cells on stdout, this on stderr
        assert "summary beta_star: corrupt (" in out and "does not match its checksum" in out
        assert list(tickets.glob("*.ticket"))
    # Status said the next snakemake rebuilds it: the summary and figure only, no store.
    assert planned(tmp_path, config) == {"aggregate": 1, "plot": 1, "all": 1}
    before = snapshot(tmp_path / "results" / "simulations")
    run(tmp_path, config)
    assert snapshot(tmp_path / "results" / "simulations") == before
    assert verify(summary).ok and planned(tmp_path, config) == {}


def test_status_writes_no_ticket_while_a_controller_runs(reference, tmp_path, capsys):
    """What a running controller is writing would read as damage: status reports, and leaves the repair to
    a status run once that controller has ended."""
    shutil.copytree(reference, tmp_path / "results")
    config = _config(tmp_path)
    results = tmp_path / "results"
    manifest = json.loads(sorted((results / "manifests").glob("*.json"))[0].read_text())
    rotten = _rot(results / "simulations" / manifest["store"])
    hold = ("import sys, time; from attnflow.run.lock import lock_results; lock_results(sys.argv[1]); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(results)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert attnflow_main(["status", "--deep", "--configfile", str(config)]) == 0
        captured = capsys.readouterr()
        assert all(f"corrupt {point_name(config, cid, 'beta_star')}:" in captured.out for cid in rotten)
        assert f"a controller (pid {holder.pid}" in captured.err and "no repair ticket" in captured.err
        assert not (results / "repairs").exists()
    finally:
        holder.kill()
        holder.wait()
    assert attnflow_main(["status", "--deep", "--configfile", str(config)]) == 0
    assert planned(tmp_path, config) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
