"""attnflow against the batched solvers a researcher would reach for: diffrax (JAX) and torchode (PyTorch).

Run: ``python benchmarks/bench_peers.py`` (a few minutes on 2 cores). The peers
come from the optional extra ``pip install -e '.[bench]'``; a missing one is
skipped with a message.

Every route integrates the same vector field (softmax attention on the sphere,
random symmetric heads, beta = 1, tokens from attnflow's own generators) with
Dormand-Prince 5(4), rtol 1e-6, atol 1e-9, float64, 101 output times on
[0, 10]. Reported per route: wall time (best of 5), compile time (first call
minus best), mean accepted steps, the largest error against scipy's DOP853 at
rtol 1e-12 (4 seeds), and the largest norm drift. attnflow keeps its retraction
onto the sphere, per-trajectory error control and per-seed reproducibility;
the peers integrate the projected field as it is (their drift is shown).

attnflow routes:
- ``simulate()``, observables of all six groups, as ``attnflow.simulate`` records by default;
- ``simulate()``, positions only (what the peers return; the engine's cosines come with it);
- ``simulate()``, cosines only (what the clustering experiments record).

diffrax routes: positions only (what it returns), and positions plus the
variables ``simulate()`` records by default, computed in the same jit at the
101 outputs from their definitions (what a researcher using diffrax would add
to get them; checked against ``attnflow.engine.observe`` at the same states).
And positions only under attnflow's error control: diffrax's Dopri5 estimates
the local error with Dormand and Prince's other embedded solution, whose
weights are 2/3 of the ones attnflow, scipy and Hairer's DOPRI5 use (exactly,
entry by entry: ``diffrax_error_scale``), so at equal tolerances it accepts
errors 1.5 times as large and takes fewer, less accurate steps; at its
tolerances times 2/3 it accepts and sizes every step as attnflow does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp
from threadpoolctl import threadpool_info

from attnflow import Cell, simulate
from attnflow.heads import head_matrices
from attnflow.observables import DEFAULT_GROUPS
from attnflow.tableau import DOPRI5
from attnflow.tokens import initial_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import velocity as reference_velocity  # noqa: E402

RTOL, ATOL, T_MAX, SAMPLES = 1e-6, 1e-9, 10.0, 101
WITH_OBSERVABLES = "diffrax + same observables (jit)"
# simulate() as users call it: all observables and the accuracy certificate.
CERTIFIED = "attnflow simulate(), certified"
SAME_CONTROL = "diffrax, attnflow's error control"
CELLS = {
    "S": dict(n=8, d=8, H=2, seeds=64),
    "M": dict(n=32, d=32, H=4, seeds=64),
    "L": dict(n=128, d=64, H=4, seeds=8),
    "mixed beta": dict(n=32, d=32, H=4, seeds=64),
}


def problem(name):
    cell = Cell(heads="random", beta=1.0, t_max=T_MAX, n_samples=SAMPLES, rtol=RTOL, atol=ATOL, **CELLS[name])
    score_matrices = head_matrices(cell, cell.seeds).score_matrices
    x0 = initial_tokens(cell, cell.seeds)
    if name == "mixed beta":  # log-uniform in [0.5, 8], one per trajectory
        beta = np.exp(np.random.default_rng(7).uniform(np.log(0.5), np.log(8.0), cell.n_seeds))
    else:
        beta = np.full(cell.n_seeds, 1.0)
    return cell, score_matrices, x0, beta


def best_of(fn, repeat, cpu=None):
    """Best wall time of ``repeat`` calls, the first call's excess over it (compilation), the output.

    ``cpu``, when given, receives the CPU time of the process (every thread) during the best call:
    how many cores' worth of work the wall time hides.
    """
    calls = []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        calls.append((time.perf_counter() - start, time.process_time() - start_cpu))
    best, best_cpu = min(calls)
    if cpu is not None:
        cpu.append(best_cpu)
    return best, calls[0][0] - best, out


def reference(cell, score_matrices, x0, beta, count):
    t = np.linspace(0, T_MAX, SAMPLES)
    n, d = cell.n, cell.d
    out = []
    for b in range(count):
        def rhs(_t, y, m=score_matrices[b], bt=beta[b]):
            return reference_velocity(y.reshape(n, d), m, bt, "softmax").ravel()
        sol = solve_ivp(rhs, (0, T_MAX), x0[b].ravel(), method="DOP853", rtol=1e-12, atol=1e-14, t_eval=t)
        out.append(sol.y.T.reshape(SAMPLES, n, d))
    return np.stack(out)


# --- attnflow -------------------------------------------------------------------------------------
def attnflow_route(cell, score_matrices, x0, beta, groups, calls=None, certify=False):
    """simulate() itself when beta is shared; the same engine call when it varies per trajectory.

    ``certify``: with the accuracy certificate, as users call ``simulate()`` (its companion runs
    included); off, the same work as the peers.

    ``calls``, when given, receives the mean field evaluations per trajectory: ``"all"``, and
    ``"samples"``, those made at the output times for the observables.
    """
    from attnflow.contract import Controller, Heads, Problem, SaveAt
    from attnflow.engine import solve

    def count(steps, rejected, rhs_calls):
        if calls is not None:
            # Per attempted step, the stages after the first (FSAL, the tableau simulate() uses);
            # plus the initial field and the initial step-size probe. The rest went to the samples.
            stages = (DOPRI5.a.shape[0] - 1) * (np.mean(steps) + np.mean(rejected)) + 2
            calls.update(all=float(np.mean(rhs_calls)), samples=float(np.mean(rhs_calls)) - stages)

    if np.all(beta == beta[0]):
        def run():
            # certify=False: the same integration the peers do, without the certificate's companion runs.
            ds = simulate(cell.replace(observables=list(groups)), x0=None, certify=certify)
            if certify and calls is not None:
                calls["certificate"] = ds.attrs.get("certificate_rhs_calls", 0) / cell.n_seeds
            count(ds.n_steps.values, ds.n_rejected.values, ds.attrs["solver_rhs_calls"] / cell.n_seeds)
            x = ds.x.values if "x" in ds else None
            return x, ds.n_steps.values, ds.norm_drift.values
    else:
        def run():
            r = solve(Problem(x0, Heads(score_matrices), "softmax", beta), Controller(RTOL, ATOL, 100_000),
                      SaveAt(np.linspace(0, T_MAX, SAMPLES), groups))
            count(r.n_steps, r.n_rejected, r.n_rhs_calls)
            return r.variables.get("x"), r.n_steps, r.norm_drift
    return run


# --- diffrax --------------------------------------------------------------------------------------
def jax_attention(x, m, bt):
    """One configuration's rows ``y^h_j = M_h x_j`` (M_h symmetric), scores ``s^h_ij = <y^h_i, x_j>`` and
    softmax weights, in JAX: what diffrax's field and the JAX observables share."""
    import jax
    import jax.numpy as jnp

    y = jnp.einsum("nd,hde->hne", x, m)
    s = jnp.einsum("hne,me->hnm", y, x)
    return y, s, jax.nn.softmax(bt * s, axis=-1)


def jax_tangent(x, v):
    """``v`` projected onto the tangent spaces of the sphere at the tokens ``x``."""
    import jax.numpy as jnp

    return v - jnp.sum(v * x, axis=-1, keepdims=True) * x


def diffrax_error_scale():
    """``|b_error / e|``: diffrax's Dopri5 error weights over attnflow's (``DOPRI5.e``), one constant for
    every stage (2/3 in diffrax 0.7), or None where they are not proportional.

    Both controllers accept a step when the RMS of error / (atol + rtol |y|) is at most 1 and scale
    the next one by 0.9 times its -1/5th power, so diffrax at tolerances times this constant takes
    the steps attnflow takes at the tolerances themselves.
    """
    import diffrax

    theirs, ours = np.asarray(diffrax.Dopri5.tableau.b_error, dtype=float), DOPRI5.e
    largest = np.argmax(np.abs(ours))
    ratio = theirs[largest] / ours[largest]
    return abs(ratio) if np.allclose(theirs, ratio * ours, rtol=1e-12, atol=1e-15) else None


def diffrax_route(cell, score_matrices, x0, beta, observables=False, tolerance_scale=1.0):
    """diffrax's Dopri5 on the batch (``vmap``, one jit). ``observables``: then, in the same jit, the
    variables ``simulate()`` records by default at the 101 outputs (``jax_observables``).
    ``tolerance_scale`` multiplies both tolerances (``diffrax_error_scale``)."""
    import diffrax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def field(t, x, args):
        m, bt = args
        y, _, w = jax_attention(x, m, bt)
        return jax_tangent(x, jnp.einsum("hnm,hme->ne", w, y))

    ts = jnp.linspace(0.0, T_MAX, SAMPLES)
    observe = jax_observables(cell.cluster_eps)

    def measure(ys, m, bt):
        # Output by output: a vmap over the outputs holds (T, H, n, n) intermediates, 2.4x slower at L
        return jax.lax.map(lambda x: observe(x, m, bt), ys)

    controller = diffrax.PIDController(rtol=RTOL * tolerance_scale, atol=ATOL * tolerance_scale)

    def one(x, m, bt):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Dopri5(), 0.0, T_MAX, None, x, (m, bt),
                                  saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller,
                                  max_steps=100_000)
        return sol.ys, sol.stats["num_accepted_steps"], measure(sol.ys, m, bt) if observables else {}

    solve = jax.jit(jax.vmap(one))
    args = (jnp.asarray(x0), jnp.asarray(score_matrices), jnp.asarray(beta))

    def run():
        ys, steps, measured = solve(*args)
        jax.block_until_ready((ys, measured))
        ys = np.asarray(ys)
        return ys, np.asarray(steps), np.max(np.abs(np.linalg.norm(ys, axis=-1) - 1.0), axis=(1, 2))
    return run


def jax_observables(cluster_eps):
    """The variables of ``DEFAULT_GROUPS`` at one configuration ``x`` (n, d), as a researcher would
    compute them in JAX after a diffrax solve: the definitions of docs/model.md ("Observables"),
    vectorised. Returns a function ``(x, m, beta) -> dict``; checked against ``attnflow.engine.observe``
    at the same states before it is timed (``check_jax_observables``)."""
    import jax
    import jax.numpy as jnp

    def observe(x, m, bt):
        n, H = x.shape[0], m.shape[0]
        y, s, p = jax_attention(x, m, bt)
        f = jnp.einsum("hnm,hme->hne", p, y)  # head outputs f^h_i
        xdot = jax_tangent(x, f.sum(0))
        gram = x @ x.T
        upper = jnp.triu(jnp.ones((n, n), bool), 1)
        # clusters: each token takes the smallest label among its neighbours until none changes
        edges = gram >= 1.0 - cluster_eps

        def spread(state):
            labels, _ = state
            new = jnp.min(jnp.where(edges, labels[None, :], n), axis=1)
            return new, jnp.any(new != labels)

        labels, _ = jax.lax.while_loop(lambda state: state[1], spread, (jnp.arange(n), jnp.array(True)))
        exps = jnp.exp(bt * s)
        a = jnp.sum(f * x, axis=-1)  # radial shadows (H, n)
        tangential = jnp.sum((f - a[..., None] * x) ** 2, axis=-1)
        norms = jnp.linalg.norm(f, axis=-1)
        others_largest = jnp.max(jnp.where(jnp.eye(H, dtype=bool)[:, :, None], 0.0, norms[None]), axis=1)
        rates = jnp.einsum("ie,hje->hij", xdot, y)
        rates = rates + jnp.swapaxes(rates, -1, -2)  # ds_ij/dt
        mean_s = jnp.sum(p * s, axis=-1, keepdims=True)
        return dict(
            gamma_mean=jnp.sum(jnp.where(upper, gram, 0.0)) / (n * (n - 1) / 2),
            gamma_min=jnp.min(jnp.where(upper, gram, jnp.inf)),
            cluster_count=jnp.sum(labels == jnp.arange(n)),
            kinetic=jnp.sum(xdot ** 2) / n,
            gamma_mean_rate=2.0 * (jnp.dot(xdot.sum(0), x.sum(0)) - jnp.sum(xdot * x)) / (n * (n - 1)),
            energy=exps.sum((1, 2)) / (2.0 * bt * n * n),
            energy_rate=jnp.einsum("ne,hnm,hme->h", xdot, exps, y) / (n * n),
            radial_shadow=a,
            tangential_power=tangential,
            rd_margin=tangential - a * (a.sum(0) - a),
            rd_margin_sufficient=tangential - (H - 1) * jnp.abs(a) * others_largest,
            entropy=-jnp.sum(p * jax.nn.log_softmax(bt * s, axis=-1), axis=-1),
            entropy_rate=-bt * bt * jnp.sum(p * (s - mean_s) * rates, axis=-1),
        )
    return observe


def check_jax_observables(cell, score_matrices, beta, ys, count):
    """Largest deviation of the JAX observables from ``attnflow.engine.observe`` at the same states
    (the first ``count`` trajectories' samples), relative to each variable's largest value."""
    import jax

    from attnflow.engine import observe

    per_time = jax.jit(jax.vmap(jax_observables(cell.cluster_eps), in_axes=(0, None, None)))
    worst = 0.0
    for b in range(count):
        ours = observe(ys[b], score_matrices[b][None], attention="softmax", beta=float(beta[b]),
                       groups=DEFAULT_GROUPS, cluster_eps=cell.cluster_eps)
        theirs = {k: np.asarray(v) for k, v in per_time(ys[b], score_matrices[b], beta[b]).items()}
        assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
        for name, value in ours.items():
            scale = max(float(np.max(np.abs(value))), 1e-300)
            worst = max(worst, float(np.max(np.abs(theirs[name] - value))) / scale)
    return worst


# --- torchode -------------------------------------------------------------------------------------
def torchode_route(cell, score_matrices, x0, beta):
    import torch
    import torchode as to

    torch.set_default_dtype(torch.float64)
    B, n, d = x0.shape
    m = torch.as_tensor(score_matrices)
    bt = torch.as_tensor(beta)[:, None, None, None]

    def field(t, y):
        x = y.reshape(B, n, d)
        rows = torch.einsum("bnd,bhde->bhne", x, m)
        s = torch.einsum("bhne,bme->bhnm", rows, x)
        w = torch.softmax(bt * s, dim=-1)
        v = torch.einsum("bhnm,bhme->bne", w, rows)
        return (v - (v * x).sum(-1, keepdim=True) * x).reshape(B, n * d)

    term = to.ODETerm(field)
    method = to.Dopri5(term=term)
    controller = to.IntegralController(atol=ATOL, rtol=RTOL, term=term)
    solver = to.AutoDiffAdjoint(method, controller)
    compiled = "eager"
    try:
        solver = torch.compile(solver)
        compiled = "torch.compile"
    except Exception:  # noqa: BLE001 - fall back to eager where compilation is unavailable
        pass
    t_eval = torch.linspace(0.0, T_MAX, SAMPLES).repeat(B, 1)
    y0 = torch.as_tensor(x0.reshape(B, n * d))

    def run():
        with torch.no_grad():
            sol = solver.solve(to.InitialValueProblem(y0=y0, t_eval=t_eval))
        ys = sol.ys.numpy().reshape(B, SAMPLES, n, d)
        drift = np.max(np.abs(np.linalg.norm(ys, axis=-1) - 1.0), axis=(1, 2))
        return ys, sol.stats["n_accepted"].numpy(), drift
    return run, compiled


# --- scipy ----------------------------------------------------------------------------------------
def scipy_route(cell, score_matrices, x0, beta):
    def run():
        out, steps = [], []
        t = np.linspace(0, T_MAX, SAMPLES)
        for b in range(x0.shape[0]):
            def rhs(_t, y, m=score_matrices[b], bt=beta[b]):
                return reference_velocity(y.reshape(cell.n, cell.d), m, bt, "softmax").ravel()
            sol = solve_ivp(rhs, (0, T_MAX), x0[b].ravel(), method="RK45", rtol=RTOL, atol=ATOL, t_eval=t)
            out.append(sol.y.T.reshape(SAMPLES, cell.n, cell.d))
            steps.append(sol.nfev // 6)
        ys = np.stack(out)
        return ys, np.array(steps), np.max(np.abs(np.linalg.norm(ys, axis=-1) - 1.0), axis=(1, 2))
    return run


def busy_core(name, repeat):
    """``simulate()`` with every observable, alone and beside a process that keeps one core busy.

    On a shared node another job's thread takes a core: with trajectories handed out
    statically the engine waits for the thread that shares it (about 2x); handed out
    dynamically, the free core takes more of them.
    """
    import subprocess

    import numba

    cell, score_matrices, x0, beta = problem(name)
    run = attnflow_route(cell, score_matrices, x0, beta, DEFAULT_GROUPS)
    alone = best_of(run, repeat)[0]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        busy = best_of(run, repeat)[0]
    finally:
        spinner.kill()
        spinner.wait()  # gone before the next timing
    print(f"\nbeside one busy core ({name}, simulate() all observables, {numba.get_num_threads()} engine "
          f"threads taking trajectories from one counter): alone {alone:.3f} s, busy {busy:.3f} s, "
          f"{busy / alone:.2f}x (target <= 1.6x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="S,M,L,mixed beta", help="comma-separated subset")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ref-seeds", type=int, default=4)
    parser.add_argument("--no-scipy", action="store_true", help="skip scipy one by one (slow)")
    parser.add_argument("--busy-core", default="M",
                        help="cell timed alone and beside one busy core ('' skips)")
    args = parser.parse_args(argv)

    import numba

    blas = sorted({(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()})
    print(f"machine: {os.cpu_count()} cores; numba threads {numba.get_num_threads()} "
          f"(engine BLAS limited to 1 thread per trajectory); BLAS: {blas}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if args.busy_core:
        busy_core(args.busy_core, args.repeat)
    header = (f"{'cell':11} {'route':34} {'wall s':>8} {'cpu s':>7} {'compile s':>9} {'steps':>6} "
              f"{'error':>9} {'drift':>9}")
    rows, evaluations = [], {}
    for name in [c.strip() for c in args.cells.split(",")]:
        cell, score_matrices, x0, beta = problem(name)
        k = min(args.ref_seeds, cell.n_seeds)
        ref = reference(cell, score_matrices, x0, beta, k)
        calls = {}
        evaluations[name] = calls
        routes = [
            ("attnflow simulate(), positions",
             attnflow_route(cell, score_matrices, x0, beta, ("positions",))),
            ("attnflow simulate(), all observables",
             attnflow_route(cell, score_matrices, x0, beta, DEFAULT_GROUPS, calls)),
            ("attnflow simulate(), cosines only",
             attnflow_route(cell, score_matrices, x0, beta, ("cosines",))),
        ]
        if np.all(beta == beta[0]):  # simulate() itself (mixed beta calls the engine: no certificate)
            routes.insert(2, (CERTIFIED, attnflow_route(cell, score_matrices, x0, beta, DEFAULT_GROUPS, calls,
                                                        certify=True)))
        try:
            routes.append(("diffrax vmap Dopri5 (jit)", diffrax_route(cell, score_matrices, x0, beta)))
            routes.append((WITH_OBSERVABLES, diffrax_route(cell, score_matrices, x0, beta, observables=True)))
            scale = diffrax_error_scale()
            if scale is None:
                print("diffrax's Dopri5 error weights are not a multiple of attnflow's: no route under "
                      "attnflow's error control")
            else:
                routes.append((SAME_CONTROL, diffrax_route(cell, score_matrices, x0, beta,
                                                           tolerance_scale=scale)))
        except ImportError as err:
            print(f"diffrax skipped: {err} (pip install -e '.[bench]')")
        try:
            run, how = torchode_route(cell, score_matrices, x0, beta)
            routes.append((f"torchode Dopri5 ({how})", run))
        except ImportError as err:
            print(f"torchode skipped: {err} (pip install -e '.[bench]')")
        if not args.no_scipy:
            routes.append(("scipy RK45, one by one", scipy_route(cell, score_matrices, x0, beta)))
        print(f"\n{header}")
        positions_error = None
        for label, run in routes:
            try:
                cpu = []
                wall, compile_s, (ys, steps, drift) = best_of(run, args.repeat, cpu)
            except Exception as err:  # noqa: BLE001 - report the failing peer, keep the others
                print(f"{name:11} {label:34} failed: {type(err).__name__}: {str(err)[:120]}")
                continue
            if ys is not None:
                error = float(np.max(np.abs(np.asarray(ys)[:k] - ref)))
                positions_error = error if label.startswith("attnflow") else positions_error
            else:
                error = positions_error if positions_error is not None else np.nan
            row = (name, label, wall, compile_s, float(np.mean(steps)), error, float(np.max(drift)), cpu[0])
            rows.append(row)
            print(f"{name:11} {label:34} {wall:8.3f} {cpu[0]:7.3f} {compile_s:9.2f} {row[4]:6.0f} "
                  f"{error:9.1e} {row[6]:9.1e}", flush=True)
            if label == WITH_OBSERVABLES:  # the same variables as simulate()'s, or the timing means nothing
                deviation = check_jax_observables(cell, score_matrices, beta, ys, k)
                verdict = ("the same variables" if deviation < 1e-10
                           else "MISMATCH: the timing compares different work")
                print(f"{'':11} (its observables at its own states against attnflow.engine.observe there: "
                      f"largest deviation {deviation:.1e} of each variable's largest value: {verdict})",
                      flush=True)
    print("\nspeed-up of attnflow simulate() over diffrax (wall time, this run; in brackets CPU time of\n"
          "every thread of the process: the work per core), and the observables' share:")
    for name in dict.fromkeys(r[0] for r in rows):
        peer = next((r for r in rows if r[0] == name and r[1].startswith("diffrax")), None)
        ours = {r[1]: r[2] for r in rows if r[0] == name and r[1].startswith("attnflow")}
        ours_cpu = {r[1]: r[7] for r in rows if r[0] == name and r[1].startswith("attnflow")}
        for label, wall in ours.items():
            ratio = f"{peer[2] / wall:5.2f}x ({peer[7] / ours_cpu[label]:4.2f}x)" if peer else "  n/a"
            print(f"  {name:11} {label:38} {ratio}")
        base = ours.get("attnflow simulate(), cosines only")
        full_label = "attnflow simulate(), all observables"
        full = ours.get(full_label)
        both = next((r[2] for r in rows if r[0] == name and r[1] == WITH_OBSERVABLES), None)
        if both and full:
            print(f"  {name:11} {'all observables, against ' + WITH_OBSERVABLES:38} {both / full:5.2f}x")
        same = next((r[2] for r in rows if r[0] == name and r[1] == SAME_CONTROL), None)
        if same and full:
            print(f"  {name:11} {'all observables, against ' + SAME_CONTROL:38} {same / full:5.2f}x")
        if base and full:
            share = 100 * (full - base) / full
            print(f"  {name:11} observables beyond the cosines: {share:.0f}% of simulate()")
        certified = ours.get(CERTIFIED)
        if peer and certified and full:
            print(f"  {name:11} {'diffrax / simulate(): certificate on, off':38} {peer[2] / certified:5.2f}x "
                  f"{peer[2] / full:5.2f}x (CPU {peer[7] / ours_cpu[CERTIFIED]:4.2f}x "
                  f"{peer[7] / ours_cpu[full_label]:4.2f}x)")
        if certified and full:
            print(f"  {name:11} certificate's cost over the run it certifies: wall "
                  f"{certified / full - 1:.2f}, CPU {ours_cpu[CERTIFIED] / ours_cpu[full_label] - 1:.2f}")
        calls = evaluations.get(name)
        if calls and "certificate" in calls:
            print(f"  {name:11} certificate's field evaluations: {calls['certificate']:.0f} per trajectory, "
                  f"{calls['certificate'] / calls['all']:.2f} of the run's")
        if calls:
            # Every observable but the cosines needs the field at the sample itself, which
            # costs what a stage costs: this fraction of the work is the share's floor.
            print(f"  {name:11} field evaluations at the samples: {calls['samples']:.0f} of "
                  f"{calls['all']:.0f} per trajectory ({100 * calls['samples'] / calls['all']:.0f}%)")


if __name__ == "__main__":
    main()
