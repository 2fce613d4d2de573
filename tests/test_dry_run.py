"""A dry run writes nothing, and the run after it does what it listed; a grid that shrinks keeps its cells."""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import yaml
from sweep_helpers import beta_star_config, dry_run, jobs_of, run

import attnflow.simulation as simulate_module
from attnflow.cell import Cell
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.run.batch import run_batch
from attnflow.run.stored import stored_cells


def _files(results: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under a results folder: its time and the SHA-256 of its bytes."""
    return {str(p.relative_to(results)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()
                                          if p.is_file() else "folder")
            for p in sorted(results.rglob("*"))}


def _ran(proc) -> dict[str, int]:
    """The jobs a run did, by rule: its job table (a run prints it on stderr, a dry run on stdout)."""
    return jobs_of(SimpleNamespace(stdout=proc.stdout + proc.stderr))


def _dry_then_run(workdir: Path, config: Path) -> tuple[dict[str, int], str]:
    """A dry run, which must leave the results folder as it was (bytes and times), then the run, which
    must do exactly the jobs the dry run listed; the plan and what the dry run said at its start."""
    results = workdir / "results"
    before = _files(results) if results.exists() else None
    dry = dry_run(workdir, config)
    assert (_files(results) if results.exists() else None) == before
    real = run(workdir, config)
    assert _ran(real) == jobs_of(dry), real.stderr[-3000:]
    return jobs_of(dry), dry.stderr


def _edit_grid(config: Path, **grid) -> None:
    cfg = yaml.safe_load(config.read_text())
    cfg["experiments"]["beta_star"]["grid"].update(grid)
    config.write_text(yaml.safe_dump(cfg))


def test_a_dry_run_writes_nothing(tmp_path):
    """In each state (fresh, a value added, a store deleted, a summary damaged) `snakemake -n` leaves the
    results folder byte-identical, and the run after it does the jobs it listed: the tickets the start-up
    check issues are jobs of the run (rule `ticket`), which the dry run lists and does not write."""
    config = beta_star_config(tmp_path)
    results = tmp_path / "results"
    plan, _ = _dry_then_run(tmp_path, config)
    assert plan == {"simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    # A value added along batch_over: each batch's manifest lacks a cell (a ticket each, as a working
    # copy without Snakemake's records of the parameters needs), each reruns and computes it.
    _edit_grid(config, beta=[0.5, 2.0, 8.0])
    plan, said = _dry_then_run(tmp_path, config)
    assert plan == {"ticket": 2, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    assert said.count("gained 1 cell (its store holds the other 2)") == 2
    assert len(list(results.glob("repairs/*/cells-added-*.ticket"))) == 2  # written by the run
    # A store deleted: its ticket, then its batch alone, and the summary and figure after it.
    store = sorted(results.glob("simulations/*.zarr.zip"))[0]
    store.unlink()
    dry = dry_run(tmp_path, config, quiet=False)
    ticket = f"{results}/repairs/{store.name.removesuffix('.zarr.zip')}/store-missing-"
    assert f"reason: Missing output files: {ticket}" in dry.stdout  # the ticket's job, named in words
    assert f"reason: Input files updated by another job: {ticket}" in dry.stdout  # the simulate job
    plan, said = _dry_then_run(tmp_path, config)
    assert plan == {"ticket": 1, "simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    assert f"{store} is missing: its job recomputes it" in said and store.exists()
    # A summary damaged under its figure: rebuilt, with the figure, through a summary ticket.
    summary = results / "summaries" / "beta_star.zarr.zip"
    summary.write_bytes(summary.read_bytes()[:-64])
    plan, said = _dry_then_run(tmp_path, config)
    assert plan == {"ticket": 1, "aggregate": 1, "plot": 1, "all": 1}
    assert "the summary of beta_star is corrupt" in said
    assert list(results.glob("repairs/_summaries/beta_star/summary-corrupt-*.ticket"))
    # Healed: nothing left to do, and a dry run then writes nothing either (the lock file's bytes included).
    assert _dry_then_run(tmp_path, config)[0] == {}


def test_a_shrinking_batch_keeps_its_cells(tmp_path, monkeypatch):
    """run_batch: a value removed from a batch's grid leaves its cell in the store (not rewritten); put
    back, no cell is computed. Counted at the engine's entry point, `simulate`."""
    cells = [Cell(H=1, n=3, d=3, beta=beta, seeds=1, t_max=0.5, n_samples=2) for beta in (0.5, 1.0, 2.0)]
    layout = Layout(tmp_path)
    real, calls = simulate_module.simulate, []

    def counted(cell, **kwargs):
        calls.append(cell_id(cell))
        return real(cell, **kwargs)

    monkeypatch.setattr(simulate_module, "simulate", counted)
    run_batch(cells, "b", layout, log=lambda *_: None)
    store = layout.store("b")
    written = (store.stat().st_mtime_ns, store.read_bytes())
    logs = []
    result = run_batch(cells[:2], "b", layout, log=logs.append)  # beta = 2 removed
    ids = {cell_id(c) for c in cells}
    assert len(calls) == 3 and set(result.cells) == ids and set(stored_cells(store)) == ids
    assert (store.stat().st_mtime_ns, store.read_bytes()) == written  # nothing new: not rewritten
    assert any("1 cell the batch no longer has" in line and "off the grid" in line for line in logs), logs
    logs.clear()
    result = run_batch(cells, "b", layout, log=logs.append)  # put back
    assert len(calls) == 3 and set(result.cells) == ids
    assert sum("complete, skipped" in line for line in logs) == 3 and not any("written" in x for x in logs)
    # A value removed and another added: the new cell is computed and stored beside the kept one.
    more = [*cells[:2], Cell(H=1, n=3, d=3, beta=4.0, seeds=1, t_max=0.5, n_samples=2)]
    result = run_batch(more, "b", layout, log=lambda *_: None)
    assert len(calls) == 4 and set(result.cells) == ids | {cell_id(more[-1])}


def test_removing_then_restoring_a_value_computes_no_cell(tmp_path):
    """The workflow: a beta removed leaves the summary (the dry run names it), its cells stay stored
    (`attnflow status` counts them off-grid); put back, its jobs compute no cell."""
    from attnflow.cli import main

    config = beta_star_config(tmp_path, **{"experiments.beta_star.grid.beta": [0.5, 1.0, 2.0]})
    results = tmp_path / "results"
    run(tmp_path, config)
    _edit_grid(config, beta=[0.5, 1.0])  # the figure needs two
    plan, said = _dry_then_run(tmp_path, config)
    assert "2 grid points of beta_star leave its summary and figure (beta = 2 removed)" in said, said
    assert plan["aggregate"] == 1 and plan["plot"] == 1
    manifests = [json.loads(p.read_text()) for p in sorted(results.glob("manifests/*.json"))]
    assert [len(m["cells"]) for m in manifests] == [3, 3]  # each batch's beta = 2 cell kept
    from attnflow.access import open_summary

    with open_summary("beta_star", config) as summary:
        assert list(summary.beta.values) == [0.5, 1.0]
    printed = _status(main, config)
    assert "kept off-grid beta_star: 2 cells in 2 stores" in printed, printed
    _edit_grid(config, beta=[0.5, 1.0, 2.0])
    plan, said = _dry_then_run(tmp_path, config)
    assert "leave its summary" not in said and "gained" not in said  # the stores hold every cell
    logs = "".join(p.read_text() for p in results.glob("logs/simulate/*.log"))
    assert plan.get("simulate") == 2 and "computed in" not in logs and "written" not in logs, logs
    with open_summary("beta_star", config) as summary:
        assert list(summary.beta.values) == [0.5, 1.0, 2.0]
    assert "kept off-grid" not in _status(main, config)


def _status(main, config: Path) -> str:
    """`attnflow status` of a config, as printed."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["status", "--configfile", str(config)]) == 0
    return buffer.getvalue()
