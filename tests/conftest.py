import fcntl
import os
import shutil
import sys
from pathlib import Path

# One BLAS thread in the tests' processes and every process they start (Snakemake, its jobs): the suite
# runs a worker per core, each starting jobs, and an OpenBLAS thread pool per process on top of that
# spins against the others (measured: validating the shipped configs, 0.6 s alone, 25 s with both cores
# busy). The engine takes one BLAS thread whatever this says (engine.solve limits it), so its numbers
# do not move; set before numpy loads its BLAS.
for _blas_threads in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))


# The test files by their wall time on 2 cores (seconds, a fresh-clone run of the suite), longest
# first. Under pytest-xdist (``--dist loadfile --no-loadscope-reorder``) a worker takes the next file
# in this order as it finishes one: the longest start first and the short ones fill the end (longest
# processing time first), instead of one worker finishing a long file alone while the other idles.
# test_config comes second: it needs no engine, and runs while the first file compiles it.
# A file not listed goes after these, the files with workflow runs first.
MEASURED_SECONDS = {
    "test_numerics_version.py": 163, "test_config.py": 16, "test_doc_commands.py": 88,
    "test_isolation.py": 67, "test_jax_engine.py": 59, "test_workflow.py": 56, "test_faults.py": 45,
    "test_figure_layout.py": 40, "test_refine.py": 39, "test_bitrot.py": 32, "test_slurm.py": 30,
    "test_resources.py": 21, "test_failures.py": 16, "test_certificate_sweep.py": 12,
    "test_experiments.py": 11, "test_gpu_jobs.py": 9.5, "test_blas.py": 5, "test_certificate.py": 5,
    "test_engine.py": 5, "test_export.py": 4.6, "test_lock.py": 4.6,
}


def pytest_collection_modifyitems(config, items):
    """Test files in the order of ``MEASURED_SECONDS`` (a stable sort: each file keeps its tests' order)."""
    order = list(MEASURED_SECONDS)
    slow = {item.path for item in items if item.get_closest_marker("workflow")}

    def rank(item):
        name = item.path.name
        return (order.index(name), 0) if name in order else (len(order), item.path not in slow)

    items.sort(key=rank)


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


# Finished workflow runs shared by the whole session. Tests only read them; a test that damages,
# deletes or adds results copies the results directory first (shutil.copytree) and runs on the copy.
def _session_run(tmp_path_factory, name: str, make) -> Path:
    """A directory that ``make(directory)`` fills once per test session.

    Under pytest-xdist each worker has its own session fixtures: the first worker to ask makes the
    directory, in the session's base temporary directory (above the workers' own), under a file
    lock; the others wait for it and read the same one. A worker that failed halfway leaves no
    ``.complete`` marker: the next one starts again from scratch.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    directory, complete = base / name, base / f"{name}.complete"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            complete.touch()
    return directory


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny config run once locally on 2 cores, its simulate jobs at one thread each (the rule's own:
    two at a time): (workdir, config path, results).

    One thread on purpose too: test_faults.test_same_seeds_bit_identical_on_one_and_two_threads
    compares its stores with those of ``beta_star_run`` (two threads a job).
    """
    from sweep_helpers import run, write_config

    tmp = _session_run(tmp_path_factory, "tiny",
                       lambda tmp: run(tmp, write_config(tmp), "--set-threads", "simulate=1"))
    return tmp, tmp / "config.yaml", tmp / "results"


@pytest.fixture(scope="session")
def beta_star_run(tmp_path_factory):
    """The tiny config's beta_star alone, run once locally on 2 cores, two threads a simulate job (as the
    SLURM profile sets): (workdir, config path, results dir).

    test_faults.test_same_seeds_bit_identical_on_one_and_two_threads compares its stores with those of
    ``tiny_run`` (one thread a job). The stale-store, bit-rot and SLURM tests start from copies of it.
    """
    from sweep_helpers import beta_star_config, run

    tmp = _session_run(tmp_path_factory, "beta_star",
                       lambda tmp: run(tmp, beta_star_config(tmp), "--set-threads", "simulate=2", cores=2))
    return tmp, tmp / "config.yaml", tmp / "results"


@pytest.fixture(scope="session")
def compiled_engine(tmp_path_factory):
    """The engine compiled into the working tree's numba cache, once per session (all workers).

    One small cell simulated in-process compiles the solver every simulation job uses
    (test_doc_commands hands the cache to its fresh install, which would compile it again).
    """
    def compile_engine(_):
        from attnflow import Cell, simulate

        simulate(Cell(H=2, n=4, d=4, beta=0.5, heads="block", seeds=2, t_max=0.5, n_samples=3))

    _session_run(tmp_path_factory, "compiled_engine", compile_engine)
