"""The failures the numbers decide: what a batch's manifests record of them, the lines that name them by
grid point with their remedy (``attnflow status``, a run's first and last lines, the report's captions),
and the switch that computes them again."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..ids import cell_id
from ..names import cells_phrase, describe_failures
from ..store import record_of
from .manifest import read_manifest

if TYPE_CHECKING:
    from ..cell import Cell
    from ..sweep import Sweep


# The config key (``snakemake --config retry_failures=True``) that computes known failures again.
RETRY_KEY = "retry_failures"


def retry_requested(sweep: Sweep) -> bool:
    """Whether the config asks to compute the known failures again (``RETRY_KEY``)."""
    return bool(sweep.config.get(RETRY_KEY))


def failure_remedy(cell: Cell, error: str) -> str:
    """What to change for a failure the numbers decide (``error``: a seed's or a cell's), in words: the
    step budget, the tolerance, or the stiffness that caused it (the cost model's, ``resources``)."""
    from ..resources import stiffness

    stiff = stiffness(cell)
    why = (f"{cell.attention} at beta = {cell.beta:g} is stiff (the cost model puts its steps at "
           f"{stiff:.3g}x a mild flow's)" if stiff > 100 else "")
    if "step budget" in error:
        fix = f"raise max_steps (now {cell.max_steps}) or loosen rtol (now {cell.rtol:g})"
        return f"{fix}; {why}: a lower beta or t_max is cheaper" if why else fix
    if "underflow" in error or "non-finite" in error or "left the sphere" in error:
        return (f"{why}: lower beta or t_max" if why else
                f"the flow overflows or blows up here: lower beta or t_max (now {cell.t_max:g})")
    return "see the error; `attnflow status` lists the failures"


def _short_error(error: str) -> str:
    """A cell's error without the ``cell(...): `` it starts with (the line names its grid point)."""
    return error.split("): ", 1)[1] if error.startswith("cell(") and "): " in error else error


def recorded_failures(sweep: Sweep) -> tuple[dict[str, str], dict[str, str]]:
    """What the batches' manifests record, each manifest read once: the cells that failed whole (cell id
    -> error) and the stored cells holding failed seeds (cell id -> how many seeds failed and why)."""
    whole, seeds = {}, {}
    for batch in sweep.batches:
        record = read_manifest(sweep, batch) or {}
        for key, found in (("failed", whole), ("seed_failures", seeds)):
            if isinstance(record.get(key), dict):
                found.update(record[key])
    return whole, seeds


def failed_cells(sweep: Sweep) -> dict[str, str]:
    """Every cell the batches' manifests record as failed whole: cell id -> error."""
    return recorded_failures(sweep)[0]


def seed_failed_cells(sweep: Sweep) -> dict[str, str]:
    """Every stored cell the batches' manifests record as holding failed seeds: cell id -> the line
    saying how many seeds failed and why."""
    return recorded_failures(sweep)[1]


def _cells_by_id(sweep: Sweep) -> dict:
    return {cell_id(c): c for cells in sweep.batches.values() for c in cells}


def failure_lines(sweep: Sweep, failures: tuple[dict, dict] | None = None) -> list[str]:
    """One line per failure, by grid point, with its remedy: the cells that failed whole, then those
    holding failed seeds (what ``attnflow status`` and the end of a run print). ``failures``:
    ``recorded_failures(sweep)`` where the caller has read it already."""
    cells = _cells_by_id(sweep)
    whole, seeds = failures or recorded_failures(sweep)
    lines = []
    for kind, found in (("failed", whole), ("failed seeds", seeds)):
        for cid, error in sorted(found.items(), key=lambda item: sweep.name_of(item[0])):
            if cid in cells:
                short = _short_error(error)
                lines.append(f"{kind} {sweep.name_of(cid)}: {short}; {failure_remedy(cells[cid], short)}")
    return lines


def known_failures_notice(sweep: Sweep) -> str | None:
    """The one line a run starts with when it skips failures the numbers decided (None when none)."""
    if retry_requested(sweep):
        return None
    ids = _cells_by_id(sweep)
    recorded_whole, recorded_seeds = recorded_failures(sweep)
    whole = [cid for cid in recorded_whole if cid in ids]
    seeds = [cid for cid in recorded_seeds if cid in ids]
    if not whole and not seeds:
        return None
    parts = ([f"{cells_phrase(len(whole))} that failed"] if whole else []) + \
        ([f"{cells_phrase(len(seeds))} with failed seeds (stored as failed)"] if seeds else [])
    return (f"attnflow: skipping known failures: {' and '.join(parts)}; the same numbers fail the same way, "
            "so they are computed again only when their cell (say a larger max_steps), or the numerics "
            f"version changes; `attnflow status` names them; to force them: `snakemake --config "
            f"{RETRY_KEY}=True`")


def failure_report(sweep: Sweep) -> str | None:
    """The line a run ends with when cells or seeds failed (None when none did): how many, where (by
    grid point), and the first with its remedy."""
    whole, seeds = recorded_failures(sweep)
    lines = failure_lines(sweep, (whole, seeds))
    if not lines:
        return None
    ids = set(whole) | set(seeds)
    where = [f"{name} {sum(cell_id(p.cell) in ids for p in points)}" for name, points in sweep.points.items()
             if any(cell_id(p.cell) in ids for p in points)]
    counts = ([f"{len(whole)} cells failed"] if whole else []) + \
        ([f"{len(seeds)} cells hold failed seeds"] if seeds else [])
    first = lines[0]
    return (f"attnflow: {' and '.join(counts)} ({', '.join(where)} grid points; failed seeds are left out of "
            "the reductions, counted in the summaries and figures); `attnflow status` lists them; first: "
            f"{first if len(first) < 400 else first[:400] + '...'}")


def figure_caption(sweep: Sweep, experiment: str) -> str:
    """The report caption of an experiment's figure: the experiment's, then the failed cells its
    summary lists (missing in the figure), read from the summary's attributes."""
    caption = sweep.experiments.get(experiment).caption
    try:
        failed = json.loads(record_of(sweep.layout.summary(experiment)).get("failed_cells") or "[]")
    except (ValueError, TypeError):
        failed = []
    if not failed:
        return caption
    return f"{caption} Failed cells (missing in the figure): {describe_failures(failed)}."


__all__ = ["RETRY_KEY", "failed_cells", "failure_lines", "failure_remedy", "failure_report", "figure_caption",
           "known_failures_notice", "recorded_failures", "retry_requested", "seed_failed_cells"]
