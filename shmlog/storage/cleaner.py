"""Log compaction: keep the latest record per key in the closed segments of a
``cleanup.policy=compact`` partition.

Rules
-----
* Offsets never change and order is kept: a cleaned batch keeps its base offset,
  its ``last_offset_delta`` and its timestamps; only records go, so offsets get
  gaps (the batch format allows them, see ``batch_layout``).
* The active segment is never cleaned, nor any segment holding a record younger
  than ``min.compaction.lag.ms``, nor any holding an offset at or past the last
  stable offset (Kafka's first unstable offset: a transaction still open is never
  compacted, nor anything after its first batch).
* A record is removed only when a later record with the same key exists in the
  cleaned range (a record of an aborted transaction never counts as that later
  one), or when it belongs to an aborted transaction. Records without a key are
  otherwise kept. A tombstone (a null value) is itself removed once its segment's
  newest timestamp is older than ``delete.retention.ms``: every earlier value of
  its key is gone by then. The keys of committed transactions compact like any.
* An end-transaction marker is removed only when no batch of its transaction is
  left (a cleaning that removes the last of them keeps the marker; the next one
  finds none) and its segment is older than ``delete.retention.ms``, as a
  tombstone; nor is the marker a producer wrote after its last data batch (its
  epoch fences zombies). shmlog's batch has no delete-horizon field, so the
  retention runs from the segment's newest timestamp, as in Kafka before 3.0.
  An aborted transaction's ``.txnindex`` entry goes into the cleaned segment's
  while batches of it are left (Kafka's ``CleanedTransactionMetadata``).
* A batch left with no records is dropped, unless it is its producer's last data
  batch in the log: that one stays, empty, so a walk of the log still finds the
  producer's last sequence (Kafka's ``RETAIN_EMPTY``).
* Nothing a reader maps is modified: cleaned segments are new files, swapped in by
  :meth:`PartitionLog.replace_segments` with a rename, so a reader holding the old
  mapping keeps reading the old (uncleaned, equally valid) bytes.

Theory of operation
-------------------
A partition is cleaned when the dirty part of its cleanable log (closed segments
from the *clean offset*, where the last cleaning stopped, up to the first segment
too young or active) is at least ``min.cleanable.dirty.ratio`` of the whole
cleanable log, or when its first dirty segment is older than
``max.compaction.lag.ms``. Cleaning is Kafka's two passes:

1. **Map**: compiled code walks the dirty segments and puts every keyed record
   into an open-addressing hash table (Kafka's SkimpyOffsetMap): a 128-bit hash of
   the key (two independent 64-bit hashes) and the record's offset, the later
   offset winning. The table has a bounded size (the broker's
   ``cleaner_dedupe_buffer_size``) and is filled to at most 90 %; when the dirty
   part has more keys, the range ends before the segment that did not fit (what it
   put in the map already is harmless: those records are later than anything
   cleaned, and stay).
2. **Copy**: every segment from the log start to the end of the range is copied,
   in groups that together fit one segment, into new files, keeping a record when
   the map has no later offset for its key. Uncompressed batches are filtered and
   re-checksummed entirely in compiled code; a zstd batch is inflated, filtered by
   the same kernel and compressed again.

Transactions: the plan takes, on the log owner's thread, the aborted transactions
the cleaned range meets (``PartitionLog.aborted_transactions``: from every
segment's ``.txnindex``, as an abort's marker may lie past the range) and each
producer's last data batch (``PartitionLog.producer_batches``), as arrays sorted
for binary searches in the kernels. The map pass skips the batches of aborted
transactions. The copy pass follows the transactions batch by batch in compiled
code (a typed dict of the producers with a transaction's batch met since their
last marker, a flag per aborted transaction): it empties an aborted transaction's
batches without inflating them, and decides each marker as its rule above says.

:func:`clean` does both passes and touches only files it creates, through its own
read-only mappings, so the broker runs it on a thread of its own; the swap that
follows (quick) happens on the broker's loop, which checks that the segments it
replaces are still those that were cleaned.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shutil
import threading
from typing import Any

import numpy as np
import zstandard

from ..common import access, limits
from ..native import typed_containers as typed
from ..native.crc32c import crc32c_kernel
from ..native.jit import (
    copy_bytes,
    kernel,
    load_i16,
    load_i32,
    load_i64,
    load_u16,
    load_u32,
    store_i32,
    store_u16,
    store_u32,
)
from ..record import batch_layout as L
from ..record.control import ControlType, marker_type
from ..record.records import ZSTD_LEVEL, batch_frame, batch_info, inflate_records
from ..segments import CLEANING_DIRECTORY, AbortedTransaction, PartitionLog, Segment
from . import index_layout as I
from . import producer_snapshots as P
from .mapped_file import MappedFile
from .topic_config import TopicConfig
from .transaction_index_layout import txn_index_path

log = logging.getLogger(__name__)

__all__ = ["CleanerPlan", "CleanedGroup", "Cleaning", "CleanerThread", "OffsetMap", "plan",
           "clean", "keys_max", "warm_kernels", "ENTRY_SIZE", "MAP_LOAD_FACTOR"]

# Bytes of one offset-map slot: two 64-bit key hashes and an offset (Kafka's map
# holds a 16-byte MD5 and an offset: the same 24 bytes).
ENTRY_SIZE = 24
# The most of its slots the map fills (Kafka's log.cleaner.io.buffer.load.factor):
# a probe for a missing key ends at an empty slot, soon enough below this.
MAP_LOAD_FACTOR = 0.9
# Walk statuses of the compiled passes.
_DONE = 0
_INFLATE = 1              # a zstd batch at the returned position: Python inflates it
_FULL = 2                 # the map might not hold the next batch's keys
# The offset index stores offsets relative to the segment's base as u32.
_GROUP_OFFSET_SPAN_MAX = 2**31 - 1
_FNV_OFFSET_BASIS = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ABORT = int(ControlType.ABORT)
# Columns of a plan's aborted transactions (rows sorted by producer id, then first
# offset) and of its producers' last data batches (sorted by producer id).
_PRODUCER_ID, _FIRST_OFFSET, _LAST_OFFSET, _LAST_STABLE_OFFSET = 0, 1, 2, 3
_LAST_DATA_OFFSET = 1
_NO_ABORTED = np.zeros((0, 4), np.int64)
_NO_PRODUCERS = np.zeros((0, 2), np.int64)


# --- kernels ----------------------------------------------------------------------------

@kernel
def _key_hash(buffer, position, length):
    """Two independent 64-bit hashes of ``buffer[position:position + length]``:
    FNV-1a, and a rotate-multiply hash seeded with the length. Together they make
    a collision (which would drop a record of another key) as unlikely as MD5's."""
    first = _FNV_OFFSET_BASIS
    second = _GOLDEN ^ np.uint64(length)
    for index in range(position, position + length):
        byte = np.uint64(buffer[index])
        first = (first ^ byte) * _FNV_PRIME
        second = second ^ byte
        second = ((second << np.uint64(23)) | (second >> np.uint64(41))) * _GOLDEN
    return first, second


@kernel
def _slot(first, mask):
    """Where a key's probe starts: FNV's low bits mixed with its high ones."""
    return np.int64((first ^ (first >> np.uint64(29))) & np.uint64(mask))


@kernel
def _map_put(first_hashes, second_hashes, offsets, first, second, offset):
    """Record ``offset`` for the key; returns 1 when the key is new. (The caller
    keeps the table below full, so an empty slot always ends the probe.)"""
    mask = offsets.size - 1
    slot = _slot(first, mask)
    while True:
        if offsets[slot] < 0:
            first_hashes[slot] = first
            second_hashes[slot] = second
            offsets[slot] = offset
            return 1
        if first_hashes[slot] == first and second_hashes[slot] == second:
            offsets[slot] = max(offsets[slot], offset)
            return 0
        slot = (slot + 1) & mask


@kernel
def _latest_offset(first_hashes, second_hashes, offsets, first, second):
    """The map's offset for a key, or -1."""
    mask = offsets.size - 1
    slot = _slot(first, mask)
    while offsets[slot] >= 0:
        if first_hashes[slot] == first and second_hashes[slot] == second:
            return offsets[slot]
        slot = (slot + 1) & mask
    return -1


@kernel
def _map_records(buffer, start, end, base_offset, first_hashes, second_hashes, offsets, keys):
    """Put every keyed record of the records region ``[start, end)`` into the map;
    returns how many keys it holds now."""
    record = start
    while record < end:
        key_length = load_i32(buffer, record + L.KEY_LENGTH_OFFSET)
        if key_length >= 0:
            first, second = _key_hash(buffer, record + L.RECORD_HEADER_LENGTH, key_length)
            keys += _map_put(first_hashes, second_hashes, offsets, first, second,
                             base_offset + load_u32(buffer, record + L.OFFSET_DELTA_OFFSET))
        record += np.int64(load_u32(buffer, record + L.RECORD_LENGTH_OFFSET))
    return keys


@kernel(inline="always")
def _aborted_row(aborted, producer_id, offset):
    """The row of ``aborted`` (rows of producer id, first offset, last offset, last
    stable offset, sorted by producer id then first offset) of the producer's
    aborted transaction that holds ``offset`` (its first offset at or below it, its
    marker at or past it), or -1. A producer's transactions never overlap, so it is
    the last of the producer's rows that begins at or below ``offset``."""
    low = 0
    high = aborted.shape[0]
    while low < high:
        middle = (low + high) >> 1
        if aborted[middle, 0] < producer_id or \
                (aborted[middle, 0] == producer_id and aborted[middle, 1] <= offset):
            low = middle + 1
        else:
            high = middle
    row = low - 1
    if row >= 0 and aborted[row, 0] == producer_id and aborted[row, 2] >= offset:
        return row
    return -1


@kernel(inline="always")
def _last_data_offset(last_data, producer_id):
    """The last offset of the producer's last data batch in the log (``last_data``:
    rows of producer id and that offset, sorted by producer id), or -1."""
    low = 0
    high = last_data.shape[0]
    while low < high:
        middle = (low + high) >> 1
        if last_data[middle, 0] < producer_id:
            low = middle + 1
        else:
            high = middle
    if low < last_data.shape[0] and last_data[low, 0] == producer_id:
        return last_data[low, 1]
    return -1


@kernel(inline="always")
def _in_aborted_transaction(log, position, attributes, aborted):
    """Whether the data batch at ``position`` belongs to an aborted transaction."""
    return attributes & L.TRANSACTIONAL_BIT != 0 and aborted.shape[0] > 0 and _aborted_row(
        aborted, load_i64(log, position + L.PRODUCER_ID_OFFSET),
        load_i64(log, position + L.BASE_OFFSET_OFFSET)) >= 0


@kernel
def _map_batches(log, position, end, first_hashes, second_hashes, offsets, keys, keys_max,
                 aborted):
    """Map the uncompressed batches from ``position``; returns (status, position,
    keys), stopping at a zstd batch (``_INFLATE``) or before a batch that could take
    the map past ``keys_max`` (``_FULL``). Control batches and the batches of the
    transactions in ``aborted`` are passed over: an aborted record never hides a
    committed one of its key (Kafka's ``buildOffsetMapForSegment``)."""
    while position < end:
        frame_status, length = batch_frame(log, position, end)
        if frame_status != 0:
            break                              # zeros: the end of the data
        attributes = load_u16(log, position + L.ATTRIBUTES_OFFSET)
        if attributes & L.CONTROL_BIT == 0 and \
                not _in_aborted_transaction(log, position, attributes, aborted):
            if keys + load_i32(log, position + L.RECORD_COUNT_OFFSET) > keys_max:
                return _FULL, position, keys
            if attributes & L.CODEC_MASK != L.CODEC_NONE:
                return _INFLATE, position, keys
            keys = _map_records(log, position + L.RECORDS_OFFSET, position + length,
                                load_i64(log, position + L.BASE_OFFSET_OFFSET),
                                first_hashes, second_hashes, offsets, keys)
        position += length
    return _DONE, position, keys


@kernel
def _filter_records(source, start, end, base_offset, first_hashes, second_hashes, offsets,
                    drop_tombstones, out, out_position):
    """Copy the records of ``source[start:end]`` that survive cleaning to ``out`` at
    ``out_position``; returns (end of what was written, records kept)."""
    kept = 0
    record = start
    while record < end:
        record_length = np.int64(load_u32(source, record + L.RECORD_LENGTH_OFFSET))
        key_length = load_i32(source, record + L.KEY_LENGTH_OFFSET)
        keep = True
        if key_length >= 0:
            offset = base_offset + load_u32(source, record + L.OFFSET_DELTA_OFFSET)
            first, second = _key_hash(source, record + L.RECORD_HEADER_LENGTH, key_length)
            if _latest_offset(first_hashes, second_hashes, offsets, first, second) > offset:
                keep = False                   # a later record has this key
            elif drop_tombstones and load_i32(source, record + L.VALUE_LENGTH_OFFSET) < 0:
                keep = False                   # an expired tombstone
        if keep:
            copy_bytes(out, out_position, source, record, record_length)
            out_position += record_length
            kept += 1
        record += record_length
    return out_position, kept


@kernel
def _seal_cleaned(out, batch_position, batch_end, kept):
    """Fix the header copied to ``out[batch_position:]`` for its kept records:
    length, record count, CRC (base offset, last offset delta and timestamps stay)."""
    store_u32(out, batch_position + L.BATCH_LENGTH_OFFSET, batch_end - batch_position)
    store_i32(out, batch_position + L.RECORD_COUNT_OFFSET, kept)
    store_u32(out, batch_position + L.CRC_OFFSET,
              crc32c_kernel(out, batch_position + L.CRC_COVERED_OFFSET, batch_end))


@kernel(inline="always")
def _write_empty(log, position, out, out_position):
    """Write the header of the batch at ``position`` as an empty batch (no records,
    no codec) at ``out_position``; returns where it ends (Kafka's ``RETAIN_EMPTY``)."""
    copy_bytes(out, out_position, log, position, L.HEADER_LENGTH)
    store_u16(out, out_position + L.ATTRIBUTES_OFFSET,
              load_u16(out, out_position + L.ATTRIBUTES_OFFSET) & ~L.CODEC_MASK)
    _seal_cleaned(out, out_position, out_position + L.HEADER_LENGTH, 0)
    return out_position + L.HEADER_LENGTH


@kernel(inline="always")
def _data_batch_read(log, position, attributes, aborted, observed, committed):
    """Follow a data batch the copy pass meets (Kafka's ``onBatchRead``): True when it
    belongs to an aborted transaction (marked observed: its marker stays); else a
    transactional batch of a transaction that did not abort makes its producer's
    next marker one with data left (``committed``)."""
    if attributes & L.TRANSACTIONAL_BIT == 0:
        return False
    producer_id = load_i64(log, position + L.PRODUCER_ID_OFFSET)
    base_offset = load_i64(log, position + L.BASE_OFFSET_OFFSET)
    row = _aborted_row(aborted, producer_id, base_offset) if aborted.shape[0] else -1
    if row >= 0:
        observed[row] = 1
        return True
    if producer_id not in committed:
        committed[producer_id] = (np.int64(load_i16(log, position + L.PRODUCER_EPOCH_OFFSET)),
                                  base_offset)
    return False


@kernel(inline="always")
def _keep_control_batch(log, position, length, attributes, drop_markers, aborted, observed,
                        kept_aborts, committed, last_data):
    """Follow a control batch the copy pass meets (Kafka's ``onControlBatchRead``);
    whether it stays. An end-transaction marker goes only when no batch of its
    transaction is left in the log (none met since the producer's last marker,
    retained empty ones included), ``drop_markers`` (its segment is older than
    ``delete.retention.ms``) and it is not what its producer wrote after its last
    data batch (its epoch, which fences zombies: Kafka keeps that marker too). An
    ABORT whose transaction still has batches keeps its ``.txnindex`` entry
    (``kept_aborts``). A control batch that is no marker shmlog reads is kept."""
    producer_id = load_i64(log, position + L.PRODUCER_ID_OFFSET)
    base_offset = load_i64(log, position + L.BASE_OFFSET_OFFSET)
    data_left = False
    if producer_id in committed:
        del committed[producer_id]
        data_left = True
    if attributes & L.CODEC_MASK != L.CODEC_NONE:
        return True
    kind = marker_type(log, position, position + length)
    if kind < 0 or producer_id < 0:
        return True
    if kind == _ABORT and aborted.shape[0]:
        row = _aborted_row(aborted, producer_id, base_offset)
        if row >= 0 and aborted[row, 2] == base_offset and observed[row]:
            kept_aborts[row] = 1
            data_left = True
    if data_left or not drop_markers:
        return True
    last_data_offset = _last_data_offset(last_data, producer_id)
    return 0 <= last_data_offset < base_offset


@kernel
def _clean_batches(log, position, end, first_hashes, second_hashes, offsets, drop_tombstones,
                   aborted, observed, kept_aborts, committed, last_data, out, out_position):
    """Copy what survives of the batches from ``position`` into ``out``; returns
    (status, position, out_position, retain_empty), stopping at a zstd batch
    (``_INFLATE``; ``retain_empty`` says whether that batch stays, empty, should no
    record of it survive). A batch of an aborted transaction loses every record; a
    batch left with no records is dropped, unless it is its producer's last data
    batch (``last_data``: its sequence stays, Kafka's ``RETAIN_EMPTY``); a control
    batch is kept whole or dropped (:func:`_keep_control_batch`)."""
    while position < end:
        frame_status, length = batch_frame(log, position, end)
        if frame_status != 0:
            break                              # zeros: the end of the data
        attributes = load_u16(log, position + L.ATTRIBUTES_OFFSET)
        if attributes & L.CONTROL_BIT != 0:
            if _keep_control_batch(log, position, length, attributes, drop_tombstones, aborted,
                                   observed, kept_aborts, committed, last_data):
                copy_bytes(out, out_position, log, position, length)
                out_position += length
            position += length
            continue
        producer_id = load_i64(log, position + L.PRODUCER_ID_OFFSET)
        retain_empty = producer_id >= 0 and _last_data_offset(last_data, producer_id) == \
            load_i64(log, position + L.BASE_OFFSET_OFFSET) + \
            load_i32(log, position + L.LAST_OFFSET_DELTA_OFFSET)
        if _data_batch_read(log, position, attributes, aborted, observed, committed):
            if retain_empty:
                out_position = _write_empty(log, position, out, out_position)
        elif attributes & L.CODEC_MASK != L.CODEC_NONE:
            return _INFLATE, position, out_position, retain_empty
        else:
            batch_end, kept = _filter_records(
                log, position + L.RECORDS_OFFSET, position + length,
                load_i64(log, position + L.BASE_OFFSET_OFFSET), first_hashes, second_hashes,
                offsets, drop_tombstones, out, out_position + L.RECORDS_OFFSET)
            if kept > 0:
                copy_bytes(out, out_position, log, position, L.HEADER_LENGTH)
                _seal_cleaned(out, out_position, batch_end, kept)
                out_position = batch_end
            elif retain_empty:
                out_position = _write_empty(log, position, out, out_position)
        position += length
    return _DONE, position, out_position, False


# --- the offset map ---------------------------------------------------------------------

def keys_max(buffer_size: int) -> int:
    """How many keys a map of at most ``buffer_size`` bytes holds (a power of two
    of slots, filled to the load factor)."""
    slots = 1 << max(4, (buffer_size // ENTRY_SIZE).bit_length() - 1)
    return int(slots * MAP_LOAD_FACTOR)


class OffsetMap:
    """The last offset of every key seen: an open-addressing table of
    (hash, hash, offset) slots, a power of two of them, at most
    :data:`MAP_LOAD_FACTOR` full. It starts small and doubles (rehashing) as keys
    come, up to room for ``keys_max``: its size follows the distinct keys, so a log
    of few keys probes a table that fits the cache."""

    def __init__(self, keys_max: int):
        self.keys_max = keys_max
        self.table = _empty_table(limits.CLEANER_SLOTS_MIN)
        self.keys = 0

    @property
    def _limit(self) -> int:
        return int(self.table[2].size * MAP_LOAD_FACTOR)

    def _grow(self) -> bool:
        """Double the table, if that stays within ``keys_max``; False when it cannot."""
        if self._limit >= self.keys_max:
            return False
        table = _empty_table(2 * self.table[2].size)
        _rehash(*self.table, *table)
        self.table = table
        return True

    def add_segment(self, log: np.ndarray, aborted: np.ndarray = _NO_ABORTED) -> bool:
        """Put the segment's keys in, but those of the transactions in ``aborted``
        (a plan's rows); False when the map filled up first (the keys put so far
        stay: they only ever name later records)."""
        position = 0
        while True:
            limit = min(self._limit, self.keys_max)
            status, position, self.keys = _map_batches(log, position, log.size, *self.table,
                                                       self.keys, limit, aborted)
            if status == _DONE:
                return True
            info = batch_info(log, position)
            if status == _FULL:
                if self.keys + info.record_count > self.keys_max or not self._grow():
                    return False
                continue
            records = inflate_records(log, info)
            self.keys = _map_records(records, 0, records.size, info.base_offset, *self.table,
                                     self.keys)
            position += info.batch_length


def _empty_table(slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(slots, np.uint64), np.zeros(slots, np.uint64), np.full(slots, -1, np.int64)


@kernel
def _rehash(first_hashes, second_hashes, offsets, new_first, new_second, new_offsets):
    for slot in range(offsets.size):
        if offsets[slot] >= 0:
            _map_put(new_first, new_second, new_offsets, first_hashes[slot], second_hashes[slot],
                     offsets[slot])


# --- planning ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SegmentFile:
    """What the cleaner needs of a segment: it never touches the Segment object,
    which belongs to the broker's loop."""
    base_offset: int
    log_path: str
    size: int
    next_offset: int
    max_timestamp: int


@dataclasses.dataclass(frozen=True)
class CleanerPlan:
    """One cleaning of one partition: the segments to rewrite (from the log start),
    which of them are dirty, and where the cleaned range ends."""
    directory: str
    config: TopicConfig
    segments: tuple[SegmentFile, ...]
    first_dirty: int                   # index into segments
    end_offset: int                    # the first offset not cleaned
    dirty_ratio: float
    # The topic the partition belonged to when planned: the swap is refused if the
    # topic was deleted and created again (same name, same directory) meanwhile.
    topic_id: str | None = None
    # The aborted transactions the cleaned range meets, from every segment's
    # .txnindex (an abort's marker may lie past the range): int64 rows of producer
    # id, first offset, last offset, last stable offset, sorted by producer id then
    # first offset.
    aborted: np.ndarray = dataclasses.field(default_factory=lambda: _NO_ABORTED, compare=False)
    # Each producer's last data batch in the log: int64 rows of producer id and its
    # last offset, sorted by producer id (that batch stays, emptied if it must).
    last_data: np.ndarray = dataclasses.field(default_factory=lambda: _NO_PRODUCERS, compare=False)


def _segment_file(segment: Segment) -> SegmentFile:
    return SegmentFile(segment.base_offset, segment.log_path, segment.size, segment.next_offset,
                       segment.age_timestamp())


def plan(partition_log: PartitionLog, now: int,
         last_stable_offset: int | None = None) -> CleanerPlan | None:
    """What to clean now, or None (not compacted, nothing cleanable, or not dirty
    enough). Called on the thread that owns ``partition_log``.

    ``last_stable_offset`` is the partition's (Kafka's first unstable offset bound:
    no segment holding an offset at or past it is cleaned, so a transaction still
    open is never compacted); the broker gives the appender's. None derives it from
    the log (the transactions open at its end, ``PartitionLog.producer_state``: a
    walk of the active segment)."""
    config = partition_log.config
    if not config.compact:
        return None
    cleanable = []
    for segment in partition_log.segments[:-1]:         # never the active segment
        if segment.age_timestamp() > now - config.min_compaction_lag_ms:
            break
        cleanable.append(_segment_file(segment))
    if not cleanable or cleanable[-1].next_offset <= partition_log.clean_offset:
        return None
    rows = None
    if last_stable_offset is None:
        rows, open_transactions = partition_log.producer_state()
        last_stable_offset = int(open_transactions[:, 2].min()) if len(open_transactions) \
            else partition_log.log_end_offset
    while cleanable and cleanable[-1].next_offset > last_stable_offset:
        cleanable.pop()                                 # holds unstable offsets
    if not cleanable:
        return None
    clean_offset = partition_log.clean_offset
    first_dirty = next((index for index, segment in enumerate(cleanable)
                        if segment.next_offset > clean_offset), None)
    if first_dirty is None:
        return None
    clean_bytes = sum(segment.size for segment in cleanable[:first_dirty])
    dirty_bytes = sum(segment.size for segment in cleanable[first_dirty:])
    ratio = dirty_bytes / max(1, clean_bytes + dirty_bytes)
    overdue = cleanable[first_dirty].max_timestamp < now - config.max_compaction_lag_ms
    if dirty_bytes == 0 or (ratio < config.min_cleanable_dirty_ratio and not overdue):
        return None
    end_offset = cleanable[-1].next_offset
    if rows is None:
        rows = partition_log.producer_batches()
    return CleanerPlan(partition_log.directory, config, tuple(cleanable), first_dirty,
                       end_offset, ratio, partition_log.topic_id,
                       _aborted_rows(partition_log.aborted_transactions(
                           partition_log.log_start_offset, end_offset)),
                       _last_data(rows))


def _aborted_rows(entries: list[AbortedTransaction]) -> np.ndarray:
    """A plan's ``aborted``: the entries as rows, by producer id then first offset."""
    if not entries:
        return _NO_ABORTED
    rows = np.array([tuple(entry) for entry in entries], np.int64).reshape(-1, 4)
    return np.ascontiguousarray(rows[np.lexsort((rows[:, _FIRST_OFFSET],
                                                 rows[:, _PRODUCER_ID]))])


def _last_data(rows: np.ndarray) -> np.ndarray:
    """A plan's ``last_data`` from the producers' windows (``producer_snapshots``'
    rows): each producer's greatest last offset."""
    if not len(rows):
        return _NO_PRODUCERS
    last_offsets = rows[:, P.BASE_OFFSET] + rows[:, P.LAST_OFFSET_DELTA]
    order = np.lexsort((last_offsets, rows[:, P.PRODUCER_ID]))
    producers, last_offsets = rows[order, P.PRODUCER_ID], last_offsets[order]
    final = np.append(producers[1:] != producers[:-1], True)
    return np.ascontiguousarray(np.stack([producers[final], last_offsets[final]], axis=1),
                                dtype=np.int64)


# --- cleaning ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CleanedGroup:
    """A cleaned segment, written under the partition's cleaning directory, that
    replaces ``replaces`` (base offsets; the first is its own)."""
    base_offset: int
    replaces: tuple[int, ...]
    size: int


@dataclasses.dataclass(frozen=True)
class Cleaning:
    """The outcome of :func:`clean`, ready for :meth:`PartitionLog.replace_segments`."""
    plan: CleanerPlan
    groups: tuple[CleanedGroup, ...]
    end_offset: int
    bytes_before: int
    bytes_after: int

    @property
    def topic_id(self) -> str | None:
        """The id of the topic it was planned against."""
        return self.plan.topic_id


def _groups(segments: tuple[SegmentFile, ...], segment_bytes: int) -> list[list[SegmentFile]]:
    """Consecutive segments that fit one segment together (Kafka's grouping)."""
    groups: list[list[SegmentFile]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            if sum(member.size for member in group) + segment.size <= segment_bytes and \
                    segment.next_offset - group[0].base_offset <= _GROUP_OFFSET_SPAN_MAX:
                group.append(segment)
                continue
        groups.append([segment])
    return groups


def warm_kernels() -> None:
    """Load the kernels a cleaning runs over a segment's log for both kinds of log
    it is given: a segment mapped read-only, and the writable empty array a segment
    file of no bytes maps to. (A cleaning of real batches, as the broker's warm-up
    does, loads the rest; which kinds of log it meets depends on where rolls fell.)"""
    for writable in (True, False):
        log = np.zeros(0, np.uint8)
        log.flags.writeable = writable
        offset_map = OffsetMap(1)
        offset_map.add_segment(log)
        _clean_segment(log, offset_map, False, _Transactions(_NO_ABORTED, _NO_PRODUCERS),
                       np.zeros(0, np.uint8), 0)


class _Transactions:
    """What the copy pass of one cleaning follows of the transactions, from the log
    start to the end of its range (Kafka's ``CleanedTransactionMetadata``): the
    plan's aborted transactions, which of them had batches met (``observed``) and
    whose marker stays with its ``.txnindex`` entry (``kept``), the producers with
    batches of a transaction that did not abort met since their last marker
    (``committed``), and each producer's last data batch (``last_data``)."""

    def __init__(self, aborted: np.ndarray, last_data: np.ndarray):
        self.aborted = aborted
        self.observed = np.zeros(len(aborted), np.uint8)
        self.kept = np.zeros(len(aborted), np.uint8)
        self.committed = typed.transaction_table()
        self.last_data = last_data

    def arguments(self) -> tuple:
        return self.aborted, self.observed, self.kept, self.committed, self.last_data

    def kept_entries(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """The kept entries whose marker lies in ``[start_offset, end_offset)``, in
        marker order: the cleaned segment's ``.txnindex``."""
        rows = self.aborted[self.kept.astype(bool)]
        rows = rows[(rows[:, _LAST_OFFSET] >= start_offset) & (rows[:, _LAST_OFFSET] < end_offset)]
        rows = rows[np.argsort(rows[:, _LAST_OFFSET], kind="stable")]
        return [AbortedTransaction(*row) for row in rows.tolist()]


def _clean_segment(log: np.ndarray, offset_map: OffsetMap, drop_tombstones: bool,
                   transactions: _Transactions, out: np.ndarray, out_position: int) -> int:
    position = 0
    while True:
        status, position, out_position, retain_empty = _clean_batches(
            log, position, log.size, *offset_map.table, drop_tombstones,
            *transactions.arguments(), out, out_position)
        if status == _DONE:
            return out_position
        info = batch_info(log, position)
        records = inflate_records(log, info)
        scratch = np.empty(L.HEADER_LENGTH + records.size, np.uint8)
        scratch_end, kept = _filter_records(records, 0, records.size, info.base_offset,
                                            *offset_map.table, drop_tombstones, scratch,
                                            L.HEADER_LENGTH)
        if kept:
            frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(
                scratch[L.HEADER_LENGTH:scratch_end])
            batch_end = out_position + L.HEADER_LENGTH + len(frame)
            out[out_position:out_position + L.HEADER_LENGTH] = \
                log[position:position + L.HEADER_LENGTH]
            out[out_position + L.HEADER_LENGTH:batch_end] = np.frombuffer(frame, np.uint8)
            _seal_cleaned(out, out_position, batch_end, kept)
            out_position = batch_end
        elif retain_empty:
            out_position = _write_empty(log, position, out, out_position)
        position += info.batch_length


def clean(cleaning_plan: CleanerPlan, now: int, keys_max: int) -> Cleaning:
    """Build the offset map of the plan's dirty segments and write the cleaned
    segments under ``<partition>/.cleaning/``. Reads segment files through mappings
    of its own and writes only there, so it may run on any thread.

    ``keys_max`` bounds the map; the dirty range ends before the first segment
    whose keys did not fit. When not even the first dirty segment fits, the map
    grows for it (progress before the memory bound).
    """
    config = cleaning_plan.config
    dirty = cleaning_plan.segments[cleaning_plan.first_dirty:]
    # No more slots than the dirty bytes could hold records for.
    records_max = sum(segment.size for segment in dirty) // L.RECORD_HEADER_LENGTH + 1
    keys_max = min(keys_max, records_max)
    while True:
        offset_map = OffsetMap(keys_max)
        taken = 0
        for segment in dirty:
            mapped = MappedFile(segment.log_path, None)
            try:
                fitted = offset_map.add_segment(mapped.bytes, cleaning_plan.aborted)
            finally:
                mapped.close()
            if not fitted:
                break
            taken += 1
        if taken:
            break
        log.warning("%s: one segment has more keys than the cleaner's map holds (%d); "
                    "growing it for this cleaning", cleaning_plan.directory, keys_max)
        keys_max *= 2
    segments = cleaning_plan.segments[:cleaning_plan.first_dirty + taken]
    end_offset = segments[-1].next_offset

    target = os.path.join(cleaning_plan.directory, CLEANING_DIRECTORY)
    shutil.rmtree(target, ignore_errors=True)
    # not makedirs: a partition deleted meanwhile stays deleted
    os.mkdir(target, access.current().directory_mode & 0o777)
    transactions = _Transactions(cleaning_plan.aborted, cleaning_plan.last_data)
    groups = []
    for group in _groups(segments, config.segment_bytes):
        out = np.empty(sum(segment.size for segment in group), np.uint8)
        out_position = 0
        for segment in group:
            mapped = MappedFile(segment.log_path, None)
            try:
                drop_tombstones = segment.max_timestamp < now - config.delete_retention_ms
                out_position = _clean_segment(mapped.bytes, offset_map, drop_tombstones,
                                              transactions, out, out_position)
            finally:
                mapped.close()
        entries = transactions.kept_entries(group[0].base_offset, group[-1].next_offset)
        groups.append(_write_group(target, config, group, out[:out_position], entries))
    return Cleaning(cleaning_plan, tuple(groups), end_offset,
                    sum(segment.size for segment in segments),
                    sum(group.size for group in groups))


def _write_group(target: str, config: TopicConfig, group: list[SegmentFile],
                 data: np.ndarray, entries: list[AbortedTransaction]) -> CleanedGroup:
    """The cleaned log of a group, with indexes rebuilt from it and its aborted
    transactions ``entries`` indexed, durably on disk."""
    base_offset = group[0].base_offset
    log_path = os.path.join(target, I.segment_file_name(base_offset, I.LOG_SUFFIX))
    with os.fdopen(access.open_file(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                   "wb") as output:
        output.write(data)
    segment = Segment(target, base_offset, config, active=False)
    status, end = segment.rebuild()
    assert status == 0 and end == data.size, "cleaning wrote whole, checked batches"
    segment.close()
    paths = [segment.log_path, segment.offset_index_path, segment.time_index_path]
    for entry in entries:
        segment.txn_index.append(entry)
    if not entries and any(os.path.exists(txn_index_path(member.log_path)) for member in group):
        # Empty, yet there: renamed over the first replaced segment's, it removes the
        # entries whose transactions have no batch left.
        os.close(access.open_file(segment.txn_index.path, os.O_WRONLY | os.O_CREAT))
    if os.path.exists(segment.txn_index.path):
        paths.append(segment.txn_index.path)
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    return CleanedGroup(base_offset, tuple(segment.base_offset for segment in group),
                        int(data.size))


class CleanerThread:
    """Runs :func:`clean` off the broker's loop, one partition at a time (Kafka's
    default of one cleaner thread); the loop collects what it finished and swaps it
    in. The kernels release the GIL, so cleaning runs beside the appender."""

    def __init__(self, keys_max: int):
        self.keys_max = keys_max
        self.busy = False                 # a job was submitted and not collected
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="shmlog-cleaner", daemon=True)
        self._thread.start()

    def submit(self, key: Any, cleaning_plan: CleanerPlan, now: int) -> None:
        assert not self.busy, "one cleaning at a time"
        self.busy = True
        self._jobs.put((key, cleaning_plan, now))

    def collect(self) -> tuple[Any, Cleaning | Exception] | None:
        """The finished job, if any: (key, its Cleaning, or the error it failed with)."""
        if not self.busy or self._finished.empty():
            return None
        self.busy = False
        return self._finished.get()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            key, cleaning_plan, now = job
            try:
                result: Cleaning | Exception = clean(cleaning_plan, now, self.keys_max)
            except Exception as error:      # noqa: BLE001 - reported to the loop, which logs it
                result = error
            self._finished.put((key, result))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current job (a cleaning cut short leaves only files the
        next open removes)."""
        self._jobs.put(None)
        self._thread.join(timeout=timeout_s)
