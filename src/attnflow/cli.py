"""``attnflow`` command line: a sweep's state and plan, the config schema, the generated docs, exports."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from .numerics import CERTIFICATE_BOUND
from .status import status as _status


def _schema(args) -> int:
    import yaml

    from .config import schema

    text = yaml.safe_dump(schema(), sort_keys=False, width=100)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as err:
            print(f"attnflow schema: --output {args.output}: cannot write ({err.strerror})", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def _docs(args) -> int:
    from .docs import config_markdown, experiments_markdown

    pages = {"experiments.md": experiments_markdown(), "config.md": config_markdown()}
    if args.output:
        try:
            Path(args.output).mkdir(parents=True, exist_ok=True)
            for name, text in pages.items():
                (Path(args.output) / name).write_text(text)
        except OSError as err:
            print(f"attnflow docs: --output {args.output}: cannot write the pages there ({err.strerror}; "
                  "it must be a directory)", file=sys.stderr)
            return 2
    else:
        sys.stdout.write("\n".join(pages.values()))
    return 0


def _refine(args) -> int:
    from .errors import ConfigError
    from .refine import refine

    try:
        named = {"snakefile": args.snakefile} if args.snakefile else {}  # default: the working directory's
        out = refine(args.configfile, args.experiment, args.rounds, args.snakemake_args or ["--cores", "all"],
                     **named)
    except (ConfigError, RuntimeError) as err:
        print(f"attnflow refine: {err}", file=sys.stderr)
        return 2
    print(f"refined points: {out} (part of {args.experiment}'s grid in every later run of {args.configfile}; "
          "delete the file to drop them)")
    return 0


def _export(args) -> int:
    from .access import NotBuiltError
    from .errors import ConfigError
    from .experiments import NoExport
    from .export import STDOUT, export, metadata_path, output_problem, write_csv, write_json
    from .store import CorruptStore, StaleStore

    # The destinations first: a path that cannot take the table costs one line, not a computed export.
    problems = [output_problem(path, option) for option, path in (("--csv", args.csv), ("--json", args.json))
                if path is not None]
    if args.csv not in (None, STDOUT):
        problems.append(output_problem(str(metadata_path(args.csv)), "--csv (its metadata file)"))
    problems.append(_same_destination(args.csv, args.json, metadata_path, STDOUT))
    problems = [p for p in problems if p]
    if problems:
        print(f"attnflow export: {problems[0]}", file=sys.stderr)
        return 2
    try:
        df = export(args.experiment, args.configfile, args.results)
    except (ConfigError, NotBuiltError, NoExport, CorruptStore, StaleStore) as err:
        print(f"attnflow export: {err}", file=sys.stderr)
        return 2
    if args.csv:
        write_csv(df, args.csv)
    if args.json:
        write_json(df, args.json)
    if not (args.csv or args.json):
        write_csv(df, STDOUT)
    for path in filter(None, (args.csv, args.json)):
        if path != STDOUT:
            also = f" (and its metadata, {metadata_path(path)})" if path == args.csv else ""
            print(f"{args.experiment}: {len(df)} rows -> {path}{also}", file=sys.stderr)
    return 0


def _same_destination(csv, json_path, metadata_path, stdout) -> str | None:
    """Two of export's outputs (the CSV, its metadata file, the JSON) written to one file (paths resolved:
    ``F`` and ``./F`` are one file), where the last written would replace the other: refused."""
    from pathlib import Path

    named = {"--csv": csv, "--json": json_path}
    if csv not in (None, stdout):
        named["--csv's metadata file"] = str(metadata_path(csv))
    seen = {}
    for option, path in named.items():
        if path is None:
            continue
        key = path if path == stdout else str(Path(path).expanduser().resolve())
        if key in seen:
            return f"{seen[key]} and {option} name the same destination {path}: give each its own file"
        seen[key] = option
    return None


def _plan(args) -> int:
    import os

    from .access import load_sweep
    from .errors import ConfigError
    from .plan import SIMULATE_THREADS, plan, render, to_json
    from .profile import profile_settings

    try:
        settings = profile_settings(args.profile)
        sweep = load_sweep(args.configfile, args.results)
    except (ConfigError, FileNotFoundError) as err:
        print(f"attnflow plan: {err}", file=sys.stderr)
        return 2
    for name, why in sweep.skipped.items():
        print(f"attnflow plan: skipping experiment {name}: {why}", file=sys.stderr)
    from .run.owner import foreign_owner

    foreign = foreign_owner(sweep, args.configfile)
    if foreign:
        print(f"attnflow plan: a run would be refused: {foreign}", file=sys.stderr)
    cores = args.cores or settings.get("cores") or os.cpu_count() or 1
    result = plan(sweep, cores, settings.get("threads", SIMULATE_THREADS),
                  cluster_jobs=None if args.cores else settings.get("cluster_jobs"),
                  declared=args.gpus if args.gpus is not None else settings.get("gpus"))
    print(to_json(result) if args.json else render(result))
    return 0


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum}")
        return value
    return parse


# An integer >= 1 (``--rounds 0`` would run the workflow and refine nothing; ``--cores 0`` plans on no core).
_positive = _at_least(1)
# A GPU count: 0 is none (the JAX engine's cells on the CPU cores), a negative one a mistake.
_gpu_count = _at_least(0)


def _bound(text: str) -> float:
    """A finite number > 0 (a certificate bound of -1 or nan would flag every store)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number > 0")
    return value


DESCRIPTION = ("The command line of attnflow, beside the workflow itself (snakemake): a sweep's state and "
               "plan, refinement of a boundary, an experiment's table for a paper, the config schema and the "
               "generated docs.")
DEFAULT_CONFIG = "config/config.yaml"


def _configfile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configfile", default=DEFAULT_CONFIG, metavar="FILE",
                        help="the sweep config, a YAML file (default: %(default)s)")


def _experiment(parser: argparse.ArgumentParser, names: list[str], which: str) -> None:
    """The positional experiment argument, its help listing the experiments it takes. Not argparse
    choices: a config's experiment_modules may add experiments, which are checked against the config."""
    parser.add_argument("experiment", metavar="EXPERIMENT",
                        help=f"{which}: one of {', '.join(names)} (or one that the config's "
                             "experiment_modules adds)")


def _command(commands, name: str, summary: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary in ``attnflow --help`` also heads its own ``--help``."""
    kwargs.setdefault("description", summary[0].upper() + summary[1:] + ".")
    return commands.add_parser(name, help=summary, **kwargs)


def _parser() -> argparse.ArgumentParser:
    from .experiments import Experiment, registry
    from .version import __version__

    experiments = list(registry())
    exporting = [e.name for e in experiments if type(e).export_table is not Experiment.export_table]
    refining = [e.name for e in experiments if e.refine_axis]
    parser = argparse.ArgumentParser(prog="attnflow", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attnflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = _command(commands, "status", "cells done, missing, failed, corrupt, interrupted and stale",
                            description="Per experiment: its cells by state, the summaries to rebuild, the "
                                        "stores above the accuracy certificate's bound, and an ETA.")
    _configfile(status)
    status.add_argument("--results", metavar="DIR", help="override the config's results directory")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--deep", action="store_true",
                        help="read every byte of every store against its checksums (finds bit rot, which the "
                             "check of sizes and times at every start cannot see)")
    status.add_argument("--cores", type=_positive, help="cores the run uses, for its ETA (default: all here)")
    status.add_argument("--gpus", type=_gpu_count, metavar="N",
                        help="the GPUs the run's jobs may hold at once, as snakemake --resources gpu=N, for "
                             "its ETA: cells on the JAX engine priced on the GPU (default: one where jax "
                             "sees a GPU here and a cell's engine is auto)")
    status.add_argument("--certificate-bound", type=_bound, default=CERTIFICATE_BOUND, metavar="BOUND",
                        help="flag finished stores whose accuracy certificate (the worst seed's) "
                             "exceeds this (default "
                             f"{CERTIFICATE_BOUND:g})")
    status.set_defaults(func=_status)
    schema = _command(commands, "schema", "the config's JSON schema (YAML), generated from Cell and the "
                                           "experiments")
    schema.add_argument("--output", metavar="FILE", help="write to this file instead of stdout")
    schema.set_defaults(func=_schema)
    docs = _command(commands, "docs", "docs/experiments.md and docs/config.md, generated from the code",
                    description="The pages docs/experiments.md and docs/config.md, generated from the code.")
    docs.add_argument("--output", metavar="DIR",
                      help="write both pages into this directory instead of stdout")
    docs.set_defaults(func=_docs)
    refine = _command(commands, "refine", "refine an experiment's boundary: add bracket midpoints to its "
                                           "grid and run only the new cells",
                            epilog="Arguments after -- go to snakemake (default --cores all), e.g. "
                                   "attnflow refine beta_star --rounds 3 -- --profile profiles/slurm")
    _experiment(refine, refining, "the experiment whose boundary to refine")
    _configfile(refine)
    refine.add_argument("--rounds", type=_positive, default=1,
                        help="each round halves every bracket (>= 1; default: %(default)s); the points "
                             "are recorded in the results directory, part of the grid from then on")
    refine.add_argument("--snakefile", metavar="FILE", help="the workflow to run (default: Snakefile in the "
                                                            "working directory)")
    refine.set_defaults(func=_refine)
    plan = _command(commands, "plan", "before a run: cells (new, done, failed, stale), jobs, core-hours, "
                                       "wall time and the largest job's memory, from the SLURM cost model")
    _configfile(plan)
    plan.add_argument("--profile", metavar="DIR",
                      help="a Snakemake profile (directory): its cores, jobs and threads")
    plan.add_argument("--cores", type=_positive,
                      help="cores to run on (default: the profile's, else all here)")
    plan.add_argument("--results", metavar="DIR", help="override the config's results directory")
    plan.add_argument("--gpus", type=_gpu_count, metavar="N",
                      help="the GPUs the run's jobs may hold at once, as snakemake --resources gpu=N (a "
                           "cluster's login node sees none; 0: none): where engine auto cells run, so what "
                           "they cost (default: the profile's, else one where jax sees a GPU here)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.set_defaults(func=_plan)
    export = _command(commands, "export", "an experiment's measured thresholds, boundaries and fitted "
                                           "exponents with their intervals, seed counts and closed forms, "
                                           "one row per grid line (CSV or JSON)",
                            epilog="Without --csv or --json the CSV goes to stdout. Every path is checked "
                                   "before anything is computed.")
    _experiment(export, exporting, "the experiment whose table to write")
    _configfile(export)
    export.add_argument("--results", metavar="DIR", help="override the config's results directory")
    export.add_argument("--csv", metavar="FILE",
                        help="write the table as CSV, and beside it FILE-metadata.json (CSVW): every "
                             "column's description and units, the table's provenance ('-': the CSV alone to "
                             "stdout)")
    export.add_argument("--json", metavar="FILE", help="write the table, its columns' descriptions and units "
                                                       "and its provenance as JSON ('-': stdout)")
    export.set_defaults(func=_export)
    return parser


def main(argv=None) -> int:
    parser = _parser()
    # Split at "--" before parsing, so that options may come in any order before it and
    # snakemake's own options after it are never read as attnflow's.
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if passthrough and args.command != "refine":
        parser.error(f"arguments after -- go to snakemake; only attnflow refine takes them: {passthrough}")
    args.snakemake_args = passthrough
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (``attnflow status | head``): not an error of attnflow's. Point stdout at
        # devnull so that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
