"""Matrix products for the compiled kernels: BLAS's ``dgemm``, called directly.

numba's ``np.dot`` reaches the same ``dgemm`` (scipy's ``cython_blas``, whose
BLAS ``threadpoolctl`` limits) through a generic wrapper: layout checks, then a
helper that dispatches on the dtype, then the call. On the small products of a
small cell the wrapper cost as much as the product: an 8x8x8 product took 60 ns
through ``np.dot`` and 32 ns through ``matmul`` (measured), a fifth of a field
evaluation at n = d = 8. Up to 10^6 multiply-adds the call is the one ``np.dot``
makes, so results are bit-identical to it.

The kernels call the symbol ``attnflow_dgemm``, registered with the JIT's linker
in each process (``llvmlite.binding.add_symbol``) as numba does for its own
helpers: compiled code cached on disk names the symbol, not an address.

A product above 10^6 multiply-adds whose right operand is small is taken in
panels of rows (``panel_rows``) where BLAS is an OpenBLAS with AVX-512 kernels:
it computes a product of at most 10^6 multiply-adds with a kernel that reads the
operands in place, and first copies a larger one into packed blocks, which at
these sizes costs more than it saves. The scores ``Y X^T`` and the head output
``W Y`` of a cell of 128 tokens in d = 64 took 31 us each, in two panels 22 us
(one thread, measured), and a field evaluation there 17% less time. On AVX2
kernels (OpenBLAS told to use Haswell's) panels were 6-22% slower, and other
BLAS libraries have no such bound: there every product is one call. The unpacked
kernel sums each entry's products in another order than the packed one on some
shapes (300 x 16 x 300: 2% of the entries differ in the last bit), hence
``NUMERICS_VERSION`` 3.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import get_cython_function_address, intrinsic

from .blas_info import PANELS
from .borrow import borrow

_SYMBOL = "attnflow_dgemm"
llvm.add_symbol(_SYMBOL, get_cython_function_address("scipy.linalg.cython_blas", "dgemm"))

_FORTRAN_INT = ir.IntType(32)  # scipy's cython_blas takes LP64 (32-bit) integers


def _is_c_matrix(ty) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.dtype == types.float64 and ty.layout == "C"


@intrinsic
def _dgemm(typingctx, a, b, out):
    """``out = a @ b`` by Fortran ``dgemm``: row-major ``out^T = b^T a^T`` is ``dgemm('N', 'N', n, m, k,
    1, b, n, a, k, 0, out, n)`` on the same memory. Sizes at least 1 (``matmul`` sees to that)."""
    if not (_is_c_matrix(a) and _is_c_matrix(b) and _is_c_matrix(out)):
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
        one, zero = by_reference(ir.Constant(double, 1.0)), by_reference(ir.Constant(double, 0.0))
        data = [builder.bitcast(array.data, double.as_pointer()) for array in arrays]
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type for ptr in (
            no_transpose, no_transpose, n_, m_, k_, one, data[1], n_, data[0], k_, zero, data[2], n_)])
        dgemm = cgutils.get_or_insert_function(builder.module, fnty, _SYMBOL)
        builder.call(dgemm, [no_transpose, no_transpose, n_, m_, k_, one, data[1], n_, data[0], k_, zero,
                             data[2], n_])
        return context.get_dummy_value()

    return types.none(a, b, out), codegen


# OpenBLAS's bound for its unpacked kernels (kernel/x86_64/dgemm_small_kernel_permit_skylakex.c); whether
# the BLAS has them is ``PANELS`` (blas_info.py).
SMALL_PRODUCT = 1_000_000
# Panels only while the right operand stays in cache (128 KiB): the unpacked kernel reads it again for
# each panel. With a larger one (32 tokens in d = 512: X M_h in 11 panels of 3 rows) a field evaluation
# took 3.5 times as long (measured).
PANEL_OPERAND = 16_384


@numba.njit(cache=True, inline="always")
def panel_rows(m, k, n):
    """The most rows of ``a`` (m, k) per ``dgemm`` call in ``a @ b``, ``b`` (k, n): all ``m`` unless BLAS
    has the unpacked kernels (``PANELS``), the product is above ``SMALL_PRODUCT`` and ``b`` has at most
    ``PANEL_OPERAND`` entries; then at least 61."""
    if not PANELS or m * k * n <= SMALL_PRODUCT or k * n > PANEL_OPERAND:
        return m
    return SMALL_PRODUCT // (k * n)


@numba.njit(cache=True, inline="always")
def matmul(a, b, out):
    """``out = a @ b`` for C-contiguous float64 matrices (``np.dot(a, b, out)`` without its wrapper; in
    panels of rows above 10^6 multiply-adds where ``panel_rows`` says so).

    Shapes that do not match (a bug in the caller: the engine's buffers have their shapes by
    construction) fill ``out`` with NaN, which the finite check of every result reports, rather than
    letting BLAS read or write past an array (``np.dot`` would raise; a raise costs each caller
    compile time and speed, see ``field.attention_weights``). Dimensions stay far below 2^31, the
    range of BLAS's integers, for any cell the resources allow.
    """
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or out.shape[0] != m or out.shape[1] != n:
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = np.nan
        return
    if m <= 1 or n <= 1 or k == 0:
        # A row or a column: np.dot takes a matrix-vector product there (another summation, so
        # another result in the last bit), and handles the empty cases; keep its results.
        np.dot(a, b, out)
        return
    rows = panel_rows(m, k, n)
    if rows >= m:
        _dgemm(a, b, out)
    else:
        _in_panels(a, b, out, rows)


@numba.njit(cache=True, inline="never")
def _in_panels(a, b, out, rows):
    """``out = a @ b`` in balanced panels of at most ``rows`` rows. Not inlined: one copy of the loop,
    not one at each of the engine's 15 products, whose compilation it made 6-8 s longer (measured)."""
    a, b, out = borrow((a, b, out))
    m = a.shape[0]
    count = (m + rows - 1) // rows
    start = 0
    for panel in range(count):
        stop = start + (m - start) // (count - panel)
        _dgemm(a[start:stop], b, out[start:stop])
        start = stop
