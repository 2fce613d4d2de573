"""What the Snakemake workflow calls: the validated sweep (at parse time), the jobs' parameters, and the
jobs themselves (``simulate_job``, ``aggregate_job``, ``plot_job``, called by ``workflow/scripts``).
Keeping the logic here makes it testable without Snakemake."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import sys
import threading
from pathlib import Path

from .. import jobparams
from ..cell import Cell
from ..config import load as load_config
from ..config import validate
from ..ids import cell_id, config_digest
from ..layout import Layout, results_of
from ..names import _axis_order, batch_experiment, grid_point_name
from ..spec import Spec
from ..sweep import Sweep
from ..version import __version__
from .failures import RETRY_KEY
from .manifest import write_manifest


def sweep_from_workflow(config: dict, configfiles=()) -> Sweep:
    """Validate the config Snakemake loaded; its files are re-read strictly (duplicate keys refused).
    The last config file names the results directory of a config without ``results``."""
    configfiles = list(configfiles)
    for path in configfiles:
        load_config(path)
    return validate(config, configfile=configfiles[-1] if configfiles else None)


def batch_params(sweep: Sweep, batch: str, write: bool = True) -> str:
    """The simulate job's parameter: the digest naming the file of its cells as JSON (each cell's cached
    canonical JSON, the text ``json.dumps([cell.to_dict() ...], sort_keys=True)`` gives; see
    ``attnflow.jobparams``): it changes when, and only when, the batch's cells do."""
    text = "[" + ", ".join(cell.canonical_json() for cell in sweep.batches[batch]) + "]"
    return jobparams.put(sweep.layout, text, write)


def spec_params(sweep: Sweep, name: str, write: bool = True) -> str:
    """An aggregate job's parameter: the digest naming the file of its experiment's spec, as
    ``batch_params``."""
    return jobparams.put(sweep.layout, sweep.specs[name].to_json(), write)


def entries_params(sweep: Sweep, name: str, write: bool = True) -> str:
    """An aggregate job's parameter: the digest naming the file of its experiment's grid points
    (``Sweep.entries``: grid coordinates, store path, cell id), as ``batch_params``."""
    return jobparams.put(sweep.layout, json.dumps(sweep.entries(name)), write)


def provenance(config: dict) -> dict:
    """What stores and summaries record of their origin. Read inside the jobs, never a rule
    parameter: Snakemake reruns a job whose parameters change, and the digest changes with
    any edit of the config."""
    return {"config_sha256": config_digest(config), "attnflow_version": __version__}


@contextlib.contextmanager
def stop_on_sigterm():
    """Within: SIGTERM (SLURM's time limit or scancel, a user's kill) ends this process as an exception, as
    Ctrl-C does, instead of at once, so that ``run_batch`` checkpoints the cells it finished before the job
    exits (status 143, as a kill by SIGTERM). The signal lands when the engine next returns to Python
    (SLURM's SIGKILL follows after its KillWait). Outside the main thread, where no handler can be set,
    it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        print(f"attnflow: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def simulate_job(cells_params: str, batch: str, config: dict, output: str, log=print, gpu: int = 0):
    """Simulate the cells of a batch (``cells_params``: the digest ``batch_params`` gave) its store does not
    hold, then write its manifest (``write_manifest``): the cells its store holds, the store's size and
    time (what the start-up check compares), the cells that failed whole (errors by cell id), those
    holding failed seeds (their ``seed_failures`` line) and the numerics version they failed under. The
    job succeeds with failures: the numbers decide them, so the next run skips them (``known_failures``)
    until the cell or the numerics change. ``gpu``: the GPUs the job was given (its ``gpu`` resource),
    for which its large ``auto`` cells were planned on the JAX engine: a job given one where jax sees
    none fails, naming it, rather than compute them on numba (the stores would then be stale at every
    start). The manifest records each stored cell's engine."""
    from .. import resources
    from ..engines import engine_for
    from .batch import run_batch

    layout = Layout(results_of(config))
    cells = [Cell(**fields) for fields in json.loads(jobparams.get(layout, cells_params))]
    unmet = [c for c in cells if c.engine == "auto" and engine_for(c) != resources.job_engine(c, bool(gpu))]
    if unmet:
        raise RuntimeError(
            f"batch {batch} was given {gpu} GPU for {len(unmet)} cells of engine auto that the cost model "
            f"calls large (first: {cell_name(unmet[0], batch, config)}), but jax sees no GPU on "
            f"{socket.gethostname()}: install jax's GPU build there (pip install 'attnflow[jax-cuda]'), or "
            "run without `--resources gpu=...` to compute them on the numba engine")
    with stop_on_sigterm():
        result = run_batch(cells, batch, layout, log=log,
                           provenance={"batch": batch, **provenance(config)},
                           names={cell_id(c): cell_name(c, batch, config) for c in cells},
                           retry_failed=bool(config.get(RETRY_KEY)))
    write_manifest(output, batch, result)


def cell_name(cell: Cell, batch: str, config: dict) -> str:
    """A batch's cell named by its grid point (``grid_point_name``), from the config alone: the batch's
    experiment and the values of that experiment's grid axes (the fields a grid point sets). A simulate
    job names its cells so without expanding the sweep."""
    experiment = batch_experiment(batch)
    block = (config.get("experiments") or {}).get(experiment) or {}
    axes = list(block.get("grid") or {}) or [a for extra in block.get("extra_points") or () for a in extra]
    modules = tuple(config.get("experiment_modules") or ())
    axes = _axis_order(dict.fromkeys(axes), _default_axes(experiment, modules))
    return grid_point_name(experiment, {a: getattr(cell, a) for a in axes if hasattr(cell, a)})


@functools.lru_cache(maxsize=64)
def _default_axes(experiment: str, modules: tuple) -> tuple:
    """The axes of an experiment's default grid, in order (none for one the registry does not know)."""
    from ..experiments import ExperimentModuleError, registry

    try:
        experiments = registry(modules)
    except (ExperimentModuleError, ValueError):  # the config's check names it; a name needs no order
        return ()
    return tuple(experiments.get(experiment).defaults.get("grid", {})) if experiment in experiments else ()


def aggregate_job(name: str, spec_params: str, entries_params: str, output: str, scheduler: str,
                  config: dict, modules=(), retire=(), manifests=()):
    """Summarise one experiment from the stores its rule names (never re-derived from the config;
    the digests ``spec_params`` and ``entries_params`` gave); the errors of its
    failed cells come from the batches' ``manifests``."""
    from ..aggregate import aggregate
    from ..experiments import registry

    experiment = registry(modules).get(name)
    layout = Layout(results_of(config))
    entries = [tuple(entry) for entry in json.loads(jobparams.get(layout, entries_params))]
    failures = {}
    for path in manifests:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            failures.update(json.loads(Path(path).read_text()).get("failed") or {})
    spec = Spec.from_json(name, jobparams.get(layout, spec_params))
    return aggregate(experiment, spec, entries, output, scheduler=scheduler, provenance=provenance(config),
                     retire=retire, failures=failures)


def plot_job(summary_path: str, outputs, modules=(), width: float | None = None, part: str = ""):
    """Draw one figure (``part`` of its experiment's ``figures``) from the experiment's summary store
    (the spec comes from the summary), ``width`` inches wide (the config's ``figure_width``)."""
    from ..experiments import registry
    from ..figures import drawn_width, render
    from ..plotting import TEXT_WIDTH
    from ..store import open_verified

    width = TEXT_WIDTH if width is None else width
    with open_verified(summary_path, chunks=None) as summary:  # read whole: no dask (0.4 s of imports)
        summary = summary.load()
        experiment = registry(modules).get(summary.attrs["experiment"])
        drawn = drawn_width(experiment, width)
        if drawn > width:
            print(f"{experiment.name}: drawn {drawn:g} in wide, not figure_width = {width:g}: its panels "
                  "side by side have no layout narrower")
        render(summary, outputs, source=summary_path, experiment_modules=modules, width=width, part=part)


__all__ = ["aggregate_job", "batch_params", "cell_name", "entries_params", "plot_job", "provenance",
           "simulate_job", "spec_params", "stop_on_sigterm", "sweep_from_workflow"]
