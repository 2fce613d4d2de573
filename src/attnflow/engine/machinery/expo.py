"""A vectorisable exp for the compiled kernels.

numba's ``np.exp`` is a scalar libm call unless Intel's SVML is installed, and
then its results depend on whether it is. This one is plain arithmetic that
LLVM vectorises: Cody-Waite reduction ``x = k ln 2 + r``, ``|r| <= ln(2)/2``,
a degree-13 Taylor polynomial (truncation below 5e-18 relative) in Horner
form with fused multiply-adds where the CPU has them (``fastmath`` allows
contraction only, no reassociation), and ``2^k`` assembled from its exponent
bits in a register (``_from_bits``: no scratch array and no second pass). In
512-bit registers where the CPU has them (``wide_vectors``; bit for bit the
same results). Measured within 1 ulp of the correctly rounded result
(tests/test_engine.py), with or without SVML installed.
Arguments below -708 return ``exp(-708)`` (~3e-308) rather than a subnormal,
and from 709.44 (where ``k`` reaches 1024) ``+inf``, below float64's own
overflow at 709.78;
the engine only takes exps of non-positive softmax logits (where that is far
below the row's largest weight, 1) and of ``beta s`` bounded by ``Cell``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from .borrow import borrow

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # high bits of ln 2: k * _LN2_HI is exact for |k| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_LOWEST = -708.0
# Above ln(max float64) ~ 709.78, 2^k with k = 1024 assembles to +inf: clamping here keeps k from
# wrapping the exponent bits into the sign bit (exp(711) would come out as -1.9e-308).
_HIGHEST = 710.0
# A function attribute (LLVM's IR text; llvmlite's attribute set takes LLVM's keyword attributes only,
# its add() checks them, and prints a key-value one as it is).
WIDE_VECTORS = '"prefer-vector-width"="512"'
(_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13) = (
    1.0 / math.factorial(k) for k in range(14)
)


@intrinsic
def _from_bits(typingctx, bits):
    """The float64 whose bit pattern is the int64 ``bits`` (a register move)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def wide_vectors(typingctx):
    """Mark the calling compiled function for 512-bit vectors: on Intel's CPUs with AVX-512 (Skylake-X
    and later) LLVM vectorises loops in 256-bit registers unless a function asks for more (on the
    first such CPUs, 512-bit instructions lowered the clock). Where LLVM already takes 512 bits (AMD's
    Zen 4) or the CPU has no such registers, nothing changes. Only the loops' width changes, not an
    operation (no reassociation): every result is the same bit for bit."""

    def codegen(context, builder, sig, args):
        set.add(builder.function.attributes, WIDE_VECTORS)
        return context.get_dummy_value()

    return types.none(), codegen


@numba.njit(cache=True, fastmath={"contract"})
def exp_inplace(a):
    """``a[:] = exp(a)`` for a 1-d float64 array."""
    wide_vectors()
    a = borrow(a)
    for j in range(a.size):
        x = min(max(a[j], _LOWEST), _HIGHEST)
        k = np.floor(x * _LOG2E + 0.5)
        r = (x - k * _LN2_HI) - k * _LN2_LO
        p = _C13
        p = p * r + _C12
        p = p * r + _C11
        p = p * r + _C10
        p = p * r + _C9
        p = p * r + _C8
        p = p * r + _C7
        p = p * r + _C6
        p = p * r + _C5
        p = p * r + _C4
        p = p * r + _C3
        p = p * r + _C2
        p = p * r + _C1
        a[j] = (p * r + _C0) * _from_bits((np.int64(k) + 1023) << 52)
