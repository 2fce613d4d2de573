"""Seeded random streams: each seed owns one independent stream per purpose.

A seed's draws therefore do not depend on which other seeds share its batch,
nor on which other purposes a cell uses.
"""

from __future__ import annotations

import numpy as np

_STREAMS = {"strengths": 1, "heads": 2, "tokens": 3, "embedding": 4}


def stream(seed: int, purpose: str) -> np.random.Generator:
    """The generator of ``seed`` for ``purpose`` (strengths, heads, tokens, embedding)."""
    return np.random.default_rng([int(seed), _STREAMS[purpose]])
