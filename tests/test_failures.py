"""Failed cells keep the figure: recorded in the manifest, missing (NaN) in the figure, named in its
caption, in ``attnflow status`` and in the run's last line; retried once per run, never in a loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sweep_helpers import planned, run, write_config

from attnflow import Cell
from attnflow.cli import main as attnflow_main
from attnflow.config import load, validate
from attnflow.layout import Layout
from attnflow.store import open_verified
from attnflow.sweep import cell_id, run_batch, stored_cells
from attnflow.workflow import figure_caption

# usa attention blows up in finite time at beta = 16: any step budget runs out there, while
# beta = 0.5 and 2 need a few dozen steps. 2 of the 6 cells fail, one in each batch.
FAILING = {
    "fixed": {"d": 4, "t_max": 4.0, "n_samples": 21, "seeds": 2, "max_steps": 2000},
    "grid": {"H": [2], "n": [4, 6], "attention": ["usa"], "heads": ["block"], "beta": [0.5, 2.0, 16.0]},
    "batch_over": ["beta"],
}
OTHERS = ("energy", "superadditivity", "clustering_time", "clustering_probability", "entropy",
          "orthogonality", "toy_margin")


def test_a_failed_cell_is_recorded_and_the_batch_goes_on(tmp_path):
    bad = Cell(H=2, n=4, d=4, beta=16.0, attention="usa", heads="block", seeds=1, t_max=4.0, max_steps=500)
    good = Cell(H=2, n=4, d=4, beta=0.5, attention="usa", heads="block", seeds=1, t_max=1.0, max_steps=500)
    result = run_batch([bad, good], "b", Layout(tmp_path), log=lambda *_: None)
    assert list(result.failed) == [cell_id(bad)] and "step budget of 500" in result.failed[cell_id(bad)]
    assert result.failed[cell_id(bad)].startswith("cell(H=2, n=4, d=4, beta=16.0, attention='usa'")
    assert set(result.cells) == {cell_id(good)} == set(stored_cells(Layout(tmp_path).store("b")))


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failing")
    edits = {**{f"experiments.{name}": None for name in OTHERS}, "experiments.beta_star": FAILING}
    config = write_config(tmp, **edits)
    proc = run(tmp, config)  # exits 0: the failures cost their cells, not the run
    return tmp, config, tmp / "results", proc


@pytest.mark.workflow
def test_the_figure_is_drawn_without_the_failed_cells(failing_run):
    _, config, results, proc = failing_run
    assert (results / "figures" / "beta_star.png").stat().st_size > 1000
    assert (results / "figures" / "beta_star.pdf").exists()
    summary = open_verified(results / "summaries" / "beta_star.zarr.zip").load()
    assert summary.attrs["n_failed_cells"] == 2
    failed = json.loads(summary.attrs["failed_cells"])
    assert sorted(f["coords"]["n"] for f in failed) == [4, 6]
    assert {f["coords"]["beta"] for f in failed} == {16.0}
    # Missing, not dropped: NaN at beta = 16, numbers elsewhere.
    frac = summary.frac_mono_path.squeeze()
    assert np.isnan(frac.sel(beta=16.0)).all() and np.isfinite(frac.sel(beta=0.5)).all()
    # The manifests record each failure with its error; their stores are not listed as finished.
    manifests = [json.loads(p.read_text()) for p in (results / "manifests").glob("*.json")]
    assert sum(len(m["failed"]) for m in manifests) == 2
    assert all("step budget" in e for m in manifests for e in m["failed"].values())
    assert all(not set(m["failed"]) & set(m["cells"]) for m in manifests)
    # The caption (report) lists them.
    sweep = validate(load(config), reach_scheduler=False)
    caption = figure_caption(sweep, "beta_star")
    assert "Failed cells (missing in the figure): " in caption
    assert caption.count("beta=16.0, heads=block, n=") == 2
    assert caption.count(" (trajectory 0: step budget of 2000 exhausted") == 2
    # The run ends with one line naming the failures.
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnflow: 2 cells failed")]
    assert len(lines) == 1 and "beta_star 2 grid points" in lines[0] and "attnflow status" in lines[0]


@pytest.mark.workflow
def test_status_names_each_failed_cell_with_its_error(failing_run, capsys):
    _, config, _, _ = failing_run
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("beta_star"))
    assert row.split()[1:5] == ["6", "4", "0", "2"]  # cells, done, missing, failed
    lines = [line for line in out.splitlines() if line.startswith("failed beta_star/")]
    assert len(lines) == 2 and all("step budget of 2000 exhausted" in line for line in lines)


@pytest.mark.workflow
def test_a_rerun_retries_failed_cells_once(failing_run):
    tmp, config, results, _ = failing_run
    stores = {p.name: p.stat().st_mtime_ns for p in (results / "simulations").glob("*.zarr.zip")}
    # Each batch holding a failed cell runs again (once), then the summary and figure.
    assert planned(tmp, config) == {"simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    proc = run(tmp, config)
    assert proc.stderr.count("failed in the last run") == 2 and proc.stderr.count("retries it once") == 2
    logs = [p.read_text() for p in (results / "logs" / "simulate").glob("*.log")]
    # Every batch ran once: its finished cells skipped, its failed cell tried once more.
    assert all(log.count("FAILED: ") == 1 and log.count("complete, skipped") == 2 for log in logs)
    # The stores hold what they held: not written again.
    assert {p.name: p.stat().st_mtime_ns for p in (results / "simulations").glob("*.zarr.zip")} == stores
    assert (results / "figures" / "beta_star.png").exists()


def test_an_arithmetic_error_in_the_compiled_code_fails_the_cell_named(tmp_path, monkeypatch):
    """numba reports a ZeroDivisionError inside the compiled loop as SystemError: the cell fails,
    named, and the batch goes on (it is not left "missing")."""
    import attnflow.simulation as simulation

    real = simulation.simulate

    def crash(cell, **kwargs):
        if cell.beta > 10:
            raise SystemError("<built-in function solve_batch> returned a result with an exception set")
        return real(cell, **kwargs)

    monkeypatch.setattr(simulation, "simulate", crash)
    bad = Cell(H=2, n=4, d=4, beta=16.0, attention="usa", heads="block", seeds=1, t_max=0.5)
    good = Cell(H=2, n=4, d=4, beta=0.5, attention="usa", heads="block", seeds=1, t_max=0.5)
    result = run_batch([bad, good], "b", Layout(tmp_path), log=lambda *_: None)
    assert result.failed[cell_id(bad)].startswith("cell(H=2, n=4, d=4, beta=16.0, attention='usa'")
    assert "SystemError in the simulation" in result.failed[cell_id(bad)]
    assert set(stored_cells(Layout(tmp_path).store("b"))) == {cell_id(good)}


def test_a_dense_axis_keeps_a_readable_number_of_tick_labels():
    import matplotlib.pyplot as plt

    from attnflow.plotting import MAX_TICKS, log_ticks

    fig, ax = plt.subplots()
    values = np.geomspace(0.1, 100, 5000)
    log_ticks(ax, "x", values)
    ticks = ax.get_xticks()
    assert len(ticks) <= MAX_TICKS and ticks[0] == pytest.approx(0.1) and ticks[-1] == pytest.approx(100)
    plt.close(fig)


def test_when_every_cell_failed_the_summary_error_says_why(tmp_path):
    from attnflow.aggregate import summarise
    from attnflow.experiments import registry

    store = str(tmp_path / "never-written.zarr.zip")  # a batch whose cells all failed writes no store
    entries = [({"beta": 16.0}, store, "c1"), ({"beta": 32.0}, store, "c2")]
    failures = {"c1": "step budget of 1 exhausted", "c2": "step budget of 1 exhausted"}
    with pytest.raises(FileNotFoundError, match=r"beta_star: none of the 2 cells is stored: 2 failed, the "
                                                r"first at \{'beta': 16\.0\}: step budget of 1 exhausted"):
        summarise(registry().get("beta_star"), None, entries, failures)


def test_a_log_panel_whose_cells_all_failed_keeps_the_figure(tmp_path):
    # Every cell behind a log-scaled panel failed (NaN): matplotlib cannot log-scale it and raised at
    # drawing, which cost the whole figure (metastability, clustering_time, clustering_probability).
    from attnflow.plotting import mark_empty_log_axes, plain_log_axis, plt

    fig, (full, empty) = plt.subplots(1, 2)
    for ax, y in ((full, [1.0, 2.0, 4.0]), (empty, [np.nan] * 3)):
        ax.step([1.0, 10.0, 100.0], y, where="post")
        ax.set_xscale("log")
        plain_log_axis(ax, "y", base=2, subs=(1.0,))
    mark_empty_log_axes(fig)
    fig.tight_layout()
    fig.savefig(tmp_path / "f.png")
    assert full.get_yscale() == "log" and empty.get_yscale() == "linear"
    assert any("no data" in t.get_text() for t in empty.texts) and not full.texts
    plt.close(fig)
