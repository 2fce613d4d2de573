"""The package's layers (docs/workflow.md, "Architecture"): a module imports only from its own layer and
the layers below it, function-level imports included (a lazy import made for start-up speed still ties
the modules). An import that runs up is a failure unless ALLOWED names it, with its reason."""

from package_imports import MODULES, SRC
from package_imports import imports as _imports

# Bottom to top. A name covers its submodules (``attnflow.engine`` covers ``attnflow.engine.dopri``).
LAYERS = {
    # No import of the package's own modules beyond each other: names, errors, registries, numbers.
    "leaves": ["version", "units", "errors", "registry", "numerics", "streams", "tableau", "report", "layout",
               "jobparams", "names"],
    # The model: its declarations, a grid cell, closed forms, the metadata of what is stored, the
    # engines' contract, an experiment's resolved spec (its bounds are functions of a Cell).
    "model": ["attention", "geometry", "strengths", "tokens", "trained", "heads", "observables", "cellvalues",
              "cell", "ids", "spec", "contract", "theory", "metadata"],
    # Integrating a cell: the numba and JAX engines, the choice between them, the cost model.
    "engines": ["engine", "jaxengine", "engines", "resources", "seed_failures", "certificate", "simulation"],
    # Stores complete or absent, and a batch's cells packed in one.
    "storage": ["store", "pack", "versions"],
    # What each experiment declares, reduces, derives and draws, with its drawing and table toolkits.
    # Below the sweep: the config is checked against the experiments' declarations.
    "experiments": ["plotting", "tables", "experiments"],
    # A config checked and expanded into cells and batches.
    "sweep": ["sweep", "config"],
    # Running a sweep: the batch runner, a results folder's state, the Snakemake jobs' entry points and
    # the aggregation and figures they run.
    "run": ["run", "aggregate", "figures"],
    # What a person calls: the package's facade, the command line and the reports and tables it prints.
    "interfaces": ["attnflow", "access", "export", "status", "plan", "progress", "profile", "refine", "docs",
                   "cli"],
}

# Imports that run up, each with why it stays: (importer, imported) -> reason.
ALLOWED: dict[tuple[str, str], str] = {}


def _layer(module: str) -> int:
    """The index of a module's layer: that of the longest name in LAYERS covering it."""
    best = None
    for index, names in enumerate(LAYERS.values()):
        for name in names:
            full = "attnflow" if name == "attnflow" else f"attnflow.{name}"
            covers = module == full or (full != "attnflow" and module.startswith(full + "."))
            if covers and (best is None or len(full) > best[0]):
                best = (len(full), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and to docs/workflow.md)"
    return best[1]


def upward_imports() -> dict[tuple[str, str], str]:
    """Every import that runs up: (importer, imported) -> "importer's layer < imported's layer"."""
    names = list(LAYERS)
    out = {}
    for module in MODULES:
        for imported in _imports(module):
            if _layer(imported) > _layer(module):
                out[(module, imported)] = f"{names[_layer(module)]} imports {names[_layer(imported)]}"
    return out


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_runs_up_the_layers():
    up = upward_imports()
    stray = {pair: why for pair, why in up.items() if pair not in ALLOWED}
    assert not stray, "imports running up the layers (move the code, or import it from below): " + "; ".join(
        f"{a} -> {b} ({why})" for (a, b), why in sorted(stray.items()))
    stale = set(ALLOWED) - set(up)
    assert not stale, f"allowed but no longer running up (remove from ALLOWED): {sorted(stale)}"


def test_the_layers_catch_an_import_that_runs_up():
    # The check itself: a leaf importing the cell, and the model importing the package root, run up.
    assert _layer("attnflow.errors") < _layer("attnflow.cell") < _layer("attnflow")
    assert _layer("attnflow.engine.machinery.blas") == _layer("attnflow.engine")
    assert _layer("attnflow.experiments.beta_star") < _layer("attnflow.config")


def test_the_docs_list_every_layer_in_order():
    text = (SRC.parents[1] / "docs" / "workflow.md").read_text()
    section = text[text.index("## Architecture"):]
    positions = [section.index(f"**{name}**") for name in LAYERS]
    assert positions == sorted(positions), "docs/workflow.md lists the layers in another order"
