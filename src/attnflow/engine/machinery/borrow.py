"""Borrowed views: arrays (and records of arrays) without a reference count, for the hot loop.

numba counts references to every array with an atomic add, at each binding of
an array variable and each call that passes one: a record of 14 buffers passed
to an inlined helper costs 28 atomic operations. Where many threads share an
array (the heads, the outputs) those operations also contend for one cache line.
The loop's arrays all live for the whole integration of a trajectory, so it
works on borrowed views: the same data and shape with no owner, which numba's
reference counting skips (a null check, no atomic).

Each compiled function of the loop that is not inlined borrows its array
arguments again on entry, although its callers pass borrowed views: compiled on
its own, a function cannot know that, and calls numba's reference counting
(a function call, then the null check) for every view it takes. Borrowed in the
function itself, the owner is a constant null and the compiler drops those
calls; results are bit-identical.

A borrowed view must not outlive its owner: borrow only arrays whose owner is
bound for longer (an argument of the caller, or a variable used again after the
borrowed views, see ``keep``).

Records go to the loop's compiled functions by reference (``by_reference``,
``dereference``). numba passes a record by value as every scalar of every
array in it: ``field`` took 233 arguments and ``measure`` 446, most of them
written to the stack at each call. A reference is one pointer.

What each of these buys, measured: docs/performance.md, "Engine machinery".
"""

from __future__ import annotations

import numba
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model


def _borrowed(context, builder, ty, value):
    if isinstance(ty, types.Array):
        view = context.make_array(ty)(context, builder, value=value)
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()
    if isinstance(ty, types.BaseTuple):
        items = [_borrowed(context, builder, t, builder.extract_value(value, i))
                 for i, t in enumerate(ty.types)]
        return context.make_tuple(builder, ty, items)
    # Anything else is returned as it is, and the caller owns what an intrinsic returns: a counted
    # object (a typed list, say) needs its own reference, or the caller would release it once too often.
    context.nrt.incref(builder, ty, value)
    return value


@intrinsic
def borrow(typingctx, value):
    """``value`` (an array, or a tuple or record of arrays and scalars) as unowned views."""

    def codegen(context, builder, sig, args):
        return _borrowed(context, builder, sig.args[0], args[0])

    return value(value), codegen


@numba.njit(cache=True, inline="never")
def keep(value):
    """A use of ``value`` that the compiler keeps: its owner lives at least until here."""
    return value


@intrinsic
def flat(typingctx, array):
    """A C-contiguous ``array`` as a borrowed 1-d view of all its entries, in memory order.

    One loop over the n d entries of a small state instead of a loop per token, which vectorises
    where a token's d entries are too few. ``array.ravel()`` gives the same view
    but calls numba's reshape helper each time. Borrowed, so the same rule as ``borrow`` holds.
    """
    if not (isinstance(array, types.Array) and array.layout == "C"):
        return None
    view_type = array.copy(ndim=1)

    def codegen(context, builder, sig, args):
        source = context.make_array(sig.args[0])(context, builder, value=args[0])
        return _view(context, builder, source, view_type, [source.nitems])

    return view_type(array), codegen


@intrinsic
def as_c(typingctx, matrix):
    """A 2-d array whose entries are C-contiguous in memory, whatever its type says (one row of a wider
    matrix, say), typed C-contiguous: a borrowed view, for what takes C-contiguous arrays only
    (``np.dot`` with an output). The caller checks the memory (``blas._contiguous``)."""
    if not (isinstance(matrix, types.Array) and matrix.ndim == 2):
        return None
    view_type = matrix.copy(layout="C")

    def codegen(context, builder, sig, args):
        source = context.make_array(sig.args[0])(context, builder, value=args[0])
        return _view(context, builder, source, view_type, cgutils.unpack_tuple(builder, source.shape, 2))

    return view_type(matrix), codegen


def _view(context, builder, source, view_type, shape):
    """A borrowed view of ``source``'s data with ``shape`` and C-contiguous strides."""
    view = context.make_array(view_type)(context, builder)
    entry = context.get_abi_sizeof(context.get_data_type(view_type.dtype))
    itemsize = context.get_constant(types.intp, entry)
    strides = [itemsize]
    for extent in reversed(shape[1:]):
        strides.insert(0, builder.mul(strides[0], extent))
    context.populate_array(view, data=source.data, shape=cgutils.pack_array(builder, shape),
                           strides=cgutils.pack_array(builder, strides), itemsize=itemsize, meminfo=None)
    return view._getvalue()


class Ref(types.Type):
    """A pointer to a record (a tuple or namedtuple) that lives in the caller's frame (``by_reference``)."""

    def __init__(self, record):
        self.record = record
        super().__init__(name=f"Ref({record})")

    @property
    def key(self):
        return self.record


@register_model(Ref)
class _RefModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, dmm.lookup(fe_type.record).get_value_type().as_pointer())


@intrinsic
def by_reference(typingctx, record):
    """``record`` stored once in the calling function's frame, as a ``Ref`` to pass to compiled functions.

    Valid while the caller runs, and its views while their owners live (the rule of ``borrow``): pass it
    down, never return or keep it.
    """
    if not isinstance(record, types.BaseTuple):
        return None

    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, args[0].type)  # in the entry block: one per call site
        builder.store(args[0], slot)
        return slot

    return Ref(record)(record), codegen


@intrinsic
def dereference(typingctx, ref):
    """The record a ``Ref`` points to, as borrowed views (``borrow``)."""
    if not isinstance(ref, Ref):
        return None

    def codegen(context, builder, sig, args):
        return _borrowed(context, builder, sig.return_type, builder.load(args[0]))

    return ref.record(ref), codegen
