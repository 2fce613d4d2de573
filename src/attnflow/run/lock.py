"""The results directory's lock: one workflow controller at a time on a results directory."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from ..layout import Layout


class ResultsBusy(RuntimeError):
    """Another workflow controller holds the results directory's lock."""


# The locks this process holds, by lock path: open file descriptions, kept for the process's lifetime.
_HELD: dict[Path, int] = {}
# A controller that runs the workflow itself (``attnflow refine``) passes its lock's file descriptor to
# the ``snakemake`` it starts under this name: the same open file description, so the child holds it too.
LOCK_FD_ENV = "ATTNFLOW_RESULTS_LOCK_FD"


def lock_results(results: str | Path) -> Path:
    """Take the results directory's exclusive lock for the rest of this process; return the lock's path.

    Two controllers on one results directory would each run every job (Snakemake's
    own lock is per working directory, and two working copies share results), and
    one's summary would overwrite the other's. So the workflow's main process takes
    ``Layout.lock`` (``flock``, released by the kernel when the process ends, even
    when killed) and a second controller fails at once, naming the holder. Taking
    it again in the same process, or in a ``snakemake`` started by a holder that
    passed its descriptor (``LOCK_FD_ENV``), is a no-op. Raises ``ResultsBusy``.
    """
    path, fd = _acquire(results)
    if fd is None:
        raise ResultsBusy(_busy_message(results, path))
    _HELD[path.resolve()] = fd
    return path


def results_holder(results: str | Path) -> str | None:
    """``"pid N on host"`` of another controller holding the results directory's lock, else None.

    Takes nothing and writes nothing: the workflow asks at parse time (before it
    knows whether it is a dry run) so that it issues no repair tickets under a
    running controller, and a dry run leaves the results directory as it found it
    (the lock file's bytes and time included). Creates nothing where no lock file is.
    """
    path = Layout(results).lock
    if not path.exists() or path.resolve() in _HELD or _inherited_lock(path) is not None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)  # flock needs no write access: the file is not touched
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # the lock, if it was free and so taken, goes with it
    return None


def _acquire(results: str | Path) -> tuple[Path, int | None]:
    """The lock's path and a descriptor holding it (this process's, an inherited one, or a new one
    with this process's id written in it), or None while another process holds it."""
    path = Layout(results).lock
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.resolve() in _HELD:
        return path, _HELD[path.resolve()]
    inherited = _inherited_lock(path)
    if inherited is not None:  # this process's already (its parent's, shared): never closed here
        _HELD[path.resolve()] = inherited
        return path, inherited
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return path, None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    return path, fd


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "a process that has not written its id yet"
    except OSError:
        return "a process that has not written its id yet"


def _busy_message(results: str | Path, path: Path) -> str:
    return (f"results directory {Path(results).absolute()} is in use by another attnflow controller "
            f"({_holder(path)}; lock {path}): two controllers would run every job twice and overwrite "
            "each other's summaries; wait for it to finish or stop it")


def release_results(results: str | Path) -> None:
    """Give up the lock ``lock_results`` took (``refine`` holds it only while it runs)."""
    fd = _HELD.pop(Layout(results).lock.resolve(), None)
    if fd is not None:
        os.close(fd)  # the last descriptor of the open file description: the lock goes with it


def lock_for_child(results: str | Path) -> tuple[dict[str, str], tuple[int]]:
    """``(environment additions, pass_fds)`` under which a ``snakemake`` this process starts (it holds
    the lock, see ``lock_results``) shares the lock instead of failing on it."""
    fd = _HELD[Layout(results).lock.resolve()]
    return {LOCK_FD_ENV: str(fd)}, (fd,)


def _inherited_lock(path: Path) -> int | None:
    """The descriptor named by ``LOCK_FD_ENV`` if it is this lock file and holds its lock."""
    try:
        fd = int(os.environ[LOCK_FD_ENV])
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by this open file description: succeeds
            return fd
    except (KeyError, ValueError, OSError):
        pass
    return None


__all__ = ["LOCK_FD_ENV", "ResultsBusy", "lock_for_child", "lock_results", "release_results",
           "results_holder"]
