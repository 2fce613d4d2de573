"""The JAX engine's kernel of every declaration, one table per kind (``attnflow.contract``), keyed by the
declared values and checked against the declarations when first imported (before any batch runs)."""

from __future__ import annotations

from ..contract import check_engine
from .field import KEPT, MOTIONS, ROWS, WEIGHTS
from .measure import ENERGIES, ENTROPIES, GROUP_KERNELS, METRIC_GAPS

KERNELS = {"weight rule": WEIGHTS, "energy rule": ENERGIES, "entropy rule": ENTROPIES, "mask rule": KEPT,
           "motion rule": MOTIONS, "head form": ROWS, "clustering metric": METRIC_GAPS,
           "observable group": GROUP_KERNELS}

check_engine("jax", KERNELS)
