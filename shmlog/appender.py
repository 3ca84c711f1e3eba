"""The appender: drains every producer's ring into the partition logs.

Rules
-----
* Every batch is validated (length, magic, version, CRC32C, record structure)
  before a byte of it reaches a log; a bad batch is completed back to its producer
  with a negative :class:`CompletionCode` and never appended.
* A ring whose bytes cannot be entries is poisoned: its entries before the damage
  stand, nothing after it is read, and ``consumer_error`` tells the producer.
* Offsets come from the log; the partition's row in the state table is published
  (high watermark last, release) after each batch, so consumers see it at once.
* An entry is appended only to the partition it names: its topic key and
  partition number, not its row, decide. An entry whose row is not that
  partition's (the topic was deleted and the row reused, or the rows were handed
  out anew after a crash that lost ``partition-rows.json``) goes to the partition
  of that identity if this appender hosts it, else it is refused with
  ``UNKNOWN_PARTITION``. Entries for an internal topic (``__consumer_offsets``,
  which only the broker writes) are refused with ``INTERNAL_TOPIC``.

Theory of operation
-------------------
:func:`_drain` is the compiled loop. It visits the rings round-robin, one entry per
ring per round, and for each uncompressed batch bound for a CreateTime partition it
checks that the entry's identity is its row's, validates, appends through
``segments._append`` into the active segment's mapped arrays, completes the entry
(its base offset, acknowledged with a release store), hands the ring space back
and publishes the partition's offsets. Anything it cannot
finish in compiled code - a zstd batch (its records are checked after inflating),
a topic that stamps LogAppendTime or recompresses, a segment that must roll or
needs space reserved, an entry whose identity is not its row's - it hands back to
Python (``_SLOW``), which looks the partition up by the entry's identity, appends
that one entry through :meth:`PartitionLog.append` (or refuses it), refreshes the
partition's arrays and calls the loop again. Per-record work never happens in Python.

Idempotent producers: a batch with a producer id carries the per-partition
sequence number of its first record, and the producer's epoch. The appender
remembers, per (partition, producer id), the last appended batch's epoch, first
sequence and base offset and the next sequence expected. Under the same epoch, a
batch whose first sequence equals the last batch's is a re-send of it (a broker
died after appending it but before acknowledging it, and the new broker found it
still in the ring): it is acknowledged with the original base offset and not
appended again; a sequence that is neither is out of order. A higher epoch must
start again at sequence 0 (KIP-360: a producer whose batch was refused bumps its
epoch and resets the partition's sequence once nothing of it is in flight, since
the refused batch left a gap); a lower epoch is fenced (``INVALID_PRODUCER_EPOCH``).
A refused batch changes nothing remembered. The memory is rebuilt from the active
segment when a partition is opened.
"""

from __future__ import annotations

import enum
import logging

import numba
import numpy as np
from numba import types
from numba.typed import Dict, List

from . import batch_layout as B
from . import ring_layout as R
from .atomics import py_fence, py_store_release, store_release
from .errors import (CorruptRecordError, CorruptRingError, RecordTooLargeError, StorageError,
                     UnknownTopicOrPartitionError)
from .jit import kernel, load_i16, load_i32, load_i64, load_u16, load_u32
from .log_manager import LogManager
from .records import _check_batch
from .ring import ENTRY_CORRUPT, ENTRY_NONE, Destination, Ring, complete_entry, next_entry
from .segments import (_APPENDED, _BASE_OFFSET, _NEXT_OFFSET, _POSITION, _REJECTED,
                       _TIMESTAMP_NONE, _append)
from .groups import INTERNAL_TOPICS
from .state import PartitionStateTable, publish_row, topic_key

log = logging.getLogger(__name__)

__all__ = ["Appender", "CompletionCode"]


class CompletionCode(enum.IntEnum):
    """Why an entry was not appended; its completion result is ``-code``. Codes
    below 100 are the :class:`~shmlog.records.BatchStatus` the batch failed with."""
    UNKNOWN_PARTITION = 100
    RECORD_TOO_LARGE = 101
    STORAGE_ERROR = 102
    NOT_ONE_BATCH = 103        # the entry holds bytes beyond its one batch
    OUT_OF_ORDER_SEQUENCE = 104  # an idempotent producer skipped or reordered a sequence
    INTERNAL_TOPIC = 105       # producers may not append to an internal topic (as in Kafka)
    INVALID_PRODUCER_EPOCH = 106  # older than an epoch the producer id already appended with


# drain results
_IDLE = 0                      # every ring is empty
_BUDGET = 1                    # entries_max entries handled; call again
_SLOW = 2                      # report = (ring, position, length): Python's turn
_POISON = 3                    # report = (ring, position, length): garbage in a ring
_REPORT_FINISHED = 4           # report[4]: entries the call finished (appended or refused)
_REPORT_LENGTH = 5

# columns of the per-ring state array
RING_CAPACITY = 0
RING_HEAD = 1                  # private head: never read back from shared memory
RING_ACTIVE = 2
RING_COLUMNS = 3

# columns of the per-row settings array (one row per partition: its row in the state table)
ROW_REGISTERED = 0
ROW_FAST = 1                   # uncompressed batches may be appended in compiled code
ROW_SEGMENT_BYTES = 2
ROW_SEGMENT_MS = 3
ROW_INDEX_INTERVAL = 4
ROW_BATCH_SIZE_MAX = 5
ROW_LOG_START_OFFSET = 6
ROW_GENERATION = 7
ROW_TOPIC_KEY = 8              # the identity entries for this row must carry
ROW_PARTITION = 9
ROW_INTERNAL = 10              # producers' entries are refused (the broker appends itself)
ROW_COLUMNS = 11

# Entries handled per call before Python looks up again (signals, shutdown, timers).
DRAIN_ENTRIES_MAX = 4096


@kernel
def _finish(words, completions, rings, ring, entry_number, result, head):
    """Complete the entry (under its own number) and hand its space back."""
    _finish_at(words, completions, rings, ring, entry_number, result, head, -1)


@kernel
def _finish_at(words, completions, rings, ring, entry_number, result, head, timestamp):
    """``_finish`` with the broker's append time (LogAppendTime topics; else -1)."""
    complete_entry(words, completions, entry_number, result, timestamp)
    rings[ring, RING_HEAD] = head
    # Release: the entry's bytes were copied (or rejected) before the producer may reuse them.
    store_release(words, R.HEAD_WORD, head)


_SEQUENCE_NEW = 0             # append, then remember
_SEQUENCE_DUPLICATE = 1       # acknowledge with the remembered base offset
_SEQUENCE_OUT_OF_ORDER = 2
_SEQUENCE_FENCED = 3          # an epoch older than the remembered one
SEQUENCE_MODULUS = 1 << 31    # sequences wrap to 0 after 2**31 - 1, as in Kafka


@kernel
def _check_sequence(sequences, row, producer_id, producer_epoch, base_sequence):
    """(verdict, base offset to acknowledge a duplicate with)."""
    key = (row, producer_id)
    if producer_id < 0 or key not in sequences:
        return _SEQUENCE_NEW, -1
    epoch, last_sequence, last_base_offset, next_sequence = sequences[key]
    if producer_epoch < epoch:
        return _SEQUENCE_FENCED, -1
    if producer_epoch > epoch:
        return (_SEQUENCE_NEW if base_sequence == 0 else _SEQUENCE_OUT_OF_ORDER), -1
    if base_sequence == last_sequence:
        return _SEQUENCE_DUPLICATE, last_base_offset
    if base_sequence != next_sequence:
        return _SEQUENCE_OUT_OF_ORDER, -1
    return _SEQUENCE_NEW, -1


@kernel
def _remember_sequence(sequences, row, producer_id, producer_epoch, base_sequence, base_offset,
                       record_count):
    if producer_id >= 0:
        sequences[(row, producer_id)] = (producer_epoch, base_sequence, base_offset,
                                         (base_sequence + record_count) % SEQUENCE_MODULUS)


@kernel
def _sequence_refusal(verdict):
    """The completion result of a batch its sequence keeps out (0: none)."""
    if verdict == _SEQUENCE_OUT_OF_ORDER:
        return -CompletionCode.OUT_OF_ORDER_SEQUENCE.value
    if verdict == _SEQUENCE_FENCED:
        return -CompletionCode.INVALID_PRODUCER_EPOCH.value
    return 0


@kernel
def _forget_sequences(sequences, row):
    """Forget every producer's sequence for the partition at ``row``. Compiled (and
    so cached on disk): a typed dict walked from Python compiles its iterator in
    every process, which stalled a broker's first topic deletion for seconds."""
    stale = [key for key in sequences.keys() if key[0] == row]
    for key in stale:
        del sequences[key]


@kernel
def _rebuild_sequences(log, end, row, sequences):
    """Remember the last batch of every producer in a (valid) segment."""
    position = 0
    while end - position >= B.HEADER_LENGTH:
        length = np.int64(load_u32(log, position + B.BATCH_LENGTH_OFFSET))
        if length < B.HEADER_LENGTH or length > end - position:
            return
        _remember_sequence(sequences, row, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                           np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                           np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                           load_i64(log, position + B.BASE_OFFSET_OFFSET),
                           np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)) + 1)
        position += length


@kernel
def _drain(ring_words, ring_completions, ring_data, rings, logs, offset_indexes,
           time_indexes, segment_states, row_settings, state_rows, appended, touched, sequences,
           cursor, entries_max, report):
    report[_REPORT_FINISHED] = 0
    handled = 0
    ring_count = rings.shape[0]
    while True:
        progress = False
        for step in range(ring_count):
            ring = (cursor[0] + step) % ring_count
            if not rings[ring, RING_ACTIVE]:
                continue
            words, data = ring_words[ring], ring_data[ring]
            status, position, length, row, entry_topic_key, entry_partition, number, head = \
                next_entry(words, data, rings[ring, RING_CAPACITY], rings[ring, RING_HEAD])
            if status == ENTRY_NONE:
                continue
            if status == ENTRY_CORRUPT:
                report[0], report[1], report[2] = ring, position, length
                report[_REPORT_FINISHED] = handled
                return _POISON
            progress = True
            handled += 1
            start = position + R.ENTRY_HEADER_LENGTH
            end = position + length
            if row >= row_settings.shape[0] or not row_settings[row, ROW_REGISTERED] \
                    or row_settings[row, ROW_TOPIC_KEY] != entry_topic_key \
                    or row_settings[row, ROW_PARTITION] != entry_partition \
                    or row_settings[row, ROW_INTERNAL]:
                # Not the partition registered at this row, or one producers may not
                # write: Python finds the partition by the entry's identity or refuses.
                report[0], report[1], report[2] = ring, position, length
                report[_REPORT_FINISHED] = handled - 1
                cursor[0] = ring
                return _SLOW
            # The header, bounds and codec only: the CRC and the records are checked
            # on the copy in the log (or by the slow path), where the producer can no
            # longer change them.
            status, batch_length = _check_batch(data, start, end, False, False)
            if status != 0:
                _finish(words, ring_completions[ring], rings, ring, number, -status, head)
                continue
            if batch_length != end - start:
                _finish(words, ring_completions[ring], rings, ring, number,
                        -CompletionCode.NOT_ONE_BATCH.value, head)
                continue
            if batch_length > row_settings[row, ROW_BATCH_SIZE_MAX]:
                _finish(words, ring_completions[ring], rings, ring, number,
                        -CompletionCode.RECORD_TOO_LARGE.value, head)
                continue
            producer_id = load_i64(data, start + B.PRODUCER_ID_OFFSET)
            producer_epoch = np.int64(load_i16(data, start + B.PRODUCER_EPOCH_OFFSET))
            base_sequence = np.int64(load_i32(data, start + B.BASE_SEQUENCE_OFFSET))
            verdict, duplicate_offset = _check_sequence(sequences, row, producer_id,
                                                        producer_epoch, base_sequence)
            if verdict == _SEQUENCE_DUPLICATE:
                _finish(words, ring_completions[ring], rings, ring, number, duplicate_offset, head)
                continue
            if verdict != _SEQUENCE_NEW:
                _finish(words, ring_completions[ring], rings, ring, number,
                        _sequence_refusal(verdict), head)
                continue
            codec = load_u16(data, start + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK
            state = segment_states[row]
            base_offset = state[_NEXT_OFFSET]
            if codec == B.CODEC_NONE and row_settings[row, ROW_FAST]:
                appended_status, _, batch_status = _append(
                    data, start, end, logs[row], offset_indexes[row], time_indexes[row], state,
                    row_settings[row, ROW_SEGMENT_BYTES], row_settings[row, ROW_SEGMENT_MS],
                    row_settings[row, ROW_INDEX_INTERVAL], _TIMESTAMP_NONE, 0, True)
                if appended_status == _REJECTED:
                    _finish(words, ring_completions[ring], rings, ring, number, -batch_status, head)
                    continue
                if appended_status == _APPENDED:
                    if appended[row] == 0:
                        touched[0] += 1
                        touched[touched[0]] = row
                    appended[row] += state[_NEXT_OFFSET] - base_offset   # from the log copy
                    _remember_sequence(sequences, row, producer_id, producer_epoch, base_sequence,
                                       base_offset, state[_NEXT_OFFSET] - base_offset)
                    _finish(words, ring_completions[ring], rings, ring, number, base_offset, head)
                    # The batch is in the segment: publish it (high watermark last).
                    publish_row(state_rows, row, row_settings[row, ROW_LOG_START_OFFSET],
                                state[_NEXT_OFFSET], state[_NEXT_OFFSET], state[_BASE_OFFSET],
                                state[_POSITION], row_settings[row, ROW_GENERATION])
                    continue
            report[0], report[1], report[2] = ring, position, length
            report[_REPORT_FINISHED] = handled - 1     # this one is Python's to finish
            cursor[0] = ring
            return _SLOW
        report[_REPORT_FINISHED] = handled
        if not progress:
            return _IDLE
        if handled >= entries_max:
            cursor[0] = (cursor[0] + 1) % ring_count
            return _BUDGET


_WORDS_TYPE = numba.typeof(np.zeros(1, np.int64))
_BYTES_TYPE = numba.typeof(np.zeros(1, np.uint8))


def _empty_bytes() -> np.ndarray:
    return np.zeros(0, np.uint8)


# What a free ring slot's entries in the compiled loop's lists hold: never read (the
# slot is inactive), they only let go of the removed ring's views.
_EMPTY_WORDS = np.zeros(0, np.int64)
_EMPTY_BYTES = _empty_bytes()


class Appender:
    """Drains rings into the partition logs of a :class:`LogManager`, publishing
    offsets in a :class:`PartitionStateTable`. A partition's row (in the table,
    which its producers put on ring entries beside its identity) is also its index
    in the appender's arrays.
    """

    def __init__(self, logs: LogManager, table: PartitionStateTable):
        self.logs = logs
        self.table = table
        capacity = table.row_capacity
        self._partitions: dict[int, object] = {}               # row -> PartitionLog
        self._rows: dict[tuple[str, int], int] = {}
        self._rows_by_identity: dict[tuple[int, int], int] = {}   # (topic key, partition)
        self.row_settings = np.zeros((capacity, ROW_COLUMNS), np.int64)
        self.appended = np.zeros(capacity, np.int64)
        self._logs = List([_empty_bytes() for _ in range(capacity)])
        self._offset_indexes = List([_empty_bytes() for _ in range(capacity)])
        self._time_indexes = List([_empty_bytes() for _ in range(capacity)])
        self._segment_states = List([np.zeros(16, np.int64) for _ in range(capacity)])
        self._rings: list[Ring | None] = []
        self._ring_words = List.empty_list(_WORDS_TYPE)
        self._ring_completions = List.empty_list(_WORDS_TYPE)
        self._ring_data = List.empty_list(_BYTES_TYPE)
        self.rings = np.zeros((0, RING_COLUMNS), np.int64)
        self._cursor = np.zeros(1, np.int64)
        self._report = np.zeros(_REPORT_LENGTH, np.int64)
        # Partitions the compiled loop appended to: a count, then their rows.
        self._touched = np.zeros(capacity + 1, np.int64)
        # (row, producer id) -> (last batch's epoch, its first sequence, its base offset,
        # next sequence)
        self._sequences = Dict.empty(key_type=types.UniTuple(types.int64, 2),
                                     value_type=types.UniTuple(types.int64, 4))

    # -- partitions ------------------------------------------------------------------
    def register_partition(self, topic: str, partition: int, row: int | None = None) -> int:
        """Host (topic, partition): open its log, claim its table row; the row. A
        ``row`` asked for (the row it had before a restart) is used when free."""
        key = (topic, partition)
        if key in self._rows:
            return self._rows[key]
        partition_log = self.logs.partition_log(topic, partition)
        # One vectorised look: a loop over the rows cost a millisecond per partition,
        # which a topic of many partitions (__consumer_offsets: 50) held the broker for.
        free = np.flatnonzero(self.row_settings[:, ROW_REGISTERED] == 0)
        if not free.size:
            raise StorageError(
                f"the partition state table is full ({self.row_settings.shape[0]} rows)")
        if row is None or not 0 <= row < self.row_settings.shape[0] \
                or self.row_settings[row, ROW_REGISTERED]:
            row = int(free[0])
        identity = (topic_key(self.logs.describe_topic(topic).topic_id), partition)
        self.table.claim(row, *identity)
        self._partitions[row] = partition_log
        self._rows[key] = row
        self._rows_by_identity[identity] = row
        self.row_settings[row, ROW_REGISTERED] = 1
        self.row_settings[row, ROW_TOPIC_KEY], self.row_settings[row, ROW_PARTITION] = identity
        self.row_settings[row, ROW_INTERNAL] = int(topic in INTERNAL_TOPICS)
        partition_log.publish_generation = lambda: self._publish_segment_change(row)
        self.refresh(row)
        active = partition_log.active
        _rebuild_sequences(active.log, active.size, row, self._sequences)
        return row

    def unregister_partition(self, topic: str, partition: int) -> None:
        """Stop hosting (topic, partition): entries addressed to it are refused from now
        on, and its table row is freed."""
        row = self._rows.pop((topic, partition), None)
        if row is None:
            return
        del self._rows_by_identity[(int(self.row_settings[row, ROW_TOPIC_KEY]), partition)]
        self.row_settings[row] = 0
        self._partitions.pop(row).publish_generation = None
        _forget_sequences(self._sequences, row)
        for arrays in (self._logs, self._offset_indexes, self._time_indexes):
            arrays[row] = _empty_bytes()
        self._segment_states[row] = np.zeros(16, np.int64)
        self.table.free(row)

    def row_of(self, topic: str, partition: int) -> int:
        try:
            return self._rows[(topic, partition)]
        except KeyError:
            raise UnknownTopicOrPartitionError(
                f"{topic}-{partition} is not hosted by this appender") from None

    def destination(self, topic: str, partition: int) -> Destination:
        """What a producer puts on its ring entries for (topic, partition)."""
        row = self.row_of(topic, partition)
        return Destination(row, int(self.row_settings[row, ROW_TOPIC_KEY]), partition)

    def refresh(self, row: int) -> None:
        """Point the compiled loop at the partition's current active segment and
        settings, and publish its offsets: after a slow-path append, and whenever the
        broker changed the partition outside the drain (retention, truncation,
        a config change)."""
        partition_log = self._partitions[row]
        log_bytes, offset_index, time_index, state, segment_bytes = partition_log.kernel_target()
        self._logs[row] = log_bytes
        self._offset_indexes[row] = offset_index
        self._time_indexes[row] = time_index
        self._segment_states[row] = state
        config = partition_log.config
        settings = self.row_settings[row]
        settings[ROW_FAST] = int(partition_log.kernel_appendable)
        settings[ROW_SEGMENT_BYTES] = segment_bytes
        settings[ROW_SEGMENT_MS] = config.segment_ms
        settings[ROW_INDEX_INTERVAL] = config.index_interval_bytes
        settings[ROW_BATCH_SIZE_MAX] = config.batch_size_max
        settings[ROW_LOG_START_OFFSET] = partition_log.log_start_offset
        settings[ROW_GENERATION] = partition_log.generation
        end = partition_log.log_end_offset
        self.table.publish(row, partition_log.log_start_offset, end, end,
                           partition_log.active.base_offset, partition_log.active.size,
                           partition_log.generation)

    def _publish_segment_change(self, row: int) -> None:
        """Publish the partition's row in the middle of a change to its segment files
        (``PartitionLog._segments_changing``: an odd generation before the first file
        operation, an even one after the last)."""
        self.refresh(row)
        # The generation store is a release (publish_row), which orders what came
        # before it, not what follows. The full fence makes the odd generation
        # visible to every core before the first rename or unlink starts, so a
        # reader whose listing sees any of them loads (after its own fence, see
        # state.load_segment_generation) this generation or a later one.
        py_fence()

    # -- rings -----------------------------------------------------------------------
    def add_ring(self, ring: Ring) -> int:
        """Start draining ``ring`` (from where its consumer left off); its index. A
        slot freed by :meth:`remove_ring` is reused, so the table is as long as the
        most rings ever drained at once."""
        if None in self._rings:
            index = self._rings.index(None)
            self._rings[index] = ring
            self._ring_words[index] = ring.words
            self._ring_completions[index] = ring.completions
            self._ring_data[index] = ring.data
        else:
            index = len(self._rings)
            self._rings.append(ring)
            self._ring_words.append(ring.words)
            self._ring_completions.append(ring.completions)
            self._ring_data.append(ring.data)
            self.rings = np.concatenate([self.rings, np.zeros((1, RING_COLUMNS), np.int64)])
        self.rings[index, RING_CAPACITY] = ring.capacity
        self.rings[index, RING_HEAD] = ring.consumer_head
        self.rings[index, RING_ACTIVE] = 1
        return index

    def remove_ring(self, index: int) -> None:
        """Stop draining a ring and unmap it: the compiled loop's lists drop their
        views of it first (a view keeps a mapping alive). Its slot is free for the
        next ring. Removing a removed ring does nothing."""
        ring = self._rings[index]
        if ring is None:
            return
        self.rings[index, RING_ACTIVE] = 0
        self._rings[index] = None
        self._ring_words[index] = _EMPTY_WORDS
        self._ring_completions[index] = _EMPTY_WORDS
        self._ring_data[index] = _EMPTY_BYTES
        ring.close()

    def index_of(self, ring: Ring) -> int | None:
        """The index of a ring being drained, or None (removed, or never added)."""
        for index, candidate in enumerate(self._rings):
            if candidate is ring:
                return index
        return None

    @property
    def ring_list(self) -> list:
        """The rings by index (None where a slot is free)."""
        return list(self._rings)

    # -- draining ----------------------------------------------------------------------
    def drain(self, entries_max: int = DRAIN_ENTRIES_MAX) -> int:
        """Handle entries until every ring is empty or about ``entries_max`` were
        handled; returns how many were."""
        handled = 0
        while handled < entries_max:
            status = _drain(self._ring_words, self._ring_completions, self._ring_data,
                            self.rings, self._logs, self._offset_indexes, self._time_indexes,
                            self._segment_states, self.row_settings, self.table.rows, self.appended,
                            self._touched, self._sequences, self._cursor,
                            entries_max - handled, self._report)
            handled += int(self._report[_REPORT_FINISHED])
            if self._touched[0]:
                self._after_compiled_appends()
            if status == _SLOW:
                self._append_slowly(*map(int, self._report[:3]))
                handled += 1
            elif status == _POISON:
                self._poison(*map(int, self._report[:3]))
            elif status == _IDLE:
                break
        return handled

    def _after_compiled_appends(self) -> None:
        for row in self._touched[1:1 + self._touched[0]].tolist():
            self._partitions[row].appended_by_kernel(int(self.appended[row]))
            self.appended[row] = 0
        self._touched[0] = 0

    def _append_slowly(self, ring: int, position: int, length: int) -> None:
        """One entry the compiled loop handed over: append it through the log of the
        partition its identity names (whatever its row says), or refuse it."""
        source = self._rings[ring]
        # A private copy: the producer cannot change what is validated and appended.
        batch = source.data[position + R.ENTRY_HEADER_LENGTH:position + length].copy()
        _, _, _, _, entry_topic_key, entry_partition, number, head = next_entry(
            source.words, source.data, source.capacity, int(self.rings[ring, RING_HEAD]))
        row = self._rows_by_identity.get((int(entry_topic_key), int(entry_partition)))
        if row is None or self.row_settings[row, ROW_INTERNAL]:
            refusal = CompletionCode.UNKNOWN_PARTITION if row is None \
                else CompletionCode.INTERNAL_TOPIC
            _finish(source.words, source.completions, self.rings, ring, number, -refusal, head)
            return
        result, append_time = self._append_batch(row, batch)
        _finish_at(source.words, source.completions, self.rings, ring, number, result, head,
                   append_time)
        self.refresh(row)

    def _append_batch(self, row: int, batch: np.ndarray) -> tuple[int, int]:
        """Append one batch through the partition's log, unless its sequence says it
        is a duplicate or out of order: (completion result, broker append time)."""
        partition_log = self._partitions[row]
        header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0] \
            if batch.size >= B.HEADER_LENGTH else None
        producer_id = int(header["producer_id"]) if header is not None else -1
        producer_epoch = int(header["producer_epoch"]) if header is not None else -1
        base_sequence = int(header["base_sequence"]) if header is not None else -1
        verdict, duplicate_offset = _check_sequence(self._sequences, row, producer_id,
                                                    producer_epoch, base_sequence)
        if verdict == _SEQUENCE_DUPLICATE:
            return int(duplicate_offset), -1
        if verdict != _SEQUENCE_NEW:
            return int(_sequence_refusal(verdict)), -1
        try:
            appended = partition_log.append(batch)
        except CorruptRecordError as error:
            return -(error.status or CompletionCode.NOT_ONE_BATCH), -1
        except RecordTooLargeError:
            return -CompletionCode.RECORD_TOO_LARGE, -1
        except StorageError:
            log.exception("append to %s failed", partition_log.directory)
            return -CompletionCode.STORAGE_ERROR, -1
        _remember_sequence(self._sequences, row, producer_id, producer_epoch, base_sequence,
                           appended.base_offset, appended.last_offset - appended.base_offset + 1)
        return appended.base_offset, appended.log_append_time

    def _poison(self, ring: int, position: int, length: int) -> None:
        source = self._rings[ring]
        error = CorruptRingError(f"ring {source.name!r}: no valid entry at byte {position} "
                                 f"(length field {length}); it is no longer read",
                                 name=source.name, position=position)
        log.warning("%s", error)
        py_store_release(source.words, R.CONSUMER_ERROR_WORD, int(CompletionCode.NOT_ONE_BATCH))
        self.remove_ring(ring)

