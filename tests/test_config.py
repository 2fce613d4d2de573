"""Config mistakes fail before any job, as one line naming the key; the schema and docs are generated."""

import copy
import socket
from pathlib import Path

import pytest
import yaml
from sweep_helpers import ROOT, TINY, run, set_dotted, write_config

from attnflow.cell import FIELD_DOCS
from attnflow.config import ConfigError, load, schema, validate
from attnflow.docs import config_markdown, experiments_markdown
from attnflow.experiments import registry

BASE = {
    "results": "out",
    "experiments": {
        "beta_star": {
            "fixed": {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0},
            "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0, 2.0]},
            "batch_over": ["beta"],
        },
    },
}


def _with(path, value, base=BASE):
    cfg = copy.deepcopy(base)
    set_dotted(cfg, path, value)
    return cfg


@pytest.mark.parametrize("path, value, match", [
    ("experiments.beta_star.grid.beta", [0.5, 0.5], r"grid\.beta: 0\.5 and 0\.5 are the same value"),
    ("experiments.beta_star.grid.beta", [1, 1.0], r"grid\.beta: 1 and 1\.0 are the same value"),
    ("experiments.beta_star.grid.n", [8], r"experiments\.beta_star\.grid\.n = \[8\]: .* at least 2 values"),
    ("experiments.beta_star.grid.n", None, r"experiments\.beta_star\.fixed\.n = \[8\]: .* at least 2"),
    ("results", "", r"results = '': must name an output directory"),
    ("results", "/", r"results = '/': the filesystem root"),
    ("dask_scheduler", "tcp://127.0.0.1:9", r"dask_scheduler = 'tcp://127.0.0.1:9': no scheduler answers"),
    ("dask_scheduler", "processes", r"dask_scheduler: 'processes' does not match"),
    ("experiments.phase", {"grid": {"beta": [1.0]}}, r"^experiments\.phase: unknown experiment \(known: "),
    ("experiments.beta_star.fixed.H", "two", r"experiments\.beta_star\.fixed\.H: 'two' is not of type"),
    ("experiments.beta_star.fixed.temperature", 1.0, r"unknown key 'temperature' \(allowed: H, n,"),
    ("experiments.beta_star.fixed.attention", "tanh", r"attention = 'tanh': must be one of softmax"),
    ("experiments.beta_star.grid.beta", [], r"experiments\.beta_star\.grid\.beta: \[\] should be non-empty"),
    ("experiments.beta_star.fixed.d", 5, r"experiments\.beta_star \(grid point .*\): Cell\.d = 5"),
    ("experiments.beta_star.fixed.rtol", 1e-16, r"Cell\.rtol = 1e-16: must lie in"),
    ("experiments.beta_star.batch_over", ["n", "d"], r"batch_over: 'd' is not a grid axis"),
    ("experiments", {}, r"experiments: \{\} should be non-empty"),
    ("experiment_modules", ["no.such.module"], r"experiment_modules: cannot import 'no\.such\.module'"),
    # A field pinned by the closed form, given another value or made a grid axis.
    ("experiments.clustering_time.fixed.heads", "block",
     r"experiments\.clustering_time\.fixed\.heads: must be scalar \(the closed form is the equiangular"),
    ("experiments.clustering_probability.grid.attention", ["softmax", "relu"],
     r"experiments\.clustering_probability\.fixed\.attention: must be softmax"),
    ("experiments.clustering_time.fixed.cluster_metric", "epsilon",
     r"clustering_time\.fixed\.cluster_metric: must be gamma_mean \(the time for the mean cosine"),
    # Figures that read the cluster count at t_max: a run stopped at its clustering time has none.
    ("experiments.clustering_time.fixed.stop_at_cluster", True,
     r"clustering_time\.fixed\.stop_at_cluster: must be False \(the uniform-start figure counts "
     r"the clusters left"),
    ("experiments.metastability.fixed.stop_at_cluster", True,
     r"metastability\.fixed\.stop_at_cluster: must be False \(the plateaus are read"),
    # A mask where the figure draws closed forms of unmasked attention.
    ("experiments.superadditivity.fixed.mask", "causal",
     r"experiments\.superadditivity\.fixed\.mask = \['causal'\]: the superadditivity figure draws closed"),
    ("experiments.beta_star.grid.mask", ["none", "causal"], r"beta_star\.grid\.mask = \['none', 'causal'\]"),
])
def test_config_mistakes_are_one_line_naming_the_key(path, value, match):
    with pytest.raises(ConfigError) as err:
        validate(_with(path, value))
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    assert __import__("re").search(match, message), message


def test_superadditivity_needs_both_distributions():
    cfg = {"experiments": {"superadditivity": {"grid": {"lambda_dist": ["linear", "dirichlet"],
                                                         "lambda_bar": [1.0, 2.0], "beta": [1.0, 2.0]}}}}
    with pytest.raises(ConfigError, match=r"grid\.lambda_dist = \['linear', 'dirichlet'\]: .* needs 'equal'"):
        validate(cfg)


def test_duplicated_yaml_keys_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("results: a\nexperiments:\n  energy: {}\n  energy: {fixed: {n: 4}}\n")
    with pytest.raises(ConfigError, match=r"key 'energy' appears twice \(lines 3 and 4\)"):
        load(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")


def test_reachable_scheduler_is_accepted():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        validate(_with("dask_scheduler", f"tcp://127.0.0.1:{port}"))


def test_shipped_configs_validate():
    for path in (ROOT / "config" / "config.yaml", ROOT / "config" / "paper.yaml", TINY):
        sweep = validate(load(path), reach_scheduler=False)
        assert sweep.batches


def test_committed_schema_is_the_generated_one():
    committed = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert committed == yaml.safe_load(yaml.safe_dump(schema())), \
        "run: attnflow schema --output workflow/schemas/config.schema.yaml"


def test_schema_follows_cell_and_experiments_field_by_field():
    generated = schema()
    fields = generated["properties"]["defaults"]["properties"]
    assert set(fields) == set(FIELD_DOCS)
    for name, spec in fields.items():
        assert spec["description"] == FIELD_DOCS[name] and "default" in spec, name
    blocks = generated["properties"]["experiments"]["properties"]
    assert set(blocks) == set(registry().names())
    for name, block in blocks.items():
        assert block["description"] and block["default"] == registry().get(name).defaults
    for key, spec in generated["properties"].items():
        assert spec["description"], key


def test_committed_docs_are_the_generated_ones():
    assert (ROOT / "docs" / "experiments.md").read_text() == experiments_markdown(), \
        "run: attnflow docs --output docs"
    assert (ROOT / "docs" / "config.md").read_text() == config_markdown(), "run: attnflow docs --output docs"
    for exp in registry():
        assert f"## `{exp.name}`" in experiments_markdown()


def test_readme_links_stay_inside_the_repository():
    import re

    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "config" / "README.md"]:
        for target in re.findall(r"\]\(([^)#]+)", doc.read_text()):
            if target.startswith("http"):
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}"
        assert "shared/" not in doc.read_text(), doc


@pytest.mark.workflow
@pytest.mark.parametrize("edits, key", [
    ({"experiments.energy.fixed.H": "two"}, "experiments.energy.fixed.H"),
    ({"experiments.energy.fixed.temperature": 1.0}, "temperature"),
    ({"experiments.beta_star.grid.beta": [0.5, 0.5]}, "experiments.beta_star.grid.beta"),
    ({"experiments.beta_star.grid.n": [4]}, "experiments.beta_star.grid.n"),
    ({"experiments.beta_star.fixed.d": 5}, "Cell.d = 5"),
    ({"results": ""}, "results = ''"),
    ({"dask_scheduler": "tcp://127.0.0.1:9"}, "dask_scheduler"),
    ({"experiments.nonsense": {}}, "experiments.nonsense: unknown experiment"),
])
def test_malformed_config_stops_the_workflow_before_any_job(tmp_path, edits, key):
    config = write_config(tmp_path, **edits)
    proc = run(tmp_path, config, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert key in out and "Traceback" not in out, out[-2000:]
    assert len(out.splitlines()) < 15, out
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_duplicated_key_in_the_config_file_stops_the_workflow(tmp_path):
    config = write_config(tmp_path)
    text = Path(config).read_text()
    Path(config).write_text(text + "dask_scheduler: threads\n")
    proc = run(tmp_path, config, check=False)
    assert proc.returncode != 0 and "appears twice" in proc.stdout + proc.stderr
