"""Packaging: the licence and citation exist, and the three dependency lists agree on every floor.

pyproject.toml (pip), environment.yml (conda users) and workflow/envs/attnflow.yaml
(--software-deployment-method conda) are edited by hand; a floor raised in one and
not the others installs a stack the code was never run on.
"""

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from the PyPI ones (none today; add them here)
CONDA_TO_PYPI: dict[str, str] = {}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _floors_pip(specs) -> dict[str, Version]:
    out = {}
    for text in specs:
        req = Requirement(text)
        floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
        out[_norm(req.name)] = floors[0] if floors else None
    return out


def _floors_conda(path: Path) -> dict[str, Version]:
    out = {}
    for dep in yaml.safe_load(path.read_text())["dependencies"]:
        if not isinstance(dep, str):
            continue  # the pip: section
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9][0-9A-Za-z.]*))?", dep.strip())
        assert match, f"{path.name}: cannot read the dependency {dep!r}"
        name, floor = match.groups()
        out[_norm(CONDA_TO_PYPI.get(name, name))] = Version(floor) if floor else None
    return out


def _pyproject() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = _floors_pip(project["dependencies"])
    for extra in ("trained", "test"):
        floors.update(_floors_pip(project["optional-dependencies"][extra]))
    floors["python"] = Version(project["requires-python"].removeprefix(">="))
    return floors


SOURCES = {
    "pyproject.toml": _pyproject,
    "environment.yml": lambda: _floors_conda(ROOT / "environment.yml"),
    "workflow/envs/attnflow.yaml": lambda: _floors_conda(ROOT / "workflow" / "envs" / "attnflow.yaml"),
}


def test_floors_agree_across_the_three_lists():
    floors = {name: read() for name, read in SOURCES.items()}
    shared = set.union(*(set(f) for f in floors.values())) - {"pip"}
    disagree = []
    for package in sorted(shared):
        seen = {src: f[package] for src, f in floors.items() if package in f}
        if len(seen) > 1 and len(set(seen.values())) > 1:
            disagree.append(f"{package}: " + ", ".join(f"{src} {v or 'no floor'}" for src, v in seen.items()))
    assert not disagree, "version floors differ:\n" + "\n".join(disagree)


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_runtime_package_has_a_floor(source):
    floors = SOURCES[source]()
    bare = [p for p, v in floors.items() if v is None and p != "pip"]
    assert not bare, f"{source}: packages without a floor: {bare}"


def test_floors_cover_what_the_code_and_profiles_use():
    floors = _pyproject()
    # zarr 3 stores: xarray's first release for zarr-python 3.
    assert floors["zarr"] >= Version("3.0") and floors["xarray"] >= Version("2025.01.2")
    # profiles/slurm sets slurm-status-command (plugin 2.0.1) and documents slurm-array-jobs (2.6.0).
    profile = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    assert "slurm-status-command" in profile and "slurm-array-jobs" in profile
    assert floors["snakemake-executor-plugin-slurm"] >= Version("2.6")
    for source in ("environment.yml",):
        assert SOURCES[source]()["snakemake-executor-plugin-slurm"] >= Version("2.6")


def test_licence_and_citation():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "The attnflow developers" in licence
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "MIT"
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("Gradient Flow Structure and Quantitative Dynamics")
    assert paper["authors"][0]["family-names"] == "Pendharkar"
    assert "2605.04279" in paper["url"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cff["version"] == project["version"]
