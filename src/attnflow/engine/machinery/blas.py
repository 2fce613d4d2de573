"""Matrix products for the compiled kernels: the engine's own tiles for small ones, BLAS's ``dgemm``,
called directly, for the others.

Products of at most ``TILED_PRODUCT`` multiply-adds go to ``tiles.small_product``
(each entry one chain of fused multiply-adds, the same bits on every machine):
faster than any call to BLAS at these sizes, and threads computing them at once
do not slow each other down, as they do in OpenBLAS's AVX2 builds (tiles.py).

numba's ``np.dot`` reaches the same ``dgemm`` (scipy's ``cython_blas``, whose
BLAS ``threadpoolctl`` limits) through a generic wrapper: layout checks, then a
helper that dispatches on the dtype, then the call. Up to 10^6 multiply-adds
the call is the one ``np.dot`` makes, so results are bit-identical to it.

The kernels call the symbol ``attnflow_dgemm``, registered with the JIT's linker
in each process (``llvmlite.binding.add_symbol``) as numba does for its own
helpers: compiled code cached on disk names the symbol, not an address.

A product above 10^6 multiply-adds whose right operand is small is taken in
panels of rows (``panel_rows``) where BLAS is an OpenBLAS with AVX-512 kernels:
it computes a product of at most 10^6 multiply-adds with a kernel that reads the
operands in place, and first copies a larger one into packed blocks, which at
these sizes costs more than it saves. On AVX2 kernels panels are slower, and
other BLAS libraries have no such bound: there every product is one call. The
unpacked kernel sums each entry's products in another order than the packed
one on some shapes (the last bit of a few entries), hence ``NUMERICS_VERSION`` 3.

Operands may be views whose rows sit further apart than their width: BLAS takes
each matrix's leading dimension from its strides.

What each of these buys, measured: docs/performance.md, "Engine machinery".
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import get_cython_function_address, intrinsic, overload

from .blas_info import PANELS
from .borrow import as_c, borrow
from .tiles import is_matrix, small_product

_SYMBOL = "attnflow_dgemm"
llvm.add_symbol(_SYMBOL, get_cython_function_address("scipy.linalg.cython_blas", "dgemm"))

_FORTRAN_INT = ir.IntType(32)  # scipy's cython_blas takes LP64 (32-bit) integers


@intrinsic
def _dgemm(typingctx, a, b, out):
    """``out = a @ b`` by Fortran ``dgemm``: row-major ``out^T = b^T a^T`` is ``dgemm('N', 'N', n, m, k,
    1, b, ldb, a, lda, 0, out, ldc)`` on the same memory, each leading dimension the matrix's row
    stride in entries. Sizes at least 1, the entries of each row adjacent (``matmul`` sees to both)."""
    if not (is_matrix(a) and is_matrix(b) and is_matrix(out)):
        return None

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(ty)(context, builder, value=v)
                  for ty, v in zip(sig.args, args, strict=True)]
        m, k = cgutils.unpack_tuple(builder, arrays[0].shape, 2)
        n = cgutils.unpack_tuple(builder, arrays[1].shape, 2)[1]

        def by_reference(value):
            return cgutils.alloca_once_value(builder, value)

        def fortran_int(value):
            return by_reference(builder.trunc(value, _FORTRAN_INT))

        double = ir.DoubleType()
        no_transpose = by_reference(ir.Constant(ir.IntType(8), ord("N")))
        m_, n_, k_ = fortran_int(m), fortran_int(n), fortran_int(k)
        eight = ir.Constant(m.type, 8)
        lda, ldb, ldc = (fortran_int(builder.sdiv(cgutils.unpack_tuple(builder, array.strides, 2)[0], eight))
                         for array in arrays)
        one, zero = by_reference(ir.Constant(double, 1.0)), by_reference(ir.Constant(double, 0.0))
        data = [builder.bitcast(array.data, double.as_pointer()) for array in arrays]
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type for ptr in (
            no_transpose, no_transpose, n_, m_, k_, one, data[1], ldb, data[0], lda, zero, data[2], ldc)])
        dgemm = cgutils.get_or_insert_function(builder.module, fnty, _SYMBOL)
        builder.call(dgemm, [no_transpose, no_transpose, n_, m_, k_, one, data[1], ldb, data[0], lda, zero,
                             data[2], ldc])
        return context.get_dummy_value()

    return types.none(a, b, out), codegen


# Products of at most this many multiply-adds go to ``tiles.small_product``: 2-3x faster than BLAS up to
# 65,536 (8x8x8 to 32x64x32), even at 262,144 (64x64x64), slower from 524,288 (one BLAS thread, machine B).
TILED_PRODUCT = 131_072
# OpenBLAS's bound for its unpacked kernels (kernel/x86_64/dgemm_small_kernel_permit_skylakex.c); whether
# the BLAS has them is ``PANELS`` (blas_info.py).
SMALL_PRODUCT = 1_000_000
# Panels only while the right operand stays in cache (128 KiB): the unpacked kernel reads it again for
# each panel, and a larger one made a field evaluation several times slower.
PANEL_OPERAND = 16_384


@numba.njit(cache=True, inline="always")
def panel_rows(m, k, n):
    """The most rows of ``a`` (m, k) per ``dgemm`` call in ``a @ b``, ``b`` (k, n): all ``m`` unless BLAS
    has the unpacked kernels (``PANELS``), the product is above ``SMALL_PRODUCT`` and ``b`` has at most
    ``PANEL_OPERAND`` entries; then at least 61."""
    if not PANELS or m * k * n <= SMALL_PRODUCT or k * n > PANEL_OPERAND:
        return m
    return SMALL_PRODUCT // (k * n)


@numba.njit(cache=True)
def matmul(a, b, out):
    """``out = a @ b`` for float64 matrices whose rows each hold adjacent entries (C-contiguous, or
    views of rows of wider matrices): by the tiles up to ``TILED_PRODUCT`` multiply-adds; above,
    ``np.dot(a, b, out)`` without its wrapper, in panels of rows above 10^6 multiply-adds where
    ``panel_rows`` says so.

    Shapes that do not match, or rows whose entries are not adjacent (a bug in the caller: the
    engine's buffers have their shapes and layouts by construction) fill ``out`` with NaN, which the
    finite check of every result reports, rather than letting BLAS read or write past an array
    (``np.dot`` would raise; a raise costs each caller compile time and speed, see
    ``field.attention_weights``). Dimensions stay far below 2^31, the range of BLAS's integers, for
    any cell the resources allow.

    A call, compiled once: inlined at each of the engine's products (by numba or by LLVM) the
    first compilation took longer for no speed that counts (docs/performance.md, "Engine machinery").
    """
    a, b, out = borrow((a, b, out))
    m, k = a.shape
    n = b.shape[1]
    if (b.shape[0] != k or out.shape[0] != m or out.shape[1] != n
            or not (_adjacent(a) and _adjacent(b) and _adjacent(out))):
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = np.nan
        return
    if m <= 1 or n <= 1 or k == 0:
        _row_or_column(a, b, out)
        return
    if m * k * n <= TILED_PRODUCT:
        small_product(a, b, out)
        return
    rows = panel_rows(m, k, n)
    if rows >= m:
        _dgemm(a, b, out)
    else:
        _in_panels(a, b, out, rows)


@numba.njit(cache=True, inline="never")
def _row_or_column(a, b, out):
    """``out = a @ b`` for a row or a column, or an empty sum. np.dot takes a matrix-vector product
    there (another summation, so another result in the last bit) and handles the empty cases: keep its
    results. It takes C-contiguous operands only; a view of rows of a wider matrix goes to
    BLAS's product (np.dot on copies would cost every first compilation its own seconds). Not inlined:
    one copy for the engine's products, not one each."""
    a, b, out = borrow((a, b, out))
    if _contiguous(a) and _contiguous(b) and _contiguous(out):
        np.dot(as_c(a), as_c(b), as_c(out))
    elif a.shape[1] == 0:  # an empty sum, as np.dot makes it
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = 0.0
    elif out.size > 0:
        _dgemm(a, b, out)


@numba.njit(cache=True, inline="never")
def _in_panels(a, b, out, rows):
    """``out = a @ b`` in balanced panels of at most ``rows`` rows. Not inlined: one copy of the loop,
    not one at each of the engine's products (compile time)."""
    a, b, out = borrow((a, b, out))
    m = a.shape[0]
    count = (m + rows - 1) // rows
    start = 0
    for panel in range(count):
        stop = start + (m - start) // (count - panel)
        _dgemm(a[start:stop], b, out[start:stop])
        start = stop


def _true_when_typed_c(check):
    """Compile the matrix test ``check`` as it is, or as ``True`` for a matrix typed C-contiguous: the
    products of a small cell pay for no test."""

    @overload(check)
    def compiled(matrix):
        if matrix.layout == "C":
            def typed_c(matrix):
                return True
            return typed_c
        return check

    return check


@_true_when_typed_c
def _adjacent(matrix):
    """Whether each row's entries are adjacent in memory (moot for rows of one entry, or no entries)."""
    return matrix.size == 0 or matrix.shape[1] == 1 or matrix.strides[1] == 8


@_true_when_typed_c
def _contiguous(matrix):
    """Whether ``matrix`` is C-contiguous in memory, whatever its type says (a view of one row
    is)."""
    if matrix.size == 0:
        return True
    rows, cols = matrix.shape
    return (cols == 1 or matrix.strides[1] == 8) and (rows == 1 or matrix.strides[0] == 8 * cols)
