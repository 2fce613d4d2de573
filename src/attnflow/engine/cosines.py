"""The cosines of a configuration and the clustering criterion on them, compiled (``measure``, the
integration loop's event)."""

from __future__ import annotations

from enum import IntEnum

import numba
import numpy as np

from .field import unit_rows_into
from .machinery import borrow, matmul, transpose_into


class Metric(IntEnum):
    """Clustering criteria (``Cell.cluster_metric``)."""

    EPSILON = 0  # 1 - gamma_min <= threshold
    GAMMA_MEAN = 1  # gamma_mean >= threshold


# The metrics with a branch here and in dopri._met and dopri._sampled_value: engine.check_declarations
# refuses any other.
COMPILED_METRICS = frozenset({Metric.EPSILON, Metric.GAMMA_MEAN})


@numba.njit(cache=True)
def gamma_mean(x):
    """Mean of ``<x_i, x_j>`` over pairs ``i < j``, as ``(|sum x|^2 - sum |x_i|^2) / (n (n-1))``."""
    x = borrow(x)
    n, d = x.shape
    total_sq, self_sq = 0.0, 0.0
    for k in range(d):
        col = 0.0
        for i in range(n):
            col += x[i, k]
            self_sq += x[i, k] * x[i, k]
        total_sq += col * col
    return (total_sq - self_sq) / (n * (n - 1))


@numba.njit(cache=True)
def gram_min(x, xt, gram):
    """``gram = X X^T``; returns the smallest off-diagonal entry."""
    x, xt, gram = borrow((x, xt, gram))
    matmul(x, xt, gram)
    n = x.shape[0]
    low = np.inf
    for i in range(n):
        for j in range(i + 1, n):
            low = min(low, gram[i, j])
    return low


@numba.njit(cache=True)
def criterion_value(x, xt, gram, metric, threshold, radii, theta):
    """The clustering metric at ``x``: epsilon = 1 - gamma_min, or gamma_mean; of the directions
    (into ``theta``) where the state carries radii (``radii``).

    For epsilon, ``1 - gamma_mean`` is a lower bound (the minimum is at most the
    mean): while it is above ``threshold`` the criterion cannot hold and the
    O(n^2 d) Gram matrix is skipped.
    """
    x, xt, gram, theta = borrow((x, xt, gram, theta))
    if radii:
        unit_rows_into(x, theta)
        x = theta
    mean = gamma_mean(x)
    if metric == Metric.EPSILON:
        if 1.0 - mean > threshold:
            return 1.0 - mean
        transpose_into(x, xt)
        return 1.0 - gram_min(x, xt, gram)
    if metric == Metric.GAMMA_MEAN:
        return mean
    return np.nan  # unreachable: every Metric has a branch (checked at import); NaN never meets one


@numba.njit(cache=True)
def count_clusters(gram, level, seen, stack):
    """Connected components of the graph with an edge where ``gram_ij >= level`` (``i < j``: the
    upper triangle decides, for both directions), by depth-first search.

    Each token's row is scanned once, when it leaves the stack: n^2 comparisons
    and no finds (a union-find over the pairs is slow once the tokens cluster and
    every pair is an edge).
    ``seen`` and ``stack``: (n,) int64 scratch.
    """
    gram, seen, stack = borrow((gram, seen, stack))
    n = gram.shape[0]
    for i in range(n):
        seen[i] = 0
    count = 0
    for root in range(n):
        if seen[root]:
            continue
        count += 1
        seen[root] = 1
        stack[0] = root
        top = 1
        while top > 0:
            top -= 1
            i = stack[top]
            for j in range(i):
                if not seen[j] and gram[j, i] >= level:
                    seen[j] = 1
                    stack[top] = j
                    top += 1
            for j in range(i + 1, n):
                if not seen[j] and gram[i, j] >= level:
                    seen[j] = 1
                    stack[top] = j
                    top += 1
    return count
