"""``simulate(cell)``: integrate every seed of a cell as one batch and measure it."""

from __future__ import annotations

import numpy as np
import xarray as xr
from threadpoolctl import threadpool_limits

from . import __version__, generators
from .cell import MAX_EXPONENT, Cell
from .integrate import BatchedField, IntegrationError, integrate
from .kernels import ATTENTION_CODES, Workspace, normalise_rows_inplace, velocity
from .observables import first_crossing, trajectory_observables

# Explicit tokens this close to the sphere are round-off and get normalised.
_SPHERE_TOLERANCE = 1e-8
_SYMMETRY_TOLERANCE = 1e-12


class SimulationError(RuntimeError):
    """A cell's simulation produced no trustworthy result; the message names the cell."""


class AttentionField(BatchedField):
    """The attention flow of MODEL.md for a batch of trajectories (compiled kernel)."""

    def __init__(self, scores, values_t, beta, attention, spherical):
        self.scores = np.ascontiguousarray(scores)
        self.shared_values = values_t is None
        self.values_t = self.scores if values_t is None else np.ascontiguousarray(values_t)
        self.beta = float(beta)
        self.attention = ATTENTION_CODES[attention]
        self.spherical = bool(spherical)
        self.workspace = Workspace()

    def __call__(self, y):
        out = np.empty_like(y)
        return velocity(
            np.ascontiguousarray(y), self.scores, self.values_t, self.shared_values,
            self.beta, self.attention, self.spherical, out, self.workspace,
        )

    def restrict(self, indices):
        self.scores = np.ascontiguousarray(self.scores[indices])
        self.values_t = (
            self.scores if self.shared_values else np.ascontiguousarray(self.values_t[indices])
        )


_VARIABLES = {
    "energy": (("head",), "1", "per-head energy E_h = sum_ij exp(beta s^h_ij) / (2 beta n^2)"),
    "energy_rate": (("head",), "1/time", "exact dE_h/dt = (1/n^2) sum_i <dx_i/dt, g^h_i>"),
    "kinetic": ((), "1/time^2", "(1/n) sum_i ||dx_i/dt||^2"),
    "radial_shadow": (("head", "token"), "1", "a^h_i = <f^h_i, x_i>"),
    "tangential_power": (("head", "token"), "1", "T^h_i = ||P_{x_i} f^h_i||^2"),
    "rd_margin": (
        ("head", "token"), "1", "Radial Dominance margin T^h_i - a^h_i sum_{h'!=h} a^h'_i",
    ),
    "rd_margin_sufficient": (
        ("head", "token"), "1",
        "sufficient margin T^h_i - (H-1) |a^h_i| max_{h'!=h} ||f^h'_i||",
    ),
    "entropy": (("head", "token"), "nat", "attention entropy of softmax_j(beta s^h_ij)"),
    "entropy_rate": (
        ("head", "token"), "nat/time", "Thm 27: -beta^2 Cov_p(s_ij, ds_ij/dt), exact",
    ),
    "gamma_mean": ((), "1", "mean pairwise cosine <x_i, x_j>, i < j"),
    "gamma_mean_rate": ((), "1/time", "exact d gamma_mean / dt from the velocities"),
    "gamma_min": ((), "1", "minimum pairwise cosine <x_i, x_j>, i < j"),
}


def simulate(
    cell: Cell,
    *,
    x0: np.ndarray | None = None,
    score_matrices: np.ndarray | None = None,
    value_matrices: np.ndarray | None = None,
) -> xr.Dataset:
    """Integrate all seeds of ``cell`` as one batch and measure every observable.

    Parameters
    ----------
    cell : Cell
        The grid cell; its generators give tokens and heads per seed.
    x0 : ndarray, optional
        Initial tokens, ``(n, d)`` (shared by all seeds) or ``(seeds, n, d)``,
        replacing the cell's ``init``. On the sphere each row must have unit
        norm to ``1e-8`` (then it is normalised exactly) or ``ValueError``.
    score_matrices : ndarray, optional
        ``(H, d, d)`` symmetric ``M_h`` replacing the cell's ``heads``.
    value_matrices : ndarray, optional
        ``(H, d, d)`` ``V_h``; default ``V_h = M_h`` (value alignment).

    Returns
    -------
    xarray.Dataset
        Dims ``seed, time, head, token`` (and ``dim``, ``dim_col``); the
        observables of MODEL.md with ``units`` and ``description`` attrs; per
        seed ``t_cluster``, ``censored``, ``norm_drift`` and solver counts.
        The dataset attrs hold every cell field and the package version.
    """
    if not isinstance(cell, Cell):
        raise TypeError(f"simulate expects a Cell, got {type(cell).__name__}")
    n_seeds, n, d, H = cell.n_seeds, cell.n, cell.d, cell.H
    spherical = cell.geometry == "sphere"

    lambdas = np.stack([generators.head_strengths(cell, s) for s in cell.seeds])
    if score_matrices is None:
        scores = np.stack([generators.score_matrices(cell, lam, s)
                           for lam, s in zip(lambdas, cell.seeds, strict=True)])
    else:
        scores = np.broadcast_to(_check_scores(cell, score_matrices), (n_seeds, H, d, d)).copy()
        lambdas = np.linalg.norm(scores, ord=2, axis=(-2, -1))
    values_t = None
    if value_matrices is not None:
        values = _check_matrices("value_matrices", value_matrices, (H, d, d))
        values_t = np.broadcast_to(np.swapaxes(values, -1, -2), (n_seeds, H, d, d)).copy()
    if x0 is None:
        x_init = np.stack([generators.initial_tokens(cell, s) for s in cell.seeds])
    else:
        x_init = _check_x0(cell, x0)

    times = np.linspace(0.0, cell.t_max, cell.n_samples)
    field = AttentionField(scores, values_t, cell.beta, cell.attention, spherical)
    with threadpool_limits(limits=1):
        try:
            xs, stats = integrate(
                field, x_init, times, rtol=cell.rtol, atol=cell.atol,
                max_steps=cell.max_steps, unit_rows=spherical,
            )
        except IntegrationError as err:
            raise SimulationError(f"{describe(cell)}: {err}") from err
        obs = trajectory_observables(
            xs, scores, scores if values_t is None else values_t, cell.beta,
            cell.attention, spherical,
        )
    # Largest | ||x_i|| - 1 | per seed: stored, and checked on the sphere.
    norm_drift = np.max(np.abs(np.linalg.norm(xs, axis=-1) - 1.0), axis=(1, 2))
    _check_finite(cell, xs, obs, norm_drift if spherical else None)

    if cell.cluster_metric == "epsilon":
        t_cluster, censored = first_crossing(times, 1.0 - obs["gamma_min"], cell.cluster_threshold, True)
    else:
        t_cluster, censored = first_crossing(times, obs["gamma_mean"], cell.cluster_threshold, False)

    data_vars = {}
    for name, (extra, units, description) in _VARIABLES.items():
        data_vars[name] = (("seed", "time") + extra, obs[name], {"units": units, "description": description})
    data_vars["t_cluster"] = ("seed", t_cluster, {
        "units": "time",
        "description": f"first time {cell.cluster_metric} crosses {cell.cluster_threshold:g} "
        "(linear interpolation between samples); NaN when censored",
    })
    data_vars["censored"] = ("seed", censored, {
        "units": "1", "description": "the clustering criterion was not met by t_max",
    })
    data_vars["norm_drift"] = ("seed", norm_drift, {
        "units": "1", "description": "max_t,i | ||x_i|| - 1 | over the samples",
    })
    data_vars["n_steps"] = ("seed", stats.n_steps, {"units": "1", "description": "accepted steps"})
    data_vars["n_rejected"] = ("seed", stats.n_rejected, {"units": "1", "description": "rejected steps"})
    data_vars["lam"] = (("seed", "head"), lambdas, {
        "units": "1", "description": "head strength lambda_h (operator norm for explicit heads)",
    })
    data_vars["score_matrix"] = (("seed", "head", "dim", "dim_col"), scores, {
        "units": "1", "description": "score matrix M_h used",
    })
    if values_t is not None:
        data_vars["value_matrix"] = (("seed", "head", "dim", "dim_col"),
                                     np.swapaxes(values_t, -1, -2),
                                     {"units": "1", "description": "value matrix V_h used"})
    if cell.save_positions:
        data_vars["x"] = (("seed", "time", "token", "dim"), xs, {
            "units": "1", "description": "token positions",
        })

    attrs = {f"cell_{k}": v for k, v in cell.to_dict().items()}
    attrs.update({
        "attnflow_version": __version__,
        "x0_source": "cell" if x0 is None else "explicit",
        "heads_source": "cell" if score_matrices is None else "explicit",
        "values_source": "scores" if value_matrices is None else "explicit",
        "solver": "batched Dormand-Prince 5(4), per-trajectory error control, retraction",
        "solver_rhs_calls": int(stats.n_rhs_calls),
        "solver_max_retraction": float(stats.max_retraction),
    })
    coords = {
        "seed": np.array(cell.seeds, dtype=np.int64),
        "time": ("time", times, {"units": "time"}),
        "head": np.arange(H),
        "token": np.arange(n),
    }
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def describe(cell: Cell) -> str:
    """A one-line identification of a cell for error messages."""
    keys = ("H", "n", "d", "beta", "attention", "heads", "lambda_dist", "init", "geometry")
    return "cell(" + ", ".join(f"{k}={getattr(cell, k)!r}" for k in keys) + f", seeds={list(cell.seeds)})"


def _check_matrices(name, a, shape):
    a = np.asarray(a, dtype=float)
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape} does not match (H, d, d) = {shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite entries")
    return a


def _check_scores(cell, m):
    m = _check_matrices("score_matrices", m, (cell.H, cell.d, cell.d))
    asym = np.max(np.abs(m - np.swapaxes(m, -1, -2)))
    if asym > _SYMMETRY_TOLERANCE * max(1.0, np.max(np.abs(m))):
        raise ValueError(f"score_matrices: not symmetric (max |M - M^T| = {asym:.3g}); "
                         "the gradient-flow structure needs symmetric M_h")
    worst = cell.beta * np.max(np.linalg.norm(m, ord=2, axis=(-2, -1)))
    if worst > MAX_EXPONENT:
        raise ValueError(f"score_matrices: beta * max ||M_h|| = {worst:.4g} exceeds "
                         f"{MAX_EXPONENT:g}; exp(beta s) would overflow float64")
    return m


def _check_x0(cell, x0):
    x0 = np.asarray(x0, dtype=float)
    if x0.shape == (cell.n, cell.d):
        x0 = np.broadcast_to(x0, (cell.n_seeds, cell.n, cell.d))
    if x0.shape != (cell.n_seeds, cell.n, cell.d):
        raise ValueError(f"x0: shape {x0.shape}, expected (n, d) = {(cell.n, cell.d)} "
                         f"or (seeds, n, d) = {(cell.n_seeds, cell.n, cell.d)}")
    if not np.all(np.isfinite(x0)):
        raise ValueError("x0: contains non-finite entries")
    x0 = x0.copy()
    if cell.geometry == "sphere":
        off = np.max(np.abs(np.linalg.norm(x0, axis=-1) - 1.0))
        if off > _SPHERE_TOLERANCE:
            raise ValueError(f"x0: tokens are not on the unit sphere (max | ||x_i|| - 1 | = {off:.3g})")
        normalise_rows_inplace(x0)
    return x0


def _check_finite(cell, xs, obs, sphere_drift):
    bad = [k for k, v in obs.items() if not np.all(np.isfinite(v))]
    if not np.all(np.isfinite(xs)):
        bad.insert(0, "x")
    if bad:
        raise SimulationError(f"{describe(cell)}: non-finite values in {', '.join(bad)}")
    if sphere_drift is not None:
        drift = float(np.max(sphere_drift))
        if drift > 1e-10:
            raise SimulationError(f"{describe(cell)}: tokens left the sphere (drift {drift:.3g})")
