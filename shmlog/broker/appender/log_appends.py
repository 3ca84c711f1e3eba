"""The log side of the appender: appends made in Python through a partition's log, and
what every append leaves behind (producer state, the partitions appended to).

Rules
-----
* A leader's append in Python (the slow path's, the broker's own) goes through
  :meth:`LogAppends.append_batch` as the compiled loop's does: its producer's
  sequence checked first (a duplicate is acknowledged with the original's offsets,
  a refused batch changes nothing), then ``PartitionLog.append`` stamped with the
  row's leader epoch (as Kafka's leader stamps ``partitionLeaderEpoch``), then its
  sequence remembered. An error of the log is a completion code, never an exception.
* A follower's append (:meth:`LogAppends.append_replicated`) keeps the leader's
  offsets, epochs and timestamps and is remembered unchecked (Kafka checks sequences
  only for a client's appends, ``origin == Client``).
* The partition's log publishes its row itself (its listener, ``PartitionRows.refresh``)
  on an append outside the compiled loop, so a completion stored after the append
  never names an offset the state table does not show.
* Every partition appended to, by any path, is remembered until
  :meth:`LogAppends.take_appended` takes it: replication answers waiting follower
  fetches from it.
* An append the log refuses (``StorageError``: a full disk, an I/O error, a limit)
  is counted (:attr:`RefusalLog.count`, the stats' ``appends_refused_storage``) and
  logged without a traceback: one line at the first refusal, then one line per
  :data:`limits.APPEND_REFUSAL_LOG_INTERVAL_S` at most, saying how many were refused
  since (a full disk refuses every batch; a line each flooded the log).

Theory of operation
-------------------
The compiled loop tallies its appends per row (``appended``: the offsets it appended,
``touched``: a count, then the rows it appended to, each once); after each call
:meth:`LogAppends.note_compiled_appends` gives the logs their append targets back
(``PartitionLog.appended_by_kernel``) and remembers the rows, with no work per entry.
The producer state is rebuilt from the whole log when a partition is registered and
after a truncation (:meth:`LogAppends.rebuild_producer_state`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from ...common import limits
from ...common.errors import (
    CorruptRecordError,
    RecordTooLargeError,
    ResourceLimitError,
    StorageError,
)
from ...record import batch_layout as B
from ...record.batch_header import offset_span
from ...record.control import ControlType, EndTransactionMarker, encode_marker
from ...shm.completion import CompletionCode
from .layout import ROW_ABORTED_GENERATION, ROW_FIRST_UNSTABLE_OFFSET, ROW_LEADER_EPOCH
from .partition_rows import PartitionRows
from .producer_state import (
    SEQUENCE_DUPLICATE,
    SEQUENCE_NEW,
    ProducerStateTable,
    sequence_refusal,
)
from .transactions import TXN_BEGINS, TXN_VERIFY, TransactionTable

log = logging.getLogger("shmlog.broker.appender")     # the appender's log, joined by its parts

__all__ = ["LogAppends", "RefusalLog"]


class LogAppends:
    """Appends in Python to the partitions of ``rows``, and the producer state and
    the partitions appended to that every append updates (see the module's rules)."""

    def __init__(self, rows: PartitionRows):
        self.rows = rows
        self.producer_states = ProducerStateTable()
        self.transactions = TransactionTable()
        # verifier(topic, partition, producer id, epoch) -> whether the coordinator added
        # the partition to the producer's transaction (None: nobody verifies).
        self.verifier = None
        capacity = rows.settings.shape[0]
        # The compiled loop's tally: offsets appended per row, and the rows appended
        # to (a count, then the rows).
        self.appended = np.zeros(capacity, np.int64)
        self.touched = np.zeros(capacity + 1, np.int64)
        # Rows appended to since take_appended last took them (a dict: ordered, unique).
        self._appended_rows: dict[int, None] = {}
        self.refusals = RefusalLog()

    def note_compiled_appends(self) -> None:
        """Give the logs the compiled loop appended to their targets back, and
        remember those partitions as appended to."""
        if not self.touched[0]:
            return
        rows = self.touched[1:1 + self.touched[0]].tolist()
        self._appended_rows.update(dict.fromkeys(rows))
        for row in rows:
            self.rows.partition_log(row).appended_by_kernel(
                self.rows.target(row), int(self.appended[row]),
                int(self.rows.settings[row, ROW_LEADER_EPOCH]))
            self.appended[row] = 0
        self.touched[0] = 0

    def take_appended(self) -> list[tuple[int, int]]:
        """The partitions appended to since the last call, as (row, log end offset
        now), in the order first appended to; each once."""
        rows, self._appended_rows = self._appended_rows, {}
        return [(row, self.rows.partition_log(row).log_end_offset) for row in rows]

    def forget(self, row: int) -> None:
        """Forget the partition at ``row`` (it is no longer hosted): its producers, and
        that it was appended to."""
        self._appended_rows.pop(row, None)
        self.producer_states.forget(row)
        self.transactions.forget(self.rows.settings, row)

    def append_batch(self, row: int, batch: np.ndarray, *,
                     sequenced: bool = True) -> tuple[int, int, int]:
        """Append one batch through the partition's log, unless its sequence says it
        is a duplicate or out of order: (completion result, broker append time, last
        offset of the batch the result names or -1). ``batch`` may be one Kafka
        client's batch stored in pieces (``kafka_batches.from_kafka``): checked and
        remembered as the one batch its client sent. A batch not ``sequenced`` (a
        coordinator's, under a producer's id: a transaction's offsets) is neither
        checked nor remembered by sequence; its transaction is checked all the same."""
        partition_log = self.rows.partition_log(row)
        header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0] \
            if batch.size >= B.HEADER_LENGTH else None
        producer_id = int(header["producer_id"]) if header is not None else -1
        producer_epoch = int(header["producer_epoch"]) if header is not None else -1
        base_sequence = int(header["base_sequence"]) if header is not None else -1
        if header is not None and header["attributes"] & B.TRANSACTIONAL_BIT \
                and self.transactions.held(row, producer_id):
            # Behind a batch of its producer held for the coordinator: held too, its
            # sequence checked once that one is in.
            return -CompletionCode.TRANSACTION_VERIFYING, -1, -1
        # A Kafka client's batch stored in pieces is checked as the client sent it:
        # its first sequence, and the last of its last piece (its sequences run on).
        span = offset_span(batch) if header is not None else 0
        last_offset_delta = span - 1 if span else \
            (int(header["last_offset_delta"]) if header is not None else 0)
        verdict, duplicate_offset = self.producer_states.check(
            row, producer_id, producer_epoch, base_sequence, last_offset_delta) \
            if sequenced else (SEQUENCE_NEW, -1)
        if verdict == SEQUENCE_DUPLICATE:
            return int(duplicate_offset), -1, int(duplicate_offset) + last_offset_delta
        if verdict != SEQUENCE_NEW:
            return int(sequence_refusal(verdict)), -1, -1
        settings = self.rows.settings
        transactional = header is not None and bool(header["attributes"] & B.TRANSACTIONAL_BIT)
        transaction = self.transactions.verdict(settings, row, producer_id, producer_epoch,
                                                transactional)
        if transaction == TXN_VERIFY:
            transaction = self._verified(row, producer_id, producer_epoch)
        if transaction < 0:
            return transaction, -1, -1
        if transaction == TXN_BEGINS:
            # Open before the append publishes the row: the last stable offset stays
            # below the transaction's first batch.
            self.transactions.begin(settings, row, producer_id, producer_epoch,
                                    partition_log.log_end_offset)
        result = self._append(row, partition_log, batch)
        if isinstance(result, int):
            if transaction == TXN_BEGINS:          # nothing of it is in the log: not begun
                self.transactions.end(settings, row, producer_id)
                self.transactions.expect(row, producer_id, producer_epoch)
                self.rows.refresh(row)
            return result, -1, -1
        appended = result
        if sequenced:
            self._remember(row, producer_id, producer_epoch, base_sequence, appended)
        self._appended_rows[row] = None
        return appended.base_offset, appended.log_append_time, appended.last_offset

    def _remember(self, row, producer_id, producer_epoch, base_sequence, appended) -> None:
        self.producer_states.remember(row, producer_id, producer_epoch, base_sequence,
                                      appended.base_offset,
                                      appended.last_offset - appended.base_offset + 1)

    def _append(self, row: int, partition_log, batch: np.ndarray):
        """``PartitionLog.append`` stamped with the row's leader epoch: its
        ``AppendResult``, or the completion result (an int) of the log's refusal."""
        try:
            return partition_log.append(
                batch, leader_epoch=int(self.rows.settings[row, ROW_LEADER_EPOCH]))
        except CorruptRecordError as error:
            return -(error.status or CompletionCode.NOT_ONE_BATCH)
        except RecordTooLargeError:
            return -CompletionCode.RECORD_TOO_LARGE
        except ResourceLimitError as error:
            self.refusals.refused(partition_log.directory, error)
            return -CompletionCode.RESOURCE_LIMIT
        except StorageError as error:
            self.refusals.refused(partition_log.directory, error)
            return -CompletionCode.STORAGE_ERROR

    # -- transactions ------------------------------------------------------------------
    def _verified(self, row: int, producer_id: int, producer_epoch: int) -> int:
        """The verdict on a transactional batch its partition expects under no entry
        for its epoch: ``TXN_BEGINS`` when the verifier (the coordinator) adds the
        partition to the producer's transaction at that epoch, else the refusal it
        gives (``INVALID_TXN_STATE`` with no verifier)."""
        if self.verifier is None:
            return -CompletionCode.INVALID_TXN_STATE
        refusal = self.verifier(*self.rows.name_of(row), producer_id, producer_epoch)
        if refusal is CompletionCode.TRANSACTION_VERIFYING:
            self.transactions.hold(row, producer_id, producer_epoch)
        if refusal is not None:
            return -refusal
        transaction = self.transactions.verdict(self.rows.settings, row, producer_id,
                                                producer_epoch, True)
        return transaction if transaction == TXN_BEGINS else -CompletionCode.INVALID_TXN_STATE

    def expect_transaction(self, row: int, producer_id: int, producer_epoch: int) -> bool:
        """The coordinator added the partition at ``row`` to the producer's transaction:
        :meth:`TransactionTable.expect`."""
        return self.transactions.expect(self.rows.hosted(row), producer_id, producer_epoch)

    def verified(self, row: int, producer_id: int, producer_epoch: int,
                 added: bool) -> bool:
        """The verification of the producer's batches held for the partition at ``row``
        ended: the partition is in its transaction at ``producer_epoch`` (``added``,
        expected from now on), or not. Whether it is expected now."""
        if added:
            return self.expect_transaction(row, producer_id, producer_epoch)
        self.transactions.release(row, producer_id)
        return False

    def write_marker(self, row: int, marker: EndTransactionMarker) -> int:
        """Append the end-transaction ``marker`` to the partition at ``row`` (the
        coordinator's, Kafka's WriteTxnMarkers), end its producer's transaction there,
        remember an aborted one in the partition's ``.txnindex``, and publish the row:
        the completion result (the marker's offset, or ``-CompletionCode``).

        A marker needs no open transaction (the coordinator writes one to every
        partition it added, written to or not), and fences the producer's older
        epochs in the partition (Kafka's ``appendEndTxnMarker``)."""
        partition_log = self.rows.partition_log(row)
        # Decided: no batch of the producer joins the transaction any more, whether
        # or not this marker goes in now (the coordinator retries one that failed).
        self.transactions.ending(row, marker.producer_id)
        result = self._append(row, partition_log, encode_marker(marker))
        if isinstance(result, int):
            return result
        marker_offset = result.base_offset
        self.producer_states.fence(row, marker.producer_id, marker.producer_epoch)
        first_offset = self.transactions.first_offset(row, marker.producer_id)
        if not marker.committed and first_offset >= 0:
            # Indexed before the transaction ends: a failed index write leaves it
            # open (the last stable offset below it), and the retried marker ends it.
            try:
                self._index_aborted(row, partition_log, marker.producer_id, first_offset,
                                    marker_offset)
            except StorageError as error:
                self.refusals.refused(partition_log.directory, error)
                return -CompletionCode.STORAGE_ERROR
        self.transactions.end(self.rows.settings, row, marker.producer_id)
        self.rows.refresh(row)
        self._appended_rows[row] = None
        return marker_offset

    def _index_aborted(self, row: int, partition_log, producer_id: int, first_offset: int,
                       marker_offset: int) -> None:
        """Write an aborted transaction into the partition's ``.txnindex`` and move the
        row's aborted generation (the caller publishes the row after)."""
        settings = self.rows.settings[row]
        first_unstable = int(settings[ROW_FIRST_UNSTABLE_OFFSET])
        partition_log.append_aborted_transaction(
            producer_id, first_offset, marker_offset,
            first_unstable if first_unstable >= 0 else partition_log.log_end_offset)
        settings[ROW_ABORTED_GENERATION] += 1

    def append_replicated(self, row: int, batches) -> tuple[int, int]:
        """Append a leader's batches to the follower partition at ``row`` as they are
        (``PartitionLog.append_as_follower``: offsets, epochs and timestamps kept):
        the row is published (its log end; the high watermark stays where
        ``advance_high_watermark`` put it), and the partition is among those
        :meth:`take_appended` gives. Each producer's batches are remembered
        without checking their sequences (Kafka checks sequences only for a client's
        appends, ``origin == Client``), so a producer's re-send to this replica once
        it leads is found a duplicate.

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
            be ``EXTERNAL`` (``set_high_watermark_policy``), or its consumers
            would read what is not committed.
        CorruptRecordError, RecordTooLargeError, StorageError
            As ``PartitionLog.append_as_follower`` (its subclasses
            ``UnexpectedAppendOffsetError`` and ``OffsetsOutOfOrderError``
            included); nothing of a refused append is remembered.
        """
        settings = self.rows.check_external(
            row, "a follower's high watermark comes from its leader")
        source = batches if isinstance(batches, np.ndarray) else np.frombuffer(batches, np.uint8)
        partition_log = self.rows.partition_log(row)
        # The last stable offset stays below these batches while they go in (they may
        # open transactions the table learns of after): the log's listener publishes
        # the row on the append.
        first_unstable = int(settings[ROW_FIRST_UNSTABLE_OFFSET])
        settings[ROW_FIRST_UNSTABLE_OFFSET] = partition_log.log_end_offset \
            if first_unstable < 0 else first_unstable
        try:
            appended = partition_log.append_as_follower(source)
        except StorageError:
            # Batches before the one that failed may be in: remember from the log.
            self.rebuild_producer_state(row)
            raise
        finally:
            settings[ROW_FIRST_UNSTABLE_OFFSET] = first_unstable
        # The bytes were validated whole: every batch of them is in the log now.
        self.producer_states.remember_batches(row, source)
        self._follow_transactions(row, partition_log, source)
        self.rows.refresh(row)
        self._appended_rows[row] = None
        return appended.base_offset, appended.last_offset

    def _follow_transactions(self, row: int, partition_log, batches: np.ndarray) -> None:
        """The transactions ``batches`` (in the log) open and end; an aborted one not
        in the ``.txnindex`` yet is written there (the caller publishes the row)."""
        ended = self.transactions.observe(self.rows.settings, row, batches)
        for producer_id, first_offset, marker_offset, kind in ended.tolist():
            if kind != ControlType.ABORT or first_offset < 0:
                continue
            if any(entry.last_offset == marker_offset and entry.producer_id == producer_id
                   for entry in partition_log.aborted_transactions(marker_offset,
                                                                   marker_offset + 1)):
                continue                           # indexed before a restart
            self._index_aborted(row, partition_log, producer_id, first_offset, marker_offset)

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
        self.producer_states.forget(self.rows.hosted(row))
        self.remember_log(row)

    def remember_log(self, row: int) -> None:
        """Remember the last batches of each producer in the partition's log, in every
        segment (``producer_snapshots``), not the active one alone: a producer whose
        last batches sit in an older segment would be forgotten, and a re-send
        appended twice; and the transactions open at its end (``PartitionLog.producer_state``),
        whose first offsets hold the last stable offset published."""
        rows, transactions = self.rows.partition_log(row).producer_state()
        self.producer_states.remember_producers(row, rows)
        # From "nothing known" (or what a truncation left) to the log's open
        # transactions with no publish between: a reader never sees an open
        # transaction's records as stable. Readers read the .txnindex files again.
        settings = self.rows.settings
        self.transactions.forget(settings, row)
        for producer_id, producer_epoch, first_offset in transactions.tolist():
            self.transactions.begin(settings, row, producer_id, producer_epoch, first_offset)
        settings[row, ROW_ABORTED_GENERATION] += 1
        self.rows.refresh(row)


class RefusalLog:
    """The log lines of appends the log refused: the first, then a count of those
    since, once per :data:`limits.APPEND_REFUSAL_LOG_INTERVAL_S` at most (the clock
    is passed in, so the rule is testable alone). ``count`` is every refusal."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.count = 0
        self._clock = clock
        self._unreported = 0
        self._reported_at: float | None = None

    def refused(self, directory: str, error: Exception) -> None:
        self.count += 1
        now = self._clock()
        if self._reported_at is not None and \
                now - self._reported_at < limits.APPEND_REFUSAL_LOG_INTERVAL_S:
            self._unreported += 1
            return
        since = "" if not self._unreported else \
            f" ({self._unreported} more refused since the last report)"
        log.error("append to %s refused: %s%s (%d refused since the broker started)",
                  directory, error, since, self.count)
        self._reported_at, self._unreported = now, 0
