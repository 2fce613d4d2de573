"""``simulate(cell)``: integrate every seed of a cell as one batch and measure it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import xarray as xr

from .attention import ATTENTIONS
from .cell import MAX_EXPONENT, Cell
from .certificate import certify_seeds
from .contract import Controller, Heads, Problem
from .engines import engine_for, integrate
from .geometry import GEOMETRIES
from .heads import Form, head_matrices
from .metadata import COORDINATES
from .numerics import ENGINE_NUMERICS
from .observables import CLUSTER_METRICS, variables
from .resources import oversized
from .seed_failures import SeedFailure, failure_summary, seed_failures
from .tokens import initial_tokens, unit_rows
from .units import FLOW_TIME, TIME_UNITS
from .version import __version__

# Explicit tokens this close to the sphere are round-off and get normalised.
_SPHERE_TOLERANCE = 1e-8
_SYMMETRY_TOLERANCE = 1e-12


# The store attr ``values_source`` of value alignment V_h = M_h (the config's ``values: aligned``):
# the spelling stores have always carried, kept so stores stay alike; the one place `scores`
# names the score matrices (docs/model.md, "Names").
_ALIGNED_VALUES_SOURCE = "scores"


# What a store keeps of the score matrices, by form: (variable, its trailing dims, attrs), or None where the
# store keeps none (factored: trained heads are not copied into every store; the attrs name the weights
# file and its digest).
_STORED_HEADS = {
    Form.DENSE: ("score_matrix", ("dim", "dim_col"),
                 {"units": "1", "long_name": "score matrix", "description": "score matrix M_h used"}),
    Form.DIAGONAL: ("score_diagonal", ("dim",),
                    {"units": "1", "long_name": "score matrix diagonal",
                     "description": "diagonal of the (diagonal) score matrix M_h used"}),
    Form.FACTORED: None,
}


class SimulationError(RuntimeError):
    """A cell's simulation produced no trustworthy result; the message names the cell."""


def simulate(
    cell: Cell,
    *,
    x0: np.ndarray | None = None,
    score_matrices: np.ndarray | None = None,
    value_matrices: np.ndarray | None = None,
    certify: bool = True,
) -> xr.Dataset:
    """Integrate all seeds of ``cell`` as one batch and record its observable groups.

    Parameters
    ----------
    cell : Cell
        The grid cell; its declarations give tokens and heads per seed, and
        ``cell.observables`` the groups to record (``attnflow.observables``).
    x0 : ndarray, optional
        Initial tokens, ``(n, d)`` (shared by all seeds) or ``(seeds, n, d)``,
        replacing the cell's ``init``. On the sphere each row must have unit
        norm to ``1e-8`` (then it is normalised exactly) or ``ValueError``; where the geometry
        carries radii the rows are ``r_k theta_k`` (any norm but 0).
    score_matrices : ndarray, optional
        ``(H, d, d)`` symmetric score matrices ``M_h`` replacing the cell's head structure (``heads``).
    value_matrices : ndarray, optional
        ``(H, d, d)`` ``V_h``; default ``V_h = M_h`` (value alignment).
    certify : bool
        Record the accuracy certificate (default): every seed integrated a second time, at a looser
        tolerance for a smooth field and a tighter one for relu or where the steps did not follow the
        tolerance, its steps capped where stability sizes them; see ``certificate_error``.

    Returns
    -------
    xarray.Dataset
        Dims ``seed, time, head, token`` (and ``dim``, ``dim_col``); the
        variables of the recorded groups; per seed
        ``t_cluster`` (the first time the clustering criterion holds, located
        on the integrator's dense output), ``censored``, ``norm_drift`` and the
        solver's step counts. The attrs hold every cell field and the package
        version. The accuracy certificate (``certificate.certify_seeds``; docs/model.md,
        "Numerics"): per seed ``certificate_error``, a bound on the largest error of its
        recorded float variables (and ``t_cluster``), each relative to that variable's largest
        |value| in the seed, from companion runs at other tolerances, NaN where no companion
        could bound it (``certificate_flag`` says how or why not); in the attrs the worst seed's
        (``certificate_error``, ``certificate_seed``, ``certificate_variable``; NaN when one is
        uncertified, counted in ``certificate_uncertified``), the companions' route, tolerances
        and cost in field evaluations (``certificate_rhs_calls``). Every variable and
        coordinate has ``units`` (CF; ``"1"``: every quantity is dimensionless, time
        included), ``long_name`` and ``description`` attrs (``attnflow.metadata``).
    """
    if not isinstance(cell, Cell):
        raise TypeError(f"simulate expects a Cell, got {type(cell).__name__}")
    if not isinstance(certify, (bool, np.bool_)):
        raise TypeError(f"simulate: certify = {certify!r}: must be True or False")
    too_large = oversized(cell)
    if too_large:
        raise ValueError(f"{describe(cell)}: {too_large}")
    heads = _heads(cell, score_matrices, value_matrices)
    x_init = initial_tokens(cell, cell.seeds) if x0 is None else _check_x0(cell, x0)
    times = cell.sample_times()
    # The heads in the form's field of ``Heads`` (``Form.array``).
    problem = Problem(x_init, Heads(**{heads.form.array: heads.stacked}, values=heads.values), cell.attention,
                      cell.beta, cell.geometry, cell.mask, cell.ngpt_alpha)
    result = integrate(cell, problem, times, Controller(cell.rtol, cell.atol, cell.max_steps), strict=False)
    failure, t_failed, reasons = seed_failures(cell, result, times)
    failed = failure != SeedFailure.OK
    # A failed seed has nothing to certify: the certificate covers the seeds that succeeded.
    certificate, certificate_per_seed = ({}, {}) if not certify else \
        certify_seeds(cell, result, problem, times, skip=failed)
    if failed.all():  # nothing to certify: the cell carries no certificate (its per-seed one is NaN)
        certificate = {}
    data_vars = {**_run_variables(cell, result, failure, t_failed), **certificate_per_seed,
                 **_head_variables(cell, heads)}
    sources = {"x0_source": "cell" if x0 is None else "explicit",
               "heads_source": "cell" if score_matrices is None else "explicit",
               "values_source": _values_source(cell, heads, value_matrices)}
    attrs = {**_cell_attrs(cell), **sources, **_solver_attrs(cell, result), **certificate,
             # Per failed seed, its error in words; "" where none failed (the pack keeps what cells share
             # once).
             "n_seeds_failed": int(failed.sum()), "seed_failures": failure_summary(cell, failure, reasons)}
    return xr.Dataset(data_vars, coords=_coordinates(cell, times), attrs=attrs)


def _values_source(cell, heads, value_matrices) -> str:
    if value_matrices is not None:
        return "explicit"
    if cell.values == "identity":
        return cell.values
    return "heads" if heads.values is not None else _ALIGNED_VALUES_SOURCE


def _coordinates(cell, times) -> dict:
    return {name: (name, values, COORDINATES[name].attrs()) for name, values in (
        ("seed", np.array(cell.seeds, dtype=np.int64)), ("time", times), ("head", np.arange(cell.H)),
        ("token", np.arange(cell.n)))}


class _CellHeads(NamedTuple):
    """A cell's heads as the engines take them and as the store keeps them."""

    form: Form
    stacked: object  # (seeds or 1, H, ...) in the form's array; the factored form a pair (U, e)
    values: np.ndarray | None  # (seeds or 1, H, d, d) V_h, or None for value alignment
    lambdas: np.ndarray  # (seeds, H) head strengths
    discarded: np.ndarray | None  # per head, the antisymmetric share of trained heads


def _heads(cell, score_matrices, value_matrices) -> _CellHeads:
    n_seeds, d, H = cell.n_seeds, cell.d, cell.H
    values = discarded = None
    if score_matrices is None:
        # Score matrices that do not depend on the seed are built once and shared by the batch.
        built = head_matrices(cell, cell.seeds if cell.heads_per_seed else cell.seeds[:1])
        lambdas = np.broadcast_to(built.strengths, (n_seeds, H))
        form = built.form
        stacked = getattr(built, form.array)
        values, discarded = built.values, built.antisymmetric_share
    else:
        form, stacked = Form.DENSE, _check_score_matrices(cell, score_matrices)[None]
        lambdas = np.broadcast_to(np.linalg.norm(stacked, ord=2, axis=(-2, -1)), (n_seeds, H))
    if value_matrices is not None:
        values = _check_matrices("value_matrices", value_matrices, (H, d, d))[None]
    return _CellHeads(form, stacked, values, lambdas, discarded)


def _run_variables(cell, result, failure, t_failed) -> dict:
    """The store's variables of the run: the recorded groups over time, and per seed its clustering time,
    failure, drift and step counts."""
    failed = failure != SeedFailure.OK
    attention = ATTENTIONS.get(cell.attention)
    data_vars = {var.name: (("seed", "time") + var.dims, result.variables[var.name], var.attrs(attention))
                 for var in variables(cell.observables)}
    criterion = CLUSTER_METRICS.get(cell.cluster_metric).text(cell.cluster_threshold)
    data_vars["t_cluster"] = ("seed", result.t_cluster, {
        "units": TIME_UNITS, "long_name": "clustering time",
        "description": f"first time {criterion} holds, in {FLOW_TIME}, located by bisection on the "
                       "integrator's dense output; NaN when censored",
    })
    data_vars["censored"] = ("seed", np.isnan(result.t_cluster) & ~failed, {  # a flag: CF gives it no units
        "long_name": "not clustered by t_max",
        "description": f"{criterion} never held up to t_max (False for a failed seed)",
    })
    data_vars["failed"] = ("seed", failed, {
        "long_name": "run failed",
        "description": "the seed's run failed (see failure, t_failed): its samples from t_failed on are NaN "
                       "and the reductions leave the seed out"})
    data_vars["failure"] = ("seed", failure.astype(np.int8), {
        "units": "1", "long_name": "failure kind", "description": "why the seed's run failed (0: it did not)",
        "flag_values": [f.value for f in SeedFailure],
        "flag_meanings": " ".join(f.name.lower() for f in SeedFailure)})
    data_vars["t_failed"] = ("seed", t_failed, {
        "units": TIME_UNITS, "long_name": "failure time",
        "description": f"time at which the seed's run failed, in {FLOW_TIME}; NaN where it did not"})
    if cell.stop_at_cluster:
        data_vars["t_stop"] = ("seed", result.t_stop, {
            "units": TIME_UNITS, "long_name": "stopping time",
            "description": f"where the run stopped (t_cluster, or t_max if censored), in {FLOW_TIME}; "
                           "samples after it are NaN (cluster counts -1)"})
    name, attrs = norm_variable(GEOMETRIES.get(cell.geometry).on_sphere)
    data_vars[name] = ("seed", result.norm_drift, attrs)
    data_vars["n_steps"] = ("seed", result.n_steps, {"units": "1", "long_name": "accepted steps",
                                                     "description": "steps the integrator accepted"})
    data_vars["n_rejected"] = ("seed", result.n_rejected, {"units": "1", "long_name": "rejected steps",
                                                           "description": "steps the integrator rejected"})
    return data_vars


def _head_variables(cell, heads: _CellHeads) -> dict:
    """The store's variables of the heads: their strengths, and the matrices where the store keeps them."""
    data_vars = {"lam": (("seed", "head"), heads.lambdas, {
        "units": "1", "long_name": "head strength",
        "description": "head strength lambda_h (operator norm for explicit heads)",
    })}
    # The score matrices themselves: per seed where they are drawn, once where they are not.
    stored_heads = _STORED_HEADS[heads.form]
    if stored_heads is not None:
        name, trailing, attrs = stored_heads
        data_vars[name] = (*_per_head(heads.stacked, trailing), attrs)
    if heads.discarded is not None:
        data_vars["antisymmetric_share"] = ("head", heads.discarded, {
            "units": "1", "long_name": "discarded antisymmetric share",
            "description": "||antisym(M_h)||_F / ||M_h||_F of the trained W_Q^T W_K, discarded"})
    if heads.values is not None and not cell.weights:
        # By its own leading axis: explicit values are shared even where the heads are drawn per seed.
        data_vars["value_matrix"] = (*_per_head(heads.values, ("dim", "dim_col")),
                                     {"units": "1", "long_name": "value matrix",
                                      "description": "value matrix V_h used"})
    return data_vars


def _cell_attrs(cell) -> dict:
    """Every cell field as an attr (``cell_<field>``), and the trained weights' file and digest."""
    attrs = {f"cell_{k}": v for k, v in cell.to_dict().items()}
    if cell.weights:
        from .trained import digest, resolve

        attrs.update({"weights_file": str(resolve(cell.weights)), "weights_sha256": digest(cell.weights)})
    return attrs


def _solver_attrs(cell, result) -> dict:
    """What integrated the cell: the package, the engine and its numerics, the solver's counts."""
    return {
        "attnflow_version": __version__,
        "solver": "Dormand-Prince 5(4), per-trajectory error control, retraction onto the sphere",
        "engine": engine_for(cell),  # the engine that ran: numba or jax (Cell.engine may say auto)
        "engine_numerics": ENGINE_NUMERICS[engine_for(cell)],  # that engine's own numerics version
        "solver_heads_form": result.form,
        "solver_rhs_calls": int(result.n_rhs_calls.sum()),
        "solver_max_retraction": float(result.max_retraction.max()),
    }


def norm_variable(on_sphere: bool) -> tuple[str, dict]:
    """The name and attributes under which a cell stores max_t,i | ||x_i|| - 1 |. On the sphere it is the
    integrator's drift off it (round-off); where the geometry moves the norms (flat space, the radii of
    pre_ln and peri_ln) the same number is dynamics, under a name of its own."""
    if on_sphere:
        return "norm_drift", {"units": "1", "long_name": "norm drift",
                              "description": "max_t,i | ||x_i|| - 1 | over the samples: the integrator's "
                                             "drift off the sphere"}
    return "norm_change", {"units": "1", "long_name": "largest change of a token's norm",
                           "description": "max_t,i | ||x_i|| - 1 | over the samples: off the sphere (flat, "
                                          "pre_ln, peri_ln) the flow moves the norms from 1 (no drift)"}


def _per_head(array, trailing):
    """Dims and data of a stored (seeds or 1, H, ...) array: per seed, or once where the seeds share it."""
    if array.shape[0] > 1:
        return ("seed", "head") + trailing, array
    return ("head",) + trailing, array[0]


def describe(cell: Cell) -> str:
    """A one-line identification of a cell for error messages."""
    keys = ("H", "n", "d", "beta", "attention", "mask", "heads", "lambda_dist", "init", "geometry")
    return "cell(" + ", ".join(f"{k}={getattr(cell, k)!r}" for k in keys) + f", seeds={list(cell.seeds)})"


def _as_real(name, a):
    try:
        a = np.asarray(a)
    except ValueError as err:  # a ragged nesting of lists
        raise ValueError(f"{name}: not an array of one shape ({err})") from None
    if np.iscomplexobj(a):
        raise ValueError(f"{name}: complex entries; the model is real")
    if not np.issubdtype(a.dtype, np.number) or a.dtype == bool:
        raise ValueError(f"{name}: dtype {a.dtype} is not a real number type")
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains non-finite entries")
    return a


def _check_matrices(name, a, shape):
    a = _as_real(name, a)
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape} does not match (H, d, d) = {shape}")
    return a


def _check_score_matrices(cell, m):
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
    x0 = _as_real("x0", x0)
    if x0.shape == (cell.n, cell.d):
        x0 = np.broadcast_to(x0, (cell.n_seeds, cell.n, cell.d))
    if x0.shape != (cell.n_seeds, cell.n, cell.d):
        raise ValueError(f"x0: shape {x0.shape}, expected (n, d) = {(cell.n, cell.d)} "
                         f"or (seeds, n, d) = {(cell.n_seeds, cell.n, cell.d)}")
    x0 = np.array(x0)
    geometry = GEOMETRIES.get(cell.geometry)
    if geometry.radii and np.any(np.linalg.norm(x0, axis=-1) == 0.0):
        raise ValueError(f"x0: a token of norm 0 has no direction (geometry {cell.geometry}: "
                         "x_k = r_k theta_k)")
    if geometry.on_sphere:
        off = np.max(np.abs(np.linalg.norm(x0, axis=-1) - 1.0))
        if off > _SPHERE_TOLERANCE:
            raise ValueError(f"x0: tokens are not on the unit sphere (max | ||x_i|| - 1 | = {off:.3g})")
        x0 = unit_rows(x0)
    return x0
