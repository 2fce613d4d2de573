"""Validation has one owner (issue 16): ``attnflow.config`` checks a config's content; experiments
declare what they need as data (``axes``, ``pinned``, ``fixed_only``, ``bounds``, ``inputs``) and
``attnflow.sweep`` only expands a checked config."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import attnflow
from attnflow.config import ConfigError, validate
from attnflow.experiments import Experiment, builtin_modules, registry
from attnflow.sweep import Sweep

SRC = Path(attnflow.__file__).resolve().parent

# The only modules that may construct a ConfigError, each with the reason. A config's content is
# attnflow.config's alone; the other two check the arguments of a call on a config it accepted.
ALLOWED = {
    "config/": "the owner (a package): YAML, experiment modules, schema, results, scheduler, every "
               "experiment block (extra points, batch_over, grid values, input files, cells) and what each "
               "experiment declares it needs",
    "access.py": "open_summary / open_cells: the experiment the caller names is not one the valid config "
                 "runs (an argument of the call)",
    "refine.py": "attnflow refine's arguments: rounds, the Snakefile, an experiment the config does not "
                 "run or that declares no boundary",
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _name(node) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _config_errors(tree: ast.Module) -> list[int]:
    """Lines that construct or raise a ConfigError (``ConfigError(...)``, ``raise ConfigError``)."""
    lines = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _name(node.func) == "ConfigError"]
    lines += [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Raise) and node.exc is not None and _name(node.exc) == "ConfigError"]
    return sorted(lines)


def test_only_the_designated_modules_raise_config_error():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = _config_errors(_tree(path))
        if lines:
            module = path.relative_to(SRC).as_posix()
            owner = next((key for key in ALLOWED if key.endswith("/") and module.startswith(key)), module)
            found.setdefault(owner, []).extend(lines)  # a package's modules count as one owner
    stray = {module: lines for module, lines in found.items() if module not in ALLOWED}
    assert not stray, f"ConfigError raised outside {', '.join(ALLOWED)} (declare the check for " \
                      f"attnflow.config instead): {stray}"
    assert set(found) == set(ALLOWED), f"allowed but raising none any more: {set(ALLOWED) - set(found)}"


def test_experiment_modules_declare_and_never_check():
    assert not hasattr(Experiment, "check")
    for module in builtin_modules():
        path = SRC / "experiments" / (module.rsplit(".", 1)[1] + ".py")
        tree = _tree(path)
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        assert "ConfigError" not in imported, path.name
        methods = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert "check" not in methods, path.name


def test_sweep_never_imports_config():
    """The dependency runs config -> sweep: sweep expands what config has checked."""
    tree = _tree(SRC / "sweep.py")
    imports = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imports += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [m for m in imports if m and re.search(r"(^|\.)config$", m)], imports


def _refusal(config: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate(config, reach_scheduler=False)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    return message


CROSSOVER_GRID = {"attention": ["softmax", "relu"], "init": ["equiangular_typical"],
                  "cluster_threshold": [0.5, 0.9], "beta": [1.0, 2.0]}
METASTABILITY_GRID = {"H": [1], "d": [2], "beta": [1.0, 2.0, 4.0]}


@pytest.mark.parametrize("experiment, block, match", [
    # fixed_only: metastability's map has one time axis, shared by every cell.
    ("metastability", {"grid": {**METASTABILITY_GRID, "t_max": [100.0, 1000.0]}},
     r"^experiments\.metastability\.grid\.t_max = \[100\.0, 1000\.0\]: must be fixed \(every cell shares "
     r"one sample grid, the map's time axis\)$"),
    ("metastability", {"grid": {**METASTABILITY_GRID, "n_samples": [31, 61]}},
     r"^experiments\.metastability\.grid\.n_samples = \[31, 61\]: must be fixed"),
    # bounds: crossover's levels lie above the start gamma0 = 1/sqrt(d) (d = 64: 0.125).
    ("crossover", {"grid": {**CROSSOVER_GRID, "cluster_threshold": [0.1, 0.5]}},
     r"^experiments\.crossover\.grid\.cluster_threshold: 0\.1 must lie in \(gamma0 = 1/sqrt\(d\), 1\) = "
     r"\(0\.125, 1\)$"),
    # A value the closed forms are not derived for (the equiangular ODE: softmax and relu).
    ("clustering_time", {"grid": {"attention": ["softmax", "relu", "sigmoid"], "n": [2, 4], "d": [16, 64],
                                  "init": ["equiangular_typical"], "cluster_threshold": [0.5]}},
     r"^experiments\.clustering_time\.grid\.attention = \['softmax', 'relu', 'sigmoid'\]: the "
     r"clustering_time figure draws only softmax, relu, not 'sigmoid'"),
    # A grid axis the figure has no panel for (its plot and derive would crash on the extra dimension).
    ("energy", {"grid": {"geometry": ["sphere"], "heads": ["random"], "max_steps": [1000, 2000]}},
     r"^experiments\.energy\.grid\.max_steps = \[1000, 2000\]: the energy figure is drawn over heads, "
     r"geometry, with no panel for max_steps"),
    # ... at each grid point's own d (d = 16: 0.25), which may be a grid axis.
    ("crossover", {"grid": {**CROSSOVER_GRID, "d": [64, 16], "cluster_threshold": [0.2, 0.5]}},
     r"^experiments\.crossover\.grid\.cluster_threshold: 0\.2 must lie in \(gamma0 = 1/sqrt\(d\), 1\) = "
     r"\(0\.25, 1\)$"),
])
def test_declared_needs_are_one_line_naming_experiment_key_and_value(experiment, block, match):
    message = _refusal({"results": "out", "experiments": {experiment: block}})
    assert re.search(match, message), message


@pytest.mark.parametrize("where", ["fixed", "grid"])
def test_a_named_weights_file_that_does_not_exist_is_refused(tmp_path, where):
    missing = str(tmp_path / "modle.safetensors")
    block = {"fixed": {"weights": missing}} if where == "fixed" else \
        {"grid": {"weights": ["minilm", missing], "layer": [0], "heads": ["trained", "trained_orthogonal"],
                  "beta": [1.0, 4.0]}}
    message = _refusal({"results": "out", "experiments": {"trained_heads": block}})
    assert message == f"experiments.trained_heads.{where}.weights = {missing!r}: no such file"


def test_a_missing_weights_file_is_no_reason_to_skip(tmp_path):
    """``unavailable`` says whether the experiment can run on this machine, not whether the config is
    right: a missing file the config names is the declared input check's."""
    exp = registry().get("trained_heads")
    spec = exp.spec({"fixed": {"weights": str(tmp_path / "modle.safetensors")}})
    assert exp.unavailable(spec) is None


DECLARED = '''
from toy_experiment import ToyMargin
from attnflow.experiments import Bound


class Declared(ToyMargin):
    name = "toy_declared"
    fixed_only = {"n": "one token count per figure"}
    bounds = (Bound("beta", high=2.0),)
    inputs = {"weights": lambda value: None if value in ("", "here") else "not here"}


EXPERIMENT = Declared()
'''


@pytest.fixture
def declared(tmp_path, monkeypatch):
    (tmp_path / "declared_experiment.py").write_text(DECLARED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return lambda block: {"results": "out", "experiment_modules": ["declared_experiment"],
                          "experiments": {"toy_declared": block}}


def test_a_new_experiment_declares_its_needs_and_config_evaluates_them(declared):
    validate(declared({}), reach_scheduler=False)
    for block, match in [
        ({"grid": {"beta": [0.5, 1.0], "n": [4, 8]}},
         r"^experiments\.toy_declared\.grid\.n = \[4, 8\]: must be fixed \(one token count per figure\)$"),
        ({"grid": {"beta": [0.5, 4.0]}},
         r"^experiments\.toy_declared\.grid\.beta: 4\.0 must lie in \(-inf, 2\)$"),
        ({"fixed": {"beta": 1.5}, "grid": {}, "batch_over": []},
         r"^experiments\.toy_declared\.fixed\.beta = \[1\.5\]: the toy_declared figure needs at least 2 "
         r"values"),
        ({"fixed": {"weights": "there"}},
         r"^experiments\.toy_declared\.fixed\.weights = 'there': not here$"),
    ]:
        message = _refusal(declared(block))
        assert re.search(match, message), message


def test_an_experiment_that_still_defines_check_is_refused(tmp_path, monkeypatch):
    (tmp_path / "old_experiment.py").write_text(
        "from toy_experiment import ToyMargin\n\n\nclass Old(ToyMargin):\n    name = 'toy_old'\n\n"
        "    def check(self, spec):\n        pass\n\n\nEXPERIMENT = Old()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    message = _refusal({"experiment_modules": ["old_experiment"], "experiments": {"toy_old": {}}})
    assert message.startswith("experiment_modules: experiment toy_old defines check(), which nothing calls")


def test_extra_points_are_checked_by_config_not_by_spec():
    block = {"grid": {"beta": [0.5, 1.0]}, "extra_points": [{"n": 4}]}
    spec = registry().get("energy").spec(block)  # resolving checks nothing
    assert spec.extra_points == ({"n": 4},)
    message = _refusal({"experiments": {"energy": block}})
    assert message.startswith("experiments.energy.extra_points: {'n': 4} must give exactly the grid axes")


def test_sweep_from_config_only_expands_what_validate_accepted():
    config = {"results": "out", "experiments": {"beta_star": {
        "fixed": {"heads": "block", "d": 4, "seeds": 2, "t_max": 1.0},
        "grid": {"H": [2], "n": [4, 6], "beta": [0.5, 1.0]}, "batch_over": ["beta"]}}}
    checked = validate(config, reach_scheduler=False)
    expanded = Sweep.from_config(config, registry())
    assert checked.batches == expanded.batches and checked.specs == expanded.specs
    assert checked.entries("beta_star") == expanded.entries("beta_star")



def test_an_experiment_that_averages_other_axes_takes_them():
    # orthogonality's figure averages over axes it is not drawn over, and its title says so.
    from attnflow.config import validate

    block = {"grid": {"delta": [0.0, 0.1], "beta": [0.5, 1.0], "t_max": [5.0, 10.0]}}
    validate({"results": "out", "experiments": {"orthogonality": block}}, reach_scheduler=False)
