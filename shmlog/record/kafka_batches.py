"""Kafka's record batch (magic 2) to and from shmlog's batch layout, compiled: what a
Kafka client's Produce hands the appender, and what a Fetch sends back.

Rules
-----
* **Everything carried over.** Base offset, leader epoch, producer id, epoch and
  base sequence, first and largest timestamps, the timestamp type, record count
  and last offset delta; per record its offset and timestamp deltas, key, value
  (null kept null, distinct from empty) and headers (a null header value kept).
  So a batch's idempotence fields mean the same on both sides.
* **Checked before trusted.** A Kafka batch's CRC32C is checked first; its varints,
  lengths and record count must fit exactly (no byte left over, nothing read past
  its end); it must be one batch, magic 2, and not a control batch (Kafka refuses
  those from clients: only the broker writes them). Any failure is
  :class:`CorruptRecordError` with a :class:`KafkaBatchStatus`; the caller maps it
  to Kafka's error code. A transactional batch keeps its bit
  (``batch_layout.TRANSACTIONAL_BIT``): the appender admits it only in a partition
  its producer's transaction added.
* **Codecs.** A Kafka batch compressed with gzip or zstd is inflated (bounded by
  ``limits.DECOMPRESSED_RECORDS_SIZE_MAX`` as it inflates) and stored as zstd;
  uncompressed stays uncompressed. Its records must be exactly one gzip member or
  zstd frame, whole, with no byte after it (what every Kafka client writes). snappy
  and lz4 are refused (:class:`UnsupportedCodecError`): shmlog stores only none and
  zstd and adds no dependency for them. Stored batches go back to Kafka
  uncompressed (a stored zstd batch is inflated on the way).
* **No per-record Python.** A run of stored batches is sized in one kernel call and
  written in another, compressed or not, within a budget or not; Python works per
  batch only to inflate or deflate.

Theory of operation
-------------------
Kafka's header is 61 big-endian bytes and its records use zigzag varints; shmlog's
header is 64 little-endian bytes and its records fixed-width fields (see
``batch_layout``). Each direction is two passes over the records: the first checks
and sizes the output exactly, the second writes it into one buffer allocated once.
Kafka's CRC covers its bytes from the attributes on; shmlog's from its attributes
on too (``CRC_COVERED_OFFSET``); each side's is computed over its own layout.
"""

from __future__ import annotations

import enum
import zlib

import numpy as np
import zstandard

from ..common import limits
from ..common.errors import CorruptRecordError, UnsupportedCodecError
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
from . import batch_layout as B
from .compression import ZSTD_LEVEL
from .kafka_layout import (
    HEADER_FIXED,
    K_ATTRIBUTES,
    K_BASE_OFFSET,
    K_BASE_SEQUENCE,
    K_BASE_TIMESTAMP,
    K_CODEC_MASK,
    K_CONTROL_BIT,
    K_CRC,
    K_GZIP,
    K_LAST_OFFSET_DELTA,
    K_LEADER_EPOCH,
    K_LENGTH,
    K_LENGTH_OVERHEAD,
    K_LZ4,
    K_MAGIC,
    K_MAX_TIMESTAMP,
    K_PRODUCER_EPOCH,
    K_PRODUCER_ID,
    K_RECORD_COUNT,
    K_SNAPPY,
    K_TIMESTAMP_TYPE_BIT,
    K_TRANSACTIONAL_BIT,
    K_ZSTD,
    KAFKA_HEADER_LENGTH,
    KAFKA_MAGIC,
    RECORD_FIXED,
)

__all__ = ["KafkaBatchStatus", "from_kafka", "to_kafka", "KAFKA_HEADER_LENGTH"]

class KafkaBatchStatus(enum.IntEnum):
    """Why a Kafka batch was refused (kernels return these)."""
    OK = 0
    TRUNCATED = 1            # shorter than its header or its length says
    BAD_MAGIC = 2
    BAD_CRC = 3
    BAD_RECORDS = 4          # a varint or length does not fit, or the count is wrong
    NOT_ONE_BATCH = 5        # bytes follow the batch
    # 6 was TRANSACTIONAL (a transactional batch) before transactions existed
    BAD_COMPRESSION = 7
    CONTROL = 8              # a control batch: only the broker writes those (Kafka's rule)


_OK = int(KafkaBatchStatus.OK)
_TRUNCATED = int(KafkaBatchStatus.TRUNCATED)
_BAD_MAGIC = int(KafkaBatchStatus.BAD_MAGIC)
_BAD_CRC = int(KafkaBatchStatus.BAD_CRC)
_BAD_RECORDS = int(KafkaBatchStatus.BAD_RECORDS)
_NOT_ONE_BATCH = int(KafkaBatchStatus.NOT_ONE_BATCH)
_CONTROL = int(KafkaBatchStatus.CONTROL)


# -- big-endian fields and zigzag varints -------------------------------------------------
@kernel
def _be16(buffer, position):
    return np.int16((np.int32(buffer[position]) << 8) | np.int32(buffer[position + 1]))


@kernel
def _be32(buffer, position):
    value = np.uint32(0)
    for index in range(4):
        value = (value << np.uint32(8)) | np.uint32(buffer[position + index])
    return value


@kernel
def _be64(buffer, position):
    value = np.uint64(0)
    for index in range(8):
        value = (value << np.uint64(8)) | np.uint64(buffer[position + index])
    return np.int64(value)


@kernel
def _put_be(buffer, position, value, width):
    unsigned = np.uint64(value)
    for index in range(width - 1, -1, -1):
        buffer[position + index] = np.uint8(unsigned & np.uint64(0xFF))
        unsigned >>= np.uint64(8)


@kernel
def _varint(buffer, position, end, max_bytes):
    """(value, position after it, ok) of the zigzag varint at ``position``."""
    raw = np.uint64(0)
    shift = np.uint64(0)
    for index in range(max_bytes):
        if position + index >= end:
            return np.int64(0), position, False
        byte = np.uint64(buffer[position + index])
        raw |= (byte & np.uint64(0x7F)) << shift
        if byte < np.uint64(0x80):
            value = np.int64(raw >> np.uint64(1)) ^ -np.int64(raw & np.uint64(1))
            return value, position + index + 1, True
        shift += np.uint64(7)
    return np.int64(0), position, False


@kernel
def _varint_size(value):
    raw = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    size = 1
    while raw >= np.uint64(0x80):
        raw >>= np.uint64(7)
        size += 1
    return size


@kernel
def _put_varint(buffer, position, value):
    raw = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    while raw >= np.uint64(0x80):
        buffer[position] = np.uint8((raw & np.uint64(0x7F)) | np.uint64(0x80))
        raw >>= np.uint64(7)
        position += 1
    buffer[position] = np.uint8(raw)
    return position + 1


# -- Kafka records -> shmlog records ------------------------------------------------------
@kernel
def _kafka_records(source, start, end, count, out, out_position, write):
    """Walk ``count`` Kafka records in ``source[start:end]``; with ``write``, put them
    in shmlog's layout at ``out[out_position:]``. Returns (status, bytes of shmlog
    records, last offset delta)."""
    position = start
    size = 0
    last_delta = -1
    for _ in range(count):
        length, position, ok = _varint(source, position, end, 5)
        if not ok or length < 1 or position + length > end:
            return _BAD_RECORDS, 0, 0
        record_end = position + length
        position += 1                                            # record attributes
        timestamp_delta, position, ok1 = _varint(source, position, record_end, 10)
        offset_delta, position, ok2 = _varint(source, position, record_end, 5)
        key_length, position, ok3 = _varint(source, position, record_end, 5)
        if not (ok1 and ok2 and ok3) or offset_delta < 0 or offset_delta <= last_delta \
                or key_length < -1 or position + max(key_length, 0) > record_end:
            return _BAD_RECORDS, 0, 0
        key_at = position
        position += max(key_length, 0)
        value_length, position, ok = _varint(source, position, record_end, 5)
        if not ok or value_length < -1 or position + max(value_length, 0) > record_end:
            return _BAD_RECORDS, 0, 0
        value_at = position
        position += max(value_length, 0)
        header_count, position, ok = _varint(source, position, record_end, 5)
        if not ok or header_count < 0 or header_count > record_end - position:
            return _BAD_RECORDS, 0, 0
        headers_at = position
        header_bytes = 0
        for _ in range(header_count):
            name_length, position, ok = _varint(source, position, record_end, 5)
            if not ok or name_length < 0 or position + name_length > record_end:
                return _BAD_RECORDS, 0, 0
            position += name_length
            header_value_length, position, ok = _varint(source, position, record_end, 5)
            if not ok or header_value_length < -1 or \
                    position + max(header_value_length, 0) > record_end:
                return _BAD_RECORDS, 0, 0
            position += max(header_value_length, 0)
            header_bytes += HEADER_FIXED + name_length + max(header_value_length, 0)
        if position != record_end:
            return _BAD_RECORDS, 0, 0
        record_size = RECORD_FIXED + max(key_length, 0) + max(value_length, 0) + header_bytes
        if write:
            at = out_position + size
            store_u32(out, at, record_size)
            store_u32(out, at + 4, offset_delta)
            store_i64(out, at + 8, timestamp_delta)
            store_i32(out, at + 16, key_length)
            store_i32(out, at + 20, value_length)
            store_u32(out, at + 24, header_count)
            at += RECORD_FIXED
            if key_length > 0:
                copy_bytes(out, at, source, key_at, key_length)
                at += key_length
            if value_length > 0:
                copy_bytes(out, at, source, value_at, value_length)
                at += value_length
            header = headers_at
            for _ in range(header_count):
                name_length, header, _ok = _varint(source, header, record_end, 5)
                name_at = header
                header += name_length
                header_value_length, header, _ok = _varint(source, header, record_end, 5)
                store_u32(out, at, name_length)
                store_i32(out, at + 4, header_value_length)
                copy_bytes(out, at + HEADER_FIXED, source, name_at, name_length)
                at += HEADER_FIXED + name_length
                if header_value_length > 0:
                    copy_bytes(out, at, source, header, header_value_length)
                    at += header_value_length
                    header += header_value_length
        size += record_size
        last_delta = offset_delta
    if position != end:
        return _BAD_RECORDS, 0, 0
    return _OK, size, last_delta


@kernel
def _check_kafka_header(batch, size):
    """(status, records end) of the Kafka batch ``batch[:size]`` (CRC checked)."""
    if size > K_MAGIC and batch[K_MAGIC] != KAFKA_MAGIC:
        return _BAD_MAGIC, 0                 # a message set of magic 0 or 1: same place
    if size < KAFKA_HEADER_LENGTH:
        return _TRUNCATED, 0
    length = np.int64(np.int32(_be32(batch, K_LENGTH)))
    end = length + K_LENGTH_OVERHEAD
    if length < KAFKA_HEADER_LENGTH - K_LENGTH_OVERHEAD or end > size:
        return _TRUNCATED, 0
    if end != size:
        return _NOT_ONE_BATCH, 0
    if crc32c_kernel(batch, K_ATTRIBUTES, end) != _be32(batch, K_CRC):
        return _BAD_CRC, 0
    if _be16(batch, K_ATTRIBUTES) & K_CONTROL_BIT:
        return _CONTROL, 0
    return _OK, end


@kernel
def _stored_header(batch, out, records_length, codec, record_count, last_delta):
    """Write shmlog's header for the Kafka batch ``batch`` into ``out`` (records
    already at ``out[RECORDS_OFFSET:]``) and its CRC."""
    length = B.HEADER_LENGTH + records_length
    store_u32(out, B.BATCH_LENGTH_OFFSET, length)
    store_u16(out, B.MAGIC_OFFSET, B.MAGIC)
    out[B.VERSION_OFFSET] = B.VERSION
    out[B.RESERVED_OFFSET] = 0
    store_i64(out, B.BASE_OFFSET_OFFSET, _be64(batch, K_BASE_OFFSET))
    store_i32(out, B.LEADER_EPOCH_OFFSET, np.int32(_be32(batch, K_LEADER_EPOCH)))
    attributes = codec
    if _be16(batch, K_ATTRIBUTES) & K_TIMESTAMP_TYPE_BIT:
        attributes |= B.TIMESTAMP_TYPE_BIT
    if _be16(batch, K_ATTRIBUTES) & K_TRANSACTIONAL_BIT:
        attributes |= B.TRANSACTIONAL_BIT
    store_u16(out, B.ATTRIBUTES_OFFSET, attributes)
    store_i16(out, B.PRODUCER_EPOCH_OFFSET, _be16(batch, K_PRODUCER_EPOCH))
    store_i32(out, B.RECORD_COUNT_OFFSET, record_count)
    store_i32(out, B.LAST_OFFSET_DELTA_OFFSET, np.int32(_be32(batch, K_LAST_OFFSET_DELTA)))
    store_i32(out, B.BASE_SEQUENCE_OFFSET, np.int32(_be32(batch, K_BASE_SEQUENCE)))
    store_i64(out, B.PRODUCER_ID_OFFSET, _be64(batch, K_PRODUCER_ID))
    store_i64(out, B.FIRST_TIMESTAMP_OFFSET, _be64(batch, K_BASE_TIMESTAMP))
    store_i64(out, B.MAX_TIMESTAMP_OFFSET, _be64(batch, K_MAX_TIMESTAMP))
    store_u32(out, B.CRC_OFFSET, crc32c_kernel(out, B.CRC_COVERED_OFFSET, length))


def _signed32(value: int) -> int:
    """An int32 field read unsigned (outside a kernel), as its signed value."""
    return (value ^ 0x80000000) - 0x80000000


def _refuse(status: int, what: str) -> CorruptRecordError:
    name = KafkaBatchStatus(status).name
    return CorruptRecordError(f"a Kafka record batch was refused ({name}): {what}",
                              status=status)


def _inflate(codec: int, data) -> bytes:
    """A Kafka batch's compressed records, inflated: ``data`` must be exactly one
    gzip member or one zstd frame (what every Kafka client writes: a batch is one
    compressing stream) with no byte after it, and inflate to at most
    ``limits.DECOMPRESSED_RECORDS_SIZE_MAX`` bytes, checked as it inflates."""
    try:
        inflated, complete, after = (_inflate_gzip if codec == K_GZIP else _inflate_zstd)(data)
        if not complete:
            raise ValueError("the data ends inside the compressed stream")
        if after:
            raise ValueError(f"{after} bytes follow the compressed stream")
    except (zlib.error, zstandard.ZstdError, ValueError) as error:
        raise _refuse(int(KafkaBatchStatus.BAD_COMPRESSION),
                      f"its records do not inflate: {error}") from None
    return inflated


def _inflate_gzip(data) -> tuple[bytes, bool, int]:
    """(inflated bytes, whether the member ended, bytes after it). zlib checks the
    member's trailer (CRC-32 and length) before it says the member ended."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    inflated = inflater.decompress(data, limits.DECOMPRESSED_RECORDS_SIZE_MAX + 1)
    _check_inflated_size(len(inflated))
    return inflated, inflater.eof, len(inflater.unused_data)


def _inflate_zstd(data) -> tuple[bytes, bool, int]:
    """(inflated bytes, whether the frame ended, bytes after it). A frame that
    declares its size is checked against the bound and inflated at once (libzstd
    holds it to that size; a cut frame or bytes after it raise); one that does not,
    a step at a time (``limits.ZSTD_UNSIZED_FRAME_STEP_SIZE``)."""
    data = memoryview(data)
    declared = zstandard.frame_content_size(data)
    _check_inflated_size(declared)
    decompressor = zstandard.ZstdDecompressor(
        max_window_size=limits.DECOMPRESSED_RECORDS_SIZE_MAX)
    if declared >= 0:
        return decompressor.decompress(data, allow_extra_data=False), True, 0
    inflater = decompressor.decompressobj()
    step = limits.ZSTD_UNSIZED_FRAME_STEP_SIZE
    pieces, total, fed = [], 0, 0
    while not inflater.eof and fed < data.nbytes:
        pieces.append(inflater.decompress(data[fed:fed + step]))
        fed += step
        total += len(pieces[-1])
        _check_inflated_size(total)
    after = len(inflater.unused_data) + max(data.nbytes - fed, 0)
    return b"".join(pieces), inflater.eof, after


def _check_inflated_size(size: int) -> None:
    if size > limits.DECOMPRESSED_RECORDS_SIZE_MAX:
        raise ValueError(f"inflates past {limits.DECOMPRESSED_RECORDS_SIZE_MAX} bytes")


def from_kafka(records, batch_size_max: int | None = None) -> np.ndarray:
    """The one Kafka record batch in ``records`` (a Produce's partition data) as
    shmlog batches, ready for the appender: one batch, or several back to back when
    its stored form would pass ``batch_size_max`` (see :func:`_split`).

    Raises
    ------
    CorruptRecordError
        The batch is malformed, fails its CRC, is more or less than one batch, its
        records do not inflate, or it is a control batch (``status``: a
        :class:`KafkaBatchStatus`).
    UnsupportedCodecError
        It is compressed with snappy or lz4.
    """
    batch = np.frombuffer(records, np.uint8)
    status, end = _check_kafka_header(batch, batch.size)
    if status != _OK:
        raise _refuse(status, f"{batch.size} bytes")
    codec = int(_be16(batch, K_ATTRIBUTES)) & K_CODEC_MASK
    count = _signed32(int(_be32(batch, K_RECORD_COUNT)))
    if codec in (K_SNAPPY, K_LZ4):
        raise UnsupportedCodecError(
            f"a Kafka record batch is compressed with {'snappy' if codec == K_SNAPPY else 'lz4'}"
            f": shmlog stores batches uncompressed or as zstd; set the producer's "
            f"compression.type to zstd, gzip or none")
    if codec not in (0, K_GZIP, K_ZSTD):
        raise _refuse(_BAD_RECORDS, f"its codec {codec} is none of Kafka's")
    source = batch if codec == 0 else \
        np.frombuffer(_inflate(codec, batch[KAFKA_HEADER_LENGTH:end]), np.uint8)
    start, stop = (KAFKA_HEADER_LENGTH, end) if codec == 0 else (0, source.size)
    if count < 0 or count > stop - start:
        raise _refuse(_BAD_RECORDS, f"it counts {count} records")
    empty = np.zeros(0, np.uint8)
    status, size, last_delta = _kafka_records(source, start, stop, count, empty, 0, False)
    if status != _OK or \
            (count and last_delta != _signed32(int(_be32(batch, K_LAST_OFFSET_DELTA)))):
        raise _refuse(_BAD_RECORDS, "its records do not parse as their header says")
    out = np.empty(B.HEADER_LENGTH + size, np.uint8)
    _kafka_records(source, start, stop, count, out, B.HEADER_LENGTH, True)
    _stored_header(batch, out, size, B.CODEC_NONE, count, last_delta)
    budget = out.size if batch_size_max is None else batch_size_max
    if codec != 0 and batch_size_max is not None:   # what zstd may add to random bytes
        budget -= min(limits.ZSTD_FRAME_OVERHEAD_MAX, budget // 8)
    pieces = _split(out, count, budget)
    if codec != 0:
        pieces = [_compress(piece) for piece in pieces]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def _compress(batch: np.ndarray) -> np.ndarray:
    """An uncompressed stored batch as zstd (header kept but its length, codec, CRC)."""
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(
        batch[B.HEADER_LENGTH:])
    stored = np.empty(B.HEADER_LENGTH + len(frame), np.uint8)
    stored[:B.HEADER_LENGTH] = batch[:B.HEADER_LENGTH]
    stored[B.HEADER_LENGTH:] = np.frombuffer(frame, np.uint8)
    _restamp(stored, B.CODEC_ZSTD)
    return stored


@kernel
def _restamp(batch, codec):
    """Set a stored batch's length and codec and write its CRC again."""
    store_u32(batch, B.BATCH_LENGTH_OFFSET, batch.size)
    attributes = load_u16(batch, B.ATTRIBUTES_OFFSET)
    store_u16(batch, B.ATTRIBUTES_OFFSET, (attributes & ~B.CODEC_MASK) | codec)
    store_u32(batch, B.CRC_OFFSET, crc32c_kernel(batch, B.CRC_COVERED_OFFSET, batch.size))


@kernel
def _chunk_ends(batch, count, budget):
    """Where the records of ``batch`` split into runs whose batches stay within
    ``budget`` bytes (each run at least one record): the end position of each run."""
    ends = np.empty(max(count, 1), np.int64)
    runs = 0
    position = B.HEADER_LENGTH
    run_start = position
    for _ in range(count):
        length = load_u32(batch, position)
        if position > run_start and B.HEADER_LENGTH + position + length - run_start > budget:
            ends[runs] = position
            runs += 1
            run_start = position
        position += length
    ends[runs] = position
    return ends[:runs + 1]


@kernel
def _make_chunk(batch, start, end, out):
    """``out``: a stored batch of the records ``batch[start:end]``, their offset deltas
    made relative to the first, the header's counts, sequence and largest
    timestamp set for them (its CRC after)."""
    out[:B.HEADER_LENGTH] = batch[:B.HEADER_LENGTH]
    first_delta = np.int64(load_u32(batch, start + 4))
    base_sequence = load_i32(batch, B.BASE_SEQUENCE_OFFSET)
    first_timestamp = load_i64(batch, B.FIRST_TIMESTAMP_OFFSET)
    largest = np.int64(-(1 << 62))
    position = start
    at = B.HEADER_LENGTH
    count = 0
    last = np.int64(0)
    while position < end:
        length = load_u32(batch, position)
        copy_bytes(out, at, batch, position, length)
        last = np.int64(load_u32(batch, position + 4)) - first_delta
        store_u32(out, at + 4, last)
        largest = max(largest, load_i64(batch, position + 8))
        position += length
        at += length
        count += 1
    store_u32(out, B.BATCH_LENGTH_OFFSET, at)
    store_i32(out, B.RECORD_COUNT_OFFSET, count)
    store_i32(out, B.LAST_OFFSET_DELTA_OFFSET, last)
    if base_sequence >= 0:
        store_i32(out, B.BASE_SEQUENCE_OFFSET,
                  (np.int64(base_sequence) + first_delta) % (np.int64(1) << 31))
    store_i64(out, B.MAX_TIMESTAMP_OFFSET, first_timestamp + largest)
    store_u32(out, B.CRC_OFFSET, crc32c_kernel(out, B.CRC_COVERED_OFFSET, at))


def _split(batch: np.ndarray, count: int, budget: int) -> list[np.ndarray]:
    """An uncompressed stored batch as batches of at most ``budget`` bytes (a record
    alone larger stays alone, for the appender to refuse).

    A Kafka batch within ``max.message.bytes`` may not be once stored (shmlog's record
    fields are fixed-width, Kafka's varints: 100-byte values take about 20 % more), so
    its records go in several batches, appended together: offsets and sequences run
    on from batch to batch, the first has the Kafka batch's first sequence, so a
    re-sent Kafka batch is found a duplicate of the first and acknowledged with its
    offset."""
    if batch.size <= budget:
        return [batch]
    pieces = []
    start = B.HEADER_LENGTH
    for end in _chunk_ends(batch, count, budget):
        piece = np.empty(B.HEADER_LENGTH + int(end) - start, np.uint8)
        _make_chunk(batch, start, int(end), piece)
        pieces.append(piece)
        start = int(end)
    return pieces


# -- shmlog records -> Kafka records ------------------------------------------------------
@kernel
def _kafka_size_of_records(records, start, end, count):
    """Bytes the ``count`` shmlog records at ``records[start:end]`` take as Kafka's
    (the appender validated them when they were stored)."""
    position = start
    size = 0
    for _ in range(count):
        body = _kafka_record_body_size(records, position)
        size += _varint_size(body) + body
        position += load_u32(records, position)
    return size


@kernel
def _kafka_record_body_size(records, position):
    key_length = load_i32(records, position + 16)
    value_length = load_i32(records, position + 20)
    header_count = load_u32(records, position + 24)
    size = 1 + _varint_size(load_i64(records, position + 8)) + \
        _varint_size(load_u32(records, position + 4)) + \
        _varint_size(key_length) + max(key_length, 0) + \
        _varint_size(value_length) + max(value_length, 0) + _varint_size(header_count)
    at = position + RECORD_FIXED + max(key_length, 0) + max(value_length, 0)
    for _ in range(header_count):
        name_length = load_u32(records, at)
        header_value_length = load_i32(records, at + 4)
        size += _varint_size(name_length) + name_length + \
            _varint_size(header_value_length) + max(header_value_length, 0)
        at += HEADER_FIXED + name_length + max(header_value_length, 0)
    return size


@kernel
def _write_kafka_records(records, start, count, out, at):
    position = start
    for _ in range(count):
        at = _put_varint(out, at, _kafka_record_body_size(records, position))
        out[at] = 0                                               # record attributes
        at = _put_varint(out, at + 1, load_i64(records, position + 8))
        at = _put_varint(out, at, load_u32(records, position + 4))
        key_length = load_i32(records, position + 16)
        value_length = load_i32(records, position + 20)
        header_count = load_u32(records, position + 24)
        source = position + RECORD_FIXED
        at = _put_varint(out, at, key_length)
        if key_length > 0:
            copy_bytes(out, at, records, source, key_length)
            at += key_length
            source += key_length
        at = _put_varint(out, at, value_length)
        if value_length > 0:
            copy_bytes(out, at, records, source, value_length)
            at += value_length
            source += value_length
        at = _put_varint(out, at, header_count)
        for _ in range(header_count):
            name_length = load_u32(records, source)
            header_value_length = load_i32(records, source + 4)
            at = _put_varint(out, at, name_length)
            copy_bytes(out, at, records, source + HEADER_FIXED, name_length)
            at += name_length
            source += HEADER_FIXED + name_length
            at = _put_varint(out, at, header_value_length)
            if header_value_length > 0:
                copy_bytes(out, at, records, source, header_value_length)
                at += header_value_length
                source += header_value_length
        position += load_u32(records, position)
    return at


@kernel
def _write_kafka_header(header, out, at, records_size):
    """Kafka's header for the stored batch whose header is ``header[0:64]``, at
    ``out[at:]``, its records (``records_size`` bytes) following; CRC included."""
    end = at + KAFKA_HEADER_LENGTH + records_size
    _put_be(out, at + K_BASE_OFFSET, load_i64(header, B.BASE_OFFSET_OFFSET), 8)
    _put_be(out, at + K_LENGTH, end - at - K_LENGTH_OVERHEAD, 4)
    _put_be(out, at + K_LEADER_EPOCH, load_i32(header, B.LEADER_EPOCH_OFFSET), 4)
    out[at + K_MAGIC] = KAFKA_MAGIC
    attributes = 0
    stored = load_u16(header, B.ATTRIBUTES_OFFSET)
    if stored & B.TIMESTAMP_TYPE_BIT:
        attributes |= K_TIMESTAMP_TYPE_BIT
    if stored & B.CONTROL_BIT:
        attributes |= K_CONTROL_BIT
    if stored & (B.TRANSACTIONAL_BIT | B.CONTROL_BIT):   # Kafka's markers are transactional
        attributes |= K_TRANSACTIONAL_BIT
    _put_be(out, at + K_ATTRIBUTES, attributes, 2)
    _put_be(out, at + K_LAST_OFFSET_DELTA, load_i32(header, B.LAST_OFFSET_DELTA_OFFSET), 4)
    _put_be(out, at + K_BASE_TIMESTAMP, load_i64(header, B.FIRST_TIMESTAMP_OFFSET), 8)
    _put_be(out, at + K_MAX_TIMESTAMP, load_i64(header, B.MAX_TIMESTAMP_OFFSET), 8)
    _put_be(out, at + K_PRODUCER_ID, load_i64(header, B.PRODUCER_ID_OFFSET), 8)
    _put_be(out, at + K_PRODUCER_EPOCH, load_u16(header, B.PRODUCER_EPOCH_OFFSET), 2)
    _put_be(out, at + K_BASE_SEQUENCE, load_i32(header, B.BASE_SEQUENCE_OFFSET), 4)
    _put_be(out, at + K_RECORD_COUNT, load_i32(header, B.RECORD_COUNT_OFFSET), 4)
    _put_be(out, at + K_CRC, crc32c_kernel(out, at + K_ATTRIBUTES, end), 4)
    return end


@kernel
def _batch_sizes(log, end, positions, sizes):
    """Walk the stored batches in ``log[:end]`` (validated when stored; a zero length,
    space never written, ends them): each one's position, and its size as Kafka's
    (-1 for a compressed one: sized once inflated); ``positions`` gets the end of the
    last as its last entry. Returns the number of batches."""
    position = 0
    count = 0
    while position < end:
        length = np.int64(load_u32(log, position + B.BATCH_LENGTH_OFFSET))
        if length < B.HEADER_LENGTH or length > end - position:
            break                  # zero padding (never written): the end of the data
        positions[count] = position
        if load_u16(log, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK:
            sizes[count] = -1
        else:
            sizes[count] = KAFKA_HEADER_LENGTH + _kafka_size_of_records(
                log, position + B.HEADER_LENGTH, position + length,
                load_i32(log, position + B.RECORD_COUNT_OFFSET))
        count += 1
        position += length
    positions[count] = position
    return count


@kernel
def _write_uncompressed(log, positions, sizes, starts, count, out):
    """Write the first ``count`` stored batches as Kafka's at ``out[starts[i]:]``, all
    but the compressed ones (``sizes[i]`` -1 in ``_batch_sizes``: their slots are
    left for :func:`_write_inflated`)."""
    for index in range(count):
        position = positions[index]
        if load_u16(log, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK:
            continue
        records_size = sizes[index] - KAFKA_HEADER_LENGTH
        _write_kafka_records(log, position + B.HEADER_LENGTH,
                             load_i32(log, position + B.RECORD_COUNT_OFFSET), out,
                             starts[index] + KAFKA_HEADER_LENGTH)
        _write_kafka_header(log[position:position + B.HEADER_LENGTH], out, starts[index],
                            records_size)


@kernel
def _write_inflated(header, records, out, at, size):
    """Write the stored batch whose header is ``header`` and whose inflated records
    are ``records`` as a Kafka batch of ``size`` bytes at ``out[at:]``."""
    count = load_i32(header, B.RECORD_COUNT_OFFSET)
    _write_kafka_records(records, 0, count, out, at + KAFKA_HEADER_LENGTH)
    _write_kafka_header(header, out, at, size - KAFKA_HEADER_LENGTH)


def to_kafka(log: np.ndarray, max_bytes: int = -1) -> np.ndarray:
    """The stored batches ``log`` holds, whole and back to back (a read of the
    partition's log, as the appender stored them), as Kafka record batches, back to
    back, uncompressed: a stored zstd batch is inflated and goes out as Kafka's codec
    none (sending it as Kafka's zstd would need the records re-encoded and compressed
    again; a later option).

    With ``max_bytes`` >= 0, only as many whole batches as fit in it in Kafka's form,
    and at least the first: a stored zstd batch goes out inflated, so a read bounded
    by its stored bytes may hold many times more (40 zstd batches of 1,000 zero
    kilobytes: a 1 MiB read of the log, 40 MB as Kafka's), and a Fetch's budgets
    count what is sent.

    Two kernel calls for the whole run: one sizes every batch (exactly, so the output
    is allocated once), one writes the uncompressed ones. Python works per compressed
    batch only, to inflate it (and no further than the budget reaches).
    """
    log = np.ascontiguousarray(log)
    capacity = log.size // B.HEADER_LENGTH + 1
    positions = np.empty(capacity + 1, np.int64)
    sizes = np.empty(capacity, np.int64)
    count = _batch_sizes(log, log.size, positions, sizes)
    sizes = sizes[:count]
    sized, inflated = _inflate_stored(log, positions, sizes, max_bytes)
    ends = np.cumsum(sizes[:sized])
    kept = ends.size
    if max_bytes >= 0:
        kept = max(int(np.searchsorted(ends, max_bytes, side="right")), min(kept, 1))
    out = np.empty(int(ends[kept - 1]) if kept else 0, np.uint8)
    starts = ends[:kept] - sizes[:kept]
    _write_uncompressed(log, positions, sizes, starts, kept, out)
    for index, records in inflated.items():
        if index < kept:
            position = int(positions[index])
            _write_inflated(log[position:position + B.HEADER_LENGTH], records, out,
                            int(starts[index]), int(sizes[index]))
    return out


def _inflate_stored(log: np.ndarray, positions: np.ndarray, sizes: np.ndarray,
                    max_bytes: int) -> tuple[int, dict]:
    """Inflate the compressed batches among ``sizes`` (-1) in order and size them
    (in place), as far as the budget reaches: (how many batches are sized, from the
    first: all unless the budget ran out before a compressed one; {index: its
    inflated records})."""
    inflated = {}
    total = known = 0
    for index in np.flatnonzero(sizes < 0).tolist():
        total += int(sizes[known:index].sum())
        if max_bytes >= 0 and index and total >= max_bytes:
            return index, inflated             # the batches before it fill the budget
        position = int(positions[index])
        batch = log[position:int(positions[index + 1])]
        records = np.frombuffer(zstandard.ZstdDecompressor().decompress(
            batch[B.HEADER_LENGTH:],
            max_output_size=limits.DECOMPRESSED_RECORDS_SIZE_MAX), np.uint8)
        count = int(batch[B.RECORD_COUNT_OFFSET:B.RECORD_COUNT_OFFSET + 4].view("<i4")[0])
        sizes[index] = KAFKA_HEADER_LENGTH + _kafka_size_of_records(records, 0, records.size,
                                                                    count)
        inflated[index] = records
        known = index
    return sizes.size, inflated
