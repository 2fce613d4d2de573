"""Every stored and summarised variable and coordinate keeps its units, long name and description (CF)."""

import numpy as np
import pytest
import xarray as xr
from sweep_helpers import place_batch
from yaml import safe_load

from attnflow import access
from attnflow.aggregate import summarise
from attnflow.config import validate
from attnflow.experiments import registry
from attnflow.metadata import (
    CONVENTIONS,
    FLOW_TIME,
    SUMMARIES,
    TIME_UNITS,
    MissingMetadata,
    describe_summary,
    undescribed,
)
from attnflow.run.stored import stored_cells
from attnflow.store import open_members, open_verified, read_members, record_of

pytestmark = pytest.mark.workflow


def _check_time(ds, where):
    assert "t" not in ds.dims, f"{where}: the time dimension is named 'time'"
    if "time" in ds.coords:
        assert ds.time.ndim == 1, f"{where}: a scalar time coordinate"
        assert (ds.time.attrs["units"], ds.time.attrs["long_name"]) == (TIME_UNITS, FLOW_TIME), where


def test_every_store_group_cell_and_summary_of_the_tiny_run_is_described(tiny_run):
    _, config, results = tiny_run
    stores = sorted((results / "simulations").glob("*.zarr.zip"))
    assert stores
    for path in stores:
        members = read_members(path)
        for group in record_of(path)["groups"]:
            with open_members(members, group, chunks=None) as ds:
                assert not undescribed(ds), f"{path.name}/{group}: {undescribed(ds)}"
                _check_time(ds, f"{path.name}/{group}")
        for cid, cell in stored_cells(path).items():  # each cell as it was simulated
            assert not undescribed(cell), f"{path.name}:{cid}: {undescribed(cell)}"
    names = list(safe_load(config.read_text())["experiments"])
    for name in names:
        summary = open_verified(results / "summaries" / f"{name}.zarr.zip")
        assert not undescribed(summary), f"summary {name}: {undescribed(summary)}"
        _check_time(summary, f"summary {name}")
        assert not [c for c, v in summary.coords.items() if v.ndim == 0], f"{name}: a scalar coordinate"
        assert summary.attrs["Conventions"] == CONVENTIONS and summary.attrs["title"], name
        assert name in summary.attrs["history"] and "attnflow" in summary.attrs["history"], name
        for key in ("config_sha256", "attnflow_version", "numerics_version", "reduction_version", "stores"):
            assert key in summary.attrs, (name, key)
    assert open_verified(results / "summaries" / "beta_star.zarr.zip").beta.attrs["long_name"] == \
        "inverse temperature"
    # Read back through the notebook API: the cells combined over the grid axes keep them too.
    # (clustering_time at one d: cells of two d do not combine, their dim axes differ in length.)
    for name, coords in (("beta_star", {}), ("clustering_time", {"d": 16}), ("energy", {})):
        cells = access.open_cells(name, config, **coords)
        assert not undescribed(cells), f"open_cells({name!r}): {undescribed(cells)}"
    # clustering_time's batches hold cells of two thresholds: each cell's description names its own.
    cells = access.open_cells("clustering_time", config, cluster_threshold=0.5, n=4, d=16, attention="relu",
                              init="equiangular_typical")
    assert "gamma_mean >= 0.5 holds" in cells.t_cluster.attrs["description"]


def test_a_summary_variable_declared_nowhere_stops_the_aggregation_named():
    summary = xr.Dataset({"thm11_residual": ("beta", [0.0]), "new_quantity": ("beta", [1.0])},
                         coords={"beta": [1.0]})
    with pytest.raises(MissingMetadata, match="energy: .*new_quantity; declare them"):
        describe_summary(summary.copy(), "energy")
    extras = {"new_quantity": ("1", "a new quantity", "what an experiment module adds")}
    described = describe_summary(summary.copy(), "energy", extras)
    assert described.new_quantity.attrs == {"units": "1", "long_name": "a new quantity",
                                            "description": "what an experiment module adds"}
    assert described.beta.attrs["long_name"] == "inverse temperature"


# The shipped experiments the tiny run leaves out: each summarised from a few tiny cells, simulated
# in-process as a simulate job does (trained_heads from test_trained's two-head weights file).
SMALL = {
    "crossover": {"fixed": {"n": 4, "d": 8, "seeds": 2, "t_max": 20.0},
                  "grid": {"attention": ["softmax", "relu"], "init": ["equiangular_typical"],
                           "cluster_threshold": [0.5, 0.9], "beta": [0.5, 1.0]}},
    "metastability": {"fixed": {"n": 4, "seeds": 2, "t_max": 5.0, "n_samples": 9},
                      "grid": {"H": [1], "d": [2], "beta": [1.0, 2.0, 3.0]}},
    "variants": {"fixed": {"n": 4, "d": 4, "seeds": 2, "t_max": 1.0, "n_samples": 5},
                 "grid": {"heads": ["scalar"], "attention": ["softmax", "sigmoid"],
                          "mask": ["none", "causal"], "beta": [1.0, 2.0]}},
    "scaling": {"fixed": {"seeds": 2, "t_max": 10.0},
                "grid": {"attention": ["softmax", "relu"], "n": [3, 4], "d": [2, 4]}},
    "normalization": {"fixed": {"seeds": 2, "t_max": 10.0, "n_samples": 9},
                      "grid": {"geometry": ["sphere", "pre_ln"], "init": ["equiangular", "uniform"],
                               "beta": [1.3]}},
}


@pytest.mark.parametrize("name", [*sorted(SMALL), "trained_heads"])
def test_the_experiments_outside_the_tiny_run_are_described(tmp_path, name):
    from attnflow import simulate
    from attnflow.ids import cell_id

    block = SMALL.get(name)
    if name == "trained_heads":
        from test_trained import D, _weights

        block = {"fixed": {"weights": str(_weights(tmp_path)[0]), "H": 2, "d": D, "n": 4, "seeds": 2,
                           "t_max": 1.0, "n_samples": 5},
                 "grid": {"layer": [0], "heads": ["trained", "trained_orthogonal"], "beta": [1.0, 2.0]}}
    sweep = validate({"results": str(tmp_path / "results"), "experiments": {name: block}},
                     reach_scheduler=False)
    for batch, cells in sweep.batches.items():
        place_batch(sweep, batch, {cell_id(c): simulate(c) for c in cells})
    summary = summarise(sweep.experiments.get(name), sweep.specs[name], sweep.entries(name))
    assert not undescribed(summary), f"{name}: {undescribed(summary)}"
    _check_time(summary, name)
    assert not [c for c, v in summary.coords.items() if v.ndim == 0], f"{name}: scalar coordinates"
    assert np.isfinite(np.asarray(list(summary.data_vars.values())[0].values, dtype=float)).any()


def test_every_shipped_experiment_has_its_summary_table():
    shipped = [e.name for e in registry()]
    assert sorted(SUMMARIES) == sorted(shipped)
