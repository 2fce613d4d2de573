"""Would stepping a small cell's trajectories in lock-step (SIMD across seeds) beat BLAS per trajectory?

Run: ``python benchmarks/bench_lanes.py`` (under a minute).

Issue 18 asked whether the engine should step many trajectories of a small cell
in lock-step, as diffrax's ``vmap`` does, with the seed axis innermost so the
compiler vectorises across seeds. A field evaluation is three products per head
(``X M_h``, the scores, the weighted rows), so the question is whether such a
product, computed for 8 trajectories at once in compiled loops over a
``(n, d, 8)`` layout, costs less per trajectory than the single-threaded BLAS
call per trajectory the engine makes (``np.dot`` in numba, OpenBLAS's small
kernels). Printed per trajectory, for ``n = d`` = 8, 16, 32:

- BLAS: one ``np.dot`` per trajectory, as ``engine.field`` does;
- lanes: ``y[j, k, w] += x[j, l, w] m[l, k, w]``, the lane axis innermost;
- lanes, registers: the same with the 8 lanes' sums held in scalars.

Measured on the development machine (AVX-512): at 8, BLAS 105 ns, lanes
159 ns, registers 99 ns; at 16, 205, 1267 and 815 ns. The loops only tie
BLAS at 8 and fall far behind above it; a whole lock-step field at
n = d = 8 (H = 2, softmax, projected) cost 1.1-1.3 us per trajectory, the
engine's own 1.1 us. So the engine keeps one trajectory per thread.
"""

from __future__ import annotations

import time

import numba
import numpy as np

LANES = 8


@numba.njit(fastmath={"contract"})
def lanes(x, m, y):
    n, d, _ = x.shape
    for j in range(n):
        for k in range(d):
            for w in range(LANES):
                y[j, k, w] = 0.0
        for l in range(d):  # noqa: E741 - the summation index of the formula
            for k in range(d):
                for w in range(LANES):
                    y[j, k, w] += x[j, l, w] * m[l, k, w]


@numba.njit(fastmath={"contract"})
def lanes_in_registers(x, m, y):
    n, d, _ = x.shape
    for j in range(n):
        for k in range(d):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
            for l in range(d):  # noqa: E741
                a0 += x[j, l, 0] * m[l, k, 0]
                a1 += x[j, l, 1] * m[l, k, 1]
                a2 += x[j, l, 2] * m[l, k, 2]
                a3 += x[j, l, 3] * m[l, k, 3]
                a4 += x[j, l, 4] * m[l, k, 4]
                a5 += x[j, l, 5] * m[l, k, 5]
                a6 += x[j, l, 6] * m[l, k, 6]
                a7 += x[j, l, 7] * m[l, k, 7]
            y[j, k, 0], y[j, k, 1], y[j, k, 2], y[j, k, 3] = a0, a1, a2, a3
            y[j, k, 4], y[j, k, 5], y[j, k, 6], y[j, k, 7] = a4, a5, a6, a7


@numba.njit
def blas(x, m, y):
    for w in range(x.shape[0]):
        np.dot(x[w], m[w], y[w])


@numba.njit
def repeat(kernel, x, m, y, times):
    for _ in range(times):
        kernel(x, m, y)


def per_trajectory_ns(kernel, x, m, y, times) -> float:
    repeat(kernel, x, m, y, 2)  # compile
    best = np.inf
    for _ in range(5):
        start = time.perf_counter()
        repeat(kernel, x, m, y, times)
        best = min(best, time.perf_counter() - start)
    return best / times / LANES * 1e9


def main() -> None:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    print(f"one product X M (n = d), per trajectory, {LANES} trajectories per call, best of 5")
    print(f"{'n = d':>6} {'BLAS':>10} {'lanes':>10} {'registers':>10}")
    with threadpool_limits(1):  # as the engine runs BLAS
        for n in (8, 16, 32):
            x, m = rng.random((n, n, LANES)), rng.random((n, n, LANES))
            y = np.empty_like(x)
            xb, mb = np.ascontiguousarray(x.transpose(2, 0, 1)), np.ascontiguousarray(m.transpose(2, 0, 1))
            yb = np.empty_like(xb)
            times = max(200, 400_000 // n**2)
            got = [per_trajectory_ns(blas, xb, mb, yb, times), per_trajectory_ns(lanes, x, m, y, times),
                   per_trajectory_ns(lanes_in_registers, x, m, y, times)]
            lanes_in_registers(x, m, y)
            blas(xb, mb, yb)
            assert np.allclose(y.transpose(2, 0, 1), yb, rtol=1e-12)  # the same product
            print(f"{n:>6} " + " ".join(f"{t:>7.0f} ns" for t in got))


if __name__ == "__main__":
    main()
