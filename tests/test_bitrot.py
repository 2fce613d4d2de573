"""Bit rot (a chunk's bytes change, its size and time stay): what ``attnflow status`` reports corrupt,
the next plain ``snakemake`` recomputes; status and the workflow agree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from sweep_helpers import beta_star_config, planned, run, snapshot

from attnflow.cli import main as attnflow_main
from attnflow.store import verify

pytestmark = pytest.mark.workflow



def _config(tmp):
    return beta_star_config(tmp)


@pytest.fixture
def reference(beta_star_run):
    """The results of this config, run once per session (tests/conftest.py); the tests rot a copy."""
    return beta_star_run[2]


def _rot(store):
    """Flip one byte of a chunk, keeping its size and modification time."""
    chunk = next(p for p in (store / "energy").iterdir() if not p.name.startswith("."))
    st = chunk.stat()
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_bit_rot_reported_by_status_is_recomputed_by_the_next_run(reference, tmp_path, capsys):
    shutil.copytree(reference, tmp_path / "results")
    config = _config(tmp_path)
    results = tmp_path / "results"
    manifest = sorted((results / "manifests").glob("*.json"))[0]
    name = next(iter(json.loads(manifest.read_text())["stores"].values()))
    store = results / "simulations" / name
    _rot(store)
    # The start-up check (sizes, times) cannot see it: nothing to do, until status has looked.
    assert verify(store, checksums=False).ok and verify(store).status == "corrupt"
    assert planned(tmp_path, config) == {}
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"corrupt beta_star/{name.removesuffix('.zarr')}:" in out and "does not match its checksum" in out
    # Status said "the next snakemake recomputes it": it does, that store alone.
    assert planned(tmp_path, config) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    before = snapshot(results / "simulations")
    run(tmp_path, config)
    after = snapshot(results / "simulations")
    changed = {k.split("/")[0] for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {name}
    assert verify(store).ok
    np.testing.assert_array_equal(xr.open_zarr(store).energy.values,
                                  xr.open_zarr(reference / "simulations" / name).energy.values)
    assert planned(tmp_path, config) == {}


def test_status_writes_no_ticket_while_a_controller_runs(reference, tmp_path, capsys):
    """What a running controller is writing would read as damage: status reports, and leaves the repair to
    a status run once that controller has ended."""
    shutil.copytree(reference, tmp_path / "results")
    config = _config(tmp_path)
    results = tmp_path / "results"
    manifest = sorted((results / "manifests").glob("*.json"))[0]
    name = next(iter(json.loads(manifest.read_text())["stores"].values()))
    _rot(results / "simulations" / name)
    hold = ("import sys, time; from attnflow.workflow import lock_results; lock_results(sys.argv[1]); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(results)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert attnflow_main(["status", "--configfile", str(config)]) == 0
        captured = capsys.readouterr()
        assert f"corrupt beta_star/{name.removesuffix('.zarr')}:" in captured.out
        assert f"a controller (pid {holder.pid}" in captured.err and "no repair ticket" in captured.err
        assert not (results / "repairs").exists()
    finally:
        holder.kill()
        holder.wait()
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    assert planned(tmp_path, config) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
