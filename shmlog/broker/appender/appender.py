"""The :class:`Appender`: what the broker and replication call to drain the rings into
the logs; it composes the appender's parts and runs the slow path.

Rules
-----
* An entry is appended only to the partition it names: its topic key and partition
  number, not its row, decide. The slow path finds the partition by that identity
  (``PartitionRows.row_by_identity``), whatever the row says, and refuses an entry
  whose identity names no hosted partition with ``UNKNOWN_PARTITION``.
* The slow path refuses, in this order and before it looks at the batch, as the
  compiled loop does (:meth:`Appender._refusal`): an internal topic
  (``INTERNAL_TOPIC``), a partition another broker leads (``NOT_LEADER_OR_FOLLOWER``,
  unless a forwarder takes it), and for an acks=all ring a fenced partition
  (``NOT_LEADER_OR_FOLLOWER``) or one under min ISR (``NOT_ENOUGH_REPLICAS``).
* A private copy of the entry's batch is validated and appended: the producer cannot
  change it meanwhile. Every entry, appended or refused, ends in
  ``completions.finish_entry``, after its row is published.
* A ring whose bytes cannot be entries is poisoned: its entries before the damage
  stand, nothing after it is read, ``consumer_error`` tells the producer, and the
  ring is removed.
* Forwarding (cluster mode, :meth:`Appender.set_forwarder`): an entry bound for a
  partition another broker leads has its batch checked as the leader would check
  its bytes alone, is handed to the forwarder as a :class:`ForwardedEntry` (a copy of
  its batch), has its space released at once and its completion parked as external
  until :meth:`Appender.resolve_forwarded` gives the leader's answer, in ring order.
  Entries for partitions this broker leads never take that path.
* Everything runs on one thread, the draining one; nothing here is thread-safe.

Theory of operation
-------------------
The appender's state is three parts, each with its own module: the hosted
partitions by row (``partition_rows.PartitionRows``), the rings by slot and their
parked completions (``rings.RingTable``), and the appends made in Python with the
producer state and the partitions appended to (``log_appends.LogAppends``).
:meth:`Appender.drain` hands all their arrays to the compiled loop
(``drain.drain_rings``) and answers what it stops at: an entry it cannot finish
(:meth:`Appender._append_slowly`: appended through ``PartitionLog.append``, or
refused, or forwarded), or a poisoned ring. Most public methods are the parts'
own, named here so that the broker and replication have one object to call.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import numpy as np

from ...common.errors import CorruptRingError, LocalProtocolError
from ...native.atomics import py_store_release
from ...record.control import EndTransactionMarker
from ...record.records import check_batch
from ...ring import Destination, Ring, next_entry
from ...shm import ring_layout as R
from ...shm.completion import CompletionCode
from ...shm.state import PartitionStateTable
from ...storage.log_manager import LogManager
from .drain import drain_rings
from .layout import (
    DRAIN_ENTRIES_MAX,
    DRAIN_IDLE,
    DRAIN_POISON,
    DRAIN_SLOW,
    REPORT_FINISHED,
    REPORT_LENGTH,
    RING_AWAITS_HIGH_WATERMARK,
    RING_HEAD,
    ROW_BATCH_SIZE_MAX,
    ROW_FENCED,
    ROW_INTERNAL,
    ROW_NOT_LEADER,
    ROW_PARTITION,
    ROW_TOPIC_KEY,
    ROW_UNDER_MIN_ISR,
    HighWatermarkPolicy,
)
from .log_appends import LogAppends
from .partition_rows import PartitionRows
from .rings import RingTable

log = logging.getLogger("shmlog.broker.appender")     # the appender's log, joined by its parts

__all__ = ["Appender", "ForwardedEntry"]


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
        self._partitions = PartitionRows(logs, table)
        self._rings = RingTable()
        self._appends = LogAppends(self._partitions)
        self._cursor = np.zeros(1, np.int64)
        self._report = np.zeros(REPORT_LENGTH, np.int64)
        self._forward: Callable[[ForwardedEntry], None] | None = None   # see set_forwarder
        self._hold: Callable[[ForwardedEntry], None] | None = None   # set_transaction_verifier

    # -- partitions ------------------------------------------------------------------
    def register_partition(self, topic: str, partition: int, row: int | None = None) -> int:
        """Host (topic, partition): open its log, claim its table row, remember its
        producers from the log; the row. A ``row`` asked for (the row it had before a
        restart) is used when free."""
        if self._partitions.is_hosted(topic, partition):
            return self._partitions.row_of(topic, partition)
        row = self._partitions.register(topic, partition, row)
        self._appends.remember_log(row)
        return row

    def unregister_partition(self, topic: str, partition: int) -> None:
        """Stop hosting (topic, partition): entries addressed to it are refused from now
        on, and its table row is freed."""
        row = self._partitions.stop_hosting(topic, partition)
        if row is None:
            return
        # Kafka answers a produce waiting for a partition it stops leading with an error.
        self._rings.refuse_parked_from(row, 0, CompletionCode.UNKNOWN_PARTITION,
                                       self._partitions.settings)
        self._appends.forget(row)
        self._partitions.free(row)

    def row_of(self, topic: str, partition: int) -> int:
        """The row of a hosted partition: :meth:`PartitionRows.row_of`."""
        return self._partitions.row_of(topic, partition)

    def destination(self, topic: str, partition: int) -> Destination:
        """What a producer puts on its ring entries for (topic, partition)."""
        return self._partitions.destination(topic, partition)

    def refresh(self, row: int) -> None:
        """Point the compiled loop at the partition's current append target and
        settings, and publish its offsets: :meth:`PartitionRows.refresh`."""
        self._partitions.refresh(row)

    # -- seams for replication ---------------------------------------------------------
    def high_watermark(self, row: int) -> int:
        """The high watermark published for the partition at ``row``."""
        return self._partitions.high_watermark(row)

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
        self._partitions.set_high_watermark_policy(row, policy, high_watermark)
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
        if self._partitions.advance_high_watermark(row, high_watermark):
            self._complete_parked()
        return self._partitions.high_watermark(row)

    def set_leader_epoch(self, row: int, leader_epoch: int) -> None:
        """The leader epoch stamped on every batch appended to the partition from now
        on: :meth:`PartitionRows.set_leader_epoch`."""
        self._partitions.set_leader_epoch(row, leader_epoch)

    @property
    def appends_refused_storage(self) -> int:
        """Appends the logs refused (``StorageError``: a full disk) since the start."""
        return self._appends.refusals.count

    def take_appended(self) -> list[tuple[int, int]]:
        """The partitions appended to since the last call, as (row, log end offset
        now), in the order first appended to; each once."""
        return self._appends.take_appended()

    def set_under_min_isr(self, row: int, under: bool) -> None:
        """Whether the partition has fewer in-sync replicas than its
        ``min.insync.replicas``: :meth:`PartitionRows.set_under_min_isr`."""
        self._partitions.set_under_min_isr(row, under)

    def under_min_isr(self, row: int) -> bool:
        """What :meth:`set_under_min_isr` last said of the partition (False at first)."""
        return self._partitions.under_min_isr(row)

    def set_fenced(self, row: int, fenced: bool) -> None:
        """Whether this broker may have lost the partition's leadership without
        knowing it: :meth:`PartitionRows.set_fenced`."""
        self._partitions.set_fenced(row, fenced)

    def fenced(self, row: int) -> bool:
        """What :meth:`set_fenced` last said of the partition (False at first)."""
        return self._partitions.fenced(row)

    def set_is_leader(self, row: int, leader: bool) -> None:
        """Whether this broker leads the partition at ``row``:
        :meth:`PartitionRows.set_is_leader`."""
        self._partitions.set_is_leader(row, leader)

    def is_leader(self, row: int) -> bool:
        """What :meth:`set_is_leader` last said of the partition (True at first)."""
        return self._partitions.is_leader(row)

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
        self._rings.refuse_parked_from(self._partitions.hosted(row), int(first_offset), code,
                                       self._partitions.settings)

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
        self._rings.refuse_parked_from(self._partitions.hosted(row), 0, code,
                                       self._partitions.settings)

    def parked_count(self, row: int) -> int:
        """How many parked entries wait for the high watermark of the partition at
        ``row`` to cover their batches (not those it covers already, parked behind
        another's in their ring).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        return self._rings.parked_count(self._partitions.hosted(row), self._partitions.settings)

    def _complete_parked(self) -> None:
        self._rings.complete_parked(self._partitions.settings)

    # -- rings -----------------------------------------------------------------------
    def add_ring(self, ring: Ring, *, awaits_high_watermark: bool = False) -> int:
        """Start draining ``ring`` (from where its consumer left off); its index. A
        slot freed by :meth:`remove_ring` is reused, so the table is as long as the
        most rings ever drained at once. With ``awaits_high_watermark`` (a producer
        with acks=all) an entry completes once the high watermark covers its batch,
        not when it is appended (see the package's rules)."""
        return self._rings.add(ring, awaits_high_watermark)

    def set_awaits_high_watermark(self, index: int, awaits_high_watermark: bool) -> None:
        """Whether the entries of the ring at ``index`` complete once the high
        watermark covers their batches (acks=all) or once appended, from its next
        entry on (a producer registers again, saying its acks, with a broker that
        adopted its ring not knowing them). Completions stay in ring order: an
        entry behind a parked one waits for it either way."""
        self._rings.set_awaits_high_watermark(index, awaits_high_watermark)

    def awaits_high_watermark(self, index: int) -> bool:
        """Whether the entries of the ring at ``index`` wait for the high watermark
        (see :meth:`set_awaits_high_watermark`)."""
        return self._rings.awaits_high_watermark(index)

    def remove_ring(self, index: int) -> None:
        """Stop draining a ring and unmap it: the compiled loop's lists drop their
        views of it first (a view keeps a mapping alive). Its slot is free for the
        next ring. Removing a removed ring does nothing. Its parked completions go
        with it: its producer is gone, or its ring poisoned."""
        self._rings.remove(index)

    def index_of(self, ring: Ring) -> int | None:
        """The index of a ring being drained, or None (removed, or never added)."""
        return self._rings.index_of(ring)

    @property
    def ring_list(self) -> list:
        """The rings by index (None where a slot is free)."""
        return self._rings.ring_list

    def ring_at(self, index: int) -> Ring | None:
        """The ring drained at ``index``, or None (a free slot, or no such index)."""
        return self._rings.ring_at(index)

    # -- draining ----------------------------------------------------------------------
    def drain(self, entries_max: int = DRAIN_ENTRIES_MAX) -> int:
        """Handle entries until every ring is empty or about ``entries_max`` were
        handled; returns how many were."""
        rings, partitions, appends = self._rings, self._partitions, self._appends
        handled = 0
        while handled < entries_max:
            status = drain_rings(rings.words, rings.completions, rings.data, rings.state,
                                 rings.parked, partitions.log_views, partitions.offset_indexes,
                                 partitions.time_indexes, partitions.segment_states,
                                 partitions.settings, self.table.rows, self.table.control,
                                 appends.appended, appends.touched,
                                 appends.producer_states.sequences,
                                 appends.transactions.table, self._cursor,
                                 entries_max - handled, self._report)
            handled += int(self._report[REPORT_FINISHED])
            appends.note_compiled_appends()
            if status == DRAIN_SLOW:
                self._append_slowly(*map(int, self._report[:3]))
                handled += 1
            elif status == DRAIN_POISON:
                self._poison(*map(int, self._report[:3]))
            elif status == DRAIN_IDLE:
                break
        rings.wake_sleepers()
        return handled

    def _append_slowly(self, ring: int, position: int, length: int) -> None:
        """One entry the compiled loop handed over: append it through the log of the
        partition its identity names (whatever its row says), or refuse it; then
        finish it as the loop does. The row is published before the entry completes,
        so no producer hears of an offset the table does not show yet."""
        source = self._rings.ring_at(ring)
        # A private copy: the producer cannot change what is validated and appended.
        batch = source.data[position + R.ENTRY_HEADER_LENGTH:position + length].copy()
        _, _, _, _, entry_topic_key, entry_partition, number, head = next_entry(
            source.words, source.data, source.capacity, int(self._rings.state[ring, RING_HEAD]))
        row = self._partitions.row_by_identity(int(entry_topic_key), int(entry_partition))
        refusal = self._refusal(ring, row)
        if refusal is CompletionCode.NOT_LEADER_OR_FOLLOWER and self._forward is not None:
            refusal = self._forwarded(ring, number, head, row, batch)
            if refusal is None:
                return
        if refusal is not None:
            row, result, append_time, last_offset = -1, -refusal, -1, -1
        else:
            # The log's listener refreshed the row (and published it) on the append.
            result, append_time, last_offset = self._appends.append_batch(row, batch)
            if result == -CompletionCode.TRANSACTION_VERIFYING and self._hold is not None:
                # Parked first: the holder may resolve it at once.
                self._rings.park_forwarded(ring, number, head)
                self._hold(self._entry(ring, number, row, batch))
                return
        self._rings.finish(ring, number, result, append_time, row, last_offset, head,
                           self._partitions.settings)

    def _forwarded(self, ring: int, number: int, head: int, row: int,
                   batch: np.ndarray) -> int | None:
        """Hand an entry bound for a partition another broker leads to the forwarder
        (its completion parked as external, its space released), or why it is
        refused here: what the leader would refuse for its bytes alone is refused
        at once, with the code the compiled loop gives (the leader checks again)."""
        settings = self._partitions.settings[row]
        status, batch_length = check_batch(batch, 0, batch.size, True, True)
        if status != 0:
            return int(status)
        if batch_length != batch.size:
            return CompletionCode.NOT_ONE_BATCH
        if batch.size > settings[ROW_BATCH_SIZE_MAX]:
            return CompletionCode.RECORD_TOO_LARGE
        self._forward(self._entry(ring, number, row, batch))
        self._rings.park_forwarded(ring, number, head)
        return None

    def _entry(self, ring: int, number: int, row: int, batch: np.ndarray) -> ForwardedEntry:
        settings = self._partitions.settings[row]
        return ForwardedEntry(ring, self._rings.ring_at(ring), number, row,
                              int(settings[ROW_TOPIC_KEY]), int(settings[ROW_PARTITION]), batch,
                              bool(self._rings.state[ring, RING_AWAITS_HIGH_WATERMARK]))

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
        if not self._rings.resolve_forwarded(ring, number, result, append_time):
            return False
        self._complete_parked()
        return True

    def _refusal(self, ring: int, row: int | None) -> CompletionCode | None:
        """Why the slow path refuses an entry of ``ring`` bound for ``row`` (None: the
        identity names no hosted partition) before looking at its batch, or None;
        the same checks as the compiled loop's _row_takes and _admit."""
        if row is None:
            return CompletionCode.UNKNOWN_PARTITION
        settings = self._partitions.settings[row]
        awaits_high_watermark = self._rings.state[ring, RING_AWAITS_HIGH_WATERMARK]
        if settings[ROW_INTERNAL]:
            return CompletionCode.INTERNAL_TOPIC
        if settings[ROW_NOT_LEADER]:
            return CompletionCode.NOT_LEADER_OR_FOLLOWER
        if awaits_high_watermark and settings[ROW_FENCED]:
            return CompletionCode.NOT_LEADER_OR_FOLLOWER
        if awaits_high_watermark and settings[ROW_UNDER_MIN_ISR]:
            return CompletionCode.NOT_ENOUGH_REPLICAS
        return None

    def append(self, row: int, batch, *, sequenced: bool = True) -> tuple[int, int]:
        """Append one batch the broker writes itself (offset commits) to the partition
        at ``row`` as the drain appends a producer's: its sequence checked (unless not
        ``sequenced``: a coordinator's batch under a producer's id), stamped with the
        row's leader epoch, its row published by its high-watermark policy.

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
        if not self._partitions.is_leader(row):
            return -CompletionCode.NOT_LEADER_OR_FOLLOWER, -1
        result, append_time, _ = self._appends.append_batch(row, source, sequenced=sequenced)
        return result, append_time

    # -- transactions --------------------------------------------------------------------
    def expect_transaction(self, row: int, producer_id: int, producer_epoch: int) -> bool:
        """The transaction coordinator added the partition at ``row`` to the producer's
        transaction at ``producer_epoch`` (AddPartitionsToTxn): its first transactional
        batch there is admitted. False when a transaction of another epoch is still
        open there (the coordinator ends it first).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        return self._appends.expect_transaction(row, producer_id, producer_epoch)

    def set_transaction_verifier(
            self, verify: Callable[[str, int, int, int], CompletionCode | None] | None,
            hold: Callable[[ForwardedEntry], None] | None = None) -> None:
        """Who decides on a transactional batch for a partition not added to its
        producer's transaction at its epoch: ``verify(topic, partition, producer id,
        epoch)`` (on the draining thread) adds it there through
        :meth:`expect_transaction` and returns None, or returns the code that refuses
        the batch. None (the default) refuses them all with ``INVALID_TXN_STATE``.

        A verifier that must ask a coordinator elsewhere returns
        ``TRANSACTION_VERIFYING``: that batch, and every later one of the producer
        for the partition, is held until :meth:`transaction_verified`. A ring's
        entry is handed to ``hold`` as a :class:`ForwardedEntry` (its completion
        parked, its space released); :meth:`append` answers
        ``-TRANSACTION_VERIFYING`` and its caller holds the batch."""
        self._appends.verifier = verify
        self._hold = hold

    def transaction_verified(self, row: int, producer_id: int, producer_epoch: int,
                             added: bool) -> bool:
        """The verification of the producer's batches held for the partition at
        ``row`` ended: the partition was added to its transaction at
        ``producer_epoch`` (``added``) or not. Whether its batches are admitted now:
        the caller then appends the held ones, in order, or refuses them."""
        return self._appends.verified(row, producer_id, producer_epoch, added)

    def write_marker(self, row: int, marker: EndTransactionMarker) -> int:
        """Append an end-transaction marker to the partition at ``row`` and end its
        producer's transaction there (:meth:`LogAppends.write_marker`): the marker's
        offset, or ``-CompletionCode``.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        # Decided: nothing joins the transaction here, even if its marker must wait.
        self._appends.transactions.ending(self._partitions.hosted(row), marker.producer_id)
        if not self._partitions.is_leader(row):
            return -CompletionCode.NOT_LEADER_OR_FOLLOWER
        return self._appends.write_marker(row, marker)

    def last_stable_offset(self, row: int) -> int:
        """The last stable offset published for the partition at ``row``:
        :meth:`PartitionRows.last_stable_offset`."""
        return self._partitions.last_stable_offset(row)

    def open_transactions_by_row(self) -> dict[int, list[tuple[int, int, int]]]:
        """:meth:`open_transactions` of every hosted partition with one, by row, in one
        walk (what a look at every partition asks)."""
        return self._appends.transactions.open_transactions_by_row()

    def open_transactions(self, row: int) -> list[tuple[int, int, int]]:
        """(producer id, epoch, first offset) of each transaction open (or expected:
        first offset -1) in the partition at ``row``."""
        return self._appends.transactions.open_transactions(self._partitions.hosted(row))

    def append_replicated(self, row: int, batches) -> tuple[int, int]:
        """Append a leader's batches to the follower partition at ``row`` as they are:
        :meth:`LogAppends.append_replicated` (the partition's high watermark must be
        ``EXTERNAL``)."""
        return self._appends.append_replicated(row, batches)

    def rebuild_producer_state(self, row: int) -> None:
        """Forget what is remembered of the producers of the partition at ``row`` and
        remember it again from its log: :meth:`LogAppends.rebuild_producer_state`."""
        self._appends.rebuild_producer_state(row)

    def _poison(self, ring: int, position: int, length: int) -> None:
        source = self._rings.ring_at(ring)
        error = CorruptRingError(f"ring {source.name!r}: no valid entry at byte {position} "
                                 f"(length field {length}); it is no longer read",
                                 name=source.name, position=position)
        log.warning("%s", error)
        py_store_release(source.words, R.CONSUMER_ERROR_WORD, int(CompletionCode.NOT_ONE_BATCH))
        self.remove_ring(ring)
