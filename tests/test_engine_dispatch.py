"""Every declaration the engine runs has its own compiled branch: masks are declared rules like
attention types, and no compiled dispatch over a declaration falls into a default branch."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from reference import random_sphere, random_symmetric

import attnflow.engine as engine
from attnflow.attention import MASKS, Energy, Entropy, Mask, MaskRule, Weights
from attnflow.contract import ClusterEvent, Controller, Heads, Problem, SaveAt, check_attention, check_mask
from attnflow.engine import observe, solve
from attnflow.engine.cosines import Metric
from attnflow.heads import Form
from attnflow.observables import CLUSTER_METRICS

T_EVAL = np.array([0.0, 0.5, 1.0])
ENUMS = {enum.__name__: enum for enum in (Weights, Energy, Entropy, MaskRule, Metric, Form)}


def test_a_mask_declared_without_its_kernel_is_refused_by_name(rng):
    # On 24e6db2 a Mask was a bool: this one (causal=False) ran bit-identical to "none" and was stored
    # under its own name. Now its rule must be a MaskRule with a compiled branch.
    x = random_sphere(rng, 4, 3)[None]
    m = random_symmetric(rng, 1, 3)[None]
    for rule in (False, 7):  # a bool where the rule goes, and a rule the engine has no branch for
        window = Mask("window", rule, "token i attends to tokens i-2..i")
        with pytest.raises(NotImplementedError, match=rf"mask 'window' declares \w+ rule {rule!r}, which has "
                                                      "no kernel in engine 'numba'"):
            check_mask("numba", engine.KERNELS, window)
        with pytest.raises(NotImplementedError, match="mask 'window'"):
            solve(Problem(x, Heads(m), "softmax", 1.0, mask=window), Controller(1e-6, 1e-9, 100),
                  SaveAt(T_EVAL))
        with pytest.raises(NotImplementedError, match="mask 'window'"):
            observe(x, m, attention="softmax", mask=window, beta=1.0)


def test_registering_a_mask_without_its_kernel_fails_at_import():
    # A new entry in the registry before the engine is imported: the import itself refuses it.
    code = ("from attnflow.attention import MASKS, Mask\n"
            "MASKS._items['window'] = Mask('window', False, 'a sliding window')\n"
            "import attnflow.engine\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "mask 'window' declares bool rule False, which has no kernel in engine 'numba'" in run.stderr


def test_an_attention_rule_given_as_a_bool_is_refused():
    # True == Weights.EXP == 1: a bool must not pass for the member of the same value.
    softmax = engine.ATTENTIONS.get("softmax")
    with pytest.raises(NotImplementedError, match="attention 'mystery' declares bool rule True"):
        check_attention("numba", engine.KERNELS, dataclasses.replace(softmax, name="mystery", weights=True))


def test_the_declared_masks_run_as_their_own_rule(rng):
    # Each declared mask's numbers are its rule's: an alias of a rule runs bit-identical to it.
    x = random_sphere(rng, 5, 4)[None]
    m = random_symmetric(rng, 2, 4)[None]
    for mask in MASKS:
        alias = Mask(f"{mask.name}-again", mask.rule, mask.description)
        for attention in ("softmax", "sigmoid"):
            got = observe(x, m, attention=attention, mask=alias, beta=1.3)
            want = observe(x, m, attention=attention, mask=mask.name, beta=1.3)
            assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in want)
    plain = observe(x, m, attention="softmax", mask="none", beta=1.3)
    causal = observe(x, m, attention="softmax", mask="causal", beta=1.3)
    assert not np.array_equal(plain["kinetic"], causal["kinetic"])


@pytest.mark.parametrize("rule", ["weights", "energy", "entropy", "mask"])
def test_a_rule_without_a_branch_poisons_rather_than_runs_as_another(monkeypatch, rng, rule):
    # Past the checks (as a careless edit would get), the compiled dispatch has no default branch to
    # run another rule's numbers in: a rule value with no branch gives NaN where the rule acts.
    x = random_sphere(rng, 4, 3)[None]
    m = random_symmetric(rng, 1, 3)[None]
    flow_of = engine.flow_of
    monkeypatch.setattr(engine, "flow_of", lambda *a: flow_of(*a)._replace(**{rule: 99}))
    got = observe(x, m, attention="softmax", beta=1.0, groups=("velocity", "energy", "entropy"))
    poisoned = {"weights": ("kinetic", "entropy_rate"), "mask": ("kinetic", "entropy", "entropy_rate"),
                "energy": ("energy", "energy_rate"), "entropy": ("entropy", "entropy_rate")}[rule]
    for name in poisoned:
        assert np.all(np.isnan(got[name])), name


def test_a_metric_without_a_branch_never_meets_its_threshold(monkeypatch, rng):
    # epsilon <= 1.99 holds from t = 0 for any configuration; under an unknown metric value nothing
    # holds (the criterion's dispatch has no default that would read it as another metric).
    x = random_sphere(rng, 4, 3)[None]
    m = random_symmetric(rng, 1, 3)[None]
    args = (Problem(x, Heads(m), "softmax", 1.0), Controller(1e-6, 1e-9, 1000), SaveAt(T_EVAL),
            ClusterEvent("epsilon", 1.99))
    assert solve(*args).t_cluster[0] == 0.0
    monkeypatch.setitem(engine.METRICS, "epsilon", 99)
    assert np.isnan(solve(*args).t_cluster[0])


def test_the_criterion_text_is_declared_for_every_metric():
    assert CLUSTER_METRICS.get("epsilon").text(1e-3) == "epsilon <= 0.001"
    assert CLUSTER_METRICS.get("gamma_mean").text(0.9) == "gamma_mean >= 0.9"
    with pytest.raises(ValueError, match="cluster_metric: 'median', expected one of epsilon, gamma_mean"):
        ClusterEvent("median", 0.5)


@pytest.mark.parametrize("kind, member", [("mask rule", MaskRule.CAUSAL), ("observable group", "energy")])
def test_a_mask_rule_or_group_missing_from_the_compiled_tables_is_refused(monkeypatch, kind, member):
    monkeypatch.delitem(engine.KERNELS[kind], member)
    label = repr(getattr(member, "name", member))
    with pytest.raises(NotImplementedError, match=f"engine 'numba' has no {kind} kernel for {label}"):
        engine.check_declarations()


# --- no default branch, read from the sources ------------------------------------------------------

def _members(test: ast.expr) -> set[tuple[str, str]]:
    """The (enum, member) pairs a condition compares with, as ``x == Weights.SOFTMAX``."""
    found = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if (isinstance(side, ast.Attribute) and isinstance(side.value, ast.Name)
                        and side.value.id in ENUMS):
                    found.add((side.value.id, side.attr))
    return found


def _poisons(body: list[ast.stmt]) -> bool:
    """Whether a branch only marks the unreachable: NaN (or False, 0) written or returned, or a raise."""
    def poison(value):
        return (isinstance(value, ast.Attribute) and value.attr == "nan") or (
            isinstance(value, ast.Constant) and value.value in (False, 0)) or (
            isinstance(value, ast.Tuple) and all(poison(v) for v in value.elts))

    return all(isinstance(s, ast.Raise) or (isinstance(s, ast.Return) and poison(s.value))
               or (isinstance(s, ast.Assign) and poison(s.value)) for s in body)


def _dispatch(test: ast.expr) -> set[tuple[str, str]]:
    """The members a condition dispatches on: one comparison, or several joined by ``or``. A
    conjunction (``shared_rows and flow.mask == MaskRule.NONE and ...``) is a shortcut where all of
    its conditions hold, whose else is the general route, valid for every member."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return set()
    return _members(test)


def _dispatches(path: Path):
    """Each if/elif chain over declared enum members: (line, members named, final else or None)."""
    tree = ast.parse(path.read_text())
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node in inner:
            continue
        if isinstance(node, ast.If) and _dispatch(node.test):
            members, branch = set(), node
            while True:
                members |= _dispatch(branch.test)
                if len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If):
                    branch = branch.orelse[0]
                    inner.add(branch)
                    continue
                yield node.lineno, members, branch.orelse or None
                break


def _fall_throughs(path: Path):
    """Each run of ``if <member>: ... return`` statements and the ``return`` after it (the default of
    that shape): (line, members named, the return)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        members, first = set(), None
        for statement in node.body:
            if (isinstance(statement, ast.If) and not statement.orelse and _dispatch(statement.test)
                    and isinstance(statement.body[-1], ast.Return)):
                members |= _dispatch(statement.test)
                first = first or statement.lineno
                continue
            if members and isinstance(statement, ast.Return):
                yield first, members, [statement]
            members, first = set(), None


def _complete(members) -> bool:
    """Whether ``members`` name every member of each enum they come from."""
    return all({m.name for m in ENUMS[e]} <= {m for f, m in members if f == e} for e, _ in members)


def test_no_compiled_jax_or_python_side_dispatch_has_a_default_branch():
    # The numba engine, the JAX engine, the contract and simulate, and the test oracle
    # (tests/test_contract.py checks their dispatch tables' keys against the declarations).
    package = Path(engine.__file__).parents[1]
    paths = [*sorted((package / "engine").rglob("*.py")), *sorted((package / "jaxengine").glob("*.py")),
             package / "contract.py", package / "simulation.py", package / "engines.py",
             Path(__file__).with_name("reference.py")]
    problems = []
    for path in paths:  # the machinery's included (rglob)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # a conditional expression over a declaration is a two-way default
            if isinstance(node, ast.IfExp) and _members(node.test):
                problems.append(f"{path.name}:{node.lineno}: a conditional expression over "
                                f"{sorted(_members(node.test))}")
        # A final else (or the return after a run of returning ifs) is allowed only where it cannot be
        # reached: it poisons, or the chain names every member of its enum.
        for line, members, final in [*_dispatches(path), *_fall_throughs(path)]:
            if final is not None and not _complete(members) and not _poisons(final):
                problems.append(f"{path.name}:{line}: a default branch after {sorted(members)}")
    assert not problems, "\n".join(problems)


def test_the_source_check_finds_a_default_branch(tmp_path):
    # The check above, on the shapes of default the issue 40 review found.
    bad = tmp_path / "bad.py"
    bad.write_text("def f(metric, mask, s):\n"
                   "    value = 1.0 if metric == Metric.EPSILON else 2.0\n"
                   "    if mask == MaskRule.CAUSAL:\n"
                   "        s[0] = 0.0\n"
                   "    else:\n"
                   "        s[0] = 1.0\n"
                   "def g(form):\n"
                   "    if form == Form.FACTORED:\n"
                   "        return 1\n"
                   "    return 2\n")
    found = [chain for chain in _dispatches(bad) if chain[2] is not None]
    assert [(line, members) for line, members, _ in found] == [(3, {("MaskRule", "CAUSAL")})]
    assert not _poisons(found[0][2]) and not _complete(found[0][1])
    fall = list(_fall_throughs(bad))
    assert [(line, members) for line, members, _ in fall] == [(8, {("Form", "FACTORED")})]
    assert not _poisons(fall[0][2])
    tree = ast.parse(bad.read_text())
    assert [_members(n.test) for n in ast.walk(tree) if isinstance(n, ast.IfExp)] == [{("Metric", "EPSILON")}]
