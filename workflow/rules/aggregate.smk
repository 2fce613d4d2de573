rule aggregate:
    """Reduce an experiment's stores lazily with dask into one consolidated summary store."""
    input:
        manifests=experiment_manifests,
        tickets=experiment_tickets,
    output:
        summary=str(LAYOUT.summary("{experiment}")),
    params:
        entries=experiment_entries,
        spec=experiment_spec,
        scheduler=config.get("dask_scheduler", "threads"),
        modules=MODULES,
        retire=experiment_figures,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        str(LAYOUT.benchmark("aggregate", "{experiment}"))
    log:
        str(LAYOUT.log("aggregate", "{experiment}")),
    localrule: True
    script:
        "../scripts/aggregate.py"
