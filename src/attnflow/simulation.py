"""``simulate(cell)``: integrate every seed of a cell as one batch and measure it."""

from __future__ import annotations

import numpy as np
import xarray as xr

from . import __version__
from .attention import ATTENTIONS
from .cell import INT64_MAX, MAX_EXPONENT, MIN_RTOL, Cell
from .engine import IntegrationError, criterion_text
from .engines import engine_for, solver_for
from .heads import Form, head_matrices
from .observables import variables
from .resources import oversized
from .tokens import initial_tokens, unit_rows

# Explicit tokens this close to the sphere are round-off and get normalised.
_SPHERE_TOLERANCE = 1e-8
_SYMMETRY_TOLERANCE = 1e-12
# Largest | ||x_i|| - 1 | accepted on the sphere: the retraction keeps it at round-off.
_MAX_SPHERE_DRIFT = 1e-10


# Accuracy certificate (docs/model.md, "Numerics"): the first CERTIFICATE_SEEDS seeds
# are integrated again at rtol / CERTIFICATE_FACTOR (floored at MIN_RTOL) and atol / CERTIFICATE_FACTOR.
CERTIFICATE_SEEDS = 2
CERTIFICATE_FACTOR = 100.0
# The certificate is this times the measured deviation: the tighter run has an error of its own,
# ideally ~100^(5/6) ~ 50x smaller, but near round-off or where the step is limited by stability
# rather than accuracy it is not (measured up to 5% of the deviation), so the bare deviation could
# understate the cell's error by that much; the factor covers a tighter-run error of up to half.
CERTIFICATE_SAFETY = 2.0
# A variable's scale is max |value| over the certified seeds' recorded samples (tighter run), floored
# here, so a variable that is zero throughout (up to round-off) does not divide by zero.
CERTIFICATE_SCALE_FLOOR = 1e-12
# Steps the tighter run may take, relative to the cell's budget (DOPRI5 needs ~100^(1/5) = 2.5x).
_CERTIFICATE_STEP_FACTOR = 4
# The store attr ``values_source`` of value alignment V_h = M_h (the config's ``values: aligned``):
# the spelling stores have always carried, kept so stores stay alike; the one place `scores`
# names the score matrices (docs/model.md, "Names").
_ALIGNED_VALUES_SOURCE = "scores"


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
        norm to ``1e-8`` (then it is normalised exactly) or ``ValueError``.
    score_matrices : ndarray, optional
        ``(H, d, d)`` symmetric score matrices ``M_h`` replacing the cell's head structure (``heads``).
    value_matrices : ndarray, optional
        ``(H, d, d)`` ``V_h``; default ``V_h = M_h`` (value alignment).
    certify : bool
        Record the accuracy certificate (default): the first ``CERTIFICATE_SEEDS`` seeds integrated
        again at a tolerance ``CERTIFICATE_FACTOR`` times tighter, see ``certificate_error``.

    Returns
    -------
    xarray.Dataset
        Dims ``seed, time, head, token`` (and ``dim``, ``dim_col``); the
        variables of the recorded groups with ``units`` and ``description`` attrs; per seed
        ``t_cluster`` (the first time the clustering criterion holds, located
        on the integrator's dense output), ``censored``, ``norm_drift`` and the
        solver's step counts. The attrs hold every cell field and the package
        version, and the accuracy certificate: ``certificate_error``,
        ``CERTIFICATE_SAFETY`` times the largest deviation of the first seeds'
        recorded variables from a rerun at ``certificate_rtol`` (each float
        variable's deviation divided by its scale, the largest |value| of that
        variable over those seeds' samples in the tighter run, floored at
        ``CERTIFICATE_SCALE_FLOOR``; samples reached by one integration only
        left out; ``t_cluster`` the same way, a censoring that differs counting
        1), with ``certificate_variable`` the variable it comes from and
        ``certificate_rhs_calls`` its cost in field evaluations.
    """
    if not isinstance(cell, Cell):
        raise TypeError(f"simulate expects a Cell, got {type(cell).__name__}")
    if not isinstance(certify, (bool, np.bool_)):
        raise TypeError(f"simulate: certify = {certify!r}: must be True or False")
    too_large = oversized(cell)
    if too_large:
        raise ValueError(f"{describe(cell)}: {too_large}")
    n_seeds, n, d, H = cell.n_seeds, cell.n, cell.d, cell.H
    spherical = cell.spherical

    values = None
    if score_matrices is None:
        # Score matrices that do not depend on the seed are built once and shared by the batch.
        built = head_matrices(cell, cell.seeds if cell.heads_per_seed else cell.seeds[:1])
        lambdas = np.broadcast_to(built.strengths, (n_seeds, H))
        form = built.form
        stacked = getattr(built, form.array)  # (seeds or 1, H, ...); the factored form a pair (U, e)
        values = built.values
        discarded = built.antisymmetric_share
    else:
        discarded = None
        form, stacked = Form.DENSE, _check_score_matrices(cell, score_matrices)[None]
        lambdas = np.broadcast_to(np.linalg.norm(stacked, ord=2, axis=(-2, -1)), (n_seeds, H))
    given = {form.array: stacked}  # the engine's keyword for the form
    if value_matrices is not None:
        values = _check_matrices("value_matrices", value_matrices, (H, d, d))[None]
    if x0 is None:
        x_init = initial_tokens(cell, cell.seeds)
    else:
        x_init = _check_x0(cell, x0)

    times = cell.sample_times()
    try:
        result = _integrate(cell, x_init, given, values, times, cell.rtol, cell.atol, cell.max_steps)
    except IntegrationError as err:
        raise SimulationError(f"{describe(cell)}: {err}") from err
    recorded = result.variables
    measured = times[None, :] <= result.t_stop[:, None]  # (seed, time): samples the run reached
    _check_finite(cell, recorded, measured, result.norm_drift if spherical else None)
    certificate = _certificate(cell, result, x_init, given, values, times) if certify else {}

    data_vars = {}
    attention = ATTENTIONS.get(cell.attention)
    for var in variables(cell.observables):
        data_vars[var.name] = (("seed", "time") + var.dims, recorded[var.name],
                               {"units": var.units, "description": var.describe(attention)})
    criterion = criterion_text(cell.cluster_metric, cell.cluster_threshold)
    data_vars["t_cluster"] = ("seed", result.t_cluster, {
        "units": "time",
        "description": f"first time {criterion} holds, located by bisection on the integrator's "
                       "dense output; NaN when censored",
    })
    data_vars["censored"] = ("seed", np.isnan(result.t_cluster), {
        "units": "1", "description": f"{criterion} never held up to t_max",
    })
    if cell.stop_at_cluster:
        data_vars["t_stop"] = ("seed", result.t_stop, {
            "units": "time", "description": "where the run stopped (t_cluster, or t_max if censored); "
                                            "samples after it are NaN (cluster counts -1)"})
    data_vars["norm_drift"] = ("seed", result.norm_drift, {
        "units": "1", "description": "max_t,i | ||x_i|| - 1 | over the samples",
    })
    data_vars["n_steps"] = ("seed", result.n_steps, {"units": "1", "description": "accepted steps"})
    data_vars["n_rejected"] = ("seed", result.n_rejected, {"units": "1", "description": "rejected steps"})
    data_vars["lam"] = (("seed", "head"), lambdas, {
        "units": "1", "description": "head strength lambda_h (operator norm for explicit heads)",
    })
    # The score matrices themselves: per seed where they are drawn, once where they are not; the
    # factored form (trained heads) is not copied into every store (the attrs name the weights file
    # and its digest).
    if form == Form.DENSE:
        data_vars["score_matrix"] = (*_per_head(stacked, ("dim", "dim_col")), {
            "units": "1", "description": "score matrix M_h used"})
    elif form == Form.DIAGONAL:
        data_vars["score_diagonal"] = (*_per_head(stacked, ("dim",)), {
            "units": "1", "description": "diagonal of the (diagonal) score matrix M_h used"})
    if discarded is not None:
        data_vars["antisymmetric_share"] = ("head", discarded, {
            "units": "1",
            "description": "||antisym(M_h)||_F / ||M_h||_F of the trained W_Q^T W_K, discarded"})
    if values is not None and not cell.weights:
        # By its own leading axis: explicit values are shared even where the heads are drawn per seed.
        data_vars["value_matrix"] = (*_per_head(values, ("dim", "dim_col")),
                                     {"units": "1", "description": "value matrix V_h used"})

    attrs = {f"cell_{k}": v for k, v in cell.to_dict().items()}
    if cell.weights:
        from .trained import digest, resolve

        attrs.update({"weights_file": str(resolve(cell.weights)), "weights_sha256": digest(cell.weights)})
    attrs.update({
        "attnflow_version": __version__,
        "x0_source": "cell" if x0 is None else "explicit",
        "heads_source": "cell" if score_matrices is None else "explicit",
        "values_source": "explicit" if value_matrices is not None else (
            "heads" if values is not None else _ALIGNED_VALUES_SOURCE),
        "solver": "Dormand-Prince 5(4), per-trajectory error control, retraction onto the sphere",
        "solver_engine": engine_for(cell),  # the engine that ran (Cell.engine may say auto)
        "solver_heads_form": result.form,
        "solver_rhs_calls": int(result.n_rhs_calls.sum()),
        "solver_max_retraction": float(result.max_retraction.max()),
        **certificate,
    })
    coords = {
        "seed": np.array(cell.seeds, dtype=np.int64),
        "time": ("time", times, {"units": "time"}),
        "head": np.arange(H),
        "token": np.arange(n),
    }
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def _integrate(cell, x_init, given, values, times, rtol, atol, max_steps):
    """The engine on a cell's flow, score matrices (``given``: the form's keyword -> its arrays) and
    criterion: the one spelling of the call (the certificate's rerun differs in the tolerances, the
    step budget and the seeds alone)."""
    return solver_for(cell)(
        x_init, **given, attention=cell.attention, beta=cell.beta, spherical=cell.spherical, mask=cell.mask,
        t_eval=times, rtol=rtol, atol=atol, max_steps=max_steps, values=values, groups=cell.observables,
        cluster_metric=cell.cluster_metric, cluster_threshold=cell.cluster_threshold,
        cluster_eps=cell.cluster_eps, stop_at_cluster=cell.stop_at_cluster,
    )


def _certificate(cell, result, x_init, given, values, times) -> dict:
    """The accuracy certificate: the first seeds again at a 100x tighter tolerance (see ``simulate``).

    Integer variables (the cluster count) are left out: a count flips when a pair sits at the
    threshold, whatever the accuracy. A tighter run that fails records ``inf``.
    """
    k = min(CERTIFICATE_SEEDS, cell.n_seeds)
    rtol = max(cell.rtol / CERTIFICATE_FACTOR, MIN_RTOL)
    atol = cell.atol / CERTIFICATE_FACTOR
    sub = {key: (tuple(a[:k] for a in arr) if key == Form.FACTORED.array else arr[:k] if arr.shape[0] > 1
                 else arr)
           for key, arr in given.items()}
    vals = None if values is None else (values[:k] if values.shape[0] > 1 else values)
    out = {"certificate_rtol": rtol, "certificate_atol": atol, "certificate_seeds": k,
           "certificate_rhs_calls": 0}
    try:
        # Clamped to int64, the engine's step counter (Cell allows max_steps up to its maximum).
        tight = _integrate(cell, x_init[:k], sub, vals, times, rtol, atol,
                           min(_CERTIFICATE_STEP_FACTOR * cell.max_steps, INT64_MAX))
    except IntegrationError as err:
        return {**out, "certificate_error": float("inf"),
                "certificate_variable": f"tighter run failed: {err}"}
    out["certificate_rhs_calls"] = int(tight.n_rhs_calls.sum())  # its cost, next to solver_rhs_calls
    pairs = {name: (result.variables[name][:k], tight.variables[name])
             for name in tight.variables if tight.variables[name].dtype.kind == "f"}
    pairs["t_cluster"] = (result.t_cluster[:k], tight.t_cluster)
    worst, where = 0.0, ""
    for name, (got, ref) in pairs.items():
        deviation = certificate_deviation(got, ref, censoring=name == "t_cluster")
        if deviation > worst or not where:
            worst, where = deviation, name
    return {**out, "certificate_error": CERTIFICATE_SAFETY * float(worst), "certificate_variable": where}


def certificate_deviation(got, ref, *, censoring: bool = False) -> float:
    """``max |got - ref| / scale`` over the entries finite in both, ``scale = max |ref|`` there
    (floored at ``CERTIFICATE_SCALE_FLOOR``); 0 when nothing is finite in both.

    ``censoring`` (for ``t_cluster``): an entry finite in one and not the other (clustered in one
    integration only) counts 1. Per-sample variables leave such entries out: a run that stops at
    its clustering criterion ends at the end of an integrator step, which moves with the tolerance.
    """
    got, ref = np.asarray(got, dtype=float), np.asarray(ref, dtype=float)
    both = np.isfinite(got) & np.isfinite(ref)
    if censoring and np.any(np.isfinite(got) != np.isfinite(ref)):
        return 1.0
    if not both.any():
        return 0.0
    scale = max(float(np.max(np.abs(ref[both]))), CERTIFICATE_SCALE_FLOOR)
    return float(np.max(np.abs(got[both] - ref[both]))) / scale


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
    if cell.spherical:
        off = np.max(np.abs(np.linalg.norm(x0, axis=-1) - 1.0))
        if off > _SPHERE_TOLERANCE:
            raise ValueError(f"x0: tokens are not on the unit sphere (max | ||x_i|| - 1 | = {off:.3g})")
        x0 = unit_rows(x0)
    return x0


def _check_finite(cell, recorded, measured, sphere_drift):
    """Every measured sample finite, tokens on the sphere; ``measured`` is (seed, time)."""
    every = bool(measured.all())  # the usual case: no run stopped early, no samples to leave out

    def finite(v):
        if every:
            return bool(np.isfinite(v).all())
        mask = measured.reshape(measured.shape + (1,) * (v.ndim - 2))
        return np.all(np.isfinite(v) | ~mask)

    bad = [k for k, v in recorded.items() if v.dtype.kind == "f" and not finite(v)]
    if bad:
        raise SimulationError(f"{describe(cell)}: non-finite values in {', '.join(bad)}")
    if sphere_drift is not None:
        drift = float(np.max(sphere_drift))
        if drift > _MAX_SPHERE_DRIFT:
            raise SimulationError(f"{describe(cell)}: tokens left the sphere (drift {drift:.3g})")
