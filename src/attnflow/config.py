"""Sweep configs: strict loading, the generated schema, and validation before any job runs.

A config is YAML with ``results``, ``dask_scheduler``, ``experiment_modules``,
``defaults`` (cell fields shared by every experiment) and ``experiments`` (one
block per experiment: ``fixed``, ``grid``, ``batch_over``, ``extra_points``). The
schema is generated from ``Cell``'s fields and the experiment registry, so a new
field, attention type, head structure or experiment reaches it with no edit here.

This module is the one owner of checking a config's content; every error is one
``ConfigError`` line naming the offending key and value. It checks, in order: the
YAML (``load``), the experiment modules, the schema, ``results`` and the scheduler,
then each experiment block: its extra points, ``batch_over`` and grid values, the
files it names (the experiment's ``inputs``), every cell (``Cell``'s own
``ValueError``, turned into a ``ConfigError`` naming the experiment and grid point)
and what the experiment declares it needs (``axes``, ``pinned``, ``fixed_only``,
``bounds``; see ``attnflow.experiments.Experiment``). Experiments declare, this
module evaluates; ``attnflow.sweep`` then only expands the checked config into
cells and batches (``config`` imports ``sweep``, never the reverse).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml

from .cell import _DEFAULTS as CELL_DEFAULTS
from .cell import CONDITIONAL_FIELDS, FIELD_CHOICES, FIELD_DOCS, Cell, readers_of
from .errors import ConfigError
from .experiments import Experiment, ExperimentModuleError, registry
from .layout import Layout, results_of
from .observables import GROUPS
from .spec import Spec
from .sweep import EngineConflict, Point, Sweep, point, resolve

SCHEDULERS = ("threads", "synchronous", "distributed")
SEED_MAX = 2**63 - 1
FIGURE_WIDTHS = (3.5, 12.0)  # inches: a journal column to a poster panel; the figures are laid out for these
TOP_LEVEL = {
    "results": (None, "output directory (stores, summaries, figures, logs), one per config: default "
                      "results/<the config file's name without .yaml>; ~ is expanded; not empty, not /, no "
                      "braces"),
    "share_results": (False, "run on a results directory another config ran on, taking it over: its batches "
                             "of the same name lose the other config's cells, its summaries and figures are "
                             "rebuilt from this config (without it such a run is refused, naming what it "
                             "would drop); on the command line: snakemake --config share_results=True"),
    "dask_scheduler": ("threads", "aggregation scheduler: threads, synchronous, distributed (a local "
                                  "dask.distributed cluster) or the address tcp://host:port of a running "
                                  "scheduler"),
    "figure_width": (7.0, f"width of every figure in inches ({FIGURE_WIDTHS[0]:g} to {FIGURE_WIDTHS[1]:g}), "
                          "the width it is printed at (7: a journal's text width; 3.5: a column); no text in "
                          "a figure is smaller than 7 pt at that width"),
    "experiment_modules": ([], "importable modules that each define an EXPERIMENT, added to the "
                               "built-in experiments"),
    "defaults": ({}, "cell fields for every experiment: a block's fixed values win over them, they win "
                     "over the experiment's own defaults"),
    "experiments": (None, "the experiments to run: name -> block with fixed, grid, batch_over, extra_points"),
    "refinement": ([], "the rounds an older `attnflow refine` recorded in a copy of the config (a record; "
                       "ignored: refine now records its points in the results directory, refinement.json)"),
    "retry_failures": (False, "compute known failures again (seeds or cells the numbers failed, which "
                              "runs otherwise skip until their cell or the numerics change): "
                              "`snakemake --config retry_failures=True`"),
}


# --- loading ---------------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (YAML keeps the last silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor`: merged keys may be overridden by the explicit ones
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"{loader.name}: key {key!r} appears twice (lines {seen[key] + 1} and "
                              f"{key_node.start_mark.line + 1}); YAML would keep the last one silently")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _no_octal(loader, node):
    """An integer written with a leading zero (``010``) is octal to YAML 1.1 (8): refused, not guessed."""
    text = loader.construct_scalar(node)
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    if re.fullmatch(r"[-+]?0[0-9_]+", text):
        raise ConfigError(f"{loader.name}: line {node.start_mark.line + 1}: {text} has a leading zero, which "
                          f"YAML reads as the octal number {value}; write it without the zero")
    return value


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _no_octal)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A parser's error in one line: the line of the problem, the problem, and what it was parsing
    where (its own message spreads these over several lines, the problem last)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if not problem or mark is None:
        return f"not valid YAML: {str(err).splitlines()[0]}"
    context, where = getattr(err, "context", None), getattr(err, "context_mark", None)
    within = f" ({context} at line {where.line + 1})" if context and where and where.line != mark.line else ""
    return f"line {mark.line + 1}: not valid YAML: {problem}{within}"


def _utf8_text(path: Path) -> str:
    """The config file's text; ``ConfigError`` naming the file and line where it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {err.object[err.start]:#04x}); save "
                          "the config as UTF-8") from None


def check_utf8(path: str | Path) -> None:
    """``ConfigError`` (``load``'s message) for a config file that is not UTF-8, which Snakemake's own
    reader stops at with a traceback naming no file; the Snakefile checks its default config with it
    before Snakemake reads it. A file that cannot be read is left to Snakemake to report."""
    try:
        _utf8_text(Path(path))
    except OSError:
        pass


def load(path: str | Path) -> dict:
    """Read a config file strictly: duplicated keys and malformed YAML are ``ConfigError``."""
    path = Path(path)
    try:
        text = _utf8_text(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        config = loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    finally:
        loader.dispose()
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping, got {type(config).__name__}")
    return config


# --- schema ----------------------------------------------------------------------------------------
def _field_schema(field: dataclasses.Field) -> dict:
    name = field.name
    if name == "seeds":
        # Seeds seed numpy's generators, which take at most 64 bits: refused here, not after integrating.
        out = {"oneOf": [{"type": "integer", "minimum": 1, "maximum": SEED_MAX},
                         {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
                          "minItems": 1}]}
    elif name == "observables":
        out = {"type": "array", "items": {"type": "string", "enum": list(GROUPS.names())}}
    elif name == "head_subset":
        out = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    elif name in FIELD_CHOICES:
        out = {"type": "string", "enum": list(FIELD_CHOICES[name])}
    else:
        out = {"type": {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}[field.type]}
    default = CELL_DEFAULTS[name]
    out["description"] = FIELD_DOCS[name]
    out["default"] = list(default) if isinstance(default, tuple) else default
    return out


GRID_DESCRIPTION = "grid axes: cell field -> non-empty list of values; the cells are their product"
# Cell fields that are no grid axis, and why (said where a grid or an extra point gives one).
NOT_AXES = {
    "observables": "the groups a cell records: list them under fixed",
    # The engine is no part of a cell's id: a grid over engines would name each cell twice, one store.
    "engine": "the engine is no part of a cell (one store per cell, whichever engine computed it), so a "
              "grid over engines repeats each cell: give it under fixed; to compare engines, run a config "
              "per engine, each with its own results",
}


def schema(experiments=None) -> dict:
    """The JSON schema of a config, generated from ``Cell`` and the experiment registry."""
    experiments = experiments if experiments is not None else registry()
    fields = {f.name: _field_schema(f) for f in dataclasses.fields(Cell)}
    cell_fields = {"type": "object", "additionalProperties": False, "properties": fields,
                   "description": "cell fields (see attnflow.Cell)"}
    grid = {"type": "object", "additionalProperties": False, "properties": {
        name: {"type": "array", "minItems": 1, "items": {k: v for k, v in spec.items()
                                                          if k not in ("description", "default")},
               "description": f"values of {name}: {FIELD_DOCS[name]}"}
        for name, spec in fields.items() if name not in NOT_AXES
    }, "description": GRID_DESCRIPTION}
    blocks = {}
    for exp in experiments:
        blocks[exp.name] = {
            "type": "object", "additionalProperties": False,
            "description": f"{exp.theorem}: {exp.question}",
            "default": exp.defaults,
            "properties": {
                "fixed": {**cell_fields, "description": "cell fields fixed for this experiment"},
                "grid": grid,
                "batch_over": {"type": "array", "items": {"type": "string", "enum": list(fields)},
                               "description": "grid axes whose values share one simulation job"},
                "extra_points": {"type": "array", "items": {**grid, "minProperties": 1, "properties": {
                    name: {k: v for k, v in spec.items() if k not in ("description", "default")}
                    for name, spec in fields.items() if name not in NOT_AXES}},
                                 "description": "grid points beyond the product of the grid's axes, each "
                                                "giving every grid axis (attnflow refine writes them)"},
            },
        }
    top = {key: {"description": doc} for key, (_, doc) in TOP_LEVEL.items()}
    for key, (default, _) in TOP_LEVEL.items():
        if default is not None:
            top[key]["default"] = default
    top["results"]["type"] = "string"
    top["share_results"]["type"] = "boolean"
    top["dask_scheduler"]["type"] = "string"
    top["dask_scheduler"]["pattern"] = "^(" + "|".join(SCHEDULERS) + r"|tcp://.+)$"
    top["figure_width"].update({"type": "number", "minimum": FIGURE_WIDTHS[0], "maximum": FIGURE_WIDTHS[1]})
    top["experiment_modules"].update({"type": "array", "items": {"type": "string"}})
    top["refinement"].update({"type": "array", "items": {"type": "object"}})
    top["retry_failures"]["type"] = "boolean"
    top["defaults"].update(cell_fields)
    top["experiments"].update({"type": "object", "minProperties": 1, "additionalProperties": False,
                               "properties": blocks})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "description": "attnflow sweep configuration", "type": "object",
            "additionalProperties": False, "required": ["experiments"], "properties": top}


def _schema_message(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator == "enum":
        return f"{where} = {error.instance!r}: must be one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        # A grid's or an extra point's (whose schema is the grid's) field that is no axis.
        axis = next((key for key in unknown if key in NOT_AXES), None)
        if axis and error.schema.get("description") == GRID_DESCRIPTION:
            return f"{where}.{axis} = {error.instance[axis]!r}: not a grid axis: {NOT_AXES[axis]}"
        return (f"{where}: unknown key {', '.join(map(repr, unknown))} (allowed: {', '.join(allowed)})")
    message = error.message if len(error.message) < 200 else error.message[:200] + "..."
    return f"{where}: {message}{_number_hint(error)}"


def _number_hint(error: jsonschema.ValidationError) -> str:
    """A number YAML read as a string, where a number was expected: YAML 1.1 reads an exponent without
    a dot and a sign (``1e-8``) so, and any number in quotes. Says how to write it."""
    instance = error.instance
    if not isinstance(instance, str):
        return ""
    try:
        value = float(instance)
    except ValueError:
        return ""
    if not math.isfinite(value):  # 'nan', 'inf': no way of writing them is accepted
        return ""
    if "e" not in instance.lower():
        return f" ({instance!r} is a string to YAML: write the number without quotes)"
    if _wants_integer(error.schema):
        return (f" ({instance!r} is a string to YAML: write the integer in digits, {int(value)})"
                if value.is_integer() else "")
    return f" ({instance!r} is a string to YAML: write an exponent with a dot and a sign, e.g. {value:.1e})"


def _wants_integer(schema) -> bool:
    """Whether a schema (or one of its ``anyOf`` choices: a seed count or list) takes an integer."""
    if not isinstance(schema, dict):
        return False
    return schema.get("type") == "integer" or any(_wants_integer(s) for s in schema.get("anyOf", ()))


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


# --- the experiment blocks -------------------------------------------------------------------------
def where(spec: Spec, key: str) -> str:
    """The config key of a cell field in an experiment block: ``experiments.<name>.grid.<key>`` on a
    grid axis, else ``experiments.<name>.fixed.<key>`` (where the value came from the defaults too)."""
    return f"experiments.{spec.name}.{'grid' if key in spec.grid else 'fixed'}.{key}"


def _canonical(value):
    """Numbers compared as values: 1 and 1.0 are one grid value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return repr(float(value)) if math.isfinite(value) else repr(value)


def check_grid(name: str, grid: dict) -> None:
    """Each grid value once (1 and 1.0 are one value), and each a single value: a list (say
    ``seeds: [[0, 1], [2, 3]]``) would name a batch and a store by its text."""
    for axis, values in grid.items():
        seen = {}
        for value in values:
            if isinstance(value, (list, tuple, dict)):
                raise ConfigError(f"experiments.{name}.grid.{axis}: {value!r} is a {type(value).__name__}; "
                                  "a grid axis takes single values (a list-valued field such as seeds "
                                  "goes under fixed)")
            key = _canonical(value)
            if key in seen:
                raise ConfigError(f"experiments.{name}.grid.{axis}: {seen[key]!r} and {value!r} are the "
                                  "same value (each value once)")
            seen[key] = value


def check_fixed_off_grid(spec: Spec, block: dict | None) -> None:
    """A field the block fixes is not also a grid axis (its own grid's or, without one, the experiment's
    default grid), where the grid would win and the fixed value be dropped without a word."""
    fixed = (block or {}).get("fixed") or {}
    for key in fixed:
        if key in spec.grid:
            grid = "the block's grid" if "grid" in (block or {}) else \
                "the experiment's default grid (the block gives none)"
            raise ConfigError(f"experiments.{spec.name}.fixed.{key} = {fixed[key]!r}: {key} is also an axis "
                              f"of {grid}, {spec.grid[key]!r}, which would win; keep one: drop it from "
                              f"fixed, or give a grid without {key}")


def check_read(spec: Spec, block: dict | None, points: list[Point]) -> None:
    """A field the block sets (fixed or grid) away from its default that no cell of the block reads (say
    ``gamma0`` beside ``init: uniform``) is refused: each cell drops it (``Cell._canonicalise``), and
    the figure would carry a setting that changed nothing."""
    block = block or {}
    given = {**(block.get("fixed") or {}), **(block.get("grid") or {})}
    for key, value in given.items():
        values = value if key in (block.get("grid") or {}) else [value]
        if key not in CONDITIONAL_FIELDS or all(_at_default(key, v) for v in values):
            continue
        if not any(key in p.cell.used_fields() for p in points):
            remedy = "add clusters to observables" if key == "cluster_eps" else \
                "give the choice that reads it"
            raise ConfigError(f"{where(spec, key)} = {value!r}: no cell of this experiment reads {key}; "
                              f"it is read only {readers_of(key)}: drop it, or {remedy}")


def _at_default(key: str, value) -> bool:
    """Whether a config's value of a field is its default, as ``Cell`` normalises it (a list for a
    sequence field: ``head_subset: []`` is the default ``()``)."""
    default = CELL_DEFAULTS[key]
    return (tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value) == default


def check_block(spec: Spec) -> None:
    """A block's own shape: each extra point gives exactly the grid axes, each ``batch_over`` axis is
    on the grid, each grid value is a single value and appears once."""
    for extra in spec.extra_points:
        if set(extra) != set(spec.grid):
            raise ConfigError(f"experiments.{spec.name}.extra_points: {extra!r} must give exactly the "
                              f"grid axes ({', '.join(spec.grid)})")
    for axis in spec.batch_over:
        if axis not in spec.grid:
            raise ConfigError(f"experiments.{spec.name}.batch_over: {axis!r} is not a grid axis "
                              f"(grid: {', '.join(spec.grid) or 'none'})")
    check_grid(spec.name, spec.grid)


def check_inputs(experiment: Experiment, spec: Spec) -> None:
    """Every value of a field the experiment declares under ``inputs`` names a file that exists."""
    for key, problem_of in experiment.inputs.items():
        for value in spec.values(key):
            problem = problem_of(value)
            if problem:
                raise ConfigError(f"{where(spec, key)} = {value!r}: {problem}")


def points_of(spec: Spec) -> list[Point]:
    """The grid points of a spec (``attnflow.sweep.point``); a cell ``Cell`` refuses is a
    ``ConfigError`` naming the experiment and the grid point, then Cell's own message (the field)."""
    from .resources import oversized, size

    points, sized = [], set()
    for coords in spec.coordinates():
        at = f" (grid point {coords})" if coords else ""
        try:
            points.append(point(spec, coords))
        except TypeError as err:  # a field Cell does not have
            raise ConfigError(f"experiments.{spec.name}: {err}") from None
        except ValueError as err:
            raise ConfigError(f"experiments.{spec.name}{at}: {err}") from None
        cell = points[-1].cell
        of = size(cell)
        if of not in sized:
            sized.add(of)
            too_large = oversized(of)
            if too_large:
                raise ConfigError(f"experiments.{spec.name}{at}: {too_large}")
    return points


def check_needs(experiment: Experiment, spec: Spec, points: list[Point]) -> None:
    """What the experiment declares its figure needs, in order: no causal mask unless the figure is
    drawn over ``mask`` (the paper's closed forms are for unmasked attention), its ``pinned`` fields
    at their values, its ``fixed_only`` fields off the grid, enough values of each of its ``axes``
    (and the values they require), every value of a ``bounds`` field inside its range, and no grid
    axis the figure is not drawn over (unless it ``averages_other_axes``)."""
    name = experiment.name
    if "mask" not in {axis.name for axis in experiment.axes} and spec.values("mask") != ["none"]:
        raise ConfigError(f"{where(spec, 'mask')} = {spec.values('mask')!r}: the {name} figure draws closed "
                          "forms of unmasked attention; masks are compared in the variants experiment")
    for key, (value, why) in experiment.pinned.items():
        if key in spec.grid or spec.fixed.get(key) != value:
            raise ConfigError(f"experiments.{name}.fixed.{key}: must be {value} ({why})")
    for key, why in experiment.fixed_only.items():
        if key in spec.grid:
            raise ConfigError(f"experiments.{name}.grid.{key} = {spec.grid[key]!r}: must be fixed ({why})")
    for axis in experiment.axes:
        values = spec.values(axis.name)
        why = f" ({axis.why})" if axis.why else ""
        if len(values) < axis.min_values:
            raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure needs at least "
                              f"{axis.min_values} values{why}")
        for value in axis.required:
            if value not in values:
                raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure needs "
                                  f"{value!r} among them{why}")
        for value in values if axis.allowed else ():
            if value not in axis.allowed:
                raise ConfigError(f"{where(spec, axis.name)} = {values!r}: the {name} figure draws only "
                                  f"{', '.join(map(str, axis.allowed))}, not {value!r}{why}")
    for bound in experiment.bounds:
        for p in points:
            low, high = bound.ends(p.cell)
            value = p.coords.get(bound.key, spec.fixed.get(bound.key))
            if not low < getattr(p.cell, bound.key) < high:
                ends = f"({low:.4g}, {high:.4g})"
                if bound.low_text or bound.high_text:
                    ends = f"{bound.describe()} = {ends}"
                raise ConfigError(f"{where(spec, bound.key)}: {value!r} must lie in {ends}")
    drawn = [axis.name for axis in experiment.axes]
    for key in () if experiment.averages_other_axes else spec.grid:
        if key not in drawn:
            raise ConfigError(f"experiments.{name}.grid.{key} = {spec.grid[key]!r}: the {name} figure is "
                              f"drawn over {', '.join(drawn)}, with no panel for {key}; fix it under fixed "
                              "(one value), or run each value from its own config")


__all__ = ["ConfigError", "check_block", "check_grid", "check_inputs", "check_needs", "check_results",
           "check_scheduler", "experiment_registry", "load", "points_of", "refined_points", "schema",
           "validate", "where", "with_refinement"]
