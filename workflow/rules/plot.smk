rule plot:
    """Render an experiment's figure as PNG and PDF."""
    input:
        summary=rules.aggregate.output.summary,
        tickets=experiment_tickets,
    output:
        png=report(
            str(LAYOUT.figure("{experiment}", "png")),
            caption="../report/figure.rst",
            category="Figures",
        ),
        pdf=str(LAYOUT.figure("{experiment}", "pdf")),
    params:
        modules=MODULES,
        caption=experiment_caption,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        str(LAYOUT.benchmark("plot", "{experiment}"))
    log:
        str(LAYOUT.log("plot", "{experiment}")),
    localrule: True
    script:
        "../scripts/plot.py"
