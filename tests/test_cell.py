import pytest

from attnflow import Cell


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
        (dict(attention="sigmoid"), "attention", "sigmoid"),
        (dict(heads="dense"), "heads", "dense"),
        (dict(beta=0.0), "beta", "0.0"),
        (dict(beta=-1.0), "beta", "-1.0"),
        (dict(beta=float("nan")), "beta", "nan"),
        (dict(beta=700.0), "beta", "700.0"),
        (dict(attention="usa", lambda_dist="dirichlet", H=4, beta=200.0), "beta", "200.0"),
        (dict(H=0), "H", "0"),
        (dict(n=2.5), "n", "2.5"),
        (dict(seeds=[]), "seeds", "[]"),
        (dict(seeds=[1, 1]), "seeds", "[1, 1]"),
        (dict(seeds=0), "seeds", "0"),
        (dict(spread=1.0, lambda_dist="linear"), "spread", "1.0"),
        (dict(delta=0.1), "delta", "0.1"),
        (dict(init="equiangular", gamma0=1.0), "gamma0", "1.0"),
        (dict(geometry="torus"), "geometry", "torus"),
        (dict(save_positions="yes"), "save_positions", "yes"),
        (dict(cluster_metric="gamma_mean", cluster_threshold=1.5), "cluster_threshold", "1.5"),
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
