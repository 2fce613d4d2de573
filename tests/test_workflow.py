"""End-to-end runs of the Snakemake workflow on a tiny config; checks the summaries' numbers."""

import numpy as np
import pytest
import xarray as xr
import yaml
from sweep_helpers import planned, run, write_config

from attnflow import theory
from attnflow.cli import main as attnflow_main

pytestmark = pytest.mark.workflow


def test_summaries_match_closed_forms(tiny_run):
    tmp, _, results = tiny_run
    summaries = results / "summaries"
    energy = xr.open_zarr(summaries / "energy.zarr").load()
    # Thm 11 for usa holds to round-off, flat and sphere.
    assert float(energy.thm11_residual.max()) < 1e-12
    beta = xr.open_zarr(summaries / "beta_star.zarr").load()
    # The orthogonal-token bisection reproduces the closed form (bisection tol 1e-12).
    np.testing.assert_allclose(beta.beta_orthogonal, beta.beta_star_closed, rtol=1e-9)
    assert beta.beta_star_closed.sel(H=2, n=6) == pytest.approx(float(theory.beta_star(2, 6)))
    sup = xr.open_zarr(summaries / "superadditivity.zarr").load()
    # Exact velocity at equiangular t=0 vs sum phi: both are round-off accurate.
    np.testing.assert_allclose(sup.early_rate, sup.early_rate_theory, rtol=1e-10)
    # Fitted late rate vs 2 Lambda: fit over eps in (1e-10, 1e-3), O(eps) bias.
    np.testing.assert_allclose(sup.late_rate, sup.late_rate_theory, rtol=2e-3)
    ent = xr.open_zarr(summaries / "entropy.zarr").load()
    np.testing.assert_allclose(ent.entropy.isel(time=-1), np.log(6), atol=1e-6)
    assert float(ent.min_entropy_step.min()) > -1e-12  # non-decreasing
    # Thm 27: the exact rate, integrated by Simpson's rule (O(dt^4), dt = 0.1 here:
    # ~1e-4 relative), reproduces the entropy change; a wrong factor gives O(1).
    assert float(ent.thm27_residual.max()) < 1e-3
    ct = xr.open_zarr(summaries / "clustering_time.zarr").load()
    finite = ct.t_cluster.values[np.isfinite(ct.t_cluster.values)]
    assert np.all(finite > 0) and np.all(finite <= 30.0)
    for ext in ("png", "pdf"):
        for name in ("energy", "beta_star", "superadditivity", "clustering_time", "entropy",
                     "orthogonality"):
            assert (results / "figures" / f"{name}.{ext}").stat().st_size > 1000


def test_provenance_of_stores_summaries_and_figures(tiny_run, capsys):
    tmp, config, results = tiny_run
    stores = sorted((results / "simulations").glob("*.zarr"))
    ds = xr.open_zarr(stores[0])
    # Every cell field in the attrs; the creating experiment's grid axes as coordinates.
    for field in ("H", "n", "d", "beta", "attention", "heads", "init", "geometry", "seeds"):
        assert f"cell_{field}" in ds.attrs
    grid = yaml.safe_load(config.read_text())["experiments"][ds.attrs["experiment"]]["grid"]
    for axis in grid:
        assert ds[axis].item() == ds.attrs[f"cell_{axis}"]
    for key in ("attnflow_version", "config_sha256", "experiment", "cell_id", "cell_seeds"):
        assert key in ds.attrs
    assert list(ds.seed.values) == ds.attrs["cell_seeds"]
    summary = xr.open_zarr(results / "summaries" / "beta_star.zarr")
    assert summary.attrs["config_sha256"] == ds.attrs["config_sha256"]
    assert summary.attrs["n_missing_cells"] == 0 and "experiment_config" in summary.attrs
    from PIL import Image

    meta = Image.open(results / "figures" / "beta_star.png").text["Description"]
    assert ds.attrs["config_sha256"] in meta and "beta_star.zarr" in meta
    # attnflow status: every cell done.
    assert attnflow_main(["status", "--configfile", str(config), "--json"]) == 0
    report = __import__("json").loads(capsys.readouterr().out)
    assert all(not r["missing"] and not r["failed"] and r["done"] for r in report.values())


def test_report_builds(tiny_run):
    tmp, config, _ = tiny_run
    run(tmp, config, "--report", str(tmp / "report.html"))
    html = (tmp / "report.html").read_text()
    assert "Radial Dominance" in html or len(html) > 100_000


def test_rerun_is_noop_and_new_values_run_only_their_jobs(tiny_run):
    tmp, config, _ = tiny_run
    assert planned(tmp, config) == {}
    # One more beta: beta_star batches over beta, so its one batch reruns (computing
    # only the new cell), then its summary and figure; nothing else.
    more_beta = write_config(tmp, "beta.yaml", **{"experiments.beta_star.grid.beta": [0.5, 2.0, 8.0]})
    assert planned(tmp, more_beta) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    # One more n in clustering_time: exactly one new cell, one new job.
    more_n = write_config(tmp, "n.yaml", **{"experiments.clustering_time.grid.n": [4, 8, 16]})
    assert planned(tmp, more_n) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}


@pytest.mark.parametrize(
    "edits, key",
    [
        ({"experiments.energy.fixed.H": "two"}, "H"),
        ({"experiments.energy.fixed.temperature": 1.0}, "temperature"),
        ({"experiments.beta_star.grid.beta": []}, "beta"),
        ({"experiments.beta_star.fixed.d": 5}, "Cell.d"),
        ({"experiments.energy.fixed.beta": -1.0}, "Cell.beta"),
        ({"experiments.energy.fixed.init": "orthogonal"}, "Cell.d"),
    ],
)
def test_malformed_config_stops_before_any_job(tmp_path, edits, key):
    config = write_config(tmp_path, **edits)
    proc = run(tmp_path, config, check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
