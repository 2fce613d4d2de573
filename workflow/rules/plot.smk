# The report's labels of a figure and its caption, printed once (attnflow.report).
from attnflow.report import Caption, figure_labels


rule plot:
    """Render one figure of an experiment as PNG and PDF (an experiment may draw several:
    Layout.figures)."""
    input:
        summary=figure_summary,
        tickets=figure_tickets,
    output:
        png=report(
            str(LAYOUT.figure("{figure}", "png")),
            caption="../report/figure.rst",
            category="Figures",
            labels=lambda wildcards: figure_labels(LAYOUT, wildcards.figure),
        ),
        pdf=str(LAYOUT.figure("{figure}", "pdf")),
    params:
        modules=MODULES,
        caption=lambda wildcards: Caption(figure_caption_of(wildcards)),
        width=config.get("figure_width", 7.0),
        part=figure_part,
    conda:
        "../envs/attnflow.yaml"
    benchmark:
        str(LAYOUT.benchmark("plot", "{figure}"))
    log:
        str(LAYOUT.log("plot", "{figure}")),
    localrule: True
    script:
        "../scripts/plot.py"
