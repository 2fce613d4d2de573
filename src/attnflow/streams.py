"""Seeded random streams: each seed owns one independent stream per purpose.

A seed's draws therefore do not depend on which other seeds share its batch,
nor on which other purposes a cell uses.

A stream is numpy's ``default_rng([seed, purpose])``, drawn bit for bit alike,
but built from state words computed once per process: ``SeedSequence``'s
hashing took 9 of the 15 us of each ``default_rng`` call (measured), and a
batch of cells draws the same seeds' streams once per cell.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.random.bit_generator import ISeedSequence

_STREAMS = {"strengths": 1, "heads": 2, "tokens": 3, "embedding": 4}


def seed_batch(seeds, caller: str) -> tuple[int, ...]:
    """``seeds`` (a sequence of ints) as a tuple; a single int is refused by name: the builders take a
    batch of seeds (``[seed]`` for one)."""
    if isinstance(seeds, (int, np.integer)):
        raise TypeError(f"{caller}: seeds = {seeds!r}: give a sequence of seeds, [{seeds}] for one")
    return tuple(int(seed) for seed in seeds)


def stream(seed: int, purpose: str) -> np.random.Generator:
    """The generator of ``seed`` for ``purpose`` (strengths, heads, tokens, embedding)."""
    return np.random.Generator(np.random.PCG64(_RememberedSeedSequence((int(seed), _STREAMS[purpose]))))


class _RememberedSeedSequence(ISeedSequence):
    """``SeedSequence(entropy)`` as a bit generator sees it (numpy's seed-sequence interface), its state
    words remembered per process."""

    __slots__ = ("entropy",)

    def __init__(self, entropy: tuple[int, ...]):
        self.entropy = entropy

    def generate_state(self, n_words, dtype=np.uint32):
        return _state_words(self.entropy, int(n_words), np.dtype(dtype))


@functools.lru_cache(maxsize=1 << 16)  # 64 Ki streams, about 10 MB: every seed of any sweep's batch
def _state_words(entropy, n_words, dtype):
    words = np.random.SeedSequence(list(entropy)).generate_state(n_words, dtype)
    words.setflags(write=False)  # shared by every generator built from it
    return words
