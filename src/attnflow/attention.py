"""Attention types (MODEL.md, "Attention types"): one declaration each.

A declaration names the type, says how the compiled engine turns scores into
weights (``Weights``, the switch in ``engine/field.py``) and how the head
outputs combine into the velocity. ``Cell``, the engine, the observables, the
cost model, the config schema and the docs all read these declarations.
Adding a type is one entry here plus, for a new weight rule, one branch in
``engine.field.attention_weights``.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum

from .registry import Registry


class Weights(IntEnum):
    """Weight rules the compiled engine implements (``engine.field.attention_weights``)."""

    SOFTMAX = 0  # softmax_j(beta s_ij), stabilised by the row maximum
    EXP = 1  # exp(beta s_ij), unnormalised
    RELU = 2  # max(beta s_ij, 0) / n


@dataclasses.dataclass(frozen=True)
class AttentionType:
    name: str
    weights: Weights
    velocity_over_n: bool  # v_i = (1/n) sum_h f^h_i instead of sum_h f^h_i
    formula: str  # the weights w^h_ij, as in MODEL.md
    description: str

    @property
    def velocity(self) -> str:
        return "(1/n) sum_h f^h_i" if self.velocity_over_n else "sum_h f^h_i"


ATTENTIONS: Registry[AttentionType] = Registry("attention", [
    AttentionType(
        "softmax", Weights.SOFTMAX, False, "softmax_j(beta s^h_ij)",
        "normalised attention; the paper's quantitative results (Thm 19, 22, 25, 27)",
    ),
    AttentionType(
        "usa", Weights.EXP, True, "exp(beta s^h_ij)",
        "unnormalised attention, the paper's gradient-flow framework (Thm 11, 16-17, 39)",
    ),
    AttentionType(
        "relu", Weights.RELU, False, "max(beta s^h_ij, 0) / n",
        "ReLU attention: no drive between orthogonal tokens (Thm 25)",
    ),
])
