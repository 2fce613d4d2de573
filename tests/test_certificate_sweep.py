"""The certificate travels: every store has one, a summary carries the worst, a figure prints it, and
`attnflow status` flags stores above its bound."""

import numpy as np
import pytest
from sweep_helpers import run, stored, write_config

from attnflow.cli import main as attnflow_main
from attnflow.figures import certificate_line
from attnflow.store import open_verified

pytestmark = pytest.mark.workflow

BLOCK = {"crossover": {
    "fixed": {"heads": "scalar", "H": 1, "n": 8, "d": 16, "seeds": 1, "t_max": 50.0, "n_samples": 2,
              "stop_at_cluster": True, "cluster_metric": "gamma_mean", "rtol": 1e-8, "atol": 1e-11},
    "grid": {"attention": ["softmax", "relu"], "init": ["equiangular_typical"],
             "cluster_threshold": [0.5, 0.9], "beta": [1.0, 4.0]},
    "batch_over": ["beta", "cluster_threshold"],
}}


def status(capsys, config, *extra):
    """``attnflow status`` (in this process): its exit code and what it printed."""
    code = attnflow_main(["status", "--configfile", str(config), *extra])
    return code, capsys.readouterr().out


def test_summary_carries_the_worst_certificate_and_status_flags(tmp_path, capsys):
    config = write_config(tmp_path, **{"experiments": BLOCK, "defaults": None, "experiment_modules": None})
    run(tmp_path, config)
    results = tmp_path / "results"
    certificates = [ds.attrs["certificate_error"] for ds in stored(results).values()]
    assert len(certificates) == 8 and all(np.isfinite(certificates))
    summary = open_verified(results / "summaries" / "crossover.zarr.zip")
    assert summary.attrs["certificate_error"] == max(certificates)
    assert summary.attrs["certificate_uncertified"] == 0
    assert f"{max(certificates):.1e}" in certificate_line(summary)
    assert (results / "figures" / "crossover.png").stat().st_size > 1000

    code, quiet = status(capsys, config)
    assert code == 0 and "uncertified" not in quiet
    code, flagged = status(capsys, config, "--certificate-bound", f"{min(certificates) / 2:g}")
    assert code == 0
    assert flagged.count("uncertified crossover (") == len(certificates), flagged


def test_a_figure_says_when_its_worst_certificate_is_above_the_bound():
    import xarray as xr

    from attnflow.numerics import CERTIFICATE_BOUND

    below = xr.Dataset(attrs={"certificate_error": CERTIFICATE_BOUND / 2})
    assert "uncertified" not in certificate_line(below)
    for worst in (CERTIFICATE_BOUND * 5.9, float("nan")):
        line = certificate_line(xr.Dataset(attrs={"certificate_error": worst}))
        assert f"above {CERTIFICATE_BOUND:g}: uncertified" in line


def test_status_says_why_a_cell_is_uncertified_and_offers_no_tighter_rtol_for_it(monkeypatch, capsys):
    """A cell whose seeds no companion could bound (certificate NaN) is named with the store's reason, not
    told to tighten rtol, which does not move stability-limited steps; a certificate above the bound is."""
    from attnflow import status as status_module

    reason = "1 of 1 seeds uncertified: steps did not follow the tolerance (stability-limited)"
    monkeypatch.setattr(status_module, "uncertified", lambda sweep, bound: {
        "superadditivity": {"a": (float("nan"), reason), "b": (3e-3, "energy")}})

    class Sweep:
        def name_of(self, cid, name):
            return f"{name} (cell {cid})"

    status_module._print_uncertified(Sweep(), 1e-4)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"uncertified superadditivity (cell a): {reason}")
    assert "tighten" not in lines[0]
    assert "certificate_error 0.003 > 0.0001" in lines[1] and "error of energy" in lines[1]
    assert "tighten rtol" in lines[1]


def test_a_figure_counts_the_cells_no_companion_could_bound_and_claims_no_more_than_it_has():
    import xarray as xr

    line = certificate_line(xr.Dataset(attrs={"certificate_error": 2e-6, "certificate_uncertified": 4}))
    assert "every certified seed" in line and "every seed" not in line
    assert "4 cells with a seed no companion run could bound" in line
    assert "every seed (" in certificate_line(xr.Dataset(attrs={"certificate_error": 2e-6}))
