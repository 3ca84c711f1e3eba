"""numba typed lists and dicts made and changed only by cached kernels.

Rules
-----
* Python code never touches a typed container's methods (``List(...)``,
  ``List.empty_list``, ``Dict.empty``, ``[]``, ``[] =``, ``append``, ``len``,
  iteration): it calls the kernels here, or a kernel of its own, instead.
* A new kind of container gets its maker here, beside the others.

Theory of operation
-------------------
A typed container's Python methods are thin wrappers around small jitted
functions that numba compiles at their first call in every process, for every
item type, and never caches on disk. Making a broker's appender (lists of log
views, indexes, segment states and ring views; a dict of producers' sequences)
compiled about 25 such functions: 3 s of CPU at every broker start, more than
everything else the start does. The same operations inside a kernel declared with
``jit.kernel`` are compiled once and then loaded from numba's disk cache, as every
other kernel is; a container crosses between Python and kernels as an opaque
handle, which costs no compile.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic
from numba.typed import Dict, List

from ..common import limits
from .jit import kernel

__all__ = ["BYTES", "WORDS", "WINDOW", "byte_arrays", "word_arrays", "set_item", "append_item",
           "producer_table", "sequence_table", "transaction_table", "table_size", "get_or",
           "OPEN_TRANSACTION", "abort_list"]

BYTES = numba.typeof(np.zeros(1, np.uint8))     # a contiguous uint8 array
WORDS = numba.typeof(np.zeros(1, np.int64))     # a contiguous int64 array
# A producer's window of last batches, laid out by ``storage.producer_window``: its
# epoch, next sequence and batches held, then each batch's first sequence, last
# sequence and base offset.
WINDOW = types.UniTuple(types.int64, 3 + 3 * limits.PRODUCER_BATCHES_MAX)
_ROW_AND_PRODUCER = types.UniTuple(types.int64, 2)
# An open transaction: its producer epoch and first offset.
OPEN_TRANSACTION = types.UniTuple(types.int64, 2)
_ABORT = types.UniTuple(types.int64, 4)


@kernel
def byte_arrays(count):
    """A typed list of ``count`` empty uint8 arrays (``BYTES``)."""
    arrays = List.empty_list(BYTES)
    for _ in range(count):
        arrays.append(np.zeros(0, np.uint8))
    return arrays


@kernel
def word_arrays(count, width):
    """A typed list of ``count`` zeroed int64 arrays of ``width`` words (``WORDS``)."""
    arrays = List.empty_list(WORDS)
    for _ in range(count):
        arrays.append(np.zeros(width, np.int64))
    return arrays


@kernel
def set_item(items, index, item):
    """``items[index] = item``."""
    items[index] = item


@kernel
def append_item(items, item):
    """``items.append(item)``."""
    items.append(item)


@kernel
def producer_table():
    """An empty dict of producer id -> its window (``producer_snapshots``)."""
    return Dict.empty(key_type=types.int64, value_type=WINDOW)


@kernel
def sequence_table():
    """An empty dict of (row, producer id) -> the producer's window (the appender's)."""
    return Dict.empty(key_type=_ROW_AND_PRODUCER, value_type=WINDOW)


@kernel
def transaction_table():
    """An empty dict of producer id -> its open transaction (``producer_snapshots``)."""
    return Dict.empty(key_type=types.int64, value_type=OPEN_TRANSACTION)


@kernel
def abort_list():
    """An empty list of aborted transactions met by a walk: (producer id, first offset,
    marker offset, last stable offset) each (``producer_snapshots``)."""
    return List.empty_list(_ABORT)


@kernel
def table_size(table):
    """``len(table)`` for a dict made here."""
    return len(table)


@intrinsic
def _present(typingctx, optional):
    """The value of an optional known not to be None (numba's own cast, which
    checks that it is not)."""
    if not isinstance(optional, types.Optional):
        return None

    def codegen(context, builder, signature, args):
        return context.cast(builder, args[0], signature.args[0], signature.return_type)
    return optional.type(optional), codegen


@kernel(inline="always")
def get_or(table, key, default):
    """``table.get(key, default)`` in one lookup, typed as the dict's values: numba
    types ``get`` as optional even with a default, which a tuple's slices and
    indexes do not take, and ``key in table`` before ``table[key]`` looks twice
    (~100 ns against ~30 for one, measured on the appender's sequence table)."""
    return _present(table.get(key, default))
