"""The dashed bounds of clustering_time bound the exact equiangular time wherever they are drawn."""

import numpy as np
import pytest

from attnflow import theory
from attnflow.experiments.clustering_time import initial_drive_bound, relu_linear_is_bound
from attnflow.tokens import typical_cosine


@pytest.mark.parametrize("attention", ["relu", "softmax"])
def test_bound_to_one_half_is_above_the_exact_time(attention):
    # The clustering_time figure's grid (n, d) at its level 1/2, beta = lambda = 1.
    for n in (2, 3, 4, 8, 16):
        for d in (64, 256, 1024, 4096):
            g0 = typical_cosine(d)
            exact = float(theory.equiangular_time(g0, 0.5, [1.0], 1.0, n, attention))
            assert float(initial_drive_bound(attention, g0, 0.5, n, 1.0, [1.0])) >= exact, (n, d)


def test_relu_linearisation_alone_is_not_a_bound_at_n_2():
    # docs/model.md (result 5) / issue 17: at n = 2 (1 - g)(1 + g) < 1, the true time exceeds the
    # linearised one (~10%).
    g0 = typical_cosine(64)
    exact = float(theory.equiangular_time(g0, 0.5, [1.0], 1.0, 2, "relu"))
    linear = 2 * np.log(0.5 / g0) / 2.0
    assert exact / linear == pytest.approx(1.098, abs=1e-3)
    assert not relu_linear_is_bound(0.5, 2) and relu_linear_is_bound(0.5, 3)
