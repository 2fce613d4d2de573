"""One name per concept (docs/model.md, "Names"): the head forms are one set shared by the head
structures, the engine and the cost model; the score matrix M_h is never called ``scores``; the
names retired for that stay retired; and no two classes of the package share a name."""

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from attnflow import Cell, resources
from attnflow.heads import FORMS, HEADS, Form, HeadMatrices, head_matrices

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnflow"
# Python the repository runs: the package, the tests, the benchmarks, the workflow's rules and scripts.
CODE = sorted({*(p for d in ("src", "tests", "benchmarks", "workflow") for p in (ROOT / d).rglob("*.py")),
               *(ROOT / "workflow").rglob("*.smk"), ROOT / "Snakefile"} - {Path(__file__).resolve()})
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _hits(pattern: str, paths, allowed=()) -> list[str]:
    """``path:line: text`` of every line matching ``pattern`` that matches none of ``allowed``."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line) and not any(re.search(a, line) for a in allowed):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_head_forms_are_one_set():
    from attnflow import engine
    from attnflow.engine import field

    # The engine applies the forms heads.py declares: the same enum, not a copy.
    assert field.Form is Form and engine.Form is Form
    assert FORMS == tuple(member.name.lower() for member in field.Form) == ("diagonal", "dense", "factored")
    assert [form.label for form in Form] == list(FORMS)
    for structure in HEADS:
        assert isinstance(structure.form, Form), f"{structure.name}.form = {structure.form!r} is not a Form"
        assert (structure.rank is not None) == (structure.form == Form.FACTORED), structure.name
    # Each form's array is a HeadMatrices attribute, a field of the engines' Heads and a keyword of observe.
    from attnflow.contract import Heads

    attributes = {f.name for f in dataclasses.fields(HeadMatrices)}
    for form in Form:
        assert form.array in attributes
        for entry in (Heads, engine.observe):
            assert form.array in inspect.signature(entry).parameters, (entry.__name__, form.array)


@pytest.mark.parametrize("name", [s.name for s in HEADS if "weights" not in s.uses])
def test_each_structure_builds_the_form_it_declares(name):
    from attnflow.engine import head_form

    structure = HEADS.get(name)
    cell = Cell(H=2, n=3, d=4, heads=name, delta=0.1, seeds=2)  # delta: perturbed_block's, else reset
    built = head_matrices(cell, [0])
    assert built.form == structure.form
    # The engine applies it in that form (these draws are not diagonal), and the cost model prices it.
    assert head_form(built.score_matrices, built.diagonal, built.factors, cell.d) == structure.form
    assert resources.head_entries(cell) > 0 and resources.cell_seconds(cell) > 0


def test_the_score_matrix_is_never_called_scores():
    """``scores`` are the n x n s^h_ij; a stack of M_h is ``score_matrices``. No attribute, keyword or
    key spells M_h ``scores``, but the store attr value kept for old stores (``_ALIGNED_VALUES_SOURCE``)."""
    assert _hits(r"\.scores\b", CODE) == []  # an attribute
    assert _hits(r"\bscores=", CODE) == []  # a keyword or a default
    assert _hits(r"\bscores\s*:", CODE) == []  # a field, an annotated parameter, a documented one
    assert _hits(r"""["']scores["']""", CODE, allowed=[r"^_ALIGNED_VALUES_SOURCE = \"scores\""]) == []


def test_retired_names_stay_retired():
    retired = r"\b(HeadSet|build_heads|LayerHeads|heads_of|score_factors|max_score_norm)\b"
    assert _hits(retired, CODE + DOCS) == []
    from attnflow.engine import EngineResult

    fields = {f.name for f in dataclasses.fields(EngineResult)}
    assert "variables" in fields and "observables" not in fields  # it holds variables, not groups


def test_no_two_classes_of_the_package_share_a_name():
    """Two ``TrainedHeads`` (a record and an experiment) once lived side by side; so did the energy
    and entropy rules and experiments. Classes and namedtuples each have one name in the package."""
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                name = node.name
            elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                  and getattr(node.value.func, "id", None) == "namedtuple"):
                name = node.targets[0].id
            else:
                continue
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_the_builders_take_a_batch_of_seeds_and_refuse_one_int_by_name():
    import pytest

    from attnflow import Cell
    from attnflow.tokens import initial_tokens

    cell = Cell(H=2, n=3, d=4, heads="random", seeds=2)
    for build, name in ((head_matrices, "head_matrices"), (initial_tokens, "initial_tokens")):
        with pytest.raises(TypeError, match=rf"{name}: seeds = 0: give a sequence of seeds, \[0\] for one"):
            build(cell, 0)
    assert head_matrices(cell, [0, 1]).score_matrices.shape == (2, 2, 4, 4)
    assert initial_tokens(cell, (1,)).shape == (1, 3, 4)
