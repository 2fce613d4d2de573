"""``engine.machinery.borrow`` on records that hold a reference-counted object besides arrays and scalars."""

import subprocess
import sys

PROGRAM = """
import numba, numpy as np
from numba.typed import List
from attnflow.engine.machinery.borrow import borrow

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


def test_flat_is_every_entry_in_memory_order_and_writes_through():
    import numba
    import numpy as np

    from attnflow.engine.machinery.borrow import borrow, flat

    @numba.njit
    def weighted_then_incremented(stack, j):
        stack = borrow(stack)
        view = flat(stack[j])  # a 2-d slice of a 3-d array, as the integrator's stages
        total = 0.0
        for i in range(view.size):
            total += view[i] * (i + 1)
            view[i] += 1.0
        return total, view.size

    stack = np.arange(2 * 3 * 5, dtype=float).reshape(2, 3, 5)
    before = stack.copy()
    total, size = weighted_then_incremented(stack, 1)
    assert size == 15
    assert total == float(np.dot(before[1].ravel(), np.arange(1, 16)))  # small integers: exact
    assert np.array_equal(stack[1], before[1] + 1.0) and np.array_equal(stack[0], before[0])


def test_a_record_by_reference_is_the_record_and_writes_through():
    import numba
    import numpy as np

    from attnflow.engine.machinery.borrow import by_reference, dereference

    @numba.njit
    def scale_into(ref, factor):
        source, target, count = dereference(ref)
        for i in range(count):
            target[i] = factor * source[i]
        return source.size

    @numba.njit
    def caller(source, target):
        ref = by_reference((source, target, np.int64(3)))
        return scale_into(ref, 2.0) + scale_into(ref, 2.0)

    source, target = np.arange(1.0, 5.0), np.zeros(4)
    assert caller(source, target) == 8
    assert np.array_equal(target, [2.0, 4.0, 6.0, 0.0])


def test_a_reference_is_one_argument_where_the_record_is_every_scalar_in_it():
    # numba passes a record by value as every scalar of every array in it: the engine's field took 233
    # arguments and measure 446, most written to the stack at each call. A reference is one pointer
    # (field and measure take their records only so: dereference types nothing else).
    import numba
    import numpy as np
    from numba.core.registry import cpu_target

    from attnflow.engine.machinery.borrow import Ref

    record = numba.typeof((np.ones((2, 2)), np.ones((2, 2, 2)), np.ones(3), 1.0))

    def arguments(*types):
        return len(cpu_target.target_context.get_arg_packer(types).argument_types)

    assert arguments(record) == (5 + 2 * 2) + (5 + 2 * 3) + (5 + 2) + 1  # meminfo, parent, sizes, data...
    assert arguments(Ref(record)) == 1
