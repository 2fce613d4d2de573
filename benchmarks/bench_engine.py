"""Engine benchmark: attnflow's compiled engine against scipy's solve_ivp one trajectory at a time,
the field's floating-point rate against numpy's matmul peak, and trained (low-rank) heads.

Run: ``python benchmarks/bench_engine.py`` (a few minutes on 2 cores).

For cells S, M, L (softmax, beta = 1, random symmetric heads, uniform start,
t_max = 10, rtol = 1e-6, atol = 1e-9, 101 samples) it prints wall times of both
routes and their errors against a tight reference (scipy DOP853 at rtol 1e-12),
so speed is not bought with accuracy; then the GFLOP/s of one field evaluation
at L next to numpy's float64 matrix multiply; the time per step against n; and
a trained-heads cell (d = 384, H = 12 heads of rank 2 d_head from MiniLM, or
random heads of that rank) through its factors and through dense products.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
from scipy.integrate import solve_ivp
from threadpoolctl import threadpool_info, threadpool_limits

from attnflow import Cell
from attnflow.contract import Controller, Heads, Problem, SaveAt
from attnflow.engine import _head_arrays, flow_of, solve
from attnflow.engine.dopri import trajectory_heads
from attnflow.engine.field import field, workspace
from attnflow.engine.machinery.borrow import by_reference
from attnflow.heads import head_matrices
from attnflow.tokens import initial_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import velocity as reference_velocity  # noqa: E402

CELLS = {
    "S": dict(n=8, d=8, H=2, seeds=64),
    "M": dict(n=32, d=32, H=4, seeds=64),
    "L": dict(n=128, d=64, H=4, seeds=8),
}
TARGETS = {"S": 20.0, "M": 5.0, "L": 2.0}  # speed-ups over scipy RK45 one by one


def batch(cell):
    return head_matrices(cell, cell.seeds).score_matrices, initial_tokens(cell, cell.seeds)


def run_attnflow(cell, score_matrices, x0, times):
    start = time.perf_counter()
    r = solve(Problem(x0, Heads(score_matrices), cell.attention, cell.beta),
              Controller(cell.rtol, cell.atol, cell.max_steps), SaveAt(times, ("positions",)))
    return time.perf_counter() - start, r.variables["x"], r


def run_scipy(cell, score_matrices, x0, times, method, rtol, atol, count):
    n, d = cell.n, cell.d
    out, start = [], time.perf_counter()
    for b in range(count):
        def rhs(_t, y, m=score_matrices[b]):
            return reference_velocity(y.reshape(n, d), m, cell.beta, cell.attention).ravel()
        sol = solve_ivp(rhs, (0.0, cell.t_max), x0[b].ravel(), method=method, rtol=rtol, atol=atol,
                        t_eval=times)
        out.append(sol.y.T.reshape(len(times), n, d))
    return time.perf_counter() - start, np.stack(out)


@numba.njit(cache=True, parallel=True)
def _fields(x, head_arrays, flow, beta, repeat):
    """``repeat`` field evaluations of every trajectory (one per thread at a time)."""
    for b in numba.prange(x.shape[0]):
        hd = trajectory_heads(head_arrays, b)
        n, d = x.shape[1], x.shape[2]
        ws = workspace(n, d, hd.H, hd.eig.shape[1], False, not hd.shared)
        out = np.empty((n, d))
        xb = np.ascontiguousarray(x[b])
        off = np.bool_(False)
        for _ in range(repeat):
            field(xb, out, by_reference(hd), flow, beta, off, off, by_reference(ws))


def field_seconds(x0, repeat=50, **form):
    """Wall time of one field evaluation of the whole batch (best of 3); the score matrices in one form,
    as ``solve`` takes them (``score_matrices=``, ``diagonal=`` or ``factors=``)."""
    _, arrays = _head_arrays(x0, Heads(**form))
    flow = flow_of("softmax", geometry="flat")
    with threadpool_limits(1):
        _fields(x0, arrays, flow, 1.0, 2)
        best = np.inf
        for _ in range(3):
            start = time.perf_counter()
            _fields(x0, arrays, flow, 1.0, repeat)
            best = min(best, (time.perf_counter() - start) / repeat)
    return best


def matmul_gflops(m, k, n, repeat=200):
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k)), rng.random((k, n))
    a @ b
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * m * k * n * repeat / (time.perf_counter() - start) / 1e9


def dense_flops(n, d, H):
    """Floating-point operations of one field evaluation with dense heads (three products per head)."""
    return H * (2 * n * d * d + 4 * n * n * d)


def trained_heads(n, seeds):
    """d = 384, H = 12 heads of rank 2 d_head = 64: MiniLM layer 0 if installed, else random of that rank."""
    try:
        cell = Cell(heads="trained", weights="minilm", H=12, d=384, n=n, init="embedding", seeds=seeds)
        source = "MiniLM layer 0"
        u, e = (a[0] for a in head_matrices(cell, [0]).factors)
    except ValueError:
        cell = Cell(H=12, d=384, n=n, seeds=seeds)
        rng = np.random.default_rng(0)
        u = np.linalg.qr(rng.standard_normal((12, 384, 64)))[0]
        e = rng.uniform(-1, 1, (12, 64))
        source = "random heads of rank 64"
    x0 = initial_tokens(cell.replace(init="uniform"), cell.seeds)
    return cell, (u[None], e[None]), x0, source


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="SML", help="subset of S, M, L")
    parser.add_argument("--repeat", type=int, default=3, help="timings per route (best is kept)")
    parser.add_argument("--ref-seeds", type=int, default=4, help="seeds checked against the tight reference")
    args = parser.parse_args(argv)

    blas = sorted({(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()})
    print(f"BLAS: {blas}; numba threads {numba.get_num_threads()} (one trajectory each, BLAS at 1 thread)")
    times = np.linspace(0.0, 10.0, 101)
    print(f"\n{'cell':4} {'seeds':>5} {'attnflow s':>10} {'scipy s':>9} {'speed-up':>8} {'target':>6}"
          f" {'err attnflow':>12} {'err scipy':>10} {'steps':>6}")
    for name in args.cells:
        cell = Cell(heads="random", beta=1.0, t_max=10.0, rtol=1e-6, atol=1e-9, **CELLS[name])
        score_matrices, x0 = batch(cell)
        run_attnflow(cell, score_matrices, x0, times[:3])  # compile or load outside the timing
        ours = [run_attnflow(cell, score_matrices, x0, times) for _ in range(args.repeat)]
        t_ours, xs, result = min(ours, key=lambda r: r[0])
        theirs = [run_scipy(cell, score_matrices, x0, times, "RK45", cell.rtol, cell.atol, cell.n_seeds)
                  for _ in range(args.repeat)]
        t_scipy, xs_scipy = min(theirs, key=lambda r: r[0])
        k = min(args.ref_seeds, cell.n_seeds)
        _, ref = run_scipy(cell, score_matrices, x0, times, "DOP853", 1e-12, 1e-14, k)
        err_ours = np.max(np.abs(xs[:k] - ref))
        err_scipy = np.max(np.abs(xs_scipy[:k] - ref))
        print(f"{name:4} {cell.n_seeds:5d} {t_ours:10.3f} {t_scipy:9.2f} {t_scipy / t_ours:7.1f}x"
              f" {TARGETS[name]:5.0f}x {err_ours:12.2e} {err_scipy:10.2e} {int(np.mean(result.n_steps)):6d}")

    cell = Cell(heads="random", beta=1.0, **CELLS["L"])
    score_matrices, x0 = batch(cell)
    elapsed = field_seconds(x0, score_matrices=score_matrices)
    gf = dense_flops(cell.n, cell.d, cell.H) * cell.n_seeds / elapsed / 1e9
    peak_shape = matmul_gflops(cell.n, cell.d, cell.n)
    peak_big = matmul_gflops(1024, 1024, 1024, repeat=10)
    print(f"\nfield at L ({cell.n_seeds} trajectories): {elapsed * 1e3:.2f} ms, {gf:.1f} GFLOP/s")
    print(f"numpy float64 matmul: {peak_big:.1f} GFLOP/s at 1024^3, {peak_shape:.1f} GFLOP/s at "
          f"{cell.n}x{cell.d}x{cell.n}")
    print(f"field / numpy peak: {100 * gf / peak_big:.0f}% (target >= 40%)")

    print("\ntime per step vs n (d=32, H=4, 8 trajectories, fixed steps):")
    print(f"{'n':>5} {'ms/step':>8} {'us/step/traj':>13}")
    for n in (8, 16, 32, 64, 128, 256):
        cell = Cell(n=n, d=32, H=4, heads="random", seeds=8)
        score_matrices, x0 = batch(cell)
        best = np.inf
        for _ in range(args.repeat + 1):
            start = time.perf_counter()
            solve(Problem(x0, Heads(score_matrices), "softmax", 1.0), Controller(1, 1, 100, fixed_step=0.01),
                  SaveAt(np.array([0.0, 0.2])))
            best = min(best, (time.perf_counter() - start) / 20)
        print(f"{n:5d} {best * 1e3:8.3f} {best / 8 * 1e6:13.1f}")

    cell, factors, x0, source = trained_heads(n=32, seeds=8)
    u, e = factors
    dense = np.einsum("bhdr,bhr,bher->bhde", u, e, u)
    t_factored = field_seconds(x0, factors=factors, repeat=10)
    t_dense = field_seconds(x0, score_matrices=dense, repeat=10)
    print(f"\ntrained heads, d=384, H=12, rank 64 ({source}), n=32, 8 trajectories, one field evaluation:")
    print(f"  through the factors {t_factored * 1e3:.2f} ms, dense products {t_dense * 1e3:.2f} ms: "
          f"{t_dense / t_factored:.1f}x (simulate() uses the factors)")


if __name__ == "__main__":
    main()
