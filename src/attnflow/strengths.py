"""Distributions of head strengths lambda_h (docs/model.md, "Head structures and strengths"): one
declaration each.

Every distribution keeps the total ``Lambda = sum_h lambda_h = H * lambda_bar``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .registry import Registry
from .streams import stream


@dataclasses.dataclass(frozen=True)
class StrengthDistribution:
    name: str
    draw: Callable  # (cell, seed) -> (H,) strengths
    largest: Callable  # cell -> upper bound on max_h lambda_h over every seed
    uses: tuple[str, ...]  # the cell fields it reads besides H and lambda_bar
    description: str
    seeded: bool = False  # draws from the seed's random stream


def _equal(cell, seed):
    return np.full(cell.H, cell.lambda_bar)


def _linear(cell, seed):
    if cell.H == 1:
        return np.full(1, cell.lambda_bar)
    return cell.lambda_bar * (1.0 + cell.spread * (2.0 * np.arange(cell.H) / (cell.H - 1) - 1.0))


def _dirichlet(cell, seed):
    weights = stream(seed, "strengths").dirichlet(np.full(cell.H, cell.concentration))
    return cell.H * cell.lambda_bar * weights


STRENGTHS: Registry[StrengthDistribution] = Registry("lambda_dist", [
    StrengthDistribution("equal", _equal, lambda c: c.lambda_bar, (),
                         "every head has strength lambda_bar"),
    StrengthDistribution("linear", _linear, lambda c: c.lambda_bar * (1.0 + c.spread), ("spread",),
                         "lambda_h = lambda_bar (1 + spread (2h/(H-1) - 1)), evenly spaced"),
    # A Dirichlet draw can put the whole total on one head.
    StrengthDistribution("dirichlet", _dirichlet, lambda c: c.H * c.lambda_bar, ("concentration",),
                         "H lambda_bar times a seeded Dirichlet(concentration) draw", seeded=True),
])


def head_strengths(cell, seed: int) -> np.ndarray:
    """``lambda_h`` for one seed, shape ``(H,)``, summing to ``H * lambda_bar``."""
    return STRENGTHS.get(cell.lambda_dist).draw(cell, seed)
