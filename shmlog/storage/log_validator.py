"""Validating the batches of an append before any byte of them enters the log
(Kafka's ``LogValidator``), and storing them as ``compression.type`` says.

Rules
-----
* Nothing is appended unless every batch of the append passed: structure, CRC32C,
  records (a zstd batch inflated and its records checked), ``max.message.bytes``,
  and the offsets the log can still give (:func:`check_offsets_available`). A
  failure raises a named error that says which batch and why; the log is unchanged.
* A produced append (``PartitionLog.append``) carries batches as producers send
  them: their base offsets are ignored (the log assigns them), their record
  offset deltas are dense. A follower's append (``append_as_follower``) carries
  batches as its leader stored them: each base offset follows the batch before,
  and compaction may have left the deltas sparse (recovery's rules).
* The buffers validated are private to the caller (nobody else can change them
  before they are copied); a compiled writer validates its own copy instead
  (``segment_append.append_batches`` with ``verify_copy``).

Theory of operation
-------------------
A kernel walks the append once, checking every batch and counting batches, zstd
batches and the largest batch; Python raises what it found, then inflates and
checks the records of compressed batches (a kernel cannot inflate). When the
topic's ``compression.type`` is a codec, batches stored with another codec are
recompressed (:func:`_apply_compression_type`), and checked against the size
limit again.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..common import limits
from ..common.errors import (
    CorruptRecordError,
    OffsetOverflowError,
    OffsetsOutOfOrderError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from ..native.jit import kernel, load_i32, load_i64, load_u16
from ..record import batch_layout as B
from ..record.records import (
    BatchStatus,
    Compression,
    batch_info,
    check_batch,
    check_inflated,
    check_produced_batch,
    iter_batches,
    recompress_batch,
)
from .topic_config import TopicConfig

__all__ = ["ReplicatedBatches", "validate_produced", "validate_replicated",
           "check_offsets_available"]

_BAD_OFFSET = int(BatchStatus.BAD_OFFSET)
# _validate_replicated's status for a batch whose base is not past the batch before
# it (not a BatchStatus: the batch itself may be fine).
_OUT_OF_ORDER = -1


@kernel
def _validate(source, start, end):
    """Validate appended batches: (status, position of the first bad one, batches,
    zstd batches, largest batch length)."""
    position = start
    count = 0
    compressed = 0
    largest = 0
    while position < end:
        status, length = check_produced_batch(source, position, end, True)
        if status != 0:
            return status, position, count, compressed, largest
        largest = max(largest, length)
        if load_u16(source, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK != B.CODEC_NONE:
            compressed += 1
        count += 1
        position += length
    return 0, position, count, compressed, largest


@kernel
def _validate_replicated(source, start, end):
    """Validate a follower's batches as stored batches (recovery's rules: compaction
    leaves sparse offset deltas) whose base offsets each follow the batch before:
    (status, position of the first bad one, batches, zstd batches, largest batch
    length, first base offset, the offset after the last batch). ``status`` is a
    :class:`BatchStatus`, or ``_OUT_OF_ORDER``."""
    position = start
    count = 0
    compressed = 0
    largest = 0
    first_base = np.int64(-1)
    next_offset = np.int64(-1)
    while position < end:
        status, length = check_batch(source, position, end, True, True)
        if status != 0:
            return status, position, count, compressed, largest, first_base, next_offset
        base_offset = load_i64(source, position + B.BASE_OFFSET_OFFSET)
        last_offset_delta = np.int64(load_i32(source, position + B.LAST_OFFSET_DELTA_OFFSET))
        if base_offset < 0 or base_offset >= limits.OFFSET_MAX - last_offset_delta:
            return _BAD_OFFSET, position, count, compressed, largest, first_base, next_offset
        if count and base_offset < next_offset:
            return _OUT_OF_ORDER, position, count, compressed, largest, first_base, next_offset
        if count == 0:
            first_base = base_offset
        next_offset = base_offset + last_offset_delta + 1
        largest = max(largest, length)
        if load_u16(source, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK != B.CODEC_NONE:
            compressed += 1
        count += 1
        position += length
    return 0, position, count, compressed, largest, first_base, next_offset


class ReplicatedBatches(NamedTuple):
    """A follower's append, validated (:func:`validate_replicated`)."""
    source: np.ndarray
    batch_count: int
    first_base_offset: int
    next_offset: int               # the offset after its last batch


def _as_source(batches) -> np.ndarray:
    """``batches`` as the contiguous 1-D uint8 array the kernels walk.

    Raises
    ------
    CorruptRecordError
        It is not one.
    """
    source = batches if isinstance(batches, np.ndarray) else np.frombuffer(batches, np.uint8)
    if source.dtype != np.uint8 or source.ndim != 1 or not source.flags.c_contiguous:
        raise CorruptRecordError("batches must be a contiguous 1-D uint8 buffer")
    return source


def validate_produced(batches, config: TopicConfig, directory: str) -> tuple[np.ndarray, int]:
    """Validate a produced append to the log in ``directory``, and store it as
    ``compression.type`` says.

    Returns
    -------
    (source, batch count)
        The batches to append (recompressed when the topic says so) and how many.

    Raises
    ------
    CorruptRecordError
        A batch is malformed.
    RecordTooLargeError
        A batch exceeds ``max.message.bytes`` (as sent, or as stored).
    """
    source = _as_source(batches)
    status, bad_position, count, compressed, largest = _validate(source, 0, source.size)
    _raise_invalid(status, bad_position, count, largest, config, directory)
    if compressed:
        _check_compressed(source)
    return _apply_compression_type(source, config, directory), count


def check_offsets_available(directory: str, log_end_offset: int, batch_count: int) -> None:
    """Check that ``batch_count`` produced batches appended at ``log_end_offset`` can
    take their offsets (each may hold ``limits.BATCH_RECORD_COUNT_MAX`` records).

    Raises
    ------
    OffsetOverflowError
        They could take offsets past ``limits.OFFSET_MAX``.
    """
    if log_end_offset > limits.OFFSET_MAX - batch_count * limits.BATCH_RECORD_COUNT_MAX:
        raise OffsetOverflowError(
            f"{directory}: {batch_count} more batches could take offsets past "
            f"{limits.OFFSET_MAX} (the log end is {log_end_offset})")


def validate_replicated(batches, config: TopicConfig, directory: str,
                        log_end_offset: int) -> ReplicatedBatches:
    """Validate a follower's append (a leader's batches, as stored) to the log in
    ``directory`` ending at ``log_end_offset``.

    Raises
    ------
    UnexpectedAppendOffsetError
        The first base offset is below the log end.
    OffsetsOutOfOrderError
        A batch's base offset is not past the batch before it.
    CorruptRecordError
        A batch is malformed.
    RecordTooLargeError
        A batch exceeds ``max.message.bytes``.
    """
    source = _as_source(batches)
    status, bad_position, count, compressed, largest, first_base, next_offset = \
        _validate_replicated(source, 0, source.size)
    _raise_invalid(status, bad_position, count, largest, config, directory)
    if first_base < log_end_offset:
        raise UnexpectedAppendOffsetError(
            f"{directory}: a follower's append starts at offset {first_base}, below "
            f"the log end {log_end_offset}; nothing was appended",
            status=int(BatchStatus.BAD_OFFSET), position=0)
    if compressed:
        _check_compressed(source)
    return ReplicatedBatches(source, int(count), int(first_base), int(next_offset))


def _raise_invalid(status: int, bad_position: int, count: int, largest: int,
                   config: TopicConfig, directory: str) -> None:
    """Raise what a validating walk found (see :func:`validate_produced`)."""
    if status == _OUT_OF_ORDER:
        raise OffsetsOutOfOrderError(
            f"{directory}: the batch at byte {bad_position} of a follower's append "
            f"does not start past the batch before it; nothing was appended",
            status=int(BatchStatus.BAD_OFFSET), position=int(bad_position))
    if status != 0 or count == 0:
        reason = BatchStatus(status).name if count or status else "EMPTY"
        raise CorruptRecordError(
            f"{directory}: rejected batch at byte {bad_position} of the append: "
            f"{reason}; nothing was appended", status=int(status), position=int(bad_position))
    if largest > config.batch_size_max:
        raise RecordTooLargeError(
            f"{directory}: a batch of {largest} bytes exceeds the limit of "
            f"{config.batch_size_max} (max.message.bytes="
            f"{config.max_message_bytes}, segment.bytes={config.segment_bytes}); "
            f"nothing was appended: send smaller batches or raise max.message.bytes")


def _check_compressed(source: np.ndarray) -> None:
    """Inflate every zstd batch and check its records (the kernels framed them)."""
    position = 0
    while position < source.size:
        info = batch_info(source, position)       # _validate framed every batch
        if info.compression is Compression.ZSTD:
            check_inflated(source, info)
        position += info.batch_length


def _apply_compression_type(source: np.ndarray, config: TopicConfig,
                           directory: str) -> np.ndarray:
    """Recompress batches whose codec differs from ``compression.type`` (unless it
    is "producer", which keeps what the producer sent).

    Raises
    ------
    RecordTooLargeError
        A recompressed batch exceeds ``max.message.bytes``.
    """
    wanted = config.compression_type
    if wanted == "producer":
        return source
    codec = Compression.parse(wanted)
    infos = list(iter_batches(source))
    if all(info.compression is codec for info in infos):
        return source
    converted = [recompress_batch(source, info, codec) for info in infos]
    largest = max(batch.size for batch in converted)
    if largest > config.batch_size_max:
        raise RecordTooLargeError(
            f"{directory}: stored as compression.type={wanted}, a batch would be "
            f"{largest} bytes, over the limit of {config.batch_size_max}; nothing "
            f"was appended")
    return np.concatenate(converted)
