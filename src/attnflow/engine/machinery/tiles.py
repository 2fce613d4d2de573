"""Small matrix products in registers: ``out = a @ b`` by tiles of vector accumulators.

Each entry is one chain of fused multiply-adds over the inner index in order,
``c = fma(a_il, b_lj, c)`` for ``l = 0 .. k-1`` from ``c = 0``, on every
machine: how the entries are grouped into tiles changes nothing in the
arithmetic. ``blas.matmul`` sends every product up to ``blas.TILED_PRODUCT``
multiply-adds here instead of to BLAS's ``dgemm``.

Why: a small ``dgemm`` is mostly the call, and where OpenBLAS runs its AVX2
kernels (it has a path for small products with its AVX-512 ones only) two
threads calling it at once slow each other down: an 8x8x8 product took 173 ns
alone and 584 ns beside another thread through BLAS, 61 and 62 ns here; a
32x32x32 one 3.5 us through BLAS, 1.9 us here (one BLAS thread, machine B;
docs/performance.md, "Engine machinery"). The tiles share nothing between
threads.

A tile is ``ROWS`` rows by up to 8 columns of ``out``, its accumulators LLVM
vectors that stay in registers while the inner index runs (compiled loops in
numba kept them in memory: an 8x8x8 product took 3x as long). The tiles are
written in LLVM IR (``_row_block``): numba has no vector type.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .borrow import borrow

_DOUBLE = ir.DoubleType()
# Rows of a full tile: four independent chains of fused multiply-adds cover the latency of one (four
# cycles, one vector fma a cycle, on Zen 4).
ROWS = 4
# Columns of a tile, from the widest (one AVX-512 register, two AVX2 ones) down, powers of two: any width
# is a sum of these.
WIDTHS = (8, 4, 2, 1)


def is_matrix(ty) -> bool:
    """A float64 matrix type, C-contiguous or a view of one whose rows may be further apart ('A'): what
    the products (the tiles, and ``blas``'s call to BLAS) take."""
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.dtype == types.float64 and ty.layout in "CA"


def _row_block(rows: int):
    """An intrinsic ``block(a, b, out, i)``: ``out[i:i+rows] = a[i:i+rows] @ b``, by tiles of ``rows`` rows
    and 8 columns, then one tile of each width in ``WIDTHS`` that the remaining columns hold; rows
    whose entries are adjacent, no bounds checked (``small_product`` stays inside)."""

    @intrinsic
    def block(typingctx, a, b, out, i):
        if not (is_matrix(a) and is_matrix(b) and is_matrix(out) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            arrays = [context.make_array(ty)(context, builder, value=v)
                      for ty, v in zip(sig.args[:3], args[:3], strict=True)]
            intp = context.get_value_type(types.intp)
            i0 = context.cast(builder, args[3], sig.args[3], types.intp)
            k = cgutils.unpack_tuple(builder, arrays[0].shape, 2)[1]
            n = cgutils.unpack_tuple(builder, arrays[1].shape, 2)[1]
            eight = ir.Constant(intp, 8)
            lda, ldb, ldc = (builder.sdiv(cgutils.unpack_tuple(builder, array.strides, 2)[0], eight)
                             for array in arrays)
            base_a, base_b, base_c = (builder.bitcast(array.data, _DOUBLE.as_pointer()) for array in arrays)
            a_rows = [builder.gep(base_a, [builder.mul(builder.add(i0, ir.Constant(intp, r)), lda)])
                      for r in range(rows)]
            c_rows = [builder.gep(base_c, [builder.mul(builder.add(i0, ir.Constant(intp, r)), ldc)])
                      for r in range(rows)]

            def tile(width, j0):
                """``out[i:i+rows, j0:j0+width]``: one vector accumulator a row, in registers while the
                inner index runs (allocas that LLVM's mem2reg promotes), each lane one fma chain."""
                vector = ir.VectorType(_DOUBLE, width)
                fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                                     f"llvm.fma.v{width}f64")
                int32 = ir.IntType(32)
                undefined = ir.Constant(vector, ir.Undefined)
                lane_zero = ir.Constant(ir.VectorType(int32, width), [0] * width)  # every lane from lane 0
                b_column = builder.gep(base_b, [j0])
                accumulators = [cgutils.alloca_once_value(builder, ir.Constant(vector, None)) for _ in a_rows]
                with cgutils.for_range(builder, k) as loop:
                    l_ = loop.index
                    b_row = builder.gep(b_column, [builder.mul(l_, ldb)])
                    b_values = builder.load(builder.bitcast(b_row, vector.as_pointer()), align=8)
                    for a_row, acc in zip(a_rows, accumulators, strict=True):
                        first = builder.insert_element(undefined, builder.load(builder.gep(a_row, [l_])),
                                                       ir.Constant(int32, 0))
                        splat = builder.shuffle_vector(first, undefined, lane_zero)
                        builder.store(builder.call(fma, [splat, b_values, builder.load(acc)]), acc)
                for c_row, acc in zip(c_rows, accumulators, strict=True):
                    target = builder.bitcast(builder.gep(c_row, [j0]), vector.as_pointer())
                    builder.store(builder.load(acc), target, align=8)

            widest = WIDTHS[0]
            whole = builder.and_(n, ir.Constant(intp, -widest))  # the columns in tiles of the widest
            with cgutils.for_range_slice(builder, ir.Constant(intp, 0), whole, ir.Constant(intp, widest),
                                         intp=intp) as (j0, _):
                tile(widest, j0)
            for width in WIDTHS[1:]:  # the rest in binary: a tile of width w where n has the bit w
                with builder.if_then(builder.icmp_signed("!=", builder.and_(n, ir.Constant(intp, width)),
                                                         ir.Constant(intp, 0))):
                    tile(width, builder.and_(n, ir.Constant(intp, -2 * width)))
            return context.get_dummy_value()

        return types.none(a, b, out, i), codegen

    return block


_full_rows, _single_row = _row_block(ROWS), _row_block(1)


@numba.njit(cache=True, inline="never")
def small_product(a, b, out):
    """``out = a @ b`` by tiles (see the module's docstring). Shapes must match and each row's entries
    be adjacent: ``blas.matmul`` checks both."""
    a, b, out = borrow((a, b, out))
    m = a.shape[0]
    i = 0
    while i + ROWS <= m:
        _full_rows(a, b, out, i)
        i += ROWS
    while i < m:
        _single_row(a, b, out, i)
        i += 1
