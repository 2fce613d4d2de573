"""Job parameters kept in files named by their digest, so that a rule's params stay 16 characters.

Snakemake records a job's params and, when they change, reruns the job and quotes
the old and new values in the dry run's reason. A batch's cells as JSON are tens
of kilobytes (an experiment's grid points more), so a one-value edit printed
hundreds of kilobytes. The rules pass instead the digest of that text (SHA-256),
and the job reads the text from the file it names (``Layout.job_params``): the
digest changes exactly when the text does, so a job reruns exactly when its
cells change. The file is written wherever a run builds its jobs (the
controller, a cluster node parsing the workflow again for its job), unless a
file of that name already holds that text (one edited or damaged is written
again: a hand edit never fails every later run). A dry run writes none:
Snakemake compares the digests, and only the job reads the file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from .layout import Layout

DIGEST_CHARS = 16  # 64 bits: a collision among the few thousand texts of one results folder is ~1e-13


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def put(layout: Layout, text: str, write: bool = True) -> str:
    """The digest naming ``text``, whose file (``Layout.job_params``) is written now unless it exists
    (or ``write`` is False: a dry run, or a run on another config's results, writes nothing)."""
    key = digest(text)
    path = layout.job_params(key)
    if write and not _holds(path, text):  # absent, or edited or damaged since: written (again)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a job on another node parsing at the same time never reads half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return key


def _holds(path, text: str) -> bool:
    """Whether the file at ``path`` holds ``text`` (its size first: an edit most often changes it)."""
    data = text.encode()
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False


def get(layout: Layout, key: str) -> str:
    """The text ``put`` named ``key``, checked against it."""
    path = layout.job_params(key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"job parameters {path} are missing: a run (not a dry run) writes them as it "
                                "builds its jobs; run `snakemake` again") from None
    if digest(text) != key:
        raise ValueError(f"job parameters {path} do not match their digest (edited or damaged since the "
                         "run began): run `snakemake` again, which writes them anew")
    return text


__all__ = ["digest", "get", "put"]
