"""The compiled loop that drains every producer's ring into the partition logs.

Rules
-----
* The loop never raises and never calls Python: what it cannot finish in compiled
  code it hands back (``DRAIN_SLOW``, ``DRAIN_POISON``) with the entry's place in
  the report, and Python calls it again.
* Every ring word it reads is input, checked before use (``ring_layout``'s table of
  words): a bad one poisons that ring (``DRAIN_POISON``), never the loop.
* It reads a ring's entries only after their tail is published (``ring.next_entry``),
  checks a batch's header, bounds and codec in the ring, and its CRC and records on
  the copy in the log (``segments.append_batches``), where the producer can no
  longer change them.
* An entry is appended here only to the partition at its row, and only if that row
  is the partition its identity (topic key, partition) names, registered, not
  internal and led by this broker (:func:`_row_takes`); otherwise Python finds the
  partition by the identity, or refuses the entry.
* The row is published (:func:`publish_offsets`, high watermark last) after each
  batch, before the batch's completion is stored, so no producer hears of an offset
  the state table does not show yet. The journal of changed rows names it then too
  (``state.publish_row``), and its sequence is stored every
  ``JOURNAL_UNFLUSHED_MAX`` publishes and before the loop returns, so consumers
  following the journal learn of it within that many batches, and before the
  broker rings their doorbell.
* Per-record work never happens in Python: every entry on the common path (one
  uncompressed batch for a CreateTime partition) is finished here.

Theory of operation
-------------------
:func:`drain_rings` visits the rings round-robin, one entry per ring per round, and
takes each entry through the appender's rules, one kernel each: :func:`_row_takes`
(the entry's identity is its row's, and producers may write it), :func:`_admit` (the
batch's header and size, its producer's sequence, and its transaction
(``transactions``): the entry is either finished with a result there, or to be
appended), and for an uncompressed batch bound for a
CreateTime partition :func:`_append_fast` (copy it into the active segment through
``segments.append_batches``, check the copy, remember its sequence, publish the row).
Every entry ends in ``completions.finish_entry``, which completes (or parks) it and
hands its space back. Anything the loop cannot finish - a zstd batch (its records are
checked after inflating), a topic that stamps LogAppendTime or recompresses, a
segment that must roll or needs space reserved, an entry whose identity is not its
row's, the first batch of a transaction in its partition - it stops at
(``DRAIN_SLOW``): the appender's slow path appends that one entry through
``PartitionLog.append`` (or refuses it), finishes it through the same
``finish_entry`` and calls the loop again.

The rows the loop appended to are listed in ``touched`` (a count, then the rows) and
the offsets it appended to each in ``appended``, so the appender tells the partition
logs of their appends once per call, not per entry.
"""

from __future__ import annotations

import numpy as np

from ...native.jit import kernel, load_i16, load_i32, load_i64, load_u16
from ...record import batch_layout as B
from ...record.records import check_batch
from ...ring import ENTRY_CORRUPT, ENTRY_NONE, next_entry
from ...segments import append_batches
from ...shm import ring_layout as R
from ...shm.completion import CompletionCode
from ...shm.state import journal_flush, publish_row
from ...storage.segment_state import (
    APPENDED,
    BASE_OFFSET_WORD,
    NEXT_OFFSET_WORD,
    POSITION_WORD,
    REJECTED,
    TIMESTAMP_NONE,
)
from .completions import finish_entry
from .layout import (
    DRAIN_BUDGET,
    DRAIN_IDLE,
    DRAIN_POISON,
    DRAIN_SLOW,
    PARKED_COMPLETIONS_MAX,
    PER_ENTRY_INLINE,
    REPORT_FINISHED,
    RING_ACTIVE,
    RING_AWAITS_HIGH_WATERMARK,
    RING_CAPACITY,
    RING_HEAD,
    RING_PARKED_COUNT,
    ROW_ABORTED_GENERATION,
    ROW_BATCH_SIZE_MAX,
    ROW_FAST,
    ROW_FENCED,
    ROW_FIRST_UNSTABLE_OFFSET,
    ROW_GENERATION,
    ROW_HIGH_WATERMARK,
    ROW_HIGH_WATERMARK_POLICY,
    ROW_INDEX_INTERVAL,
    ROW_INTERNAL,
    ROW_LEADER_EPOCH,
    ROW_LOG_START_OFFSET,
    ROW_NOT_LEADER,
    ROW_PARTITION,
    ROW_REGISTERED,
    ROW_SEGMENT_BYTES,
    ROW_SEGMENT_MS,
    ROW_TOPIC_KEY,
    ROW_UNDER_MIN_ISR,
    HighWatermarkPolicy,
)
from .producer_state import (
    SEQUENCE_DUPLICATE,
    SEQUENCE_NEW,
    check_sequence,
    remember_sequence,
    sequence_refusal,
)
from .transactions import TXN_BEGINS, held, transaction_verdict

__all__ = ["drain_rings", "publish_offsets", "last_stable_offset"]

# what an entry's admission (and its compiled append) decides
_COMPLETE = 0                  # finish it with the result given
_APPEND = 1                    # append it in compiled code
_TO_PYTHON = 2                 # the slow path appends or refuses it


@kernel(inline=PER_ENTRY_INLINE)
def publish_offsets(state_rows, journal, row_settings, row, state):
    """Publish the row from its active segment's state: the log end, and the high
    watermark its policy gives (stored last, release: see ``publish_row``), and name
    it in the journal (``journal``: the table's control area; the caller flushes)."""
    if row_settings[row, ROW_HIGH_WATERMARK_POLICY] == HighWatermarkPolicy.LOG_END.value:
        row_settings[row, ROW_HIGH_WATERMARK] = state[NEXT_OFFSET_WORD]
    high_watermark = row_settings[row, ROW_HIGH_WATERMARK]
    publish_row(state_rows, journal, row, row_settings[row, ROW_LOG_START_OFFSET],
                state[NEXT_OFFSET_WORD], high_watermark, state[BASE_OFFSET_WORD],
                state[POSITION_WORD], row_settings[row, ROW_GENERATION],
                last_stable_offset(row_settings[row, ROW_FIRST_UNSTABLE_OFFSET], high_watermark,
                                   row_settings[row, ROW_LOG_START_OFFSET]),
                row_settings[row, ROW_ABORTED_GENERATION])


@kernel(inline="always")
def last_stable_offset(first_unstable_offset, high_watermark, log_start_offset):
    """Kafka's LSO: the first offset of the oldest open transaction, never above the
    high watermark (which it is when no transaction is open, -1) nor below the log
    start (retention may remove a long-open transaction's first records: Kafka
    bounds its first unstable offset so)."""
    if 0 <= first_unstable_offset < high_watermark:
        return max(first_unstable_offset, min(log_start_offset, high_watermark))
    return high_watermark


@kernel(inline=PER_ENTRY_INLINE)
def _row_takes(row_settings, row, entry_topic_key, entry_partition):
    """Whether the entry's row is the partition its identity names, and one producers
    may write (else Python finds the partition by the identity, or refuses)."""
    return (row < row_settings.shape[0] and row_settings[row, ROW_REGISTERED] != 0
            and row_settings[row, ROW_TOPIC_KEY] == entry_topic_key
            and row_settings[row, ROW_PARTITION] == entry_partition
            and row_settings[row, ROW_INTERNAL] == 0 and row_settings[row, ROW_NOT_LEADER] == 0)


@kernel(inline=PER_ENTRY_INLINE)
def _admit(data, start, end, row_settings, row, sequences, transactions,
           awaits_high_watermark):
    """What becomes of the batch ``data[start:end]`` bound for ``row``: (action,
    completion result, last offset it names). _COMPLETE with the result when it is
    refused (too few in-sync replicas for acks=all, header, size, a control batch,
    its transaction, sequence) or a duplicate; _APPEND when the compiled loop
    appends it; _TO_PYTHON when it is compressed, its topic needs the slow path, or
    it opens its transaction in the partition (``transactions``).

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
    attributes = load_u16(data, start + B.ATTRIBUTES_OFFSET)
    if attributes & B.CONTROL_BIT:
        return _COMPLETE, -CompletionCode.CONTROL_FROM_PRODUCER.value, -1
    producer_id = load_i64(data, start + B.PRODUCER_ID_OFFSET)
    if attributes & B.TRANSACTIONAL_BIT and held(transactions, row, producer_id):
        return _TO_PYTHON, 0, -1              # behind a batch held for its coordinator
    producer_epoch = np.int64(load_i16(data, start + B.PRODUCER_EPOCH_OFFSET))
    last_offset_delta = np.int64(load_i32(data, start + B.LAST_OFFSET_DELTA_OFFSET))
    verdict, duplicate_offset = check_sequence(
        sequences, row, producer_id, producer_epoch,
        np.int64(load_i32(data, start + B.BASE_SEQUENCE_OFFSET)), last_offset_delta)
    if verdict == SEQUENCE_DUPLICATE:
        # Acknowledged with the original's offsets (so once they are committed).
        return _COMPLETE, duplicate_offset, duplicate_offset + last_offset_delta
    if verdict != SEQUENCE_NEW:
        return _COMPLETE, sequence_refusal(verdict), -1
    transaction = transaction_verdict(transactions, row_settings, row, producer_id,
                                      producer_epoch, attributes & B.TRANSACTIONAL_BIT != 0)
    if transaction < 0:
        return _COMPLETE, transaction, -1
    codec = attributes & B.CODEC_MASK
    if codec != B.CODEC_NONE or not row_settings[row, ROW_FAST] or transaction >= TXN_BEGINS:
        return _TO_PYTHON, 0, -1
    return _APPEND, 0, -1


@kernel(inline=PER_ENTRY_INLINE)
def _append_fast(data, start, end, log, offset_index, time_index, state, row_settings, row,
                 state_rows, journal, sequences, appended, touched):
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
    remember_sequence(sequences, row, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                      np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                      np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                      base_offset, next_offset - base_offset)
    publish_offsets(state_rows, journal, row_settings, row, state)   # the batch is in the segment
    return _COMPLETE, base_offset, next_offset - 1


@kernel
def _stop(report, finished, ring, position, length):
    """Leave the loop at an entry Python must see: where it is, and what was done."""
    report[0], report[1], report[2] = ring, position, length
    report[REPORT_FINISHED] = finished


@kernel
def drain_rings(ring_words, ring_completions, ring_data, rings, parked, logs, offset_indexes,
                time_indexes, segment_states, row_settings, state_rows, journal, appended,
                touched, sequences, transactions, cursor, entries_max, report):
    """The compiled loop (see the module's theory): rings round-robin from
    ``cursor``, each entry through _row_takes, _admit, _append_fast and finish_entry,
    until every ring is empty (DRAIN_IDLE), about ``entries_max`` entries are finished
    (DRAIN_BUDGET), or an entry is Python's (DRAIN_SLOW) or garbage (DRAIN_POISON);
    ``report`` says where, and how many entries were finished. The journal's
    sequence is stored before it returns (``journal``: the table's control area)."""
    status = _drain(ring_words, ring_completions, ring_data, rings, parked, logs,
                    offset_indexes, time_indexes, segment_states, row_settings, state_rows,
                    journal, appended, touched, sequences, transactions, cursor, entries_max,
                    report)
    journal_flush(journal)
    return status


@kernel(inline=PER_ENTRY_INLINE)
def _drain(ring_words, ring_completions, ring_data, rings, parked, logs, offset_indexes,
           time_indexes, segment_states, row_settings, state_rows, journal, appended, touched,
           sequences, transactions, cursor, entries_max, report):
    """drain_rings' loop, which returns at the entry that ends it."""
    report[REPORT_FINISHED] = 0
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
                return DRAIN_POISON
            progress = True
            start, end = position + R.ENTRY_HEADER_LENGTH, position + length
            action, result, last_offset = _TO_PYTHON, 0, -1
            if _row_takes(row_settings, row, entry_topic_key, entry_partition):
                action, result, last_offset = _admit(data, start, end, row_settings, row,
                                                     sequences, transactions,
                                                     rings[ring, RING_AWAITS_HIGH_WATERMARK])
            if action == _APPEND:
                action, result, last_offset = _append_fast(
                    data, start, end, logs[row], offset_indexes[row], time_indexes[row],
                    segment_states[row], row_settings, row, state_rows, journal, sequences,
                    appended, touched)
            if action == _TO_PYTHON:
                _stop(report, finished, ring, position, length)
                cursor[0] = ring
                return DRAIN_SLOW
            finish_entry(words, ring_completions[ring], rings, parked, row_settings, ring,
                         number, result, -1, row, last_offset, head)
            finished += 1
        report[REPORT_FINISHED] = finished
        if not progress:
            return DRAIN_IDLE
        if finished >= entries_max:
            cursor[0] = (cursor[0] + 1) % ring_count
            return DRAIN_BUDGET
