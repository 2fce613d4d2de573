"""One-line access to a finished sweep: an experiment's summary, or its simulation stores.

Cells are stored by batch, named inside by a hash of their fields, and
summaries live under the config's results directory, so opening one by hand
needs the sweep's batches and ``attnflow.pack``. Here the config is the only address: the experiment
is named, the grid values are given as keywords, and every store is verified
against its completion record before it is read. Errors name what is wrong and
what to run: an experiment the config does not run, a summary not built yet, a
grid value that is not on the grid, a cell not simulated yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import xarray as xr

from .errors import ConfigError
from .store import StaleStore

DEFAULT_CONFIG = "config/config.yaml"


class NotBuiltError(FileNotFoundError):
    """A summary or store the workflow has not written yet; the message says which command writes it."""


class OutdatedSummary(StaleStore):
    """A summary built from another grid than the config's, or under other numerics or reduction versions
    (stale): the message names the command that rebuilds it. Never served: its numbers are not the
    config's."""


class OutdatedCells(StaleStore):
    """Stored cells another engine computed than the config names for them (``engine: numba`` or ``jax``),
    or their engine under another version of its own numbers: the message names the command that
    recomputes them. Never served: their numbers are not those the config asks for."""


class NotOnGrid(KeyError):
    """A coordinate that is no grid axis of the experiment, or a value not on its axis (named)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def load_sweep(configfile: str | Path = DEFAULT_CONFIG, results: str | Path | None = None):
    """The validated sweep of a config file (``results`` overrides its results directory; without
    either, ``results/<the file's stem>``, as the workflow resolves it)."""
    from .config import load, validate

    config = load(configfile)
    if results is not None:
        config["results"] = str(results)
    sweep = validate(config, reach_scheduler=False, configfile=configfile)
    where = _run_directory(configfile, sweep.results)
    if where is not None:  # called from another directory than the run's: its results, read from there
        config["results"] = str(where / sweep.results)
        sweep = validate(config, reach_scheduler=False, configfile=configfile)
    return sweep


def _run_directory(configfile, results: Path) -> Path | None:
    """Where a run of this config writes a relative results directory that is not under the working
    directory: the nearest directory above the config file that holds a ``Snakefile`` (Snakemake runs
    there, as the README's commands do). None: an absolute one, one under the working directory, or no
    ``Snakefile`` above the config."""
    if results.is_absolute() or results.exists():
        return None
    for directory in Path(configfile).resolve().parents:
        if (directory / "Snakefile").is_file():
            return None if directory == Path.cwd().resolve() else directory
    return None


def _check_experiment(sweep, experiment: str, configfile) -> None:
    """The experiment a caller asks for, against a config ``attnflow.config`` accepted.

    A check of this call's argument, not of the config's content (which ``attnflow.config``
    owns), so it lives with the call; ``ConfigError`` as the name is one of the config's keys.
    """
    if experiment in sweep.specs:
        return
    if experiment in sweep.skipped:
        raise ConfigError(f"experiments.{experiment}: cannot run here ({sweep.skipped[experiment]})")
    known = ", ".join(sweep.specs)
    if experiment in sweep.experiments:
        raise ConfigError(f"experiments.{experiment}: not in {configfile} (it runs: {known})")
    raise ConfigError(f"experiment {experiment!r}: unknown (this config runs: {known}; every experiment: "
                      f"{', '.join(sweep.experiments.names())})")


def build_command(configfile, target: str | Path) -> str:
    """The command that writes ``target`` (a summary or figure) for this config. The target comes
    first: ``--configfile`` takes every word after it, so a target there would be read as a config."""
    return f"snakemake {target} --configfile {configfile}"


def open_summary(experiment: str, configfile: str | Path = DEFAULT_CONFIG, *,
                 results: str | Path | None = None, load: bool = True) -> xr.Dataset:
    """An experiment's summary: its quantities over the grid, closed forms on the same grid.

    The store is verified against its completion record first, every byte
    (``CorruptStore`` naming the variable or chunk that differs). A summary
    built from another grid than the config's (another config on the same
    results directory, or the config edited since), or under other numerics or
    reduction versions, raises ``OutdatedSummary`` naming the command that
    rebuilds it: only the config's own numbers are served. ``load=False``
    returns it lazily (dask).
    """
    sweep = load_sweep(configfile, results)
    _check_experiment(sweep, experiment, configfile)
    path = sweep.layout.summary(experiment)
    if not path.exists():
        raise NotBuiltError(f"{experiment}: no summary at {path.absolute()} yet; build it with "
                            f"`{build_command(configfile, path)}` (or `snakemake --configfile {configfile}` "
                            "for every experiment)")
    from .store import load as load_store
    from .store import open_members
    from .versions import summary_versions

    rebuild = f"`{build_command(configfile, path)}` rebuilds it"
    try:
        _, members = load_store(path, expect=summary_versions(sweep.experiments.get(experiment)))
    except StaleStore as err:
        raise OutdatedSummary(f"{err}; {rebuild}") from None
    ds = open_members(members)
    if ds.attrs.get("experiment_spec") != sweep.specs[experiment].to_json():
        ds.close()
        raise OutdatedSummary(f"{path} was built from another grid (or fixed fields) of {experiment} than "
                              f"{configfile} holds{_owned_by(sweep, configfile)}; {rebuild}")
    if load:
        with ds:
            ds = ds.load()
    return ds


def _owned_by(sweep, configfile) -> str:
    """`` (the results directory belongs to config X)`` when another config ran there last, else ""."""
    from .run.owner import UnreadableOwner, config_identity, owner_of, same_config

    try:
        owner = owner_of(sweep.results)
    except UnreadableOwner as err:
        return f" (its owner record {err})"
    if owner and not same_config(owner, config_identity(sweep, configfile)):
        return f" (its results directory {sweep.results} belongs to config {owner.get('config')})"
    return ""


def _as_list(value) -> list:
    if isinstance(value, str) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _same(a, b) -> bool:
    """Grid values equal as a config means them: 1 and 1.0 alike, numpy scalars as plain ones."""
    a, b = _plain(a), _plain(b)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return float(a) == float(b)
    return a == b


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def select_points(sweep, experiment: str, coords: dict):
    """The experiment's grid points matching ``coords`` (axis -> value or list of values).

    A key that is no grid axis must be one of the experiment's fixed fields at its
    value; a value not on the grid is ``NotOnGrid`` (a ``KeyError``) naming the axis, the value and
    the grid's values.
    """
    spec = sweep.specs[experiment]
    wanted = {}
    for axis, value in coords.items():
        values = _as_list(value)
        where = f"fixed at {spec.fixed[axis]!r}" if axis in spec.fixed else "not a cell field"
        if not values:  # selects nothing: no grid point (an empty dataset) is never what was meant
            choices = f"{axis}: {spec.values(axis)}" if axis in spec.grid else f"{axis} is {where}"
            raise NotOnGrid(f"{experiment}: {axis} = {value!r}: no value given ({choices})")
        if axis not in spec.grid:
            if axis in spec.fixed and all(_same(v, spec.fixed[axis]) for v in values):
                continue  # a fixed field at its value selects everything
            raise NotOnGrid(f"{experiment}: {axis} = {value!r} is not on the grid ({axis} is {where}; grid "
                           f"axes: {', '.join(spec.grid) or 'none'})")
        on_grid = spec.values(axis)
        absent = [v for v in values if not any(_same(v, g) for g in on_grid)]
        if absent:
            raise NotOnGrid(f"{experiment}: {axis} = {absent[0]!r} is not on the grid ({axis}: {on_grid})")
        wanted[axis] = values
    return [p for p in sweep.points[experiment]
            if all(any(_same(p.coords[a], v) for v in vs) for a, vs in wanted.items())]


def open_cells(experiment: str, configfile: str | Path = DEFAULT_CONFIG, *, results: str | Path | None = None,
               **coords) -> xr.Dataset:
    """The simulation stores of an experiment's grid points matching ``coords``, combined over its grid axes.

    ``open_cells("beta_star", "config/config.yaml", n=8, beta=[0.5, 1.0])``: keywords
    are grid axes, each a value or a list of values (none: every point). The result
    has one dimension per grid axis (outer join: a coordinate combination the grid
    lacks is NaN) on top of each cell's own (seed, time, head, token); it is read
    into memory. Each batch's store is verified first, every byte; a cell not
    stored yet is ``NotBuiltError`` naming its grid point and the command that
    writes it; one another engine computed than the config names is
    ``OutdatedCells``. ``attrs["engines"]`` counts the cells of each engine.
    """
    from .ids import cell_id
    from .metadata import with_coordinates
    from .pack import merged_attrs, split
    from .store import load, open_groups
    from .versions import engine_staleness, store_versions, stored_engine, stored_engine_numerics

    sweep = load_sweep(configfile, results)
    _check_experiment(sweep, experiment, configfile)
    points = select_points(sweep, experiment, coords)
    axes = list(sweep.specs[experiment].grid)
    cells: dict[str, xr.Dataset] = {}
    for path in dict.fromkeys(sweep.store_of(p.cell) for p in points):
        if path.exists():
            record, members = load(path, expect=store_versions())
            for ds in open_groups(members, record["groups"], chunks=None):
                cells.update(split(ds.load()))
    missing = [p.coords for p in points if cell_id(p.cell) not in cells]
    if missing:
        summary = sweep.layout.summary(experiment)
        raise NotBuiltError(f"{experiment}: {len(missing)} of {len(points)} cells have no store yet "
                            f"(first: {missing[0]}); `{build_command(configfile, summary)}` simulates them")
    # The engine is no part of a cell's id: a store may hold another engine's numbers than the config
    # names (moved from numba to jax, before `snakemake` recomputes them), as status says (other_engines).
    named = {}  # cell id -> the engine its batch names (another experiment's, where that one names one)
    for batch in {sweep.owner[cell_id(p.cell)] for p in points}:
        named.update((cell_id(c), None if c.engine == "auto" else c.engine) for c in sweep.batches[batch])
    stale = []
    for point in points:
        ds = cells[cell_id(point.cell)]
        if why := engine_staleness(stored_engine(ds), stored_engine_numerics(ds), named[cell_id(point.cell)]):
            stale.append((point.coords, why))
    if stale:
        summary = sweep.layout.summary(experiment)
        raise OutdatedCells(f"{experiment}: {len(stale)} of {len(points)} cells are stale (first: "
                            f"{stale[0][0]}: {stale[0][1]}); `{build_command(configfile, summary)}` "
                            "recomputes them")
    engines: dict[str, int] = {}  # engine: auto takes either's cells: said in the attributes, never dropped
    for ds in (cells[cid] for cid in dict.fromkeys(cell_id(p.cell) for p in points)):
        engines[stored_engine(ds)] = engines.get(stored_engine(ds), 0) + 1
    pieces, bare = [], set()
    for point in points:
        ds = cells[cell_id(point.cell)]
        # Dims without a coordinate (a dimension's index, the matrices' columns) get one for the join, so
        # cells of another d join outward (NaN past their size) instead of refusing to align; it goes again
        # after the join, as the stores have none.
        index = {dim: np.arange(size) for dim, size in ds.sizes.items() if dim not in ds.coords}
        bare.update(index)
        pieces.append(ds.assign_coords(index).expand_dims("cell").assign_coords(
            {a: ("cell", [_plain(point.coords[a])]) for a in axes}))
    if not axes:
        return pieces[0].isel(cell=0, drop=True).drop_vars(bare)
    out = xr.concat(pieces, dim="cell", join="outer", coords="minimal", compat="override",
                    combine_attrs="drop_conflicts").drop_vars(bare)
    # A description naming each cell's threshold: joined, not dropped. A variable some cells lack (flat
    # geometry's norm_change, the sphere's norm_drift) is NaN in the others, described by those that have it.
    for name in out.variables:
        if having := [piece[name].attrs for piece in pieces if name in piece.variables]:
            out[name].attrs = merged_attrs(having)
    out = out.swap_dims(cell=axes[0]) if len(axes) == 1 else out.set_index(cell=axes).unstack("cell")
    out.attrs["engines"] = ", ".join(f"{engine}: {count}" for engine, count in sorted(engines.items()))
    return with_coordinates(out)  # the grid axes: units, long name, description


__all__ = ["NotBuiltError", "NotOnGrid", "OutdatedCells", "OutdatedSummary", "load_sweep", "open_cells",
           "open_summary", "select_points"]
