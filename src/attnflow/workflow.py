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
from .store import StoreState, verify
from .sweep import Sweep, cell_id, config_digest


def sweep_from_workflow(config: dict, configfiles=()) -> Sweep:
    """Validate the config Snakemake loaded; its files are re-read strictly (duplicate keys refused)."""
    for path in configfiles:
        load_config(path)
    return validate(config)


def manifest(results: str | Path, batch: str) -> str:
    return str(Path(results) / "manifests" / f"{batch}.json")


def unhealthy(sweep: Sweep) -> dict[str, list[tuple[str, StoreState]]]:
    """Batches whose manifest lists a store that is now missing or does not match its record.

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
                    if not (state := verify(store, checksums=False)).ok]
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
        record = {"manifest_mtime_ns": seen,
                  "stores": [{"path": p, "status": s.status, "detail": s.detail} for p, s in problems]}
        text = json.dumps(record, indent=1, sort_keys=True)
        ticket = repair_dir(sweep.results, batch) / f"{hashlib.sha256(text.encode()).hexdigest()[:12]}.ticket"
        if not ticket.exists():
            ticket.parent.mkdir(parents=True, exist_ok=True)
            ticket.write_text(text)
    return damage


def repair_dir(results: str | Path, batch: str) -> Path:
    return Path(results) / "repairs" / batch


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


__all__ = ["ConfigError", "aggregate_job", "batch_params", "issue_repairs", "manifest", "plot_job",
           "provenance", "repair_tickets", "simulate_job", "sweep_from_workflow", "unhealthy"]
