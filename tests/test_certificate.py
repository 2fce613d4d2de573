"""The accuracy certificate of a store (docs/model.md, "Numerics"): it bounds the error of every seed.

The true error comes from an independent reference: the numpy field below (written apart from the
engine, checked against tests/reference.py) integrated by DOP853 at rtol 1e-12 (tests/dop853.py, which
lands a step on every relu kink), its variables measured at the reference positions and its cluster
time located inside the step where the criterion first holds.
"""

from pathlib import Path

import dop853
import numpy as np
import pytest
import yaml
from reference import velocity as reference_velocity
from scipy.optimize import brentq

from attnflow.attention import ATTENTIONS
from attnflow.cell import Cell
from attnflow.certificate import Certified, seed_deviations
from attnflow.engine import observe
from attnflow.simulation import simulate

VARIANTS = yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text())[
    "experiments"]["variants"]["fixed"]
# The variants block of the default run, its fitted tolerances included; positions recorded as well.
BASE = dict(VARIANTS, seeds=4, n_samples=21, observables=["velocity", "energy", "entropy", "positions"])
CELLS = {
    # The cell whose error exceeded a 2-seed certificate 2000x (issue 41), with all its seeds.
    "relu, random heads, beta 4": dict(attention="relu", heads="random", beta=4.0, seeds=16),
    "relu, scalar heads, causal, beta 4": dict(attention="relu", heads="scalar", mask="causal", beta=4.0),
    "softmax, random heads, beta 4": dict(attention="softmax", heads="random", beta=4.0),
    "softmax, scalar heads, beta 0.5": dict(attention="softmax", heads="scalar", beta=0.5),
    # Stiff: the step is limited by stability, so the looser companion takes nearly the same steps.
    "usa, random heads, beta 4": dict(attention="usa", heads="random", beta=4.0, seeds=2, t_max=5.0),
    "usa, scalar heads, causal, beta 2": dict(attention="usa", heads="scalar", mask="causal", beta=2.0),
    "sigmoid, random heads, beta 4": dict(attention="sigmoid", heads="random", beta=4.0),
    "sigmoid, scalar heads, causal, beta 4": dict(attention="sigmoid", heads="scalar", mask="causal",
                                                  beta=4.0),
}
REFERENCE_RTOL = 1e-12


def batched_velocity(x, score, values, beta, attention, mask):
    """The field of docs/model.md on the sphere for a batch x (S, n, d), heads (S, H, d, d)."""
    n = x.shape[1]
    xs = x[:, None]  # (S, 1, n, d): the heads broadcast over it
    s = xs @ score @ np.swapaxes(xs, -1, -2)
    keep = np.tril(np.ones((n, n), dtype=bool)) if mask == "causal" else np.ones((n, n), dtype=bool)
    if attention == "softmax":
        z = np.where(keep, beta * s, -np.inf)
        w = np.exp(z - z.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
    elif attention == "usa":
        w = np.where(keep, np.exp(beta * s), 0.0) / n
    elif attention == "sigmoid":
        w = np.where(keep, 0.5 * (1.0 + np.tanh(0.5 * (beta * s - np.log(n)))), 0.0)
    else:
        w = np.where(keep, np.maximum(beta * s, 0.0) / n, 0.0)
    v = (w @ (xs @ np.swapaxes(values, -1, -2))).sum(axis=1)  # sum_h sum_j w^h_ij V_h x_j
    return v - np.sum(v * x, axis=-1, keepdims=True) * x


def stored_heads(ds, seeds):
    """(S, H, d, d) score and value matrices of a store, per seed."""
    if "score_matrix" in ds:
        m = ds.score_matrix.values
    else:
        m = np.stack([np.diag(row) for row in ds.score_diagonal.values])
    m = np.broadcast_to(m, (seeds,) + m.shape[-3:]) if m.ndim == 3 else m
    v = m if "value_matrix" not in ds else np.broadcast_to(ds.value_matrix.values, m.shape)
    return np.ascontiguousarray(m), np.ascontiguousarray(v)


def reference(ds, cell):
    """The cell's variables per seed from DOP853 at rtol 1e-12 on the numpy field, each relu kink
    landed on a step's end (tests/dop853.py)."""
    x0, times = ds.x.values[:, 0], ds.time.values
    S, n, d = x0.shape
    score, values = stored_heads(ds, S)
    keep = np.tril(np.ones((n, n), dtype=bool)) if cell.mask == "causal" else np.ones((n, n), dtype=bool)

    def field(seeds):
        return lambda y: batched_velocity(y.reshape(-1, n, d), score[seeds], values[seeds], cell.beta,
                                          cell.attention, cell.mask).reshape(len(seeds), -1)

    def scores(y):
        x = y.reshape(S, n, d)
        return np.einsum("sid,shde,sje->shij", x, score, x)[:, :, keep].reshape(S, -1)

    def retract(y):
        x = y.reshape(y.shape[0], n, d)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).reshape(y.shape[0], -1)

    def margin(y):  # the variants criterion 1 - min_{i<j} <x_i, x_j> <= threshold, as a sign
        x = y.reshape(-1, n, d)
        gram = np.einsum("sid,sjd->sij", x, x)[:, *np.triu_indices(n, 1)]
        return 1.0 - gram.min(axis=1) - cell.cluster_threshold

    assert cell.cluster_metric == "epsilon"
    x, (t_start, y_start, t_end) = dop853.integrate(
        field(np.arange(S)), x0.reshape(S, -1), times, rtol=REFERENCE_RTOL, atol=1e-15,
        kinks=None if ATTENTIONS.get(cell.attention).smooth else scores, retract=retract,
        event=lambda y: margin(y) <= 0)
    x = x.reshape(S, times.size, n, d)
    per_sample = lambda a: np.repeat(a, times.size, axis=0)  # noqa: E731  (heads per seed -> per sample)
    out = observe(x.reshape(-1, n, d), per_sample(score), attention=cell.attention, beta=cell.beta,
                  mask=cell.mask, values=per_sample(values), groups=cell.observables,
                  cluster_eps=cell.cluster_eps)
    out = {k: v.reshape((S, times.size) + v.shape[1:]) for k, v in out.items()}
    out["x"] = x
    # The first crossing inside the step where the criterion first held: one DOP853 step from its start.
    out["t_cluster"] = t_start.copy()
    for s in np.flatnonzero(t_end > t_start):
        def along(tau, s=s):
            y = dop853.single_step(field([s]), y_start[s:s + 1], np.array([tau]))
            return margin(retract(y))[0]
        out["t_cluster"][s] += brentq(along, 0.0, t_end[s] - t_start[s], xtol=1e-14)
    return out


def true_errors(ds, ref):
    """Per seed: the certificate's measure of the stored variables against the reference."""
    names = [v for v in ref if v != "t_cluster" and ds[v].dtype.kind == "f"]
    return np.max([seed_deviations(ds[v].values, ref[v]) for v in names]
                  + [seed_deviations(ds.t_cluster.values, ref["t_cluster"], censoring=True)], axis=0)


def test_the_numpy_field_is_the_reference_field():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 4))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    g = rng.standard_normal((2, 2, 4, 4))
    m = g + np.swapaxes(g, -1, -2)
    for attention in ("softmax", "usa", "sigmoid", "relu"):
        for mask in ("none", "causal"):
            got = batched_velocity(x, m, m, 1.5, attention, mask)
            want = [reference_velocity(x[s], m[s], 1.5, attention, mask=mask) for s in range(2)]
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", list(CELLS))
def test_the_certificate_bounds_every_seed(name):
    cell = Cell(**{**BASE, **CELLS[name]})
    ds = simulate(cell)
    errors = true_errors(ds, reference(ds, cell))
    certificate = ds.certificate_error.values
    assert np.isfinite(certificate).all()
    assert np.all(certificate >= errors), (name, certificate / errors)
    assert ds.attrs["certificate_error"] == certificate.max()
    assert ds.attrs["certificate_route"] == ("tighter" if cell.attention == "relu" else "looser")
    # The default run's tolerances make these cells certified: the stored numbers are that accurate.
    from attnflow.numerics import CERTIFICATE_BOUND

    assert errors.max() <= ds.attrs["certificate_error"] <= CERTIFICATE_BOUND, name


# Cells where the steps are limited by stability, not accuracy, at tolerances from 1e-3 to 1e-9 (issue 49),
# on the default cell (n = d = 8, t_max = 10); positions recorded for the reference's start.
OBSERVED = ["velocity", "energy", "entropy", "positions"]
MATRIX = {
    # The cell whose seed 38 read 4.7x under its error with a looser companion alone: all 64 seeds.
    "sigmoid, block heads, beta 8, rtol 1e-5": dict(attention="sigmoid", heads="block", beta=8.0, rtol=1e-5,
                                                   seeds=64),
    "sigmoid, block heads, beta 8, rtol 1e-3": dict(attention="sigmoid", heads="block", beta=8.0, rtol=1e-3),
    "sigmoid, block heads, beta 4, rtol 1e-4": dict(attention="sigmoid", heads="block", beta=4.0, rtol=1e-4),
    "softmax, random heads, beta 4, rtol 1e-3": dict(attention="softmax", heads="random", beta=4.0,
                                                     rtol=1e-3),
    "softmax, scalar heads, beta 1, rtol 1e-9": dict(attention="softmax", heads="scalar", rtol=1e-9,
                                                     seeds=2),
    "relu, block heads, beta 4, rtol 1e-4": dict(attention="relu", heads="block", beta=4.0, rtol=1e-4),
    # usa at beta 6-8: thousands of stability-limited steps. At rtol 1e-4 most seeds take the same steps
    # at every tolerance, so no companion measures their error; at rtol 1e-3 the runs differ by 10-100% of
    # the variables (errors saturate, and a looser companion read 2.7x under one): uncertified (at beta 8
    # every seed).
    "usa, block heads, beta 6, rtol 1e-4": dict(attention="usa", heads="block", beta=6.0, rtol=1e-4,
                                                t_max=4.0),
    "usa, random heads, beta 6, rtol 1e-3": dict(attention="usa", heads="random", beta=6.0, rtol=1e-3,
                                                 t_max=4.0),
    "usa, random heads, beta 8, rtol 1e-3": dict(attention="usa", heads="random", beta=8.0, rtol=1e-3,
                                                 seeds=2, t_max=4.0),
}
NONE_CERTIFIED = ("usa, random heads, beta 8, rtol 1e-3",)
UNCERTIFIED = (Certified.STEPS_IGNORE_TOLERANCE, Certified.COMPANION_FAILED, Certified.NO_TIGHTER_TOLERANCE,
               Certified.SATURATED)


@pytest.mark.parametrize("name", list(MATRIX))
def test_every_seed_is_bounded_or_flagged_where_steps_are_stability_limited(name):
    fields = {"seeds": 4, "n_samples": 21, "observables": OBSERVED, **MATRIX[name]}
    cell = Cell(**fields, atol=fields["rtol"] * 1e-3)
    ds = simulate(cell)
    certificate, flag = ds.certificate_error.values, ds.certificate_flag.values
    certified = np.isin(flag, (Certified.LOOSER, Certified.TIGHTER, Certified.CAPPED))
    errors = true_errors(ds, reference(ds, cell))
    assert certified.any() != (name in NONE_CERTIFIED), (name, flag)
    # A certified seed's certificate bounds its error; an uncertified one stores no number, and says why.
    assert np.all(certificate[certified] >= errors[certified]), (name, certificate / errors)
    assert np.isin(flag[~certified], UNCERTIFIED).all() and np.isnan(certificate[~certified]).all(), name
    assert ds.attrs["certificate_uncertified"] == (~certified).sum()
    if certified.all():
        assert ds.attrs["certificate_error"] == certificate.max()
    else:  # the cell's certificate is no number either: the summaries count it uncertified
        assert np.isnan(ds.attrs["certificate_error"]) and "uncertified" in ds.attrs["certificate_variable"]


def test_long_horizons_sized_by_stability_are_certified_by_the_capped_companion():
    """config/paper.yaml's metastability cells, run to t = 30,000 (here 10,000, two seeds): stability sizes
    the steps, so no companion's step count follows its tolerance, and before the capped companion 85% of
    their seeds were uncertified. The capped companion (tighter, every step at most 0.7 of the seed's mean)
    bounds each seed's error against the DOP853 reference: measured certificate / error 1.98-2.0, where
    CERTIFICATE_SAFETY = 2 gives 2 for a companion with no error of its own."""
    from attnflow.resources import stability_sized

    cell = Cell(attention="softmax", heads="scalar", H=2, d=2, n=16, beta=4.0, init="uniform", seeds=2,
                t_max=10000.0, n_samples=31, sample_spacing="log", cluster_eps=0.01, lambda_dist="linear",
                spread=0.5, rtol=1e-8, atol=1e-11, observables=OBSERVED)
    assert stability_sized(cell)
    ds = simulate(cell)
    assert ds.attrs["certificate_route"] == "capped"
    assert (ds.certificate_flag.values == Certified.CAPPED).all()
    errors = true_errors(ds, reference(ds, cell))
    assert np.all(ds.certificate_error.values >= errors), ds.certificate_error.values / errors
    assert ds.attrs["certificate_error"] == ds.certificate_error.values.max() <= 1e-4


def test_capped_groups_run_at_their_smallest_cap_within_sqrt_2():
    # Each seed's steps capped at most at its own cap and at least at 1/sqrt 2 of it (the capped companion's
    # bound asks the first; the second is its cost), every seed in exactly one group, alike caps in one run.
    from attnflow.certificate import _cap_groups

    cap = np.array([0.30, 1.00, 0.31, 0.42, np.inf, 0.43, 1.40, 0.29, np.inf])
    groups = _cap_groups(cap)
    assert sorted(np.concatenate(groups).tolist()) == list(range(cap.size))
    for group in groups:
        step = cap[group].min()
        assert np.all(step <= cap[group]) and np.all(cap[group] <= np.sqrt(2.0) * step)
    assert [g.tolist() for g in groups] == [[0, 2, 7], [3, 5], [1, 6], [4, 8]]
    for bad in (-1.0, 0.0, np.nan):  # never a run at an invalid step, nor a loop that cannot advance
        with pytest.raises(ValueError, match="caps must be > 0"):
            _cap_groups(np.array([bad, 0.5]))


def test_companions_record_only_the_groups_the_certificate_compares(monkeypatch):
    # energy_path costs a field evaluation at every accepted step for a variable the certificate leaves out,
    # and the cluster count is an integer: a companion without them certifies every seed alike, for less.
    import attnflow.certificate as certificate_module

    cell = Cell(H=2, n=6, d=6, beta=2.0, heads="random", attention="softmax", seeds=4, t_max=4.0,
                n_samples=9, observables=["clusters", "energy", "energy_path", "radial"])
    assert certificate_module._compared(cell) == ("cosines", "energy", "radial")
    lean = simulate(cell)
    monkeypatch.setattr(certificate_module, "_compared", lambda c: c.observables)
    every = simulate(cell)
    np.testing.assert_array_equal(lean.certificate_error.values, every.certificate_error.values)
    assert lean.attrs["certificate_rhs_calls"] < every.attrs["certificate_rhs_calls"]


def test_every_seed_is_rerun_and_the_certificate_is_off_on_request():
    cell = Cell(seeds=5, t_max=2.0)
    ds = simulate(cell)
    assert ds.attrs["certificate_seeds"] == 5 and ds.certificate_error.dims == ("seed",)
    assert np.all(ds.certificate_error.values > 0)
    assert ds.attrs["certificate_error"] == ds.certificate_error.values.max()
    worst = int(np.argmax(ds.certificate_error.values))
    assert ds.attrs["certificate_seed"] == cell.seeds[worst] and ds.attrs["certificate_variable"]
    off = simulate(cell, certify=False)
    assert "certificate_error" not in off.attrs and "certificate_error" not in off


def test_seed_deviation_conventions():
    got = np.array([[1.0, 2.0], [np.nan, 1.0], [1e-20, 0.0]])
    ref = np.array([[1.0, 2.5], [1.0, 1.5], [0.0, 0.0]])
    np.testing.assert_allclose(seed_deviations(got, ref), [0.2, 1 / 3, 1e-8])  # scale floored at 1e-12
    # t_cluster: clustered in one run only counts 1; censored in both counts 0.
    np.testing.assert_array_equal(seed_deviations([[np.nan], [np.nan]], [[1.0], [np.nan]], censoring=True),
                                  [1.0, 0.0])
