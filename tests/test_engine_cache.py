"""numba's cache of the engine goes stale with any source the compiled engine is built from
(``attnflow.engine.machinery.cache``), not only with the file that defines a cached function."""

from __future__ import annotations

import shutil

from attnflow.engine import dopri, field, measure
from attnflow.engine.machinery import blas, blas_info, cache, expo


def test_every_engine_function_is_stamped_with_all_engine_sources():
    # solve_batch (dopri.py) carries field's and exp's code: its stamp must cover their files too.
    for kernel in (dopri.solve_batch, dopri.observe_batch, field.field, measure.measure, expo.exp_inplace,
                   blas.matmul):
        locator = kernel._cache._impl._locator
        assert isinstance(locator, cache._EngineStamped), type(locator)
        assert locator.get_source_stamp() == cache.stamp(cache.sources()) + bytes([blas_info.PANELS])
    names = {path.relative_to(cache.ENGINE_DIR.parent).as_posix() for path in cache.sources()}
    assert {"engine/dopri.py", "engine/field.py", "engine/measure.py", "engine/machinery/expo.py",
            "engine/machinery/blas.py", "attention.py", "heads.py"} <= names
    # Every source under engine/, the machinery's included: a compiled function in a new file is covered.
    assert set(cache.ENGINE_DIR.rglob("*.py")) <= set(cache.sources())


def test_the_stamp_changes_with_any_one_source(tmp_path):
    copies = []
    for path in cache.sources():
        # by the path under the package: engine/ and engine/machinery/ both hold an __init__.py
        copy = tmp_path / path.relative_to(cache.ENGINE_DIR.parent)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        copies.append(copy)
    before = cache.stamp(copies)
    assert before == cache.stamp(cache.sources())
    for copy in copies:  # a comment added to any one file, as a git pull might change field.py alone
        text = copy.read_bytes()
        copy.write_bytes(text + b"\n# edited\n")
        assert cache.stamp(copies) != before, copy.name
        copy.write_bytes(text)
    assert cache.stamp(copies) == before


def test_a_numba_without_those_locators_warns_and_keeps_its_own(monkeypatch):
    import pytest
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    monkeypatch.setattr(impl, "_locator_classes", list(impl._locator_classes))
    for name in ("InTreeCacheLocator", "_InTreeCacheLocator"):
        monkeypatch.delattr(caching, name, raising=False)
    with pytest.warns(RuntimeWarning, match="checked against each function's own file"):
        cache.register()
