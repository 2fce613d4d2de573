"""Engine benchmark: attnflow's batched integrator vs scipy's solve_ivp one trajectory at a time.

Run: ``python benchmarks/bench_engine.py`` (about 1 minute on 2 cores).

For cells S, M, L (softmax, beta = 1, random symmetric heads, uniform start,
t_max = 10, rtol = 1e-6, atol = 1e-9) it prints wall times of both routes and
their errors against a tight reference (scipy DOP853 at rtol 1e-12), so speed
is not bought with accuracy; then the GFLOP/s of one right-hand-side
evaluation at L next to numpy's own float64 matrix multiply, and how the time
per step grows with n.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp
from threadpoolctl import threadpool_info, threadpool_limits

from attnflow import Cell, generators
from attnflow.integrate import integrate
from attnflow.kernels import flops_per_trajectory
from attnflow.simulation import AttentionField

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import velocity as reference_velocity  # noqa: E402

CELLS = {
    "S": dict(n=8, d=8, H=2, seeds=64),
    "M": dict(n=32, d=32, H=4, seeds=64),
    "L": dict(n=128, d=64, H=4, seeds=8),
}
TARGETS = {"S": 20.0, "M": 5.0, "L": 2.0}


def make_batch(cell):
    lam = [generators.head_strengths(cell, s) for s in cell.seeds]
    scores = np.stack([generators.score_matrices(cell, lm, s)
                       for lm, s in zip(lam, cell.seeds, strict=True)])
    x0 = np.stack([generators.initial_tokens(cell, s) for s in cell.seeds])
    return scores, x0


def run_attnflow(cell, scores, x0, times):
    field = AttentionField(scores, None, cell.beta, cell.attention, True)
    with threadpool_limits(1):
        start = time.perf_counter()
        xs, stats = integrate(field, x0, times, rtol=cell.rtol, atol=cell.atol,
                              max_steps=cell.max_steps, unit_rows=True)
        return time.perf_counter() - start, xs, stats


def run_scipy(cell, scores, x0, times, method, rtol, atol, count):
    n, d = cell.n, cell.d
    out, start = [], time.perf_counter()
    for b in range(count):
        def rhs(_t, y, m=scores[b]):
            return reference_velocity(y.reshape(n, d), m, cell.beta, cell.attention).ravel()
        sol = solve_ivp(rhs, (0.0, cell.t_max), x0[b].ravel(), method=method, rtol=rtol,
                        atol=atol, t_eval=times)
        out.append(sol.y.T.reshape(len(times), n, d))
    return time.perf_counter() - start, np.stack(out)


def matmul_gflops(m, k, n, repeat=200):
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k)), rng.random((k, n))
    a @ b
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * m * k * n * repeat / (time.perf_counter() - start) / 1e9


def rhs_gflops(cell, scores, x0, repeat=50):
    field = AttentionField(scores, None, cell.beta, cell.attention, True)
    with threadpool_limits(1):
        field(x0)
        start = time.perf_counter()
        for _ in range(repeat):
            field(x0)
        elapsed = (time.perf_counter() - start) / repeat
    flops = flops_per_trajectory(cell.n, cell.d, cell.H) * x0.shape[0]
    return flops / elapsed / 1e9, elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="SML", help="subset of S, M, L")
    parser.add_argument("--repeat", type=int, default=3, help="timings per route (best is kept)")
    parser.add_argument("--ref-seeds", type=int, default=4,
                        help="seeds checked against the tight reference")
    args = parser.parse_args(argv)

    blas = [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()]
    print(f"BLAS: {blas}")
    times = np.linspace(0.0, 10.0, 101)
    print(f"\n{'cell':4} {'seeds':>5} {'attnflow s':>10} {'scipy s':>9} {'speed-up':>8} {'target':>6}"
          f" {'err attnflow':>12} {'err scipy':>10} {'steps':>6}")
    for name in args.cells:
        cell = Cell(heads="random", beta=1.0, t_max=10.0, rtol=1e-6, atol=1e-9, **CELLS[name])
        scores, x0 = make_batch(cell)
        run_attnflow(cell, scores, x0, times[:3])  # compile and allocate outside the timing
        # Best of `repeat` for both routes: the machine is noisy, the minimum is the
        # least disturbed measurement of each.
        ours = [run_attnflow(cell, scores, x0, times) for _ in range(args.repeat)]
        t_ours, xs, stats = min(ours, key=lambda r: r[0])
        theirs = [run_scipy(cell, scores, x0, times, "RK45", cell.rtol, cell.atol, cell.n_seeds)
                  for _ in range(args.repeat)]
        t_scipy, xs_scipy = min(theirs, key=lambda r: r[0])
        k = min(args.ref_seeds, cell.n_seeds)
        _, ref = run_scipy(cell, scores, x0, times, "DOP853", 1e-12, 1e-14, k)
        err_ours = np.max(np.abs(xs[:k] - ref))
        err_scipy = np.max(np.abs(xs_scipy[:k] - ref))
        print(f"{name:4} {cell.n_seeds:5d} {t_ours:10.2f} {t_scipy:9.2f} {t_scipy / t_ours:7.1f}x"
              f" {TARGETS[name]:5.0f}x {err_ours:12.2e} {err_scipy:10.2e}"
              f" {int(np.mean(stats.n_steps)):6d}")

    cell = Cell(heads="random", beta=1.0, **CELLS["L"])
    scores, x0 = make_batch(cell)
    gf, elapsed = rhs_gflops(cell, scores, x0)
    peak_shape = matmul_gflops(cell.n, cell.d, cell.n)
    peak_big = matmul_gflops(1024, 1024, 1024, repeat=10)
    print(f"\nRHS at L (8 trajectories): {elapsed * 1e3:.2f} ms, {gf:.1f} GFLOP/s")
    print(f"numpy float64 matmul: {peak_big:.1f} GFLOP/s at 1024^3, "
          f"{peak_shape:.1f} GFLOP/s at {cell.n}x{cell.d}x{cell.n}")
    print(f"RHS / numpy peak: {100 * gf / peak_big:.0f}% (target >= 25%)")

    print("\ntime per step vs n (d=32, H=4, 8 trajectories, fixed steps):")
    print(f"{'n':>5} {'ms/step':>8} {'us/step/traj':>13}")
    for n in (8, 16, 32, 64, 128, 256):
        cell = Cell(n=n, d=32, H=4, heads="random", seeds=8)
        scores, x0 = make_batch(cell)
        field = AttentionField(scores, None, 1.0, "softmax", True)
        with threadpool_limits(1):
            integrate(field, x0, np.array([0.0, 0.01]), rtol=1, atol=1, max_steps=10, fixed_step=0.01)
            per_step = np.inf
            for _ in range(args.repeat):
                start = time.perf_counter()
                integrate(field, x0, np.array([0.0, 0.2]), rtol=1, atol=1, max_steps=100,
                          fixed_step=0.01)
                per_step = min(per_step, (time.perf_counter() - start) / 20)
        print(f"{n:5d} {per_step * 1e3:8.3f} {per_step / 8 * 1e6:13.1f}")


if __name__ == "__main__":
    main()
