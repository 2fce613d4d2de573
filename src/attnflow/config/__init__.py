"""Sweep configs: strict loading, the generated schema, and validation before any job runs.

A config is YAML with ``results``, ``dask_scheduler``, ``experiment_modules``,
``defaults`` (cell fields shared by every experiment) and ``experiments`` (one
block per experiment: ``fixed``, ``grid``, ``batch_over``, ``extra_points``). The
schema is generated from ``Cell``'s fields and the experiment registry, so a new
field, attention type, head structure or experiment reaches it with no edit here.

This package is the one owner of checking a config's content; every error is one
``ConfigError`` line naming the offending key and value. It checks, in order: the
YAML (``load``, in ``reader``), the experiment modules, the schema (``schemagen``),
``results`` and the scheduler, then each experiment block (``blocks``): its extra
points, ``batch_over`` and grid values, the files it names (the experiment's
``inputs``), every cell (``Cell``'s own ``ValueError``, turned into a
``ConfigError`` naming the experiment and grid point) and what the experiment
declares it needs (``axes``, ``pinned``, ``fixed_only``, ``bounds``; see
``attnflow.experiments.Experiment``). Experiments declare, this package
evaluates; ``attnflow.sweep`` then only expands the checked config into
cells and batches (``config`` imports ``sweep``, never the reverse).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema

from ..errors import ConfigError
from ..experiments import Experiment, ExperimentModuleError, registry
from ..layout import Layout, results_of
from ..spec import Spec
from ..sweep import EngineConflict, Point, Sweep, resolve
from .blocks import (
    _canonical,
    check_block,
    check_fixed_off_grid,
    check_grid,
    check_inputs,
    check_needs,
    check_read,
    points_of,
    where,
)
from .reader import check_utf8, load
from .schemagen import FIGURE_WIDTHS, SCHEDULERS, SEED_MAX, TOP_LEVEL, _schema_message, schema


# --- validation ------------------------------------------------------------------------------------
def check_results(results) -> None:
    """A ``results`` value names a directory that can be made (``None``: the default, always fine)."""
    if results is None:
        return
    if not isinstance(results, str) or not results.strip():
        raise ConfigError(f"results = {results!r}: must name an output directory")
    # Snakemake reads braces in an output path as wildcards (a WildcardError at the first rule).
    if "{" in results or "}" in results:
        raise ConfigError(f"results = {results!r}: braces are wildcards to Snakemake; name a directory "
                          "without { or }")
    if any(c in results for c in "\n\r\t\0"):
        raise ConfigError(f"results = {results!r}: holds a control character (a line break, a tab); name a "
                          "directory on one line")
    if results.startswith("~") and os.path.expanduser(results) == results:
        raise ConfigError(f"results = {results!r}: cannot expand {results.split('/')[0]!r} (no such user "
                          "or no home directory); write the path out")
    results = os.path.expanduser(results)
    if Path(results).resolve() == Path(Path(results).resolve().anchor):
        raise ConfigError(f"results = {results!r}: the filesystem root; name a directory for the outputs")
    where = Path(results).resolve()
    if (where / "Snakefile").is_file() or (where / "pyproject.toml").is_file():
        raise ConfigError(f"results = {results!r}: the working copy itself ({where}), whose files the "
                          "outputs would mix with; name a directory of its own (results/<name>)")
    # The first path that exists on the way down must be a directory, or every write below fails late.
    for path in (Path(results), *Path(results).parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == Path(results) else f" ({path} is a file)"
                raise ConfigError(f"results = {results!r}: not a directory{where}; name a directory for the "
                                  "outputs")
            break


def check_scheduler(name: str, timeout: float = 2.0) -> None:
    """A ``tcp://host:port`` scheduler must accept a connection now, not after every simulation."""
    if name in SCHEDULERS:
        return
    parts = urlsplit(name)
    try:
        port = parts.port
    except ValueError:  # not a number, or outside 0-65535
        port = None
    if parts.scheme != "tcp" or not parts.hostname or not port:
        raise ConfigError(f"dask_scheduler = {name!r}: expected {', '.join(SCHEDULERS)} or tcp://host:port "
                          "(a port from 1 to 65535)")
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(f"dask_scheduler = {name!r}: no scheduler answers there ({err})") from None


def experiment_registry(modules):
    """The built-in experiments and those of ``experiment_modules``, each module importable and
    defining an ``EXPERIMENT`` that declares its needs (an old-style ``check`` method is refused,
    since nothing would call it)."""
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"experiment_modules = {modules!r}: must be a list of module names")
    try:
        experiments = registry(modules)
    except (ExperimentModuleError, ValueError) as err:  # ValueError: a name declared twice
        raise ConfigError(f"experiment_modules: {err}") from None
    for exp in experiments:
        if hasattr(exp, "check"):
            raise ConfigError(f"experiment_modules: experiment {exp.name} defines check(), which nothing "
                              "calls; declare what it needs as axes, pinned, fixed_only, bounds or inputs "
                              "(attnflow.experiments.Experiment)")
    return experiments


def validate(config: dict, *, reach_scheduler: bool = True, configfile: str | Path | None = None):
    """Check a whole config before any job; return the ``Sweep`` it describes.

    Raises ``ConfigError`` (one line, naming the key and value) on the first
    problem: schema, results path, scheduler address, grids with repeated
    values, impossible cells, and what each experiment's figure needs.
    ``configfile``: the file the config was read from, whose name gives the
    results directory of a config without ``results`` (``layout.results_of``);
    the sweep's config holds the resolved directory. The points ``attnflow
    refine`` recorded in that directory join their experiments' extra points.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"the config must be a mapping, got {type(config).__name__}")
    experiments = experiment_registry(config.get("experiment_modules", []))
    unknown = [k for k in (config.get("experiments") or {}) if k not in experiments]
    if unknown:
        raise ConfigError(f"experiments.{unknown[0]}: unknown experiment "
                          f"(known: {', '.join(experiments.names())})")
    validator = jsonschema.Draft202012Validator(schema(experiments))
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        raise ConfigError(_schema_message(error))
    check_results(config.get("results"))
    config = {**config, "results": str(results_of(config, configfile))}
    if reach_scheduler:
        check_scheduler(config.get("dask_scheduler", TOP_LEVEL["dask_scheduler"][0]))
    specs, skipped = resolve(config, experiments)
    refinement = Layout(config["results"]).refinement
    unrefined, specs = specs, with_refinement(specs, refinement, experiments)
    if not specs:
        raise ConfigError("experiments: empty, nothing to run")
    points = {}
    for name, spec in specs.items():
        try:
            points.update(check_experiment(experiments.get(name), spec, config["experiments"][name], skipped))
        except ConfigError as err:
            if spec is unrefined[name]:
                raise
            # The refined points' fault if the config's own grid passes: the file is named, not the config.
            check_experiment(experiments.get(name), unrefined[name], config["experiments"][name], skipped)
            raise ConfigError(f"{refinement}: a point attnflow refine recorded for {name} is refused now: "
                              f"{err}; delete the file to drop the refined points") from None
    if not points:
        raise ConfigError("experiments: none can run here ("
                          + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + ")")
    try:
        return Sweep.expand(config, experiments, specs, points, skipped)
    except EngineConflict as err:
        raise ConfigError(str(err)) from None


def check_experiment(experiment: Experiment, spec: Spec, block: dict | None,
                     skipped) -> dict[str, list[Point]]:
    """Every check of one experiment block; its grid points (none for one ``skipped`` on this machine)."""
    check_block(spec)
    check_fixed_off_grid(spec, block)
    check_inputs(experiment, spec)
    if spec.name in skipped:  # one that cannot run on this machine has no cells to check
        return {}
    points = points_of(spec)
    check_read(spec, block, points)
    check_needs(experiment, spec, points)
    return {spec.name: points}


def refined_points(path: Path) -> dict[str, list[dict]]:
    """The points ``attnflow refine`` recorded (``Layout.refinement``): experiment -> its points. A record
    that is not one (unreadable, an experiment's entry or ``points`` of another shape, a point that is no
    mapping) is refused, naming the file: none of its points is dropped unsaid."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: the points attnflow refine added are unreadable ({err}); delete the file "
                          "to drop them, or restore it") from None
    experiments = record.get("experiments") if isinstance(record, dict) else None
    if not isinstance(experiments, dict):
        raise ConfigError(f"{path}: not a record of attnflow refine (no 'experiments'); delete the file to "
                          "drop it")
    out = {}
    for name, entry in experiments.items():
        points = entry.get("points", []) if isinstance(entry, dict) else entry
        if not isinstance(points, list):
            bad = f"{name}.points = {json.dumps(points)[:80]}: not a list of points"
        else:
            bad = next((f"{name}.points[{i}] = {json.dumps(p)[:80]}: not a point (axis -> value)"
                        for i, p in enumerate(points) if not isinstance(p, dict)), None)
        if bad:
            raise ConfigError(f"{path}: experiments.{bad}; restore the file, or delete it to drop every "
                              "refined point")
        out[name] = points
    return out


def _on_grid(spec: Spec, point: dict, along: str | None) -> bool:
    """Whether a refined point still refines this grid: every axis but the one it was refined along at a
    grid value, and that one inside the grid's range (a refinement splits brackets between grid values)."""
    for axis, values in spec.grid.items():
        if axis == along:
            numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            value = point[axis]
            if numbers and not (isinstance(value, (int, float)) and min(numbers) <= value <= max(numbers)):
                return False
        elif _canonical(point[axis]) not in {_canonical(v) for v in values}:
            return False
    return True


def with_refinement(specs: dict[str, Spec], path: Path, experiments=None) -> dict[str, Spec]:
    """The specs with the refined points recorded at ``path`` added to their extra points: a refined
    grid stays refined for every later run. A point that no longer refines its grid (the grid was edited
    since: it does not give exactly the grid's axes, or one of its values left the grid, say ``n = 4``
    removed) is left out, with a warning naming the file and the points; putting the values back brings
    it back. ``experiments``: the registry, which names each experiment's ``refine_axis``."""
    refined = refined_points(path)
    out = dict(specs)
    for name, points in refined.items():
        if name not in specs or not points:
            continue
        spec = specs[name]
        along = experiments.get(name).refine_axis if experiments is not None and name in experiments else None
        fitting = [p for p in points if set(p) == set(spec.grid)]
        if len(fitting) < len(points):
            warnings.warn(f"{path}: {len(points) - len(fitting)} refined points of {name} do not give its "
                          f"grid's axes ({', '.join(spec.grid) or 'none'}) any more: left out (delete the "
                          "file, or run attnflow refine again)", stacklevel=3)
        off = [p for p in fitting if not _on_grid(spec, p, along)]
        if off:
            warnings.warn(f"{path}: {len(off)} refined points of {name} lie off its grid as edited (the "
                          f"first: {json.dumps(off[0])}): left out of the grid; put the grid's values back "
                          "to bring them back, or delete the file to drop every refined point", stacklevel=3)
            fitting = [p for p in fitting if _on_grid(spec, p, along)]
        if fitting:
            out[name] = dataclasses.replace(spec, extra_points=(*spec.extra_points, *map(dict, fitting)))
    return out


__all__ = ["FIGURE_WIDTHS", "SCHEDULERS", "SEED_MAX", "TOP_LEVEL", "ConfigError", "check_block", "check_grid",
           "check_inputs", "check_needs", "check_results", "check_scheduler", "check_utf8",
           "experiment_registry", "load", "points_of", "refined_points", "schema", "validate", "where",
           "with_refinement"]
