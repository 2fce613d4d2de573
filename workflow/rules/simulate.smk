rule simulate:
    """Integrate the cells of one batch; writes one zarr store per cell that is not complete."""
    input:
        repairs=batch_repairs,
    output:
        manifest=f"{RESULTS}/manifests/{{batch}}.json",
    params:
        cells=batch_cells,
        stores=STORES,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        f"{RESULTS}/benchmarks/simulate/{{batch}}.tsv"
    log:
        f"{RESULTS}/logs/simulate/{{batch}}.log",
    threads: 2
    resources:
        mem_mb=simulate_mem_mb,
        runtime=simulate_runtime,
    script:
        "../scripts/simulate.py"
