"""``attnflow`` command line: the state of a sweep."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from .sweep import ConfigError, cell_id, experiment_cells, failure_path, store_path


def sweep_status(config: dict) -> dict[str, dict]:
    """Per experiment: cell ids that are done, missing, failed (with the error) or interrupted."""
    root = Path(config.get("results", "results")) / "simulations"
    report = {}
    for name in config.get("experiments", {}):
        done, missing, failed, partial = [], [], {}, []
        for _, cell in experiment_cells(config, name):
            path = store_path(root, cell)
            if path.exists():
                done.append(cell_id(cell))
                continue
            record = failure_path(root, cell)
            if record.exists():
                failed[cell_id(cell)] = json.loads(record.read_text())["error"]
            else:
                missing.append(cell_id(cell))
            if path.with_name(path.name + ".partial").exists():
                partial.append(cell_id(cell))
        report[name] = {"done": done, "missing": missing, "failed": failed, "partial": partial}
    return report


def _status(args) -> int:
    config = yaml.safe_load(Path(args.configfile).read_text())
    if args.results:
        config["results"] = args.results
    try:
        report = sweep_status(config)
    except ConfigError as err:
        print(f"invalid config: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{'experiment':18} {'cells':>6} {'done':>6} {'missing':>8} {'failed':>7} {'interrupted':>12}")
    for name, r in report.items():
        total = len(r["done"]) + len(r["missing"]) + len(r["failed"])
        print(f"{name:18} {total:6d} {len(r['done']):6d} {len(r['missing']):8d} "
              f"{len(r['failed']):7d} {len(r['partial']):12d}")
    for name, r in report.items():
        for cid, error in r["failed"].items():
            print(f"failed {name}/{cid}: {error}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="attnflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="cells done, missing and failed for a sweep config")
    status.add_argument("--configfile", default="config/config.yaml")
    status.add_argument("--results", help="override the config's results directory")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
