"""The engine's machinery: what makes the compiled math fast and safe to cache, behind one contract.

The math (``field.py``, ``measure.py``, ``dopri.py``) imports from here and
from nowhere else in this folder; nothing here knows the attention flow.
docs/performance.md ("Engine machinery: what each piece buys") gives the
figure each piece was kept for.

The names the math may call, inside compiled code:

- ``borrow(value)``: an array, or a tuple/record of arrays and scalars, as views
  without a reference count (``borrow.py``). ``keep(value)``: a use the
  compiler keeps, so an owner outlives the views borrowed from it.
- ``by_reference(record)`` / ``dereference(ref)``: a record passed to a
  compiled function as one pointer instead of every scalar of every array in it.
- ``flat(array)``: a C-contiguous array as a borrowed 1-d view.
- ``matmul(a, b, out)``: ``out = a @ b``; small products by the engine's own tiles
  of vector registers, each entry one chain of fused multiply-adds (``tiles.py``),
  the others by BLAS's ``dgemm``, bit for bit what ``np.dot`` gives (``blas.py``).
- ``exp_inplace(a)``: ``a[:] = exp(a)`` for a 1-d array, vectorised, within 1 ulp,
  the same on every machine (``expo.py``).
- ``lane_sum(a)``, ``lane_max(a)``, ``copy_into(dst, src)``, ``transpose_into(x, xt)``:
  a sum and a maximum in a fixed order, a copy and a transpose (``arrays.py``).
- ``take_next(counter)``: the next trajectory of a batch, atomically (``threads.py``).

And on the Python side (``attnflow.engine``): ``run_threads(kernel, items, *args)``
runs a ``nogil`` kernel on the cores, compiled once per machine under a lock;
``loaded_blas()`` limits BLAS's threads; importing this package stamps numba's
cache of every engine source (``cache.py``).

The rules the math keeps, each the reason the names above are fast:

1. **Borrow on entry.** A compiled function that is not inlined borrows its
   array arguments first (``x, y = borrow((x, y))``), although its callers pass
   borrowed views: compiled alone, it cannot know. Borrow only what an owner
   bound for longer holds; end the owner's life with ``keep(owner)``.
2. **Records by reference.** The trajectory's records (``HeadArrays``,
   ``Workspace``, ``Scratch``, ``Outputs``) go to ``field`` and ``measure`` as
   ``by_reference(record)``, made once per trajectory; the callee reads them
   with ``dereference(ref)``. Never return or store a reference.
3. **Never raise.** Compiled code has no exceptions: the Python side refuses
   bad input by name first (``attnflow.contract``'s ``check_attention``,
   ``check_mask``, ``check_batch``; ``engine.check_declarations`` at import). A
   branch that cannot be reached writes NaN (or returns False/0), which the
   finite checks report.
4. **No default branch.** A dispatch over a declaration (``Weights``,
   ``MaskRule``, ``Form``, ``Metric``, ...) names every member; its final
   ``else`` only poisons (rule 3). tests/test_engine_dispatch.py reads the sources.
5. **The products, sums, copies here, not numpy's.** ``np.dot``, slice
   assignment, ``reshape`` and ``ravel`` in a compiled function cost compile time
   (their checks and messages) and, in the loop, speed; and the order of a sum
   decides its last bits.
6. **One trajectory per call, one thread per trajectory, single-threaded BLAS.**
   A trajectory's arithmetic is then the same whatever the batch, the core
   count or the thread that runs it: results are bit-identical.
7. **Every compiled function is ``numba.njit(cache=True)`` in a file under
   ``engine/``.** The cache is stamped with all of them (``cache.sources``), so
   an edit to any one recompiles every entry point that carries its code.
"""

from __future__ import annotations

from . import cache  # noqa: F401  (first: every compiled function after this is cached under the stamp)
from .arrays import copy_into, lane_max, lane_sum, transpose_into
from .blas import matmul
from .blas_info import loaded_blas
from .borrow import borrow, by_reference, dereference, flat, keep
from .expo import exp_inplace
from .threads import run_threads, take_next

__all__ = ["borrow", "by_reference", "copy_into", "dereference", "exp_inplace", "flat", "keep", "lane_max",
           "lane_sum", "loaded_blas", "matmul", "run_threads", "take_next", "transpose_into"]
