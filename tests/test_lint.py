"""The linters the workflow catalog's CI runs: ruff on the Python, snakemake --lint on the DAG."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "--directory", str(ROOT),
                           "--snakefile", str(ROOT / "Snakefile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr
