"""Tickets: small files, inputs of a batch's simulate job or an experiment's aggregate and plot jobs, that
make Snakemake rerun a job for damage it cannot see (a store or summary damaged, stale or gone)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..layout import Layout
from ..store import StoreState
from .health import unhealthy
from .summaries import outdated_summaries

if TYPE_CHECKING:
    from ..sweep import Sweep


def find_repairs(sweep: Sweep, checksums: bool = False) -> tuple[dict[str, list[tuple[str, StoreState]]],
                                                                    dict[str, str]]:
    """The damage of every finished batch with a damaged store (``unhealthy``) and the repair tickets it
    calls for (path -> text), written by nobody yet.

    A ticket (``<what>-<digest>.ticket`` in ``Layout.repairs(batch)``, the damage as JSON;
    ``<what>`` is what the dry run's reason then shows, say ``store-missing``) is an
    input of the batch's simulate job, newer than its manifest: Snakemake reruns the
    job, which recomputes the damaged stores alone. The workflow's ``ticket`` rule
    writes it, as the run's first job: a dry run lists that job and writes nothing.
    The digest covers the damage and the manifest's time, so a run stopped after
    writing a ticket finds it again, and a later damage gets a new one. Tickets
    stay as a record of what was healed. ``checksums``: every byte read
    (``attnflow status``, which writes its tickets itself: ``issue_repairs``).
    """
    damage = unhealthy(sweep, checksums)
    tickets = {}
    for batch, problems in damage.items():
        manifest = sweep.layout.manifest(batch)
        seen = manifest.stat().st_mtime_ns if manifest.exists() else None
        what = "+".join(dict.fromkeys(map(_repair_word, problems)))
        tickets.update([_ticket(sweep.layout.repairs(batch), what, {
            "manifest_mtime_ns": seen,
            "stores": [{"path": p, "status": s.status, "detail": s.detail} for p, s in problems]})])
    return damage, tickets


def issue_repairs(sweep: Sweep, checksums: bool = False) -> dict[str, list[tuple[str, StoreState]]]:
    """Write the repair tickets ``find_repairs`` finds, now (``attnflow status``: bit rot the workflow's
    start-up check cannot see); return the damage."""
    damage, tickets = find_repairs(sweep, checksums)
    for path, text in tickets.items():
        write_ticket(path, text)
    return damage


def _repair_word(problem: tuple[str, StoreState]) -> str:
    """What a repair ticket's name says of one problem (``issue_repairs``)."""
    state = problem[1]
    if state.status == "changed":
        return "cells-added" if state.detail.startswith("gained") else "cells-changed"
    return {"failed": "failure-retried"}.get(state.status, f"store-{state.status}")


def _summary_word(why: str) -> str:
    """What a summary ticket's name says of why it is outdated (``outdated_summaries``)."""
    if why.startswith("built from batch"):
        return "manifest-missing"
    if why.startswith("built from another grid"):
        return "grid-changed"
    return f"summary-{why.split()[0]}"  # missing, corrupt, stale...


def _ticket(directory: Path, what: str, record: dict) -> tuple[str, str]:
    """``(<directory>/<what>-<digest of record>.ticket, its text)``: ``what`` (say ``store-missing``) names
    the ticket where Snakemake's reason for its job shows it."""
    text = json.dumps(record, indent=1, sort_keys=True)
    return str(directory / f"{what}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.ticket"), text


def write_ticket(path: str | Path, text: str) -> None:
    """Write a ticket unless it is there (a run stopped after writing it, or ``attnflow status``): its
    name is the digest of its text, and a ticket rewritten would be newer than the job it reran."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)  # never a half-written ticket


def find_summary_repairs(sweep: Sweep, checksums: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """Every outdated summary (``outdated_summaries``: experiment -> why) and the ticket each calls for
    (path -> text), written by nobody yet: an input of its aggregate and plot jobs, newer than both, so
    Snakemake rebuilds the summary and its figure (and first any batch whose manifest is missing). The
    workflow's ``ticket`` rule writes them as the run starts, as it does repair tickets (``find_repairs``)."""
    found = outdated_summaries(sweep, checksums)
    tickets = {}
    for name, why in found.items():
        # The times of the summary and figures: the same damage again, after a rebuild, gets a
        # new ticket (newer than what the rebuild wrote).
        outputs = (sweep.layout.summary(name), *sweep.layout.figures(name))
        seen = {p.name: p.stat().st_mtime_ns for p in outputs if p.exists()}
        tickets.update([_ticket(sweep.layout.summary_tickets(name), _summary_word(why),
                                {"experiment": name, "why": why, "mtime_ns": seen})])
    return found, tickets


def issue_summary_tickets(sweep: Sweep, checksums: bool = False) -> dict[str, str]:
    """Write the summary tickets ``find_summary_repairs`` finds, now (``attnflow status --deep``)."""
    found, tickets = find_summary_repairs(sweep, checksums)
    for path, text in tickets.items():
        write_ticket(path, text)
    return found


def summary_tickets(results: str | Path, experiment: str, issued=()) -> list[str]:
    """Every ticket of an experiment's summary, written or ``issued`` (paths the ``ticket`` rule writes
    in this run): inputs of its aggregate and plot jobs."""
    return _tickets_in(Layout(results).summary_tickets(experiment), issued)


def repair_tickets(results: str | Path, batch: str, issued=()) -> list[str]:
    """Every repair ticket of a batch, written or ``issued``: inputs of its simulate job."""
    return _tickets_in(Layout(results).repairs(batch), issued)


def _tickets_in(directory: Path, issued) -> list[str]:
    """The tickets in ``directory`` and those of ``issued`` that go there: once written, a ticket stays an
    input of its job, whose set of inputs Snakemake would otherwise see change."""
    written = {str(p) for p in directory.glob("*.ticket")}
    return sorted(written | {p for p in issued if Path(p).parent == directory})


__all__ = ["find_repairs", "find_summary_repairs", "issue_repairs", "issue_summary_tickets", "repair_tickets",
           "summary_tickets", "write_ticket"]
