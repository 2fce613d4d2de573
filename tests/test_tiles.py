"""``engine.machinery.tiles.small_product``: each entry one chain of fused multiply-adds in order, against an
exact route (rationals rounded once per step), on every tile and tail; the products ``blas.matmul`` sends
it; views inside wider arrays."""

from fractions import Fraction

import numba
import numpy as np
import pytest

from attnflow.engine.machinery.blas import TILED_PRODUCT, matmul
from attnflow.engine.machinery.tiles import ROWS, WIDTHS, small_product


@numba.njit
def _tiled(a, b, out):
    small_product(a, b, out)


@numba.njit
def _matmul(a, b, out):
    matmul(a, b, out)


def _fma_chain(a, b):
    """``c_ij = fma(a_i,k-1, b_k-1,j, ... fma(a_i0, b_0j, 0))``: each step the exact a b + c, rounded once
    to float64 (``float`` of a Fraction rounds to nearest, ties to even, as the hardware's fma)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            c = 0.0
            for ell in range(k):
                c = float(Fraction(a[i, ell]) * Fraction(b[ell, j]) + Fraction(c))
            out[i, j] = c
    return out


def _operands(m, k, n, seed):
    rng = np.random.default_rng(seed)
    # Entries of many magnitudes, so that the order of the sums shows in the last bits.
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, (k, n)))
    return a, b


# Rows: whole tiles and every remainder of ROWS; columns: every width of WIDTHS alone and summed.
SHAPES = [(8, 8, 8), (4, 5, 8), (1, 3, 1), (2, 8, 2), (3, 7, 15), (5, 1, 9), (6, 4, 4), (7, 9, 13),
          (9, 16, 17), (12, 3, 23), (2, 2, 6)]


@pytest.mark.parametrize("shape", SHAPES)
def test_each_entry_is_one_fused_chain_in_order(shape):
    m, k, n = shape
    a, b = _operands(m, k, n, m * 10000 + k * 100 + n)
    out = np.full((m, n), np.nan)
    _tiled(a, b, out)
    assert np.array_equal(out, _fma_chain(a, b))


def _widths(n):
    """The tile widths ``small_product`` takes over n columns."""
    return ({8} if n >= 8 else set()) | {w for w in WIDTHS[1:] if n % 8 & w}


def test_the_shapes_cover_every_tile():
    assert {m % ROWS for m, _, _ in SHAPES} == set(range(ROWS)) and any(m >= ROWS for m, _, _ in SHAPES)
    assert set().union(*(_widths(n) for _, _, n in SHAPES)) == set(WIDTHS)


def test_matmul_sends_small_products_to_the_tiles_and_large_ones_to_blas():
    # Small: the tiles' chain exactly (BLAS sums some of these entries in other orders). Large (just above
    # TILED_PRODUCT): np.dot's own bits, as BLAS computes them.
    a, b = _operands(6, 11, 10, 1)
    out = np.full((6, 10), np.nan)
    _matmul(a, b, out)
    assert np.array_equal(out, _fma_chain(a, b))
    m = TILED_PRODUCT // (64 * 64) + 1
    a, b = _operands(m, 64, 64, 2)
    out = np.full((m, 64), np.nan)
    _matmul(a, b, out)
    assert m * 64 * 64 > TILED_PRODUCT and np.array_equal(out, a @ b)


def test_rows_of_wider_matrices_give_the_same_bits():
    # The engine's operands may be views whose rows sit further apart than their width (a head's rows).
    a, b = _operands(9, 13, 11, 5)
    contiguous = np.full((9, 11), np.nan)
    _tiled(a, b, contiguous)
    wide_a, wide_b, wide_out = np.zeros((9, 20)), np.zeros((13, 17)), np.full((9, 16), np.nan)
    wide_a[:, :13], wide_b[:, :11] = a, b
    _tiled(wide_a[:, :13], wide_b[:, :11], wide_out[:, :11])
    assert np.array_equal(wide_out[:, :11], contiguous)


def test_writes_nothing_outside_out():
    # The tiles store whole vectors: a view inside a larger array must leave its neighbours alone.
    a, b = _operands(7, 5, 11, 6)
    big = np.full((9, 15), -1.0)
    _tiled(a, b, big[1:8, 2:13])
    assert np.array_equal(big[1:8, 2:13], _fma_chain(a, b))
    big[1:8, 2:13] = -1.0
    assert (big == -1.0).all()
