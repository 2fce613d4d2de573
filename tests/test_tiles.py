"""``engine.tiles.small_product``: each entry one chain of fused multiply-adds in order, against an exact
route (rationals rounded once per step), on every tile and tail; and on every product ``blas.matmul``
sends it, the same bits as BLAS's own unpacked kernels."""

from fractions import Fraction

import numba
import numpy as np
import pytest

from attnflow.engine.blas import PANELS, padded, tiled
from attnflow.engine.tiles import ROWS, WIDTHS, small_product


@numba.njit
def _tiled(a, b, out):
    small_product(a, b, out)


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


# Rows: whole tiles and every remainder of ROWS; columns: every width of WIDTHS alone and summed.
SHAPES = [(8, 8, 8), (4, 5, 8), (1, 3, 1), (2, 8, 2), (3, 7, 15), (5, 1, 9), (6, 4, 4), (7, 9, 13),
          (9, 16, 17), (12, 3, 23), (2, 2, 6)]


@pytest.mark.parametrize("shape", SHAPES)
def test_each_entry_is_one_fused_chain_in_order(shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    # Entries of many magnitudes, so that the order of the sums shows in the last bits.
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, (k, n)))
    out = np.full((m, n), np.nan)
    _tiled(a, b, out)
    assert np.array_equal(out, _fma_chain(a, b))


def _widths(n):
    """The tile widths ``small_product`` takes over n columns."""
    return ({8} if n >= 8 else set()) | {w for w in WIDTHS[1:] if n % 8 & w}


def test_the_shapes_cover_every_tile():
    assert {m % ROWS for m, _, _ in SHAPES} == set(range(ROWS)) and any(m >= ROWS for m, _, _ in SHAPES)
    assert set().union(*(_widths(n) for _, _, n in SHAPES)) == set(WIDTHS)


def test_padded_operands_give_the_same_bits():
    rng = np.random.default_rng(5)
    m, k, n = 9, 130, 131  # rows of 130 and 131 entries are padded (PAD_FROM = 128)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    contiguous, pout = np.full((m, n), np.nan), padded(m, n)
    _tiled(a, b, contiguous)
    pa, pb = padded(m, k), padded(k, n)
    pa[:], pb[:], pout[:] = a, b, np.nan
    _tiled(pa, pb, pout)
    assert np.array_equal(pout, contiguous)


def test_writes_nothing_outside_out():
    # The tiles store whole vectors: a view inside a larger array must leave its neighbours alone.
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 11))
    big = np.full((9, 15), -1.0)
    _tiled(a, b, big[1:8, 2:13])
    assert np.array_equal(big[1:8, 2:13], _fma_chain(a, b))
    big[1:8, 2:13] = -1.0
    assert (big == -1.0).all()


@pytest.mark.skipif(not PANELS, reason="BLAS is not an OpenBLAS with its AVX-512 unpacked kernels")
def test_where_tiled_the_bits_are_blas_own():
    # Every shape matmul sends to the tiles, up to 40 rows and columns: the same bits as np.dot's call
    # to BLAS, so stores made through BLAS keep theirs. The shapes it keeps for BLAS do differ (the
    # check that the rule is not vacuous: 25 x 25 x 26 differs in most draws).
    rng = np.random.default_rng(7)
    checked = 0
    for m in range(2, 41):
        for k in range(1, 41):
            for n in range(2, 41):
                if not tiled.py_func(m, k, n):
                    continue
                a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
                through_dot, tiles = np.empty((m, n)), np.empty((m, n))
                _dot_and_tiles(a, b, through_dot, tiles)
                assert np.array_equal(tiles, through_dot), (m, k, n)
                checked += 1
    assert checked > 30_000
    a, b = rng.standard_normal((25, 25)), rng.standard_normal((25, 26))
    assert not tiled.py_func(25, 25, 26)
    through_dot, tiles = np.empty((25, 26)), np.empty((25, 26))
    _dot_and_tiles(a, b, through_dot, tiles)
    assert not np.array_equal(tiles, through_dot)


@numba.njit
def _dot_and_tiles(a, b, through_dot, tiles):
    np.dot(a, b, through_dot)
    small_product(a, b, tiles)


def test_no_tiles_without_the_unpacked_kernels(monkeypatch):
    # Other BLAS kernels sum in other orders (OpenBLAS's AVX2 ones differ on 3 x 8 x 4): BLAS keeps
    # every product there.
    monkeypatch.setattr("attnflow.engine.blas.PANELS", False)
    assert not tiled.py_func(8, 8, 8)
