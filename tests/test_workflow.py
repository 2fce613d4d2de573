"""End-to-end runs of the Snakemake workflow on a tiny config; checks the summaries' numbers."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from attnflow import theory

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
             "--directory", str(ROOT), "--cores", "2"]
pytestmark = pytest.mark.workflow


def _config(tmp_path, **edits):
    text = (ROOT / "tests" / "config_tiny.yaml").read_text()
    cfg = yaml.safe_load(text.replace("RESULTS_DIR", str(tmp_path / "results")))
    for path, value in edits.items():
        node = cfg
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    out = tmp_path / "config.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def _run(config, *extra, check=True):
    proc = subprocess.run([*SNAKEMAKE, "--configfile", str(config), *extra],
                          capture_output=True, text=True, env={**os.environ})
    if check and proc.returncode:
        raise AssertionError(proc.stdout[-4000:] + proc.stderr[-4000:])
    return proc


def _planned(config):
    out = _run(config, "-n", "--quiet", "rules").stdout
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M))
    return {k: int(v) for k, v in counts.items() if k != "total"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    config = _config(tmp)
    _run(config)
    return tmp, config


def test_summaries_match_closed_forms(finished):
    tmp, _ = finished
    summaries = tmp / "results" / "summaries"
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
    ct = xr.open_zarr(summaries / "clustering_time.zarr").load()
    finite = ct.t_cluster.values[np.isfinite(ct.t_cluster.values)]
    assert np.all(finite > 0) and np.all(finite <= 30.0)
    for ext in ("png", "pdf"):
        for name in ("energy", "beta_star", "superadditivity", "clustering_time", "entropy",
                     "orthogonality"):
            assert (tmp / "results" / "figures" / f"{name}.{ext}").stat().st_size > 1000


def test_stores_carry_parameters(finished):
    tmp, _ = finished
    stores = sorted((tmp / "results" / "simulations").glob("*.zarr"))
    ds = xr.open_zarr(stores[0])
    for field in ("H", "n", "d", "beta", "attention", "heads", "init", "geometry"):
        assert field in ds.coords and f"cell_{field}" in ds.attrs
    assert "attnflow_version" in ds.attrs and ds.seed.size >= 1


def test_rerun_is_noop_and_new_values_run_only_their_jobs(finished):
    tmp, config = finished
    assert _planned(config) == {}
    # One more beta: beta_star batches over beta, so its one batch reruns (computing
    # only the new cell), then its summary and figure; nothing else.
    more_beta = _config(tmp, **{"experiments.beta_star.grid.beta": [0.5, 2.0, 8.0]})
    assert _planned(more_beta) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}
    # One more n in clustering_time: exactly one new cell, one new job.
    more_n = _config(tmp, **{"experiments.clustering_time.grid.n": [4, 8, 16]})
    assert _planned(more_n) == {"simulate": 1, "aggregate": 1, "plot": 1, "all": 1}


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
    config = _config(tmp_path, **edits)
    proc = _run(config, check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
