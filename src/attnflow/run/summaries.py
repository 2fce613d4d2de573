"""What is wrong with a results directory's summaries: those to rebuild where Snakemake sees nothing to do,
the grid points that leave them, and the cells kept off every grid."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..ids import cell_id
from ..names import _plain, batch_experiment, grid_point_name
from ..spec import Spec
from ..store import root_attrs, verify
from ..versions import summary_versions
from .health import _ran_before, _summarised_batches
from .manifest import MANIFEST_FORMAT, read_manifest

if TYPE_CHECKING:
    from ..sweep import Sweep


def outdated_summaries(sweep: Sweep, checksums: bool = False) -> dict[str, str]:
    """Experiments whose summary must be rebuilt (with its figure) where Snakemake sees nothing to do.

    Snakemake compares times, not versions or bytes, and does not rerun a job
    for an intermediate file deleted under an output that stays. So: a summary
    damaged (its members against its completion record: sizes, or every byte
    with ``checksums``, as ``attnflow status --deep`` reads them); built under
    another numerics or reduction version (stale); deleted while its figure
    stays; the manifest of a batch that ran (``_orphaned``) deleted while the
    summary stays; built from another grid than the config's while no batch of
    it reruns by itself (another config's summary on a shared results
    directory, say). Returns experiment -> why; each gets a ticket
    (``issue_summary_tickets``).
    """
    found = {}
    summarised = _summarised_batches(sweep)
    for name, spec in sweep.specs.items():
        summary = sweep.layout.summary(name)
        if summary.exists():
            state = verify(summary, checksums=checksums, expect=summary_versions(sweep.experiments.get(name)))
            batches = sweep.batches_of(name)
            gone = [b for b in batches if _orphaned(sweep, b, summarised)]
            if not state.ok:
                found[name] = f"{state.status} ({state.detail})"
            elif gone:
                found[name] = f"built from batch {gone[0]}, whose manifest is missing"
            elif (root_attrs(summary).get("experiment_spec") != spec.to_json()
                  and not any(_runs_anyway(sweep, b) for b in batches)):
                # Built from another grid (fewer cells, or the same cells in another block), with no
                # batch to rerun: Snakemake sees that only in its records of the job's parameters, which
                # another working copy (or a results directory copied in) does not have.
                found[name] = "built from another grid (or fixed fields) than this config's"
        elif any(p.exists() for p in sweep.layout.figures(name)):
            found[name] = "missing while its figure stays"
    return found


def _orphaned(sweep: Sweep, batch: str, summarised: set[str]) -> bool:
    """A batch that ran (``_ran_before``, or its store is there) but whose manifest is gone."""
    if sweep.layout.manifest(batch).exists():
        return False
    store = sweep.layout.store(batch)
    return store.exists() or store.is_symlink() or _ran_before(sweep, batch, summarised)


def _runs_anyway(sweep: Sweep, batch: str) -> bool:
    """Whether Snakemake reruns a batch by itself: no manifest, or one that lacks some of its cells is
    rerun through its parameters (a value added to an axis)."""
    record = read_manifest(sweep, batch)
    if not record or record.get("format") != MANIFEST_FORMAT:
        return True
    recorded = set(record["cells"]) | set(record["failed"])
    return any(cell_id(c) not in recorded for c in sweep.batches[batch])


def leaving_points(sweep: Sweep) -> dict[str, tuple[list[dict], dict[str, list]]]:
    """Per experiment whose summary on disk holds grid points its grid no longer has: those points'
    coordinates and the axis values removed (axis -> values; none where only extra points left). The
    rebuilt summary leaves them out; their cells stay in their stores (``run_batch``). One metadata
    read per summary, and only a summary built from another grid is read further."""
    out = {}
    for name, spec in sweep.specs.items():
        recorded = root_attrs(sweep.layout.summary(name)).get("experiment_spec")
        if not recorded or recorded == spec.to_json():
            continue
        try:
            old = Spec.from_json(name, recorded)
            points = list(old.coordinates())
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a spec of another attnflow's making: rebuilt all the same, said by no line
        now = {_coords_key(coords) for coords in spec.coordinates()}
        gone = [coords for coords in points if _coords_key(coords) not in now]
        if gone:
            values = {axis: [v for v in old.grid[axis] if _coords_key({axis: v}) not in
                             {_coords_key({axis: w}) for w in spec.grid.get(axis, ())}]
                      for axis in old.grid if axis in spec.grid}
            out[name] = (gone, {axis: vs for axis, vs in values.items() if vs})
    return out


def _coords_key(coords: dict) -> str:
    """A grid point as text, equal for equal values (1 and 1.0 alike, as cells normalise them)."""
    def plain(value):
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    return json.dumps({k: plain(v) for k, v in coords.items()}, sort_keys=True, default=str)


def leaving_line(name: str, points: list[dict], values: dict[str, list]) -> str:
    """The start-up line (a dry run's too) on the grid points that leave an experiment's summary
    (``leaving_points``): by the values removed, else by the first points."""
    if values:
        what = "; ".join(f"{axis} = {', '.join(map(_plain, vs))} removed" for axis, vs in values.items())
    else:
        what = "; ".join(grid_point_name(name, c) for c in points[:2]) + ("; ..." if len(points) > 2 else "")
    return (f"attnflow: {len(points)} grid point{'s' if len(points) > 1 else ''} of {name} leave its summary "
            f"and figure ({what}): their cells stay stored, off the grid; put back, they are not computed "
            "again")


def off_grid_cells(sweep: Sweep) -> dict[str, dict[str, int]]:
    """The stored cells no grid of this sweep has (values removed from a grid, kept so that putting them
    back computes nothing: ``run_batch``), by experiment: store name -> how many. From the manifests
    alone (one small file per batch, this sweep's or not)."""
    ours = set(sweep.owner)
    out: dict[str, dict[str, int]] = {}
    for manifest in sorted(sweep.layout.manifests.glob("*.json")):
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # unreadable: its batch's health says so
        cells = record.get("cells") if isinstance(record, dict) else None
        if not isinstance(cells, dict) or not isinstance(record.get("store"), str):
            continue
        count = sum(cid not in ours for cid in cells)
        if count:
            out.setdefault(batch_experiment(manifest.stem), {})[record["store"]] = count
    return out


__all__ = ["leaving_line", "leaving_points", "off_grid_cells", "outdated_summaries"]
