"""Seeded random streams: each seed owns one independent stream per purpose.

A seed's draws therefore do not depend on which other seeds share its batch,
nor on which other purposes a cell uses.
"""

from __future__ import annotations

import numpy as np

_STREAMS = {"strengths": 1, "heads": 2, "tokens": 3, "embedding": 4}


def seed_batch(seeds, caller: str) -> tuple[int, ...]:
    """``seeds`` (a sequence of ints) as a tuple; a single int is refused by name: the builders take a
    batch of seeds (``[seed]`` for one)."""
    if isinstance(seeds, (int, np.integer)):
        raise TypeError(f"{caller}: seeds = {seeds!r}: give a sequence of seeds, [{seeds}] for one")
    return tuple(int(seed) for seed in seeds)


def stream(seed: int, purpose: str) -> np.random.Generator:
    """The generator of ``seed`` for ``purpose`` (strengths, heads, tokens, embedding)."""
    return np.random.default_rng([int(seed), _STREAMS[purpose]])
