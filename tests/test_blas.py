"""``engine.machinery.blas.matmul``: the tiles up to ``TILED_PRODUCT`` multiply-adds (tests/test_tiles.py
checks their arithmetic), above it BLAS's dgemm called directly, bit for bit what numba's ``np.dot`` gives up
to 10^6 multiply-adds, and in panels of rows above (the panels' rules, and the product they make); on views
of rows of wider matrices, bit for bit what it gives on contiguous ones."""

import numba
import numpy as np
import pytest

from attnflow.engine.machinery import transpose_into
from attnflow.engine.machinery.blas import (
    PANEL_OPERAND,
    PANELS,
    SMALL_PRODUCT,
    TILED_PRODUCT,
    matmul,
    panel_rows,
)

needs_panels = pytest.mark.skipif(not PANELS, reason="BLAS is not an OpenBLAS with AVX-512 kernels")


@numba.njit
def _both(a, b, through_dot, through_matmul):
    np.dot(a, b, through_dot)
    matmul(a, b, through_matmul)


@numba.njit
def _per_head(a, b, out):
    for h in range(a.shape[0]):
        matmul(a[h], b[h], out[h])


@pytest.mark.parametrize("shape", [(100, 100, 100), (40, 80, 41), (1, 5, 7), (7, 5, 1), (1, 1, 1), (4, 0, 3),
                                   (0, 3, 4), (3, 4, 0), (1, 400, 400)])
def test_matmul_is_np_dot_bit_for_bit(shape):
    m, k, n = shape
    assert m * k * n > TILED_PRODUCT or min(m, n) <= 1 or k == 0  # none of these goes to the tiles
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    through_dot, through_matmul = np.full((m, n), np.nan), np.full((m, n), np.nan)
    _both(a, b, through_dot, through_matmul)
    # The same BLAS routine on the same operands (or np.dot itself for a row, a column, an empty sum):
    # not one bit may differ; and both are the product (round-off of k terms of O(1)).
    assert np.array_equal(through_matmul, through_dot)
    np.testing.assert_allclose(through_matmul, a @ b, rtol=0, atol=1e-12 * max(k, 1))


@pytest.mark.parametrize("shape", [(8, 8, 8), (16, 8, 8), (33, 17, 5), (2, 3, 2), (32, 64, 64)])
def test_small_products_are_the_product(shape):
    # The tiles' own order of summation (one fused chain an entry, tests/test_tiles.py): within
    # round-off of k terms of O(1) of np.dot's.
    m, k, n = shape
    assert m * k * n <= TILED_PRODUCT
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    through_dot, through_matmul = np.full((m, n), np.nan), np.full((m, n), np.nan)
    _both(a, b, through_dot, through_matmul)
    np.testing.assert_allclose(through_matmul, through_dot, rtol=0, atol=1e-13 * k)


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


def test_matmul_on_rows_with_gaps_between_entries_writes_nan():
    # Views whose rows are not adjacent entries type as views of wider rows do; BLAS would read the gaps.
    a, b = np.ones((4, 6)), np.ones((3, 4))
    for left, right in [(a[:, ::2], b), (np.ones((4, 3)), b[:, ::2])]:
        out = np.zeros((4, 4)) if right is b else np.zeros((4, 2))
        _matmul_only(left, right, out)
        assert np.isnan(out).all()
    out = np.zeros((4, 8))[:, ::2]  # an output with gaps
    _matmul_only(np.ones((4, 3)), b, out)
    assert np.isnan(out).all()


def _wider(rows, cols):
    """An uninitialised (rows, cols) matrix whose rows sit a cache line further apart than their width from
    128 columns on (C-contiguous below: a row or a column of such a view is not np.dot's, see the last
    test)."""
    return np.empty((rows, cols + (8 if cols >= 128 else 0)))[:, :cols]


@pytest.mark.parametrize("shape", [(128, 64, 128), (64, 64, 64), (100, 100, 100), (300, 16, 300),
                                   (512, 64, 128), (33, 17, 70), (1, 70, 7), (70, 5, 1), (1, 1, 1),
                                   (4, 0, 3), (3, 4, 0)])
def test_matmul_on_views_of_wider_rows_is_the_contiguous_product_bit_for_bit(shape):
    # Only the leading dimensions change: the same kernel makes the same sums, so not one bit may differ
    # (a row, a column or an empty sum goes to np.dot, on C-typed views of the same memory).
    m, k, n = shape
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    contiguous = np.full((m, n), np.nan)
    _matmul_only(a, b, contiguous)
    pa, pb, pout = _wider(m, k), _wider(k, n), _wider(m, n)
    pa[:], pb[:], pout[:] = a, b, np.nan
    _matmul_only(pa, pb, pout)
    assert np.array_equal(pout, contiguous)
    _matmul_only(a, pb, pout)  # one such operand among contiguous ones
    assert np.array_equal(pout, contiguous)


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


@needs_panels
@pytest.mark.parametrize("shape", [(128, 64, 128), (301, 40, 100), (512, 64, 128), (1000, 16, 1000)])
def test_matmul_in_panels_is_the_product(shape):
    m, k, n = shape
    rows = panel_rows(m, k, n)
    assert 2 <= rows < m  # these shapes are taken in panels
    rng = np.random.default_rng(m + k + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    out = np.full((m, n), np.nan)
    _matmul_only(a, b, out)
    # Every row written (the panels cover the matrix), each the product to round-off of k terms of O(1).
    np.testing.assert_allclose(out, a @ b, rtol=0, atol=1e-12 * k)


@needs_panels
def test_panel_rows():
    # Whole up to SMALL_PRODUCT multiply-adds, or when the right operand outgrows PANEL_OPERAND entries;
    # otherwise panels of at most SMALL_PRODUCT multiply-adds, of at least 61 rows.
    assert panel_rows(100, 100, 100) == 100
    assert panel_rows(32, 512, 512) == 32  # b has 262144 entries
    assert panel_rows(128, 64, 128) == SMALL_PRODUCT // (64 * 128) == 122
    for m, k, n in [(128, 64, 128), (4096, 128, 128), (1000, 16, 1000), (65, 128, 128)]:
        rows = panel_rows(m, k, n)
        assert k * n <= PANEL_OPERAND and rows * k * n <= SMALL_PRODUCT and rows >= 61


def test_panel_rows_without_the_unpacked_kernels(monkeypatch):
    # Another BLAS (or OpenBLAS on AVX2 kernels, where panels were slower): every product is one call.
    monkeypatch.setattr("attnflow.engine.machinery.blas.PANELS", False)
    assert panel_rows.py_func(128, 64, 128) == 128


@numba.njit
def _transpose(x, xt):
    transpose_into(x, xt)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5000), (5000, 1), (8, 8), (64, 64), (65, 64), (300, 16),
                                   (129, 65)])
def test_transpose_into(shape):
    # Both walks (up to 4096 entries, and by rows of eight above, n not a multiple of 8 included): a copy.
    x = np.random.default_rng(sum(shape)).standard_normal(shape)
    xt = np.full(shape[::-1], np.nan)
    _transpose(x, xt)
    assert np.array_equal(xt, x.T)


@pytest.mark.parametrize("shape", [(1, 3, 133), (133, 3, 1), (2, 0, 133)])
def test_matmul_of_a_row_or_column_with_a_wider_operand_is_the_product(shape):
    # Not C-contiguous in memory, so not np.dot's matrix-vector route: BLAS's product, or an empty sum.
    m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    pb, pout = _wider(k, n), _wider(m, n)
    pb[:], pout[:] = b, np.nan
    _matmul_only(a, pb if k > 1 else b, pout)
    np.testing.assert_allclose(pout, a @ b, rtol=0, atol=1e-13)  # round-off of at most 3 terms of O(1)
