"""The package's modules form no import cycle, function-level imports included, and each imports alone;
job start-up loads no drawing library or scipy."""

import subprocess
import sys
from pathlib import Path

import pytest
from package_imports import MODULES
from package_imports import imports as _imports


def test_no_import_cycle():
    # The package root is a facade (``attnflow.simulate``, ``attnflow.open_summary`` load lazily) that
    # every submodule may read ``__version__`` from: its own imports are no layer's.
    graph = {name: _imports(name) for name in MODULES if name != "attnflow"}
    for deps in graph.values():
        deps.discard("attnflow")
    done, path = set(), []

    def visit(name):
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph.get(name, ())):
            visit(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_the_error_module_sits_below_everything():
    assert _imports("attnflow.errors") == set()
    assert "attnflow.sweep" in _imports("attnflow.config")
    assert "attnflow.config" not in _imports("attnflow.sweep")


@pytest.mark.parametrize("name", ["attnflow.errors", "attnflow.layout", "attnflow.ids", "attnflow.names",
                                  "attnflow.versions", "attnflow.sweep", "attnflow.config",
                                  *(name for name in MODULES if name.startswith("attnflow.run."))])
def test_each_imports_in_a_fresh_interpreter(name):
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_plotting_sits_below_the_experiments():
    """The experiments draw with ``plotting``; ``figures`` (which looks experiments up) sits above them."""
    assert not {m for m in _imports("attnflow.plotting") if m.startswith("attnflow.experiments")}
    assert "attnflow.figures" not in {m for name in MODULES if name.startswith("attnflow.experiments")
                                      for m in _imports(name)}


def test_job_start_up_loads_no_drawing_or_scipy():
    """Every Snakemake job (and the workflow's parse step) imports these and builds the experiment
    registry: matplotlib, seaborn and scipy load only where they are used (plot methods, closed
    forms, fits), not at start-up."""
    # The tests' own experiment module too: the suite's hundred-odd workflow starts and jobs import it.
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "import attnflow.config, attnflow.experiments, attnflow.sweep, attnflow.run.failures, "
            "attnflow.run.health, attnflow.run.jobs, attnflow.run.lock, attnflow.run.owner, "
            "attnflow.run.summaries, attnflow.run.tickets; "
            "attnflow.experiments.registry(); attnflow.experiments.registry(['toy_experiment']); "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'seaborn') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
