"""What ``snakemake --report`` shows of a figure: its labels and its caption, printed once."""

from __future__ import annotations


class Caption(str):
    """A figure's caption as the plot rule's parameter, for its report caption template
    (workflow/report/figure.rst) to print. The report also lists every parameter of the job
    beside the figure, formatting each one (``f"{value}"``): there a caption says where it is
    instead of printing itself a second time. Anything else sees the text (``str``, ``repr``: a
    changed caption still reruns the plot job)."""

    def __format__(self, spec: str) -> str:
        return format("(the caption above)", spec)

    @property
    def rst(self) -> str:
        """The text as reStructuredText reads it back unchanged: its markup characters escaped (a caption's
        ``|u^h_i|`` is no substitution, ``beta*(H, n)`` no emphasis, ``x_`` no link)."""
        out = str(self).replace("\\", "\\\\")
        for char in "*|_`":
            out = out.replace(char, "\\" + char)
        return out


def figure_labels(layout, figure: str) -> dict[str, str]:
    """The report's labels of a figure: its experiment and its part (``-`` for an experiment's only
    figure)."""
    experiment, part = layout.part_of(figure)
    return {"experiment": experiment, "part": part or "-"}


__all__ = ["Caption", "figure_labels"]
