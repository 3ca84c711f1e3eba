"""Atomic operations on shared memory, emitted as LLVM atomics from numba.

These are the only memory-ordering primitives shmlog uses across processes. Each
takes a 1-D C-contiguous int64 array (a numpy view of shared memory) and an element
index; the element must be 8-byte aligned, which every layout guarantees.

* :func:`load_acquire` - no later read or write of this thread moves before it: after
  seeing a published counter, the bytes it covers are visible.
* :func:`store_release` - no earlier read or write moves after it: bytes written
  before the store are visible to whoever acquires the new value.
* :func:`load_relaxed` / :func:`store_relaxed` - atomic (never torn, never hoisted
  out of a loop the way a plain load can be) but unordered.
* :func:`compare_and_swap` - sequentially consistent; returns the previous value.
* :func:`fetch_add` - sequentially consistent; returns the previous value.
* :func:`fence` - a sequentially consistent fence (a full barrier: the Dekker
  pattern of "store my flag, then read yours" needs it even on x86).

A spin loop must use one of the loads here: a plain ``array[index]`` may be hoisted
out of the loop by the compiler and spin forever. Python code calls the ``py_*``
wrappers, which are compiled functions around the same intrinsics.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

from .jit import kernel

__all__ = ["load_acquire", "load_relaxed", "store_release", "store_relaxed",
           "compare_and_swap", "fetch_add", "fence",
           "py_load_acquire", "py_store_release", "py_compare_and_swap", "py_fetch_add",
           "py_fence"]

_ALIGN = 8


def _is_word_array(array) -> bool:
    return (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
            and array.dtype in (types.int64, types.uint64))


def _pointer(context, builder, array_type, array, index_type, index):
    data = context.make_array(array_type)(context, builder, array).data
    position = context.cast(builder, index, index_type, types.intp)
    return builder.gep(data, [position])


def _make_load(ordering):
    @intrinsic
    def load(typingctx, array, index):
        if not _is_word_array(array) or not isinstance(index, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            pointer = _pointer(context, builder, signature.args[0], args[0],
                               signature.args[1], args[1])
            return builder.load_atomic(pointer, ordering, _ALIGN)

        return array.dtype(array, index), codegen
    return load


def _make_store(ordering):
    @intrinsic
    def store(typingctx, array, index, value):
        if not _is_word_array(array) or not isinstance(index, types.Integer) \
                or not isinstance(value, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            pointer = _pointer(context, builder, signature.args[0], args[0],
                               signature.args[1], args[1])
            stored = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
            builder.store_atomic(stored, pointer, ordering, _ALIGN)
            return context.get_dummy_value()

        return types.none(array, index, value), codegen
    return store


load_acquire = _make_load("acquire")
load_relaxed = _make_load("monotonic")
store_release = _make_store("release")
store_relaxed = _make_store("monotonic")


@intrinsic
def compare_and_swap(typingctx, array, index, expected, new):
    """Set ``array[index] = new`` if it equals ``expected``; return the old value."""
    if not _is_word_array(array) or not all(isinstance(argument, types.Integer)
                                            for argument in (index, expected, new)):
        return None

    def codegen(context, builder, signature, args):
        word = signature.args[0].dtype
        pointer = _pointer(context, builder, signature.args[0], args[0],
                           signature.args[1], args[1])
        expected_value = context.cast(builder, args[2], signature.args[2], word)
        new_value = context.cast(builder, args[3], signature.args[3], word)
        pair = builder.cmpxchg(pointer, expected_value, new_value, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return array.dtype(array, index, expected, new), codegen


@intrinsic
def fetch_add(typingctx, array, index, increment):
    """Atomically add ``increment`` to ``array[index]``; return the old value."""
    if not _is_word_array(array) or not isinstance(index, types.Integer) \
            or not isinstance(increment, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        pointer = _pointer(context, builder, signature.args[0], args[0],
                           signature.args[1], args[1])
        amount = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        return builder.atomic_rmw("add", pointer, amount, "seq_cst")

    return array.dtype(array, index, increment), codegen


@intrinsic
def fence(typingctx):
    """A sequentially consistent fence."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.none(), codegen


# --- compiled wrappers for Python callers -----------------------------------------------

@kernel
def py_load_acquire(array, index):
    return load_acquire(array, index)


@kernel
def py_store_release(array, index, value):
    store_release(array, index, value)


@kernel
def py_compare_and_swap(array, index, expected, new):
    return compare_and_swap(array, index, expected, new)


@kernel
def py_fetch_add(array, index, increment):
    return fetch_add(array, index, increment)


@kernel
def py_fence():
    fence()
