"""Resource requests against measurement: the largest cell of each shipped config, run as a job would."""

import json
import subprocess
import sys

import pytest
from sweep_helpers import ROOT, TINY, run, write_config

from attnflow import resources
from attnflow.config import load, validate

pytestmark = pytest.mark.workflow

CONFIGS = [ROOT / "config" / "config.yaml", ROOT / "config" / "paper.yaml", TINY]
SEEDS_TIMED = 4

# A job's work on one cell, in a fresh interpreter: its peak RSS (MB) and its time. The peak is the
# interpreter's own (VmHWM, Linux): ru_maxrss also holds the peak RSS of the process that started it,
# which Linux carries across fork and exec (a pytest process that once held 900 MB gives every child
# a "peak" of 900 MB, whatever the child does).
JOB = """
import json, resource, sys, time
start = time.perf_counter()
from attnflow import Cell, simulate
from attnflow.store import write
cell = Cell(**json.loads(sys.argv[1]))
write(simulate(cell), sys.argv[2])
try:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(peak, time.perf_counter() - start)
"""


def _largest(path, key):
    sweep = validate(load(path), reach_scheduler=False)
    cells = [c for batch in sweep.batches.values() for c in batch]
    return max(cells, key=key)


def _run_cell(cell, tmp_path):
    """Simulate and store one cell as a job does; (peak RSS MB, seconds including start-up)."""
    store = str(tmp_path / "s.zarr.zip")
    proc = subprocess.run([sys.executable, "-c", JOB, json.dumps(cell.to_dict()), store],
                          capture_output=True, text=True, check=True)
    peak, seconds = proc.stdout.split()[-2:]
    return float(peak), float(seconds)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_requests_cover_the_measured_peak_and_runtime(path, tmp_path):
    # The largest cell by memory and the longest by the runtime model: one run if the same.
    by_memory = _largest(path, resources.cell_bytes)
    by_time = _largest(path, resources.cell_seconds)
    # Of the longest cell, at most SEEDS_TIMED of its seeds: they are independent trajectories, which
    # the engine runs one after another on each thread and the model prices one by one (linear in
    # n_seeds), so the comparison holds per seed. paper.yaml's longest cell, 32 seeds of n = 32 tokens
    # in d = 4096 to t = 200, took 81 s of the suite in full. The largest cell by memory runs whole.
    if by_time != by_memory and by_time.n_seeds > SEEDS_TIMED:
        by_time = by_time.replace(seeds=by_time.seeds[:SEEDS_TIMED])
    for cell in dict.fromkeys([by_memory, by_time]):
        peak_mb, seconds = _run_cell(cell, tmp_path)
        assert resources.memory_mb([cell]) >= peak_mb, (cell, peak_mb)
        assert resources.runtime_minutes([cell]) * 60 >= seconds, (cell, seconds)
        # The model is within its safety margin of the measurement, not just generous.
        assert resources.SAFETY * resources.cell_seconds(cell) + resources.STARTUP_SECONDS >= seconds


def test_a_retry_asks_for_more():
    sweep = validate(load(TINY), reach_scheduler=False)
    cells = next(iter(sweep.batches.values()))
    first, second = resources.memory_mb(cells, 1), resources.memory_mb(cells, 2)
    assert second >= 2 * first - 1
    assert resources.runtime_minutes(cells, 2) == 2 * resources.runtime_minutes(cells, 1)


def test_the_rule_asks_for_the_model(tmp_path):
    config = write_config(tmp_path)
    out = run(tmp_path, config, "-n", "--printshellcmds").stdout
    sweep = validate(load(config), reach_scheduler=False)
    for batch, cells in sweep.batches.items():
        block = out[out.index(f"batch={batch}"):][:600]
        assert f"mem_mb={resources.memory_mb(cells, 1)}" in block
        assert f"runtime={resources.runtime_minutes(cells, 1)}" in block
    profile = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    assert "retries: 2" in profile


def test_the_step_estimate_never_exceeds_the_budget():
    # usa's stiffness grows like e^(beta ||M||): uncapped, beta = 100 planned ~10^14 core-hours for
    # cells whose trajectories stop at max_steps within seconds.
    from attnflow import Cell
    from attnflow.resources import cell_seconds, steps

    stiff = Cell(attention="usa", heads="block", beta=100.0, H=2, d=4, n=4, lambda_bar=1.0, max_steps=5000)
    assert steps(stiff) == 5000.0
    assert cell_seconds(stiff) < 3600.0
    mild = Cell(attention="softmax", heads="scalar", beta=1.0)
    assert steps(mild) < mild.max_steps


# The memory a job needs beyond the interpreter, measured (VmHWM after, less VmHWM after a 2-seed warm-up
# that loaded every import and kernel) for cells of 1,000 and 40,000 seeds at tiny n, d, whose peak is
# the initial tokens, their draw and the streams' state words rather than the recorded variables.
PEAKS = """
import json, sys, tempfile
from attnflow import Cell, resources
from attnflow.layout import Layout
from attnflow.run.batch import run_batch

def hwm():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024

out = []
with tempfile.TemporaryDirectory() as tmp:
    run_batch([Cell(**json.loads(sys.argv[1]), seeds=2)], "warm", Layout(tmp), log=lambda *_: None)
    for k, seeds in enumerate(json.loads(sys.argv[2])):
        cell = Cell(**json.loads(sys.argv[1]), seeds=seeds)
        before = hwm()
        run_batch([cell], f"b{k}", Layout(tmp), log=lambda *_: None)
        out.append([seeds, hwm() - before, resources.job_bytes([cell])])
print(json.dumps(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_the_memory_model_is_within_1_5x_of_the_measured_peak_from_1k_to_40k_seeds():
    # 1.5x either way (issue 42): an estimate far below the peak gets the job killed, far above wastes
    # the allocation. Tiny n, d and one sample group: the tokens and their draw dominate (at 100,000
    # seeds the model used to count 827 MB of 2.6 GB).
    fields = {"H": 2, "n": 4, "d": 3, "beta": 1.0, "t_max": 0.1, "n_samples": 2, "observables": ["cosines"]}
    proc = subprocess.run([sys.executable, "-c", PEAKS, json.dumps(fields), json.dumps([1000, 40000])],
                          capture_output=True, text=True, check=True)
    for seeds, measured, model in json.loads(proc.stdout.splitlines()[-1]):
        assert measured / 1.5 <= model <= 1.5 * measured, (seeds, measured, model)
