"""Vectors as wide as the CPU's registers in a compiled function's loops.

On Intel's CPUs with AVX-512 (Skylake-X and later), LLVM vectorises loops in
256-bit registers unless a function asks for more (the function attribute
``prefer-vector-width``): on the first such CPUs, 512-bit instructions lowered
the clock. ``wide_vectors()``, called anywhere in a compiled function, asks for
512 bits. Where LLVM already takes them (AMD's Zen 4) or the CPU has no such
registers, nothing changes. Only the loops' width changes, not an operation of
the arithmetic (no reassociation), so every result is the same bit for bit.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import intrinsic

ATTRIBUTE = '"prefer-vector-width"="512"'


@intrinsic
def wide_vectors(typingctx):
    """Mark the calling compiled function for 512-bit vectors (see the module's docstring)."""

    def codegen(context, builder, sig, args):
        # llvmlite's attribute set takes LLVM's keyword attributes only (its add() checks them); a
        # key-value attribute goes in as its IR text, which the set prints as it is.
        set.add(builder.function.attributes, ATTRIBUTE)
        return context.get_dummy_value()

    return types.none(), codegen
