"""Attention types (docs/model.md, "State and dynamics", results 8-9): one declaration each.

A declaration says everything the rest of attnflow needs from a type:

- the compiled engine: its weight rule (``Weights``), whether a head output's
  rows are divided by the row sums, and how the head outputs combine;
- the observables: which energy it is the gradient flow of, if any
  (``Energy``), and which distribution its attention entropy measures
  (``Entropy``);
- the cost model: how its step count grows with ``s = beta ||M_h||``;
- the accuracy certificate: whether its field is smooth (``smooth``).

Each rule is an enum whose members every engine implements, one kernel each
(``attnflow.contract``): an engine refuses a declaration whose rule has no
kernel there, by name, at import and at every ``solve`` (there is no default
branch to fall into). Adding a type is one entry here plus, for a new rule,
its member and its kernel in each engine (the numba engine's branch in
``engine/field.py``, or ``engine/energy.py`` and ``engine/entropy.py`` for a new energy or entropy; the
JAX engine's table entry in ``jaxengine/``). Masks are declared the same way:
each names its ``MaskRule``, refused by an engine without its kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from enum import IntEnum

from .registry import Registry


class Weights(IntEnum):
    """Weight rules of the compiled field (``engine.field.attention_weights``)."""

    SOFTMAX = 0  # softmax_j(beta s_ij), stabilised by the row maximum
    EXP = 1  # exp(beta s_ij), unnormalised
    RELU = 2  # max(beta s_ij, 0) / n
    SIGMOID = 3  # sigma(beta s_ij - log n)


class Energy(IntEnum):
    """Per-head energies the observables implement (``engine.measure``)."""

    EXP = 0  # E_h = sum_ij exp(beta s_ij) / (2 beta n^2): the paper's (Thm 11)
    SOFTPLUS = 1  # E_h = sum_ij softplus(beta s_ij - log n) / (2 beta n): sigmoid's (result 8)


class Entropy(IntEnum):
    """Distributions whose entropy the observables measure (``engine.measure``)."""

    SOFTMAX = 0  # p_ij = softmax_j(beta s_ij) (Thm 27)
    SIGMOID = 1  # p_ij = w_ij / sum_k w_ik, w = sigma(beta s - log n): the weights, row-normalised


def _logarithmic(scale: float) -> float:
    # Normalised weights keep the velocity bounded whatever beta: measured 21 steps at
    # s = 0.25, 35-49 at s = 8, 30 at s = 435 for trained heads.
    return 1.0 + math.log1p(scale)


def _exponential(scale: float) -> float:
    # Unnormalised exponentials grow like e^s: measured 12,000-44,000 steps at s = 8, and
    # 18,500 at s = 6 over t_max = 40 (the variants grid), which e^s / 10 underestimated.
    return max(1.0 + scale, math.exp(min(scale, 50.0)) / 5.0)


def _linear(scale: float) -> float:
    # Weights bounded by 1 but not normalised: a row's sum grows from ~1 at uniformity
    # to n in a cluster, and the field with it; an upper estimate like usa's at small s.
    return 1.0 + scale


@dataclasses.dataclass(frozen=True)
class AttentionType:
    name: str
    weights: Weights
    normalised: bool  # head output rows divided by the row sums of the weights
    velocity_over_n: bool  # v_i = (1/n) sum_h f^h_i instead of sum_h f^h_i
    energy: Energy  # the energy E_h the observables record
    gradient_flow: bool  # with V_h = M_h symmetric and no mask: dE/dt = (1/n) sum_i ||dx_i/dt||^2
    entropy: Entropy  # whose entropy the ``entropy`` group records
    stiffness: Callable[[float], float]  # relative step count against s = beta ||M_h|| (cost model)
    formula: str  # the weights w^h_ij, as in docs/model.md
    description: str
    # The field is smooth in the tokens. Not so (relu's kink where a score changes sign), a step across
    # the kink has an error its embedded estimate understates, and the error stops following the
    # tolerance: the accuracy certificate then compares with a tighter run (certificate.certify_seeds).
    smooth: bool

    @property
    def velocity(self) -> str:
        return "(1/n) sum_h f^h_i" if self.velocity_over_n else "sum_h f^h_i"


ATTENTIONS: Registry[AttentionType] = Registry("attention", [
    AttentionType(
        "softmax", Weights.SOFTMAX, True, False, Energy.EXP, False, Entropy.SOFTMAX, _logarithmic,
        "softmax_j(beta s^h_ij)",
        "normalised attention; the paper's quantitative results (Thm 19, 22, 25, 27)", smooth=True,
    ),
    AttentionType(
        "usa", Weights.EXP, False, True, Energy.EXP, True, Entropy.SOFTMAX, _exponential,
        "exp(beta s^h_ij)",
        "unnormalised attention, the paper's gradient-flow framework (Thm 11, 16-17, 39)", smooth=True,
    ),
    AttentionType(
        "relu", Weights.RELU, False, False, Energy.EXP, False, Entropy.SOFTMAX, _logarithmic,
        "max(beta s^h_ij, 0) / n",
        "ReLU attention: no drive between orthogonal tokens (Thm 25)", smooth=False,
    ),
    AttentionType(
        "sigmoid", Weights.SIGMOID, False, False, Energy.SOFTPLUS, True, Entropy.SIGMOID, _linear,
        "sigma(beta s^h_ij - log n)",
        "sigmoid attention with the bias -log n (Ramapuram et al. 2024): a gradient flow of the softplus "
        "energy (result 8); entropy of the row-normalised weights", smooth=True,
    ),
])


class MaskRule(IntEnum):
    """Mask rules of the compiled field and observables (``engine.field.attended``, ``_mask_rows``)."""

    NONE = 0  # every token attends to every token
    CAUSAL = 1  # token i attends to tokens j <= i only


@dataclasses.dataclass(frozen=True)
class Mask:
    name: str
    rule: MaskRule  # which pairs the engine keeps; a rule without its compiled branch is refused
    description: str

    @property
    def masked(self) -> bool:
        """Whether some pairs are left out (every rule but ``NONE``): then no gradient flow (result 9)."""
        return self.rule != MaskRule.NONE


MASKS: Registry[Mask] = Registry("mask", [
    Mask("none", MaskRule.NONE, "every token attends to every token"),
    Mask("causal", MaskRule.CAUSAL, "token i attends to tokens j <= i only (softmax normalises over j <= i); "
         "not a gradient flow (docs/model.md, result 9)"),
])
