rule plot:
    """Render an experiment's figure as PNG and PDF."""
    input:
        summary=rules.aggregate.output.summary,
        tickets=experiment_tickets,
    output:
        png=report(
            f"{RESULTS}/figures/{{experiment}}.png",
            caption="../report/figure.rst",
            category="Figures",
        ),
        pdf=f"{RESULTS}/figures/{{experiment}}.pdf",
    params:
        modules=MODULES,
        caption=experiment_caption,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        f"{RESULTS}/benchmarks/plot/{{experiment}}.tsv"
    log:
        f"{RESULTS}/logs/plot/{{experiment}}.log",
    localrule: True
    script:
        "../scripts/plot.py"
