"""``attnflow status``: a sweep's cells by state (done, missing, failed, corrupt, interrupted, stale), what
the next run will do about them, and its progress; it writes the repair tickets the workflow acts on."""

from __future__ import annotations

import json
import math
import sys

STATES = ("done", "missing", "failed", "corrupt", "interrupted", "stale")


def sweep_status(sweep, deep: bool = False) -> dict[str, dict]:
    """Per experiment: its cells by state, each batch's store checked as every start of the workflow
    does (its size and time against its manifest), or against its completion record, every byte, with
    ``deep``; ``stale``: written under another numerics version, or by another engine than the cell
    names."""
    from .ids import cell_id
    from .run.health import cell_states

    cells = cell_states(sweep, checksums=deep)
    report = {}
    for name, points in sweep.points.items():
        states = {state: {} for state in STATES}
        for cid in dict.fromkeys(cell_id(p.cell) for p in points):
            states[cells[cid].status][cid] = cells[cid].detail
        report[name] = states
    return report


def uncertified(sweep, bound: float) -> dict[str, dict[str, tuple[float, str]]]:
    """Per experiment: its finished cells whose accuracy certificate exceeds ``bound`` (or is not finite),
    each with its certificate and the store's word on it (``certificate_variable``: the variable, or why
    seeds are uncertified)."""
    import math

    from .ids import cell_id
    from .pack import group_attrs

    certificates = {}
    for batch in sweep.batches:
        for cid, attrs in group_attrs(sweep.layout.store(batch)).items():
            certificates[cid] = (attrs.get("certificate_error"), str(attrs.get("certificate_variable", "")))
    report = {}
    for name, points in sweep.points.items():
        for cid in dict.fromkeys(cell_id(p.cell) for p in points):
            value, why = certificates.get(cid, (None, ""))
            if value is not None and not (math.isfinite(value) and value <= bound):
                report.setdefault(name, {})[cid] = (value, why)
    return report


def _load(args):
    """The sweep of ``--configfile`` (``--results`` over its own), or None after one line on stderr."""
    from .config import load, validate
    from .errors import ConfigError

    try:
        config = load(args.configfile)
        if args.results is not None:  # validate refuses an empty one, as in a config
            config["results"] = args.results
        return validate(config, reach_scheduler=False, configfile=args.configfile)
    except ConfigError as err:
        print(f"attnflow status: {err}", file=sys.stderr)
        return None


def _notices(sweep) -> None:
    """What keeps cells from a run, on stderr: experiments skipped here, stores of attnflow 0.1."""
    for name, why in sweep.skipped.items():
        print(f"attnflow status: skipping experiment {name}: {why}", file=sys.stderr)
    old = sweep.layout.old_stores()
    if old:
        print(f"attnflow status: {len(old)} stores in {sweep.stores} are in the layout of attnflow 0.1 "
              "(a directory per cell), which this version does not read: their cells count as missing and "
              "the next `snakemake` computes them again; delete those directories to free their files",
              file=sys.stderr)


def _tickets(sweep, report: dict, deep: bool, foreign) -> dict[str, str]:
    """The summaries to rebuild; with the tickets for what the workflow must act on written.

    Bit rot (same size and time) passes the start-up check, so the tickets are written here, from every
    byte: repairs for corrupt stores, rebuilds for summaries (read whole with ``deep``). Not while a
    controller runs: what it is writing reads as damage, and it would rerun jobs for it; nor on another
    config's results (``foreign``)."""
    from .run.lock import results_holder
    from .run.summaries import outdated_summaries
    from .run.tickets import issue_repairs, issue_summary_tickets

    corrupt = any(states["corrupt"] for states in report.values())
    holder = results_holder(sweep.results) if corrupt or deep else None
    if corrupt and not holder and not foreign:
        issue_repairs(sweep, checksums=deep)
    if deep and not holder and not foreign:
        outdated = issue_summary_tickets(sweep, checksums=True)
    else:
        outdated = outdated_summaries(sweep, checksums=deep)
    if holder and (corrupt or outdated):
        print(f"attnflow status: a controller ({holder}) runs on {sweep.results}: no repair ticket "
              "written; run status again once it ends", file=sys.stderr)
    return outdated


def _print_json(report: dict, outdated: dict, off_grid: list[str]) -> None:
    """Cells by experiment as JSON on stdout; the summaries' state and the off-grid cells on stderr."""
    print(json.dumps(report, indent=1))
    for name, why in outdated.items():
        print(f"attnflow status: summary {name}: {why} (the next `snakemake` rebuilds it and its "
              "figure)", file=sys.stderr)
    for line in off_grid:
        print(f"attnflow status: {line}", file=sys.stderr)


def _print_table(report: dict) -> None:
    print(f"{'experiment':24} {'cells':>6}" + "".join(f" {s:>11}" for s in STATES))
    for name, states in report.items():
        total = sum(len(v) for v in states.values())
        print(f"{name:24} {total:6d}" + "".join(f" {len(states[s]):11d}" for s in STATES))


def _print_failures(sweep) -> None:
    """Each failed cell's line, naming its grid point (experiment and axis values), not the cell's hash,
    and what to change."""
    from .run.failures import RETRY_KEY, failure_lines

    failures = failure_lines(sweep)
    for line in failures:
        print(line)
    if failures:
        print(f"(failures are not retried until their cell, its max_steps or the numerics change; to force "
              f"them: `snakemake --config {RETRY_KEY}=True`)")


def _print_cells(sweep, report: dict) -> None:
    """The cells the next run acts on or records again: replaced, corrupt, stale."""
    for name, states in report.items():
        for cid, detail in states["done"].items():
            if detail:  # done, with a remark: a store touched since its manifest, intact
                print(f"replaced since {sweep.name_of(cid, name)}: {detail} (done; the next `snakemake` "
                      "records it again, computing nothing)")
        for cid, detail in states["corrupt"].items():
            print(f"corrupt {sweep.name_of(cid, name)}: {detail} (the next `snakemake` recomputes it)")
        for cid, detail in states["stale"].items():
            print(f"stale {sweep.name_of(cid, name)}: {detail} (the next `snakemake` recomputes it)")


def _print_uncertified(sweep, bound: float) -> None:
    for name, cells in uncertified(sweep, bound).items():
        for cid, (value, why) in cells.items():
            where = sweep.name_of(cid, name)
            if math.isnan(value):  # a seed no companion run could bound: a tighter rtol may not help
                print(f"uncertified {where}: {why} (docs/model.md, Numerics: where the certificate "
                      "stops being a bound)")
            else:
                variable = why or "a recorded variable"
                print(f"uncertified {where}: certificate_error {value:.3g} > {bound:g} (its worst seed's "
                      f"bound on the error of {variable}, relative to its scale): tighten rtol and atol in "
                      "its block (or defaults)")


def status(args) -> int:
    """``attnflow status``: the sweep's cells by state, its failures, damage, stale summaries and
    uncertified cells, then progress and an ETA; writes the repair tickets the workflow acts on."""
    sweep = _load(args)
    if sweep is None:
        return 2
    _notices(sweep)
    from .run.owner import foreign_owner
    from .run.summaries import off_grid_cells

    foreign = foreign_owner(sweep, args.configfile)
    if foreign:  # its stores are another config's: no ticket written for them
        print(f"attnflow status: {foreign}", file=sys.stderr)
    report = sweep_status(sweep, deep=args.deep)
    outdated = _tickets(sweep, report, args.deep, foreign)
    off_grid = [_off_grid_line(name, stores) for name, stores in off_grid_cells(sweep).items()]
    if args.json:
        _print_json(report, outdated, off_grid)
        return 0
    _print_table(report)
    _print_failures(sweep)
    _print_cells(sweep, report)
    for name, why in outdated.items():
        print(f"summary {name}: {why} (the next `snakemake` rebuilds it and its figure)")
    for line in off_grid:
        print(line)
    _print_uncertified(sweep, args.certificate_bound)
    # During a run: the share done and an ETA per experiment (attnflow.progress).
    from .progress import progress, render

    print(render(*progress(sweep, cores=args.cores, checksums=args.deep, declared=args.gpus)))
    return 0


def _off_grid_line(experiment: str, stores: dict[str, int]) -> str:
    """Status's line on the cells kept off an experiment's grid (``workflow.off_grid_cells``)."""
    count = sum(stores.values())
    return (f"kept off-grid {experiment}: {count} cell{'s' if count > 1 else ''} in {len(stores)} "
            f"store{'s' if len(stores) > 1 else ''} ({', '.join(sorted(stores)[:2])}"
            f"{', ...' if len(stores) > 2 else ''}), of grid values since removed: not in the summary; "
            "put back, they are not computed again")
