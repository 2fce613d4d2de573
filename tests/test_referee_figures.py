"""Figures a referee sent back (issue 52, item 9): what they print is what the numbers are."""


import numpy as np
import pytest
import xarray as xr

from attnflow.experiments import Spec, registry


def _summary(name: str, grid: dict, variables: dict, **fixed) -> tuple[xr.Dataset, Spec]:
    spec = Spec(name, {**registry().get(name).defaults["fixed"], **fixed}, grid, ())
    attrs = {"experiment": name, "experiment_spec": spec.to_json()}
    return xr.Dataset(variables, coords=grid, attrs=attrs), spec


@pytest.mark.parametrize("seeds", [1, 3])
def test_entropy_says_its_number_is_a_quadrature_error_and_averages_only_over_seeds_it_has(seeds):
    from attnflow.plotting import plt

    grid = {"n": [8], "beta": [1.0, 4.0]}
    time = np.linspace(0.0, 5.0, 11)
    entropy = np.log(8) - np.exp(-time)[:, None, None] * np.ones((1, 1, 2))
    summary, spec = _summary("entropy", grid, {
        "entropy": (("time", "n", "beta"), entropy),
        "rate_quadrature_error": (("n", "beta"), np.full((1, 2), 1.2e-6))}, seeds=seeds)
    fig = registry().get("entropy").plot(summary.assign_coords(time=time), spec)
    ax = fig.axes[0]
    assert "Thm 27 relative residual" not in ax.get_title()
    assert "quadrature error" in ax.get_title() and "1.2e-06" in ax.get_title()
    assert ("seeds" in ax.get_ylabel()) == (seeds > 1)
    plt.close(fig)


def test_metastability_verdict_carries_its_margin_and_its_censoring():
    from attnflow.experiments.metastability import _verdict_line

    beta = [1.0, 2.0, 6.0]
    censored = np.zeros((3, 8))
    censored[1, :2] = 1
    censored[2, :7] = 1  # 7 of 8 runs censored at beta = 6
    sub = xr.Dataset({"plateau": (("beta", "seed"), np.ones((3, 8))),
                      "plateau_censored": (("beta", "seed"), censored),
                      "fit_loglik_margin": 2.6, "fit_runs": 24.0, "fit_censored": 9.0},
                     coords={"beta": beta})
    line = _verdict_line(sub, "looks exponential in beta")
    assert line.startswith("looks exponential in beta, \u0394log L = +2.6")
    assert "9 of 24 runs censored" in line and "7/8 at \u03b2 = 6" in line and "\u03b2 = 2" not in line


def test_beta_star_leaves_out_the_row_that_is_one_by_construction():
    from attnflow.plotting import plt

    exp = registry().get("beta_star")
    beta, n = [0.5, 2.0], [4, 8]
    dims = ("seed", "attention", "H", "heads", "n", "beta")
    shape = (2, 1, 1, 2, 2, 2)
    ones = np.ones(shape)
    summary = xr.Dataset({"mono_path": (dims, ones), "mono_t0": (dims, ones), "rd_t0": (dims, ones),
                          "time_rd": (dims, ones)},
                         coords={"seed": [0, 1], "attention": ["softmax"], "H": [2],
                                 "heads": ["scalar", "block"], "n": n, "beta": beta})
    spec = exp.spec({"grid": {"attention": ["softmax"], "H": [2], "heads": ["scalar", "block"], "n": n,
                              "beta": beta}})
    summary = exp.derive(summary, spec)
    fig = exp.plot(summary, spec)
    panels = [ax for ax in fig.axes if ax.get_visible() and getattr(ax, "_colorbar", None) is None
              and ax.get_label() != "<colorbar>"]
    labels = [ax.get_ylabel() for ax in panels]
    assert len(panels) == 3 and labels[0].startswith("scalar heads")  # its Radial Dominance row stays
    assert not [label for label in labels if label.startswith("scalar") and "monotone" in label]
    assert "1 by construction" in fig._suptitle.get_text()
    plt.close(fig)


def test_superadditivity_median_treats_censored_runs_as_bounds():
    """Two pairs with ratios 0.5 and 0.8, two whose equal-strength run never clustered by t_max = 100
    (lower ends t_max / T_lin = 0.6 and 0.9): their ratios may be anything from there up, so the median
    lies in [0.7, inf], undetermined (it was inf: a bound taken for a value)."""
    exp = registry().get("superadditivity")
    t_max = 100.0
    equal = np.array([[50.0, 80.0, np.inf, np.inf], [50.0, 60.0, 70.0, np.inf]])
    linear = np.array([[100.0, 100.0, 100 / 0.6, 100 / 0.9], [100.0, 100.0, 100.0, 50.0]])
    t = np.stack([equal, linear], axis=1)  # (lambda_bar, lambda_dist, seed)
    dims = ("lambda_bar", "lambda_dist", "seed")
    summary = xr.Dataset({"t_cluster": (dims, t)},
                         coords={"lambda_bar": [0.5, 1.0], "lambda_dist": ["equal", "linear"],
                                 "seed": np.arange(4)})
    summary = summary.expand_dims(beta=[1.0], spread=[0.5], init=["uniform"])
    spec = exp.spec({"fixed": {"t_max": t_max}})
    out = exp.derive(summary, spec).squeeze()
    first = out.sel(lambda_bar=0.5)
    assert float(first.ratio_low) == pytest.approx(0.7, rel=1e-12) and np.isinf(float(first.ratio_high))
    assert np.isnan(float(first.ratio))
    # Where the censored pair sits on one side of the median, the median is known: ratios 0.5, 0.6, 0.7
    # and one pair whose equal run is censored (ratio >= 100 / 50 = 2): the median is (0.6 + 0.7) / 2.
    second = out.sel(lambda_bar=1.0)
    assert float(second.ratio) == pytest.approx(0.65, rel=1e-12)
    assert np.isnan(second.ratio_seed.values[3])
