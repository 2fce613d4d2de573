"""Result 10: log-spaced samples, the plateau measurement and the growth fit of the metastability figure."""

import numpy as np
import pytest

from attnflow.cell import LOG_DECADES, Cell
from attnflow.experiments.metastability import censored_fit, growth_fit, longest_plateau, plateaus
from attnflow.simulation import simulate


def test_log_spacing_is_zero_then_geometric_up_to_t_max():
    cell = Cell(t_max=1e4, n_samples=13, sample_spacing="log")
    t = cell.sample_times()
    assert t[0] == 0.0 and t[-1] == 1e4 and t[1] == pytest.approx(1e4 * 10.0**-LOG_DECADES, rel=1e-12)
    np.testing.assert_allclose(np.diff(np.log(t[1:])), np.log(10) * LOG_DECADES / 11, rtol=1e-12)
    assert list(Cell(t_max=2.0, n_samples=2, sample_spacing="log").sample_times()) == [0.0, 2.0]
    np.testing.assert_array_equal(Cell(t_max=2.0, n_samples=5).sample_times(), [0, 0.5, 1, 1.5, 2])
    with pytest.raises(ValueError, match="Cell.sample_spacing = 'cubic'"):
        Cell(sample_spacing="cubic")


def test_simulate_samples_at_the_log_times():
    cell = Cell(H=1, n=4, d=2, seeds=1, t_max=100.0, n_samples=9, sample_spacing="log",
                observables=["clusters"])
    ds = simulate(cell)
    np.testing.assert_array_equal(ds.time.values, cell.sample_times())
    # The linear default samples at the same places as before the field existed.
    np.testing.assert_array_equal(simulate(cell.replace(sample_spacing="linear")).time.values,
                                  np.linspace(0, 100.0, 9))


def test_a_plateau_is_entered_by_a_merge_and_outlasts_its_age():
    t = np.array([0, 1, 2, 4, 8, 16, 32, 64.0])
    # 3 from t = 2 to 32: entered by a merge, and 32 >= 2 * 2
    assert longest_plateau(t, [9, 5, 3, 3, 3, 3, 1, 1], 16) == (30.0, False, 3.0)
    # 2 from 16 to 32 is longer
    assert longest_plateau(t, [9, 5, 3, 3, 3, 2, 1, 1], 16) == (16.0, False, 2.0)
    # On at t_max: censored (a lower bound), though the merge into it came late.
    assert longest_plateau(t, [9, 5, 4, 3, 2, 2, 2, 2], 16) == (56.0, True, 2.0)
    # The initial stretch is no plateau, however long: nothing has merged yet.
    length, censored, count = longest_plateau(t, [9, 9, 9, 9, 9, 9, 9, 1], 16)
    assert np.isnan(length) and not censored
    # Nine clusters of 16 tokens are no metastable state: most tokens are still alone.
    assert np.isnan(longest_plateau(t, [12, 9, 9, 9, 9, 9, 9, 1], 16)[0])
    # The first transient: counts passed through on the way to one cluster, each shorter than its age.
    fine = np.geomspace(0.1, 100.0, 31)  # ten samples per decade, as log spacing gives
    cascade = np.where(fine < 1.0, 16, np.where(fine < 1.3, 6, np.where(fine < 1.6, 3, 1)))
    assert np.isnan(longest_plateau(fine, cascade, 16)[0])
    assert plateaus(fine, cascade, 16) == []
    # A run ending on a plateau is censored even when an earlier one was longer: the last may yet
    # outlast it.
    assert longest_plateau(t, [9, 5, 3, 3, 3, 3, 3, 2], 16) == (62.0, True, 3.0)


def test_censored_fit_is_least_squares_without_censoring():
    """Tobit with nothing censored maximises the normal likelihood: the least-squares line, exactly
    (an independent route: numpy's polyfit)."""
    rng = np.random.default_rng(2)
    x = np.repeat([1.0, 2.0, 3.0, 4.0], 10)
    y = 0.5 + 1.3 * x + 0.4 * rng.standard_normal(x.size)
    fit = censored_fit(x, y, np.zeros(x.size, bool))
    slope, intercept = np.polyfit(x, y, 1)
    assert fit["slope"] == pytest.approx(slope, rel=1e-6)
    assert fit["intercept"] == pytest.approx(intercept, rel=1e-6)
    # Its standard error is least squares' with sigma^2 = RSS / n instead of RSS / (n - 2).
    residual = y - intercept - slope * x
    ols = np.sqrt(np.sum(residual**2) / x.size / np.sum((x - x.mean()) ** 2))
    from scipy import stats

    assert fit["half"] == pytest.approx(stats.t.ppf(0.975, x.size - 2) * ols, rel=1e-3)


def test_censored_fit_recovers_the_rate_that_dropping_censored_runs_biases_down():
    """Lengths e^(1.5 beta) with log-normal scatter, censored at a horizon the largest betas pass (about
    40% of the runs), over 20 replications: the Tobit rate is unbiased (its mean within 3 standard
    errors of the mean of 1.5) and its interval covers the truth in most replications; least squares
    over the uncensored runs alone is biased down by many standard errors."""
    rng = np.random.default_rng(7)
    beta = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 40)
    horizon = np.exp(1.0 + 1.5 * 3.5)
    tobit, dropped, covered = [], [], 0
    for _ in range(20):
        length = np.exp(1.0 + 1.5 * beta + 0.5 * rng.standard_normal(beta.size))
        censored = length > horizon
        seen = np.minimum(length, horizon)
        fit = growth_fit(beta, seen, censored)
        tobit.append(fit["rate"])
        covered += abs(fit["rate"] - 1.5) < fit["rate_half"]
        dropped.append(growth_fit(beta[~censored], seen[~censored])["rate"])
    tobit, dropped = np.array(tobit), np.array(dropped)
    error = tobit.std(ddof=1) / np.sqrt(tobit.size)
    assert abs(tobit.mean() - 1.5) < 3 * error
    assert covered >= 16  # 95% intervals: 19 of 20 expected; 16 or more has probability 0.997
    assert dropped.mean() < 1.5 - 5 * dropped.std(ddof=1) / np.sqrt(dropped.size)


def test_growth_fit_tells_exponential_from_power_law():
    rng = np.random.default_rng(3)
    beta = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 20)
    noise = np.exp(0.3 * rng.standard_normal(beta.size))
    fit = growth_fit(beta, 2.0 * np.exp(1.5 * beta) * noise)
    assert fit["verdict"] == "looks exponential in beta"
    assert abs(fit["rate"] - 1.5) < fit["rate_half"] < 0.2
    wide = np.repeat([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], 20)
    assert growth_fit(wide, wide**2 * noise)["verdict"] == "looks like a power of beta"
    assert growth_fit(np.array([1.0, 2.0]), np.array([1.0, 3.0]))["verdict"] == "too few betas to fit"
    every = growth_fit(beta, np.full(beta.size, 10.0), np.ones(beta.size, bool))
    assert every["verdict"] == "too few uncensored plateaus to fit" and np.isnan(every["rate"])
