"""The package's modules and the imports between them, read from the source with ``ast`` (function-level
imports included): the graph tests/test_imports.py checks for cycles and tests/test_layers.py for imports
that run up."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnflow"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(module: str) -> set[str]:
    """The package's modules ``module`` imports anywhere in its source. ``from X import a`` imports the
    module ``X.a`` where there is one, else ``X``; the parent packages Python runs on the way are no edge
    (every module runs the package root so)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                       for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found
