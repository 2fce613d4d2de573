"""A batch's cells in one store: cells of one shape stacked along ``cell``, one group per shape.

A batch's cells differ along its experiment's ``batch_over`` axes, some of
which change shapes (``n`` the token axis, ``H`` the head axis). Cells whose
variables, shapes, dtypes and coordinates agree share a group (``g0``,
``g1``, ...) where each variable gains a leading ``cell`` dimension, indexed by
cell id. So a store holds one chunk per variable and group, whatever the
number of cells, and an experiment's reduction runs once per group on every
cell at once. A cell's attributes (its parameters, solver statistics,
accuracy certificate) are kept exactly: those all cells of a group share as
the group's attributes, the rest per cell (``CELL_ATTRS``, JSON). So are its
variables' attributes (``units``, ``long_name``, ``description``): those the
cells share on the group's variable, where they differ (a description naming
each cell's clustering threshold) every cell's value joined by " | " there and
each cell's own in ``CELL_ATTRS`` under ``VARIABLE_ATTRS``, which ``split``
puts back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import xarray as xr

from .metadata import COORDINATES

CELL = "cell"
CELL_ATTRS = "cell_attrs"  # group attribute: per cell, the attributes that differ across the group
VARIABLE_ATTRS = "variable_attrs"  # in a cell's CELL_ATTRS entry: its variables' attributes the group's lack


def _signature(ds: xr.Dataset) -> tuple:
    """What cells must share to be stacked: variables with their dims, shapes and dtypes, and the
    coordinates' values."""
    variables = tuple(sorted((name, var.dims, var.shape, var.dtype.str)
                             for name, var in ds.variables.items()))
    coords = tuple((name, np.asarray(ds[name].values).tobytes()) for name in sorted(ds.coords))
    return variables, coords


def group_cells(cells: Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    """Cells (id -> dataset) as groups (name -> dataset with a ``cell`` dimension), in cell order."""
    by_shape: dict[tuple, list[str]] = {}
    for cid, ds in cells.items():
        by_shape.setdefault(_signature(ds), []).append(cid)
    groups = {}
    for k, ids in enumerate(by_shape.values()):
        members = [cells[cid] for cid in ids]
        keys = dict.fromkeys(key for ds in members for key in ds.attrs)
        common = {key: members[0].attrs[key] for key in keys
                  if all(key in ds.attrs and _same(ds.attrs[key], members[0].attrs[key]) for ds in members)}
        varying = [{key: value for key, value in ds.attrs.items() if key not in common} for ds in members]
        stacked = xr.concat([ds.drop_attrs(deep=False) for ds in members], dim=CELL, coords="minimal",
                            compat="override", join="exact", combine_attrs="drop")
        stacked = stacked.assign_coords({CELL: (CELL, ids, COORDINATES[CELL].attrs())})
        for name in members[0].variables:
            stacked[name].attrs = merged_attrs([ds[name].attrs for ds in members])
            for ds, own in zip(members, varying, strict=True):
                differing = {k: v for k, v in ds[name].attrs.items()
                             if k not in stacked[name].attrs or not _same(v, stacked[name].attrs[k])}
                if differing:
                    own.setdefault(VARIABLE_ATTRS, {})[name] = differing
        stacked.attrs = {**common, CELL_ATTRS: json.dumps(varying, default=_plain)}
        groups[f"g{k}"] = stacked
    return groups


def merged_attrs(attrs: list[Mapping]) -> dict:
    """One variable's attributes over several datasets (cells), those every one has: a value they all
    share as it is, a text that differs as its distinct values joined by " | " (a description naming
    each cell's threshold), any other value that differs left out."""
    out = {}
    for key in [k for k in (attrs[0] if attrs else ()) if all(k in a for a in attrs)]:
        values = [a[key] for a in attrs]
        if all(_same(v, values[0]) for v in values):
            out[key] = values[0]
        elif all(isinstance(v, str) for v in values):
            out[key] = " | ".join(dict.fromkeys(values))
    return out


def placement(groups: Mapping[str, xr.Dataset]) -> dict[str, str]:
    """Where each cell is: cell id -> its group (what a store's record and manifest hold)."""
    return {cid: name for name, ds in groups.items() for cid in ds[CELL].values.tolist()}


def _plain(value):
    """numpy scalars and arrays in attributes, as JSON."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def _same(a, b) -> bool:
    return type(a) is type(b) and json.dumps(a, default=_plain) == json.dumps(b, default=_plain)


def cell_attrs(group: xr.Dataset) -> list[dict]:
    """Every cell's attributes, in the group's cell order (its variables' own, where the group's differ,
    under ``VARIABLE_ATTRS``)."""
    common = {k: v for k, v in group.attrs.items() if k != CELL_ATTRS}
    return [{**common, **varying} for varying in json.loads(group.attrs.get(CELL_ATTRS, "[]"))]


def group_attrs(path) -> dict[str, dict]:
    """Every cell's attributes in a batch's store (id -> attributes), from its groups' metadata only
    (no array read); empty for a store that is not there or not readable."""
    import zipfile

    import zarr

    from .store import UNREADABLE, record_of

    cells = record_of(path).get("cells") or {}
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
            for group in dict.fromkeys(cells.values()):
                common = json.loads(zf.read(f"{group}/.zattrs"))
                varying = json.loads(common.pop(CELL_ATTRS, "[]"))
                # The group's own cell order (its CELL coordinate, one small array): the record lists the
                # cells in another order (sorted), so pairing them with CELL_ATTRS by it mislabels them.
                ids = [str(cid) for cid in root[group][CELL][:]]
                out.update({cid: {**common, **v} for cid, v in zip(ids, varying, strict=True)})
    except (*UNREADABLE, TypeError, KeyError):
        return {}
    return out


def cell_values(group: xr.Dataset, key: str) -> xr.DataArray:
    """One attribute of every cell of a group, along ``cell`` (``cell_beta``, ``certificate_error``)."""
    values = [attrs.get(key, np.nan) for attrs in cell_attrs(group)]
    return xr.DataArray(values, dims=CELL, coords={CELL: group[CELL].values})


def select(group: xr.Dataset, ids) -> xr.Dataset:
    """The cells ``ids`` of a group (in that order, repeats allowed), their attributes with them."""
    index = {cid: i for i, cid in enumerate(group[CELL].values.tolist())}
    positions = [index[cid] for cid in ids]
    varying = json.loads(group.attrs.get(CELL_ATTRS, "[]"))
    out = group.isel({CELL: positions})
    out.attrs = {**group.attrs, CELL_ATTRS: json.dumps([varying[i] for i in positions])}
    return out


def split(group: xr.Dataset) -> dict[str, xr.Dataset]:
    """A group's cells as the datasets they were written from (id -> dataset, no ``cell`` dim)."""
    out = {}
    for i, (cid, attrs) in enumerate(zip(group[CELL].values.tolist(), cell_attrs(group), strict=True)):
        ds = group.isel({CELL: i}, drop=True)
        for name, own in attrs.pop(VARIABLE_ATTRS, {}).items():
            ds[name].attrs = {**ds[name].attrs, **own}
        ds.attrs = attrs
        out[cid] = ds
    return out


__all__ = ["CELL", "CELL_ATTRS", "VARIABLE_ATTRS", "cell_attrs", "cell_values", "group_attrs", "group_cells",
           "merged_attrs", "placement", "select", "split"]
