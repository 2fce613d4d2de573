"""LLVM function attributes, set from inside a compiled function by calling an intrinsic there.

``wide_vectors()``: vectors as wide as the CPU's registers in the function's
loops. On Intel's CPUs with AVX-512 (Skylake-X and later), LLVM vectorises
loops in 256-bit registers unless a function asks for more (the attribute
``prefer-vector-width``): on the first such CPUs, 512-bit instructions lowered
the clock. Where LLVM already takes 512 bits (AMD's Zen 4) or the CPU has no
such registers, nothing changes. Only the loops' width changes, not an
operation of the arithmetic (no reassociation), so every result is the same
bit for bit.

``always_inline()``: LLVM inlines the function at each call site, while numba
compiles it once. numba's own ``inline="always"`` copies the function's IR
into each caller and types it there again, which for ``blas.matmul`` at the
engine's products cost the first compilation seconds. Inlined by LLVM, the
compiled code is the same.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import intrinsic

WIDE_VECTORS = '"prefer-vector-width"="512"'


@intrinsic
def wide_vectors(typingctx):
    """Mark the calling compiled function for 512-bit vectors (see the module's docstring)."""

    def codegen(context, builder, sig, args):
        # llvmlite's attribute set takes LLVM's keyword attributes only (its add() checks them); a
        # key-value attribute goes in as its IR text, which the set prints as it is.
        set.add(builder.function.attributes, WIDE_VECTORS)
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def always_inline(typingctx):
    """Have LLVM inline the calling compiled function wherever it is called (see the module's
    docstring)."""

    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()

    return types.none(), codegen
