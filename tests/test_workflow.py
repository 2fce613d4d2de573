"""End-to-end runs of the Snakemake workflow on the tiny config; checks the summaries' numbers."""

import itertools
import json
import os
import re
import struct
import zipfile

import numpy as np
import pytest
from sweep_helpers import beta_star_config, dry_run, jobs_of, planned, run, snapshot, write_config

from attnflow import jobparams, theory
from attnflow.cli import main as attnflow_main
from attnflow.config import load, validate
from attnflow.experiments.superadditivity import linear_strengths
from attnflow.layout import Layout
from attnflow.run.jobs import batch_params
from attnflow.run.stored import stored_cells
from attnflow.store import RECORD, open_verified, record_of

pytestmark = pytest.mark.workflow


def _summary(results, name):
    return open_verified(results / "summaries" / f"{name}.zarr.zip").load()


def test_summaries_match_closed_forms(tiny_run):
    _, config, results = tiny_run
    energy = _summary(results, "energy")
    # Thm 11 for usa holds to round-off, flat and sphere.
    assert float(energy.thm11_residual.max()) < 1e-12

    beta = _summary(results, "beta_star")
    # The orthogonal-token bisection reproduces the closed form (bisection tol 1e-12),
    # on the measurement's own (H, n) grid.
    np.testing.assert_allclose(beta.beta_orthogonal, beta.beta_star_closed, rtol=1e-9)
    for n in beta.n.values:
        assert float(beta.beta_star_closed.sel(H=2, n=n)) == pytest.approx(float(theory.beta_star(2, n)))
    assert set(beta.frac_mono_path.dims) == {"attention", "H", "heads", "n", "beta"}
    assert ((beta.frac_time_rd >= 0) & (beta.frac_time_rd <= 1)).all()

    sup = _summary(results, "superadditivity")
    # Equiangular particles against the closed-form time integral: the crossing is
    # located on the dense output at rtol 1e-10 (~1e-8 relative on each time).
    eq = sup.sel(init="equiangular")
    np.testing.assert_allclose(eq.ratio.transpose(*eq.ratio_closed.dims), eq.ratio_closed, rtol=1e-6)
    lam = linear_strengths(sup.lambda_bar.values, 0.6, 2)  # (lambda_bar, H)
    np.testing.assert_array_equal(sup.early_sign.sel(spread=0.6).transpose("lambda_bar", "beta").values,
                                  theory.early_sign(lam[:, None, :], sup.beta.values[None, :], 6))
    np.testing.assert_allclose(sup.lambda_c, theory.lambda_c(sup.beta.values, 6))

    ct = _summary(results, "clustering_time")
    # Particles on equiangular tokens against the closed-form integral (rtol 1e-10).
    assert float(np.abs(ct.rel_error).max()) < 1e-6
    assert ct.t_closed.dims == ("attention", "n", "d", "cluster_threshold")
    # The closed-form map, point by point from attnflow.theory (one scalar call per grid point).
    for att, n, d, level in itertools.product(*(ct[k].values for k in ct.t_closed.dims)):
        point = {"attention": att, "n": n, "d": d, "cluster_threshold": level}
        expected = theory.equiangular_time(1 / np.sqrt(d), level, [1.0], 1.0, n, str(att))
        assert float(ct.t_closed.sel(point)) == pytest.approx(float(expected), rel=1e-12)
        if att == "softmax":
            drive = theory.equiangular_rate(1 / np.sqrt(d), [1.0], 1.0, n)
            assert float(ct.t_bound.sel(point)) == pytest.approx((level - 1 / np.sqrt(d)) / drive, rel=1e-12)

    cp = _summary(results, "clustering_probability")
    p = cp.probability.transpose(..., "time").values
    assert np.all((p >= 0) & (p <= 1)) and np.all(np.diff(p, axis=-1) >= 0)  # non-decreasing in t
    low, high = (cp[k].transpose(..., "time").values for k in ("probability_low", "probability_high"))
    assert np.all(low <= p + 1e-12) and np.all(p <= high + 1e-12)
    # From the mean cosine the runs' starts have (the stored t = 0 samples), one head of strength 1.
    gamma0 = float(cp.gamma_start.mean())
    expected = theory.equiangular_time(gamma0, 0.99, [1.0], cp.beta.values, 6)
    np.testing.assert_allclose(cp.t_closed.squeeze(), expected, rtol=1e-12)

    ent = _summary(results, "entropy")
    np.testing.assert_allclose(ent.entropy.isel(time=-1), np.log(6), atol=1e-6)
    assert float(ent.min_entropy_step.min()) > -1e-12  # non-decreasing
    # Thm 27: the exact rate, integrated by Simpson's rule (O(dt^4), dt = 0.1 here:
    # ~1e-4 relative), reproduces the entropy change; a wrong factor gives O(1).
    assert float(ent.rate_quadrature_error.max()) < 1e-3

    ran = load(config)["experiments"]
    for ext in ("png", "pdf"):
        for name in ran:
            assert (results / "figures" / f"{name}.{ext}").stat().st_size > 1000, name


def test_provenance_of_stores_summaries_and_figures(tiny_run, capsys):
    tmp, config, results = tiny_run
    stores = sorted((results / "simulations").glob("*.zarr.zip"))
    ds = next(iter(stored_cells(stores[0]).values()))  # one cell of a batch's store, as it was simulated
    for field in ("H", "n", "d", "beta", "attention", "heads", "init", "geometry", "seeds", "observables"):
        assert f"cell_{field}" in ds.attrs
    for key in ("attnflow_version", "config_sha256", "batch", "cell_id", "cell_seeds"):
        assert key in ds.attrs
    assert list(ds.seed.values) == ds.attrs["cell_seeds"]
    record = record_of(stores[0])
    assert record["members"] and ds.attrs["cell_id"] in record["cells"]
    assert record["batch"] == ds.attrs["batch"] == stores[0].name.removesuffix(".zarr.zip")
    summary = open_verified(results / "summaries" / "beta_star.zarr.zip")
    assert summary.attrs["config_sha256"] == ds.attrs["config_sha256"]
    assert summary.attrs["n_missing_cells"] == 0 and "experiment_spec" in summary.attrs
    from PIL import Image

    meta = Image.open(results / "figures" / "beta_star.png").text["Description"]
    assert ds.attrs["config_sha256"] in meta and "beta_star.zarr" in meta
    # attnflow status: every cell done.
    assert attnflow_main(["status", "--configfile", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for states in report.values():
        assert states["done"] and not any(states[s] for s in ("missing", "failed", "corrupt", "interrupted"))


def test_report_builds(tiny_run):
    tmp, config, _ = tiny_run
    run(tmp, config, "--report", str(tmp / "report.html"))
    html = (tmp / "report.html").read_text()
    assert "Radial Dominance" in html or len(html) > 100_000
    # A landing page (workflow/report/workflow.rst), rendered with the run's experiments.
    assert "How to read it" in html and "docs/experiments.md" in html and "toy_margin" in html
    # A label per figure: its experiment and part.
    assert '"labels": {"experiment": "clustering_time", "part": "uniform"}' in html
    assert '"labels": {"experiment": "beta_star", "part": "-"}' in html
    # Each caption once: in the figure's description, not again among the job's parameters.
    from attnflow.experiments import registry

    caption = registry().get("entropy").caption
    assert html.count(caption[:60]) == 1, html.count(caption[:60])
    assert "caption=(the caption above)" in html


def test_rerun_is_noop_and_new_values_run_only_their_jobs(tiny_run):
    tmp, config, _ = tiny_run
    assert planned(tmp, config) == {}
    # One more beta: beta_star batches over beta, so each (H, n) batch reruns (computing
    # only its new cell), then the summary and figure of beta_star, and of toy_margin, whose
    # cells one of those batches owns; nothing else.
    more_beta = write_config(tmp, "beta.yaml", **{"experiments.beta_star.grid.beta": [0.5, 2.0, 8.0]})
    assert planned(tmp, more_beta) == {"simulate": 2, "aggregate": 2, "plot": 2, "all": 1}
    # One more d in clustering_time: batches over n, so two new batches (one per attention); its two
    # figures are drawn again (Experiment.figures: a plot job each).
    more_d = write_config(tmp, "d.yaml", **{"experiments.clustering_time.grid.d": [16, 64, 128]})
    assert planned(tmp, more_d) == {"simulate": 2, "aggregate": 1, "plot": 2, "all": 1}


def test_a_one_value_edit_dry_run_is_short(beta_star_run, tmp_path):
    # Rules pass the digest of a batch's cells, not the cells: the dry run quotes two 16-character digests
    # per batch (the cells' JSON, 2 x 1.2 KB per cell and batch, before).
    import shutil

    # On a copy of the fixture's results (the run after the dry run writes repair tickets there and
    # stores cells, which the session's later users of the fixture must not see), times kept.
    workdir, results = tmp_path, tmp_path / "results"
    shutil.copytree(beta_star_run[2], results)
    # A config in a new file is another config on those results: it says so (share_results), as the user
    # who edits the one config never has to.
    more = beta_star_config(workdir, "one_more_beta.yaml", share_results=True,
                            **{"experiments.beta_star.grid.beta": [0.5, 2.0, 8.0]})
    written = sorted((results / "params").iterdir())
    proc = dry_run(workdir, more, quiet=False)
    # A dry run writes no job parameters (Snakemake compares the digests; only a job reads the file).
    assert sorted((results / "params").iterdir()) == written
    assert jobs_of(proc) == {"ticket": 2, "simulate": 2, "aggregate": 1, "plot": 1, "all": 1}
    printed = proc.stdout + proc.stderr
    # Each batch that gained a cell reruns: its params changed (a digest) and its manifest no longer
    # records all its cells (a repair ticket, a job of the run, which Snakemake names first); no cell's
    # JSON is quoted.
    assert printed.count("rule simulate:") == 2 and '"beta":' not in printed, printed
    # The start-up check says why, in words, once per batch; so does the ticket Snakemake's reasons name:
    # the ticket's job (missing) and the batch's (its input updated by that job).
    assert proc.stderr.count("gained 1 cell (its store holds the other 2): it runs, computing only") == 2
    assert len(re.findall(r"reason: Missing output files: \S+/cells-added-\w+\.ticket$", printed, re.M)) == 2
    assert len(re.findall(r"reason: Input files updated by another job: \S+/cells-added-\w+\.ticket(;|$)",
                          printed, re.M)) == 2
    # As printed for a results folder relative to the working directory, as the shipped configs give it
    # (the fixture's is absolute: a 40-character temporary directory before each of 30 paths); 6.1 KB
    # with the two ticket jobs, which name their ticket's 95-character path five times each.
    assert len(printed.replace(f"{workdir}/", "").encode()) < 7000, printed
    # The run that follows writes the files the new digests name, and its jobs read them: the two simulate
    # jobs store the new cells, the third beta among them (a plain run: its target lists the tickets,
    # without which a working directory with no records of the parameters reruns nothing).
    sweep = validate(load(more))
    run(workdir, more)
    quoted = [json.loads(jobparams.get(Layout(results), batch_params(sweep, batch, write=False)))
              for batch in sweep.batches]
    assert len(quoted) == 2 and all(sorted(c["beta"] for c in cells) == [0.5, 2.0, 8.0] for cells in quoted)
    assert all(len(json.loads(sweep.layout.manifest(b).read_text())["cells"]) == 3 for b in sweep.batches)


def _copy_run(tiny_run, tmp_path):
    import shutil

    src, _, _ = tiny_run
    shutil.copytree(src / "results", tmp_path / "results", symlinks=True)
    return write_config(tmp_path)


def _store_of(results, experiment):
    """The store of a batch of an experiment and the manifest (batch) that records it."""
    for manifest in sorted((results / "manifests").glob(f"{experiment}-*.json")):
        record = json.loads(manifest.read_text())
        assert record["cells"] and record["store"] == f"{record['batch']}.zarr.zip", record
        return results / "simulations" / record["store"], manifest
    raise AssertionError(experiment)


def _experiments_reading(config, store_name):
    from attnflow.config import validate

    sweep = validate(load(config), reach_scheduler=False)
    return {name for name in sweep.points
            if any(path.rsplit("/", 1)[-1] == store_name for _, path, _ in sweep.entries(name))}


def _chunk(store, var):
    """A data chunk (not metadata) of variable ``var`` in a store (the first group holding it)."""
    with zipfile.ZipFile(store) as zf:
        return next(n for n in zf.namelist() if n != RECORD and n.split("/")[-2:-1] == [var]
                    and not n.split("/")[-1].startswith("."))


def _rewrite(store, member, data):
    """The store's zip written again with one member's bytes replaced by ``data`` (None: left out);
    the completion record as it was (so the store no longer matches it)."""
    with zipfile.ZipFile(store) as zf:
        members = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(store, "w", zipfile.ZIP_STORED) as zf:
        for info, old in members:
            if info.filename != member:
                zf.writestr(info, old)
            elif data is not None:
                zf.writestr(info, data)


def _flip_last_byte(store, member):
    """Silent corruption: the last byte of a member flipped in place (the file's size unchanged)."""
    with zipfile.ZipFile(store) as zf:
        info = zf.getinfo(member)
    with open(store, "r+b") as fh:
        fh.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", fh.read(30)[26:30])
        fh.seek(info.header_offset + 30 + name_len + extra_len + info.file_size - 1)
        last = fh.read(1)[0]
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([last ^ 0xFF]))


# One store of a different experiment for each kind of damage: one heal run covers the three (each
# store's batch is planned and recomputed on its own, whatever happens to the others).
DAMAGES = {"beta_star": ("delete", None), "energy": ("truncate-chunk", "energy_rate"),
           "entropy": ("delete-chunk", "entropy")}


def test_damaged_stores_heal_with_a_plain_run(tiny_run, tmp_path):
    config = _copy_run(tiny_run, tmp_path)
    results = tmp_path / "results"
    before = snapshot(results / "simulations")
    damaged = {}  # store -> manifest
    for experiment, (damage, var) in DAMAGES.items():
        store, manifest = _store_of(results, experiment)
        damaged[store] = manifest
        if damage == "delete":
            store.unlink()
            continue
        chunk = _chunk(store, var)
        with zipfile.ZipFile(store) as zf:
            data = zf.read(chunk)
        _rewrite(store, chunk, data[:10] if damage == "truncate-chunk" else None)
    assert len(damaged) == len(DAMAGES)
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    # A dry run plans exactly the batches that hold them, then the summary and figure of each
    # experiment that reads one (the tiny config shares some beta_star cells with toy_margin).
    readers = set().union(*(_experiments_reading(config, store.name) for store in damaged))
    assert set(DAMAGES) <= readers
    expected = {"simulate": len(damaged), "aggregate": len(readers), "plot": len(readers), "all": 1}
    assert planned(tmp_path, config) == expected
    proc = run(tmp_path, config)
    said = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("attnflow: "))
    for manifest in damaged.values():  # a line each, naming the store (and so its batch) once
        assert said.count(f"{manifest.stem}.zarr.zip is ") == 1 and said.count(manifest.stem) == 1, said
    assert said.count(": its job recomputes it") == len(damaged)
    after = snapshot(results / "simulations")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # Only the damaged stores changed; every other store's bytes and mtimes are untouched.
    assert changed == {store.name for store in damaged}, sorted(changed)[:5]
    for store in damaged:
        healed, reference = stored_cells(store), stored_cells(tiny_run[2] / "simulations" / store.name)
        assert set(healed) == set(reference) and reference
        for cid in reference:
            assert set(healed[cid].data_vars) == set(reference[cid].data_vars)
            for var in reference[cid].data_vars:
                np.testing.assert_array_equal(healed[cid][var].values, reference[cid][var].values,
                                              err_msg=f"{store.name} {cid} {var}")
    assert planned(tmp_path, config) == {}


def test_status_names_the_corrupt_chunk(tiny_run, tmp_path, capsys):
    config = _copy_run(tiny_run, tmp_path)
    results = tmp_path / "results"
    store, _ = _store_of(results, "entropy")
    chunk = _chunk(store, "entropy")
    with zipfile.ZipFile(store) as zf:
        _rewrite(store, chunk, zf.read(chunk)[:-3])
    assert attnflow_main(["status", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    # A store of one group holds it at its root: its chunks name no group.
    where = f" of group {chunk.split('/')[0]}" if chunk.count("/") == 2 else ""
    assert "corrupt entropy (" in out and f"variable 'entropy'{where} chunk" in out, out


def test_failed_aggregation_leaves_no_current_figure(tiny_run, tmp_path):
    config = _copy_run(tiny_run, tmp_path)
    results = tmp_path / "results"
    store, _ = _store_of(results, "orthogonality")
    # Silent corruption: other bytes, same size and modification time. The start-up
    # check (sizes, times) lets it through; the aggregation verifies checksums.
    stat = store.stat()
    _flip_last_byte(store, _chunk(store, "energy"))
    os.utime(store, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.stat().st_size == stat.st_size
    # Its aggregation forced (the other experiments' summaries are untouched by the damage).
    figure = results / "figures" / "orthogonality.png"
    proc = run(tmp_path, config, str(figure), "--forcerun", "aggregate", check=False)
    assert proc.returncode != 0
    log = (results / "logs" / "aggregate" / "orthogonality.log").read_text()
    assert "corrupt" in log and store.name in log and "moved to" in log
    # No figure that looks current, no summary.
    assert not figure.exists()
    assert not (results / "summaries" / "orthogonality.zarr.zip").exists()
    # The store was moved aside: the next plain run recomputes it and draws the figure.
    assert planned(tmp_path, config)["simulate"] == 1
    run(tmp_path, config)
    assert figure.exists()
