"""How cells, grid points, batches and failures are named in logs, messages and captions."""

from __future__ import annotations


def cells_phrase(count: int) -> str:
    """"1 cell", "2 cells": how logs and messages count cells."""
    return f"{count} cell" + ("" if count == 1 else "s")


def describe_failures(failed: list[dict]) -> str:
    """Failed grid points for a caption: ``coords (error)``, the error without the cell's repetition."""
    def short(error: str) -> str:
        return error.split("): ", 1)[1] if error.startswith("cell(") and "): " in error else error

    return "; ".join(", ".join(f"{k}={v}" for k, v in f["coords"].items()) + f" ({short(f['error'])})"
                     for f in failed)


def _plain(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def grid_point_name(experiment: str, coords: dict) -> str:
    """A grid point as a person reads it: ``beta_star (attention=usa, H=2, heads=block, n=4, beta=16)``."""
    if not coords:
        return experiment
    return f"{experiment} ({', '.join(f'{k}={_plain(v)}' for k, v in coords.items())})"


def batch_experiment(batch: str) -> str:
    """The experiment a batch belongs to: its name's first part (``sweep._batch_key``)."""
    return batch.split("-", 1)[0]


def _axis_order(axes, known: tuple) -> list:
    """``sweep.canonical_grid``'s order of ``axes``: those not in ``known`` by name, then ``known``'s in
    order."""
    return sorted(a for a in axes if a not in known) + [a for a in known if a in axes]


def seed_footer(attrs) -> str:
    """``"5 of 48 seeds failed, at 3 grid points (left out)"``: a summary's failed seeds in one line
    ("" when none failed)."""
    failed = int(attrs.get("n_seeds_failed") or 0)
    if not failed:
        return ""
    points = int(attrs.get("n_points_with_failed_seeds") or 0)
    return (f"{failed} of {int(attrs.get('n_seeds') or 0)} seeds failed, at {points} grid point"
            f"{'s' if points != 1 else ''} (left out)")


__all__ = ["batch_experiment", "cells_phrase", "describe_failures", "grid_point_name", "seed_footer"]
