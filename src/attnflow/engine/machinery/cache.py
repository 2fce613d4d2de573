"""numba's cache of the engine, stale as soon as any source the compiled engine is built from changes.

numba checks a cached function against the source file that defines it, and
only that one. But a cached entry point holds the code of every compiled
function it calls: ``solve_batch`` (dopri.py) carries ``field`` (field.py) and
``exp_inplace`` (expo.py), and the constants of the enums it reads
(attention.py, heads.py). After an edit or a ``git pull`` that changes
field.py alone, numba would load the old ``solve_batch``, old field included,
and results computed by old code would be stored under the new numerics
version. Here every engine function's cache entry is stamped with one hash
over all those sources (and the one setting the BLAS decides, ``engine_stamp``),
so a change in any of them recompiles the engine.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path

from numba.core import caching

ENGINE_DIR = Path(__file__).resolve().parents[1]
# Besides the engine's own modules: the enums whose values the compiled code takes as constants.
_READ_BY_THE_ENGINE = ("attention.py", "heads.py")


def sources() -> list[Path]:
    """The files the compiled engine is built from: every source under engine/, machinery included."""
    return sorted(ENGINE_DIR.rglob("*.py")) + [ENGINE_DIR.parent / name for name in _READ_BY_THE_ENGINE]


def stamp(paths) -> bytes:
    """One hash over the contents of ``paths`` (with their names, so a moved line between files counts)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.digest()


@functools.cache
def engine_stamp() -> bytes:
    """``stamp(sources())`` and ``blas_info.PANELS``, once per process: whether products go in panels is a
    constant of the compiled code that the BLAS in the process decides (``OPENBLAS_CORETYPE``, say),
    not a source."""
    from .blas_info import PANELS

    return stamp(sources()) + bytes([PANELS])


class _EngineStamped:
    """A numba cache locator for the engine's functions, stamped with ``engine_stamp``."""

    def get_source_stamp(self):
        return engine_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if ENGINE_DIR not in Path(py_file).resolve().parents:
            return None
        return super().from_function(py_func, py_file)


def _locator(name: str):
    # numba 0.60 names these classes with a leading underscore, later versions without.
    return getattr(caching, name, None) or getattr(caching, f"_{name}")


def register() -> None:
    """Put the engine's locators before numba's own (for functions decorated after this call).

    These are numba's internal classes: where a numba release renames them, the engine still imports
    and runs, with numba's own check, and says so.
    """
    try:
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
        ours = [type(f"Engine{_locator(name).__name__.lstrip('_')}", (_EngineStamped, _locator(name)), {})
                for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
        impl._locator_classes = ours + [c for c in impl._locator_classes
                                        if not issubclass(c, _EngineStamped)]
    except (AttributeError, TypeError) as err:
        warnings.warn(f"attnflow: numba's cache of the engine is checked against each function's own file "
                      f"only, not every engine source ({err}); clear it after changing the engine "
                      "(engine/__pycache__, or NUMBA_CACHE_DIR)", RuntimeWarning, stacklevel=2)


register()
