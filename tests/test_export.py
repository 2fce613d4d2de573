"""``attnflow export`` on a finished tiny run: one row per grid line, measured against closed form."""

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from attnflow import theory
from attnflow.cli import main as attnflow_main
from attnflow.experiments import NoExport, registry
from attnflow.store import open_verified
from attnflow.tables import crossings, crossings_beyond, first_crossing, slope_interval

pytestmark = pytest.mark.workflow


def _summary(results, name):
    return open_verified(results / "summaries" / f"{name}.zarr.zip").load()


def _export(tmp_path, config, name) -> tuple[pd.DataFrame, dict]:
    csv, js = tmp_path / f"{name}.csv", tmp_path / f"{name}.json"
    args = ["export", name, "--configfile", str(config), "--csv", str(csv), "--json", str(js)]
    assert attnflow_main(args) == 0
    return pd.read_csv(csv), json.loads(js.read_text())


def test_beta_star_rows_are_grid_lines_with_the_closed_form(tiny_run, tmp_path):
    _, config, results = tiny_run
    df, doc = _export(tmp_path, config, "beta_star")
    summary = _summary(results, "beta_star")
    assert len(df) == np.prod([summary.sizes[a] for a in ("attention", "H", "heads", "n")])
    assert doc["experiment"] == "beta_star" and doc["theorem"] == "Thm 19" and len(doc["rows"]) == len(df)
    assert set(doc["columns"]) == set(df.columns) and all(c["description"] for c in doc["columns"].values())
    seeds = summary.sizes["seed"]
    for _, row in df.iterrows():
        line = {k: row[k] for k in ("attention", "H", "heads", "n")}
        assert row.beta_star_closed == pytest.approx(float(theory.beta_star(row.H, row.n)), rel=1e-9)
        assert row.seeds == seeds
        for prop in ("mono", "rd"):
            # The estimate is derive's mean over the seeds on the grid (its own route: grid_threshold and
            # t_interval); the counts are its fractions of the seeds.
            mean = float(summary[f"beta_{prop}_mean"].sel(line))
            np.testing.assert_allclose(row[f"beta_{prop}"], mean, rtol=1e-12)
            below, above = (round(float(summary[f"beta_{prop}_{side}_grid"].sel(line)) * seeds)
                            for side in ("below", "above"))
            assert (row[f"beta_{prop}_below_grid"], row[f"beta_{prop}_above_grid"]) == (below, above)
            assert row[f"beta_{prop}_seeds"] == seeds - below - above
            assert row[f"beta_{prop}_seeds"] == int(summary[f"beta_{prop}"].sel(line).notnull().sum())
            low, high = row[f"beta_{prop}_low"], row[f"beta_{prop}_high"]
            if below:  # censored below the grid: the interval reaches down to 0
                assert low == 0
            assert (high == np.inf) == (above > 0)  # censored above: unbounded
            if np.isfinite(row[f"beta_{prop}"]):
                assert low <= row[f"beta_{prop}"] <= high and low < high


def _beta_star_summary(fails_mono: np.ndarray, beta) -> xr.Dataset:
    """A beta_star summary over one grid line, (seed, beta) failures of monotonicity given (the start
    always inside Radial Dominance), with derive's own quantities."""
    from types import SimpleNamespace

    from attnflow.experiments import registry

    dims = ("seed", "attention", "H", "heads", "n", "beta")
    shape = (fails_mono.shape[0], 1, 1, 1, 1, len(beta))
    mono = (1 - fails_mono).reshape(shape).astype(float)
    summary = xr.Dataset(
        {"mono_path": (dims, mono), "mono_t0": (dims, np.ones(shape)), "rd_t0": (dims, np.ones(shape)),
         "time_rd": (dims, np.ones(shape))},
        coords={"seed": np.arange(shape[0]), "attention": ["softmax"], "H": [2], "heads": ["scalar"],
                "n": [4], "beta": np.asarray(beta, float)})
    exp = registry().get("beta_star")
    summary = exp.derive(summary, SimpleNamespace(fixed={"lambda_bar": 1.0}))
    return exp.export_table(summary).iloc[0]


def test_censored_threshold_interval_reaches_past_the_grid():
    """Issue 39's row: 13 of 16 seeds fail already at the smallest beta, 3 between 0.25 and 0.5. The mean
    over the 3 is sqrt(0.25 * 0.5) = 0.354 with zero spread; the interval must say that the threshold
    may be anywhere from 0 to 0.5, and the counts that the estimate is over 3 seeds of 16."""
    beta = [0.25, 0.5, 1.0, 2.0]
    fails = np.ones((16, 4))
    fails[13:, 0] = 0  # three seeds hold at 0.25 and fail from 0.5 on
    row = _beta_star_summary(fails, beta)
    assert row.beta_mono == pytest.approx(np.sqrt(0.25 * 0.5), rel=1e-12)
    assert (row.beta_mono_low, row.beta_mono_high) == (0.0, 0.5)
    counts = (row.beta_mono_seeds, row.beta_mono_below_grid, row.beta_mono_above_grid, row.seeds)
    assert counts == (3, 13, 0, 16)
    # Never failing: above the grid, an interval unbounded above, no estimate.
    row = _beta_star_summary(np.zeros((4, 4)), beta)
    assert np.isnan(row.beta_mono) and (row.beta_mono_low, row.beta_mono_high) == (2.0, np.inf)
    assert (row.beta_mono_seeds, row.beta_mono_above_grid) == (0, 4)


def test_threshold_interval_keeps_the_grid_resolution():
    """Seeds agreeing on a bracket give its two ends, never a zero-width interval; seeds spread over
    brackets give the Student-t interval of the bracket ends, computed here by hand."""
    from scipy import stats

    beta = [0.25, 0.5, 1.0, 2.0]
    fails = np.ones((3, 4))
    fails[:, 0] = 0
    row = _beta_star_summary(fails, beta)
    assert (row.beta_mono_low, row.beta_mono_high) == (0.25, 0.5) and row.beta_mono_seeds == 3
    fails = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]], float)
    row = _beta_star_summary(fails, beta)
    lows, highs = np.array([0.25, 0.5, 1.0, 0.5]), np.array([0.5, 1.0, 2.0, 1.0])
    t = stats.t.ppf(0.975, 3)
    assert row.beta_mono == pytest.approx(np.mean(np.sqrt(lows * highs)), rel=1e-12)
    assert row.beta_mono_low == pytest.approx(max(lows.mean() - t * lows.std(ddof=1) / 2, 0.0), rel=1e-12)
    assert row.beta_mono_high == pytest.approx(highs.mean() + t * highs.std(ddof=1) / 2, rel=1e-12)
    # A seed not computed at some beta (NaN) brackets between its computed neighbours.
    fails = np.array([[0, np.nan, 1, 1]])
    row = _beta_star_summary(fails, beta)
    assert (row.beta_mono_low, row.beta_mono_high, row.seeds) == (0.25, 1.0, 1)


def test_csv_has_a_csvw_sidecar_with_units_and_provenance(tiny_run, tmp_path):
    _, config, _ = tiny_run
    csv = tmp_path / "out" / "beta_star.csv"
    assert attnflow_main(["export", "beta_star", "--configfile", str(config), "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    meta = json.loads((tmp_path / "out" / "beta_star.csv-metadata.json").read_text())
    assert meta["@context"] == "http://www.w3.org/ns/csvw" and meta["url"] == "beta_star.csv"
    columns = meta["tableSchema"]["columns"]
    assert [c["name"] for c in columns] == list(df.columns)
    for column in columns:
        assert column["dc:description"], column["name"]
        if column["datatype"] in ("double", "integer"):
            assert column["schema:unitText"], column["name"]
    assert {c["name"]: c["datatype"] for c in columns}["attention"] == "string"
    provenance = meta["dc:provenance"]
    assert provenance["experiment"] == "beta_star" and provenance["theorem"] == "Thm 19"
    assert provenance["config_sha256"] and provenance["numerics_version"] and provenance["attnflow_version"]
    assert provenance["engines"] == "numba: 4"  # which engine computed the cells (beta_star's 4)


def test_stdout_for_dash(tiny_run, tmp_path, monkeypatch, capsys):
    _, config, _ = tiny_run
    monkeypatch.chdir(tmp_path)
    assert attnflow_main(["export", "beta_star", "--configfile", str(config), "--csv", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("attention,H,heads,n,") and not (tmp_path / "-").exists()
    assert attnflow_main(["export", "beta_star", "--configfile", str(config), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["experiment"] == "beta_star" and not list(tmp_path.iterdir())
    assert doc["columns"]["beta_mono"]["units"] == "1"


@pytest.mark.parametrize("option, path, says", [
    ("--csv", "{tmp}", "is a directory"),
    ("--json", "/proc/version", "cannot write"),
    ("--csv", "{tmp}/afile/table.csv", "is not a directory"),
    ("--csv", "{tmp}/x", "same destination"),
])
def test_export_paths_are_checked_before_anything_is_computed(tmp_path, monkeypatch, capsys, option, path,
                                                              says):
    import attnflow.export

    def computed(*args, **kwargs):
        raise AssertionError("the export was computed before its destination was checked")

    monkeypatch.setattr(attnflow.export, "export", computed)
    (tmp_path / "afile").write_text("")
    path = path.format(tmp=tmp_path)
    extra = ["--json", path] if says == "same destination" else []
    assert attnflow_main(["export", "beta_star", option, path, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnflow export: ") and says in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_superadditivity_boundary_brackets_the_crossing(tiny_run, tmp_path):
    _, config, results = tiny_run
    df, doc = _export(tmp_path, config, "superadditivity")
    summary = _summary(results, "superadditivity")
    assert len(df) == summary.sizes["init"] * summary.sizes["spread"] * summary.sizes["beta"]
    for _, row in df.iterrows():
        ratio = summary.ratio.sel(init=row.init, spread=row.spread, beta=row.beta).sortby("lambda_bar")
        assert row.lambda_c_closed == pytest.approx(float(theory.lambda_c(row.beta, 6)))
        if np.isnan(row.lambda_cross):  # no crossing: the ratio keeps its side of 1 on the grid
            assert (np.sign(np.log(ratio.values)) == np.sign(np.log(ratio.values[0]))).all()
            continue
        low, high = (float(np.log(ratio.sel(lambda_bar=v))) for v in (row.lambda_cross_low,
                                                                        row.lambda_cross_high))
        assert low * high <= 0 and row.lambda_cross_low < row.lambda_cross < row.lambda_cross_high
    # on equiangular starts the particles' crossing is the closed form's (tiny: rtol 1e-10)
    eq = df[df.init == "equiangular"]
    np.testing.assert_allclose(eq.lambda_cross, eq.lambda_cross_closed)
    assert eq.lambda_cross.notna().any()


def test_clustering_probability_and_time(tiny_run, tmp_path):
    _, config, results = tiny_run
    df, _ = _export(tmp_path, config, "clustering_probability")
    summary = _summary(results, "clustering_probability")
    columns = ("H", "spread", "d", "beta")
    assert len(df) == np.prod([summary.sizes[k] for k in columns])
    for _, row in df.iterrows():
        sel = {k: row[k] for k in columns}
        assert row.t_closed == pytest.approx(float(summary.t_closed.sel(sel)))
        assert row.median_over_closed == pytest.approx(row.t_median / row.t_closed, nan_ok=True)
        if np.isfinite(row.t_half):  # half the runs clustered within the band's bracket
            assert row.t_half_low <= row.t_half <= np.nan_to_num(row.t_half_high, nan=np.inf)
            p = summary.probability.sel(sel)  # a step in t: below 1/2 before the midpoint, not after
            before, after = (float(p.sel(time=row.t_half, method=m)) for m in ("pad", "backfill"))
            assert before < 0.5 <= after

    df, doc = _export(tmp_path, config, "clustering_time")
    summary = _summary(results, "clustering_time")
    fits = df[df.fit == "log T ~ p log n (all n)"]
    assert len(fits) == summary.sizes["attention"] * summary.sizes["d"] * summary.sizes["cluster_threshold"]
    for _, row in fits.iterrows():  # the same fit as the summary's (and the figure's)
        sel = {"attention": row.attention, "d": row.d, "cluster_threshold": row.cluster_threshold}
        assert row.measured == pytest.approx(float(summary.exponent_n_all.sel(sel)), rel=1e-9)
        assert row.bound == 1.0
    slopes = df[df.fit == "T ~ s log d"]
    for _, row in slopes.iterrows():
        sel = {"attention": row.attention, "n": row.n, "cluster_threshold": row.cluster_threshold}
        assert row.measured == pytest.approx(float(summary.log_d_slope.sel(sel)), rel=1e-9)
    assert set(doc["columns"]) == set(df.columns)


def test_experiments_without_a_table_say_so(tiny_run, capsys):
    _, config, results = tiny_run
    assert attnflow_main(["export", "energy", "--configfile", str(config)]) == 2
    assert "experiment energy declares no export" in capsys.readouterr().err
    with pytest.raises(NoExport, match="entropy declares no export"):
        registry().get("entropy").export_table(_summary(results, "entropy"))
    assert attnflow_main(["export", "nope", "--configfile", str(config)]) == 2
    assert "unknown" in capsys.readouterr().err  # a config's experiment_modules may add experiments


def test_declared_exports():
    """The experiments with thresholds, boundaries or exponents each declare a table."""
    from attnflow.experiments import Experiment

    declared = {e.name for e in registry() if type(e).export_table is not Experiment.export_table}
    assert {"beta_star", "superadditivity", "clustering_time", "clustering_probability",
            "trained_heads", "crossover", "metastability", "orthogonality", "variants", "scaling"} <= declared


def test_helpers():
    assert first_crossing([0.1, 0.4, 0.7, 0.2], [1, 2, 4, 8], 0.5) == (pytest.approx(np.sqrt(8)), 2, 4)
    assert all(np.isnan(first_crossing([0.1, 0.2], [1, 2], 0.5)))
    field = xr.DataArray([[0.0, 1.0], [0.0, 0.2]], dims=("k", "x"), coords={"x": [1.0, 4.0]})
    mid, low, high = crossings(field, "x", 0.5)
    assert float(mid[0]) == pytest.approx(2.0) and np.isnan(float(mid[1]))
    # Lines that never cross: beyond the grid on the side the stated direction puts the crossing.
    field = xr.DataArray([[0.9, 0.8], [0.3, 0.1], [0.9, 0.1]], dims=("k", "x"), coords={"x": [1.0, 4.0]})
    mid, low, high = crossings_beyond(field, "x", 0.5, falling=True)
    assert np.isnan(mid[:2]).all() and float(mid[2]) == pytest.approx(2.0)
    assert low.values.tolist() == [4.0, 0.0, 1.0] and high.values.tolist() == [np.inf, 1.0, 4.0]
    mid, low, high = crossings_beyond(field, "x", 0.5, falling=False)  # rising: the other way round
    assert low.values.tolist()[:2] == [0.0, 4.0] and high.values.tolist()[:2] == [1.0, np.inf]
    x = np.arange(6.0)
    slope, lo, hi = slope_interval(x, 2 * x + 1 + 0.01 * np.sin(7 * x))
    assert lo < slope < hi and slope == pytest.approx(2.0, abs=0.01)


def test_trained_heads_table_from_a_synthetic_summary():
    """trained_heads needs the MiniLM weights to run; its table is checked on a summary of known numbers."""
    beta = [1.0, 4.0, 16.0]
    # mono_path per (seed, layer, heads, beta): seed s of layer 0 fails from beta index s + 1 on.
    mono = np.ones((3, 2, 2, 3))
    mono[0, 0, 0, 1:] = 0
    mono[1, 0, 0, 2:] = 0
    mono[2, 0, 0, 2:] = 0
    summary = xr.Dataset(
        {"mono_path": (("seed", "layer", "heads", "beta"), mono),
         "beta_mono_below_grid": (("layer", "heads"), np.zeros((2, 2))),
         "beta_mono_above_grid": (("layer", "heads"), np.array([[0.0, 1.0], [1.0, 1.0]])),
         "principal_angle": (("layer", "angle"), [[60.0, 80.0, 85.0], [70.0, 75.0, 89.0]]),
         "cross_norm": (("layer", "pair"), [[0.1, 0.3], [0.2, 0.05]])},
        coords={"seed": [0, 1, 2], "layer": [0, 5], "heads": ["trained", "trained_orthogonal"], "beta": beta})
    df = registry().get("trained_heads").export_table(summary)
    assert len(df) == 4 and list(df.columns[:2]) == ["layer", "heads"]
    row = df[(df.layer == 0) & (df.heads == "trained")].iloc[0]
    seeds = [np.sqrt(1 * 4), np.sqrt(4 * 16), np.sqrt(4 * 16)]
    assert row.beta_mono == pytest.approx(np.mean(seeds))
    assert row.beta_mono_low < row.beta_mono < row.beta_mono_high
    assert np.isnan(row.beta_mono_orthogonal)  # the idealisation never fails on this grid
    assert row.principal_angle_median == 80.0 and row.cross_norm_max == 0.3
    assert (row.seeds, row.beta_mono_seeds, row.beta_mono_above_grid) == (3, 3, 0)
    assert df[(df.layer == 0) & (df.heads == "trained_orthogonal")].iloc[0].beta_mono_above_grid == 3


def test_metastability_table_is_the_fit_per_grid_line():
    """Plateaus growing like e^{1.5 beta} (H = 1) and like beta^2 (H = 2), through the experiment's own
    derive: the table gives each line's rate and exponent with intervals around the truth."""
    rng = np.random.default_rng(5)
    beta = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    seeds, times = 16, np.array([0.0, 1.0, 10.0])
    noise = np.exp(0.2 * rng.standard_normal((2, 1, beta.size, seeds)))
    truth = np.stack([np.exp(1.5 * beta), beta**2])[:, None, :, None]
    summary = xr.Dataset(
        {"cluster_count": (("H", "d", "beta", "seed", "time"), np.full((2, 1, beta.size, seeds, 3), 2.0)),
         "plateau": (("H", "d", "beta", "seed"), truth * noise),
         "plateau_censored": (("H", "d", "beta", "seed"), np.zeros((2, 1, beta.size, seeds))),
         "plateau_count": (("H", "d", "beta", "seed"), np.full((2, 1, beta.size, seeds), 2.0))},
        coords={"H": [1, 2], "d": [2], "beta": beta, "seed": np.arange(seeds), "time": times})
    exp = registry().get("metastability")
    df = exp.export_table(exp.derive(summary, spec=None))
    assert len(df) == 2 and list(df.columns[:2]) == ["H", "d"]
    exponential, power = df.iloc[0], df.iloc[1]
    assert exponential.rate_low < 1.5 < exponential.rate_high
    assert exponential.verdict == "looks exponential in beta"
    assert power.power_low < 2.0 < power.power_high
    assert power.verdict == "looks like a power of beta"
    assert (df.seeds == seeds).all()


def test_crossover_table_brackets_the_closed_form_crossing():
    """Equiangular particles on the closed-form ratio, uniform starts at twice it, through derive: the
    equiangular lines' bracket holds the closed-form crossing beta, the uniform lines' does not."""
    from types import SimpleNamespace

    exp = registry().get("crossover")
    fixed = exp.defaults["fixed"]
    beta, levels = np.array([0.5, 1.0, 2.0, 4.0, 8.0]), np.array([0.5, 0.9, 0.99, 0.999])
    closed = theory.time_ratio(1 / np.sqrt(fixed["d"]), levels[None, :], [fixed["lambda_bar"]],
                               beta[:, None], fixed["n"])
    t = np.ones((2, 2, beta.size, levels.size, 2))  # (attention, init, beta, level, seed)
    t[1, 0] = closed[..., None]  # relu, equiangular: T_relu / T_softmax is the closed form
    t[1, 1] = 2 * closed[..., None]  # relu, uniform: twice it
    dims = ("attention", "init", "beta", "cluster_threshold", "seed")
    summary = xr.Dataset(
        {"t_cluster": (dims, t), "frozen": (dims, np.zeros_like(t)),
         "clusters_end": (dims, np.full(t.shape, np.nan))},
        coords={"attention": ["softmax", "relu"], "init": ["equiangular_typical", "uniform"], "beta": beta,
                "cluster_threshold": levels, "seed": [0, 1]})
    df = exp.export_table(exp.derive(summary, SimpleNamespace(fixed=fixed)))
    assert len(df) == 2 * levels.size
    for _, row in df.iterrows():
        column = list(levels).index(row.cluster_threshold)
        ratio = np.log(closed[:, column]) + (row.init == "uniform") * np.log(2)
        below, above = (float(np.interp(np.log(b), np.log(beta), ratio)) for b in (row.beta_cross_low,
                                                                                   row.beta_cross_high))
        assert below > 0 > above  # relu faster (ratio < 1) above the bracket
        assert row.beta_cross_closed == pytest.approx(theory.crossover_beta(
            1 / np.sqrt(fixed["d"]), row.cluster_threshold, [fixed["lambda_bar"]], fixed["n"]))
    eq = df[df.init == "equiangular_typical"]
    assert (eq.beta_cross_low <= eq.beta_cross_closed).all()
    assert (eq.beta_cross_closed <= eq.beta_cross_high).all()
    assert (eq.max_rel_error < 1e-12).all() and df[df.init == "uniform"].max_rel_error.isna().all()
    assert (df.relu_frozen_max == 0).all() and (df.seeds == 2).all()


def test_orthogonality_table_is_per_geometry_and_beta(tiny_run, tmp_path):
    _, config, results = tiny_run
    df, doc = _export(tmp_path, config, "orthogonality")
    summary = _summary(results, "orthogonality")
    # beta fixed in the tiny config: one line per geometry the rates are evaluated in
    assert sorted(df.geometry) == ["flat", "sphere"] and (df.beta == 1.0).all()
    assert set(doc["columns"]) == set(df.columns)  # the grid line's own columns described too
    for _, row in df.iterrows():
        kept = summary.monotone.sel(geometry=row.geometry, delta=summary.delta.max())
        assert row.survival_delta_max == pytest.approx(float(kept.mean()), nan_ok=True)
        if np.isfinite(row.survival_delta_max):  # the sufficient condition never claims a lost configuration
            assert row.certified_delta_min <= 1.0 and row.survival_delta_max >= 0.0
    assert df[df.geometry == "flat"].base_share.tolist() == [1.0]  # orthogonal heads: flat monotone (Thm 16)


def test_variants_table_from_a_synthetic_summary():
    """Per variant: the gradient-flow flag from the declarations, and how far along beta every run keeps
    every head monotone, on shares of known values."""
    from attnflow.experiments import Spec

    exp = registry().get("variants")
    grid = {"heads": ["scalar"], "attention": ["softmax", "usa"], "mask": ["none", "causal"],
            "beta": [0.5, 1.0, 2.0, 4.0]}
    shares = np.ones((1, 2, 2, 4))
    shares[0, 0, 0] = [1.0, 1.0, 0.5, 1.0]  # softmax, unmasked: all runs monotone up to beta = 1
    shares[0, 1, 1] = [0.9, 1.0, 1.0, 1.0]  # usa, causal: not even at the smallest beta
    dims = ("heads", "attention", "mask", "beta")
    summary = xr.Dataset(
        {"frac_heads_monotone": (dims, shares), "frac_total_monotone": (dims, shares),
         "energy_residual": (dims, np.full(shares.shape, 1e-13))},
        coords=grid, attrs={"experiment": "variants",
                            "experiment_spec": Spec("variants", exp.defaults["fixed"], grid, ()).to_json()})
    df = exp.export_table(summary).set_index(["attention", "mask"])
    assert df.loc[("usa", "none"), "gradient_flow"] == 1 and df.loc[("usa", "causal"), "gradient_flow"] == 0
    assert df.loc[("softmax", "none"), "gradient_flow"] == 0
    assert df.loc[("softmax", "none"), "beta_heads_all"] == 1.0
    assert df.loc[("softmax", "causal"), "beta_heads_all"] == 4.0
    assert np.isnan(df.loc[("usa", "causal"), "beta_heads_all"])
    assert df.loc[("softmax", "none"), "frac_heads_monotone_min"] == 0.5
    assert (df.seeds == exp.defaults["fixed"].get("seeds", 1)).all()


def test_t_interval_of_lines_without_values_is_nan_and_silent():
    # A grid line where no seed has a threshold on the grid: NaN, not a numpy warning in the export.
    import warnings

    from attnflow.experiments._common import t_interval

    values = np.array([[np.nan, np.nan, np.nan], [1.0, np.nan, np.nan], [1.0, 2.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, half = t_interval(values)
    assert np.isnan(mean[0]) and np.isnan(half[0]) and mean[1] == 1.0 and np.isnan(half[1])
    # Two or more values: mean and the Student-t half-width t_{0.975, k-1} s / sqrt(k), from scipy.stats
    from scipy import stats

    assert mean[2] == 2.0 and half[2] == pytest.approx(stats.t.ppf(0.975, 2) * 1.0 / np.sqrt(3), rel=1e-12)
