import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny config run once locally on 2 cores: (workdir, config path, results dir)."""
    from sweep_helpers import run, write_config

    tmp = tmp_path_factory.mktemp("tiny")
    config = write_config(tmp)
    run(tmp, config)
    return tmp, config, tmp / "results"
