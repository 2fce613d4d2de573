"""Checking and normalising a ``Cell``'s field values (numbers, seeds, observables, head subsets): a value
refused is one ``ValueError`` naming the field and the value, ``Cell.<field> = <value>: <why>``."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from numbers import Integral, Real

from .observables import GROUPS, canonical_groups

INT64_MAX = 2**63 - 1
MAX_SEEDS = 10**6


def _fail(field: str, value, why: str):
    raise ValueError(f"Cell.{field} = {value!r}: {why}")


def _is_int(value) -> bool:
    """An integer that is not a bool (exact int first: the Integral ABC check is slow)."""
    return type(value) is int or (isinstance(value, Integral) and not isinstance(value, bool))


def _is_list(value) -> bool:
    """A sequence that is not a string (exact list or tuple first: the Sequence ABC check is slow)."""
    if type(value) in (list, tuple):
        return True
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _check_int(name, value):
    if not _is_int(value):
        _fail(name, value, "must be an integer")


def _check_real(name, value):
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        _fail(name, value, "must be a finite real number")


def _normalise_seeds(seeds) -> tuple[int, ...]:
    if _is_int(seeds):
        if seeds < 1:
            _fail("seeds", seeds, "a seed count must be >= 1")
        if seeds > MAX_SEEDS:  # one batch, one store: checked before a tuple of them is built
            _fail("seeds", seeds, f"at most {MAX_SEEDS:,} seeds in one cell; split them across cells "
                  "with seed lists")
        return tuple(range(int(seeds)))
    if not _is_list(seeds):
        _fail("seeds", seeds, "must be a count or a list of non-negative integers")
    out = []
    for s in seeds:
        if not _is_int(s) or s < 0:
            _fail("seeds", seeds, f"entry {s!r} is not a non-negative integer")
        if s > INT64_MAX:
            _fail("seeds", seeds, f"entry {s} exceeds 2^63 - 1 (seeds are int64)")
        out.append(int(s))
    if not out:
        _fail("seeds", seeds, "the list is empty")
    if len(set(out)) != len(out):
        _fail("seeds", seeds, "seeds must be distinct")
    return tuple(out)


def _normalise_groups(groups) -> tuple[str, ...]:
    if not _is_list(groups):
        _fail("observables", groups, f"must be a list of groups ({', '.join(GROUPS.names())})")
    try:
        try:
            return _canonical_groups(tuple(groups))
        except TypeError:  # an unhashable entry: not cached (and refused below)
            return canonical_groups(groups)
    except ValueError as err:
        _fail("observables", list(groups), str(err))


# Nearly every cell of a sweep has one of a few observables lists: remember their canonical form.
# (Only successes are cached; a refused list raises ValueError anew, with the same message.)
_canonical_groups = functools.lru_cache(maxsize=256)(canonical_groups)


def _normalise_subset(subset) -> tuple[int, ...]:
    if type(subset) is tuple and not subset:  # the default, which nearly every cell keeps
        return subset
    if not _is_list(subset):
        _fail("head_subset", subset, "must be a list of head indices")
    for h in subset:
        if not _is_int(h) or h < 0:
            _fail("head_subset", list(subset), f"entry {h!r} is not a non-negative integer")
    if len(set(subset)) != len(subset):
        _fail("head_subset", list(subset), "heads must be distinct")
    return tuple(int(h) for h in subset)

