def figure_report_caption(wildcards):
    """The caption, which the report prints once (attnflow.report.Caption)."""
    from attnflow.report import Caption

    return Caption(figure_caption_of(wildcards))


def figure_report_labels(wildcards):
    from attnflow.report import figure_labels

    return figure_labels(LAYOUT, wildcards.figure)


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
            labels=figure_report_labels,
        ),
        pdf=str(LAYOUT.figure("{figure}", "pdf")),
    params:
        modules=MODULES,
        caption=figure_report_caption,
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
