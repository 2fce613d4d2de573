"""The experiment seam: the registry is built from modules; a new experiment is one module."""

import numpy as np
import pytest
from sweep_helpers import ROOT, planned, run, write_config

from attnflow.config import ConfigError, load, validate
from attnflow.experiments import Experiment, builtin_modules, registry
from attnflow.observables import GROUPS
from attnflow.store import open_verified

pytestmark = pytest.mark.workflow


def test_registry_comes_from_the_modules():
    names = registry().names()
    assert len(names) == len(builtin_modules()) == len(set(names))
    for exp in registry():
        assert isinstance(exp, Experiment)
        assert exp.theorem and exp.question and exp.caption and exp.reading and exp.axes
        assert all(g in GROUPS for g in exp.observables)
        # Every experiment's defaults make a valid config on their own; one that cannot run on this
        # machine (trained_heads without its optional weights) is refused with its reason instead.
        config = {"experiments": {exp.name: {}}}
        reason = exp.unavailable(exp.spec({}))
        if reason:
            with pytest.raises(ConfigError, match=f"none can run here .*{exp.name}: "):
                validate(config, reach_scheduler=False)
        else:
            validate(config, reach_scheduler=False)


def test_default_config_is_the_experiments_defaults():
    config = load(ROOT / "config" / "config.yaml")
    for name, block in config["experiments"].items():
        assert block == registry().get(name).defaults, name


def test_a_module_without_experiment_is_refused(tmp_path, monkeypatch):
    (tmp_path / "not_an_experiment.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="defines no EXPERIMENT"):
        validate({"experiment_modules": ["not_an_experiment"], "experiments": {"energy": {}}})


def test_an_experiment_from_a_tests_only_module_runs_end_to_end(tmp_path):
    # One module (tests/toy_experiment.py) plus a config block: no other file changes.
    config = write_config(tmp_path, **{
        "experiment_modules": ["toy_experiment"],
        "experiments": {"toy_margin": {"grid": {"beta": [0.25, 0.5, 0.75, 1.0], "n": [8]}}},
    })
    run(tmp_path, config)
    results = tmp_path / "results"
    summary = open_verified(results / "summaries" / "toy_margin.zarr.zip").load()
    # Sufficient margin at orthogonal tokens holds exactly below beta*(2, 8) = 0.5 ln(0.382 * 7 / 0.618).
    beta_star = float(summary.beta_star.squeeze())
    c2 = (3 - np.sqrt(5)) / 2  # c*(2)^2 = 1 / golden ratio squared
    assert beta_star == pytest.approx(0.5 * np.log(c2 * 7 / (1 - c2)), rel=1e-12)
    holds = summary.holds.squeeze().values
    np.testing.assert_array_equal(holds, (summary.beta.values <= beta_star).astype(float))
    assert (results / "figures" / "toy_margin.png").stat().st_size > 1000
    assert planned(tmp_path, config) == {}
