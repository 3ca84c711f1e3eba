"""Decoding record batches: whole batches from a log, a read or the wire walked,
validated and turned into :class:`RecordColumns` or :class:`Record` objects; and the
walks that give their headers (:class:`BatchInfo`).

Rules
-----
* Decoding trusts only validated bytes: every batch is checked here first (its CRC
  unless the caller verified it, and always the structure of every record), and
  the first bad one is raised as ``CorruptRecordError`` with its status and byte
  position.
* Zero padding after the last batch (preallocated space never written) ends the
  data; bytes after a whole batch that are not a batch are an error.
* No per-record work in Python: counting and indexing the records are kernels.

Theory of operation
-------------------
:func:`decode_columns` walks the batches once (``validation.walk_batches``),
inflates any zstd batch into a decoding buffer (``compression.inflate_batch``),
counts the records and headers (:func:`_count_records`), allocates the columns and
fills them in a second compiled pass (:func:`_index_records`): offsets, timestamps
and key/value positions that point into the batch bytes themselves, so reading a
mapped segment copies no record data (zstd batches are inflated first; that copy
is unavoidable). :func:`validate_batches` and :func:`iter_batches` give the batches'
headers instead, for callers that handle batches whole.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import zstandard

from ..common.errors import CorruptRecordError
from ..native.jit import kernel, load_i32, load_i64, load_u16, load_u32
from . import batch_layout as L
from .batch_header import BatchInfo, Compression, batch_info
from .columns import Record, RecordColumns
from .compression import check_inflated, inflate_batch
from .validation import BatchStatus, batch_frame, check_batch, walk_batches, walk_records

__all__ = ["validate_batches", "iter_batches", "decode_columns", "decode_records",
           "warm_decoding"]

_OK = int(BatchStatus.OK)
_END_OF_DATA = int(BatchStatus.END_OF_DATA)


def _as_bytes(buffer) -> np.ndarray:
    if isinstance(buffer, np.ndarray):
        assert buffer.dtype == np.uint8 and buffer.ndim == 1
        return np.ascontiguousarray(buffer)
    return np.frombuffer(buffer, np.uint8)


def validate_batches(buffer, *, check_records: bool = True) -> list[BatchInfo]:
    """Validate whole batches laid back to back; return their headers.

    Raises
    ------
    CorruptRecordError
        The first invalid batch, with its status and byte position.
    """
    data = _as_bytes(buffer)
    positions = np.empty(max(1, data.size // L.HEADER_LENGTH), np.int64)
    status, count, end = walk_batches(data, 0, data.size, True, check_records, positions)
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
    status, count, end = walk_batches(data, 0, data.size, not verified, True, positions)
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
    walk_records(frame[:0], 0, 0, 0, 0, 0, 0, True)


def decode_records(buffer, *, start_offset: int | None = None) -> list[Record]:
    """Decode whole batches into :class:`Record` objects (validating them)."""
    return decode_columns(buffer, start_offset=start_offset).records()
