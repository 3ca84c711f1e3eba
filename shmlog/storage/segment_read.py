"""The read path of a segment: find a batch by offset, collect whole batches for a
read, find a record by timestamp. What the broker's log and a consumer's reader
(``client.reader``, in another process) share.

Rules
-----
* Nothing here writes to a segment, and nothing here imports the writer's side
  (``segment_append``, ``log_segment``, the log itself): a process that only reads
  segments in place loads neither the append kernels nor the validator.
* Every function takes a segment's log bytes (the broker's own mapping, or a
  reader's read-only one) and the end of the bytes it may look at: whole batches,
  which the caller knows (the writer's position, or the published size). Nothing
  past that end is ever read: it may belong to a batch still being copied.
* Every walk steps with ``records.batch_frame``, the one bounds check of a walk.
  Kernels return statuses; their wrappers raise :class:`CorruptSegmentError` with
  the path and the position of the batch that failed.
* Each batch is CRC-checked the first time a process reads it: the caller keeps
  the verified prefix of each segment, and :func:`collect_batches` extends it.

Theory of operation
-------------------
A read finds the batch holding the requested offset: the sparse offset index gives
a batch boundary at or before it (:func:`position_of`), and :func:`find_batch`
walks batch headers from there. :func:`collect_batches` takes whole batches from
that position, up to a byte limit (at least one batch) and below an offset limit,
and returns them as a view of the mapping: no copy.

A lookup by timestamp (Kafka's ``offsetsForTimes``, :func:`offset_for_timestamp`)
starts at the offset after the time index's last entry below the timestamp, walks
batch headers until a batch's largest timestamp reaches it, and walks that batch's
records, or inflates it when it is compressed (Python's work: the kernel cannot).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..common.errors import CorruptSegmentError
from ..native.jit import kernel, load_i32, load_i64, load_u16, load_u32
from ..record import batch_layout as B
from ..record.records import (
    BatchStatus,
    batch_frame,
    batch_info,
    check_batch,
    decode_columns,
    inflate_batch,
)
from .segment_state import LOOKUP_DAMAGED, LOOKUP_FOUND, LOOKUP_INFLATE, LOOKUP_NOT_FOUND

__all__ = ["ReadResult", "find_batch", "collect_batches", "position_of",
           "offset_for_timestamp"]


class ReadResult(NamedTuple):
    """Whole batches, as a zero-copy view of the mapped segment.

    ``data`` starts at the batch holding the requested offset, so it may hold a few
    records before it; ``next_offset`` is where the following read should start.
    """
    data: np.ndarray
    next_offset: int
    segment_base_offset: int


@kernel
def find_batch(log, position, end, target_offset):
    """Byte position of the first batch of ``log[position:end]`` whose last offset is
    at least ``target_offset``, walking batch headers from ``position`` (a batch
    boundary); ``end`` when there is none. Checks only each batch's frame: at one
    that fails it, that position is returned, for the verifying read to report."""
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return position        # not a batch: let the verifying reader report it
        last_offset = (load_i64(log, position + B.BASE_OFFSET_OFFSET)
                       + load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET))
        if last_offset >= target_offset:
            return position
        position += length
    return end


@kernel
def _collect(log, position, end, max_bytes, max_offset, verified_end):
    """Whole batches from ``position``: stop before ``max_bytes`` (but take at least
    one batch) or at a batch reaching ``max_offset``. The CRC of batches past
    ``verified_end`` is checked on the way (the bytes are then those append
    validated; decoding checks record structure as it walks the records).

    Returns (status, end position, next offset, bad position).
    """
    start = position
    next_offset = -1
    while position < end:
        status, length = check_batch(log, position, end, position >= verified_end, False)
        if status != 0:
            return status, position, next_offset, position
        base_offset = load_i64(log, position + B.BASE_OFFSET_OFFSET)
        if base_offset >= max_offset:
            break
        if position > start and position + length - start > max_bytes:
            break
        next_offset = base_offset + load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET) + 1
        position += length
    return 0, position, next_offset, position


@kernel
def _find_timestamp(log, position, end, target_timestamp, start_offset):
    """First record at or after ``start_offset`` with timestamp >= target.

    Returns (status, offset, timestamp, batch position): LOOKUP_FOUND, LOOKUP_NOT_FOUND,
    LOOKUP_INFLATE when the batch that holds it is compressed (Python inflates it), or
    LOOKUP_DAMAGED when a batch on the way fails its check (at that position).
    """
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return LOOKUP_DAMAGED, 0, 0, position
        base_offset = load_i64(log, position + B.BASE_OFFSET_OFFSET)
        last_offset = base_offset + load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)
        max_timestamp = load_i64(log, position + B.MAX_TIMESTAMP_OFFSET)
        if last_offset >= start_offset and max_timestamp >= target_timestamp:
            # The records are walked: check the whole batch first.
            status, _ = check_batch(log, position, end, True, True)
            if status != 0:
                return LOOKUP_DAMAGED, 0, 0, position
            attributes = load_u16(log, position + B.ATTRIBUTES_OFFSET)
            if attributes & B.CODEC_MASK != B.CODEC_NONE:
                return LOOKUP_INFLATE, 0, 0, position
            first_timestamp = load_i64(log, position + B.FIRST_TIMESTAMP_OFFSET)
            record = position + B.RECORDS_OFFSET
            while record < position + length:
                offset = base_offset + load_u32(log, record + B.OFFSET_DELTA_OFFSET)
                if attributes & B.TIMESTAMP_TYPE_BIT:
                    timestamp = max_timestamp
                else:
                    timestamp = first_timestamp + load_i64(log, record + B.TIMESTAMP_DELTA_OFFSET)
                if offset >= start_offset and timestamp >= target_timestamp:
                    return LOOKUP_FOUND, offset, timestamp, position
                record += np.int64(load_u32(log, record + B.RECORD_LENGTH_OFFSET))
        position += length
    return LOOKUP_NOT_FOUND, 0, 0, end


def collect_batches(log: np.ndarray, path: str, position: int, end: int, max_bytes: int,
                    max_offset: int, verified_end: int, offset: int) -> tuple[int, int, int]:
    """Whole batches of ``log`` from ``position`` (see ``_collect``), CRC-checked past
    ``verified_end``. Good batches before damage are served (the next read starts at
    the damage); damage where the read starts raises.

    Returns (end of the batches, next offset or -1 for none, the verified prefix).

    Raises
    ------
    CorruptSegmentError
        The batch at ``position`` fails its check.
    """
    status, stop, next_offset, bad = _collect(log, position, end, max_bytes, max_offset,
                                              verified_end)
    if status != 0 and bad == position:
        raise CorruptSegmentError(
            f"{path}: {BatchStatus(status).name} in the batch at byte {bad} (reading offset "
            f"{offset}); the segment is damaged: restore it from a replica or delete it",
            path=path, position=int(bad))
    if position <= verified_end < stop:
        verified_end = int(stop)
    return int(stop), int(next_offset), verified_end


def position_of(log: np.ndarray, end: int, base_offset: int, offset_entries: np.ndarray,
                offset: int) -> int:
    """Byte position of the batch holding ``offset`` in a segment at ``base_offset``
    (or ``end``): from the offset index's last entry at or below it (``offset_entries``,
    the entries in use, in ``index_layout.OFFSET_INDEX_DTYPE``), on by batch headers."""
    slot = int(np.searchsorted(offset_entries["relative_offset"], offset - base_offset,
                               side="right")) - 1
    start = int(offset_entries["position"][slot]) if slot >= 0 else 0
    return int(find_batch(log, start, end, offset))


def offset_for_timestamp(log: np.ndarray, path: str, end: int, base_offset: int,
                         offset_entries: np.ndarray, time_entries: np.ndarray, timestamp: int,
                         min_offset: int):
    """(offset, timestamp) of the first record of a segment at or after ``min_offset``
    whose timestamp is >= ``timestamp``, or None: from the time index's entries in use
    (``time_entries``) and the offset index's (``offset_entries``).

    Raises
    ------
    CorruptSegmentError
        A batch on the way fails its check.
    """
    slot = int(np.searchsorted(time_entries["timestamp"], timestamp, side="left")) - 1
    start_offset = (base_offset + int(time_entries["relative_offset"][slot]) + 1
                    if slot >= 0 else base_offset)
    start_offset = max(start_offset, min_offset)
    position = position_of(log, end, base_offset, offset_entries, start_offset)
    while True:
        status, offset, found, position = _find_timestamp(log, position, end, timestamp,
                                                          start_offset)
        if status == LOOKUP_FOUND:
            return int(offset), int(found)
        if status == LOOKUP_NOT_FOUND:
            return None
        if status == LOOKUP_DAMAGED:
            raise CorruptSegmentError(
                f"{path}: the batch at byte {position} fails its check (looking "
                f"up timestamp {timestamp})", path=path, position=int(position))
        hit = _timestamp_in_compressed(log, int(position), timestamp, start_offset)
        if hit is not None:
            return hit
        position += batch_info(log, int(position)).batch_length   # on to the next


def _timestamp_in_compressed(log: np.ndarray, position: int, timestamp: int, start_offset: int):
    columns = decode_columns(inflate_batch(log, batch_info(log, position)), verified=True)
    hits = np.flatnonzero((columns.offsets >= start_offset) & (columns.timestamps >= timestamp))
    if not hits.size:
        return None
    return int(columns.offsets[hits[0]]), int(columns.timestamps[hits[0]])
