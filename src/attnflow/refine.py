"""``attnflow refine``: grids that refine themselves around an experiment's boundary.

Each round reads the experiment's summary, brackets its boundary along the
experiment's ``refine_axis`` (per line of the grid: two neighbouring computed
values on opposite sides of the level), records the bracket midpoints in the
config's results directory (``Layout.refinement``, with a record of each round),
and runs the same Snakemake workflow on the same config (locally, or with any
profile given). ``config.validate`` adds the recorded points to the
experiment's extra points in every run on that directory: a plain
``snakemake`` afterwards keeps the refined cells and draws the refined figure
(deleting the file drops them). Stores are named by their cells, so only the
new cells are computed; each round halves every bracket, ``rounds`` of them
narrow it ``2^rounds`` times.

``refine`` holds the results directory's lock (``run.lock.lock_results``) from
before its first round until its last, and shares it with the workflows it
starts: another controller on the same results (a working copy re-aggregating
the unrefined grid, say) cannot write a summary between rounds; and ``refine``
fails, saying who holds the lock, while another controller runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .config import load, validate
from .errors import ConfigError
from .run.lock import lock_for_child, lock_results, release_results


def find_snakefile(snakefile: str | Path | None = None) -> Path:
    """The workflow ``refine`` runs: ``snakefile`` if given, else ``Snakefile`` in the working directory.

    Never a path beside the package: ``pip install .`` copies the package alone, so
    the workflow is the one of the working copy the command runs in (the repository
    root, where every README command runs), as with ``snakemake`` itself.
    """
    path = Path(snakefile) if snakefile else Path.cwd() / "Snakefile"
    if not path.is_file():
        where = f"{path}" if snakefile else f"no Snakefile in the working directory {Path.cwd()}"
        raise ConfigError(f"{where}: run attnflow refine from the repository root (where the Snakefile "
                          "is), or name the workflow with --snakefile")
    return path


def record_points(path: Path, experiment: str, points: list[dict], axis: str, configfile) -> None:
    """Add a round's ``points`` to the refinement record at ``path`` (``Layout.refinement``), replaced
    atomically: a reader sees the record before or after the round, whole."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        record = {}
    record.setdefault("experiments", {})
    entry = record["experiments"].setdefault(experiment, {"points": [], "rounds": []})
    entry["points"] += points
    entry["rounds"].append({"round": len(entry["rounds"]) + 1, "axis": axis, "added": len(points),
                            "config": str(configfile)})
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def run_workflow(configfile: Path, experiment: str, snakefile: Path, args, log=print, figure=True) -> None:
    """Run the workflow up to ``experiment``'s figure, or its summary alone (``figure`` False: what a
    round reads to place its points; the figure of a round the next one replaces is never drawn).
    The target comes first: ``--configfile`` takes every word after it, and the pass-through arguments
    (``-q``, say) may take the word after them."""
    sweep = validate(load(configfile), reach_scheduler=False, configfile=configfile)
    target = str(sweep.layout.figure(experiment, "png") if figure else sweep.layout.summary(experiment))
    cmd = [sys.executable, "-m", "snakemake", target, "--snakefile", str(snakefile),
           "--configfile", str(configfile), *args]
    log("running: " + " ".join(cmd))
    env, fds = lock_for_child(sweep.results)
    proc = subprocess.run(cmd, env={**os.environ, **env}, pass_fds=fds)
    if proc.returncode:
        raise RuntimeError(f"the workflow failed (exit {proc.returncode}); see its output above")


def refine(configfile: str | Path, experiment: str, rounds: int = 1, snakemake_args=("--cores", "all"),
           snakefile: str | Path | None = None, log=print) -> Path:
    """Refine ``experiment``'s boundary ``rounds`` times; return the path of the record of its refined
    points (``Layout.refinement``, in the config's results directory).

    The config is checked by ``attnflow.config.validate``; the ``ConfigError`` raised here are
    about this command's arguments (``rounds``, the workflow file, the experiment to refine),
    which only the command knows, so they stay with it. The config file is never written.
    """
    from .store import open_verified

    if not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds = {rounds!r}: must be at least 1 (each round halves every bracket)")
    snakefile = find_snakefile(snakefile)
    source = Path(configfile)
    config = load(source)
    if experiment not in (config.get("experiments") or {}):
        raise ConfigError(f"experiments.{experiment}: not in {source}; refine an experiment the config runs")
    sweep = validate(config, reach_scheduler=False, configfile=source)
    exp = sweep.experiments.get(experiment)
    if exp.refine_axis is None:
        raise ConfigError(f"experiments.{experiment}: declares no boundary to refine")
    results = sweep.results
    lock_results(results)  # ResultsBusy (a RuntimeError) while another controller runs
    try:
        out = sweep.layout.refinement
        for round_ in range(1, rounds + 1):
            run_workflow(source, experiment, snakefile, snakemake_args, log, figure=False)
            sweep = validate(config, reach_scheduler=False, configfile=source)  # the points so far
            with open_verified(sweep.layout.summary(experiment)) as summary:
                points = exp.refinement(summary.load(), sweep.specs[experiment])
            if not points:
                log(f"round {round_}: no bracket left to split along {exp.refine_axis}")
                break
            record_points(out, experiment, points, exp.refine_axis, source)
            log(f"round {round_}: {len(points)} new points along {exp.refine_axis} -> {out}")
        run_workflow(source, experiment, snakefile, snakemake_args, log)
        return out
    finally:
        release_results(results)


__all__ = ["find_snakefile", "record_points", "refine", "run_workflow"]
