import pytest

from attnflow import Cell
from attnflow.cell import CONDITIONAL_FIELDS, FIELD_DOCS
from attnflow.ids import cell_id


def test_defaults_valid_and_seeds_normalised():
    assert Cell(seeds=3).seeds == (0, 1, 2)
    assert Cell(seeds=[5, 2]).seeds == (5, 2)
    cell = Cell()
    with pytest.raises(AttributeError):
        cell.H = 3  # frozen


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        (dict(heads="block", H=3, d=8), "d", "8"),
        (dict(init="orthogonal", n=10, d=8), "d", "8"),
        (dict(init="equiangular", n=10, d=8), "d", "8"),
        (dict(init="equiangular_typical", n=10, d=8), "d", "8"),
        (dict(attention="tanh"), "attention", "tanh"),
        (dict(heads="dense"), "heads", "dense"),
        (dict(beta=0.0), "beta", "0.0"),
        (dict(beta=-1.0), "beta", "-1.0"),
        (dict(beta=float("nan")), "beta", "nan"),
        (dict(beta=700.0), "beta", "700.0"),
        (dict(attention="usa", lambda_dist="dirichlet", H=4, beta=200.0), "beta", "200.0"),
        (dict(H=0), "H", "0"),
        (dict(n=2.5), "n", "2.5"),
        (dict(n=1), "n", "1"),
        (dict(seeds=[]), "seeds", "[]"),
        (dict(seeds=[1, 1]), "seeds", "[1, 1]"),
        (dict(seeds=0), "seeds", "0"),
        (dict(spread=1.0, lambda_dist="linear"), "spread", "1.0"),
        (dict(delta=-0.1, heads="perturbed_block"), "delta", "-0.1"),
        (dict(init="equiangular", gamma0=1.0), "gamma0", "1.0"),
        (dict(geometry="torus"), "geometry", "torus"),
        (dict(cluster_metric="gamma_mean", cluster_threshold=1.5), "cluster_threshold", "1.5"),
        (dict(rtol=1e-15), "rtol", "1e-15"),
        (dict(atol=0.0), "atol", "0.0"),
        (dict(observables=["energy", "vorticity"]), "observables", "vorticity"),
        (dict(observables="energy"), "observables", "energy"),
        # int64 in the engine and the generators; a count that would build a billion-entry tuple
        (dict(seeds=[2**64]), "seeds", str(2**64)),
        (dict(seeds=10**9), "seeds", str(10**9)),
        (dict(max_steps=2**70), "max_steps", str(2**70)),
        (dict(heads="trained", weights=5), "weights", "5"),
    ],
)
def test_invalid_values_name_field_and_value(kwargs, field, value):
    with pytest.raises(ValueError) as err:
        Cell(**kwargs)
    msg = str(err.value)
    assert f"Cell.{field}" in msg and value in msg


def test_replace_revalidates():
    with pytest.raises(ValueError, match="Cell.d"):
        Cell(heads="block", H=2, d=8).replace(H=3)


def test_numbers_are_normalised_so_equal_values_hash_equally():
    a, b = Cell(t_max=10, beta=1), Cell(t_max=10.0, beta=1.0)
    assert a == b and cell_id(a) == cell_id(b)
    assert isinstance(a.t_max, float) and isinstance(Cell(n=8).n, int)


def test_fields_a_choice_does_not_read_are_reset():
    # spread is read by the linear distribution only; gamma0 by equiangular tokens only;
    # delta by perturbed block heads only: elsewhere they take their defaults, so
    # cells that simulate the same thing are equal (and share one store).
    assert Cell(spread=0.5) == Cell()
    assert Cell(lambda_dist="linear", spread=0.5).spread == 0.5
    assert Cell(gamma0=0.3) == Cell()
    assert Cell(delta=0.2) == Cell()
    assert Cell(heads="perturbed_block", delta=0.2).delta == 0.2
    assert CONDITIONAL_FIELDS >= {"spread", "concentration", "delta", "gamma0", "cluster_eps"}


def test_a_cell_without_randomness_keeps_one_seed():
    assert Cell(init="orthogonal", seeds=8).seeds == (0,)
    assert Cell(init="equiangular", gamma0=0.1, seeds=[3, 4]).seeds == (3,)
    assert Cell(init="orthogonal", heads="random", seeds=3).seeds == (0, 1, 2)
    assert Cell(init="uniform", seeds=3).seeds == (0, 1, 2)


def test_observables_are_canonical_and_always_hold_cosines():
    cell = Cell(observables=["entropy", "energy"])
    assert cell.observables == ("cosines", "energy", "entropy")
    assert Cell(observables=["energy", "entropy"]) == cell


def test_every_field_is_documented():
    assert all(FIELD_DOCS.values())
