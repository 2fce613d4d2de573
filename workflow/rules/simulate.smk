rule simulate:
    """Integrate the cells of one batch; writes the batch's store (one file) with every cell that is not complete."""
    input:
        repairs=batch_repairs,
    output:
        manifest=str(LAYOUT.manifest("{batch}")),
    params:
        cells=batch_cells,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        str(LAYOUT.benchmark("simulate", "{batch}"))
    log:
        str(LAYOUT.log("simulate", "{batch}")),
    # One thread a job, one job per core: a job's serial parts (start-up, writing its store) overlap
    # another's simulation, and the longest jobs start first. The SLURM profile sets 2 (set-threads).
    threads: 1
    priority: simulate_priority
    resources:
        mem_mb=simulate_mem_mb,
        runtime=simulate_runtime,
        # 1 where a cell runs on the JAX engine: `--resources gpu=1` lets one such job run at a time on a
        # machine; snakemake-executor-plugin-slurm asks SLURM for it (--gpus=1, or --gpus=<model>:1 with a
        # gpu_model resource). 0 for the numba engine's jobs, which never see the GPU.
        gpu=simulate_gpu,
    script:
        "../scripts/simulate.py"
