"""One owner of the output paths: attnflow.layout; nothing else spells the results directory's layout."""

import re
from pathlib import Path

from attnflow.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
# Every name the layout gives a directory or file under the results directory, as a string literal or a
# path fragment ("results/figures", f"{x}.zarr").
NAMES = "simulations|summaries|_summaries|manifests|figures|repairs|logs|benchmarks|params"
SPELLINGS = re.compile(rf"""["'/]({NAMES})(["'/]|$)|\.zarr\b|\.failed\.json|\.attnflow\.lock""")


def _code(path: Path) -> str:
    """The file without comments and docstring prose (a docstring may name a path to explain it)."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not any(q in line for q in "\"'"):
            continue
        if stripped.startswith(('"""', "``")) or "``" in line:
            continue
        lines.append(line.split(" #")[0])
    return "\n".join(lines)


def test_only_the_layout_spells_output_paths():
    sources = [*(ROOT / "src" / "attnflow").rglob("*.py"), *(ROOT / "workflow").rglob("*.smk"),
               *(ROOT / "workflow" / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               ROOT / "Snakefile"]
    offenders = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in sources if p.name != "layout.py"
                 for line in _code(p).splitlines() if SPELLINGS.search(line)]
    assert not offenders, "output paths spelled outside attnflow.layout:\n" + "\n".join(offenders)


def test_the_layout_of_a_results_directory(tmp_path):
    layout = Layout(str(tmp_path))
    assert layout.results == tmp_path
    assert layout.store("abc").parent == layout.stores == layout.pending("abc").parent.parent
    assert layout.store("abc").name == "abc.zarr.zip"  # one file per batch
    assert layout.figures("x") == [layout.figure("x", "png"), layout.figure("x", "pdf")]
    # Summary tickets never share a batch's repair directory (no batch name holds "_").
    tickets = layout.summary_tickets("x")
    assert tickets != layout.repairs("x") and "_" in tickets.parent.name
    # Wildcards pass through, so the rules spell their patterns with the same methods.
    assert str(layout.manifest("{batch}")).endswith("{batch}.json")
    assert layout.lock.parent == tmp_path
