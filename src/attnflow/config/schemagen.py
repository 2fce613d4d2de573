"""A config's JSON schema, generated from ``Cell``'s fields and the experiment registry (a new field,
attention type, head structure or experiment reaches it with no edit here), its top-level keys with their
defaults, and a schema error as one line naming the key and value."""

from __future__ import annotations

import dataclasses
import math

import jsonschema

from ..cell import _DEFAULTS as CELL_DEFAULTS
from ..cell import FIELD_CHOICES, FIELD_DOCS, Cell
from ..experiments import registry
from ..observables import GROUPS

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
