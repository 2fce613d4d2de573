"""The workflow through a real single-node SLURM cluster (Debian's slurm-wlm + munge).

The cluster is started by this module's fixture (tests/slurm/cluster.sh) and
stopped after. Without SLURM on the machine the test is skipped, unless
ATTNFLOW_REQUIRE_SLURM=1 (set by .ci/run, which installs it), where it fails.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sweep_helpers import NOT_BETA_STAR, ROOT, assert_same_results, run, write_config

pytestmark = pytest.mark.workflow

REQUIRED = os.environ.get("ATTNFLOW_REQUIRE_SLURM") == "1"
HAVE_SLURM = all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "squeue", "munged"))


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory):
    if not HAVE_SLURM or os.geteuid() != 0:
        if REQUIRED:
            pytest.fail("SLURM is required (ATTNFLOW_REQUIRE_SLURM=1) but slurm-wlm/munge or root is missing")
        pytest.skip("no SLURM here: apt-get install slurm-wlm munge (as root) to run this test")
    state = tmp_path_factory.mktemp("slurm")
    script = ROOT / "tests" / "slurm" / "cluster.sh"
    proc = subprocess.run(["bash", str(script), "start", str(state)], capture_output=True, text=True)
    if proc.returncode == 3 and not REQUIRED:
        pytest.skip("a real SLURM config is installed here; the test cluster will not replace it")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield Path(proc.stdout.strip().splitlines()[-1])
    subprocess.run(["bash", str(script), "stop", str(state)], capture_output=True)


def _config(tmp):
    """The tiny config's two experiments that share cells: beta_star, and toy_margin (the tests' own
    experiment module, imported on the node) whose cells are beta_star's at n = 4."""
    return write_config(tmp, **{f"experiments.{e}": None for e in NOT_BETA_STAR if e != "toy_margin"})


def test_slurm_run_equals_local_run(tmp_path, slurm_conf, tiny_run):
    # The local run: the whole tiny config's (its beta_star and toy_margin are this config's), on one
    # thread a job against the profile's two.
    local = tiny_run[2]
    config = _config(tmp_path)
    proc = run(
        tmp_path, config,
        "--profile", str(ROOT / "profiles" / "slurm"),
        "--slurm-no-account",
        "--default-resources", "slurm_partition=debug", "runtime=10", "mem_mb=1000",
        "--slurm-init-seconds-before-status-checks", "2",
        "--slurm-logdir", str(tmp_path / "slurm-logs"),
        env={"SLURM_CONF": str(slurm_conf)},
    )
    out = proc.stdout + proc.stderr
    # The simulation jobs really went through sbatch.
    assert re.search(r"submitted with SLURM jobid \d+", out), out[-3000:]
    assert_same_results(tmp_path / "results", local, within=True)
