import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


# Finished workflow runs shared by the whole session. Tests only read them; a test that damages,
# deletes or adds results copies the results directory first (shutil.copytree) and runs on the copy.
@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny config run once locally on 2 cores: (workdir, config path, results dir)."""
    from sweep_helpers import run, write_config

    tmp = tmp_path_factory.mktemp("tiny")
    config = write_config(tmp)
    run(tmp, config)
    return tmp, config, tmp / "results"


@pytest.fixture(scope="session")
def beta_star_run(tmp_path_factory):
    """The tiny config's beta_star alone, run once locally on ONE core: (workdir, config path, results dir).

    One core on purpose: test_faults.test_same_seeds_bit_identical_on_one_core compares its stores with
    those of ``tiny_run`` (two cores). The stale-store, bit-rot and SLURM tests start from copies of it.
    """
    from sweep_helpers import beta_star_config, run

    tmp = tmp_path_factory.mktemp("beta_star")
    config = beta_star_config(tmp)
    run(tmp, config, cores=1)
    return tmp, config, tmp / "results"
