"""Units, names and descriptions of the variables and coordinates attnflow writes, in CF style.

Every variable and coordinate of a store or summary carries ``units`` (but
labels and flags), ``long_name`` and ``description``. Units follow the CF conventions: ``"1"`` for
a dimensionless quantity, which is every quantity of the model (docs/model.md,
"Units and metadata"), time included: the flow ``dx_i/dt = P_{x_i}(v_i)`` fixes no
time scale, so its time is a pure number, named ``FLOW_TIME`` wherever a
variable is a time or a rate (``attnflow.units``). A count, a fraction and a 0/1 number are ``"1"``
too; a label (strings) and a flag (booleans) carry no ``units``, as CF leaves them out.

Stores get their variables' attributes from ``attnflow.observables`` and
``attnflow.simulation``, their coordinates' from here (``COORDINATES``, and the
``Cell`` field docs for grid axes). Summaries get theirs here, after the
reduction (``describe_summary``): ``SUMMARIES`` by experiment (``metadata.summaries``), then an
experiment's own ``metadata``; a summary variable found in neither is an error
naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..units import CONVENTIONS, FLOW_TIME, TIME_UNITS
from .meta import Meta, _meta
from .summaries import SUMMARIES

if TYPE_CHECKING:
    import xarray as xr


class MissingMetadata(KeyError):
    """A summary variable or coordinate with no declared units, long name and description."""

    def __str__(self):
        return str(self.args[0])


# Coordinates of stores and summaries that are not Cell fields. Cell fields (the grid axes) take their
# description from the field's own doc and their long name from CELL_LONG_NAMES.
COORDINATES: dict[str, Meta] = {
    "seed": Meta("1", "seed", "seed of a run's random draws (initial tokens, drawn heads): the runs of one "
                              "cell differ in it alone"),
    "time": Meta(TIME_UNITS, FLOW_TIME, f"sample time t of the flow dx_i/dt = P_x_i(v_i), in {FLOW_TIME} "
                                        "(the equation fixes no time scale)"),
    "head": Meta("1", "head index", "attention head h = 0..H-1"),
    "token": Meta("1", "token index", "token i = 0..n-1"),
    "cell": Meta("1", "cell id", "the grid cell: a hash of its parameters (attnflow.ids.cell_id)"),
    "beta_fine": Meta("1", "inverse temperature (closed-form map)",
                      "inverse temperature beta on the fine grid the closed-form map is drawn on"),
    "level_fine": Meta("1", "clustering level (closed-form map)",
                       "level of the mean pairwise cosine gamma_mean on the fine grid the closed-form map is "
                       "drawn on"),
}

# Long names of Cell fields (the description is the field's doc); a field not listed here is
# named by its doc up to the first parenthesis.
CELL_LONG_NAMES = {
    "H": "number of heads", "n": "number of tokens", "d": "dimension of the token space",
    "beta": "inverse temperature", "attention": "attention type", "mask": "attention mask",
    "heads": "head structure", "delta": "perturbation norm", "layer": "layer of the trained transformer",
    "lambda_dist": "distribution of the head strengths", "lambda_bar": "mean head strength",
    "spread": "spread of the head strengths", "init": "initial tokens", "geometry": "geometry of the flow",
    "gamma0": "initial pairwise cosine", "cluster_threshold": "threshold of the clustering criterion",
    "cluster_metric": "clustering criterion", "cluster_eps": "cluster merging tolerance",
    "t_max": "integration horizon", "ngpt_alpha": "nGPT step size", "values": "value matrices",
}

def coordinate(name: str) -> Meta | None:
    """A coordinate's metadata: ``COORDINATES``, or a Cell field's (its doc); None for another name."""
    if name in COORDINATES:
        return COORDINATES[name]
    from ..cell import Cell

    field = {f.name: f for f in dataclasses.fields(Cell)}.get(name)
    if field is None:
        return None
    doc = field.metadata["doc"]
    units = TIME_UNITS if name == "t_max" else "1"
    return Meta(units, CELL_LONG_NAMES.get(name, doc.split(" (")[0]), doc)


def unitless(var) -> bool:
    """Whether a variable is a label (strings) or a flag (booleans), to which CF gives no ``units``."""
    return var.dtype.kind in "USObV" or var.dtype == bool


def cf_attrs(meta: Meta, var) -> dict[str, str]:
    """``meta``'s attributes for ``var``: without ``units`` on a label or a flag (``unitless``)."""
    attrs = meta.attrs()
    if unitless(var):
        del attrs["units"]
    return attrs


def with_coordinates(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with every coordinate this module knows described (others left as they are)."""
    for name in ds.coords:
        meta = coordinate(str(name))
        if meta is not None:
            attrs = {**ds[name].attrs, **cf_attrs(meta, ds[name])}
            if unitless(ds[name]):
                attrs.pop("units", None)
            ds[name].attrs = attrs
    return ds


def undescribed(ds: xr.Dataset) -> list[str]:
    """The variables and coordinates of ``ds`` that lack one of units (but labels and flags, which CF
    leaves without), long_name and description."""
    return [str(name) for name, var in ds.variables.items()
            if not all(key in var.attrs for key in ("long_name", "description"))
            or ("units" not in var.attrs) != unitless(var)]


def describe_summary(summary: xr.Dataset, experiment: str, extras: Mapping | None = None) -> xr.Dataset:
    """The summary with every variable and coordinate described: ``SUMMARIES[experiment]``, then
    ``extras`` (the experiment's own ``metadata``: name -> ``Meta`` or ``(units, long_name,
    description)``) over it, then coordinates. Raises ``MissingMetadata`` naming whatever is left."""
    declared = {**SUMMARIES.get(experiment, {}), **{k: _meta(v) for k, v in (extras or {}).items()}}
    for name in summary.variables:
        meta = declared.get(str(name)) or coordinate(str(name))
        if meta is not None:
            summary[name].attrs = cf_attrs(meta, summary[name])  # replaces what a reduction carried over
    missing = undescribed(summary)
    if missing:
        raise MissingMetadata(f"{experiment}: summary variables without units, long_name and description: "
                              f"{', '.join(missing)}; declare them in the experiment's `metadata` "
                              "(name -> (units, long_name, description)) or in attnflow.metadata.SUMMARIES")
    return summary


def summary_attrs(experiment: str, history: str) -> dict[str, str]:
    """The global attributes a summary carries besides its provenance: title, Conventions, history."""
    return {"title": f"attnflow summary of experiment {experiment}", "Conventions": CONVENTIONS,
            "history": history}


def store_attrs(batch: str, cells: int) -> dict[str, str]:
    """The global attributes of a batch's simulation store: title, Conventions, history. The history
    names no time: a store's bytes are its numbers' alone (the same cells give the same file)."""
    from ..numerics import NUMERICS_VERSION
    from ..version import __version__

    return {"title": f"attnflow simulations of batch {batch}", "Conventions": CONVENTIONS,
            "history": f"attnflow {__version__}: {cells} cells of batch {batch} simulated (numerics version "
                       f"{NUMERICS_VERSION}), one group per shape, each cell's grid values coordinates "
                       "along cell"}


__all__ = ["CELL_LONG_NAMES", "CONVENTIONS", "COORDINATES", "FLOW_TIME", "SUMMARIES", "TIME_UNITS", "Meta",
           "MissingMetadata", "cf_attrs", "coordinate", "describe_summary", "store_attrs", "summary_attrs",
           "undescribed", "unitless", "with_coordinates"]
