"""The accuracy certificate of a store (docs/model.md, "Numerics")."""

import numpy as np
import pytest

from attnflow.cell import MIN_RTOL, Cell
from attnflow.observables import variables
from attnflow.simulation import CERTIFICATE_SEEDS, certificate_deviation, simulate

CELLS = {
    "softmax, every observable": Cell(),
    "relu": Cell(attention="relu", beta=2.0),
    "usa, random heads": Cell(attention="usa", heads="random", H=2, n=8, d=4, beta=4.0, t_max=5.0),
    # Stiff: beta ||M_h|| = 8 makes the usa weights span e^16; the step is limited by stability.
    "usa, stiff": Cell(attention="usa", heads="scalar", H=2, n=8, d=4, beta=8.0, t_max=5.0),
    "softmax, loose tolerance": Cell(heads="block", H=2, n=16, d=8, beta=8.0, t_max=20.0, rtol=1e-4,
                                     atol=1e-7),
    # Stops at its criterion: the runs end at the end of a step, which moves with the tolerance.
    "beta_star-like, stop at cluster": Cell(H=3, n=32, d=12, heads="block", beta=2.0, seeds=4, t_max=8.0,
                                            n_samples=41, stop_at_cluster=True),
    "crossover-like, stop at cluster": Cell(H=1, n=16, d=64, init="equiangular_typical", attention="relu",
                                            cluster_metric="gamma_mean", cluster_threshold=0.99,
                                            stop_at_cluster=True, t_max=100.0, n_samples=11,
                                            observables=["clusters"]),
}


def true_error(ds, ref, cell) -> float:
    """The same measure as the certificate, against an rtol = 1e-12 rerun of the same seeds."""
    k = min(CERTIFICATE_SEEDS, cell.n_seeds)
    names = [v.name for v in variables(cell.observables) if v.dtype.startswith("float")]
    return max([certificate_deviation(ds[v].values[:k], ref[v].values[:k]) for v in names]
               + [certificate_deviation(ds.t_cluster.values[:k], ref.t_cluster.values[:k], censoring=True)])


@pytest.mark.parametrize("name", list(CELLS))
def test_certificate_does_not_understate_the_error(name):
    cell = CELLS[name]
    ds = simulate(cell)
    ref = simulate(cell.replace(rtol=1e-12, atol=cell.atol * 1e-4), certify=False)
    error = true_error(ds, ref, cell)
    assert ds.attrs["certificate_rtol"] == pytest.approx(max(cell.rtol / 100, MIN_RTOL))
    assert ds.attrs["certificate_atol"] == pytest.approx(cell.atol / 100)
    assert np.isfinite(ds.attrs["certificate_error"])
    assert ds.attrs["certificate_error"] >= error, (name, ds.attrs["certificate_variable"])
    # ... and is of the error's order, not a blanket bound (the tolerance's scale shows in it).
    assert ds.attrs["certificate_error"] <= 10 * error + 1e-12, name


def test_certificate_reads_only_the_first_seeds_and_is_off_on_request():
    cell = Cell(seeds=5, t_max=2.0)
    ds = simulate(cell)
    assert ds.attrs["certificate_seeds"] == CERTIFICATE_SEEDS
    assert ds.attrs["certificate_variable"]
    assert "certificate_error" not in simulate(cell, certify=False).attrs
    # One seed: the certificate reruns it alone.
    assert simulate(cell.replace(seeds=1)).attrs["certificate_seeds"] == 1


def test_certificate_deviation_conventions():
    assert certificate_deviation([1.0, 2.0], [1.0, 2.5]) == pytest.approx(0.2)
    assert certificate_deviation([np.nan, 1.0], [1.0, 1.0], censoring=True) == 1.0  # clustered in one run
    assert certificate_deviation([np.nan, 1.0], [1.0, 1.5]) == pytest.approx(1 / 3)  # sample reached by one
    assert certificate_deviation([np.nan], [np.nan]) == 0.0
    assert certificate_deviation([1e-20], [0.0]) == pytest.approx(1e-8)  # scale floored at 1e-12
