"""Snakemake script: write a ticket the start-up check issued (its text is the rule's parameter, so a
ticket of any length is written whole; attnflow is not imported)."""

import os
from pathlib import Path

out = Path(snakemake.output.ticket)  # noqa: F821
tmp = out.with_name(out.name + ".tmp")
tmp.write_text(snakemake.params.text)  # noqa: F821
os.replace(tmp, out)  # never a half-written ticket
