rule aggregate:
    """Reduce an experiment's stores lazily with dask into one consolidated summary store."""
    input:
        experiment_manifests,
    output:
        summary=directory(f"{RESULTS}/summaries/{{experiment}}.zarr"),
    params:
        stores=STORES,
        scheduler=config["dask_scheduler"],
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/{{experiment}}.tsv",
    log:
        f"{RESULTS}/logs/aggregate/{{experiment}}.log",
    localrule: True
    script:
        "../scripts/aggregate.py"
