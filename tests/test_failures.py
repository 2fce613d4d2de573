"""Failures cost once (issue 39): a seed that fails is stored as failed with its cell, left out of the
reductions and counted in the summary, figure and export; a failure the numbers decide is not
retried until its cell or the numerics change; every line names the grid point and a remedy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sweep_helpers import dry_run, jobs_of, run, stored, write_config

from attnflow import Cell
from attnflow.cli import main as attnflow_main
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.run.batch import run_batch
from attnflow.run.stored import stored_cells
from attnflow.store import open_verified

# Issue 39's example at small size: usa attention is stiff at large beta. With a budget of 5,000
# steps, beta = 2 needs ~50 steps a seed (every seed succeeds), beta = 8 from 500 to 14,000 (some seeds
# exhaust it), beta = 16 exhausts it at t < 0.01 (every seed fails: the cell is still stored).
FAILING = {
    "fixed": {"d": 4, "t_max": 4.0, "n_samples": 21, "seeds": 8, "max_steps": 5000, "stop_at_cluster": True},
    "grid": {"H": [2], "n": [4, 6], "attention": ["usa"], "heads": ["scalar"], "beta": [2.0, 8.0, 16.0]},
    "batch_over": ["beta"],
}
OTHERS = ("energy", "superadditivity", "clustering_time", "clustering_probability", "entropy",
          "orthogonality", "toy_margin")


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failing")
    edits = {**{f"experiments.{name}": None for name in OTHERS}, "experiments.beta_star": FAILING}
    config = write_config(tmp, **edits)
    proc = run(tmp, config)  # exits 0: the failures cost their seeds, not the run
    return tmp, config, tmp / "results", proc


def _failed_by_point(results) -> dict:
    """(n, beta) -> seeds failed, read from the stores themselves."""
    return {(int(ds.attrs["cell_n"]), float(ds.attrs["cell_beta"])): int(ds.failed.sum())
            for ds in stored(results).values()}


@pytest.mark.workflow
def test_failed_seeds_are_stored_and_their_cells_kept(failing_run):
    _, _, results, _ = failing_run
    failed = _failed_by_point(results)
    assert len(failed) == 6  # every cell stored, the one whose seeds all failed too
    assert all(failed[(n, 2.0)] == 0 and failed[(n, 16.0)] == 8 and 0 < failed[(n, 8.0)] < 8 for n in (4, 6))
    for ds in stored(results).values():
        bad = ds.failed.values
        assert (ds.failure.values[bad] == 2).all() and (ds.failure.values[~bad] == 0).all()  # step budget
        assert np.isnan(ds.t_failed.values[~bad]).all() and np.isfinite(ds.t_failed.values[bad]).all()
        for s in np.flatnonzero(bad):  # NaN after the failure
            assert np.isnan(ds.gamma_mean.values[s, ds.time.values > ds.t_failed.values[s]]).all()
        # The certificate reruns seeds that succeeded; a cell with none has no certificate.
        if bad.all():
            assert "certificate_error" not in ds.attrs
        else:
            assert np.isfinite(ds.attrs["certificate_error"]) and ds.attrs["certificate_seeds"] >= 1
    # The manifests: no cell failed whole; the cells with failed seeds, and the numerics they failed under.
    manifests = [json.loads(p.read_text()) for p in (results / "manifests").glob("*.json")]
    assert all(not m["failed"] for m in manifests)
    assert sum(len(m["seed_failures"]) for m in manifests) == 4
    assert all("step budget of 5000 exhausted" in line
               for m in manifests for line in m["seed_failures"].values())


@pytest.mark.workflow
def test_the_summary_figure_and_export_count_the_failed_seeds(failing_run, tmp_path):
    from attnflow.export import export, write_csv
    from attnflow.figures import failed_note

    _, config, results, proc = failing_run
    failed = _failed_by_point(results)
    summary = open_verified(results / "summaries" / "beta_star.zarr.zip").load()
    for (n, beta), k in failed.items():
        point = summary.sel(n=n, beta=beta).squeeze()
        assert int(point.n_seeds_failed) == k and int(point.n_seeds_used) == 8 - k
    assert summary.n_seeds_failed.attrs["units"] == "1" and summary.n_seeds_used.attrs["long_name"]
    # The failed seeds are left out: no seed at beta = 16, the others' fractions at beta = 8.
    frac = summary.frac_mono_path.squeeze()
    assert np.isnan(frac.sel(beta=16.0)).all() and np.isfinite(frac.sel(beta=8.0)).all()
    total = sum(failed.values())
    assert summary.attrs["n_seeds_failed"] == total and summary.attrs["n_seeds"] == 6 * 8
    # The figure's footer: one short line.
    note = failed_note(summary)
    assert note == (f"Failed: {total} of 48 seeds failed, at 4 grid points (left out); `attnflow status` "
                    "names them.")
    assert (results / "figures" / "beta_star.png").stat().st_size > 1000
    # The export: per row (one per n), the seed runs used and failed over its line's betas.
    df = export("beta_star", config)
    for _, row in df.iterrows():
        k = sum(failed[(int(row.n), beta)] for beta in (2.0, 8.0, 16.0))
        assert (row.seeds_failed, row.seeds_used) == (k, 24 - k)
    write_csv(df, tmp_path / "t.csv")
    assert "seeds_failed" in (tmp_path / "t.csv").read_text().splitlines()[0]
    # The run ends with one line: how many, where, the first with its remedy.
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("attnflow: 4 cells hold failed seeds")]
    assert len(lines) == 1 and "beta_star 4 grid points" in lines[0]
    assert "raise max_steps (now 5000)" in lines[0]


@pytest.mark.workflow
def test_known_failures_are_not_retried_until_forced(failing_run):
    tmp, config, results, _ = failing_run
    stores = {p.name: p.stat().st_mtime_ns for p in (results / "simulations").glob("*.zarr.zip")}
    dry = dry_run(tmp, config, quiet=False)
    assert jobs_of(dry) == {}  # nothing to do: the failures are stored, final for these numbers
    assert dry.stderr.count("skipping known failures") == 1
    assert "retry_failures=True" in dry.stderr and "4 cells with failed seeds" in dry.stderr
    # Forced: the batches with failed seeds run again (once), recomputing just those cells.
    forced = dry_run(tmp, config, "--config", "retry_failures=True")
    # (a ticket each first: the run writes it, the dry run lists its job)
    assert jobs_of(forced) == {"ticket": 2, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    # A line per cell retried: its grid point, then why it failed (no second parenthesis, no "cell(...)").
    retried = [line for line in forced.stderr.splitlines() if line.startswith("attnflow: retrying ")]
    assert len(retried) == 4 and not any(") (" in line or "cell(" in line for line in retried), retried
    assert {p.name: p.stat().st_mtime_ns for p in (results / "simulations").glob("*.zarr.zip")} == stores


def test_one_known_failure_is_said_in_the_singular(tmp_path):
    from sweep_helpers import beta_star_config

    from attnflow.config import load, validate
    from attnflow.run.failures import known_failures_notice
    from attnflow.run.manifest import MANIFEST_FORMAT

    sweep = validate(load(beta_star_config(tmp_path)), reach_scheduler=False)
    batch, cells = next(iter(sweep.batches.items()))
    manifest = sweep.layout.manifest(batch)
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "batch": batch, "cells": {},
                                    "failed": {cell_id(cells[0]): "step budget exhausted"}}))
    assert "skipping known failures: 1 cell that failed; the same numbers" in known_failures_notice(sweep)


@pytest.mark.workflow
def test_status_names_each_failure_by_its_grid_point_with_a_remedy(failing_run, capsys):
    _, config, _, _ = failing_run
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("beta_star"))
    # cells, done, missing, failed: whole, or every seed (beta = 16: stored, but no number to use)
    assert row.split()[1:5] == ["6", "4", "0", "2"]
    lines = [line for line in out.splitlines() if line.startswith("failed seeds beta_star (")]
    assert len(lines) == 4
    # The axes in the experiment's order (sweep.canonical_grid), whatever the config's (write_config dumps
    # the grid's keys sorted).
    assert any(line.startswith("failed seeds beta_star (attention=usa, H=2, heads=scalar, n=4, beta=16): "
                               "8 of 8 seeds failed: step budget of 5000 exhausted") for line in lines)
    assert all("raise max_steps (now 5000) or loosen rtol (now 1e-09)" in line and "usa at beta = " in line
               for line in lines)
    assert "to force them: `snakemake --config retry_failures=True`" in out


def test_a_seed_failure_is_final_and_retry_failed_computes_it_again(tmp_path):
    bad = Cell(H=2, n=4, d=4, beta=16.0, attention="usa", heads="block", seeds=2, t_max=4.0, max_steps=500)
    good = Cell(H=2, n=4, d=4, beta=0.5, attention="usa", heads="block", seeds=1, t_max=1.0, max_steps=500)
    logs = []
    result = run_batch([bad, good], "b", Layout(tmp_path), log=logs.append,
                       names={cell_id(bad): "beta_star (beta=16)", cell_id(good): "beta_star (beta=0.5)"})
    assert not result.failed and set(result.cells) == {cell_id(bad), cell_id(good)}
    assert result.seed_failures[cell_id(bad)].startswith("2 of 2 seeds failed: step budget of 500 exhausted")
    assert any(line.startswith("[1/2] beta_star (beta=16): 2 of 2 seeds failed") and "raise max_steps" in line
               for line in logs)
    again = []
    run_batch([bad, good], "b", Layout(tmp_path), log=again.append)
    assert sum("complete, skipped" in line for line in again) == 2
    forced = []
    run_batch([bad, good], "b", Layout(tmp_path), log=forced.append, retry_failed=True)
    assert "retry_failed: 1 cells with failed seeds computed again" in forced
    assert set(stored_cells(Layout(tmp_path).store("b"))) == {cell_id(bad), cell_id(good)}


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
