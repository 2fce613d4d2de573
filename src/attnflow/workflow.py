"""What the Snakemake workflow asks of the package: the validated sweep, job parameters, store health.

``workflow/rules/common.smk`` calls these at parse time; the rule scripts call
``simulate_job``, ``aggregate_job`` and ``plot_job``. Keeping the logic here
makes it testable without Snakemake.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from . import __version__
from .config import load as load_config
from .config import validate
from .experiments import ConfigError, Spec
from .store import StoreState, record_of
from .sweep import Sweep, cell_id, config_digest, summary_versions, verify_cell


def sweep_from_workflow(config: dict, configfiles=()) -> Sweep:
    """Validate the config Snakemake loaded; its files are re-read strictly (duplicate keys refused)."""
    for path in configfiles:
        load_config(path)
    return validate(config)


def manifest(results: str | Path, batch: str) -> str:
    return str(Path(results) / "manifests" / f"{batch}.json")


def unhealthy(sweep: Sweep) -> dict[str, list[tuple[str, StoreState]]]:
    """Batches whose manifest lists a store that is now missing, does not match its record, or is
    stale (written under another numerics version).

    Only the stores the manifest lists (what the batch finished): a batch that
    gained cells reruns anyway, its parameters changed. Sizes and the bytes of
    files written since the record: cheap enough for every start of the workflow.
    """
    found = {}
    for batch in sweep.batches:
        path = Path(manifest(sweep.results, batch))
        try:
            names = json.loads(path.read_text())["stores"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # no manifest (the batch runs anyway) or an unreadable one
        stores = [str(sweep.stores / name) for name in names]  # wherever the results dir now is
        problems = [(store, state) for store in stores
                    if not (state := verify_cell(store, checksums=False)).ok]
        if problems:
            found[batch] = problems
    return found


def issue_repairs(sweep: Sweep) -> dict[str, list[tuple[str, StoreState]]]:
    """Write a repair ticket for every finished batch with a damaged store; return the damage.

    A ticket (``results/repairs/<batch>/<digest>.ticket``, the damage as JSON) is an
    input of the batch's simulate job, newer than its manifest: Snakemake reruns the
    job, which recomputes the damaged stores alone. The digest covers the damage
    and the manifest's time, so a dry run and the run after it share one ticket,
    and a later damage gets a new one. Tickets stay as a record of what was healed.
    """
    damage = unhealthy(sweep)
    for batch, problems in damage.items():
        seen = Path(manifest(sweep.results, batch)).stat().st_mtime_ns
        _write_ticket(repair_dir(sweep.results, batch), {
            "manifest_mtime_ns": seen,
            "stores": [{"path": p, "status": s.status, "detail": s.detail} for p, s in problems]})
    return damage


def _write_ticket(directory: Path, record: dict) -> None:
    """``<directory>/<digest of record>.ticket``, unless that ticket exists (a dry run wrote it)."""
    text = json.dumps(record, indent=1, sort_keys=True)
    ticket = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:12]}.ticket"
    if not ticket.exists():
        ticket.parent.mkdir(parents=True, exist_ok=True)
        ticket.write_text(text)


def repair_dir(results: str | Path, batch: str) -> Path:
    return Path(results) / "repairs" / batch


def summary_path(results: str | Path, experiment: str) -> Path:
    return Path(results) / "summaries" / f"{experiment}.zarr"


def figure_paths(results: str | Path, experiment: str) -> list[Path]:
    return [Path(results) / "figures" / f"{experiment}.{ext}" for ext in ("png", "pdf")]


def outdated_summaries(sweep: Sweep) -> dict[str, str]:
    """Experiments whose summary must be rebuilt (with its figure) where Snakemake sees nothing to do.

    Snakemake compares times, not versions, and does not rerun a job for an
    intermediate file deleted under an output that stays. So: a summary built
    under another numerics or reduction version (stale); a summary deleted
    while its figure stays; a manifest of its batches deleted while the summary
    stays. Each gets a ticket (``summary_tickets``) -> experiment: why.
    """
    found = {}
    for name in sweep.specs:
        summary = summary_path(sweep.results, name)
        if summary.exists():
            record = record_of(summary)
            differ = [f"{key} {record.get(key)}, now {want}"
                      for key, want in summary_versions(sweep.experiments.get(name)).items()
                      if record.get(key) != want]
            gone = [b for b in sweep.batches_of(name) if not Path(manifest(sweep.results, b)).exists()]
            if differ:
                found[name] = "stale (built under " + "; ".join(differ) + ")"
            elif gone:
                found[name] = f"built from batch {gone[0]}, whose manifest is missing"
        elif any(p.exists() for p in figure_paths(sweep.results, name)):
            found[name] = "missing while its figure stays"
    return found


def issue_summary_tickets(sweep: Sweep) -> dict[str, str]:
    """A ticket for every outdated summary (``outdated_summaries``), an input of its aggregate and plot
    jobs, newer than both: Snakemake rebuilds the summary and its figure (and first any batch whose
    manifest is missing). Shared by a dry run and the run after it, like repair tickets."""
    found = outdated_summaries(sweep)
    for name, why in found.items():
        summary = summary_path(sweep.results, name)
        seen = summary.stat().st_mtime_ns if summary.exists() else 0
        _write_ticket(summary_ticket_dir(sweep.results, name),
                      {"experiment": name, "why": why, "summary_mtime_ns": seen})
    return found


def summary_ticket_dir(results: str | Path, experiment: str) -> Path:
    # "_summaries": no batch name holds "_", so no batch's repair directory is this one.
    return Path(results) / "repairs" / "_summaries" / experiment


def summary_tickets(results: str | Path, experiment: str) -> list[str]:
    """Every ticket issued for an experiment's summary: inputs of its aggregate and plot jobs."""
    return sorted(str(p) for p in summary_ticket_dir(results, experiment).glob("*.ticket"))


def repair_tickets(results: str | Path, batch: str) -> list[str]:
    """Every repair ticket issued for a batch: inputs of its simulate job."""
    return sorted(str(p) for p in repair_dir(results, batch).glob("*.ticket"))


def batch_params(sweep: Sweep, batch: str) -> str:
    """The cells of one batch job, as JSON (Snakemake params must be hashable text)."""
    return json.dumps([cell.to_dict() for cell in sweep.batches[batch]], sort_keys=True)


def provenance(config: dict) -> dict:
    """What stores and summaries record of their origin. Read inside the jobs, never a rule
    parameter: Snakemake reruns a job whose parameters change, and the digest changes with
    any edit of the config."""
    return {"config_sha256": config_digest(config), "attnflow_version": __version__}


def simulate_job(cells_json: str, stores: str, batch: str, config: dict, output: str, log=print):
    """Simulate a batch's missing or damaged stores, then write its manifest (store names, by cell id)."""
    from .cell import Cell
    from .sweep import run_batch

    cells = [Cell(**fields) for fields in json.loads(cells_json)]
    paths = run_batch(cells, stores, log=log, provenance={"batch": batch, **provenance(config)})
    Path(output).write_text(json.dumps({
        "batch": batch,
        "stores": {cell_id(c): p.name for c, p in zip(cells, paths, strict=True)},
    }, indent=1))


def aggregate_job(name: str, spec_json: str, entries_json: str, output: str, scheduler: str,
                  config: dict, modules=(), retire=()):
    """Summarise one experiment from the stores its rule names (never re-derived from the config)."""
    from .aggregate import aggregate
    from .experiments import registry

    experiment = registry(modules).get(name)
    entries = [(coords, path) for coords, path in json.loads(entries_json)]
    return aggregate(experiment, Spec.from_json(name, spec_json), entries, output, scheduler=scheduler,
                     provenance=provenance(config), retire=retire)


def plot_job(summary_path: str, outputs, modules=()):
    """Draw one experiment's figure from its summary store (the spec comes from the summary)."""
    from .plotting import render
    from .store import open_verified

    with open_verified(summary_path) as summary:
        render(summary.load(), outputs, source=summary_path, experiment_modules=modules)


__all__ = ["ConfigError", "aggregate_job", "batch_params", "figure_paths", "issue_repairs",
           "issue_summary_tickets", "manifest", "outdated_summaries", "plot_job", "provenance",
           "repair_tickets", "simulate_job", "summary_path", "summary_tickets", "sweep_from_workflow",
           "unhealthy"]
