"""Tables for a paper: an experiment's measured thresholds, boundaries and exponents, one row per grid line.

The numbers live in the summary stores (and the figures); ``attnflow export``
writes them as CSV (with a CSVW metadata file beside it) or JSON, each column
with its description and units, each table with its provenance. Each
experiment declares its table (``Experiment.export_table``); an experiment
without a threshold, boundary or fitted exponent declares none and says so,
instead of exporting its raw summary; the helpers those declarations share are
``attnflow.tables``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

STDOUT = "-"


PROVENANCE = ("title", "config_sha256", "attnflow_version", "numerics_version", "reduction_version",
              "engines", "certificate_error", "history", "Conventions")


def export(experiment: str, configfile, results=None) -> pd.DataFrame:
    """The export table of ``experiment`` from its verified summary (``attnflow.open_summary``), with the
    experiment, its theorem and the summary's provenance in ``DataFrame.attrs``."""
    from .access import load_sweep, open_summary

    summary = open_summary(experiment, configfile, results=results)
    sweep = load_sweep(configfile, results)
    exp = sweep.experiments.get(experiment)
    df = exp.export_table(summary)
    provenance = {k: _plain(summary.attrs[k]) for k in PROVENANCE if k in summary.attrs}
    df.attrs.update({"experiment": experiment, "theorem": exp.theorem, "question": exp.question,
                     "configfile": str(configfile), "summary": str(sweep.layout.summary(experiment)),
                     **provenance})
    return df


def output_problem(path: str, option: str) -> str | None:
    """Why ``path`` cannot take the table (None: it can): checked before anything is computed, so that a
    bad path costs one line and leaves nothing half-written. ``-`` is stdout."""
    if path == STDOUT:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{option} {path}: is a directory (name a file in it)"
    if target.exists():
        try:  # append: opens for writing without touching the content
            with open(target, "ab"):
                pass
        except OSError as err:
            return f"{option} {path}: cannot write ({err.strerror})"
        return None
    parent = next(p for p in target.absolute().parents if p.exists())
    if not parent.is_dir():
        return f"{option} {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create files in {parent} (permission denied)"
    return None


def metadata_path(csv_path) -> Path:
    """The CSVW metadata file of a CSV file: ``<file>-metadata.json`` beside it (CSVW's own convention)."""
    return Path(f"{csv_path}-metadata.json")


def _plain(value):
    if value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _columns(df: pd.DataFrame) -> dict[str, dict]:
    docs, units = df.attrs.get("columns", {}), df.attrs.get("units", {})
    out = {}
    for name in df.columns:
        out[name] = {"description": docs.get(name, "")}
        if units.get(name) is not None:
            out[name]["units"] = units[name]
    return out


def _provenance(df: pd.DataFrame) -> dict:
    return {k: _plain(v) for k, v in df.attrs.items() if k not in ("columns", "units")}


def _open(path):
    """A text stream for ``path`` (stdout for ``-``), its folders made."""
    if path == STDOUT:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", newline="")


DATATYPES = {"i": "integer", "u": "integer", "f": "double", "b": "boolean"}  # numpy kind -> CSVW (XSD)


def _xsd_double(value: float) -> str:
    """A float as CSV text: 10 significant digits, INF and -INF, empty for NaN (not measured)."""
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return f"{value:.10g}"


def write_csv(df: pd.DataFrame, path) -> None:
    """The table as CSV (empty field: not measured on this grid; ``INF``: unbounded), and beside a file
    its CSVW metadata (``metadata_path``): every column's description, units and datatype, the table's
    experiment, theorem and provenance. To stdout (``-``) the CSV alone."""
    import sys

    stream = _open(path)
    # Infinities as XSD spells them (INF, -INF: the lexical forms of a CSVW double), not Python's "inf".
    out = df.copy()
    for name in out.columns:
        if out[name].dtype.kind == "f":
            out[name] = [_xsd_double(v) for v in out[name]]
    out.to_csv(stream or sys.stdout, index=False)
    if stream is None:
        return
    stream.close()
    meta = _provenance(df)
    columns = []
    for name, about in _columns(df).items():
        kind = df[name].dtype.kind
        column = {"name": name, "titles": name, "dc:description": about["description"],
                  "datatype": DATATYPES.get(kind, "string")}
        if "units" in about:
            column["schema:unitText"] = about["units"]
        columns.append(column)
    sidecar = {
        "@context": "http://www.w3.org/ns/csvw",
        "url": Path(path).name,
        "dc:title": f"attnflow export: {meta.get('experiment', '')} ({meta.get('theorem', '')})",
        "dc:description": meta.get("question", ""),
        "dc:source": meta.get("summary", ""),
        "dialect": {"header": True},
        "null": "",
        "tableSchema": {"columns": columns},
        "dc:provenance": meta,
    }
    metadata_path(path).write_text(json.dumps(sidecar, indent=1) + "\n")


def write_json(df: pd.DataFrame, path) -> None:
    """The table as ``{experiment, theorem, question, provenance..., columns: {name: {description, units}},
    rows: [...]}``; NaN is null (not measured on this grid), infinities are the strings "inf" and "-inf"
    (an interval unbounded on that side). ``-``: stdout."""
    import sys

    out = {**_provenance(df), "columns": _columns(df),
           "rows": [{k: _plain(v) for k, v in row.items()} for row in df.to_dict(orient="records")]}
    stream = _open(path)
    (stream or sys.stdout).write(json.dumps(out, indent=1) + "\n")
    if stream is not None:
        stream.close()


__all__ = ["export", "metadata_path", "output_problem", "write_csv", "write_json"]
