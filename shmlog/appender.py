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
``segments.append_batches`` into the active segment's mapped arrays, completes the entry
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

import logging

import numba
import numpy as np
from numba import types
from numba.typed import Dict, List

from . import batch_layout as B
from . import ring_layout as R
from .completion import SEQUENCE_MODULUS, CompletionCode
from .atomics import py_store_release, store_release
from .errors import (CorruptRecordError, CorruptRingError, InvalidProducerEpochError,
                     OutOfOrderSequenceError, RecordTooLargeError, StorageError,
                     UnknownTopicOrPartitionError)
from .jit import kernel, load_i16, load_i32, load_i64, load_u16
from .log_manager import LogManager
from .records import batch_frame, check_batch
from .ring import ENTRY_CORRUPT, ENTRY_NONE, Destination, Ring, complete_entry, next_entry
from .segment_state import (APPENDED, BASE_OFFSET_WORD, NEXT_OFFSET_WORD, POSITION_WORD, REJECTED,
                            STATE_WORDS, TIMESTAMP_NONE)
from .segments import AppendTarget, append_batches
from .internal_topics import INTERNAL_TOPICS
from .state import PartitionStateTable, publish_row, topic_key

log = logging.getLogger(__name__)

__all__ = ["Appender", "CompletionCode"]


# The error a refused internal append (Appender.append) raises, by completion code.
_REFUSALS = {CompletionCode.STORAGE_ERROR: StorageError,
             CompletionCode.RECORD_TOO_LARGE: RecordTooLargeError,
             CompletionCode.OUT_OF_ORDER_SEQUENCE: OutOfOrderSequenceError,
             CompletionCode.INVALID_PRODUCER_EPOCH: InvalidProducerEpochError}

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

# columns of the per-partition settings array (row = the partition's tag)
TAG_REGISTERED = 0
TAG_FAST = 1                   # uncompressed batches may be appended in compiled code
TAG_SEGMENT_BYTES = 2
TAG_SEGMENT_MS = 3
TAG_INDEX_INTERVAL = 4
TAG_BATCH_SIZE_MAX = 5
TAG_LOG_START_OFFSET = 6
TAG_GENERATION = 7
TAG_TOPIC_KEY = 8              # the identity entries for this row must carry
TAG_PARTITION = 9
TAG_INTERNAL = 10              # producers' entries are refused (the broker appends itself)
TAG_COLUMNS = 11

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


@kernel
def _check_sequence(sequences, tag, producer_id, producer_epoch, base_sequence):
    """(verdict, base offset to acknowledge a duplicate with)."""
    key = (tag, producer_id)
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
def _remember_sequence(sequences, tag, producer_id, producer_epoch, base_sequence, base_offset,
                       record_count):
    if producer_id >= 0:
        sequences[(tag, producer_id)] = (producer_epoch, base_sequence, base_offset,
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
def _forget_sequences(sequences, tag):
    """Forget every producer's sequence for the partition at ``tag``. Compiled (and
    so cached on disk): a typed dict walked from Python compiles its iterator in
    every process, which stalled a broker's first topic deletion for seconds."""
    stale = [key for key in sequences.keys() if key[0] == tag]
    for key in stale:
        del sequences[key]


@kernel
def _rebuild_sequences(log, end, tag, sequences):
    """Remember the last batch of every producer in a (valid) segment."""
    position = 0
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return
        _remember_sequence(sequences, tag, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                           np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                           np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                           load_i64(log, position + B.BASE_OFFSET_OFFSET),
                           np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)) + 1)
        position += length


@kernel
def _drain(ring_words, ring_completions, ring_data, rings, logs, offset_indexes,
           time_indexes, segment_states, tags, state_rows, appended, touched, sequences,
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
            status, position, length, tag, entry_topic_key, entry_partition, number, head = \
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
            if tag >= tags.shape[0] or not tags[tag, TAG_REGISTERED] \
                    or tags[tag, TAG_TOPIC_KEY] != entry_topic_key \
                    or tags[tag, TAG_PARTITION] != entry_partition or tags[tag, TAG_INTERNAL]:
                # Not the partition registered at this row, or one producers may not
                # write: Python finds the partition by the entry's identity or refuses.
                report[0], report[1], report[2] = ring, position, length
                report[_REPORT_FINISHED] = handled - 1
                cursor[0] = ring
                return _SLOW
            # The header, bounds and codec only: the CRC and the records are checked
            # on the copy in the log (or by the slow path), where the producer can no
            # longer change them.
            status, batch_length = check_batch(data, start, end, False, False)
            if status != 0:
                _finish(words, ring_completions[ring], rings, ring, number, -status, head)
                continue
            if batch_length != end - start:
                _finish(words, ring_completions[ring], rings, ring, number,
                        -CompletionCode.NOT_ONE_BATCH.value, head)
                continue
            if batch_length > tags[tag, TAG_BATCH_SIZE_MAX]:
                _finish(words, ring_completions[ring], rings, ring, number,
                        -CompletionCode.RECORD_TOO_LARGE.value, head)
                continue
            producer_id = load_i64(data, start + B.PRODUCER_ID_OFFSET)
            producer_epoch = np.int64(load_i16(data, start + B.PRODUCER_EPOCH_OFFSET))
            base_sequence = np.int64(load_i32(data, start + B.BASE_SEQUENCE_OFFSET))
            verdict, duplicate_offset = _check_sequence(sequences, tag, producer_id,
                                                        producer_epoch, base_sequence)
            if verdict == _SEQUENCE_DUPLICATE:
                _finish(words, ring_completions[ring], rings, ring, number, duplicate_offset, head)
                continue
            if verdict != _SEQUENCE_NEW:
                _finish(words, ring_completions[ring], rings, ring, number,
                        _sequence_refusal(verdict), head)
                continue
            codec = load_u16(data, start + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK
            state = segment_states[tag]
            base_offset = state[NEXT_OFFSET_WORD]
            if codec == B.CODEC_NONE and tags[tag, TAG_FAST]:
                appended_status, _, batch_status = append_batches(
                    data, start, end, logs[tag], offset_indexes[tag], time_indexes[tag], state,
                    tags[tag, TAG_SEGMENT_BYTES], tags[tag, TAG_SEGMENT_MS],
                    tags[tag, TAG_INDEX_INTERVAL], TIMESTAMP_NONE, 0, True)
                if appended_status == REJECTED:
                    _finish(words, ring_completions[ring], rings, ring, number, -batch_status, head)
                    continue
                if appended_status == APPENDED:
                    if appended[tag] == 0:
                        touched[0] += 1
                        touched[touched[0]] = tag
                    appended[tag] += state[NEXT_OFFSET_WORD] - base_offset   # from the log copy
                    _remember_sequence(sequences, tag, producer_id, producer_epoch, base_sequence,
                                       base_offset, state[NEXT_OFFSET_WORD] - base_offset)
                    _finish(words, ring_completions[ring], rings, ring, number, base_offset, head)
                    # The batch is in the segment: publish it (high watermark last).
                    publish_row(state_rows, tag, tags[tag, TAG_LOG_START_OFFSET],
                                state[NEXT_OFFSET_WORD], state[NEXT_OFFSET_WORD],
                                state[BASE_OFFSET_WORD], state[POSITION_WORD],
                                tags[tag, TAG_GENERATION])
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
    offsets in a :class:`PartitionStateTable`. A partition's tag (the row its
    producers put on ring entries, beside its identity) is its row in the table.
    """

    def __init__(self, logs: LogManager, table: PartitionStateTable):
        self.logs = logs
        self.table = table
        capacity = table.row_capacity
        self._partitions: dict[int, object] = {}               # tag -> PartitionLog
        self._targets: dict[int, AppendTarget] = {}            # tag -> its log's target
        self._tags: dict[tuple[str, int], int] = {}
        self._tags_by_identity: dict[tuple[int, int], int] = {}   # (topic key, partition)
        self.tags = np.zeros((capacity, TAG_COLUMNS), np.int64)
        self.appended = np.zeros(capacity, np.int64)
        self._logs = List([_empty_bytes() for _ in range(capacity)])
        self._offset_indexes = List([_empty_bytes() for _ in range(capacity)])
        self._time_indexes = List([_empty_bytes() for _ in range(capacity)])
        self._segment_states = List([np.zeros(STATE_WORDS, np.int64) for _ in range(capacity)])
        self._rings: list[Ring | None] = []
        self._ring_words = List.empty_list(_WORDS_TYPE)
        self._ring_completions = List.empty_list(_WORDS_TYPE)
        self._ring_data = List.empty_list(_BYTES_TYPE)
        self.rings = np.zeros((0, RING_COLUMNS), np.int64)
        self._cursor = np.zeros(1, np.int64)
        self._report = np.zeros(_REPORT_LENGTH, np.int64)
        # Partitions the compiled loop appended to: a count, then their tags.
        self._touched = np.zeros(capacity + 1, np.int64)
        # (tag, producer id) -> (last batch's epoch, its first sequence, its base offset,
        # next sequence)
        self._sequences = Dict.empty(key_type=types.UniTuple(types.int64, 2),
                                     value_type=types.UniTuple(types.int64, 4))

    # -- partitions ------------------------------------------------------------------
    def register_partition(self, topic: str, partition: int, tag: int | None = None) -> int:
        """Host (topic, partition): open its log, claim its table row; its tag. A
        ``tag`` asked for (the row it had before a restart) is used when free."""
        key = (topic, partition)
        if key in self._tags:
            return self._tags[key]
        partition_log = self.logs.partition_log(topic, partition)
        # One vectorised look: a loop over the rows cost a millisecond per partition,
        # which a topic of many partitions (__consumer_offsets: 50) held the broker for.
        free = np.flatnonzero(self.tags[:, TAG_REGISTERED] == 0)
        if not free.size:
            raise StorageError(f"the partition state table is full ({self.tags.shape[0]} rows)")
        if tag is None or not 0 <= tag < self.tags.shape[0] or self.tags[tag, TAG_REGISTERED]:
            tag = int(free[0])
        identity = (topic_key(self.logs.describe_topic(topic).topic_id), partition)
        self.table.claim(tag, *identity)
        self._partitions[tag] = partition_log
        self._tags[key] = tag
        self._tags_by_identity[identity] = tag
        self.tags[tag, TAG_REGISTERED] = 1
        self.tags[tag, TAG_TOPIC_KEY], self.tags[tag, TAG_PARTITION] = identity
        self.tags[tag, TAG_INTERNAL] = int(topic in INTERNAL_TOPICS)
        # The log tells of every change that makes its target or the row stale.
        partition_log.set_listener(lambda change: self.refresh(tag))
        self.refresh(tag)
        active = partition_log.active
        _rebuild_sequences(active.log, active.size, tag, self._sequences)
        return tag

    def unregister_partition(self, topic: str, partition: int) -> None:
        """Stop hosting (topic, partition): entries tagged for it are refused from now
        on, and its table row is freed."""
        tag = self._tags.pop((topic, partition), None)
        if tag is None:
            return
        del self._tags_by_identity[(int(self.tags[tag, TAG_TOPIC_KEY]), partition)]
        self.tags[tag] = 0
        self._partitions.pop(tag).set_listener(None)
        del self._targets[tag]
        _forget_sequences(self._sequences, tag)
        for arrays in (self._logs, self._offset_indexes, self._time_indexes):
            arrays[tag] = _empty_bytes()
        self._segment_states[tag] = np.zeros(STATE_WORDS, np.int64)
        self.table.free(tag)

    def tag_of(self, topic: str, partition: int) -> int:
        try:
            return self._tags[(topic, partition)]
        except KeyError:
            raise UnknownTopicOrPartitionError(
                f"{topic}-{partition} is not hosted by this appender") from None

    row_of = tag_of             # the partition slot is its row in the state table

    def destination(self, topic: str, partition: int) -> Destination:
        """What a producer puts on its ring entries for (topic, partition)."""
        tag = self.tag_of(topic, partition)
        return Destination(tag, int(self.tags[tag, TAG_TOPIC_KEY]), partition)

    def refresh(self, tag: int) -> None:
        """Point the compiled loop at the partition's current append target and
        settings, and publish its offsets. The partition's log calls this itself
        (its listener) on every change that makes them stale: its appends outside
        the loop, rolls, retention, truncation, compaction swaps and config changes
        (``segments.LogChange``); for a change of its segment files, before the
        first file operation and after the last (the seqlock, ``segment_generation``)."""
        partition_log = self._partitions[tag]
        target = partition_log.append_target()
        self._targets[tag] = target
        self._logs[tag] = target.log
        self._offset_indexes[tag] = target.offset_index
        self._time_indexes[tag] = target.time_index
        self._segment_states[tag] = target.state
        row = self.tags[tag]
        row[TAG_FAST] = int(target.compiled)
        row[TAG_SEGMENT_BYTES] = target.segment_bytes
        row[TAG_SEGMENT_MS] = target.segment_ms
        row[TAG_INDEX_INTERVAL] = target.index_interval
        row[TAG_BATCH_SIZE_MAX] = partition_log.config.batch_size_max
        row[TAG_LOG_START_OFFSET] = partition_log.log_start_offset
        row[TAG_GENERATION] = partition_log.generation
        end = partition_log.log_end_offset
        self.table.publish(tag, partition_log.log_start_offset, end, end,
                           partition_log.active.base_offset, partition_log.active.size,
                           partition_log.generation)

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
        self.rings[index, RING_HEAD] = ring._head
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
                            self._segment_states, self.tags, self.table.rows, self.appended,
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
        for tag in self._touched[1:1 + self._touched[0]].tolist():
            self._partitions[tag].appended_by_kernel(self._targets[tag], int(self.appended[tag]))
            self.appended[tag] = 0
        self._touched[0] = 0

    def _append_slowly(self, ring: int, position: int, length: int) -> None:
        """One entry the compiled loop handed over: append it through the log of the
        partition its identity names (whatever its row says), or refuse it."""
        source = self._rings[ring]
        # A private copy: the producer cannot change what is validated and appended.
        batch = source.data[position + R.ENTRY_HEADER_LENGTH:position + length].copy()
        _, _, _, _, entry_topic_key, entry_partition, number, head = next_entry(
            source.words, source.data, source.capacity, int(self.rings[ring, RING_HEAD]))
        tag = self._tags_by_identity.get((int(entry_topic_key), int(entry_partition)))
        if tag is None or self.tags[tag, TAG_INTERNAL]:
            refusal = CompletionCode.UNKNOWN_PARTITION if tag is None \
                else CompletionCode.INTERNAL_TOPIC
            _finish(source.words, source.completions, self.rings, ring, number, -refusal, head)
            return
        result, append_time = self._append_batch(tag, batch)
        _finish_at(source.words, source.completions, self.rings, ring, number, result, head,
                   append_time)
        self.refresh(tag)

    def append(self, row: int, batch: np.ndarray) -> int:
        """Append one batch the broker made itself (an offset commit) to the partition
        at ``row``, as the slow path appends a producer's, and publish it; its base
        offset.

        Raises
        ------
        StorageError, RecordTooLargeError, OutOfOrderSequenceError,
        InvalidProducerEpochError, CorruptRecordError
            The batch was refused (nothing of it was appended).
        """
        result, _ = self._append_batch(row, batch)
        self.refresh(row)
        if result < 0:
            code = -result
            refusal = _REFUSALS.get(code)
            where = self._partitions[row].directory
            if refusal is None:
                raise CorruptRecordError(f"{where}: batch refused (code {code})", status=code)
            raise refusal(f"{where}: batch refused ({CompletionCode(code).name.lower()}; "
                          f"see the broker's log)")
        return result

    def _append_batch(self, tag: int, batch: np.ndarray) -> tuple[int, int]:
        """Append one batch through the partition's log, unless its sequence says it
        is a duplicate or out of order: (completion result, broker append time)."""
        partition_log = self._partitions[tag]
        header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0] \
            if batch.size >= B.HEADER_LENGTH else None
        producer_id = int(header["producer_id"]) if header is not None else -1
        producer_epoch = int(header["producer_epoch"]) if header is not None else -1
        base_sequence = int(header["base_sequence"]) if header is not None else -1
        verdict, duplicate_offset = _check_sequence(self._sequences, tag, producer_id,
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
        _remember_sequence(self._sequences, tag, producer_id, producer_epoch, base_sequence,
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

