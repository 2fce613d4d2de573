"""``engine.blas.matmul``: BLAS's dgemm called directly, bit for bit what numba's ``np.dot`` gives."""

import numba
import numpy as np
import pytest

from attnflow.engine.blas import matmul


@numba.njit
def _both(a, b, through_dot, through_matmul):
    np.dot(a, b, through_dot)
    matmul(a, b, through_matmul)


@numba.njit
def _per_head(a, b, out):
    for h in range(a.shape[0]):
        matmul(a[h], b[h], out[h])


@pytest.mark.parametrize("shape", [(8, 8, 8), (16, 8, 8), (33, 17, 5), (128, 64, 128), (2, 3, 2),
                                   (1, 5, 7), (7, 5, 1), (1, 1, 1), (4, 0, 3), (0, 3, 4), (3, 4, 0)])
def test_matmul_is_np_dot_bit_for_bit(shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    through_dot, through_matmul = np.full((m, n), np.nan), np.full((m, n), np.nan)
    _both(a, b, through_dot, through_matmul)
    # The same BLAS routine on the same operands (or np.dot itself for a row, a column, an empty sum):
    # not one bit may differ; and both are the product (round-off of k terms of O(1)).
    assert np.array_equal(through_matmul, through_dot)
    np.testing.assert_allclose(through_matmul, a @ b, rtol=0, atol=1e-12 * max(k, 1))


def test_matmul_on_views_of_a_stack():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 4, 6))
    out = np.empty((3, 5, 6))
    _per_head(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=0, atol=1e-13)


def test_matmul_refuses_what_is_not_a_c_contiguous_float64_matrix():
    # A transposed view would be read as its memory, wrongly: refused when the call is typed.
    a = np.ones((3, 3))
    with pytest.raises(numba.TypingError):
        _both(a.T, a, np.empty((3, 3)), np.empty((3, 3)))


def test_matmul_with_shapes_that_do_not_match_writes_nan_not_past_the_arrays():
    a, b = np.ones((3, 4)), np.ones((5, 2))  # inner dimensions 4 and 5
    through_dot, through_matmul = np.zeros((3, 2)), np.zeros((3, 2))
    with pytest.raises(ValueError):  # np.dot refuses; matmul must not call BLAS on it
        _both(a, b, through_dot, through_matmul)
    out = np.zeros((3, 2))
    _matmul_only(a, b, out)
    assert np.isnan(out).all()
    out = np.zeros((2, 2))  # an output of the wrong shape for a (3, 4) @ (4, 2) product
    _matmul_only(np.ones((3, 4)), np.ones((4, 2)), out)
    assert np.isnan(out).all()


@numba.njit
def _matmul_only(a, b, out):
    matmul(a, b, out)
