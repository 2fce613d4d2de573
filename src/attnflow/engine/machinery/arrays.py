"""Loops over arrays for the compiled math: sums and maxima in a fixed lane order, copies and transposes.

Each is what a numpy call would do, written as a loop: numba's own versions of
these (a slice assignment, ``np.sum``, ``x.T.copy()``) either check shapes and
build error messages (compile time, and a raise in the hot loop) or sum in an
order that depends on the machine. Inlined at each call site.
"""

from __future__ import annotations

import numba

from .borrow import borrow, flat


@numba.njit(cache=True, inline="always")
def lane_sum(a):
    """Sum of a 1-d array in eight interleaved lanes, then the lanes in order.

    A fixed order, so the result is the same on every machine, and eight
    independent chains instead of one (a plain loop waits on each add).
    """
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    m = a.size - a.size % 8
    for j in range(0, m, 8):
        s0 += a[j]
        s1 += a[j + 1]
        s2 += a[j + 2]
        s3 += a[j + 3]
        s4 += a[j + 4]
        s5 += a[j + 5]
        s6 += a[j + 6]
        s7 += a[j + 7]
    total = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for j in range(m, a.size):
        total += a[j]
    return total


@numba.njit(cache=True, inline="always")
def lane_max(a):
    """Largest entry of a non-empty 1-d array, in eight lanes (see ``lane_sum``)."""
    m = a.size - a.size % 8
    if m == 0:
        top = a[0]
        for j in range(1, a.size):
            top = max(top, a[j])
        return top
    s0, s1, s2, s3, s4, s5, s6, s7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    for j in range(8, m, 8):
        s0 = max(s0, a[j])
        s1 = max(s1, a[j + 1])
        s2 = max(s2, a[j + 2])
        s3 = max(s3, a[j + 3])
        s4 = max(s4, a[j + 4])
        s5 = max(s5, a[j + 5])
        s6 = max(s6, a[j + 6])
        s7 = max(s7, a[j + 7])
    top = max(max(max(s0, s1), max(s2, s3)), max(max(s4, s5), max(s6, s7)))
    for j in range(m, a.size):
        top = max(top, a[j])
    return top


@numba.njit(cache=True, inline="always")
def copy_into(dst, src):
    """``dst[:, :] = src`` for C-contiguous 2-d arrays of one shape, entry by entry in memory order. A
    slice assignment would do, but its shape check and error message cost each function holding one
    seconds of compilation."""
    to, source = flat(dst), flat(src)
    for i in range(source.size):
        to[i] = source[i]


@numba.njit(cache=True, inline="always")
def transpose_into(x, xt):
    """``xt[:, :] = x.T``: a plain column walk up to 4096 entries (L1's 32 KiB), by rows of eight
    tokens above (``_transpose_by_rows``)."""
    n, d = x.shape
    if n * d > 4096:
        _transpose_by_rows(x, xt)
        return
    for i in range(n):
        for k in range(d):
            xt[k, i] = x[i, k]


@numba.njit(cache=True, inline="never")
def _transpose_by_rows(x, xt):
    """``xt[:, :] = x.T`` by rows of eight tokens, so that each write fills a cache line (below 4096
    entries the plain walk is faster). Not inlined: one copy of the loop for the engine's transposes."""
    x, xt = borrow((x, xt))
    n, d = x.shape
    for i0 in range(0, n, 8):
        i1 = min(i0 + 8, n)
        for k in range(d):
            for i in range(i0, i1):
                xt[k, i] = x[i, k]
