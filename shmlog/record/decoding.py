"""Decoding record batches: whole batches from a log, a read or the wire walked,
validated and turned into :class:`RecordColumns` or :class:`Record` objects; and the
walks that give their headers (:class:`BatchInfo`).

Rules
-----
* Decoding trusts only validated bytes: every batch is checked here (its CRC
  unless the caller verified it, and always the structure of every record) before
  any column is returned, and the first bad one is raised as
  ``CorruptRecordError`` with its status and byte position.
* Zero padding after the last batch (preallocated space never written) ends the
  data; bytes after a whole batch that are not a batch are an error.
* No per-record work in Python: counting and indexing the records are kernels.
* The walk that indexes records (:func:`_index_batch`) makes every check of
  ``validation.walk_records``, in its order, so it fails with the same status
  (``tests/unit/test_records.py`` flips every byte to prove it): a check added
  there is added here too.

Theory of operation
-------------------
:func:`decode_columns` makes one compiled walk over the batches (:func:`_decode`):
each batch's header is checked as ``validation.check_batch`` checks it (its CRC
unless verified), and the records of an uncompressed batch are checked and
indexed in the same pass (:func:`_index_batch`), into columns sized beforehand
from the batches' record counts (:func:`_record_capacity`: exact for valid
batches, so nothing is cut or copied afterwards). The walk asks for the bytes
``limits.DECODE_PREFETCH_BYTES`` ahead of the record it checks: each record's
position depends on the one before, so without it every line not yet in the core's
cache would stall the walk (a consumer's read was just CRC-checked, which leaves it
in the last-level cache). Header entries are indexed
after the walk, once their number is known, by a step over the records that have
any (:func:`_index_headers`; none at all costs nothing).
The columns hold offsets, timestamps and key/value positions that point into the
batch bytes themselves, so reading a mapped segment copies no record data. When a
zstd batch is among them, the batches are inflated into a decoding buffer
(``compression.inflate_batch``, which walks the inflated records) and that buffer
is walked instead (that copy is unavoidable). :func:`validate_batches` and
:func:`iter_batches` give the batches' headers instead, for callers that handle
batches whole.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import zstandard

from ..common import limits
from ..common.errors import CorruptRecordError
from ..native.jit import kernel, load_i32, load_i64, load_u16, load_u32, prefetch
from . import batch_layout as L
from .batch_header import BatchInfo, Compression, batch_info
from .columns import Record, RecordColumns
from .compression import check_inflated, inflate_batch
from .validation import BatchStatus, batch_frame, check_batch, walk_batches, walk_records

__all__ = ["validate_batches", "iter_batches", "decode_columns", "decode_records",
           "warm_decoding", "NO_ABORTED", "ABORTED_COLUMNS"]

# A read's aborted transactions: int64 rows of producer id, first offset, last offset.
ABORTED_COLUMNS = 3
NO_ABORTED = np.zeros((0, ABORTED_COLUMNS), np.int64)   # writable: one type to numba

_OK = int(BatchStatus.OK)
_END_OF_DATA = int(BatchStatus.END_OF_DATA)
_BAD_RECORD = int(BatchStatus.BAD_RECORD)
_BAD_RECORD_COUNT = int(BatchStatus.BAD_RECORD_COUNT)
_BAD_TIMESTAMP = int(BatchStatus.BAD_TIMESTAMP)


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
def _record_capacity(buffer, end):
    """Records the uncompressed batches framed from 0 hold at most: each one's
    ``record_count``, bounded by what its bytes can hold. Exact for valid batches
    (their records number ``record_count``), so the columns are sized once and never
    cut; a count a batch lies about is caught by the walk, which writes no record
    past this."""
    total = 0
    position = 0
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != _OK:
            break
        attributes = load_u16(buffer, position + L.ATTRIBUTES_OFFSET)
        if attributes & L.CODEC_MASK == L.CODEC_NONE:
            declared = np.int64(load_i32(buffer, position + L.RECORD_COUNT_OFFSET))
            room = (length - L.RECORDS_OFFSET) // L.RECORD_HEADER_LENGTH
            total += min(max(declared, 0), room)
        position += length
    return total


@kernel
def _index_batch(buffer, position, length, index, header, offsets, timestamps,
                 timestamp_types, key_positions, key_lengths, value_positions, value_lengths,
                 header_starts, header_counts):
    """Walk the records of the uncompressed batch at ``position`` (its header
    checked) with every check of ``validation.walk_records``, in its order, and
    write each record's columns at ``index`` on (none past the columns' end: a
    batch holding more records than it declares fails its count).

    Returns (status, next index, next header entry).
    """
    end = position + length
    record_count = np.int64(load_i32(buffer, position + L.RECORD_COUNT_OFFSET))
    last_offset_delta = np.int64(load_i32(buffer, position + L.LAST_OFFSET_DELTA_OFFSET))
    base_offset = load_i64(buffer, position + L.BASE_OFFSET_OFFSET)
    first_timestamp = load_i64(buffer, position + L.FIRST_TIMESTAMP_OFFSET)
    max_timestamp = load_i64(buffer, position + L.MAX_TIMESTAMP_OFFSET)
    create_time = (load_u16(buffer, position + L.ATTRIBUTES_OFFSET) & L.TIMESTAMP_TYPE_BIT) == 0
    timestamp_type = L.TIMESTAMP_CREATE_TIME if create_time else L.TIMESTAMP_LOG_APPEND_TIME
    capacity = offsets.size
    record = position + L.RECORDS_OFFSET
    count = 0
    previous_delta = -1
    while record < end:
        prefetch(buffer, record + limits.DECODE_PREFETCH_BYTES)
        if end - record < L.RECORD_HEADER_LENGTH:
            return _BAD_RECORD, index, header
        record_length = np.int64(load_u32(buffer, record + L.RECORD_LENGTH_OFFSET))
        if record_length < L.RECORD_HEADER_LENGTH or record_length > end - record:
            return _BAD_RECORD, index, header
        offset_delta = np.int64(load_u32(buffer, record + L.OFFSET_DELTA_OFFSET))
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            return _BAD_RECORD, index, header
        previous_delta = offset_delta
        timestamp = max_timestamp
        if create_time:
            timestamp = first_timestamp + load_i64(buffer, record + L.TIMESTAMP_DELTA_OFFSET)
            if timestamp > max_timestamp or timestamp < L.NO_TIMESTAMP:
                return _BAD_TIMESTAMP, index, header
        key_length = np.int64(load_i32(buffer, record + L.KEY_LENGTH_OFFSET))
        value_length = np.int64(load_i32(buffer, record + L.VALUE_LENGTH_OFFSET))
        entries = np.int64(load_u32(buffer, record + L.HEADER_COUNT_OFFSET))
        if key_length < L.NULL_LENGTH or value_length < L.NULL_LENGTH:
            return _BAD_RECORD, index, header
        if entries > limits.RECORD_HEADER_COUNT_MAX:
            return _BAD_RECORD, index, header
        record_end = record + record_length
        key = record + L.RECORD_HEADER_LENGTH
        value = key + max(key_length, 0)
        field = value + max(value_length, 0)
        if field > record_end:
            return _BAD_RECORD, index, header
        for _ in range(entries):
            if record_end - field < L.HEADER_ENTRY_LENGTH:
                return _BAD_RECORD, index, header
            name_length = np.int64(load_u32(buffer, field + L.HEADER_KEY_LENGTH_OFFSET))
            entry_length = np.int64(load_i32(buffer, field + L.HEADER_VALUE_LENGTH_OFFSET))
            if entry_length < L.NULL_LENGTH:
                return _BAD_RECORD, index, header
            field += L.HEADER_ENTRY_LENGTH + name_length + max(entry_length, 0)
            if field > record_end:
                return _BAD_RECORD, index, header
        if field != record_end:
            return _BAD_RECORD, index, header
        if index < capacity:
            offsets[index] = base_offset + offset_delta
            timestamps[index] = timestamp
            timestamp_types[index] = timestamp_type
            key_positions[index] = key
            key_lengths[index] = key_length
            value_positions[index] = value
            value_lengths[index] = value_length
            header_starts[index] = header
            header_counts[index] = entries
        index += 1
        header += entries
        count += 1
        record = record_end
    if count != record_count:
        return _BAD_RECORD_COUNT, index, header
    return _OK, index, header


@kernel
def _index_headers(buffer, count, value_positions, value_lengths, header_starts,
                   header_counts, header_key_positions, header_key_lengths,
                   header_value_positions, header_value_lengths):
    """Fill the header entry columns of ``count`` records walked by :func:`_index_batch`
    (a record's entries follow its value)."""
    for index in range(count):
        entries = header_counts[index]
        if entries == 0:
            continue
        field = value_positions[index] + max(np.int64(value_lengths[index]), 0)
        header = header_starts[index]
        for _ in range(entries):
            name_length = np.int64(load_u32(buffer, field + L.HEADER_KEY_LENGTH_OFFSET))
            value_length = np.int64(load_i32(buffer, field + L.HEADER_VALUE_LENGTH_OFFSET))
            field += L.HEADER_ENTRY_LENGTH
            header_key_positions[header] = field
            header_key_lengths[header] = name_length
            field += name_length
            header_value_positions[header] = field
            header_value_lengths[header] = value_length
            field += max(value_length, 0)
            header += 1


@kernel(inline="always")
def _aborted(buffer, position, aborted):
    """Whether the transactional batch at ``position`` belongs to an aborted
    transaction of ``aborted`` (rows of producer id, first offset, last offset: its
    marker's): one of its producer whose span holds the batch's base offset."""
    producer_id = load_i64(buffer, position + L.PRODUCER_ID_OFFSET)
    base_offset = load_i64(buffer, position + L.BASE_OFFSET_OFFSET)
    for row in range(aborted.shape[0]):
        if aborted[row, 0] == producer_id and aborted[row, 1] <= base_offset <= aborted[row, 2]:
            return True
    return False


@kernel
def _decode(buffer, check_crc, control, aborted):
    """Validate the batches of ``buffer`` from 0 (as ``validation.walk_batches`` with
    records checked, the CRC with ``check_crc``) and index the records of the
    uncompressed ones, in one walk; a control batch's records are checked and
    indexed only with ``control``, a transactional batch's of a transaction in
    ``aborted`` (rows of producer id, first and last offset) not at all. A zstd
    batch's header is checked and its records left to inflating.

    Returns (status, end, compressed, columns): ``end`` is where the walk stopped
    (the bad batch's position, zero padding or ``buffer.size``); ``compressed``
    whether a zstd batch was seen; ``columns`` the 13 arrays of
    :class:`RecordColumns` after ``data``.
    """
    end = buffer.size
    capacity = _record_capacity(buffer, end)
    offsets = np.empty(capacity, np.int64)
    timestamps = np.empty(capacity, np.int64)
    timestamp_types = np.empty(capacity, np.int8)
    key_positions = np.empty(capacity, np.int64)
    key_lengths = np.empty(capacity, np.int32)
    value_positions = np.empty(capacity, np.int64)
    value_lengths = np.empty(capacity, np.int32)
    header_starts = np.empty(capacity, np.int64)
    header_counts = np.empty(capacity, np.int32)
    status = _OK
    compressed = False
    index = 0
    header = 0
    position = 0
    while position < end:
        status, length = check_batch(buffer, position, end, check_crc, False)
        if status != _OK:
            break
        attributes = load_u16(buffer, position + L.ATTRIBUTES_OFFSET)
        if attributes & L.CODEC_MASK != L.CODEC_NONE:
            compressed = True
        else:
            indexed, headers_indexed = index, header
            status, index, header = _index_batch(
                buffer, position, length, index, header, offsets, timestamps,
                timestamp_types, key_positions, key_lengths, value_positions, value_lengths,
                header_starts, header_counts)
            if status != _OK:
                break
            if not control and attributes & L.CONTROL_BIT or attributes & L.TRANSACTIONAL_BIT \
                    and aborted.shape[0] and _aborted(buffer, position, aborted):
                index, header = indexed, headers_indexed      # checked, not returned
        position += length
    if status != _OK and status != _END_OF_DATA:
        header = 0             # nothing is indexed: the caller raises
        index = 0
    header_key_positions = np.empty(header, np.int64)
    header_key_lengths = np.empty(header, np.int32)
    header_value_positions = np.empty(header, np.int64)
    header_value_lengths = np.empty(header, np.int32)
    if header:
        _index_headers(buffer, index, value_positions, value_lengths, header_starts,
                       header_counts, header_key_positions, header_key_lengths,
                       header_value_positions, header_value_lengths)
    return (status, position, compressed, offsets[:index], timestamps[:index],
            timestamp_types[:index], key_positions[:index], key_lengths[:index],
            value_positions[:index], value_lengths[:index], header_starts[:index],
            header_counts[:index], header_key_positions, header_key_lengths,
            header_value_positions, header_value_lengths)


def decode_columns(buffer, *, start_offset: int | None = None,
                   verified: bool = False, control: bool = False,
                   aborted: np.ndarray = NO_ABORTED) -> RecordColumns:
    """Decode whole batches into :class:`RecordColumns`: the records a consumer
    reads. Control batches (a transaction's markers) are checked but their records
    left out, as Kafka's consumers skip them, unless ``control``; so are those of
    the aborted transactions ``aborted`` names (a read_committed consumer's).

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
    control : bool
        Return the records of control batches too (``shmlog dump``, ``control.py``).
    aborted : numpy.ndarray
        int64 rows of (producer id, first offset, last offset) of aborted
        transactions (the ``.txnindex`` entries a read meets): their transactional
        batches are left out. None by default (read_uncommitted).

    Raises
    ------
    CorruptRecordError
        A batch fails validation.
    """
    data = _as_bytes(buffer)
    status, end, compressed, *arrays = _decode(data, not verified, control, aborted)
    if status != _OK and status != _END_OF_DATA:
        raise CorruptRecordError(f"invalid record batch at position {end}: "
                                 f"{BatchStatus(status).name}", status=status, position=end)
    if compressed:
        data = _inflated(data, end)
        status, end, compressed, *arrays = _decode(data, False, control, aborted)
        assert status == _OK and not compressed, "inflated records were walked already"
    else:
        data = data[:end]
    columns = RecordColumns(data, *arrays)
    if start_offset is not None:
        columns = columns.from_offset(start_offset)
    return columns


def _inflated(data: np.ndarray, end: int) -> np.ndarray:
    """The validated batches of ``data[:end]`` with zstd ones inflated (their
    records walked on the way), back to back."""
    return np.concatenate([inflate_batch(data, batch_info(data, int(position)))
                           for position in _batch_positions(data, end)])


def _batch_positions(data: np.ndarray, end: int) -> np.ndarray:
    """Where the validated batches of ``data[:end]`` start."""
    positions = np.empty(max(1, end // L.HEADER_LENGTH), np.int64)
    status, count, _ = walk_batches(data, 0, end, False, False, positions)
    assert status == _OK, "the batches were validated"
    return positions[:count]


def warm_decoding() -> None:
    """Load every kernel :func:`decode_columns` runs, for the argument types a
    consumer's read passes: a read-only mapping, a writable array (inflated
    batches), and a zstd batch's inflated records (read-only, checked record by
    record). Runs them on empty inputs; a few ms once numba's disk cache holds them."""
    inflated, log = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    log.flags.writeable = False
    for data in (inflated, log):
        decode_columns(data, start_offset=0, verified=True)
        _batch_positions(data, 0)          # where zstd batches are, to inflate them
    # A read-only array from bytes: the type inflate_records returns.
    frame = np.frombuffer(zstandard.ZstdCompressor().compress(b""), np.uint8)
    walk_records(frame[:0], 0, 0, 0, 0, 0, 0, True)


def decode_records(buffer, *, start_offset: int | None = None, control: bool = False,
                   aborted: np.ndarray = NO_ABORTED) -> list[Record]:
    """Decode whole batches into :class:`Record` objects (validating them); control
    batches' records only with ``control``, an aborted transaction's never (see
    :func:`decode_columns`)."""
    return decode_columns(buffer, start_offset=start_offset, control=control,
                          aborted=aborted).records()
