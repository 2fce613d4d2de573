"""Small matrix products in registers: ``out = a @ b`` by tiles of vector accumulators.

Each entry is one chain of fused multiply-adds over the inner index in order,
``c = fma(a_il, b_lj, c)`` for ``l = 0 .. k-1`` from ``c = 0``: how OpenBLAS's
unpacked kernels for AVX-512 sum most small products, so there a product is
BLAS's own bit for bit (``blas.tiled`` says which products go here). How the
entries are grouped into tiles changes nothing in the arithmetic.

A tile is ``ROWS`` rows by up to 8 columns of ``out``, its accumulators LLVM
vectors that stay in registers while the inner index runs (compiled loops in
numba kept them in memory: an 8x8x8 product took 213 ns that way, 71 ns
through BLAS, measured on AMD's Zen 4). The tiles are written in LLVM IR
(``_tile``): numba has no vector type.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .borrow import borrow

_DOUBLE = ir.DoubleType()
# Rows of a full tile: four independent chains of fused multiply-adds cover the latency of one on
# Zen 4 (four cycles, one vector fma a cycle).
ROWS = 4
# Columns of a tile, from the widest (one AVX-512 register) down: any width is a sum of these.
WIDTHS = (8, 4, 2, 1)


def _matrix(ty) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.dtype == types.float64 and ty.layout in "CA"


def _tile(rows: int, width: int):
    """An intrinsic ``tile(a, b, out, i, j)``: ``out[i:i+rows, j:j+width] = a[i:i+rows] @ b[:, j:j+width]``,
    for rows whose entries are adjacent; no bounds checked (``small_product`` stays inside)."""

    @intrinsic
    def tile(typingctx, a, b, out, i, j):
        if not (_matrix(a) and _matrix(b) and _matrix(out)
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            arrays = [context.make_array(ty)(context, builder, value=v)
                      for ty, v in zip(sig.args[:3], args[:3], strict=True)]
            intp = context.get_value_type(types.intp)
            i0 = context.cast(builder, args[3], sig.args[3], types.intp)
            j0 = context.cast(builder, args[4], sig.args[4], types.intp)
            k = cgutils.unpack_tuple(builder, arrays[0].shape, 2)[1]
            eight = ir.Constant(intp, 8)
            lda, ldb, ldc = (builder.sdiv(cgutils.unpack_tuple(builder, array.strides, 2)[0], eight)
                             for array in arrays)
            base_a, base_b, base_c = (builder.bitcast(array.data, _DOUBLE.as_pointer()) for array in arrays)

            vector = ir.VectorType(_DOUBLE, width)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                                 f"llvm.fma.v{width}f64")
            int32 = ir.IntType(32)
            undefined = ir.Constant(vector, ir.Undefined)
            lane_zero = ir.Constant(ir.VectorType(int32, width), [0] * width)  # every lane from lane 0

            def row_start(base, row, stride):
                return builder.gep(base, [builder.mul(builder.add(i0, ir.Constant(intp, row)), stride)])

            a_rows = [row_start(base_a, r, lda) for r in range(rows)]
            c_rows = [builder.gep(row_start(base_c, r, ldc), [j0]) for r in range(rows)]
            b_column = builder.gep(base_b, [j0])
            # Accumulators in allocas that LLVM's mem2reg turns into registers carried by the loop.
            zero = ir.Constant(vector, None)
            accumulators = [cgutils.alloca_once_value(builder, zero) for _ in range(rows)]
            with cgutils.for_range(builder, k) as loop:
                l_ = loop.index
                b_row = builder.bitcast(builder.gep(b_column, [builder.mul(l_, ldb)]), vector.as_pointer())
                b_values = builder.load(b_row, align=8)
                for a_row, acc in zip(a_rows, accumulators, strict=True):
                    a_value = builder.load(builder.gep(a_row, [l_]))
                    first = builder.insert_element(undefined, a_value, ir.Constant(int32, 0))
                    splat = builder.shuffle_vector(first, undefined, lane_zero)
                    builder.store(builder.call(fma, [splat, b_values, builder.load(acc)]), acc)
            for c_row, acc in zip(c_rows, accumulators, strict=True):
                builder.store(builder.load(acc), builder.bitcast(c_row, vector.as_pointer()), align=8)
            return context.get_dummy_value()

        return types.none(a, b, out, i, j), codegen

    return tile


_FULL = {width: _tile(ROWS, width) for width in WIDTHS}
_SINGLE = {width: _tile(1, width) for width in WIDTHS}
_full8, _full4, _full2, _full1 = (_FULL[w] for w in WIDTHS)
_single8, _single4, _single2, _single1 = (_SINGLE[w] for w in WIDTHS)


@numba.njit(cache=True, inline="never")
def small_product(a, b, out):
    """``out = a @ b`` by tiles (see the module's docstring). Shapes must match and each row's entries
    be adjacent: ``blas.matmul`` checks both."""
    a, b, out = borrow((a, b, out))
    m = a.shape[0]
    n = b.shape[1]
    i = 0
    while i + ROWS <= m:
        j = 0
        while j + 8 <= n:
            _full8(a, b, out, i, j)
            j += 8
        if j + 4 <= n:
            _full4(a, b, out, i, j)
            j += 4
        if j + 2 <= n:
            _full2(a, b, out, i, j)
            j += 2
        if j < n:
            _full1(a, b, out, i, j)
        i += ROWS
    while i < m:
        j = 0
        while j + 8 <= n:
            _single8(a, b, out, i, j)
            j += 8
        if j + 4 <= n:
            _single4(a, b, out, i, j)
            j += 4
        if j + 2 <= n:
            _single2(a, b, out, i, j)
            j += 2
        if j < n:
            _single1(a, b, out, i, j)
        i += 1
