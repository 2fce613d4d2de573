"""Result 10: log-spaced samples, the plateau measurement and the growth fit of the metastability figure."""

import numpy as np
import pytest

from attnflow.cell import LOG_DECADES, Cell
from attnflow.experiments.metastability import growth_fit, longest_plateau
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


def test_longest_plateau_between_merges_and_censored():
    t = np.array([0, 1, 2, 4, 8, 16, 32, 64.0])
    assert longest_plateau(t, [9, 5, 3, 3, 3, 3, 1, 1]) == (30.0, False, 3.0)  # 3 from t = 2 to t = 32
    assert longest_plateau(t, [9, 5, 3, 3, 3, 2, 1, 1]) == (16.0, False, 2.0)  # 2 from 16 to 32 is longer
    assert longest_plateau(t, [9, 5, 4, 3, 2, 2, 2, 2]) == (56.0, True, 2.0)  # on at t_max: censored
    length, censored, count = longest_plateau(t, [9, 1, 1, 1, 1, 1, 1, 1])
    assert np.isnan(length) and not censored


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
