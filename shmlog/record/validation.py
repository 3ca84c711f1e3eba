"""Validation of record batches: the checks every byte from outside (a producer, a
ring, a disk, a peer) passes before anything trusts it, as compiled kernels.

Rules
-----
* A check reads nothing outside the bytes it is given (``buffer[position:end]``),
  and reads a field only after the frame (:func:`batch_frame`) proved it is there.
* Kernels return a :class:`BatchStatus` value (0: OK) and a length or position; they
  never raise. The Python callers (``decoding``, ``compression``, ``segments``, the
  appender) raise ``CorruptRecordError`` or complete with the code.
* Decoding trusts only bytes that passed :func:`check_batch` with its records
  walked. ``decoding`` walks the records of the batches it decodes itself, with
  every check of :func:`walk_records` in the same order: change both together.

Theory of operation
-------------------
:func:`batch_frame` is the step of every walk over batches: the length field, and
whether a whole batch is framed there. :func:`check_batch` builds on it: magic and
version (bytes that are not a batch say so), the CRC32C, the attributes, the record
count and timestamps, then with ``check_records`` the records of an uncompressed
batch (:func:`walk_records`: every length inside its record, offset deltas
increasing, headers within bounds). A zstd batch's records are walked once inflated
(``compression.check_inflated``). :func:`check_produced_batch` adds what only a
producer's batch must be, and :func:`walk_batches` checks batches laid back to back.
"""

from __future__ import annotations

import enum

import numpy as np

from ..common import limits
from ..native.crc32c import crc32c_kernel
from ..native.jit import kernel, load_i32, load_i64, load_u16, load_u32
from . import batch_layout as L

__all__ = ["BatchStatus", "walk_records", "batch_frame", "check_batch", "check_produced_batch",
           "walk_batches"]


class BatchStatus(enum.IntEnum):
    """What a validating walk over batches found; kernels return these as ints."""
    OK = 0
    END_OF_DATA = 1        # a zero length: preallocated space never written
    TRUNCATED = 2          # the batch runs past the end of the bytes we have
    BAD_LENGTH = 3
    BAD_MAGIC = 4
    BAD_VERSION = 5
    BAD_CRC = 6
    BAD_ATTRIBUTES = 7
    BAD_RECORD_COUNT = 8
    BAD_RECORD = 9         # a record's lengths do not fit, or deltas go backwards
    BAD_TIMESTAMP = 10
    BAD_COMPRESSION = 11   # the zstd frame does not inflate to valid records
    BAD_OFFSET = 12        # offsets go backwards, wrap, or leave the segment's range


_OK = int(BatchStatus.OK)
_END_OF_DATA = int(BatchStatus.END_OF_DATA)
_TRUNCATED = int(BatchStatus.TRUNCATED)
_BAD_LENGTH = int(BatchStatus.BAD_LENGTH)
_BAD_MAGIC = int(BatchStatus.BAD_MAGIC)
_BAD_VERSION = int(BatchStatus.BAD_VERSION)
_BAD_CRC = int(BatchStatus.BAD_CRC)
_BAD_ATTRIBUTES = int(BatchStatus.BAD_ATTRIBUTES)
_BAD_RECORD_COUNT = int(BatchStatus.BAD_RECORD_COUNT)
_BAD_RECORD = int(BatchStatus.BAD_RECORD)
_BAD_TIMESTAMP = int(BatchStatus.BAD_TIMESTAMP)
_BAD_OFFSET = int(BatchStatus.BAD_OFFSET)


@kernel
def walk_records(buffer, start, end, record_count, last_offset_delta,
                 first_timestamp, max_timestamp, check_timestamps):
    """Walk uncompressed records in ``buffer[start:end]``; return (status, position)."""
    position = start
    count = 0
    previous_delta = -1
    while position < end:
        if end - position < L.RECORD_HEADER_LENGTH:
            return _BAD_RECORD, position
        record_length = np.int64(load_u32(buffer, position + L.RECORD_LENGTH_OFFSET))
        if record_length < L.RECORD_HEADER_LENGTH or record_length > end - position:
            return _BAD_RECORD, position
        offset_delta = np.int64(load_u32(buffer, position + L.OFFSET_DELTA_OFFSET))
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            return _BAD_RECORD, position
        previous_delta = offset_delta
        if check_timestamps:
            timestamp = first_timestamp + load_i64(buffer, position + L.TIMESTAMP_DELTA_OFFSET)
            if timestamp > max_timestamp or timestamp < L.NO_TIMESTAMP:
                return _BAD_TIMESTAMP, position
        key_length = np.int64(load_i32(buffer, position + L.KEY_LENGTH_OFFSET))
        value_length = np.int64(load_i32(buffer, position + L.VALUE_LENGTH_OFFSET))
        header_count = np.int64(load_u32(buffer, position + L.HEADER_COUNT_OFFSET))
        if key_length < L.NULL_LENGTH or value_length < L.NULL_LENGTH:
            return _BAD_RECORD, position
        if header_count > limits.RECORD_HEADER_COUNT_MAX:
            return _BAD_RECORD, position
        record_end = position + record_length
        field = position + L.RECORD_HEADER_LENGTH + max(key_length, 0) + max(value_length, 0)
        if field > record_end:
            return _BAD_RECORD, position
        for _ in range(header_count):
            if record_end - field < L.HEADER_ENTRY_LENGTH:
                return _BAD_RECORD, position
            header_key_length = np.int64(load_u32(buffer, field + L.HEADER_KEY_LENGTH_OFFSET))
            header_value_length = np.int64(load_i32(buffer, field + L.HEADER_VALUE_LENGTH_OFFSET))
            if header_value_length < L.NULL_LENGTH:
                return _BAD_RECORD, position
            field += L.HEADER_ENTRY_LENGTH + header_key_length + max(header_value_length, 0)
            if field > record_end:
                return _BAD_RECORD, position
        if field != record_end:
            return _BAD_RECORD, position
        position = record_end
        count += 1
    if count != record_count:
        return _BAD_RECORD_COUNT, start
    return _OK, end


@kernel
def batch_frame(buffer, position, end):
    """The step of every walk over batches: (status, length) of the batch at
    ``position`` in ``buffer[:end]``, its one bounds check.

    ``OK`` when a whole batch is framed there (``HEADER_LENGTH <= length <= end -
    position``): the walk may read its header and step to ``position + length``.
    Otherwise ``END_OF_DATA`` (a zero length: preallocated space never written),
    ``TRUNCATED`` (fewer than ``HEADER_LENGTH`` bytes left, or a length past
    ``end``) or ``BAD_LENGTH`` (a length shorter than a header), and the walk
    stops. The length is returned as read (0 when not even the length field fits).
    Nothing but the length is checked: :func:`check_batch` builds on this.
    """
    available = end - position
    if available < L.BATCH_LENGTH_SIZE:
        return _TRUNCATED, np.int64(0)
    length = np.int64(load_u32(buffer, position + L.BATCH_LENGTH_OFFSET))
    if length == 0:
        return _END_OF_DATA, length
    if available < L.HEADER_LENGTH:
        return _TRUNCATED, length
    if length < L.HEADER_LENGTH:
        return _BAD_LENGTH, length
    if length > available:
        return _TRUNCATED, length
    return _OK, length


@kernel
def check_batch(buffer, position, end, check_crc, check_records):
    """Validate the batch at ``position`` in ``buffer[:end]``: (status, batch_length),
    status a :class:`BatchStatus` value (0: OK), checked in this order: the frame
    (:func:`batch_frame`; a zero length is ``END_OF_DATA``), magic and version
    before a bad length (bytes that are not a batch say so), then with
    ``check_crc`` the CRC32C, then attributes, record count and timestamps.

    With ``check_records`` the records of an uncompressed batch are walked too;
    zstd batches need inflating first, which :func:`check_inflated` does.
    Reads nothing outside ``buffer[position:end]``.
    """
    status, length = batch_frame(buffer, position, end)
    if status == _END_OF_DATA or end - position < L.HEADER_LENGTH:
        return status, length
    if load_u16(buffer, position + L.MAGIC_OFFSET) != L.MAGIC:
        return _BAD_MAGIC, length
    if buffer[position + L.VERSION_OFFSET] != L.VERSION:
        return _BAD_VERSION, length
    if status != _OK:
        return status, length
    if check_crc:
        expected = load_u32(buffer, position + L.CRC_OFFSET)
        if crc32c_kernel(buffer, position + L.CRC_COVERED_OFFSET, position + length) != expected:
            return _BAD_CRC, length
    if buffer[position + L.RESERVED_OFFSET] != 0:
        return _BAD_ATTRIBUTES, length
    attributes = np.int64(load_u16(buffer, position + L.ATTRIBUTES_OFFSET))
    codec = attributes & L.CODEC_MASK
    if attributes & ~L.ATTRIBUTES_KNOWN_MASK or (codec != L.CODEC_NONE and codec != L.CODEC_ZSTD):
        return _BAD_ATTRIBUTES, length
    record_count = np.int64(load_i32(buffer, position + L.RECORD_COUNT_OFFSET))
    last_offset_delta = np.int64(load_i32(buffer, position + L.LAST_OFFSET_DELTA_OFFSET))
    if record_count < 0 or last_offset_delta < 0 or last_offset_delta < record_count - 1:
        return _BAD_RECORD_COUNT, length
    first_timestamp = load_i64(buffer, position + L.FIRST_TIMESTAMP_OFFSET)
    max_timestamp = load_i64(buffer, position + L.MAX_TIMESTAMP_OFFSET)
    if first_timestamp < L.NO_TIMESTAMP or max_timestamp < first_timestamp:
        return _BAD_TIMESTAMP, length
    if check_records and codec == L.CODEC_NONE:
        create_time = (attributes & L.TIMESTAMP_TYPE_BIT) == 0
        status, _ = walk_records(buffer, position + L.RECORDS_OFFSET, position + length,
                                 record_count, last_offset_delta, first_timestamp,
                                 max_timestamp, create_time)
        if status != _OK:
            return status, length
    return _OK, length


@kernel
def check_produced_batch(buffer, position, end, check_crc):
    """:func:`check_batch` (records walked) plus what only a producer's batch must be: at least one
    record and dense offset deltas (``last_offset_delta == record_count - 1``; with
    the records' strictly increasing deltas that makes them exactly 0..n-1).
    Compaction leaves stored batches sparser; recovery and reads accept those."""
    status, length = check_batch(buffer, position, end, check_crc, True)
    if status != _OK:
        return status, length
    record_count = np.int64(load_i32(buffer, position + L.RECORD_COUNT_OFFSET))
    last_offset_delta = np.int64(load_i32(buffer, position + L.LAST_OFFSET_DELTA_OFFSET))
    if record_count < 1 or last_offset_delta != record_count - 1:
        return _BAD_RECORD_COUNT, length
    return _OK, length


@kernel
def walk_batches(buffer, start, end, check_crc, check_records, positions):
    """Validate consecutive batches from ``start``; stop at the first bad one.

    Fills ``positions`` with each good batch's start (as far as it has room).
    Returns (status, count, end of the last good batch).
    """
    position = start
    count = 0
    while position < end:
        status, length = check_batch(buffer, position, end, check_crc, check_records)
        if status != _OK:
            return status, count, position
        if count < positions.size:
            positions[count] = position
        count += 1
        position += length
    return _OK, count, position
