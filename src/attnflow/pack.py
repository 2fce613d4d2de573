"""A batch's cells in one store: cells of one shape stacked along ``cell``, one group per shape.

A batch's cells differ along its experiment's ``batch_over`` axes, some of
which change shapes (``n`` the token axis, ``H`` the head axis). Cells whose
variables, shapes, dtypes and coordinates agree share a group, where each
variable gains a leading ``cell`` dimension, indexed by cell id. A store of
one group holds it at its root; several are named by the grid values that
tell them apart (``n=8``, ``H=2,n=16``). So a store holds one chunk per
variable and group, whatever the number of cells, and an experiment's
reduction runs once per group on every cell at once.

Each cell's grid values (every scalar field of its ``Cell``: attention, H,
heads, n, beta, ...) are coordinates along ``cell``, so plain xarray selects
by them (``ds.sel(cell=ds.beta == 1.0)``, ``ds.set_xindex(["n", "beta"])``);
the group's ``GRID`` attribute lists them. A cell's other attributes (its
sequence fields, solver statistics, accuracy certificate) are kept exactly:
those all cells of a group share as the group's attributes, the rest per cell
(``CELL_ATTRS``, JSON). So are its variables' attributes (``units``,
``long_name``, ``description``): those the cells share on the group's
variable, where they differ (a description naming each cell's clustering
threshold) every cell's value joined by " | " there and each cell's own in
``CELL_ATTRS`` under ``VARIABLE_ATTRS``, which ``split`` puts back.

Readers (``split``, ``select``, ``cell_attrs``, ``group_attrs``) give the
cells as ``simulate`` made them, the grid values back among their
attributes (``cell_beta``), from this layout and from the one before it
(``LAYOUT`` 1: groups ``g0..gN``, grid values only in ``CELL_ATTRS``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import xarray as xr

from .metadata import COORDINATES, coordinate

CELL = "cell"
CELL_ATTRS = "cell_attrs"  # group attribute: per cell, the attributes that differ across the group
VARIABLE_ATTRS = "variable_attrs"  # in a cell's CELL_ATTRS entry: its variables' attributes the group's lack
GRID = "grid_coordinates"  # group attribute: the coordinates along CELL that hold each cell's Cell fields
FIELD = "cell_"  # a cell's attribute holding one of its Cell fields: cell_beta
# The stored layout (a store's record holds it; sweep.store_versions). 1: groups g0..gN, grid values in
# CELL_ATTRS only; 2: grid values as coordinates along CELL, groups named by what tells them apart.
LAYOUT = 2
_SCALARS = (bool, int, float, str)
STORE_ATTRS = ("title", "Conventions", "history")  # a store's attributes, which no cell of it carries


def _signature(ds: xr.Dataset) -> tuple:
    """What cells must share to be stacked: variables with their dims, shapes and dtypes, and the
    coordinates' values."""
    variables = tuple(sorted((name, var.dims, var.shape, var.dtype.str)
                             for name, var in ds.variables.items()))
    coords = tuple((name, np.asarray(ds[name].values).tobytes()) for name in sorted(ds.coords))
    return variables, coords


def group_cells(cells: Mapping[str, xr.Dataset], attrs: Mapping | None = None) -> dict[str, xr.Dataset]:
    """Cells (id -> dataset) as groups (name -> dataset with a ``cell`` dimension), in cell order: one
    group at the root (``""``), several named by what tells them apart (``group_names``). ``attrs``:
    the store's own (title, Conventions, history: ``STORE_ATTRS``), on every group, no cell's."""
    by_shape: dict[tuple, list[str]] = {}
    for cid, ds in cells.items():
        by_shape.setdefault(_signature(ds), []).append(cid)
    groups = []
    for ids in by_shape.values():
        members = [cells[cid] for cid in ids]
        grid = _grid_fields(members)
        keys = dict.fromkeys(key for ds in members for key in ds.attrs)
        common = {key: members[0].attrs[key] for key in keys if key[len(FIELD):] not in grid
                  and all(key in ds.attrs and _same(ds.attrs[key], members[0].attrs[key]) for ds in members)}
        varying = [{key: value for key, value in ds.attrs.items()
                    if key not in common and key[len(FIELD):] not in grid} for ds in members]
        stacked = xr.concat([ds.drop_attrs(deep=False) for ds in members], dim=CELL, coords="minimal",
                            compat="override", join="exact", combine_attrs="drop")
        stacked = stacked.assign_coords({CELL: (CELL, ids, _cf(COORDINATES[CELL].attrs(), str))})
        for name in members[0].variables:
            stacked[name].attrs = merged_attrs([ds[name].attrs for ds in members])
            for ds, own in zip(members, varying, strict=True):
                differing = {k: v for k, v in ds[name].attrs.items()
                             if k not in stacked[name].attrs or not _same(v, stacked[name].attrs[k])}
                if differing:
                    own.setdefault(VARIABLE_ATTRS, {})[name] = differing
        stacked = stacked.assign_coords({
            field: (CELL, [ds.attrs[FIELD + field] for ds in members],
                    _cf(coordinate(field).attrs(), type(members[0].attrs[FIELD + field])))
            for field in grid})
        stacked.attrs = {**(attrs or {}), **common, GRID: list(grid),
                         CELL_ATTRS: json.dumps(varying, default=_plain)}
        groups.append(stacked)
    return dict(zip(group_names(groups), groups, strict=True))


def _grid_fields(members: list[xr.Dataset]) -> list[str]:
    """The Cell fields stored as coordinates along ``cell``: those every cell holds as a scalar of one type
    (sequences, and a field some cell leaves unset, stay attributes), not named like a variable. A
    setting only some choices read (``CONDITIONAL_FIELDS``: gamma0 beside init equiangular) that no cell
    of the group reads (at its default in every one, where Cell puts an unread field) stays an attribute
    too: each coordinate costs a store three members and their metadata."""
    from .cell import _DEFAULTS, CONDITIONAL_FIELDS

    first = members[0]
    out = []
    for key, value in first.attrs.items():
        field = key[len(FIELD):]
        if (key.startswith(FIELD) and field != "id" and isinstance(value, _SCALARS) and coordinate(field)
                and field not in first.variables and field not in first.dims
                and all(type(ds.attrs.get(key)) is type(value) for ds in members)
                and not (field in CONDITIONAL_FIELDS
                         and all(ds.attrs[key] == _DEFAULTS[field] for ds in members))):
            out.append(field)
    return out


def _cf(attrs: dict, kind: type) -> dict:
    """A coordinate's attributes as CF wants them: no ``units`` on a label (a string) or a flag (a bool)."""
    return {k: v for k, v in attrs.items() if k != "units"} if kind in (str, bool) else attrs


def group_names(groups: list[xr.Dataset]) -> list[str]:
    """Names for a store's groups: ``[""]`` (the root) for one; for several, the grid values constant in
    each group that tell them apart (``n=8``; ``H=2,n=16``), by position (``g0``...) where those leave
    two groups alike."""
    if len(groups) == 1:
        return [""]
    constant = []
    for ds in groups:
        values = {}
        for field in ds.attrs.get(GRID, ()):
            column = ds[field].values.tolist()
            if all(v == column[0] for v in column):
                values[field] = column[0]
        constant.append(values)
    shared = set.intersection(*(set(v) for v in constant))
    telling = [f for f in constant[0] if f in shared and len({repr(v[f]) for v in constant}) > 1]
    names = [",".join(f"{f}={v[f]}" for f in telling).replace("/", "_") for v in constant]
    if "" in names or len(set(names)) < len(names):
        return [f"g{k}" for k in range(len(groups))]
    return names
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


def _per_cell_grid(group: xr.Dataset) -> list[dict]:
    """Each cell's grid values (``cell_beta``...) from the group's coordinates, in its cell order."""
    fields = [f for f in group.attrs.get(GRID, ()) if f in group.coords]
    columns = {FIELD + f: group[f].values.tolist() for f in fields}
    return [{key: column[i] for key, column in columns.items()} for i in range(group.sizes[CELL])]


def cell_attrs(group: xr.Dataset) -> list[dict]:
    """Every cell's attributes, in the group's cell order, its grid values among them (``cell_beta``; its
    variables' own, where the group's differ, under ``VARIABLE_ATTRS``)."""
    common = {k: v for k, v in group.attrs.items() if k not in (CELL_ATTRS, GRID, *STORE_ATTRS)}
    varying = json.loads(group.attrs.get(CELL_ATTRS, "[]"))
    return [{**common, **grid, **own} for grid, own in zip(_per_cell_grid(group), varying, strict=True)]


def as_cells(group: xr.Dataset) -> xr.Dataset:
    """A group as the reductions read it: the grid values back among the cells' attributes (where
    ``cell_values`` finds them), not coordinates; a group of the former layout as it is."""
    if GRID not in group.attrs:
        return group
    grid = _per_cell_grid(group)
    # As layout 1 held them: a value every cell shares among the group's attributes, the others per cell.
    shared = {k: v for k, v in grid[0].items() if all(_same(g[k], v) for g in grid)} if grid else {}
    varying = json.loads(group.attrs.get(CELL_ATTRS, "[]"))
    out = group.drop_vars([f for f in group.attrs[GRID] if f in group.coords])
    out.attrs = {**{k: v for k, v in group.attrs.items() if k not in (GRID, CELL_ATTRS)}, **shared,
                 CELL_ATTRS: json.dumps([{**{k: v for k, v in g.items() if k not in shared}, **own}
                                         for g, own in zip(grid, varying, strict=True)], default=_plain)}
    return out


def group_attrs(path) -> dict[str, dict]:
    """Every cell's attributes in a batch's store (id -> attributes), from its groups' metadata only
    (no array read but the small coordinates along ``cell``); empty for a store that is not there or not
    readable."""
    import zipfile

    import zarr

    from .store import UNREADABLE, record_of

    cells = record_of(path).get("cells") or {}
    out = {}
    try:
        with zipfile.ZipFile(path):
            pass  # a readable zip, before zarr reads it
        root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
        for group in dict.fromkeys(cells.values()):
            node = root[group] if group else root
            common = {k: v for k, v in node.attrs.items() if k not in STORE_ATTRS}
            varying = json.loads(common.pop(CELL_ATTRS, "[]"))
            grid = common.pop(GRID, [])
            # The group's own cell order (its CELL coordinate, one small array): the record lists the
            # cells in another order (sorted), so pairing them with CELL_ATTRS by it mislabels them.
            ids = [str(cid) for cid in node[CELL][:]]
            columns = {FIELD + f: np.asarray(node[f][:]).tolist() for f in grid}
            out.update({cid: {**common, **{k: c[i] for k, c in columns.items()}, **v}
                        for i, (cid, v) in enumerate(zip(ids, varying, strict=True))})
    except (*UNREADABLE, TypeError, KeyError):
        return {}
    return out


def cell_values(group: xr.Dataset, key: str) -> xr.DataArray:
    """One attribute of every cell of a group, along ``cell`` (``cell_beta``, ``certificate_error``)."""
    values = [attrs.get(key, np.nan) for attrs in cell_attrs(group)]
    return xr.DataArray(values, dims=CELL, coords={CELL: group[CELL].values})


def select(group: xr.Dataset, ids) -> xr.Dataset:
    """The cells ``ids`` of a group (in that order, repeats allowed), their attributes with them, as the
    reductions read them (``as_cells``)."""
    group = as_cells(group)
    index = {cid: i for i, cid in enumerate(group[CELL].values.tolist())}
    positions = [index[cid] for cid in ids]
    varying = json.loads(group.attrs.get(CELL_ATTRS, "[]"))
    out = group.isel({CELL: positions})
    out.attrs = {**group.attrs, CELL_ATTRS: json.dumps([varying[i] for i in positions])}
    return out


def split(group: xr.Dataset) -> dict[str, xr.Dataset]:
    """A group's cells as the datasets they were written from (id -> dataset, no ``cell`` dim)."""
    group = as_cells(group)
    out = {}
    for i, (cid, attrs) in enumerate(zip(group[CELL].values.tolist(), cell_attrs(group), strict=True)):
        ds = group.isel({CELL: i}, drop=True)
        for name, own in attrs.pop(VARIABLE_ATTRS, {}).items():
            ds[name].attrs = {**ds[name].attrs, **own}
        ds.attrs = attrs
        out[cid] = ds
    return out


__all__ = ["CELL", "CELL_ATTRS", "GRID", "LAYOUT", "STORE_ATTRS", "VARIABLE_ATTRS", "as_cells", "cell_attrs",
           "cell_values",
           "group_attrs", "group_cells", "group_names", "merged_attrs", "placement", "select", "split"]
