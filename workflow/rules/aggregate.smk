rule aggregate:
    """Reduce an experiment's stores lazily with dask into one consolidated summary store."""
    input:
        manifests=experiment_manifests,
        tickets=experiment_tickets,
    output:
        summary=directory(f"{RESULTS}/summaries/{{experiment}}.zarr"),
    params:
        entries=experiment_entries,
        spec=experiment_spec,
        scheduler=config.get("dask_scheduler", "threads"),
        modules=MODULES,
        retire=experiment_figures,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/{{experiment}}.tsv"
    log:
        f"{RESULTS}/logs/aggregate/{{experiment}}.log",
    localrule: True
    script:
        "../scripts/aggregate.py"
