"""The JAX engine on a GPU against raw diffrax and the numba engine: s per cell, compile excluded, best of 3.

    PYTHONPATH=src python benchmarks/bench_gpu.py            # S, M, L, XL, XXL (at most 5 minutes)
    PYTHONPATH=src python benchmarks/bench_gpu.py --quick    # tiny cells: checks that it runs (CPU too)
    PYTHONPATH=src python benchmarks/bench_gpu.py --cells S,M  # a subset (JAX's CPU build: its overhead)

Columns: positions only from a 30-line diffrax integration of the same field (``raw_diffrax``: vmap +
jit, Dopri5 + PID at the cell's tolerances); ``attnflow.jaxengine.solve`` with every default observable
group (the variables ``simulate()`` records); ``attnflow.engine.solve`` (numba) on the host's cores,
skipped at XXL and where the cost model expects more than a minute a run. The cells are
bench_peers.py's: random dense heads, softmax, beta = 1, t_max = 10, 101 samples, rtol 1e-6, atol 1e-9.
Needs jax, diffrax, numba, numpy, scipy and xarray; not zarr, dask, snakemake or pyyaml. Writes the table
to $OUT/bench_gpu.md too where $OUT is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

if importlib.util.find_spec("threadpoolctl") is None:
    # The numba engine limits BLAS to one thread per worker through threadpoolctl; without it, the
    # same limit from the environment (read when numpy loads BLAS), and a stand-in that does nothing.
    import contextlib
    import types

    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    stand_in = types.ModuleType("threadpoolctl")
    stand_in.ThreadpoolController = type("ThreadpoolController", (), {
        "info": lambda self: [], "limit": lambda self, **kwargs: contextlib.nullcontext()})
    sys.modules["threadpoolctl"] = stand_in

from attnflow import Cell  # noqa: E402
from attnflow.heads import head_matrices  # noqa: E402
from attnflow.observables import DEFAULT_GROUPS  # noqa: E402
from attnflow.resources import cell_seconds  # noqa: E402
from attnflow.tokens import initial_tokens  # noqa: E402

CELLS = {"S": dict(n=8, d=8, H=2, seeds=64), "M": dict(n=32, d=32, H=4, seeds=64),
         "L": dict(n=128, d=64, H=4, seeds=8), "XL": dict(n=512, d=128, H=4, seeds=64),
         "XXL": dict(n=2048, d=128, H=4, seeds=16)}
QUICK = {"S": dict(n=4, d=4, H=2, seeds=4), "M": dict(n=8, d=8, H=2, seeds=4)}
# numba runs (4 each: a warm-up, then best of 3) only where the cost model expects less than this a run
# (it overestimates: 2x at L and 10x at XL on 16 cores, measured in issue 40)
NUMBA_LIMIT_S = 60.0


def problem(shape, quick):
    cell = Cell(heads="random", beta=1.0, t_max=2.0 if quick else 10.0, n_samples=11 if quick else 101,
                rtol=1e-6, atol=1e-9, **shape)
    return cell, head_matrices(cell, cell.seeds).score_matrices, initial_tokens(cell, cell.seeds)


def raw_diffrax(cell, m, x0):
    """Positions only: what a researcher writes in 30 lines (x64 on for this route)."""
    import diffrax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def field(t, x, m):
        s = jnp.einsum("nd,hde,me->hnm", x, m, x)  # s^h_ij = <x_i, M_h x_j>
        w = jax.nn.softmax(cell.beta * s, axis=-1)
        v = jnp.einsum("hnm,hde,me->nd", w, m, x)  # sum_h sum_j w_ij M_h x_j
        return v - jnp.sum(v * x, axis=-1, keepdims=True) * x

    ts = jnp.asarray(cell.sample_times())
    controller = diffrax.PIDController(rtol=cell.rtol, atol=cell.atol)

    def one(x, m):
        return diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Dopri5(), 0.0, cell.t_max, None, x, m,
                                   saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller,
                                   max_steps=cell.max_steps).ys

    solve = jax.jit(jax.vmap(one))
    x0, m = jnp.asarray(x0), jnp.asarray(m)
    return lambda: jax.block_until_ready(solve(x0, m))


def engine_route(solve, cell, m, x0):
    from attnflow.contract import Controller, Heads, Problem, SaveAt

    problem = Problem(x0, Heads(m), cell.attention, cell.beta)
    controller = Controller(cell.rtol, cell.atol, cell.max_steps)
    saveat = SaveAt(cell.sample_times(), DEFAULT_GROUPS)
    return lambda: solve(problem, controller, saveat)


def best_of(run, repeat):
    run()  # compile (jit, or numba's first call) and warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny cells, to check that the script runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cells", default=None, help="comma-separated subset of the cells, e.g. S,M")
    args = parser.parse_args(argv)
    import jax

    from attnflow import engine, jaxengine

    device = jax.devices()[0]
    lines = [f"device: {device.platform} ({device.device_kind}); host cores: {os.cpu_count()}", "",
             "| cell | raw diffrax, positions (s) | JAX engine, every group (s) "
             "| numba engine, host cores (s) |",
             "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    cells = QUICK if args.quick else CELLS
    chosen = args.cells.split(",") if args.cells else list(cells)
    for name in chosen:
        if name not in cells:
            parser.error(f"--cells: {name!r} is not one of {', '.join(cells)}")
    for name, shape in cells.items():
        if name not in chosen:
            continue
        cell, m, x0 = problem(shape, args.quick)
        label = f"{name} n={cell.n} d={cell.d} H={cell.H}, {cell.n_seeds} seeds"
        raw = best_of(raw_diffrax(cell, m, x0), args.repeat)
        ours = best_of(engine_route(jaxengine.solve, cell, m, x0), args.repeat)
        expected = cell_seconds(cell) / os.cpu_count()  # the cost model's CPU seconds, on every core
        if name == "XXL":
            numba = "not run (minutes)"
        elif expected > NUMBA_LIMIT_S:
            numba = f"not run (cost model: {expected:.0f} s a run)"
        else:
            numba = f"{best_of(engine_route(engine.solve, cell, m, x0), args.repeat):.3g}"
        lines.append(f"| {label} | {raw:.3g} | {ours:.3g} | {numba} |")
        print(lines[-1], flush=True)
        if os.environ.get("OUT"):  # after each cell: a run cut short keeps what it measured
            os.makedirs(os.environ["OUT"], exist_ok=True)
            with open(os.path.join(os.environ["OUT"], "bench_gpu.md"), "w") as out:
                out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
