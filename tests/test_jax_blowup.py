"""A trajectory that blows up ends in the JAX engine as in the numba engine: a step-size underflow after
about a hundred steps, not "step budget exhausted" after max_steps rejected or round-off-sized steps."""

import pytest

pytest.importorskip("diffrax")
pytest.importorskip("equinox")

from attnflow import Cell  # noqa: E402
from attnflow.simulation import simulate  # noqa: E402


def test_a_blow_up_is_a_step_size_underflow_in_both_engines():
    # Flat usa blows up in finite time (tests/test_faults.py): both seeds fail near t = 0.42 of 5.
    runs = {engine: simulate(Cell(heads="perturbed_block", attention="usa", geometry="flat", init="uniform",
                                  H=2, n=6, d=4, beta=1.0, seeds=2, n_samples=11, delta=0.1, t_max=5.0,
                                  engine=engine))
            for engine in ("numba", "jax")}
    for engine, ds in runs.items():
        assert "2 of 2 seeds failed: step size underflow" in ds.attrs["seed_failures"], engine
        # Steps tried before the run was called off: about a hundred (numba 131 and jax 167 per seed here),
        # against the default budget of 100,000 the JAX engine spent before.
        assert (ds.n_steps.values + ds.n_rejected.values).max() < 1000, engine
    # Where it stopped: the same time to 4 digits (the engines' step sequences differ: the
    # blow-up's time, not where round-off ends each, is what the message gives).
    assert abs(float(runs["jax"].t_failed.max()) - float(runs["numba"].t_failed.max())) < 1e-3
