"""The seeded streams against the route they stand for: numpy's ``default_rng([seed, purpose])``."""

import numpy as np
import pytest

from attnflow.streams import stream

# The purposes' numbers are part of every stored draw: written out here, not read from the module.
PURPOSES = {"strengths": 1, "heads": 2, "tokens": 3, "embedding": 4}


@pytest.mark.parametrize("seed", [0, 1, 63, 2**31 + 5, 2**40])
def test_a_stream_draws_what_default_rng_draws(seed):
    for purpose, key in PURPOSES.items():
        for _ in range(2):  # the first call computes the state words, the second reuses them
            ours, numpys = stream(seed, purpose), np.random.default_rng([seed, key])
            assert ours.bit_generator.state == numpys.bit_generator.state
            assert np.array_equal(ours.standard_normal(7), numpys.standard_normal(7))
            assert np.array_equal(ours.integers(0, 10**9, 5), numpys.integers(0, 10**9, 5))


def test_a_used_stream_leaves_the_next_one_of_its_seed_untouched():
    stream(3, "tokens").standard_normal(1000)
    again = stream(3, "tokens").standard_normal(5)
    assert np.array_equal(again, np.random.default_rng([3, 3]).standard_normal(5))
