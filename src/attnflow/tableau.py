"""Explicit Runge-Kutta tableaus with an embedded error estimate and a dense output.

A tableau checks its own consistency on construction: the rows of ``a`` sum to
``c``, the weights sum to 1, the error weights to 0, ``a`` is strictly lower
triangular, the first-same-as-last property holds where claimed, and the dense
output interpolates the step's end.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ButcherTableau:
    """``s``-stage explicit method; stage ``s-1`` is evaluated at the step's end (FSAL).

    a : (s, s) strictly lower triangular stage coefficients
    b : (s,) weights of the propagated solution
    c : (s,) stage times
    e : (s,) error weights, ``b - b_hat`` of the embedded method
    dense : (s, degree) coefficients: the interpolant at ``t + sigma h`` is
        ``y + h sum_j K_j sum_k dense[j, k] sigma^(k+1)``
    order, error_order : of the propagated and the embedded solution
    """

    name: str
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    e: np.ndarray
    dense: np.ndarray
    order: int
    error_order: int
    fsal: bool = True

    def __post_init__(self):
        s = self.b.size
        for name, arr, shape in (("a", self.a, (s, s)), ("c", self.c, (s,)), ("e", self.e, (s,))):
            if arr.shape != shape:
                raise ValueError(f"{self.name}: {name} has shape {arr.shape}, expected {shape}")
        if self.dense.shape[0] != s:
            raise ValueError(f"{self.name}: dense has {self.dense.shape[0]} rows for {s} stages")
        # Exact rationals in floating point: the sums agree to a few ulps.
        tol = 1e-14
        if np.any(np.triu(self.a) != 0):
            raise ValueError(f"{self.name}: a is not strictly lower triangular (not explicit)")
        if np.max(np.abs(self.a.sum(axis=1) - self.c)) > tol:
            raise ValueError(f"{self.name}: rows of a do not sum to c")
        if abs(self.b.sum() - 1.0) > tol:
            raise ValueError(f"{self.name}: weights b sum to {self.b.sum()!r}, not 1")
        if abs(self.e.sum()) > tol:
            raise ValueError(f"{self.name}: error weights e sum to {self.e.sum()!r}, not 0")
        if self.fsal and (np.max(np.abs(self.a[-1] - self.b)) > tol or self.c[-1] != 1.0):
            raise ValueError(f"{self.name}: the last stage is not the step's end (FSAL)")
        if np.max(np.abs(self.dense.sum(axis=1) - self.b)) > tol:
            raise ValueError(f"{self.name}: the dense output does not reach y_new at sigma = 1")


# Dormand & Prince (1980), with Shampine's (1986) quartic dense output, as in
# scipy's RK45 and diffrax's Dopri5.
DOPRI5 = ButcherTableau(
    name="Dormand-Prince 5(4)",
    a=np.array([
        [0, 0, 0, 0, 0, 0, 0],
        [1 / 5, 0, 0, 0, 0, 0, 0],
        [3 / 40, 9 / 40, 0, 0, 0, 0, 0],
        [44 / 45, -56 / 15, 32 / 9, 0, 0, 0, 0],
        [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0, 0, 0],
        [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0, 0],
        [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0],
    ]),
    b=np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0]),
    c=np.array([0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0]),
    e=np.array([-71 / 57600, 0.0, 71 / 16695, -71 / 1920, 17253 / 339200, -22 / 525, 1 / 40]),
    dense=np.array([
        [1, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432],
        [0, 0, 0, 0],
        [0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799],
        [0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072],
        [0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632],
        [0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844],
        [0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
    ]),
    order=5,
    error_order=4,
)
