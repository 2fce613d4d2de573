"""``engine.borrow`` on records that hold a reference-counted object besides arrays and scalars."""

import subprocess
import sys

PROGRAM = """
import numba, numpy as np
from numba.typed import List
from attnflow.engine.borrow import borrow

@numba.njit
def use(a, lst, n):
    total = 0.0
    for _ in range(n):
        x, items = borrow((a, lst))
        total += x[0] + items[0]
    return total

lst = List([1.0, 2.0])
print(use(np.ones(3), lst, 100000), len(lst), lst[0])
"""


def test_a_counted_member_keeps_its_reference():
    # Returned without a reference of its own, the list was released once per call too often: the heap
    # broke within the loop (glibc aborted the process). A subprocess, so a regression fails this test
    # instead of killing the test worker.
    run = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["200000.0", "2", "1.0"]
