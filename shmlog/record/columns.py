"""Decoded records: :class:`RecordColumns` (records as numpy columns pointing into the
batch bytes) and :class:`Record` (one record as Python objects), and the ways from
the first to the second and to Arrow's layout.

Rules
-----
* Columns are made by ``decoding.decode_columns`` from validated batches only; their
  positions index ``data`` and are trusted (no bounds checks).
* Reading a mapped segment copies no record data into the columns: ``data`` is the
  mapping itself for uncompressed batches (inflated batches are a copy).
* Making Python records runs no Python bytecode per record or per field.

Theory of operation
-------------------
:meth:`RecordColumns.records` makes Python records from a range of columns with
C-level operations only: one ``bytes`` copy of the range, keys and values cut
from it (one ``struct`` format per run of equally sized and spaced fields, else a
slice each), columns by ``tolist``, and records by ``tuple.__new__`` mapped over
a ``zip``. The garbage collector is held off while it runs: two tracked objects
per record (the tuple, its headers list) would otherwise start a collection every
few hundred records. :func:`gather_fields` copies one column's fields into Arrow's
variable-size binary layout (``spark``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import operator
import struct
from typing import NamedTuple

import numpy as np

from ..common import limits
from ..native.jit import copy_bytes, kernel

__all__ = ["Record", "RecordColumns", "gather_fields", "FIELD_RUN_RECORDS_MIN"]


class Record(NamedTuple):
    """One record as Python objects (``key``/``value`` are None when null)."""
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list


@dataclasses.dataclass
class RecordColumns:
    """Records as columns. Positions index ``data``: for uncompressed batches read
    from a segment, ``data`` is the mapped segment itself (zero copy).

    ``key_lengths``/``value_lengths`` are -1 for null. Header ``i`` of record ``r``
    is entry ``header_starts[r] + i`` of the ``header_*`` arrays.
    """
    data: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    timestamp_types: np.ndarray
    key_positions: np.ndarray
    key_lengths: np.ndarray
    value_positions: np.ndarray
    value_lengths: np.ndarray
    header_starts: np.ndarray
    header_counts: np.ndarray
    header_key_positions: np.ndarray
    header_key_lengths: np.ndarray
    header_value_positions: np.ndarray
    header_value_lengths: np.ndarray

    def __len__(self) -> int:
        return self.offsets.size

    def _field(self, position: int, length: int) -> bytes | None:
        if length < 0:
            return None
        return self.data[position:position + length].tobytes()

    def key(self, index: int) -> bytes | None:
        return self._field(int(self.key_positions[index]), int(self.key_lengths[index]))

    def value(self, index: int) -> bytes | None:
        return self._field(int(self.value_positions[index]), int(self.value_lengths[index]))

    def headers(self, index: int) -> list[tuple[str, bytes | None]]:
        start = int(self.header_starts[index])
        entries = []
        for header in range(start, start + int(self.header_counts[index])):
            name = self._field(int(self.header_key_positions[header]),
                               int(self.header_key_lengths[header]))
            entries.append((name.decode(errors="replace"),
                            self._field(int(self.header_value_positions[header]),
                                        int(self.header_value_lengths[header]))))
        return entries

    def record(self, index: int) -> Record:
        return Record(int(self.offsets[index]), int(self.timestamps[index]),
                      int(self.timestamp_types[index]), self.key(index), self.value(index),
                      self.headers(index))

    def records(self, factory=Record, *prefix, start: int = 0, stop: int | None = None) -> list:
        """Records ``start`` to ``stop`` as ``factory`` tuples of ``(*prefix, offset,
        timestamp, timestamp_type, key, value, headers)`` (a :class:`Record` by
        default; ``factory`` is a tuple subclass such as a named tuple with those
        fields). Built column by column with C-level operations only: one copy of
        the records' bytes, fields cut from it (``_fields``), ``tolist``, and
        ``tuple.__new__`` mapped over a ``zip`` of the columns; no Python bytecode
        runs per record."""
        stop = len(self) if stop is None else min(stop, len(self))
        if stop <= start:
            return []
        # Two tracked objects per record (the tuple, its headers list) would start a
        # collection every few hundred records, each walking the young objects and
        # ageing the records made so far; held off, one collection follows the range.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._records(factory, prefix, start, stop)
        finally:
            if collecting:
                gc.enable()

    def _records(self, factory, prefix: tuple, start: int, stop: int) -> list:
        low, high = self._span(start, stop)
        data = self.data[low:high].tobytes()
        keys = _fields(data, self.key_positions[start:stop] - low, self.key_lengths[start:stop])
        values = _fields(data, self.value_positions[start:stop] - low,
                         self.value_lengths[start:stop])
        columns = zip(*map(itertools.repeat, prefix), self.offsets[start:stop].tolist(),
                      self.timestamps[start:stop].tolist(),
                      self.timestamp_types[start:stop].tolist(), keys, values,
                      self._header_lists(data, low, start, stop))
        return list(map(tuple.__new__, itertools.repeat(factory), columns))

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes records ``start`` to ``stop`` occupy in ``data``: from the first
        one's key to the last one's last field (records lie in offset order)."""
        last = stop - 1
        high = int(self.value_positions[last]) + max(int(self.value_lengths[last]), 0)
        if self.header_counts[last]:
            entry = int(self.header_starts[last] + self.header_counts[last]) - 1
            high = int(self.header_value_positions[entry]) + \
                max(int(self.header_value_lengths[entry]), 0)
        low = int(self.key_positions[start])
        assert low <= high
        return low, high

    def _header_lists(self, data: bytes, low: int, start: int, stop: int) -> list:
        """Each record's headers as a fresh list of (name, value) pairs (kafka-python's
        shape, so a record's list is its own): the pairs are made for all records at
        once, and ``islice`` cuts them into each record's list."""
        counts = self.header_counts[start:stop]
        total = int(counts.sum())
        if not total:
            return list(map(list, itertools.repeat((), stop - start)))
        first = int(self.header_starts[start])
        entries = slice(first, first + total)
        names = _fields(data, self.header_key_positions[entries] - low,
                        self.header_key_lengths[entries])
        names = map(bytes.decode, names, itertools.repeat("utf-8"), itertools.repeat("replace"))
        values = _fields(data, self.header_value_positions[entries] - low,
                         self.header_value_lengths[entries])
        pairs = zip(names, values)
        return list(map(list, map(itertools.islice, itertools.repeat(pairs), counts.tolist())))

    def from_offset(self, offset: int) -> "RecordColumns":
        """The records at or after ``offset`` (offsets are increasing)."""
        first = int(np.searchsorted(self.offsets, offset))
        if first == 0:
            return self
        return dataclasses.replace(
            self, **{name: getattr(self, name)[first:] for name in _PER_RECORD_COLUMNS})

    def before_offset(self, offset: int) -> "RecordColumns":
        """The records below ``offset``."""
        end = int(np.searchsorted(self.offsets, offset))
        if end == len(self):
            return self
        return dataclasses.replace(
            self, **{name: getattr(self, name)[:end] for name in _PER_RECORD_COLUMNS})


def _fields(data: bytes, positions: np.ndarray, lengths: np.ndarray) -> list:
    """``data[position:position + length]`` per field, None where the length is
    null (-1), without Python bytecode per field; nulls (when some are and some
    are not) are put in place through an object array."""
    if not lengths.size or lengths.min() >= 0:
        return _slices(data, positions, lengths)
    if lengths.max() < 0:
        return [None] * lengths.size
    present = lengths >= 0
    column = np.empty(lengths.size, object)                 # None everywhere
    column[present] = _slices(data, positions[present], lengths[present])
    return column.tolist()


def _slices(data: bytes, positions: np.ndarray, lengths: np.ndarray) -> list:
    """``data[position:position + length]`` per field (none null; positions
    ascending and fields apart, as decoding lays them out). Fields in runs of equal
    gap and length (fixed-size records between batch headers) are unpacked by one
    ``struct`` format of ``"<gap>x<length>s"`` per run, far cheaper than a slice
    object and a slice per field; fields of many different sizes are sliced."""
    count = lengths.size
    if not count:
        return []
    ends = positions + lengths
    gaps = positions.copy()
    gaps[1:] -= ends[:-1]
    # One number per field for its (gap, length): both are below 2**31 (a gap lies
    # within one batch, and batches are at most max.message.bytes, an int32).
    layouts = (gaps << 32) | lengths
    runs = np.flatnonzero(layouts[1:] != layouts[:-1])
    if runs.size * FIELD_RUN_RECORDS_MIN > count:
        return list(map(data.__getitem__, map(slice, positions.tolist(), ends.tolist())))
    firsts = [0, *(runs + 1).tolist()]
    layout = "".join([f"{gap}x{length}s" * size for gap, length, size in zip(
        gaps.take(firsts).tolist(), lengths.take(firsts).tolist(),
        map(operator.sub, [*firsts[1:], count], firsts))])
    return list(_field_format("<" + layout).unpack_from(data))


_field_format = functools.lru_cache(maxsize=limits.FIELD_FORMATS_CACHED_MAX)(struct.Struct)

# Fields per run of equal layout, on average, for one struct format to pay off: a
# run costs a piece of format string and of its compilation (timeit here: slower
# than slicing at 1-2 fields a run, ahead from 4, ~6x cheaper for long runs).
FIELD_RUN_RECORDS_MIN = 8


# Columns with one entry per record (the header_* entry arrays are shared, indexed
# through header_starts, and stay whole when records are sliced off).
_PER_RECORD_COLUMNS = ("offsets", "timestamps", "timestamp_types", "key_positions",
                       "key_lengths", "value_positions", "value_lengths", "header_starts",
                       "header_counts")


@kernel
def gather_fields(data, positions, lengths, out_offsets, out):
    """Copy the fields ``data[positions[i]:+lengths[i]]`` back to back into ``out``
    (a null, length -1, takes no bytes) and write the ``len + 1`` start offsets
    (Arrow's variable-size binary layout). Returns the bytes written."""
    end = 0
    for index in range(lengths.size):
        out_offsets[index] = end
        length = lengths[index]
        if length > 0:
            copy_bytes(out, end, data, positions[index], length)
            end += length
    out_offsets[lengths.size] = end
    return end
