# attnflow sweep workflow: config -> simulation stores -> dask summaries -> figures.
from snakemake.utils import min_version

from attnflow.config import check_utf8
from attnflow.errors import ConfigError

min_version("9.0")


# The default config, unless one is given with --configfile (which would otherwise
# be merged into it key by key, mixing two grids). Not `if not config`: --config
# fills `config` before this line, and its values go on top of the default config
# (Snakemake reapplies them after loading the file).
if not workflow.configfiles:
    # Snakemake's reader stops at a config that is not UTF-8 with a traceback naming no file: checked
    # first, one line naming the file and line. (A --configfile is read by Snakemake before this file.)
    try:
        check_utf8("config/config.yaml")
    except ConfigError as err:
        raise WorkflowError(f"invalid config: {err}") from None

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


# The report's landing page (snakemake --report): what the sweep is, how to read it, the docs.
report: "workflow/report/workflow.rst"


rule all:
    input:
        [str(path) for name in EXPERIMENT_NAMES for path in LAYOUT.figures(name)],
        # The tickets this start issued (common.smk), written first: Snakemake runs no job for a missing
        # file by itself, only for one that a job it runs needs, and the jobs they rerun need them.
        list(TICKETS),


include: "workflow/rules/simulate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plot.smk"
include: "workflow/rules/ticket.smk"


# Before any job: the results directory's lock (a second controller fails here, running nothing).
onstart:
    hold_results()


# The run ends with one line on the cells that failed (missing in the figures), if any.
onsuccess:
    _failures = failure_report(SWEEP)
    if _failures:
        print(_failures, file=sys.stderr)
