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
* Releasing an entry's ring space and completing it are two steps. The space goes
  back to the producer as soon as the batch is copied into the log (or refused).
  The completion (its result, then the acknowledged count) is stored at once,
  unless the ring awaits the high watermark (``add_ring(...,
  awaits_high_watermark=True)``: a producer with acks=all): then it is *parked*
  until the partition's high watermark covers the batch's last offset, as Kafka's
  ReplicaManager holds an acks=all produce in purgatory. Completions are
  acknowledged in ring order (``ring_layout``: the count covers every entry below
  it), so a parked completion holds back every later one of its ring, whatever
  partition they went to. A ring's parked completions are at most
  ``COMPLETION_SLOTS`` (a producer never has more entries unacknowledged); a ring
  whose queue is full is not read until it drains, so a producer that ignores
  that bound cannot grow it.
* The high watermark (what consumers may read: they never see an offset at or
  above it) follows a per-row :class:`HighWatermarkPolicy`: ``LOG_END`` (every row
  today: the log end, a partition without replicas) or ``EXTERNAL`` (replication:
  the log end is published, the high watermark only moves by
  :meth:`Appender.advance_high_watermark`, never backwards and never past the log
  end, as Kafka's ``Partition.maybeIncrementLeaderHW``).
* acks=all and ``min.insync.replicas`` (Kafka's ``Partition.appendRecordsToLeader``
  and ``checkEnoughReplicasReachOffset``): while a partition is marked under min
  ISR (:meth:`Appender.set_under_min_isr`), an entry of an acks=all ring bound for
  it is refused with ``NOT_ENOUGH_REPLICAS`` before anything else is looked at
  (nothing appended, no sequence used); a parked acks=all batch whose partition is
  under min ISR when the high watermark covers it completes with
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (it is in the log, its sequence used).
  Entries of other rings never look at the mark.
* A leader that may have been replaced (:meth:`Appender.set_fenced`: its ZooKeeper
  session is suspended) refuses acks=all entries with ``NOT_LEADER_OR_FOLLOWER``,
  before the min ISR mark is looked at; acks=0/1 entries are not affected.
* A parked completion the high watermark will never cover (its partition went, its
  offsets were truncated away after a leadership change) is refused
  (:meth:`Appender.refuse_parked`, :meth:`Appender.refuse_parked_from`): it
  completes with the code given once those before it in its ring have.
* An entry bound for a partition another broker leads (:meth:`Appender.set_is_leader`)
  is refused with ``NOT_LEADER_OR_FOLLOWER``, unless a forwarder is set
  (:meth:`Appender.set_forwarder`, cluster mode): then the slow path checks its
  batch as the leader would for its bytes alone, hands a copy to the forwarder,
  releases its space at once and parks its completion as *external*
  (``PARKED_EXTERNAL``): no high watermark here covers it; it completes with what
  :meth:`Appender.resolve_forwarded` says (the leader's answer), in ring order like
  every parked completion. Entries for partitions this broker leads never take
  that path: the compiled loop is unchanged for them.
* Every batch appended to a partition (compiled path, slow path,
  :meth:`Appender.append`) is stamped with its row's leader epoch
  (:meth:`Appender.set_leader_epoch`, 0 until replication sets one), as Kafka's
  leader stamps ``partitionLeaderEpoch``.

Theory of operation
-------------------
:func:`_drain` is the compiled loop. It visits the rings round-robin, one entry per
ring per round, and takes each entry through the rules above, one kernel each:
:func:`_row_takes` (the entry's identity is its row's, and producers may write
it), :func:`_admit` (the batch's header and size, and its producer's sequence:
the entry is either finished with a result there, or to be appended), and for an
uncompressed batch bound for a CreateTime partition :func:`_append_fast` (copy it
into the active segment through ``segments.append_batches``, check the copy, remember
its sequence, publish the row). Every entry ends in :func:`_finish`, the one place
that completes (or parks) an entry and hands its space back. Anything the loop
cannot finish in compiled code - a zstd batch (its records are checked after
inflating), a topic that stamps LogAppendTime or recompresses, a segment that must
roll or needs space reserved, an entry whose identity is not its row's - it hands
back to Python (``_SLOW``), which looks the partition up by the entry's identity,
appends that one entry through :meth:`PartitionLog.append` (or refuses it),
refreshes and publishes the partition, finishes the entry through the same
:func:`_finish` and calls the loop again. Per-record work never happens in Python.

The partitions a drain appended to are remembered (from the loop's list of
touched rows: no work per entry) until :meth:`Appender.take_appended` takes them
with their log ends: replication answers waiting follower fetches from it.

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
A refused batch changes nothing remembered. The memory is rebuilt from the whole
log when a partition is opened, and after a truncation
(:meth:`Appender.rebuild_producer_state`): the producer snapshot below the active
segment and a walk of that segment (``producer_snapshots``). A follower's appends
(:meth:`Appender.append_replicated`) are remembered unchecked, so the replica that
becomes leader knows every producer's last batch.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Callable

import numpy as np

from ..common.errors import (
    CorruptRecordError,
    CorruptRingError,
    LocalProtocolError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import INTERNAL_TOPICS
from ..native import typed_containers as typed
from ..native.atomics import py_store_release, store_release
from ..native.jit import kernel, load_i16, load_i32, load_i64, load_u16
from ..record import batch_layout as B
from ..record.records import batch_frame, check_batch
from ..ring import ENTRY_CORRUPT, ENTRY_NONE, Destination, Ring, complete_entry, next_entry
from ..segments import AppendTarget, append_batches
from ..shm import ring_layout as R
from ..shm.completion import SEQUENCE_MODULUS, CompletionCode
from ..shm.state import PartitionStateTable, publish_row, topic_key
from ..storage.log_manager import LogManager
from ..storage.segment_state import (
    APPENDED,
    BASE_OFFSET_WORD,
    NEXT_OFFSET_WORD,
    POSITION_WORD,
    REJECTED,
    STATE_WORDS,
    TIMESTAMP_NONE,
)

log = logging.getLogger(__name__)

__all__ = ["Appender", "CompletionCode", "ForwardedEntry", "HighWatermarkPolicy"]


class HighWatermarkPolicy(enum.IntEnum):
    """Who moves a partition's high watermark."""
    LOG_END = 0                # it follows the log end (no replicas: every partition today)
    EXTERNAL = 1               # Appender.advance_high_watermark moves it (replication)


# drain results
_IDLE = 0                      # every ring is empty
_BUDGET = 1                    # entries_max entries handled; call again
_SLOW = 2                      # report = (ring, position, length): Python's turn
_POISON = 3                    # report = (ring, position, length): garbage in a ring
_REPORT_FINISHED = 4           # report[4]: entries the call finished (appended or refused)
_REPORT_LENGTH = 5

# what an entry's admission (and its compiled append) decides
_COMPLETE = 0                  # finish it with the result given
_APPEND = 1                    # append it in compiled code
_TO_PYTHON = 2                 # the slow path appends or refuses it

# columns of the per-ring state array
RING_CAPACITY = 0
RING_HEAD = 1                  # private head: never read back from shared memory
RING_ACTIVE = 2
RING_AWAITS_HIGH_WATERMARK = 3  # completions wait until the high watermark covers the batch
RING_PARKED_FIRST = 4          # the ring's queue of parked completions: its oldest ...
RING_PARKED_COUNT = 5          # ... and how many
RING_COLUMNS = 6

# columns of a parked completion (the per-ring queues: ring x slot x column)
PARKED_NUMBER = 0              # the entry's number
PARKED_RESULT = 1
PARKED_TIMESTAMP = 2
PARKED_ROW = 3                 # the partition whose high watermark it waits for ...
PARKED_LAST_OFFSET = 4         # ... to pass this offset (or one of the two marks below)
PARKED_COLUMNS = 5
# PARKED_LAST_OFFSET marks: the entry waits only for those before it in its ring; or
# it was forwarded to the partition's leader and waits for resolve_forwarded (its
# row is then PARKED_NO_ROW: no high watermark of this broker decides it).
PARKED_NO_BATCH = -1
PARKED_EXTERNAL = -2
PARKED_NO_ROW = -1
# A producer never has more than COMPLETION_SLOTS entries unacknowledged, and a
# parked entry is unacknowledged (see the rules).
PARKED_COMPLETIONS_MAX = R.COMPLETION_SLOTS

# columns of the per-row settings array (one row per partition: its row in the table)
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
ROW_LEADER_EPOCH = 11          # stamped on every batch appended
ROW_HIGH_WATERMARK_POLICY = 12  # a HighWatermarkPolicy
ROW_HIGH_WATERMARK = 13        # the high watermark published (LOG_END: the log end)
ROW_UNDER_MIN_ISR = 14         # fewer in-sync replicas than min.insync.replicas (acks=all)
ROW_NOT_LEADER = 15            # another broker leads it: producers' entries go to Python
ROW_FENCED = 16                # its leadership may be lost (ZooKeeper suspended): acks=all refused
ROW_COLUMNS = 17

# Entries handled per call before Python looks up again (signals, shutdown, timers).
DRAIN_ENTRIES_MAX = 4096
LEADER_EPOCH_MAX = (1 << 31) - 1   # the batch header's leader_epoch is an i32


# The kernels every entry passes through are inlined into the loop (numba's IR
# inlining): called as functions, the arrays they take (up to ten) cost reference
# counting on every entry, which measured 15-25 % more CPU per entry of one small
# batch than the loop written out in one piece (inlined: within ~10 %).
_PER_ENTRY = "always"

_SEQUENCE_NEW = 0             # append, then remember
_SEQUENCE_DUPLICATE = 1       # acknowledge with the remembered base offset
_SEQUENCE_OUT_OF_ORDER = 2
_SEQUENCE_FENCED = 3          # an epoch older than the remembered one


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
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return
        _remember_sequence(sequences, row, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                           np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                           np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                           load_i64(log, position + B.BASE_OFFSET_OFFSET),
                           np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)) + 1)
        position += length


@kernel
def _remember_producers(sequences, row, producers):
    """Remember the producers' last batches a log gives
    (``PartitionLog.producer_batches``: id, epoch, base sequence, base offset, last
    offset delta per row) for the partition at ``row``."""
    for index in range(producers.shape[0]):
        _remember_sequence(sequences, row, producers[index, 0], producers[index, 1],
                           producers[index, 2], producers[index, 3], producers[index, 4] + 1)


# --- finishing an entry: completion, parking, release ------------------------------------

@kernel(inline=_PER_ENTRY)
def _covered(row_settings, row, last_offset):
    """Whether the row's high watermark covers a batch ending at ``last_offset``
    (PARKED_NO_BATCH: nothing to wait for; PARKED_EXTERNAL: never, until
    :meth:`Appender.resolve_forwarded` says what became of it)."""
    if last_offset < 0:
        return last_offset != PARKED_EXTERNAL
    return last_offset < row_settings[row, ROW_HIGH_WATERMARK]


@kernel
def _park(rings, parked, ring, number, result, timestamp, row, last_offset):
    """Queue a completion behind the ring's parked ones (the caller checked there is
    room: a full queue stops the ring being read)."""
    slot = (rings[ring, RING_PARKED_FIRST] + rings[ring, RING_PARKED_COUNT]) \
        % PARKED_COMPLETIONS_MAX
    entry = parked[ring, slot]
    entry[PARKED_NUMBER] = number
    entry[PARKED_RESULT] = result
    entry[PARKED_TIMESTAMP] = timestamp
    entry[PARKED_ROW] = row
    entry[PARKED_LAST_OFFSET] = last_offset
    rings[ring, RING_PARKED_COUNT] += 1


@kernel(inline=_PER_ENTRY)
def _finish(words, completions, rings, parked, row_settings, ring, number, result, timestamp,
            row, last_offset, head):
    """The one place an entry is finished: its completion is stored now, or parked
    (its ring awaits the high watermark, which does not yet cover the batch, or
    completions parked before it must go first); then its space goes back.

    ``result`` is a base offset or ``-CompletionCode``, ``timestamp`` the broker's
    append time (-1: none), ``last_offset`` the last offset of the batch the result
    names (-1: none; ``row`` is then not read)."""
    if rings[ring, RING_PARKED_COUNT] > 0 or (rings[ring, RING_AWAITS_HIGH_WATERMARK]
                                             and not _covered(row_settings, row, last_offset)):
        _park(rings, parked, ring, number, result, timestamp, row, last_offset)
    else:
        complete_entry(words, completions, number, result, timestamp)
    rings[ring, RING_HEAD] = head
    # Release: the entry's bytes were copied (or refused) before the producer may reuse
    # them. A parked completion needs none of them: it holds its result.
    store_release(words, R.HEAD_WORD, head)


@kernel
def _complete_parked(ring_words, ring_completions, rings, parked, row_settings):
    """Store the parked completions whose batches the high watermark now covers, each
    ring's in order: its oldest first, up to the first still waiting. A batch of an
    acks=all ring whose partition is under min.insync.replicas at that moment
    completes with ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` instead of its offset
    (Kafka's ``Partition.checkEnoughReplicasReachOffset``)."""
    for ring in range(rings.shape[0]):
        while rings[ring, RING_ACTIVE] and rings[ring, RING_PARKED_COUNT] > 0:
            first = rings[ring, RING_PARKED_FIRST]
            entry = parked[ring, first]
            row, last_offset = entry[PARKED_ROW], entry[PARKED_LAST_OFFSET]
            if not _covered(row_settings, row, last_offset):
                break
            result = entry[PARKED_RESULT]
            if last_offset >= 0 and rings[ring, RING_AWAITS_HIGH_WATERMARK] \
                    and row_settings[row, ROW_UNDER_MIN_ISR]:
                result = -CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND.value
            complete_entry(ring_words[ring], ring_completions[ring], entry[PARKED_NUMBER],
                           result, entry[PARKED_TIMESTAMP])
            rings[ring, RING_PARKED_FIRST] = (first + 1) % PARKED_COMPLETIONS_MAX
            rings[ring, RING_PARKED_COUNT] -= 1


@kernel
def _refuse_parked_from(rings, parked, row, first_offset, result):
    """Parked completions waiting for the high watermark of ``row`` whose batches end
    at or above ``first_offset`` (0: all of them), which it will never cover (the
    partition went, or those offsets were truncated away): they complete with
    ``result`` once those before them in their ring have. Those ending below
    ``first_offset`` stay parked: after a truncation to ``first_offset`` the new
    leader's log holds them at the same offsets, so the high watermark will cover
    them (the design's note on parked completions across a leadership change)."""
    first_offset = max(first_offset, 0)          # -1 marks "waits for no batch"
    for ring in range(rings.shape[0]):
        for index in range(rings[ring, RING_PARKED_COUNT]):
            entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
            if entry[PARKED_LAST_OFFSET] >= first_offset and entry[PARKED_ROW] == row:
                entry[PARKED_RESULT] = result
                entry[PARKED_TIMESTAMP] = -1
                entry[PARKED_LAST_OFFSET] = -1


@kernel
def _parked_count(rings, parked, row_settings, row):
    """How many parked completions wait for the high watermark of ``row`` to cover
    their batches (not those it covers, parked behind another's)."""
    count = 0
    for ring in range(rings.shape[0]):
        for index in range(rings[ring, RING_PARKED_COUNT]):
            entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
            if entry[PARKED_ROW] == row \
                    and not _covered(row_settings, row, entry[PARKED_LAST_OFFSET]):
                count += 1
    return count


@kernel
def _park_forwarded(words, rings, parked, ring, number, head):
    """Finish an entry handed to the forwarder: its completion parked as external
    (behind any parked before it, so ring order holds), its space given back at once
    (the forwarder holds a copy of its batch)."""
    _park(rings, parked, ring, number, 0, -1, PARKED_NO_ROW, PARKED_EXTERNAL)
    rings[ring, RING_HEAD] = head
    # Release: the batch was copied out before the producer may reuse its space.
    store_release(words, R.HEAD_WORD, head)


@kernel
def _resolve_forwarded(rings, parked, ring, number, result, timestamp):
    """Give the external completion of entry ``number`` of ``ring`` its result; it
    completes once those before it in its ring have. False when no such completion
    waits (its ring was removed, or it was resolved already)."""
    for index in range(rings[ring, RING_PARKED_COUNT]):
        entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
        if entry[PARKED_NUMBER] == number and entry[PARKED_LAST_OFFSET] == PARKED_EXTERNAL:
            entry[PARKED_RESULT] = result
            entry[PARKED_TIMESTAMP] = timestamp
            entry[PARKED_LAST_OFFSET] = PARKED_NO_BATCH
            return True
    return False


# --- the compiled loop ------------------------------------------------------------------

@kernel(inline=_PER_ENTRY)
def _publish(state_rows, row_settings, row, state):
    """Publish the row from its active segment's state: the log end, and the high
    watermark its policy gives (stored last, release: see ``publish_row``)."""
    if row_settings[row, ROW_HIGH_WATERMARK_POLICY] == HighWatermarkPolicy.LOG_END.value:
        row_settings[row, ROW_HIGH_WATERMARK] = state[NEXT_OFFSET_WORD]
    publish_row(state_rows, row, row_settings[row, ROW_LOG_START_OFFSET], state[NEXT_OFFSET_WORD],
                row_settings[row, ROW_HIGH_WATERMARK], state[BASE_OFFSET_WORD],
                state[POSITION_WORD], row_settings[row, ROW_GENERATION])


@kernel(inline=_PER_ENTRY)
def _row_takes(row_settings, row, entry_topic_key, entry_partition):
    """Whether the entry's row is the partition its identity names, and one producers
    may write (else Python finds the partition by the identity, or refuses)."""
    return (row < row_settings.shape[0] and row_settings[row, ROW_REGISTERED] != 0
            and row_settings[row, ROW_TOPIC_KEY] == entry_topic_key
            and row_settings[row, ROW_PARTITION] == entry_partition
            and row_settings[row, ROW_INTERNAL] == 0 and row_settings[row, ROW_NOT_LEADER] == 0)


@kernel(inline=_PER_ENTRY)
def _admit(data, start, end, row_settings, row, sequences, awaits_high_watermark):
    """What becomes of the batch ``data[start:end]`` bound for ``row``: (action,
    completion result, last offset it names). _COMPLETE with the result when it is
    refused (too few in-sync replicas for acks=all, header, size, sequence) or a
    duplicate; _APPEND when the compiled loop appends it; _TO_PYTHON when it is
    compressed or its topic needs the slow path.

    The header, bounds and codec only: the CRC and the records are checked on the
    copy in the log (or by the slow path), where the producer can no longer change
    them."""
    if awaits_high_watermark:
        # Before anything else, a duplicate's dedupe included, as Kafka's
        # Partition.appendRecordsToLeader: nothing is appended, no sequence used.
        if row_settings[row, ROW_FENCED]:
            return _COMPLETE, -CompletionCode.NOT_LEADER_OR_FOLLOWER.value, -1
        if row_settings[row, ROW_UNDER_MIN_ISR]:
            return _COMPLETE, -CompletionCode.NOT_ENOUGH_REPLICAS.value, -1
    status, batch_length = check_batch(data, start, end, False, False)
    if status != 0:
        return _COMPLETE, -status, -1
    if batch_length != end - start:
        return _COMPLETE, -CompletionCode.NOT_ONE_BATCH.value, -1
    if batch_length > row_settings[row, ROW_BATCH_SIZE_MAX]:
        return _COMPLETE, -CompletionCode.RECORD_TOO_LARGE.value, -1
    verdict, duplicate_offset = _check_sequence(
        sequences, row, load_i64(data, start + B.PRODUCER_ID_OFFSET),
        np.int64(load_i16(data, start + B.PRODUCER_EPOCH_OFFSET)),
        np.int64(load_i32(data, start + B.BASE_SEQUENCE_OFFSET)))
    if verdict == _SEQUENCE_DUPLICATE:
        # Acknowledged with the original's offsets (so once they are committed).
        return (_COMPLETE, duplicate_offset,
                duplicate_offset + np.int64(load_i32(data, start + B.LAST_OFFSET_DELTA_OFFSET)))
    if verdict != _SEQUENCE_NEW:
        return _COMPLETE, _sequence_refusal(verdict), -1
    codec = load_u16(data, start + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK
    if codec != B.CODEC_NONE or not row_settings[row, ROW_FAST]:
        return _TO_PYTHON, 0, -1
    return _APPEND, 0, -1


@kernel(inline=_PER_ENTRY)
def _append_fast(data, start, end, log, offset_index, time_index, state, row_settings, row,
                 state_rows, sequences, appended, touched):
    """Append an admitted batch to the active segment of ``row``, check the copy,
    remember its sequence and publish the row: (action, result, last offset).
    _TO_PYTHON when the segment must roll or needs space reserved first."""
    base_offset = state[NEXT_OFFSET_WORD]
    position = state[POSITION_WORD]
    status, _, batch_status = append_batches(
        data, start, end, log, offset_index, time_index, state,
        row_settings[row, ROW_SEGMENT_BYTES], row_settings[row, ROW_SEGMENT_MS],
        row_settings[row, ROW_INDEX_INTERVAL], TIMESTAMP_NONE,
        row_settings[row, ROW_LEADER_EPOCH], True)
    if status == REJECTED:
        return _COMPLETE, -batch_status, -1
    if status != APPENDED:
        return _TO_PYTHON, 0, -1
    next_offset = state[NEXT_OFFSET_WORD]
    if appended[row] == 0:
        touched[0] += 1
        touched[touched[0]] = row
    appended[row] += next_offset - base_offset            # from the log copy
    # The sequence as the log copy holds it: the bytes checked, and those a restart
    # rebuilds the memory from.
    _remember_sequence(sequences, row, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                       np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                       np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                       base_offset, next_offset - base_offset)
    _publish(state_rows, row_settings, row, state)     # the batch is in the segment
    return _COMPLETE, base_offset, next_offset - 1


@kernel
def _stop(report, finished, ring, position, length):
    """Leave the loop at an entry Python must see: where it is, and what was done."""
    report[0], report[1], report[2] = ring, position, length
    report[_REPORT_FINISHED] = finished


@kernel
def _drain(ring_words, ring_completions, ring_data, rings, parked, logs, offset_indexes,
           time_indexes, segment_states, row_settings, state_rows, appended, touched, sequences,
           cursor, entries_max, report):
    """The compiled loop (see the module's theory): rings round-robin from
    ``cursor``, each entry through _row_takes, _admit, _append_fast and _finish,
    until every ring is empty (_IDLE), about ``entries_max`` entries are finished
    (_BUDGET), or an entry is Python's (_SLOW) or garbage (_POISON); ``report``
    says where, and how many entries were finished."""
    report[_REPORT_FINISHED] = 0
    finished = 0
    ring_count = rings.shape[0]
    while True:
        progress = False
        for step in range(ring_count):
            ring = (cursor[0] + step) % ring_count
            if not rings[ring, RING_ACTIVE] \
                    or rings[ring, RING_PARKED_COUNT] == PARKED_COMPLETIONS_MAX:
                continue
            words, data = ring_words[ring], ring_data[ring]
            status, position, length, row, entry_topic_key, entry_partition, number, head = \
                next_entry(words, data, rings[ring, RING_CAPACITY], rings[ring, RING_HEAD])
            if status == ENTRY_NONE:
                continue
            if status == ENTRY_CORRUPT:
                _stop(report, finished, ring, position, length)
                return _POISON
            progress = True
            start, end = position + R.ENTRY_HEADER_LENGTH, position + length
            action, result, last_offset = _TO_PYTHON, 0, -1
            if _row_takes(row_settings, row, entry_topic_key, entry_partition):
                action, result, last_offset = _admit(data, start, end, row_settings, row,
                                                     sequences,
                                                     rings[ring, RING_AWAITS_HIGH_WATERMARK])
            if action == _APPEND:
                action, result, last_offset = _append_fast(
                    data, start, end, logs[row], offset_indexes[row], time_indexes[row],
                    segment_states[row], row_settings, row, state_rows, sequences, appended,
                    touched)
            if action == _TO_PYTHON:
                _stop(report, finished, ring, position, length)
                cursor[0] = ring
                return _SLOW
            _finish(words, ring_completions[ring], rings, parked, row_settings, ring, number,
                    result, -1, row, last_offset, head)
            finished += 1
        report[_REPORT_FINISHED] = finished
        if not progress:
            return _IDLE
        if finished >= entries_max:
            cursor[0] = (cursor[0] + 1) % ring_count
            return _BUDGET


def _empty_bytes() -> np.ndarray:
    return np.zeros(0, np.uint8)


# What a free ring slot's entries in the compiled loop's lists hold: never read (the
# slot is inactive), they only let go of the removed ring's views.
_EMPTY_WORDS = np.zeros(0, np.int64)
_EMPTY_BYTES = _empty_bytes()


@dataclasses.dataclass(frozen=True)
class ForwardedEntry:
    """A ring entry bound for a partition another broker leads, handed to the
    forwarder (:meth:`Appender.set_forwarder`): resolve it with
    :meth:`Appender.resolve_forwarded` ``(ring, number, ...)`` while
    :meth:`Appender.ring_at` ``(ring)`` is still ``source`` (a removed ring's slot
    is reused)."""
    ring: int                          # the ring's index in the appender
    source: Ring
    number: int                        # the entry's number in its ring
    row: int                           # the partition's row here
    topic_key: int                     # the partition's name on the wire
    partition: int
    batch: np.ndarray = dataclasses.field(repr=False)   # a private copy: one valid batch
    awaits_high_watermark: bool        # the ring's producer asked for acks=all


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
        self._targets: dict[int, AppendTarget] = {}            # row -> its log's target
        self._rows: dict[tuple[str, int], int] = {}
        self._rows_by_identity: dict[tuple[int, int], int] = {}   # (topic key, partition)
        self.row_settings = np.zeros((capacity, ROW_COLUMNS), np.int64)
        self.appended = np.zeros(capacity, np.int64)
        # The compiled loop's views, by row and by ring: typed lists, changed only
        # through typed_containers' kernels (see there why).
        self._logs = typed.byte_arrays(capacity)
        self._offset_indexes = typed.byte_arrays(capacity)
        self._time_indexes = typed.byte_arrays(capacity)
        self._segment_states = typed.word_arrays(capacity, STATE_WORDS)
        self._rings: list[Ring | None] = []
        self._ring_words = typed.word_arrays(0, 0)
        self._ring_completions = typed.word_arrays(0, 0)
        self._ring_data = typed.byte_arrays(0)
        self.rings = np.zeros((0, RING_COLUMNS), np.int64)
        # Parked completions: per ring a circular queue (see RING_PARKED_FIRST).
        self._parked = np.zeros((0, PARKED_COMPLETIONS_MAX, PARKED_COLUMNS), np.int64)
        self._cursor = np.zeros(1, np.int64)
        self._report = np.zeros(_REPORT_LENGTH, np.int64)
        # Partitions the compiled loop appended to: a count, then their rows.
        self._touched = np.zeros(capacity + 1, np.int64)
        # Rows appended to since take_appended last took them (a dict: ordered, unique).
        self._appended_rows: dict[int, None] = {}
        # (row, producer id) -> (last batch's epoch, its first sequence, its base offset,
        # next sequence)
        self._sequences = typed.sequence_table()
        self._forward: Callable[[ForwardedEntry], None] | None = None   # see set_forwarder

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
        # The log tells of every change that makes its target or the row stale.
        partition_log.set_listener(lambda change: self.refresh(row))
        self.refresh(row)
        self._remember_log(row)
        return row

    def unregister_partition(self, topic: str, partition: int) -> None:
        """Stop hosting (topic, partition): entries addressed to it are refused from now
        on, and its table row is freed."""
        row = self._rows.pop((topic, partition), None)
        if row is None:
            return
        del self._rows_by_identity[(int(self.row_settings[row, ROW_TOPIC_KEY]), partition)]
        self.row_settings[row] = 0
        self._partitions.pop(row).set_listener(None)
        del self._targets[row]
        self._appended_rows.pop(row, None)
        # Kafka answers a produce waiting for a partition it stops leading with an error.
        self._refuse_parked_from(row, 0, CompletionCode.UNKNOWN_PARTITION)
        _forget_sequences(self._sequences, row)
        for arrays in (self._logs, self._offset_indexes, self._time_indexes):
            typed.set_item(arrays, row, _empty_bytes())
        typed.set_item(self._segment_states, row, np.zeros(STATE_WORDS, np.int64))
        self.table.free(row)

    def row_of(self, topic: str, partition: int) -> int:
        """The row of a hosted partition (in the state table and this appender's
        arrays).

        Raises
        ------
        UnknownTopicOrPartitionError
            This appender does not host (topic, partition).
        """
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
        """Point the compiled loop at the partition's current append target and
        settings, and publish its offsets. The partition's log calls this itself
        (its listener) on every change that makes them stale: its appends outside
        the loop, rolls, retention, truncation, compaction swaps and config changes
        (``segments.LogChange``); for a change of its segment files, before the
        first file operation and after the last (the seqlock, ``segment_generation``)."""
        partition_log = self._partitions[row]
        target = partition_log.append_target()
        self._targets[row] = target
        typed.set_item(self._logs, row, target.log)
        typed.set_item(self._offset_indexes, row, target.offset_index)
        typed.set_item(self._time_indexes, row, target.time_index)
        typed.set_item(self._segment_states, row, target.state)
        settings = self.row_settings[row]
        settings[ROW_FAST] = int(target.compiled)
        settings[ROW_SEGMENT_BYTES] = target.segment_bytes
        settings[ROW_SEGMENT_MS] = target.segment_ms
        settings[ROW_INDEX_INTERVAL] = target.index_interval
        settings[ROW_BATCH_SIZE_MAX] = partition_log.config.batch_size_max
        settings[ROW_LOG_START_OFFSET] = partition_log.log_start_offset
        settings[ROW_GENERATION] = partition_log.generation
        end = partition_log.log_end_offset
        self.table.publish(row, partition_log.log_start_offset, end,
                           self._high_watermark_for(row, partition_log.log_start_offset, end),
                           partition_log.active.base_offset, partition_log.active.size,
                           partition_log.generation)

    def _high_watermark_for(self, row: int, log_start_offset: int, log_end_offset: int) -> int:
        """The high watermark to publish with these offsets, by the row's policy: the
        log end, or the one set from outside kept within [log start, log end] (a
        truncation below it lowers it, as Kafka's ``Log.updateHighWatermark``)."""
        settings = self.row_settings[row]
        if settings[ROW_HIGH_WATERMARK_POLICY] == HighWatermarkPolicy.LOG_END:
            high_watermark = log_end_offset
        else:
            high_watermark = min(max(int(settings[ROW_HIGH_WATERMARK]), log_start_offset),
                                 log_end_offset)
        settings[ROW_HIGH_WATERMARK] = high_watermark
        return high_watermark

    # -- seams for replication ---------------------------------------------------------
    def _hosted(self, row: int) -> int:
        if row not in self._partitions:
            raise UnknownTopicOrPartitionError(f"row {row!r} hosts no partition of this appender")
        return row

    def high_watermark(self, row: int) -> int:
        """The high watermark published for the partition at ``row``."""
        return int(self.row_settings[self._hosted(row), ROW_HIGH_WATERMARK])

    def set_high_watermark_policy(self, row: int, policy: HighWatermarkPolicy,
                                  high_watermark: int | None = None) -> None:
        """Who moves the partition's high watermark from now on. ``EXTERNAL`` holds it
        where it is (or at ``high_watermark``, kept within the log start and end: a
        replica hosted again starts from what it knew, Kafka's recovery of the
        checkpointed HW) until :meth:`advance_high_watermark` moves it; ``LOG_END``
        moves it to the log end at once (completing what waited for it).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.row_settings[self._hosted(row), ROW_HIGH_WATERMARK_POLICY] = \
            HighWatermarkPolicy(policy)
        if high_watermark is not None and policy == HighWatermarkPolicy.EXTERNAL:
            self.row_settings[row, ROW_HIGH_WATERMARK] = int(high_watermark)
        self.refresh(row)
        self._complete_parked()

    def advance_high_watermark(self, row: int, high_watermark: int) -> int:
        """Move the high watermark of a partition whose policy is ``EXTERNAL`` up to
        ``high_watermark`` (never backwards, never past the log end), publish its
        row, and complete the parked entries it now covers; the high watermark
        published.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            The partition's high watermark follows its log end.
        """
        settings = self.row_settings[self._hosted(row)]
        if settings[ROW_HIGH_WATERMARK_POLICY] != HighWatermarkPolicy.EXTERNAL:
            raise LocalProtocolError(f"row {row}: the high watermark follows the log end; "
                                     f"set_high_watermark_policy(row, EXTERNAL) first")
        high_watermark = min(int(high_watermark), self._partitions[row].log_end_offset)
        if high_watermark > settings[ROW_HIGH_WATERMARK]:
            settings[ROW_HIGH_WATERMARK] = high_watermark
            _publish(self.table.rows, self.row_settings, row, self._targets[row].state)
            self._complete_parked()
        return int(settings[ROW_HIGH_WATERMARK])

    def set_leader_epoch(self, row: int, leader_epoch: int) -> None:
        """The leader epoch stamped on every batch appended to the partition from now
        on (0 until replication sets one).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            ``leader_epoch`` is outside [0, LEADER_EPOCH_MAX].
        """
        if not isinstance(leader_epoch, (int, np.integer)) \
                or not 0 <= leader_epoch <= LEADER_EPOCH_MAX:
            raise LocalProtocolError(f"a leader epoch must be an integer in "
                                     f"[0, {LEADER_EPOCH_MAX}], got {leader_epoch!r}")
        self.row_settings[self._hosted(row), ROW_LEADER_EPOCH] = leader_epoch

    def take_appended(self) -> list[tuple[int, int]]:
        """The partitions appended to since the last call, as (row, log end offset
        now), in the order first appended to; each once."""
        rows, self._appended_rows = self._appended_rows, {}
        return [(row, self._partitions[row].log_end_offset) for row in rows]

    def set_under_min_isr(self, row: int, under: bool) -> None:
        """Whether the partition has fewer in-sync replicas than its
        ``min.insync.replicas`` (the replica service says so whenever either
        changes). While it has, entries of acks=all rings bound for it are refused
        with ``NOT_ENOUGH_REPLICAS`` and nothing of them appended (Kafka's
        ``Partition.appendRecordsToLeader``), and an acks=all batch the high
        watermark covers completes with ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``
        (``checkEnoughReplicasReachOffset``). acks=0/1 rings are not affected.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.row_settings[self._hosted(row), ROW_UNDER_MIN_ISR] = int(bool(under))

    def set_fenced(self, row: int, fenced: bool) -> None:
        """Whether this broker may have lost the partition's leadership without
        knowing it (its ZooKeeper session is suspended: another leader may be elected
        a session timeout after ZooKeeper last heard from it). While it is, entries
        of acks=all rings bound for it are refused with ``NOT_LEADER_OR_FOLLOWER``
        and nothing of them appended (the ISR cannot shrink without ZooKeeper, so
        min.insync.replicas cannot be judged); acks=0/1 rings are not affected (Kafka
        does not fence those by ZooKeeper either).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.row_settings[self._hosted(row), ROW_FENCED] = int(bool(fenced))

    def fenced(self, row: int) -> bool:
        """What :meth:`set_fenced` last said of the partition (False at first)."""
        return bool(self.row_settings[self._hosted(row), ROW_FENCED])

    def set_is_leader(self, row: int, leader: bool) -> None:
        """Whether this broker leads the partition at ``row`` (a replicated
        partition's role; True until replication says otherwise). While it does not,
        producers' entries bound for it, and the broker's own appends, are refused
        with ``NOT_LEADER_OR_FOLLOWER`` and nothing of them appended (Kafka's
        ``NotLeaderOrFollowerException``), unless a forwarder takes the producers'
        entries (:meth:`set_forwarder`); a follower appends only its leader's
        batches (:meth:`append_replicated`).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.row_settings[self._hosted(row), ROW_NOT_LEADER] = int(not leader)

    def is_leader(self, row: int) -> bool:
        """What :meth:`set_is_leader` last said of the partition (True at first)."""
        return not self.row_settings[self._hosted(row), ROW_NOT_LEADER]

    def under_min_isr(self, row: int) -> bool:
        """What :meth:`set_under_min_isr` last said of the partition (False at first)."""
        return bool(self.row_settings[self._hosted(row), ROW_UNDER_MIN_ISR])

    def refuse_parked_from(self, row: int, first_offset: int, code: CompletionCode) -> None:
        """Complete with ``-code`` the parked entries waiting for the high watermark of
        the partition at ``row`` whose batches end at or above ``first_offset``: a
        former leader truncated its log to ``first_offset``, so they are not in the
        new leader's log (``NOT_LEADER_OR_FOLLOWER``). Those ending below it stay
        parked until the high watermark covers them. Completions keep ring order: a
        refused entry behind one still parked waits for it.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            ``code`` is not a :class:`CompletionCode`, or ``first_offset`` is negative.
        """
        if not isinstance(first_offset, (int, np.integer)) or first_offset < 0:
            raise LocalProtocolError(f"first_offset must be an offset (>= 0), "
                                     f"got {first_offset!r}")
        self._refuse_parked_from(self._hosted(row), int(first_offset), code)

    def refuse_parked(self, row: int, code: CompletionCode) -> None:
        """Complete with ``-code`` every parked entry waiting for the high watermark of
        the partition at ``row`` (leadership lost with the offset unknown: on a
        ZooKeeper session LOST, ``NOT_LEADER_OR_FOLLOWER``), in ring order as
        :meth:`refuse_parked_from`.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            ``code`` is not a :class:`CompletionCode`.
        """
        self._refuse_parked_from(self._hosted(row), 0, code)

    def parked_count(self, row: int) -> int:
        """How many parked entries wait for the high watermark of the partition at
        ``row`` to cover their batches (not those it covers already, parked behind
        another's in their ring).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        return int(_parked_count(self.rings, self._parked, self.row_settings,
                                 self._hosted(row)))

    def _refuse_parked_from(self, row: int, first_offset: int, code: CompletionCode) -> None:
        if not isinstance(code, CompletionCode):
            raise LocalProtocolError(f"a refusal's code must be a CompletionCode, got {code!r}")
        _refuse_parked_from(self.rings, self._parked, row, first_offset, -code.value)
        self._complete_parked()

    def _complete_parked(self) -> None:
        _complete_parked(self._ring_words, self._ring_completions, self.rings, self._parked,
                         self.row_settings)

    # -- rings -----------------------------------------------------------------------
    def add_ring(self, ring: Ring, *, awaits_high_watermark: bool = False) -> int:
        """Start draining ``ring`` (from where its consumer left off); its index. A
        slot freed by :meth:`remove_ring` is reused, so the table is as long as the
        most rings ever drained at once. With ``awaits_high_watermark`` (a producer
        with acks=all) an entry completes once the high watermark covers its batch,
        not when it is appended (see the module's rules)."""
        if None in self._rings:
            index = self._rings.index(None)
            self._rings[index] = ring
            typed.set_item(self._ring_words, index, ring.words)
            typed.set_item(self._ring_completions, index, ring.completions)
            typed.set_item(self._ring_data, index, ring.data)
        else:
            index = len(self._rings)
            self._rings.append(ring)
            typed.append_item(self._ring_words, ring.words)
            typed.append_item(self._ring_completions, ring.completions)
            typed.append_item(self._ring_data, ring.data)
            self.rings = np.concatenate([self.rings, np.zeros((1, RING_COLUMNS), np.int64)])
            self._parked = np.concatenate(
                [self._parked, np.zeros((1,) + self._parked.shape[1:], np.int64)])
        self.rings[index, RING_CAPACITY] = ring.capacity
        self.rings[index, RING_HEAD] = ring.consumer_head
        self.rings[index, RING_ACTIVE] = 1
        self.rings[index, RING_AWAITS_HIGH_WATERMARK] = int(awaits_high_watermark)
        self.rings[index, RING_PARKED_FIRST] = self.rings[index, RING_PARKED_COUNT] = 0
        return index

    def set_awaits_high_watermark(self, index: int, awaits_high_watermark: bool) -> None:
        """Whether the entries of the ring at ``index`` complete once the high
        watermark covers their batches (acks=all) or once appended, from its next
        entry on (a producer registers again, saying its acks, with a broker that
        adopted its ring not knowing them). Completions stay in ring order: an
        entry behind a parked one waits for it either way."""
        if not 0 <= index < len(self._rings) or self._rings[index] is None:
            raise LocalProtocolError(f"ring index {index!r} is not being drained")
        self.rings[index, RING_AWAITS_HIGH_WATERMARK] = int(bool(awaits_high_watermark))

    def awaits_high_watermark(self, index: int) -> bool:
        """Whether the entries of the ring at ``index`` wait for the high watermark
        (see :meth:`set_awaits_high_watermark`)."""
        if not 0 <= index < len(self._rings) or self._rings[index] is None:
            raise LocalProtocolError(f"ring index {index!r} is not being drained")
        return bool(self.rings[index, RING_AWAITS_HIGH_WATERMARK])

    def remove_ring(self, index: int) -> None:
        """Stop draining a ring and unmap it: the compiled loop's lists drop their
        views of it first (a view keeps a mapping alive). Its slot is free for the
        next ring. Removing a removed ring does nothing. Its parked completions go
        with it: its producer is gone, or its ring poisoned."""
        ring = self._rings[index]
        if ring is None:
            return
        self.rings[index, RING_ACTIVE] = 0
        self.rings[index, RING_PARKED_COUNT] = 0
        self._rings[index] = None
        typed.set_item(self._ring_words, index, _EMPTY_WORDS)
        typed.set_item(self._ring_completions, index, _EMPTY_WORDS)
        typed.set_item(self._ring_data, index, _EMPTY_BYTES)
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
                            self.rings, self._parked, self._logs, self._offset_indexes,
                            self._time_indexes, self._segment_states, self.row_settings,
                            self.table.rows, self.appended, self._touched, self._sequences,
                            self._cursor, entries_max - handled, self._report)
            handled += int(self._report[_REPORT_FINISHED])
            if self._touched[0]:
                self._appended_rows.update(
                    dict.fromkeys(self._touched[1:1 + self._touched[0]].tolist()))
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
            self._partitions[row].appended_by_kernel(self._targets[row], int(self.appended[row]),
                                                     int(self.row_settings[row, ROW_LEADER_EPOCH]))
            self.appended[row] = 0
        self._touched[0] = 0

    def _append_slowly(self, ring: int, position: int, length: int) -> None:
        """One entry the compiled loop handed over: append it through the log of the
        partition its identity names (whatever its row says), or refuse it; then
        finish it as the loop does. The row is published before the entry completes,
        so no producer hears of an offset the table does not show yet."""
        source = self._rings[ring]
        # A private copy: the producer cannot change what is validated and appended.
        batch = source.data[position + R.ENTRY_HEADER_LENGTH:position + length].copy()
        _, _, _, _, entry_topic_key, entry_partition, number, head = next_entry(
            source.words, source.data, source.capacity, int(self.rings[ring, RING_HEAD]))
        row = self._rows_by_identity.get((int(entry_topic_key), int(entry_partition)))
        refusal = self._refusal(ring, row)
        if refusal is CompletionCode.NOT_LEADER_OR_FOLLOWER and self._forward is not None:
            refusal = self._forwarded(ring, number, head, row, batch)
            if refusal is None:
                return
        if refusal is not None:
            row, result, append_time, last_offset = -1, -refusal, -1, -1
        else:
            # The log's listener refreshed the row (and published it) on the append.
            result, append_time, last_offset = self._append_batch(row, batch)
        _finish(source.words, source.completions, self.rings, self._parked, self.row_settings,
                ring, number, result, append_time, row, last_offset, head)

    def _forwarded(self, ring: int, number: int, head: int, row: int,
                   batch: np.ndarray) -> int | None:
        """Hand an entry bound for a partition another broker leads to the forwarder
        (its completion parked as external, its space released), or why it is
        refused here: what the leader would refuse for its bytes alone is refused
        at once, with the code the compiled loop gives (the leader checks again)."""
        status, batch_length = check_batch(batch, 0, batch.size, True, True)
        if status != 0:
            return int(status)
        if batch_length != batch.size:
            return CompletionCode.NOT_ONE_BATCH
        if batch.size > self.row_settings[row, ROW_BATCH_SIZE_MAX]:
            return CompletionCode.RECORD_TOO_LARGE
        source = self._rings[ring]
        self._forward(ForwardedEntry(
            ring, source, number, row, int(self.row_settings[row, ROW_TOPIC_KEY]),
            int(self.row_settings[row, ROW_PARTITION]), batch,
            bool(self.rings[ring, RING_AWAITS_HIGH_WATERMARK])))
        _park_forwarded(source.words, self.rings, self._parked, ring, number, head)
        return None

    def set_forwarder(self, forward: Callable[[ForwardedEntry], None] | None) -> None:
        """Who takes the entries bound for partitions this broker does not lead
        (:meth:`set_is_leader`): ``forward`` is called (on the draining thread) with
        each such entry's :class:`ForwardedEntry` whose batch passed the checks that
        need no partition state; the entry's space is released at once and its
        completion waits, in ring order, for :meth:`resolve_forwarded`. None (the
        default: a single broker) refuses them with ``NOT_LEADER_OR_FOLLOWER``."""
        self._forward = forward

    def resolve_forwarded(self, ring: int, number: int, result: int, append_time: int) -> bool:
        """Complete the forwarded entry ``number`` of the ring at ``ring`` with
        ``result`` (the leader's base offset, or ``-CompletionCode``) and
        ``append_time`` (the leader's LogAppendTime stamp, -1: none). Completions
        stay in ring order: it is stored once every entry before it in its ring
        has been, and the entries parked behind it follow as far as they may.

        Returns
        -------
        bool
            False when no forwarded entry of that number waits in that ring (its
            ring was removed, or it was resolved already): nothing changes.
        """
        if not 0 <= ring < len(self._rings) or self._rings[ring] is None:
            return False
        if not _resolve_forwarded(self.rings, self._parked, ring, int(number), int(result),
                                  int(append_time)):
            return False
        self._complete_parked()
        return True

    def ring_at(self, index: int) -> Ring | None:
        """The ring drained at ``index``, or None (a free slot, or no such index)."""
        return self._rings[index] if 0 <= index < len(self._rings) else None

    def _refusal(self, ring: int, row: int | None) -> CompletionCode | None:
        """Why the slow path refuses an entry of ``ring`` bound for ``row`` (None: the
        identity names no hosted partition) before looking at its batch, or None;
        the same checks as the compiled loop's _row_takes and _admit."""
        if row is None:
            return CompletionCode.UNKNOWN_PARTITION
        settings = self.row_settings[row]
        if settings[ROW_INTERNAL]:
            return CompletionCode.INTERNAL_TOPIC
        if settings[ROW_NOT_LEADER]:
            return CompletionCode.NOT_LEADER_OR_FOLLOWER
        if self.rings[ring, RING_AWAITS_HIGH_WATERMARK] and settings[ROW_FENCED]:
            return CompletionCode.NOT_LEADER_OR_FOLLOWER
        if self.rings[ring, RING_AWAITS_HIGH_WATERMARK] and settings[ROW_UNDER_MIN_ISR]:
            return CompletionCode.NOT_ENOUGH_REPLICAS
        return None

    def append(self, row: int, batch) -> tuple[int, int]:
        """Append one batch the broker writes itself (offset commits) to the partition
        at ``row`` as the drain appends a producer's: its sequence checked, stamped
        with the row's leader epoch, its row published by its high-watermark policy.

        Returns
        -------
        (int, int)
            The completion result (the base offset, or ``-CompletionCode``) and the
            broker's append time (-1 unless the topic stamps LogAppendTime).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        source = batch if isinstance(batch, np.ndarray) else np.frombuffer(batch, np.uint8)
        if self.row_settings[self._hosted(row), ROW_NOT_LEADER]:
            return -CompletionCode.NOT_LEADER_OR_FOLLOWER, -1
        result, append_time, _ = self._append_batch(row, source)
        return result, append_time

    def append_replicated(self, row: int, batches) -> tuple[int, int]:
        """Append a leader's batches to the follower partition at ``row`` as they are
        (``PartitionLog.append_as_follower``: offsets, epochs and timestamps kept),
        through this appender as any append goes: the row is published (its log
        end; the high watermark stays where :meth:`advance_high_watermark` put it),
        and the partition is among those :meth:`take_appended` gives. Each
        producer's last batch is remembered without checking its sequence (Kafka
        checks sequences only for a client's appends, ``origin == Client``), so a
        producer's re-send to this replica once it leads is found a duplicate.

        Returns
        -------
        (int, int)
            The first batch's base offset and the last batch's last offset.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            The partition's high watermark follows its log end: a follower's must
            be ``EXTERNAL`` (:meth:`set_high_watermark_policy`), or its consumers
            would read what is not committed.
        CorruptRecordError, RecordTooLargeError, StorageError
            As ``PartitionLog.append_as_follower`` (its subclasses
            ``UnexpectedAppendOffsetError`` and ``OffsetsOutOfOrderError``
            included); nothing of a refused append is remembered.
        """
        settings = self.row_settings[self._hosted(row)]
        if settings[ROW_HIGH_WATERMARK_POLICY] != HighWatermarkPolicy.EXTERNAL:
            raise LocalProtocolError(f"row {row}: a follower's high watermark comes from its "
                                     f"leader; set_high_watermark_policy(row, EXTERNAL) first")
        source = batches if isinstance(batches, np.ndarray) else np.frombuffer(batches, np.uint8)
        try:
            # The log's listener refreshes and publishes the row.
            appended = self._partitions[row].append_as_follower(source)
        except StorageError:
            # Batches before the one that failed may be in: remember from the log.
            self.rebuild_producer_state(row)
            raise
        # The bytes were validated whole: every batch of them is in the log now.
        _rebuild_sequences(source, source.size, row, self._sequences)
        self._appended_rows[row] = None
        return appended.base_offset, appended.last_offset

    def rebuild_producer_state(self, row: int) -> None:
        """Forget what is remembered of the producers of the partition at ``row`` and
        remember it again from its log (after a truncation removed batches: a
        forgotten batch's re-send must be appended again, not acknowledged with
        an offset the log no longer holds).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        _forget_sequences(self._sequences, self._hosted(row))
        self._remember_log(row)

    def _remember_log(self, row: int) -> None:
        """Remember the last batch of each producer in the partition's log, in every
        segment (``producer_snapshots``), not the active one alone: a producer whose
        last batch sits in an older segment would be forgotten, and its re-send
        appended twice."""
        _remember_producers(self._sequences, row, self._partitions[row].producer_batches())

    def _append_batch(self, row: int, batch: np.ndarray) -> tuple[int, int, int]:
        """Append one batch through the partition's log, unless its sequence says it
        is a duplicate or out of order: (completion result, broker append time, last
        offset of the batch the result names or -1)."""
        partition_log = self._partitions[row]
        header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0] \
            if batch.size >= B.HEADER_LENGTH else None
        producer_id = int(header["producer_id"]) if header is not None else -1
        producer_epoch = int(header["producer_epoch"]) if header is not None else -1
        base_sequence = int(header["base_sequence"]) if header is not None else -1
        verdict, duplicate_offset = _check_sequence(self._sequences, row, producer_id,
                                                    producer_epoch, base_sequence)
        if verdict == _SEQUENCE_DUPLICATE:
            return (int(duplicate_offset), -1,
                    int(duplicate_offset) + int(header["last_offset_delta"]))
        if verdict != _SEQUENCE_NEW:
            return int(_sequence_refusal(verdict)), -1, -1
        try:
            appended = partition_log.append(
                batch, leader_epoch=int(self.row_settings[row, ROW_LEADER_EPOCH]))
        except CorruptRecordError as error:
            return -(error.status or CompletionCode.NOT_ONE_BATCH), -1, -1
        except RecordTooLargeError:
            return -CompletionCode.RECORD_TOO_LARGE, -1, -1
        except StorageError:
            log.exception("append to %s failed", partition_log.directory)
            return -CompletionCode.STORAGE_ERROR, -1, -1
        _remember_sequence(self._sequences, row, producer_id, producer_epoch, base_sequence,
                           appended.base_offset, appended.last_offset - appended.base_offset + 1)
        self._appended_rows[row] = None
        return appended.base_offset, appended.log_append_time, appended.last_offset

    def _poison(self, ring: int, position: int, length: int) -> None:
        source = self._rings[ring]
        error = CorruptRingError(f"ring {source.name!r}: no valid entry at byte {position} "
                                 f"(length field {length}); it is no longer read",
                                 name=source.name, position=position)
        log.warning("%s", error)
        py_store_release(source.words, R.CONSUMER_ERROR_WORD, int(CompletionCode.NOT_ONE_BATCH))
        self.remove_ring(ring)

