"""The engine's math reaches its machinery only through the contract (``engine/machinery/__init__.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import attnflow.engine as engine
from attnflow.engine import machinery

ENGINE_DIR = Path(engine.__file__).parent


def _imports(path: Path):
    """(module, names) of each ``from ... import ...`` in ``path``, the module as written (dots kept)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or ""), {alias.name for alias in node.names}


def test_the_math_imports_only_the_contracts_names():
    math_files = sorted(ENGINE_DIR.glob("*.py"))
    assert {p.name for p in math_files} >= {"field.py", "measure.py", "dopri.py", "__init__.py"}
    problems = []
    for path in math_files:
        for module, names in _imports(path):
            if module.startswith(".machinery."):
                problems.append(f"{path.name}: from {module} (a machinery module, not the contract)")
            elif module == ".machinery" and not names <= set(machinery.__all__):
                problems.append(f"{path.name}: {sorted(names - set(machinery.__all__))} not in the contract")
    assert not problems, "\n".join(problems)


def test_every_name_of_the_contract_is_documented_at_its_top():
    # The contract is the docstring: a name the math may call is named there.
    for name in machinery.__all__:
        assert f"``{name}(" in machinery.__doc__, name


def test_the_machinery_does_not_know_the_flow():
    # Nothing under machinery/ imports the declarations the math dispatches on (attention, heads,
    # observables) or the math itself.
    for path in sorted((ENGINE_DIR / "machinery").glob("*.py")):
        for module, _ in _imports(path):
            assert not module.startswith(".."), f"{path.name}: from {module}"
