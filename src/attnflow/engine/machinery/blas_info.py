"""The BLAS loaded in the process: its libraries, whose threads the engine limits, and whether it has
the kernels the products' panels are for (``PANELS``, blas.py).

No compiled code here: the engine's cache stamp reads ``PANELS`` (cache.py) while the modules
with compiled functions are still being imported.
"""

from __future__ import annotations

import functools

import scipy.linalg.cython_blas  # noqa: F401  the BLAS the compiled products call
from threadpoolctl import ThreadpoolController

# The OpenBLAS cores with unpacked kernels for products of at most 10^6 multiply-adds (OpenBLAS's names,
# as threadpoolctl reports them).
UNPACKED_KERNEL_CORES = frozenset({"SkylakeX", "Cooperlake", "SapphireRapids"})


@functools.cache
def loaded_blas() -> ThreadpoolController:
    """The BLAS libraries loaded: one lookup of the process's libraries, reused."""
    return ThreadpoolController()


# Whether the BLAS is an OpenBLAS running AVX-512 kernels. A constant of the compiled code; the engine's
# cache is stamped with it.
PANELS = any(lib.get("internal_api") == "openblas" and lib.get("architecture") in UNPACKED_KERNEL_CORES
             for lib in loaded_blas().info())
