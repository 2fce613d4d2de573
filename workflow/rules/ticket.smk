rule ticket:
    """Write a ticket the start-up check issued (common.smk: a repair of a batch, or a summary to
    rebuild), the damage as JSON: an input of the job it reruns. The first jobs of a run; a dry run
    lists them (their reason names the ticket) and writes nothing."""
    output:
        ticket=str(REPAIRS / "{ticket}.ticket"),
    wildcard_constraints:
        ticket=TICKET_NAMES,
    params:
        # Found by the main process, where this job runs (a local rule, run in a thread there).
        text=lambda wildcards, output: TICKETS[output.ticket],
    localrule: True
    shell:
        "printf '%s' {params.text:q} > {output.ticket}.tmp && mv {output.ticket}.tmp {output.ticket}"
