import json

import pytest
from sweep_helpers import assert_same_cells

from attnflow import Cell
from attnflow.config import ConfigError, points_of, validate
from attnflow.ids import cell_id
from attnflow.run.batch import run_batch
from attnflow.run.stored import stored_cells
from attnflow.sweep import spec_points

CONFIG = {
    "experiments": {
        "beta_star": {
            "fixed": {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0},
            "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0, 2.0]},
            "batch_over": ["beta"],
        }
    },
}


def _with_grid(**grid):
    block = {**CONFIG["experiments"]["beta_star"], "grid": grid}
    return {"experiments": {"beta_star": block}}


def test_cells_are_the_grid_product_with_coordinates():
    sweep = validate(CONFIG)
    points = sweep.points["beta_star"]
    assert len(points) == 6
    assert points[0].coords == {"H": 2, "n": 4, "beta": 0.5}
    cell = points[0].cell
    assert cell.heads == "block" and cell.seeds == (0, 1) and cell.t_max == 1.0
    # The experiment's observables are recorded on top of the config's.
    assert set(cell.observables) >= {"energy", "radial"}


def test_cell_id_depends_on_every_field_and_nothing_else():
    a = Cell(H=2, n=4, d=4)
    assert cell_id(a) == cell_id(Cell(H=2, n=4, d=4))
    for change in ({"beta": 1.5}, {"seeds": 3}, {"rtol": 1e-7}, {"observables": ["positions"]}):
        assert cell_id(a.replace(**change)) != cell_id(a)


def test_batches_group_the_fast_axis_and_are_stable_under_new_values():
    batches = validate(CONFIG).batches
    assert sorted(len(v) for v in batches.values()) == [3, 3]
    grown = validate(_with_grid(H=[2], n=[4, 6, 8], beta=[0.5, 1.0, 2.0])).batches
    # Existing batches keep their names and cells; the new n only adds one.
    for name, cells in batches.items():
        assert [cell_id(c) for c in grown[name]] == [cell_id(c) for c in cells]
    assert len(grown) == 3


def _run_as_its_job(cells, batch, layout) -> None:
    """run_batch, then the manifest its simulate job writes (what run_batch reads of other batches)."""
    result = run_batch(cells, batch, layout, log=lambda *_: None)
    layout.manifest(batch).parent.mkdir(parents=True, exist_ok=True)
    layout.manifest(batch).write_text(json.dumps({"store": result.path.name, "cells": result.cells}))


def test_grid_axes_in_another_order_compute_nothing_again(tmp_path):
    """The same grid with its axes listed in another order (a config written by yaml.safe_dump, which sorts
    keys) names its batches as before (the axes in one order, ``sweep.canonical_grid``), so its jobs find
    every cell in their stores (before, every cell was computed anew; then renamed batches took them from
    the stores of the old names)."""
    first = {"results": str(tmp_path / "results"), **_with_grid(H=[2], n=[4, 6], beta=[0.5, 1.0])}
    reordered = {"results": str(tmp_path / "results"), **_with_grid(n=[4, 6], H=[2], beta=[0.5, 1.0])}
    first["experiments"]["beta_star"]["fixed"] = {**CONFIG["experiments"]["beta_star"]["fixed"], "seeds": 1,
                                                  "t_max": 0.2, "n_samples": 3}
    reordered["experiments"]["beta_star"]["fixed"] = first["experiments"]["beta_star"]["fixed"]
    before, after = validate(first), validate(reordered)
    assert set(before.batches) == set(after.batches)  # the label no longer follows the grid's order
    for batch, cells in before.batches.items():
        _run_as_its_job(cells, batch, before.layout)
    log = []
    for batch, cells in after.batches.items():
        result = run_batch(cells, batch, after.layout, log=log.append)
        assert set(result.cells) == {cell_id(c) for c in cells} and after.layout.store(batch).exists()
    assert not [line for line in log if "computed in" in line]
    assert sum("skipped" in line for line in log) == 4

    def cells_of(sweep):
        return {cid: ds for b in sweep.batches for cid, ds in stored_cells(sweep.layout.store(b)).items()}

    assert_same_cells(cells_of(after), cells_of(before))


def test_cells_whose_batch_changes_are_taken_from_the_store_that_holds_them(tmp_path):
    """batch_over edited (the batches regrouped under new names), plus one new grid value: the jobs take
    the cells other batches' stores hold and compute only the new value's (before, every cell anew)."""
    fixed = {**CONFIG["experiments"]["beta_star"]["fixed"], "seeds": 1, "t_max": 0.2, "n_samples": 3}
    first = {"results": str(tmp_path / "results"), **_with_grid(H=[2], n=[4, 6], beta=[0.5, 1.0])}
    first["experiments"]["beta_star"]["fixed"] = fixed
    regrouped = {"results": str(tmp_path / "results"), **_with_grid(H=[2], n=[4, 6], beta=[0.5, 1.0, 2.0])}
    regrouped["experiments"]["beta_star"].update(fixed=fixed, batch_over=["beta", "n"])
    before, after = validate(first), validate(regrouped)
    assert len(before.batches) == 2 and len(after.batches) == 1
    assert not set(before.batches) & set(after.batches)
    for batch, cells in before.batches.items():
        _run_as_its_job(cells, batch, before.layout)
    (batch, cells), = after.batches.items()
    log = []
    run_batch(cells, batch, after.layout, log=log.append)
    assert sum("computed in" in line for line in log) == 2, log  # beta = 2 at n = 4 and 6
    assert sum(".zarr.zip), skipped" in line and "complete (in beta_star-" in line for line in log) == 4, log


def test_a_cell_shared_by_two_experiments_is_owned_by_one_batch():
    # toy_margin's default cells are beta_star-like cells of their own; a second
    # experiment block that repeats the first's grid point shares its store.
    block = {"fixed": {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0, "n_samples": 11,
                       "stop_at_cluster": False, "observables": ["radial"], "rtol": 1e-8, "atol": 1e-11},
             "grid": {"H": [2], "n": [4], "beta": [0.5, 1.0], "attention": ["softmax"]}}
    config = {"experiment_modules": ["toy_experiment"], "experiments": {
        "beta_star": {**block, "fixed": {**block["fixed"], "observables": ["energy", "radial"]},
                      "grid": {**block["grid"], "n": [4, 6]}},
        "toy_margin": {"fixed": {**block["fixed"], "init": "uniform",
                                 "observables": ["energy", "energy_path"]},
                       "grid": {"beta": [0.5, 1.0], "n": [4]}, "batch_over": ["beta"]},
    }}
    sweep = validate(config)
    owners = {}
    for batch, cells in sweep.batches.items():
        for cell in cells:
            assert cell_id(cell) not in owners, "a cell in two batches"
            owners[cell_id(cell)] = batch
    shared = ({(p, c) for _, p, c in sweep.entries("beta_star")}
              & {(p, c) for _, p, c in sweep.entries("toy_margin")})
    assert len(shared) == 2  # beta 0.5 and 1.0 at n = 4: the same cells, each in one batch's store
    for path, cid in shared:
        owner = owners[cid]
        assert path == str(sweep.layout.store(owner))
        assert owner in sweep.batches_of("beta_star") and owner in sweep.batches_of("toy_margin")


def _shared_cells_config(beta_star_engine: str, toy_engine: str) -> dict:
    """beta_star and toy_margin sharing two cells (the test above), each naming an engine."""
    fixed = {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0, "n_samples": 11, "stop_at_cluster": False,
             "rtol": 1e-8, "atol": 1e-11}
    return {"experiment_modules": ["toy_experiment"], "experiments": {
        "beta_star": {"fixed": {**fixed, "observables": ["energy", "radial"], "engine": beta_star_engine},
                      "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0], "attention": ["softmax"]}},
        "toy_margin": {"fixed": {**fixed, "init": "uniform", "observables": ["energy", "energy_path"],
                                 "engine": toy_engine},
                       "grid": {"beta": [0.5, 1.0], "n": [4]}, "batch_over": ["beta"]},
    }}


@pytest.mark.parametrize("engines", [("auto", "numba"), ("numba", "auto"), ("jax", "auto"), ("auto", "auto")])
def test_a_shared_cell_is_computed_by_the_engine_an_experiment_names(engines):
    # The engine is no part of a cell's id: two experiments naming numba and auto share the cell, and
    # the named engine computes it (auto takes either).
    sweep = validate(_shared_cells_config(*engines))
    named = {e for e in engines if e != "auto"} or {"auto"}
    shared = {c for _, _, c in sweep.entries("beta_star")} & {c for _, _, c in sweep.entries("toy_margin")}
    held = {cell_id(cell): cell for cells in sweep.batches.values() for cell in cells}
    assert len(shared) == 2 and {held[cid].engine for cid in shared} == named


def test_a_shared_cell_named_for_two_engines_is_refused():
    with pytest.raises(ConfigError, match=r"^engine: experiments beta_star \(numba\) and toy_margin \(jax\) "
                                          r"share cells, .* give both the same engine, or auto to one"):
        validate(_shared_cells_config("numba", "jax"))


def test_equal_cells_on_one_grid_share_a_store():
    # spread is not read by equal strengths: those grid points are one cell.
    config = {"experiments": {"superadditivity": {
        "fixed": {"seeds": 2, "t_max": 1.0},
        "grid": {"init": ["uniform"], "spread": [0.3, 0.6], "lambda_dist": ["equal", "linear"],
                 "lambda_bar": [1.0, 2.0], "beta": [1.0, 2.0]}}}}
    sweep = validate(config)
    entries = sweep.entries("superadditivity")
    assert len(entries) == 16 and len({c for _, _, c in entries}) == 12
    assert sum(len(c) for c in sweep.batches.values()) == 12


def test_the_config_layer_names_the_experiment_of_a_bad_cell():
    # sweep.spec_points expands a checked spec and lets Cell's own error through; attnflow.config
    # is the layer that turns it into a ConfigError naming the experiment and grid point.
    sweep = validate(CONFIG)
    spec = sweep.specs["beta_star"]
    bad = type(spec)(spec.name, {**spec.fixed, "d": 5}, spec.grid, spec.batch_over)
    with pytest.raises(ValueError, match=r"^Cell\.d = 5") as err:
        spec_points(bad)
    assert not isinstance(err.value, ConfigError)
    with pytest.raises(ConfigError, match=r"^experiments\.beta_star \(grid point .*Cell\.d = 5"):
        points_of(bad)
