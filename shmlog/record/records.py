"""Encode, validate and decode record batches (the layout is in batch_layout).

Theory of operation
-------------------
Producers hand us records as Python objects or as numpy arrays: a batch at once
(:func:`encode_batch`), or the records ``Producer.send`` gathered one at a time,
their fields already checked (:func:`encode_gathered`). Either way each field
becomes a column - its bytes back to back and a byte length per record (-1: null),
built at C speed (``b"".join``, ``map(len, ...)``) - and one compiled kernel,
:func:`_encode_batch`, writes every record header, copies every field, and writes
the batch header and its CRC32C. zstd, when asked for, compresses the records
region as one frame and the header is written again around it.

:func:`validate_batches` checks bytes that came from anywhere (a producer, a ring,
a disk): structure, CRC, attributes and, record by record, that every length stays
inside its batch. It reports the first problem as a :class:`BatchStatus` and the
byte position where it starts. Decoding trusts only validated bytes.

:func:`decode_columns` turns a run of whole batches into :class:`RecordColumns`:
numpy arrays of offsets, timestamps and key/value positions that point into the
batch bytes themselves, so reading a mapped segment copies no record data (zstd
batches are inflated first; that copy is unavoidable).

:meth:`RecordColumns.records` makes Python records from a range of columns with
C-level operations only: one ``bytes`` copy of the range, keys and values cut
from it (one ``struct`` format per run of equally sized and spaced fields, else a
slice each), columns by ``tolist``, and records by ``tuple.__new__`` mapped over
a ``zip``. The garbage collector is held off while it runs: two tracked objects
per record (the tuple, its headers list) would otherwise start a collection every
few hundred records.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gc
import itertools
import operator
import struct
import time
from typing import Iterator, NamedTuple

import numpy as np
import zstandard

from ..common import limits
from ..common.errors import CorruptRecordError, LocalProtocolError, RecordTooLargeError
from ..native.crc32c import crc32c_kernel
from ..native.jit import (
    copy_bytes,
    kernel,
    load_i32,
    load_i64,
    load_u16,
    load_u32,
    store_i16,
    store_i32,
    store_i64,
    store_u16,
    store_u32,
)
from . import batch_layout as L

__all__ = [
    "BatchStatus", "BatchInfo", "Record", "RecordColumns", "Compression",
    "encode_batch", "encode_gathered", "check_headers", "check_timestamp", "validate_batches",
    "iter_batches", "decode_columns", "decode_records", "warm_decoding",
    "batch_frame", "check_batch", "check_produced_batch", "check_inflated", "inflate_records",
]


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


class Compression(enum.Enum):
    NONE = L.CODEC_NONE
    ZSTD = L.CODEC_ZSTD

    @classmethod
    def parse(cls, value) -> "Compression":
        """Accept None, "none", "uncompressed", "zstd" or a member."""
        if value is None or isinstance(value, Compression):
            return value or cls.NONE
        names = {"none": cls.NONE, "uncompressed": cls.NONE, "zstd": cls.ZSTD}
        try:
            return names[str(value).lower()]
        except KeyError:
            raise LocalProtocolError(
                f"compression {value!r} is not supported; use None or 'zstd'") from None


# zstd level 3 is Kafka's default (compression.zstd.level).
ZSTD_LEVEL = 3


# --- validation kernels -------------------------------------------------------------

@kernel
def _check_records(buffer, start, end, record_count, last_offset_delta,
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
        status, _ = _check_records(buffer, position + L.RECORDS_OFFSET, position + length,
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
def _walk_batches(buffer, start, end, check_crc, check_records, positions):
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


# --- encoding -------------------------------------------------------------------------

@kernel
def _write_header(out, length, attributes, record_count, first_timestamp, max_timestamp,
                  producer_id, producer_epoch, base_sequence):
    store_u32(out, L.BATCH_LENGTH_OFFSET, length)
    store_u16(out, L.MAGIC_OFFSET, L.MAGIC)
    out[L.VERSION_OFFSET] = L.VERSION
    out[L.RESERVED_OFFSET] = 0
    store_i64(out, L.BASE_OFFSET_OFFSET, 0)
    store_i32(out, L.LEADER_EPOCH_OFFSET, 0)
    store_u16(out, L.ATTRIBUTES_OFFSET, attributes)
    store_i16(out, L.PRODUCER_EPOCH_OFFSET, producer_epoch)
    store_i32(out, L.RECORD_COUNT_OFFSET, record_count)
    store_i32(out, L.LAST_OFFSET_DELTA_OFFSET, max(record_count - 1, 0))
    store_i32(out, L.BASE_SEQUENCE_OFFSET, base_sequence)
    store_i64(out, L.PRODUCER_ID_OFFSET, producer_id)
    store_i64(out, L.FIRST_TIMESTAMP_OFFSET, first_timestamp)
    store_i64(out, L.MAX_TIMESTAMP_OFFSET, max_timestamp)
    store_u32(out, L.CRC_OFFSET, crc32c_kernel(out, L.CRC_COVERED_OFFSET, length))


@kernel
def _write_headers(out, position, count, headers, header_at, name_lengths, value_lengths,
                   header):
    """Write ``count`` header entries at ``position``, from entry ``header`` of the
    length columns and byte ``header_at`` of ``headers``. Returns (end, the next
    entry, the next byte), or end -1 when an entry runs past its buffer."""
    for _ in range(count):
        if header >= name_lengths.size:
            return -1, header, header_at
        name_length = name_lengths[header]
        value_length = value_lengths[header]
        size = name_length + max(value_length, 0)
        if name_length < 0 or header_at + size > headers.size or \
                position + L.HEADER_ENTRY_LENGTH + size > out.size:
            return -1, header, header_at
        store_u32(out, position + L.HEADER_KEY_LENGTH_OFFSET, name_length)
        store_i32(out, position + L.HEADER_VALUE_LENGTH_OFFSET, value_length)
        position += L.HEADER_ENTRY_LENGTH
        copy_bytes(out, position, headers, header_at, size)
        position += size
        header_at += size
        header += 1
    return position, header, header_at


@kernel
def _encode_batch(out, values, value_lengths, keys, key_lengths, timestamps, header_counts,
                  headers, header_name_lengths, header_value_lengths, attributes, producer_id,
                  producer_epoch, base_sequence):
    """Write a whole batch into ``out``, which is sized for it exactly: the records
    from ``RECORDS_OFFSET``, then the header and its CRC.

    Record ``i``'s value is the next ``value_lengths[i]`` bytes of ``values`` (-1:
    null, no bytes); its key likewise from ``keys`` (``key_lengths`` empty: every key
    null); its timestamp ``timestamps[i]`` (stored relative to the first); its
    ``header_counts[i]`` headers (``header_counts`` empty: none) the next entries of
    the header columns, each a name then a value (-1: null) back to back in
    ``headers``. Returns the batch length, or -1 when a length runs past its buffer
    or the fields do not fill ``out`` and their buffers exactly.
    """
    count = value_lengths.size
    if count == 0 or timestamps.size != count or \
            (key_lengths.size != 0 and key_lengths.size != count) or \
            (header_counts.size != 0 and header_counts.size != count):
        return -1
    first_timestamp = timestamps[0]
    max_timestamp = first_timestamp
    position = np.int64(L.RECORDS_OFFSET)
    value_at = key_at = header_at = header = 0
    for index in range(count):
        value_length = value_lengths[index]
        key_length = key_lengths[index] if key_lengths.size else L.NULL_LENGTH
        value_size = max(value_length, 0)
        key_size = max(key_length, 0)
        if value_at + value_size > values.size or key_at + key_size > keys.size or \
                position + L.RECORD_HEADER_LENGTH + key_size + value_size > out.size:
            return -1
        timestamp = timestamps[index]
        max_timestamp = max(max_timestamp, timestamp)
        header_count = header_counts[index] if header_counts.size else 0
        store_u32(out, position + L.OFFSET_DELTA_OFFSET, index)
        store_i64(out, position + L.TIMESTAMP_DELTA_OFFSET, timestamp - first_timestamp)
        store_i32(out, position + L.KEY_LENGTH_OFFSET, key_length)
        store_i32(out, position + L.VALUE_LENGTH_OFFSET, value_length)
        store_u32(out, position + L.HEADER_COUNT_OFFSET, header_count)
        end = position + L.RECORD_HEADER_LENGTH
        copy_bytes(out, end, keys, key_at, key_size)
        end += key_size
        key_at += key_size
        copy_bytes(out, end, values, value_at, value_size)
        end += value_size
        value_at += value_size
        end, header, header_at = _write_headers(out, end, header_count, headers, header_at,
                                                header_name_lengths, header_value_lengths,
                                                header)
        if end < 0:
            return -1
        store_u32(out, position + L.RECORD_LENGTH_OFFSET, end - position)
        position = end
    if position != out.size or value_at != values.size or key_at != keys.size or \
            header_at != headers.size or header != header_name_lengths.size:
        return -1
    _write_header(out, position, attributes, count, first_timestamp, max_timestamp,
                  producer_id, producer_epoch, base_sequence)
    return position


def check_headers(headers) -> tuple[tuple, int]:
    """One record's headers, checked, as ``((name bytes, value bytes | None), ...)``
    (a copy: the caller may reuse its list), and the bytes their entries take.

    Raises
    ------
    LocalProtocolError
        A header is not a (str, bytes-like | None) pair.
    RecordTooLargeError
        More than ``limits.RECORD_HEADER_COUNT_MAX`` headers.
    """
    if len(headers) > limits.RECORD_HEADER_COUNT_MAX:
        raise RecordTooLargeError(f"a record has {len(headers)} headers; at most "
                                  f"{limits.RECORD_HEADER_COUNT_MAX} are allowed")
    entries = []
    size = 0
    for entry in headers:
        name, value = _header_pair(entry)
        if value is not None:
            if type(value) is not bytes:
                if not _is_bytes_like(value):
                    raise LocalProtocolError(f"a header value must be bytes-like or None, "
                                             f"got {type(value).__name__}")
                value = memoryview(value).tobytes()
            size += len(value)
        size += L.HEADER_ENTRY_LENGTH + len(name)
        entries.append((name, value))
    return tuple(entries), size


def _header_pair(entry) -> tuple[bytes, object]:
    """A header as (encoded name, value), checking it is a (str, value) pair."""
    try:
        name, value = entry
    except (TypeError, ValueError):
        raise LocalProtocolError(
            f"a header must be a (str, bytes | None) pair, got {entry!r}") from None
    if not isinstance(name, str):
        raise LocalProtocolError(f"a header key must be str, got {name!r}")
    return name.encode(), value


# Empty columns: "no bytes", and "every entry null / no headers" for the optional ones.
# Byte buffers are read-only and length columns writable int64 everywhere, so the
# encoding kernel has one signature (see _read_only).
_NO_BYTES = np.frombuffer(b"", np.uint8)
_NO_LENGTHS = np.empty(0, np.int64)


def _read_only(data: np.ndarray) -> np.ndarray:
    """``data`` as a read-only array: what ``np.frombuffer(bytes)`` gives, so a caller's
    writable array does not make numba compile the encoder a second time."""
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False
    return data


# len() counts the bytes of these; of other bytes-like objects (an int32 array, a cast
# memoryview) it counts items, while join() copies bytes.
_PLAIN_BYTES = frozenset((bytes, bytearray))


def _column(values, count: int, what: str, *, bytes_only: bool = False):
    """One field of every record as (its bytes back to back, read-only; the byte length
    of each, -1 for None). ``values`` None: every field null (empty lengths).
    ``bytes_only``: the caller made every entry ``bytes`` or None, so ``len`` is each
    one's byte count and the lengths need no check."""
    if values is None:
        return _NO_BYTES, _NO_LENGTHS
    if type(values) is list and len(values) == count and \
            (bytes_only or _PLAIN_BYTES.issuperset(map(type, values))):
        try:
            data = b"".join(values)
        except TypeError:
            pass                                       # a None: the general path
        else:
            return np.frombuffer(data, np.uint8), np.fromiter(map(len, values), np.int64, count)
    if isinstance(values, np.ndarray):
        if values.dtype == object:
            values = list(values)
        elif values.ndim != 2 or values.dtype != np.uint8:
            values = _as_fixed_width(values, what)
    if isinstance(values, np.ndarray):
        if values.shape[0] != count:
            raise LocalProtocolError(f"{what}: {values.shape[0]} rows for {count} records")
        return (_read_only(np.ascontiguousarray(values).reshape(-1)),
                np.full(count, values.shape[1], np.int64))
    if not isinstance(values, (list, tuple)):
        raise LocalProtocolError(f"{what} must be a list or tuple (or an array of "
                                 f"fixed-size rows), got {type(values).__name__}")
    if len(values) != count:
        raise LocalProtocolError(f"{what}: {len(values)} entries for {count} records")
    try:
        lengths = np.fromiter((-1 if v is None else len(v) if type(v) is bytes
                               else memoryview(v).nbytes for v in values), np.int64, count)
        data = b"".join(v for v in values if v is not None)
    except (TypeError, BufferError, ValueError):
        bad = next((v for v in values if v is not None and not _is_bytes_like(v)), None)
        kind = type(bad).__name__ if bad is not None else "a non-contiguous buffer"
        raise LocalProtocolError(
            f"{what} must be contiguous bytes-like objects or None, got {kind}; "
            f"encode text first (e.g. value.encode())") from None
    return np.frombuffer(data, np.uint8), lengths


def _is_bytes_like(value) -> bool:
    try:
        memoryview(value)
        return True
    except TypeError:
        return False


def _as_fixed_width(values: np.ndarray, what: str) -> np.ndarray:
    """View an (n, ...) array of any fixed-size dtype as n rows of raw bytes."""
    if values.ndim == 0:
        raise LocalProtocolError(f"{what}: expected a sequence or an (n, width) array")
    values = np.ascontiguousarray(values)
    return values.view(np.uint8).reshape(values.shape[0], -1)


def _header_columns(records_headers, count: int):
    """The header columns of a batch from ``(record index, checked headers)`` pairs
    (:func:`check_headers`), for the records that have headers: (per-record counts,
    names and values back to back, name lengths, value lengths)."""
    if not records_headers:
        return _NO_LENGTHS, _NO_BYTES, _NO_LENGTHS, _NO_LENGTHS
    counts = np.zeros(count, np.int64)
    parts, name_lengths, value_lengths = [], [], []
    for index, entries in records_headers:
        counts[index] = len(entries)
        for name, value in entries:
            parts.append(name)
            name_lengths.append(len(name))
            if value is None:
                value_lengths.append(L.NULL_LENGTH)
            else:
                parts.append(value)
                value_lengths.append(len(value))
    if not name_lengths:
        return _NO_LENGTHS, _NO_BYTES, _NO_LENGTHS, _NO_LENGTHS
    return (counts, np.frombuffer(b"".join(parts), np.uint8),
            np.array(name_lengths, np.int64), np.array(value_lengths, np.int64))


def _checked_headers(headers, count: int) -> list:
    if headers is None:
        return []
    if len(headers) != count:
        raise LocalProtocolError(f"headers: {len(headers)} entries for {count} records")
    return [(index, check_headers(record_headers)[0])
            for index, record_headers in enumerate(headers) if record_headers]


def _record_count(values) -> int:
    if isinstance(values, np.ndarray) and values.ndim >= 1 and values.dtype != object:
        count = values.shape[0]
    elif isinstance(values, (list, tuple)):
        count = len(values)
    else:
        raise LocalProtocolError(
            f"values must be a list or tuple of bytes-like objects (or None), or an array "
            f"of fixed-size rows; got {type(values).__name__}")
    if count == 0:
        raise LocalProtocolError("a batch needs at least one record")
    return count


def restamp_batch(batch: np.ndarray, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> None:
    """Give a sealed batch another producer id, epoch and first sequence, and its CRC
    again (in place): an idempotent producer sending it again after an epoch bump."""
    _check_producer_fields(producer_id, producer_epoch, base_sequence)
    header = batch[:L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)
    header["producer_id"] = producer_id
    header["producer_epoch"] = producer_epoch
    header["base_sequence"] = base_sequence
    header["crc"] = crc32c_kernel(batch, L.CRC_COVERED_OFFSET, batch.size)


def _check_producer_fields(producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    for name, value, bits in (("producer_id", producer_id, 64),
                              ("producer_epoch", producer_epoch, 16),
                              ("base_sequence", base_sequence, 32)):
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                not low <= value <= high:
            raise LocalProtocolError(f"{name} must be an integer in [{low}, {high}], "
                                     f"got {value!r}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def check_timestamp(value) -> int:
    """A record timestamp given by the caller: an integer in the range a batch stores.

    Raises
    ------
    LocalProtocolError
        Not an integer, or outside ``[NO_TIMESTAMP, limits.TIMESTAMP_MS_MAX]``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not L.NO_TIMESTAMP <= value <= limits.TIMESTAMP_MS_MAX:
        raise LocalProtocolError(f"timestamp_ms must be an integer in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] (milliseconds since the epoch), "
                                 f"got {value!r:.100}")
    return int(value)


def _timestamps(timestamps, timestamp_ms, count: int) -> np.ndarray:
    """Every record's timestamp as a fresh int64 array, checked."""
    if timestamps is None:
        stamp = now_ms() if timestamp_ms is None else check_timestamp(timestamp_ms)
        return np.full(count, stamp, np.int64)
    try:
        stamps = np.array(timestamps, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as error:
        raise LocalProtocolError(f"timestamps must be integers in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] ({error})") from None
    if stamps.shape != (count,):
        raise LocalProtocolError(f"timestamps: shape {stamps.shape} for {count} records")
    if stamps.min() < L.NO_TIMESTAMP or stamps.max() > limits.TIMESTAMP_MS_MAX:
        raise LocalProtocolError(f"timestamps must be in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] (milliseconds since the "
                                 f"epoch), got {int(stamps.min())}..{int(stamps.max())}")
    return stamps


def _encode(values, keys, headers, timestamps: np.ndarray, codec: "Compression",
            producer_id: int, producer_epoch: int, base_sequence: int,
            control: bool) -> np.ndarray:
    """One batch from its columns (:func:`_column`, :func:`_header_columns`)."""
    value_bytes, value_lengths = values
    key_bytes, key_lengths = keys
    header_counts, header_bytes, header_name_lengths, header_value_lengths = headers
    count = value_lengths.size
    records_size = (L.RECORD_HEADER_LENGTH * count + value_bytes.size + key_bytes.size
                    + L.HEADER_ENTRY_LENGTH * header_name_lengths.size + header_bytes.size)
    if records_size + L.HEADER_LENGTH > limits.BATCH_SIZE_MAX:
        raise RecordTooLargeError(
            f"batch of {count} records is {records_size + L.HEADER_LENGTH} bytes; "
            f"the format allows {limits.BATCH_SIZE_MAX}")
    out = np.empty(L.HEADER_LENGTH + records_size, np.uint8)
    length = _encode_batch(out, value_bytes, value_lengths, key_bytes, key_lengths, timestamps,
                           header_counts, header_bytes, header_name_lengths,
                           header_value_lengths, L.CONTROL_BIT if control else 0, producer_id,
                           producer_epoch, base_sequence)
    assert length == out.size, "the columns' lengths disagree with their bytes"
    if codec is Compression.ZSTD:
        out = recompress_batch(out, batch_info(out, 0), codec)
    return out


def encode_batch(values, keys=None, headers=None, timestamps=None, *, timestamp_ms=None,
                 compression=None, producer_id: int = L.NO_PRODUCER_ID,
                 producer_epoch: int = L.NO_PRODUCER_EPOCH,
                 base_sequence: int = L.NO_SEQUENCE, control: bool = False) -> np.ndarray:
    """Encode records as one batch (base offset 0: the log assigns the real one).

    Parameters
    ----------
    values : sequence of bytes-like or None, or numpy.ndarray
        Record values; None is a null value (a tombstone). A 2-D uint8 array (or any
        array whose rows are fixed-size records) gives one record per row.
    keys : same forms as ``values``, or None for all-null keys.
    headers : sequence of sequences of (str, bytes | None), or None.
    timestamps : sequence of int or numpy.ndarray, optional
        Per-record CreateTime in milliseconds; by default every record gets
        ``timestamp_ms`` (itself defaulting to now).
    compression : None, "zstd" or Compression
    producer_id, producer_epoch, base_sequence : int
        Idempotent-producer identity; -1 when not used.
    control : bool
        Mark the batch as a control batch.

    Returns
    -------
    numpy.ndarray
        The batch bytes (uint8), CRC included.

    Raises
    ------
    LocalProtocolError
        A field has the wrong type or the columns disagree in length.
    RecordTooLargeError
        The batch would exceed the format's limits.
    """
    count = _record_count(values)
    _check_producer_fields(producer_id, producer_epoch, base_sequence)
    if count > limits.BATCH_RECORD_COUNT_MAX:
        raise RecordTooLargeError(f"{count} records exceed {limits.BATCH_RECORD_COUNT_MAX}")
    codec = Compression.parse(compression)
    value_column = _column(values, count, "values")
    key_column = _column(keys, count, "keys")
    header_columns = _header_columns(_checked_headers(headers, count), count)
    return _encode(value_column, key_column, header_columns,
                   _timestamps(timestamps, timestamp_ms, count), codec, producer_id,
                   producer_epoch, base_sequence, control)


def encode_gathered(values: list, keys: dict, headers: dict, timestamps: np.ndarray, *,
                    compression: "Compression", producer_id: int, producer_epoch: int,
                    base_sequence: int) -> np.ndarray:
    """Encode the records a producer gathered one at a time as one batch.

    The caller checked each field as it came (``Producer.send``), so this does no
    per-record Python work on the common path: ``values`` is a list of ``bytes`` or
    None; ``keys`` (bytes) and ``headers`` (as :func:`check_headers` gives them) map
    a record's index to its field, for the records that have one; ``timestamps`` is
    an int64 array of milliseconds, one per record, each in the range a batch stores.
    """
    count = len(values)
    if not keys:
        key_column = _column(None, count, "keys")
    elif len(keys) == count:
        key_column = _column(list(keys.values()), count, "keys", bytes_only=True)
    else:
        every_key = [None] * count
        for index, key in keys.items():
            every_key[index] = key
        key_column = _column(every_key, count, "keys", bytes_only=True)
    return _encode(_column(values, count, "values", bytes_only=True), key_column,
                   _header_columns(headers.items(), count), timestamps, compression,
                   producer_id, producer_epoch, base_sequence, False)


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


# --- reading --------------------------------------------------------------------------

class BatchInfo(NamedTuple):
    """The header of one batch, as Python values."""
    position: int
    batch_length: int
    base_offset: int
    leader_epoch: int
    crc: int
    attributes: int
    producer_epoch: int
    record_count: int
    last_offset_delta: int
    base_sequence: int
    producer_id: int
    first_timestamp: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & L.CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        return (L.TIMESTAMP_LOG_APPEND_TIME if self.attributes & L.TIMESTAMP_TYPE_BIT
                else L.TIMESTAMP_CREATE_TIME)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & L.CONTROL_BIT)


class Record(NamedTuple):
    """One record as Python objects (``key``/``value`` are None when null)."""
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list


def _as_bytes(buffer) -> np.ndarray:
    if isinstance(buffer, np.ndarray):
        assert buffer.dtype == np.uint8 and buffer.ndim == 1
        return np.ascontiguousarray(buffer)
    return np.frombuffer(buffer, np.uint8)


def batch_info(buffer: np.ndarray, position: int) -> BatchInfo:
    """Read the header at ``position`` (the caller has validated the batch)."""
    header = buffer[position:position + L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)[0]
    return BatchInfo(position, int(header["batch_length"]), int(header["base_offset"]),
                     int(header["leader_epoch"]), int(header["crc"]), int(header["attributes"]),
                     int(header["producer_epoch"]), int(header["record_count"]),
                     int(header["last_offset_delta"]), int(header["base_sequence"]),
                     int(header["producer_id"]), int(header["first_timestamp"]),
                     int(header["max_timestamp"]))


def inflate_records(buffer: np.ndarray, info: BatchInfo) -> np.ndarray:
    """The records region of the zstd batch ``info`` describes, decompressed (its
    records not checked: :func:`check_inflated` does both).

    Raises
    ------
    CorruptRecordError
        The frame does not inflate, declares more than
        ``limits.DECOMPRESSED_RECORDS_SIZE_MAX`` bytes, or bytes follow it
        (status ``BAD_COMPRESSION``).
    """
    frame = buffer[info.position + L.RECORDS_OFFSET:info.position + info.batch_length]
    try:
        size = zstandard.frame_content_size(frame)
        if size < 0 or size > limits.DECOMPRESSED_RECORDS_SIZE_MAX:
            raise zstandard.ZstdError(f"frame declares {size} bytes")
        inflater = zstandard.ZstdDecompressor().decompressobj()
        records = inflater.decompress(frame)
        # Every CRC'd byte must belong to the one frame: nothing may ride after it.
        if not inflater.eof or inflater.unused_data or len(records) != size:
            raise zstandard.ZstdError("bytes follow the frame, or it is incomplete")
    except zstandard.ZstdError as error:
        raise CorruptRecordError(
            f"batch at position {info.position}: zstd frame does not inflate ({error})",
            status=int(BatchStatus.BAD_COMPRESSION), position=info.position) from None
    return np.frombuffer(records, np.uint8)


def recompress_batch(data: np.ndarray, info: BatchInfo, codec: "Compression") -> np.ndarray:
    """The batch at ``info.position`` stored with ``codec`` instead (what a topic's
    ``compression.type`` asks of the broker): same records, same header fields, new
    length, codec bits and CRC. The batch must have been validated."""
    start, end = info.position, info.position + info.batch_length
    if info.compression is codec:
        return data[start:end]
    if info.compression is Compression.ZSTD:
        records = inflate_records(data, info)
    else:
        records = data[start + L.RECORDS_OFFSET:end]
    if codec is Compression.ZSTD:
        records = np.frombuffer(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(records),
                                np.uint8)
    out = np.empty(L.HEADER_LENGTH + records.size, np.uint8)
    out[:L.HEADER_LENGTH] = data[start:start + L.HEADER_LENGTH]
    out[L.RECORDS_OFFSET:] = records
    header = out[:L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)
    header["batch_length"] = out.size
    header["attributes"] = (info.attributes & ~L.CODEC_MASK) | codec.value
    header["crc"] = crc32c_kernel(out, L.CRC_COVERED_OFFSET, out.size)
    return out


def validate_batches(buffer, *, check_records: bool = True) -> list[BatchInfo]:
    """Validate whole batches laid back to back; return their headers.

    Raises
    ------
    CorruptRecordError
        The first invalid batch, with its status and byte position.
    """
    data = _as_bytes(buffer)
    positions = np.empty(max(1, data.size // L.HEADER_LENGTH), np.int64)
    status, count, end = _walk_batches(data, 0, data.size, True, check_records, positions)
    if status != _OK or end != data.size:
        reason = BatchStatus(status).name if status != _OK else "TRAILING_BYTES"
        raise CorruptRecordError(f"invalid record batch at position {end}: {reason}",
                                 status=status, position=end)
    infos = [batch_info(data, int(position)) for position in positions[:count]]
    if check_records:
        for info in infos:
            if info.compression is Compression.ZSTD:
                check_inflated(data, info)
    return infos


def check_inflated(buffer: np.ndarray, info: BatchInfo) -> np.ndarray:
    """Inflate the zstd batch ``info`` describes and walk its records as
    :func:`check_batch` walks an uncompressed batch's; the inflated records.

    Raises
    ------
    CorruptRecordError
        The frame does not inflate, or a record fails its check (the status says
        which; the position is the batch's).
    """
    records = inflate_records(buffer, info)
    status, position = _check_records(records, 0, records.size, info.record_count,
                                      info.last_offset_delta, info.first_timestamp,
                                      info.max_timestamp,
                                      info.timestamp_type == L.TIMESTAMP_CREATE_TIME)
    if status != _OK:
        raise CorruptRecordError(
            f"zstd batch at position {info.position}: {BatchStatus(status).name} "
            f"at byte {position} of its inflated records",
            status=status, position=info.position)
    return records


def iter_batches(buffer) -> Iterator[BatchInfo]:
    """Headers of the validated batches in ``buffer`` (stops at a zero length)."""
    data = _as_bytes(buffer)
    position = 0
    while position < data.size:
        status, length = check_batch(data, position, data.size, True, False)
        if status == _END_OF_DATA:
            return
        if status != _OK:
            raise CorruptRecordError(
                f"invalid record batch at position {position}: {BatchStatus(status).name}",
                status=status, position=position)
        yield batch_info(data, position)
        position += length


# --- columnar decoding -----------------------------------------------------------------

@kernel
def _count_records(buffer, start, end):
    """Records and headers in uncompressed batches from ``start`` (already valid)."""
    records = 0
    headers = 0
    position = start
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != _OK:
            break              # zero padding: the end of the data
        record = position + L.RECORDS_OFFSET
        while record < position + length:
            records += 1
            headers += np.int64(load_u32(buffer, record + L.HEADER_COUNT_OFFSET))
            record += np.int64(load_u32(buffer, record + L.RECORD_LENGTH_OFFSET))
        position += length
    return records, headers


@kernel
def _index_records(buffer, start, end, offsets, timestamps, timestamp_types, key_positions,
                   key_lengths, value_positions, value_lengths, header_starts, header_counts,
                   header_key_positions, header_key_lengths, header_value_positions,
                   header_value_lengths):
    """Fill the column arrays from uncompressed, validated batches."""
    index = 0
    header = 0
    position = start
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != _OK:
            break              # zero padding: the end of the data
        base_offset = load_i64(buffer, position + L.BASE_OFFSET_OFFSET)
        attributes = load_u16(buffer, position + L.ATTRIBUTES_OFFSET)
        first_timestamp = load_i64(buffer, position + L.FIRST_TIMESTAMP_OFFSET)
        log_append_time = (attributes & L.TIMESTAMP_TYPE_BIT) != 0
        max_timestamp = load_i64(buffer, position + L.MAX_TIMESTAMP_OFFSET)
        record = position + L.RECORDS_OFFSET
        while record < position + length:
            offsets[index] = base_offset + load_u32(buffer, record + L.OFFSET_DELTA_OFFSET)
            if log_append_time:
                timestamps[index] = max_timestamp
                timestamp_types[index] = L.TIMESTAMP_LOG_APPEND_TIME
            else:
                delta = load_i64(buffer, record + L.TIMESTAMP_DELTA_OFFSET)
                timestamps[index] = first_timestamp + delta
                timestamp_types[index] = L.TIMESTAMP_CREATE_TIME
            key_length = load_i32(buffer, record + L.KEY_LENGTH_OFFSET)
            value_length = load_i32(buffer, record + L.VALUE_LENGTH_OFFSET)
            field = record + L.RECORD_HEADER_LENGTH
            key_positions[index] = field
            key_lengths[index] = key_length
            field += max(key_length, 0)
            value_positions[index] = field
            value_lengths[index] = value_length
            field += max(value_length, 0)
            count = load_u32(buffer, record + L.HEADER_COUNT_OFFSET)
            header_starts[index] = header
            header_counts[index] = count
            for _ in range(count):
                header_key_length = load_u32(buffer, field + L.HEADER_KEY_LENGTH_OFFSET)
                header_value_length = load_i32(buffer, field + L.HEADER_VALUE_LENGTH_OFFSET)
                field += L.HEADER_ENTRY_LENGTH
                header_key_positions[header] = field
                header_key_lengths[header] = header_key_length
                field += header_key_length
                header_value_positions[header] = field
                header_value_lengths[header] = header_value_length
                field += max(header_value_length, 0)
                header += 1
            index += 1
            record += np.int64(load_u32(buffer, record + L.RECORD_LENGTH_OFFSET))
        position += length
    return index


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


def inflate_batch(data: np.ndarray, info: BatchInfo) -> np.ndarray:
    """The batch with its records region inflated and its codec bits cleared: a
    decoding buffer, not a stored batch (its CRC describes the compressed form)."""
    start, end = info.position, info.position + info.batch_length
    if info.compression is not Compression.ZSTD:
        return data[start:end]
    records = check_inflated(data, info)
    header = data[start:start + L.HEADER_LENGTH].copy()
    header_fields = header.view(L.BATCH_HEADER_DTYPE)
    header_fields["batch_length"] = L.HEADER_LENGTH + records.size
    header_fields["attributes"] &= np.uint16(0xFFFF & ~L.CODEC_MASK)
    return np.concatenate([header, records])


def decode_columns(buffer, *, start_offset: int | None = None,
                   verified: bool = False) -> RecordColumns:
    """Decode whole batches into :class:`RecordColumns`.

    Parameters
    ----------
    buffer : bytes-like or numpy.ndarray
        Whole batches, back to back (what :meth:`PartitionLog.read` returns); zero
        padding after the last batch ends the data.
    start_offset : int, optional
        Drop records before this offset (a read starts at a batch boundary).
    verified : bool
        The caller already checked every batch's CRC (:meth:`PartitionLog.read`
        does). The structure of every record is checked here regardless: the
        decoding kernels rely on it.

    Raises
    ------
    CorruptRecordError
        A batch fails validation.
    """
    data = _as_bytes(buffer)
    positions = np.empty(max(1, data.size // L.HEADER_LENGTH), np.int64)
    status, count, end = _walk_batches(data, 0, data.size, not verified, True, positions)
    if status != _OK and status != _END_OF_DATA:
        raise CorruptRecordError(f"invalid record batch at position {end}: "
                                 f"{BatchStatus(status).name}", status=status, position=end)
    positions = positions[:count]
    codecs = data[positions + L.ATTRIBUTES_OFFSET] & L.CODEC_MASK
    if np.any(codecs != L.CODEC_NONE):
        data = np.concatenate([inflate_batch(data, batch_info(data, int(position)))
                               for position in positions])
    else:
        data = data[:end]
    record_count, header_count = _count_records(data, 0, data.size)
    columns = RecordColumns(
        data, np.empty(record_count, np.int64), np.empty(record_count, np.int64),
        np.empty(record_count, np.int8), np.empty(record_count, np.int64),
        np.empty(record_count, np.int32), np.empty(record_count, np.int64),
        np.empty(record_count, np.int32), np.empty(record_count, np.int64),
        np.empty(record_count, np.int32), np.empty(header_count, np.int64),
        np.empty(header_count, np.int32), np.empty(header_count, np.int64),
        np.empty(header_count, np.int32))
    filled = _index_records(data, 0, data.size, columns.offsets, columns.timestamps,
                            columns.timestamp_types, columns.key_positions, columns.key_lengths,
                            columns.value_positions, columns.value_lengths, columns.header_starts,
                            columns.header_counts, columns.header_key_positions,
                            columns.header_key_lengths, columns.header_value_positions,
                            columns.header_value_lengths)
    assert filled == record_count
    if start_offset is not None:
        columns = columns.from_offset(start_offset)
    return columns


def warm_decoding() -> None:
    """Load every kernel :func:`decode_columns` runs, for the argument types a
    consumer's read passes: a read-only mapping, a writable array (inflated
    batches), and a zstd batch's inflated records (read-only, checked record by
    record). Runs them on empty inputs; a few ms once numba's disk cache holds them."""
    inflated, log = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    log.flags.writeable = False
    for data in (inflated, log):
        decode_columns(data, start_offset=0, verified=True)
    # A read-only array from bytes: the type inflate_records returns.
    frame = np.frombuffer(zstandard.ZstdCompressor().compress(b""), np.uint8)
    _check_records(frame[:0], 0, 0, 0, 0, 0, 0, True)


def decode_records(buffer, *, start_offset: int | None = None) -> list[Record]:
    """Decode whole batches into :class:`Record` objects (validating them)."""
    return decode_columns(buffer, start_offset=start_offset).records()
