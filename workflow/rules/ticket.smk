rule ticket:
    """Write a ticket the start-up check issued (common.smk: a repair of a batch, or a summary to
    rebuild), the damage as JSON: an input of the job it reruns. The first jobs of a run; a dry run
    lists them (their reason names the ticket) and writes nothing."""
    output:
        ticket=str(REPAIRS / "{ticket}.ticket"),
    wildcard_constraints:
        ticket=TICKET_NAMES,
    params:
        # Found by the main process, which evaluates the parameters of a local job.
        text=lambda wildcards, output: TICKETS[output.ticket],
    conda:
        "../envs/attnflow.yaml"
    log:
        str(LAYOUT.log("ticket", "{ticket}")),
    localrule: True
    script:
        "../scripts/ticket.py"
