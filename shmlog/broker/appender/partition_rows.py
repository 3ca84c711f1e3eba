"""The partitions an appender hosts, each at its row: their logs, the views the compiled
loop appends through, and the per-row settings and marks (``layout``: ``ROW_*``).

Rules
-----
* A partition's row in the state table is also its index in every per-row array here,
  and what producers put on their ring entries beside its identity (topic key,
  partition). :meth:`PartitionRows.register` claims it, :meth:`PartitionRows.free`
  gives it back.
* The compiled loop's views of a partition (its active segment's log, indexes and
  state) and its settings are replaced by :meth:`PartitionRows.refresh` only, which
  the partition's log calls itself (its listener) on every change that makes them
  stale; the views live in typed lists changed only through ``typed_containers``.
* The high watermark (what consumers may read: they never see an offset at or above
  it) follows a per-row :class:`HighWatermarkPolicy`: ``LOG_END`` (the log end, a
  partition without replicas) or ``EXTERNAL`` (replication: the log end is
  published, the high watermark only moves by
  :meth:`PartitionRows.advance_high_watermark`, never backwards and never past the
  log end, as Kafka's ``Partition.maybeIncrementLeaderHW``); a truncation below it
  lowers it.
* The marks replication sets (under min ISR, fenced, not leader, the leader epoch)
  are only stored here; the compiled loop (``drain``) and the appender's slow path
  act on them.
* Everything runs on the draining thread.

Theory of operation
-------------------
Registering a partition opens its log through the :class:`LogManager`, claims a
free row (the row it had before a restart when that one is free), records the
partition's identity in the row, and sets the log's listener to :meth:`refresh`,
which points the compiled loop at the log's current append target, copies the
topic's settings into the row and publishes the row's offsets. Stopping is the
reverse in two steps, so the appender can refuse what waited for the partition
between them: :meth:`stop_hosting` (no entry is appended to it any more), then
:meth:`free` (its views dropped, its table row freed).
"""

from __future__ import annotations

import numpy as np

from ...common.errors import LocalProtocolError, StorageError, UnknownTopicOrPartitionError
from ...common.internal_topics import INTERNAL_TOPICS
from ...native import typed_containers as typed
from ...ring import Destination
from ...segments import AppendTarget
from ...shm.state import PartitionStateTable, topic_key
from ...storage.log_manager import LogManager
from ...storage.segment_state import STATE_WORDS
from .drain import last_stable_offset, publish_offsets
from .layout import (
    LEADER_EPOCH_MAX,
    ROW_ABORTED_GENERATION,
    ROW_BATCH_SIZE_MAX,
    ROW_COLUMNS,
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

__all__ = ["PartitionRows"]


def _empty_bytes() -> np.ndarray:
    """What a freed row's views hold: never read, they only let go of the mapping they
    viewed."""
    return np.zeros(0, np.uint8)


class PartitionRows:
    """The partitions of a :class:`LogManager` an appender hosts, by their rows in a
    :class:`PartitionStateTable` (see the module's rules)."""

    def __init__(self, logs: LogManager, table: PartitionStateTable):
        self.logs = logs
        self.table = table
        capacity = table.row_capacity
        self._partitions: dict[int, object] = {}               # row -> PartitionLog
        self._targets: dict[int, AppendTarget] = {}            # row -> its log's target
        self._rows: dict[tuple[str, int], int] = {}
        self._names: dict[int, tuple[str, int]] = {}     # row -> (topic, partition)
        self._rows_by_identity: dict[tuple[int, int], int] = {}   # (topic key, partition)
        self.settings = np.zeros((capacity, ROW_COLUMNS), np.int64)
        # The compiled loop's views, by row: typed lists, changed only through
        # typed_containers' kernels (see there why).
        self.log_views = typed.byte_arrays(capacity)
        self.offset_indexes = typed.byte_arrays(capacity)
        self.time_indexes = typed.byte_arrays(capacity)
        self.segment_states = typed.word_arrays(capacity, STATE_WORDS)

    # -- hosting -----------------------------------------------------------------------
    def register(self, topic: str, partition: int, row: int | None = None) -> int:
        """Host (topic, partition): open its log, claim its table row; the row. A
        ``row`` asked for (the row it had before a restart) is used when free."""
        key = (topic, partition)
        if key in self._rows:
            return self._rows[key]
        partition_log = self.logs.partition_log(topic, partition)
        # One vectorised look: a loop over the rows cost a millisecond per partition,
        # which a topic of many partitions (__consumer_offsets: 50) held the broker for.
        free = np.flatnonzero(self.settings[:, ROW_REGISTERED] == 0)
        if not free.size:
            raise StorageError(
                f"the partition state table is full ({self.settings.shape[0]} rows)")
        if row is None or not 0 <= row < self.settings.shape[0] \
                or self.settings[row, ROW_REGISTERED]:
            row = int(free[0])
        identity = (topic_key(self.logs.describe_topic(topic).topic_id), partition)
        self.table.claim(row, *identity)
        self._partitions[row] = partition_log
        self._rows[key] = row
        self._names[row] = key
        self._rows_by_identity[identity] = row
        self.settings[row, ROW_REGISTERED] = 1
        self.settings[row, ROW_TOPIC_KEY], self.settings[row, ROW_PARTITION] = identity
        self.settings[row, ROW_INTERNAL] = int(topic in INTERNAL_TOPICS)
        # The log's open transactions are not known yet (the appender reads them next,
        # LogAppends.remember_log): until then nothing past the log start is stable.
        self.settings[row, ROW_FIRST_UNSTABLE_OFFSET] = partition_log.log_start_offset
        # The log tells of every change that makes its target or the row stale.
        partition_log.set_listener(lambda change: self.refresh(row))
        self.refresh(row)
        return row

    def is_hosted(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._rows

    def stop_hosting(self, topic: str, partition: int) -> int | None:
        """The first step of unregistering (topic, partition): entries addressed to it
        are refused from now on (its settings are cleared) and its log no longer
        tells of changes; its row (None: it was not hosted), which :meth:`free` frees."""
        row = self._rows.pop((topic, partition), None)
        if row is None:
            return None
        del self._names[row]
        del self._rows_by_identity[(int(self.settings[row, ROW_TOPIC_KEY]), partition)]
        self.settings[row] = 0
        self._partitions.pop(row).set_listener(None)
        del self._targets[row]
        return row

    def free(self, row: int) -> None:
        """The last step of unregistering: drop the compiled loop's views of the row's
        segment (a view keeps a mapping alive) and free its table row."""
        for arrays in (self.log_views, self.offset_indexes, self.time_indexes):
            typed.set_item(arrays, row, _empty_bytes())
        typed.set_item(self.segment_states, row, np.zeros(STATE_WORDS, np.int64))
        self.table.free(row)

    def name_of(self, row: int) -> tuple[str, int]:
        """(topic, partition) of the hosted partition at ``row``."""
        return self._names[self.hosted(row)]

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

    def row_by_identity(self, entry_topic_key: int, entry_partition: int) -> int | None:
        """The row of the hosted partition a ring entry's identity names, or None."""
        return self._rows_by_identity.get((entry_topic_key, entry_partition))

    def destination(self, topic: str, partition: int) -> Destination:
        """What a producer puts on its ring entries for (topic, partition)."""
        row = self.row_of(topic, partition)
        return Destination(row, int(self.settings[row, ROW_TOPIC_KEY]), partition)

    def hosted(self, row: int) -> int:
        """``row``, checked to host a partition.

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        if row not in self._partitions:
            raise UnknownTopicOrPartitionError(f"row {row!r} hosts no partition of this appender")
        return row

    def partition_log(self, row: int):
        """The ``PartitionLog`` of the partition at ``row`` (hosted)."""
        return self._partitions[row]

    def target(self, row: int) -> AppendTarget:
        """Where the compiled loop appends to the partition at ``row`` (hosted)."""
        return self._targets[row]

    # -- the views and the published row -------------------------------------------------
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
        typed.set_item(self.log_views, row, target.log)
        typed.set_item(self.offset_indexes, row, target.offset_index)
        typed.set_item(self.time_indexes, row, target.time_index)
        typed.set_item(self.segment_states, row, target.state)
        settings = self.settings[row]
        settings[ROW_FAST] = int(target.compiled)
        settings[ROW_SEGMENT_BYTES] = target.segment_bytes
        settings[ROW_SEGMENT_MS] = target.segment_ms
        settings[ROW_INDEX_INTERVAL] = target.index_interval
        settings[ROW_BATCH_SIZE_MAX] = partition_log.config.batch_size_max
        settings[ROW_LOG_START_OFFSET] = partition_log.log_start_offset
        settings[ROW_GENERATION] = partition_log.generation
        end = partition_log.log_end_offset
        high_watermark = self._high_watermark_for(row, partition_log.log_start_offset, end)
        self.table.publish(row, partition_log.log_start_offset, end, high_watermark,
                           partition_log.active.base_offset, partition_log.active.size,
                           partition_log.generation,
                           int(last_stable_offset(settings[ROW_FIRST_UNSTABLE_OFFSET],
                                                  high_watermark,
                                                  partition_log.log_start_offset)),
                           int(settings[ROW_ABORTED_GENERATION]))

    def _high_watermark_for(self, row: int, log_start_offset: int, log_end_offset: int) -> int:
        """The high watermark to publish with these offsets, by the row's policy: the
        log end, or the one set from outside kept within [log start, log end] (a
        truncation below it lowers it, as Kafka's ``Log.updateHighWatermark``)."""
        settings = self.settings[row]
        if settings[ROW_HIGH_WATERMARK_POLICY] == HighWatermarkPolicy.LOG_END:
            high_watermark = log_end_offset
        else:
            high_watermark = min(max(int(settings[ROW_HIGH_WATERMARK]), log_start_offset),
                                 log_end_offset)
        settings[ROW_HIGH_WATERMARK] = high_watermark
        return high_watermark

    # -- the high watermark ------------------------------------------------------------
    def high_watermark(self, row: int) -> int:
        """The high watermark published for the partition at ``row``."""
        return int(self.settings[self.hosted(row), ROW_HIGH_WATERMARK])

    def last_stable_offset(self, row: int) -> int:
        """The last stable offset published for the partition at ``row`` (Kafka's LSO:
        below its oldest open transaction, never above the high watermark)."""
        settings = self.settings[self.hosted(row)]
        return int(last_stable_offset(settings[ROW_FIRST_UNSTABLE_OFFSET],
                                      settings[ROW_HIGH_WATERMARK],
                                      settings[ROW_LOG_START_OFFSET]))

    def set_high_watermark_policy(self, row: int, policy: HighWatermarkPolicy,
                                  high_watermark: int | None = None) -> None:
        """Who moves the partition's high watermark from now on (see
        :meth:`Appender.set_high_watermark_policy`); the row is published."""
        self.settings[self.hosted(row), ROW_HIGH_WATERMARK_POLICY] = HighWatermarkPolicy(policy)
        if high_watermark is not None and policy == HighWatermarkPolicy.EXTERNAL:
            self.settings[row, ROW_HIGH_WATERMARK] = int(high_watermark)
        self.refresh(row)

    def check_external(self, row: int, what: str) -> np.ndarray:
        """The settings of the hosted partition at ``row``, checked to have an
        ``EXTERNAL`` high watermark (``what`` says why it must).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        LocalProtocolError
            Its high watermark follows its log end.
        """
        settings = self.settings[self.hosted(row)]
        if settings[ROW_HIGH_WATERMARK_POLICY] != HighWatermarkPolicy.EXTERNAL:
            raise LocalProtocolError(f"row {row}: {what}; "
                                     f"set_high_watermark_policy(row, EXTERNAL) first")
        return settings

    def advance_high_watermark(self, row: int, high_watermark: int) -> bool:
        """Move an ``EXTERNAL`` high watermark up to ``high_watermark`` (never
        backwards, never past the log end) and publish the row; whether it moved.

        Raises
        ------
        UnknownTopicOrPartitionError, LocalProtocolError
            As :meth:`check_external`.
        """
        settings = self.check_external(row, "the high watermark follows the log end")
        high_watermark = min(int(high_watermark), self._partitions[row].log_end_offset)
        if high_watermark <= settings[ROW_HIGH_WATERMARK]:
            return False
        settings[ROW_HIGH_WATERMARK] = high_watermark
        publish_offsets(self.table.rows, self.table.control, self.settings, row,
                        self._targets[row].state)
        self.table.flush_journal()
        return True

    # -- replication's marks -------------------------------------------------------------
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
        self.settings[self.hosted(row), ROW_LEADER_EPOCH] = leader_epoch

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
        self.settings[self.hosted(row), ROW_UNDER_MIN_ISR] = int(bool(under))

    def under_min_isr(self, row: int) -> bool:
        """What :meth:`set_under_min_isr` last said of the partition (False at first)."""
        return bool(self.settings[self.hosted(row), ROW_UNDER_MIN_ISR])

    def set_fenced(self, row: int, fenced: bool) -> None:
        """Whether this broker may have lost the partition's leadership without
        knowing it (another leader may have been elected). While it is, entries
        of acks=all rings bound for it are refused with ``NOT_LEADER_OR_FOLLOWER``
        and nothing of them appended (the ISR cannot shrink without ZooKeeper, so
        min.insync.replicas cannot be judged); acks=0/1 rings are not affected (Kafka
        does not fence those by ZooKeeper either).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.settings[self.hosted(row), ROW_FENCED] = int(bool(fenced))

    def fenced(self, row: int) -> bool:
        """What :meth:`set_fenced` last said of the partition (False at first)."""
        return bool(self.settings[self.hosted(row), ROW_FENCED])

    def set_is_leader(self, row: int, leader: bool) -> None:
        """Whether this broker leads the partition at ``row`` (a replicated
        partition's role; True until replication says otherwise). While it does not,
        producers' entries bound for it, and the broker's own appends, are refused
        with ``NOT_LEADER_OR_FOLLOWER`` and nothing of them appended (Kafka's
        ``NotLeaderOrFollowerException``), unless a forwarder takes the producers'
        entries (:meth:`Appender.set_forwarder`); a follower appends only its
        leader's batches (:meth:`Appender.append_replicated`).

        Raises
        ------
        UnknownTopicOrPartitionError
            No partition is hosted at ``row``.
        """
        self.settings[self.hosted(row), ROW_NOT_LEADER] = int(not leader)

    def is_leader(self, row: int) -> bool:
        """What :meth:`set_is_leader` last said of the partition (True at first)."""
        return not self.settings[self.hosted(row), ROW_NOT_LEADER]
