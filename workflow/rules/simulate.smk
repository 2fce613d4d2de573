rule simulate:
    """Integrate the cells of one batch; writes one zarr store per cell that does not exist yet."""
    output:
        manifest=f"{RESULTS}/manifests/{{experiment}}/{{batch}}.json",
    params:
        cells=batch_cells,
        stores=STORES,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        f"{RESULTS}/benchmarks/simulate/{{experiment}}/{{batch}}.tsv",
    log:
        f"{RESULTS}/logs/simulate/{{experiment}}/{{batch}}.log",
    threads: 2
    resources:
        mem_mb=simulate_mem_mb,
        runtime=simulate_runtime,
    script:
        "../scripts/simulate.py"
