"""The version of the numbers the engine computes (``attnflow.engine`` re-exports it).

Its own module, outside the engine package: the workflow reads it at every start (a store's
record must match it), and importing anything under ``attnflow.engine`` loads numba and
compiles the dispatch checks (0.3 s of each ``snakemake`` start, measured).

Bump ``NUMERICS_VERSION`` with any change that moves a computed number (a new
step-size rule, another interpolant for ``t_cluster``, a reordered sum): every
store records the version it was written under, and a store of another version
is ``stale``, recomputed by the next ``snakemake`` and never mixed into a
summary with current ones. ``tests/test_numerics_version.py`` holds golden
values of a few cells and fails when they change while this stays the same.
"""

# 2: scalar heads (M_h = lambda_h I, values aligned) with n < d integrate in the span of the initial
#    tokens (engine._span_basis): the same flow, its error control on n coordinates instead of d.
NUMERICS_VERSION = 2

__all__ = ["NUMERICS_VERSION"]
