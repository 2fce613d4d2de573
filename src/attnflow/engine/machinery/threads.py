"""The batch's trajectories on several cores: plain threads running one compiled kernel each.

Every thread runs the same ``nogil`` kernel, which takes the next trajectory
from a shared counter (an atomic fetch-and-add) until none is left: dynamic
scheduling, one trajectory at a time, so a slow trajectory or a busy core
never holds a block of others back. This replaced numba's ``parallel=True``
``prange``, whose parallel-loop lowering cost seconds of the first job's
compilation for each entry point, for a loop that needs none of it.
The arithmetic of a trajectory does not depend on the thread that runs it.

Before its first run in a process, a kernel is compiled for the batch's types,
or loaded from numba's cache, under a lock shared by every process of this user
on this machine that runs this installed engine into the same numba cache
(``compile_once``): jobs that start together on a fresh install compile the
engine once and the others load that cache, instead of each compiling
it again side by side. Processes of another install or another cache do not
wait for it: they would compile all the same. The lock file lives in the
user's own cache directory, beside numba's (``lock_directory``), never in the
shared temporary directory, where another user could create or hold the same
name and make every job wait.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import socket
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def take_next(typingctx, counter):
    """``counter[0] += 1`` atomically; returns the value before (the next item to take)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and counter.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, value=args[0])
        first = cgutils.get_item_pointer(context, builder, sig.args[0], array,
                                         [context.get_constant(types.intp, 0)])
        return builder.atomic_rmw("add", first, context.get_constant(types.int64, 1), "monotonic")

    return types.int64(counter), codegen


@functools.cache
def _helpers(count: int) -> ThreadPoolExecutor:
    """``count`` helper threads, started once per process (starting them costs a millisecond a call)."""
    return ThreadPoolExecutor(count, thread_name_prefix="attnflow-engine")


def lock_directory() -> Path:
    """This user's own cache directory for attnflow, beside numba's user-wide cache:
    ``$XDG_CACHE_HOME/attnflow``, else ``~/.cache/attnflow``; created readable by the user only.

    Raises ``PermissionError`` naming it where it belongs to another user or others may write
    in it (another user could then hold the lock), ``OSError`` where it cannot be created.
    """
    base = os.environ.get("XDG_CACHE_HOME", "")
    where = (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "attnflow"
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = where.stat()
    if status.st_uid != os.getuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{where}: not this user's own directory (owner uid {status.st_uid}, mode "
                              f"{stat.filemode(status.st_mode)})")
    return where


def compile_lock() -> Path:
    """The file whose lock ``compile_once`` holds, in ``lock_directory``: one per machine (a home
    directory may be shared by a cluster's nodes), engine install and numba cache
    (``NUMBA_CACHE_DIR``, or beside the installed sources where it is unset)."""
    where = f"{socket.gethostname()}\0{Path(__file__).resolve().parent}\0{numba.config.CACHE_DIR}"
    return lock_directory() / f"engine-{hashlib.sha256(where.encode()).hexdigest()[:12]}.lock"


def compile_once(kernel, args) -> None:
    """Make ``kernel`` ready for ``args`` without running it: compiled, or loaded from numba's cache,
    by one process of this user at a time on this machine. A process that finds another compiling
    says so on stderr (a job's log) and waits for it, then loads what it cached in well under a
    second. Where no lock can be had (no cache directory of the user's own, a file system without
    locks) it says so and compiles without one: a wait saves time, it is never needed for
    correctness."""
    if kernel.overloads:  # ready in this process: the engine has one specialisation per kernel
        return  # (typing the arguments again costs a small cell's simulate() time)
    signature = tuple(numba.typeof(a) for a in args)
    try:
        path = compile_lock()
        held = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as err:
        print(f"attnflow: compiling the engine without the compile lock ({err})", file=sys.stderr, flush=True)
        kernel.compile(signature)
        return
    try:  # the lock goes with the file when it closes
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"attnflow: waiting for another process compiling the engine ({path}), "
                  "to load what it caches", file=sys.stderr, flush=True)
            fcntl.flock(held, fcntl.LOCK_EX)
        except OSError as err:  # no locks on this file system
            print(f"attnflow: compiling the engine without the compile lock ({err})", file=sys.stderr,
                  flush=True)
        kernel.compile(signature)
    finally:
        os.close(held)


def run_threads(kernel, items: int, *args) -> None:
    """``kernel(counter, *args)`` on ``min(numba.get_num_threads(), items)`` threads (this one included),
    sharing one counter from which the kernel takes its items."""
    counter = np.zeros(1, dtype=np.int64)
    compile_once(kernel, (counter, *args))
    threads = max(1, min(numba.get_num_threads(), items))
    if threads == 1:
        kernel(counter, *args)
        return
    others = [_helpers(threads - 1).submit(kernel, counter, *args) for _ in range(threads - 1)]
    try:
        kernel(counter, *args)
    finally:  # never return (or raise) while a helper still writes into the batch's arrays
        for other in others:
            other.result()


__all__ = ["compile_lock", "compile_once", "lock_directory", "run_threads", "take_next"]
