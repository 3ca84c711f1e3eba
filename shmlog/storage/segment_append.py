"""The writer's kernels: appending batches to the active segment, keeping its
sparse indexes, and the rescan that rebuilds them.

Rules
-----
* One writer per segment (the partition's writer), holding a current target: the
  log has not told its listener of a change since the target was taken.
* No store ever lands past a reservation, in any of the three files. The
  segment's state (``segment_state``) says how many bytes of the log and of each
  index are reserved; :func:`append_batches` copies a batch only when the log
  bytes it takes, the index entries it may add and the slot of the closing
  time-index entry (which sealing writes) are all reserved (see
  :func:`index_slots_reserved`), and otherwise asks Python for room
  (``NEED_SPACE``).
* One slot of each index stays free for the closing time-index entry: an append
  that would need it asks for a roll instead (:func:`will_index`).
* Offsets are assigned once, dense and increasing; a follower's append keeps its
  leader's (which compaction may have left with gaps), never going back.
* Kernels return statuses, never raise; every walk steps with
  ``records.batch_frame``. The kernels other modules call are public (no wrapper
  can check more than their callers already do, on a per-batch path).

Theory of operation
-------------------
:func:`append_batches` copies validated batches into the mapping, stamps base
offset and leader epoch, adds sparse index entries every ``index.interval.bytes``
(an offset-index entry and, when the largest timestamp grew, a time-index entry),
and returns early when the segment must roll or more space must be reserved;
Python (``log_segment``, ``local_log``) does those and calls it again. It is
called by ``PartitionLog.append`` and by a compiled writer's own loop, through the
``AppendTarget`` the log gives it (``segments``).

:func:`rescan` walks a segment's log from byte 0, checks every batch (CRC32C,
structure and offsets) and rebuilds both indexes as the appends would have:
recovery's work, and a truncation's. :func:`verify_prefix` only checks.
"""

from __future__ import annotations

import numpy as np

from ..common import limits
from ..native.crc32c import crc32c_kernel
from ..native.jit import (
    copy_bytes,
    kernel,
    load_i32,
    load_i64,
    load_u16,
    store_i32,
    store_i64,
    store_u16,
    store_u32,
)
from ..record import batch_layout as B
from ..record.records import BatchStatus, batch_frame, check_batch, check_produced_batch
from . import index_layout as I
from .segment_state import (
    APPENDED,
    BASE_OFFSET_WORD,
    INDEXED_TIMESTAMP_WORD,
    MAX_TIMESTAMP_WORD,
    NEED_ROLL,
    NEED_SPACE,
    NEXT_OFFSET_WORD,
    OFFSET_CAPACITY_WORD,
    OFFSET_ENTRIES_WORD,
    OFFSET_RESERVED_WORD,
    POSITION_WORD,
    REJECTED,
    RESERVED_WORD,
    ROLL_TIMESTAMP_WORD,
    SINCE_INDEX_WORD,
    TIME_CAPACITY_WORD,
    TIME_ENTRIES_WORD,
    TIME_RESERVED_WORD,
    TIMESTAMP_NONE,
)

__all__ = ["append_batches", "will_index", "index_slots_reserved",
           "append_time_entry", "rescan", "verify_prefix"]

# Batch statuses the kernels return (ints: what numba compares and returns).
_TRUNCATED = int(BatchStatus.TRUNCATED)
_BAD_LENGTH = int(BatchStatus.BAD_LENGTH)
_BAD_OFFSET = int(BatchStatus.BAD_OFFSET)


@kernel
def will_index(state, index_interval):
    """Whether the next batch gets index entries: ``index.interval.bytes`` of log
    since the last entry, and room in both indexes (one slot of each stays free for
    the closing time-index entry)."""
    return (state[SINCE_INDEX_WORD] >= index_interval
            and state[OFFSET_ENTRIES_WORD] < state[OFFSET_CAPACITY_WORD] - 1
            and state[TIME_ENTRIES_WORD] < state[TIME_CAPACITY_WORD] - 1)


@kernel
def index_slots_reserved(state, indexing):
    """Whether every index slot the next batch may store into is reserved on disk:
    an entry of each index when ``indexing``, and the time index's closing entry
    (which sealing writes, unless the index is full)."""
    extra = 1 if indexing else 0
    offset_end = (state[OFFSET_ENTRIES_WORD] + extra) * I.OFFSET_ENTRY_LENGTH
    time_end = min(state[TIME_ENTRIES_WORD] + 1 + extra,
                   state[TIME_CAPACITY_WORD]) * I.TIME_ENTRY_LENGTH
    return offset_end <= state[OFFSET_RESERVED_WORD] and time_end <= state[TIME_RESERVED_WORD]


@kernel
def _index_batch(log, log_position, length, offset_index, time_index, state, index_interval):
    """Account for the batch just written at ``log_position``: sparse index entries
    and the running maximum timestamp."""
    indexing = will_index(state, index_interval)
    base_offset = load_i64(log, log_position + B.BASE_OFFSET_OFFSET)
    last_offset = base_offset + load_i32(log, log_position + B.LAST_OFFSET_DELTA_OFFSET)
    max_timestamp = load_i64(log, log_position + B.MAX_TIMESTAMP_OFFSET)
    if state[MAX_TIMESTAMP_WORD] < max_timestamp:
        state[MAX_TIMESTAMP_WORD] = max_timestamp
    if state[ROLL_TIMESTAMP_WORD] == TIMESTAMP_NONE:
        state[ROLL_TIMESTAMP_WORD] = max_timestamp
    if indexing:
        entry = state[OFFSET_ENTRIES_WORD] * I.OFFSET_ENTRY_LENGTH
        store_u32(offset_index, entry + I.OFFSET_ENTRY_RELATIVE_OFFSET_OFFSET,
                  base_offset - state[BASE_OFFSET_WORD])
        store_u32(offset_index, entry + I.OFFSET_ENTRY_POSITION_OFFSET, log_position)
        state[OFFSET_ENTRIES_WORD] += 1
        if state[MAX_TIMESTAMP_WORD] > state[INDEXED_TIMESTAMP_WORD]:
            append_time_entry(time_index, state, last_offset)
        state[SINCE_INDEX_WORD] = 0
    state[SINCE_INDEX_WORD] += length
    state[POSITION_WORD] = log_position + length
    state[NEXT_OFFSET_WORD] = last_offset + 1


@kernel
def append_time_entry(time_index, state, last_offset):
    """Store a time-index entry for the running maximum timestamp at ``last_offset``
    (the caller knows its slot is reserved)."""
    entry = state[TIME_ENTRIES_WORD] * I.TIME_ENTRY_LENGTH
    store_i64(time_index, entry + I.TIME_ENTRY_TIMESTAMP_OFFSET, state[MAX_TIMESTAMP_WORD])
    store_u32(time_index, entry + I.TIME_ENTRY_RELATIVE_OFFSET_OFFSET,
              last_offset - state[BASE_OFFSET_WORD])
    state[TIME_ENTRIES_WORD] += 1
    state[INDEXED_TIMESTAMP_WORD] = state[MAX_TIMESTAMP_WORD]


@kernel
def append_batches(source, start, end, log, offset_index, time_index, state, segment_bytes,
                   segment_ms, index_interval, append_timestamp, leader_epoch, verify_copy,
                   keep_offsets=False):
    """Copy the batches ``source[start:end]`` into the active segment the arrays
    and ``state`` describe (an ``AppendTarget``'s fields), giving them the next
    offsets: the append kernel, called by ``PartitionLog.append`` and by a
    compiled writer's own loop.

    Contract
    --------
    * The caller is the partition's one writer and holds a current target (the
      log has not told its listener of a change since it was taken).
    * ``segment_bytes``, ``segment_ms`` and ``index_interval`` are the target's;
      ``append_timestamp`` is the broker's clock for a LogAppendTime topic, else
      ``segment_state.TIMESTAMP_NONE`` (the producer's timestamps stay);
      ``leader_epoch`` is stamped into every batch.
    * With ``keep_offsets`` (a follower's append, Kafka's ``appendAsFollower``) each
      batch keeps the base offset and leader epoch it carries (``leader_epoch`` is
      not read; ``append_timestamp`` must be ``TIMESTAMP_NONE``): the log end jumps
      to the batch's base over a gap compaction left in the leader's log. A base
      below the log end is ``REJECTED`` (``BAD_OFFSET``). The caller rolls to the
      batch's base when asked to (a new segment there; an empty segment whose
      base is too far below the batch's asks for that too).
    * With ``verify_copy`` each batch is validated (``records.check_produced_batch``,
      CRC included) after it is copied, in the log, so the bytes checked are the
      bytes kept even if the source changes meanwhile (a ring a producer can still
      write); without it the caller validated the source, which nobody else can
      change. A batch must not be compressed unless the caller checked its records
      (``records.check_inflated``): the kernel cannot inflate.
    * Nothing is stored past what ``state`` says is reserved, in any file.
    * After it returns, ``state`` holds the new position and next offset; the
      caller publishes them and calls ``PartitionLog.appended_by_kernel``.

    Returns
    -------
    (status, source position reached, batch status)
        ``APPENDED`` when all are in; ``NEED_ROLL`` / ``NEED_SPACE`` when Python
        must roll or reserve before the batch at that position (space: log bytes
        or index slots, see :func:`index_slots_reserved`); ``REJECTED`` when that
        batch failed validation (its :class:`BatchStatus` says why, and nothing of
        it is in the log). The outcomes are ``segment_state``'s.
    """
    position = start
    while position < end:
        frame_status, length = batch_frame(source, position, end)
        if frame_status != 0:
            short = end - position < B.HEADER_LENGTH
            return REJECTED, position, _TRUNCATED if short else _BAD_LENGTH
        last_offset_delta = np.int64(load_i32(source, position + B.LAST_OFFSET_DELTA_OFFSET))
        if append_timestamp != TIMESTAMP_NONE:
            max_timestamp = append_timestamp
        else:
            max_timestamp = load_i64(source, position + B.MAX_TIMESTAMP_OFFSET)
        log_position = state[POSITION_WORD]
        base_offset = state[NEXT_OFFSET_WORD]
        if keep_offsets:
            base_offset = load_i64(source, position + B.BASE_OFFSET_OFFSET)
            if base_offset < state[NEXT_OFFSET_WORD]:
                return REJECTED, position, _BAD_OFFSET
            relative_last = base_offset + last_offset_delta - state[BASE_OFFSET_WORD]
            if log_position == 0 and relative_last > I.RELATIVE_OFFSET_MAX:
                return NEED_ROLL, position, 0
        if log_position > 0:
            if log_position + length > segment_bytes:
                return NEED_ROLL, position, 0
            if base_offset + last_offset_delta - state[BASE_OFFSET_WORD] > I.RELATIVE_OFFSET_MAX:
                return NEED_ROLL, position, 0
            if max_timestamp - state[ROLL_TIMESTAMP_WORD] > segment_ms:
                return NEED_ROLL, position, 0
            if state[SINCE_INDEX_WORD] >= index_interval and (
                    state[OFFSET_ENTRIES_WORD] >= state[OFFSET_CAPACITY_WORD] - 1
                    or state[TIME_ENTRIES_WORD] >= state[TIME_CAPACITY_WORD] - 1):
                return NEED_ROLL, position, 0
        if log_position + length > state[RESERVED_WORD] or \
                not index_slots_reserved(state, will_index(state, index_interval)):
            return NEED_SPACE, position, 0
        copy_bytes(log, log_position, source, position, length)
        if verify_copy:
            batch_status, _ = check_produced_batch(log, log_position, log_position + length, True)
            if batch_status != 0:
                store_u32(log, log_position + B.BATCH_LENGTH_OFFSET, 0)   # end of data again
                return REJECTED, position, batch_status
        if not keep_offsets:
            store_i64(log, log_position + B.BASE_OFFSET_OFFSET, base_offset)
            store_i32(log, log_position + B.LEADER_EPOCH_OFFSET, leader_epoch)
        if append_timestamp != TIMESTAMP_NONE:
            # LogAppendTime: the broker's clock replaces the producer's, as in Kafka;
            # the fields are under the CRC, so it is computed again.
            attributes = load_u16(log, log_position + B.ATTRIBUTES_OFFSET)
            store_u16(log, log_position + B.ATTRIBUTES_OFFSET, attributes | B.TIMESTAMP_TYPE_BIT)
            store_i64(log, log_position + B.FIRST_TIMESTAMP_OFFSET, append_timestamp)
            store_i64(log, log_position + B.MAX_TIMESTAMP_OFFSET, append_timestamp)
            crc = crc32c_kernel(log, log_position + B.CRC_COVERED_OFFSET, log_position + length)
            store_u32(log, log_position + B.CRC_OFFSET, crc)
        _index_batch(log, log_position, length, offset_index, time_index, state, index_interval)
        position += length
    return APPENDED, position, 0


@kernel
def rescan(log, end, offset_index, time_index, state, index_interval):
    """Rescan a segment from byte 0: check every batch, rebuild both indexes (the
    state starts as an empty segment's, with the index slots the log can need
    reserved).

    Returns (status, position): position is the end of the valid prefix, where the
    first bad batch (if any) starts.
    """
    position = 0
    while position < end:
        status, length = check_batch(log, position, end, True, True)
        if status != 0:
            return status, position
        base_offset = load_i64(log, position + B.BASE_OFFSET_OFFSET)
        last_offset_delta = np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET))
        # base_offset is not under the CRC: it must follow on, and not wrap.
        relative_last = base_offset + last_offset_delta - state[BASE_OFFSET_WORD]
        if base_offset < state[NEXT_OFFSET_WORD] \
                or base_offset >= limits.OFFSET_MAX - last_offset_delta \
                or relative_last > I.RELATIVE_OFFSET_MAX:
            return _BAD_OFFSET, position
        _index_batch(log, position, length, offset_index, time_index, state, index_interval)
        position += length
    return 0, position


@kernel
def verify_prefix(log, end):
    """Check every batch in ``log[0:end]``: (status, end of the good prefix)."""
    position = 0
    while position < end:
        status, length = check_batch(log, position, end, True, True)
        if status != 0:
            return status, position
        position += length
    return 0, position
