"""Cell ids are the names of stores: any change to ``Cell`` normalisation or ``to_dict`` that alters
an id orphans every stored result. ``tests/data/cell_ids.json`` holds what the code produced when the
fixture was written (run this file as a script to rewrite it, only for an intended id change):

- the sorted ids of every cell of each shipped config (``config/*.yaml``);
- the id and ``to_dict`` of hand-picked cells (numbers of every accepted type, conditional fields,
  seeds and observables spelled several ways);
- the exact error (type and message) for hand-picked bad values, so a faster validation keeps the
  same first error, in the same words.
"""

import dataclasses
import hashlib
import json
import pickle
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from attnflow import Cell
from attnflow.config import load, validate
from attnflow.ids import cell_id

ROOT = Path(__file__).parent.parent
FIXTURE = Path(__file__).parent / "data" / "cell_ids.json"
CONFIGS = ("config.yaml", "paper.yaml")


def config_cells(name: str) -> list[Cell]:
    sweep = validate(load(ROOT / "config" / name), reach_scheduler=False)
    return [cell for cells in sweep.batches.values() for cell in cells]


def config_ids(name: str) -> dict[str, list[str]]:
    """Per experiment the config runs here, its cells' ids (an experiment skipped on this machine, say
    trained_heads without its weights, is absent: the fixture holds every one)."""
    sweep = validate(load(ROOT / "config" / name), reach_scheduler=False)
    return {exp: sorted({cell_id(p.cell) for p in points}) for exp, points in sweep.points.items()}


def id_from_canonical_json(cell: Cell) -> str:
    """``cell_id`` computed from ``Cell.identity_json`` (the cached text): must be the same id."""
    return hashlib.sha256((cell.identity_json() + cell.input_digest()).encode()).hexdigest()[:16]


# Valid cells: label -> kwargs. Labels are stable keys into the fixture.
VALID = {
    "default": {},
    "ints_for_floats": dict(beta=2, t_max=10, lambda_bar=1, atol=1, cluster_eps=1),
    "numpy_numbers": dict(H=np.int64(2), n=np.int32(8), d=np.uint8(8), beta=np.float64(0.5),
                          t_max=np.float32(2.5), lambda_bar=np.int64(3), n_samples=np.int16(11)),
    "fraction": dict(beta=Fraction(1, 3), lambda_bar=Fraction(3, 2)),
    "float_subclass_and_int_subclass": dict(beta=np.float64(1.25), max_steps=np.int64(500)),
    "seed_count": dict(seeds=3),
    "seed_count_numpy": dict(seeds=np.int64(2)),
    "seed_list": dict(seeds=[5, 2, 9]),
    "seed_tuple_numpy": dict(seeds=(np.int64(7), 1)),
    "seed_range": dict(seeds=range(2, 5)),
    "no_randomness_keeps_first_seed": dict(init="orthogonal", n=4, d=8, seeds=[3, 1]),
    "observables_reordered": dict(observables=["entropy", "energy"]),
    "observables_tuple_dup": dict(observables=("energy", "energy", "positions")),
    "observables_empty": dict(observables=[]),
    "observables_no_clusters_resets_eps": dict(observables=["energy"], cluster_eps=0.5),
    "observables_clusters_keeps_eps": dict(observables=["clusters"], cluster_eps=0.5),
    "head_subset_ignored_for_scalar": dict(head_subset=[1, 0]),
    "spread_reset": dict(spread=0.5, lambda_dist="equal"),
    "spread_kept": dict(spread=0.5, lambda_dist="linear"),
    "dirichlet": dict(lambda_dist="dirichlet", concentration=2, H=3),
    "block": dict(heads="block", H=4, d=8),
    "perturbed_block": dict(heads="perturbed_block", delta=0.25, H=2, d=8),
    "random_heads": dict(heads="random", init="orthogonal", n=4, d=4, seeds=3),
    "equiangular": dict(init="equiangular", gamma0=0.2, n=4, d=4),
    "equiangular_typical": dict(init="equiangular_typical", n=4, d=6),
    "gamma0_reset": dict(gamma0=0.9),
    "flat_causal_usa": dict(geometry="flat", mask="causal", attention="usa"),
    "relu_sigmoid_log": dict(attention="sigmoid", sample_spacing="log", n_samples=7),
    "relu": dict(attention="relu", stop_at_cluster=True),
    "gamma_mean": dict(cluster_metric="gamma_mean", cluster_threshold=-0.5),
    "tolerances": dict(rtol=1e-14, atol=1e-12, max_steps=10),
    "weights_ignored_for_scalar": dict(weights="nope.safetensors", layer=3, model_heads=4, values="trained"),
    "weights_none_ignored": dict(weights=None),
    "numpy_str_choice": dict(attention=np.str_("relu"), init=np.str_("uniform")),
    "big_beta_ok": dict(beta=300.0, lambda_bar=2.0),
    "negative_zero": dict(gamma0=-0.0, init="equiangular", n=3, d=3),
}
# Cells of geometries and values added after the fixture was written: their ids are new, so they are
# checked here for what makes an id (the JSON of to_dict, equal cells equal), not against the fixture.
NEW = {
    "pre_ln": dict(geometry="pre_ln", observables=["radius"]),
    "peri_ln_alpha_reset": dict(geometry="peri_ln", ngpt_alpha=3.0),
    "ngpt_alpha": dict(geometry="ngpt", ngpt_alpha=0.5),
    "identity_values": dict(values="identity", heads="random", init="orthogonal", n=4, d=4),
}


@pytest.mark.parametrize("label", NEW)
def test_new_cells_have_the_json_of_their_dict(label):
    cell = Cell(**NEW[label])
    assert cell.canonical_json() == json.dumps(cell.to_dict(), sort_keys=True) == cell.identity_json()
    assert cell == Cell(**cell.to_dict()) and id_from_canonical_json(cell) == cell_id(cell)
    other = cell.replace(engine="jax")
    assert cell_id(other) == cell_id(cell)
    assert json.loads(other.canonical_json()) == {**json.loads(cell.canonical_json()), "engine": "jax"}


# Invalid cells: label -> kwargs; each must fail with the recorded error type and message.
INVALID = {
    # out of its range where no choice reads it (refused all the same: a typo, not a no-op)
    "spread_bad_unread": dict(spread=5.0),
    "delta_negative_unread": dict(delta=-1.0),
    "cluster_eps_bad_unread": dict(observables=["energy"], cluster_eps=3.0),
    "H_str": dict(H="2"),
    "H_float": dict(H=2.0),
    "H_bool": dict(H=True),
    "H_zero_numpy": dict(H=np.int64(0)),
    "n_one": dict(n=1),
    "H_zero_then_n_one": dict(H=0, n=1),
    "H_zero_and_beta_str": dict(H=0, beta="x"),
    "two_type_errors": dict(n="x", H="y"),
    "beta_str": dict(beta="1"),
    "beta_bool": dict(beta=False),
    "beta_none": dict(beta=None),
    "beta_inf": dict(beta=float("inf")),
    "beta_decimal": dict(beta=Decimal("1.5")),
    "beta_huge_int": dict(beta=10**400),
    "beta_zero": dict(beta=0),
    "beta_negative": dict(beta=-1.0),
    "beta_overflow": dict(beta=700.0),
    "beta_overflow_usa": dict(attention="usa", lambda_dist="dirichlet", H=4, beta=200.0),
    "t_max_list": dict(t_max=[1.0]),
    "stop_int": dict(stop_at_cluster=1),
    "attention_unknown": dict(attention="tanh"),
    "attention_none": dict(attention=None),
    "attention_list": dict(attention=["softmax"]),
    "geometry_unknown": dict(geometry="torus"),
    "values_unknown": dict(values="both"),
    "seeds_zero": dict(seeds=0),
    "seeds_negative": dict(seeds=-2),
    "seeds_bool": dict(seeds=True),
    "seeds_str": dict(seeds="12"),
    "seeds_float": dict(seeds=2.0),
    "seeds_empty": dict(seeds=[]),
    "seeds_dup": dict(seeds=[1, 1]),
    "seeds_negative_entry": dict(seeds=[1, -1]),
    "seeds_float_entry": dict(seeds=[1.0]),
    "seeds_bool_entry": dict(seeds=[0, True]),
    "seeds_set": dict(seeds={1, 2}),
    "observables_str": dict(observables="energy"),
    "observables_unknown": dict(observables=["energy", "vorticity"]),
    "observables_int": dict(observables=[1]),
    "observables_none": dict(observables=None),
    "head_subset_dup": dict(head_subset=[0, 0]),
    "head_subset_negative": dict(head_subset=[-1]),
    "head_subset_str": dict(head_subset="01"),
    "head_subset_float": dict(head_subset=[1.0]),
    "spread_linear": dict(spread=1.0, lambda_dist="linear"),
    "spread_negative": dict(spread=-0.1, lambda_dist="linear"),
    "delta_negative": dict(delta=-0.1, heads="perturbed_block"),
    "rtol_small": dict(rtol=1e-15),
    "rtol_one": dict(rtol=1),
    "atol_zero": dict(atol=0.0),
    "threshold_epsilon": dict(cluster_threshold=2.0),
    "threshold_gamma_mean": dict(cluster_metric="gamma_mean", cluster_threshold=1.5),
    "cluster_eps_zero": dict(observables=["clusters"], cluster_eps=0.0),
    "blocks_dont_fit": dict(heads="block", H=3, d=8),
    "orthogonal_no_room": dict(init="orthogonal", n=10, d=8),
    "equiangular_no_room": dict(init="equiangular", n=10, d=8),
    "equiangular_gamma0": dict(init="equiangular", gamma0=1.0),
    "trained_no_weights": dict(heads="trained"),
    "embedding_no_weights": dict(init="embedding"),
    "concentration_zero": dict(concentration=0.0),
    "max_steps_zero": dict(max_steps=0),
    "layer_negative": dict(layer=-1),
    "unknown_field": dict(colour="red"),
}


def _error(kwargs) -> str:
    try:
        Cell(**kwargs)
    except Exception as err:  # noqa: BLE001 - the type is part of what is pinned
        return f"{type(err).__name__}: {err}"
    return "accepted"


def compute() -> dict:
    valid = {}
    for label, kwargs in VALID.items():
        cell = Cell(**kwargs)
        valid[label] = {"id": cell_id(cell), "dict": json.dumps(cell.to_dict(), sort_keys=True)}
    return {"configs": {name: config_ids(name) for name in CONFIGS},
            "valid": valid,
            "invalid": {label: _error(kwargs) for label, kwargs in INVALID.items()}}


@pytest.fixture(scope="module")
def fixture():
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_config_cell_ids_unchanged(fixture, name):
    got, pinned = config_ids(name), fixture["configs"][name]
    assert got
    for experiment, ids in got.items():
        assert ids == pinned[experiment], experiment


@pytest.mark.parametrize("name", CONFIGS)
def test_canonical_json_is_the_json_of_to_dict(fixture, name):
    cells = config_cells(name)
    for cell in cells:
        assert cell.canonical_json() == json.dumps(cell.to_dict(), sort_keys=True)
    pinned = {cid for ids in fixture["configs"][name].values() for cid in ids}
    assert {id_from_canonical_json(cell) for cell in cells} <= pinned


@pytest.mark.parametrize("label", VALID)
def test_valid_cells_keep_their_ids_and_fields(fixture, label):
    cell = Cell(**VALID[label])
    expected = fixture["valid"][label]
    assert json.dumps(cell.to_dict(), sort_keys=True) == expected["dict"]
    assert cell_id(cell) == expected["id"]
    assert cell.canonical_json() == expected["dict"] and id_from_canonical_json(cell) == expected["id"]
    # Normalised fields have exact builtin types (10 and 10.0 are one value of a float field).
    for name in ("H", "n", "d", "n_samples", "max_steps", "layer", "model_heads"):
        assert type(getattr(cell, name)) is int
    for name in ("beta", "t_max", "lambda_bar", "rtol", "atol", "delta", "spread", "gamma0"):
        assert type(getattr(cell, name)) is float
    assert cell == Cell(**cell.to_dict()) and cell_id(Cell(**cell.to_dict())) == expected["id"]


@pytest.mark.parametrize("label", INVALID)
def test_invalid_cells_fail_with_the_same_error(fixture, label):
    assert _error(INVALID[label]) == fixture["invalid"][label]


# numpy values whose repr depends on the numpy version: the message is built from the repr here.
@pytest.mark.parametrize("field, value, why", [
    ("H", np.float64(2.0), "must be an integer"),
    ("n", np.float32(8), "must be an integer"),
    ("beta", np.float64("nan"), "must be a finite real number"),
    ("t_max", np.float32("inf"), "must be a finite real number"),
    ("stop_at_cluster", np.bool_(True), "must be true or false"),
    ("seeds", np.array([1, 2]), "must be a count or a list of non-negative integers"),
])
def test_numpy_values_fail_with_the_same_error(field, value, why):
    assert _error({field: value}) == f"ValueError: Cell.{field} = {value!r}: {why}"


def test_cached_json_is_no_field():
    a, b = Cell(beta=2.0), Cell(beta=2.0)
    text = a.canonical_json()  # cached on a, not on b
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    # every field but engine and those added since stores existed (ngpt_alpha), which the dict (and
    # the id) carry only away from their defaults
    assert list(a.to_dict()) == list(b.to_dict()) == [f.name for f in dataclasses.fields(Cell)
                                                      if f.name not in ("engine", "ngpt_alpha")]
    c = a.replace(beta=3.0)
    assert c.canonical_json() == json.dumps(c.to_dict(), sort_keys=True) != text
    assert a.canonical_json() is text


def test_pickled_cell_keeps_its_json():
    cell = Cell(seeds=[3, 1], beta=0.5)
    for cached in (False, True):
        if cached:
            cell.canonical_json()
        copy = pickle.loads(pickle.dumps(cell))
        assert copy == cell and copy.canonical_json() == cell.canonical_json()
        assert id_from_canonical_json(copy) == cell_id(cell)


def test_to_dict_is_a_fresh_mutable_copy():
    cell = Cell(seeds=[1, 2])
    out = cell.to_dict()
    out["seeds"].append(3)
    out["beta"] = 5.0
    assert cell.to_dict()["seeds"] == [1, 2] and cell.to_dict()["beta"] == 1.0


if __name__ == "__main__":  # rewrite the fixture (only for an intended change of ids or errors)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    sys.exit(0)


def test_the_engine_is_no_part_of_the_id():
    # One cell computed by two engines is one cell: its id leaves the engine out (a config moved
    # from numba to auto keeps its stores), and its store records the engine that computed it
    # (sweep.engine_staleness). A job's JSON of its cells (canonical_json) names a non-default one.
    default = Cell(beta=2.0)
    assert Cell(beta=2.0, engine="numba").canonical_json() == default.canonical_json() \
        == default.identity_json()
    for engine in ("jax", "auto"):
        other = Cell(beta=2.0, engine=engine)
        assert cell_id(other) == cell_id(default)
        assert other.identity_json() == default.identity_json()
        assert other.canonical_json() == json.dumps(other.to_dict(), sort_keys=True)
        with_engine = {**json.loads(default.canonical_json()), "engine": engine}
        assert json.loads(other.canonical_json()) == with_engine
        assert Cell(**json.loads(other.canonical_json())) == other
