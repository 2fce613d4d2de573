import json
import re
import sys
from pathlib import Path

from attnflow import resources
from attnflow.plan import jobs_get_gpus
from attnflow.errors import ConfigError
from attnflow.run.failures import failure_report, figure_caption, known_failures_notice
from attnflow.run.health import damage_line
from attnflow.run.jobs import batch_params, entries_params, spec_params, sweep_from_workflow
from attnflow.run.lock import ResultsBusy, lock_results, results_holder
from attnflow.run.owner import claim_results, foreign_owner
from attnflow.run.summaries import leaving_line, leaving_points
from attnflow.run.tickets import find_repairs, find_summary_repairs, repair_tickets, summary_tickets


try:
    SWEEP = sweep_from_workflow(config, workflow.configfiles)
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None
# The config file whose name gives a config without `results:` its directory (results/<name>), and
# which the results directory records as its owner.
CONFIGFILE = workflow.configfiles[-1] if workflow.configfiles else None
# Resolved once, here: every job reads its results directory from the config it is given.
config["results"] = SWEEP.config["results"]

for _name, _why in SWEEP.skipped.items():
    print(f"attnflow: skipping experiment {_name}: {_why}", file=sys.stderr)

# GPUs for the jobs whose cells run on the JAX engine (attnflow.resources): as `--resources gpu=N` declares
# (a cluster's login node sees none: N > 0 says its jobs may have them; gpu=0 runs the JAX engine on the
# CPU), else where jax sees one on this machine, asked only if a cell's engine is auto (in a child process:
# jax's first look at a GPU claims its memory). A local run gets one GPU job at a time unless told more:
# two jobs on one device would each claim most of its memory.
DECLARED_GPUS = workflow.global_resources.get("gpu").value
GPUS = jobs_get_gpus(SWEEP, DECLARED_GPUS)
if (DECLARED_GPUS is None and workflow.local_exec and not workflow.remote_exec and not workflow.subprocess_exec
        and any(resources.gpu_request(cells, GPUS) for cells in SWEEP.batches.values())):
    workflow.register_resource("gpu", 1)

# Every output path comes from the sweep's Layout (attnflow.layout); rules name their wildcards through it.
LAYOUT = SWEEP.layout
RESULTS = str(SWEEP.results)
EXPERIMENT_NAMES = list(SWEEP.specs)
MODULES = json.dumps(config.get("experiment_modules", []))


# Every figure of every experiment, by name (an experiment may draw several: Layout.figure_names).
FIGURE_NAMES = [figure for name in EXPERIMENT_NAMES for figure in LAYOUT.figure_names(name)]


wildcard_constraints:
    experiment="|".join(EXPERIMENT_NAMES),
    figure="|".join(FIGURE_NAMES),
    batch="[A-Za-z0-9._+-]+",


# Another controller running on these results (see hold_results): its jobs rewrite what the health check
# below reads, so no ticket is written; a run then fails at its start, a dry run plans without them.
_HOLDER = None if workflow.remote_exec or workflow.subprocess_exec else results_holder(SWEEP.results)
if _HOLDER:
    print(
        f"attnflow: another controller ({_HOLDER}) runs on {SWEEP.results}: stores not checked while its "
        "jobs write them (the jobs listed may lack repairs), and a run with jobs to do stops at its start "
        "until it ends",
        file=sys.stderr,
    )

# One config per results directory: a run of another config there would drop its cells and summaries.
# A run is refused at its start (hold_results); a dry run, which changes nothing, says so and plans on.
_FOREIGN = None if workflow.remote_exec or workflow.subprocess_exec else foreign_owner(SWEEP, CONFIGFILE)
if _FOREIGN:
    print(f"attnflow: a run would be refused: {_FOREIGN}", file=sys.stderr)

# Self-healing: a finished batch one of whose stores is missing or does not match its
# completion record gets a repair ticket, a new input of its simulate job: the job
# reruns and recomputes those stores alone; an outdated summary gets one too, an input of its
# aggregate and plot jobs. The tickets are found here and written by the `ticket` rule's jobs
# (rules/ticket.smk), the first of a run: a dry run lists those jobs, and so every job they rerun,
# and writes nothing. Jobs running on a cluster node parse this file too: only the main process
# looks for damage.
TICKETS = {}  # path -> text of every ticket this start issues
if not workflow.remote_exec and not _HOLDER and not _FOREIGN:  # never a ticket in another config's results
    _damage, _tickets = find_repairs(SWEEP)
    TICKETS.update(_tickets)
    for _batch, _problems in _damage.items():
        for _path, _state in _problems:
            print(damage_line(SWEEP, _batch, _path, _state), file=sys.stderr)
    # Failures the numbers decided are not retried: said once, with how to force them.
    _known = known_failures_notice(SWEEP)
    if _known:
        print(_known, file=sys.stderr)
    _old = LAYOUT.old_stores()
    if _old:
        print(
            f"attnflow: {len(_old)} stores in {SWEEP.stores} are in the layout of attnflow 0.1 (a directory "
            "per cell), which this version does not read: their cells are computed again, into one file "
            f"per batch; delete them to free their files (the directories {_old[0].name}, ...)",
            file=sys.stderr,
        )
    _outdated, _tickets = find_summary_repairs(SWEEP)
    TICKETS.update(_tickets)
    for _name, _why in _outdated.items():
        print(
            f"attnflow: the summary of {_name} is {_why}: rebuilt, with its figure",
            file=sys.stderr,
        )
    # A value removed from a grid: its points leave the summary; their cells stay stored.
    for _name, (_points, _values) in leaving_points(SWEEP).items():
        print(leaving_line(_name, _points, _values), file=sys.stderr)
# The `ticket` rule makes exactly these files (a ticket already written, a record of a past repair, is
# no job's output: Snakemake would rerun its job for a changed rule); none when none is issued.
REPAIRS = LAYOUT.repairs("")  # every ticket's directory is under it
TICKET_NAMES = "|".join(re.escape(str(Path(p).relative_to(REPAIRS).with_suffix(""))) for p in TICKETS) or "(?!)"


def hold_results():
    """One controller per results directory, for its lifetime: a second one fails at once, naming the
    holder (two would run every job twice). Called by the Snakefile's onstart, which Snakemake runs once the
    DAG is built and before any job, in the main process only and never in a dry run (which changes
    nothing); at parse time a dry run cannot be told from a run."""
    if workflow.remote_exec or workflow.subprocess_exec:
        return
    if _FOREIGN:
        raise WorkflowError(f"attnflow: {_FOREIGN}")
    try:
        lock_results(SWEEP.results)
    except ResultsBusy as err:
        raise WorkflowError(f"attnflow: {err}") from None
    # Asked again under the lock: another config's controller may have claimed the directory since parse time.
    foreign = foreign_owner(SWEEP, CONFIGFILE)
    if foreign:
        raise WorkflowError(f"attnflow: {foreign}")
    claim_results(SWEEP, CONFIGFILE)  # this config owns the results directory from now on


def refuse_foreign():
    """A run (not a dry run) of a config on another config's results fails before its DAG is built:
    even where it would have nothing to do, since then the figures it leaves in place are the other
    config's. Called from the input functions: the DAG is built once Snakemake knows whether it is a
    dry run (onstart, the other check, is skipped when there is nothing to do)."""
    if _FOREIGN and not workflow.dryrun:
        raise WorkflowError(f"attnflow: {_FOREIGN}")


def batch_repairs(wildcards):
    refuse_foreign()
    return repair_tickets(RESULTS, wildcards.batch, TICKETS)


def experiment_tickets(wildcards):
    refuse_foreign()
    return summary_tickets(RESULTS, wildcards.experiment, TICKETS)


def write_params():
    """Whether the job parameter files are written now (attnflow.jobparams): by a run, never by a dry run
    (which changes nothing: Snakemake compares the digests, only a job reads the file, and the run that
    follows, or a cluster node parsing this file again for its job, writes it), nor into another
    config's results. Asked in the params functions, once Snakemake knows whether it is a dry run."""
    return not _FOREIGN and not workflow.dryrun


def batch_cells(wildcards):
    """The digest of the batch's cells, which the job reads from the file it names (attnflow.jobparams)."""
    return batch_params(SWEEP, wildcards.batch, write=write_params())


def experiment_manifests(wildcards):
    return [str(LAYOUT.manifest(b)) for b in SWEEP.batches_of(wildcards.experiment)]


def experiment_entries(wildcards):
    """The digest of (grid coordinates, store path, cell id) of every grid point: what the aggregation reads."""
    return entries_params(SWEEP, wildcards.experiment, write=write_params())


def experiment_spec(wildcards):
    return spec_params(SWEEP, wildcards.experiment, write=write_params())


def figure_summary(wildcards):
    return str(LAYOUT.summary(LAYOUT.part_of(wildcards.figure)[0]))


def figure_tickets(wildcards):
    refuse_foreign()
    return summary_tickets(RESULTS, LAYOUT.part_of(wildcards.figure)[0], TICKETS)


def figure_part(wildcards):
    return LAYOUT.part_of(wildcards.figure)[1]


def figure_caption_of(wildcards):
    return figure_caption(SWEEP, LAYOUT.part_of(wildcards.figure)[0])


def experiment_figures(wildcards):
    return [str(path) for path in LAYOUT.figures(wildcards.experiment)]


def simulate_mem_mb(wildcards, attempt):
    return resources.memory_mb(SWEEP.batches[wildcards.batch], attempt, simulate_gpu(wildcards))


def simulate_gpu(wildcards):
    """1 for a job whose cells run on the JAX engine (attnflow.resources.gpu_request), else 0: locally
    Snakemake runs one such job at a time (the gpu resource registered above); on SLURM the plugin asks
    for it (--gpus=1)."""
    return resources.gpu_request(SWEEP.batches[wildcards.batch], GPUS, DECLARED_GPUS)


def simulate_priority(wildcards):
    """The batch's model time in seconds: Snakemake starts the longest simulate jobs first, so that
    none is left running alone at the end (the order plan.makespan assumes)."""
    return int(sum(resources.cell_seconds(c) for c in SWEEP.batches[wildcards.batch]))


def simulate_runtime(wildcards, attempt):
    return resources.runtime_minutes(SWEEP.batches[wildcards.batch], attempt, simulate_gpu(wildcards))
