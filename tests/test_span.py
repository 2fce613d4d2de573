"""Scalar heads in n < d dimensions: the engine integrates in the span of the initial tokens.

With every M_h = lambda_h I and V_h = M_h the velocity of each token is a combination of the
tokens, so the flow never leaves their span; ``engine.solve`` then integrates the n coordinates
on an orthonormal basis of it (``engine._span_basis``). Checked here against the integration in
all d coordinates (``in_span=False``), which is the independent route.
"""

import numpy as np
import pytest
from reference import random_sphere

from attnflow import Cell, simulate
from attnflow.contract import Controller, Heads, Problem, SaveAt
from attnflow.engine import solve

GROUPS = ("cosines", "clusters", "velocity", "energy", "radial", "entropy", "positions")
T_EVAL = np.linspace(0.0, 6.0, 13)


def _solve(x0, diagonal, attention="softmax", mask="none", geometry="sphere", values=None, in_span=True):
    return solve(Problem(x0, Heads(diagonal=diagonal, values=values), attention, 1.3, geometry, mask),
                 Controller(1e-10, 1e-13, 100_000), SaveAt(T_EVAL, GROUPS), in_span=in_span)


def _scalar_heads(d, strengths=(1.0, 0.4)):
    return np.stack([np.full(d, lam) for lam in strengths])[None]


@pytest.mark.parametrize("attention, mask, geometry", [
    ("softmax", "none", "sphere"), ("usa", "causal", "sphere"), ("sigmoid", "none", "flat"),
    ("softmax", "none", "pre_ln"), ("softmax", "causal", "peri_ln"), ("usa", "none", "ngpt")])
def test_the_span_integration_is_the_full_one(rng, attention, mask, geometry):
    n, d = 6, 40
    x0 = np.stack([random_sphere(rng, n, d) for _ in range(3)])
    heads = _scalar_heads(d)
    full = _solve(x0, heads, attention, mask=mask, geometry=geometry, in_span=False)
    span = _solve(x0, heads, attention, mask=mask, geometry=geometry)
    assert "span of the initial tokens (6 of 40 dimensions)" in span.form and "span" not in full.form
    for name, value in full.variables.items():
        if value.dtype.kind != "f":
            continue
        # At t = 0 nothing is integrated yet: every observable is a function of inner products, which
        # the basis preserves, so only round-off separates the two (O(1) values, d-term sums).
        np.testing.assert_allclose(span.variables[name][:, 0], value[:, 0], rtol=1e-12, atol=1e-13,
                                   err_msg=name)
        # Later each run is within its own error control (rtol 1e-10 per step, smooth flow over
        # t = 6 with ~10^2 steps): their difference stays far below 1e-7 of the values' size (the
        # flat geometry's grow without bound), and round-off is 1e-15.
        np.testing.assert_allclose(span.variables[name], value, rtol=1e-7, atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(span.variables["cluster_count"], full.variables["cluster_count"])
    # Positions come back in R^d, on the sphere.
    x = span.variables["x"]
    assert x.shape == (3, T_EVAL.size, n, d)
    if geometry != "flat":  # the tokens or their directions
        np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("why", ["unequal diagonal", "value matrices", "n = d"])
def test_the_span_is_used_only_where_the_flow_stays_in_it(rng, why):
    n, d = 5, 12
    heads = _scalar_heads(d)
    kw = {}
    if why == "unequal diagonal":  # a diagonal head that is not a multiple of I moves tokens out
        heads = heads.copy()
        heads[0, 0, 0] = 2.0
    elif why == "value matrices":
        kw["values"] = rng.standard_normal((1, 2, d, d))
    else:
        d = n
        heads = _scalar_heads(d)
    x0 = random_sphere(rng, n, d)[None]
    result = _solve(x0, heads, **kw)
    assert "span" not in result.form


def test_a_cell_in_high_dimension_records_the_basis_it_used():
    # clustering_time's largest cells in paper.yaml are n = 32 in d = 4096; a small one here.
    ds = simulate(Cell(H=1, n=8, d=512, heads="scalar", seeds=2, t_max=5.0, n_samples=3,
                       observables=["positions"]))
    assert "8 of 512 dimensions" in ds.attrs["solver_heads_form"]
    assert ds.x.shape == (2, 3, 8, 512)
    np.testing.assert_allclose(np.linalg.norm(ds.x.values, axis=-1), 1.0, atol=1e-12)
