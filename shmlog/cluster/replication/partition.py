"""One hosted partition's part in replication (Kafka's ``Partition``): its role, and
what it does as leader, follower or observer.

Rules
-----
* The partition's state znode decides the role (``cluster.zk.view``): this broker leads
  when the state names it, follows when it is among the assigned replicas, observes
  otherwise (a copy for this host's readers: never in the ISR, never elected).
  A state with an older leader epoch than the one held is never applied.
* **Becoming leader** at epoch E (``Partition.makeLeader``): the epoch cache gets
  (E, log end) before any append, the appender stamps E on every batch, the high
  watermark moves only by :meth:`PartitionReplica.maybe_advance_high_watermark`
  (policy EXTERNAL), and the followers' fetch states start over
  (``rules.LeaderReplicaState``).
* **Becoming follower** (``Partition.makeFollower``): producers' entries are not
  appended here (the appender hands them to ``forwarding``, which sends them to
  the leader), and the log is truncated before it fetches, by the KIP-279 loop
  (``rules.truncation_step``), never to its high watermark.
* **Truncating to T**: the log and its epoch cache lose every batch at or above T,
  the producers' state is rebuilt from what is left, and acks=all entries parked on
  batches at or above T fail with ``NOT_LEADER_OR_FOLLOWER`` (those below T are in
  the new leader's log at the same offsets: they complete when this replica's high
  watermark covers them).
* **The high watermark** is the lowest log end over the maximal ISR; it moves only
  forward, and never on a follower past ``min(leader's HW, own log end)``. It moves
  while the ZooKeeper session is suspended too (Kafka's leader goes on committing
  with the ISR it holds): the ISR cannot shrink without a ZooKeeper write, so a
  leader replaced meanwhile commits nothing its followers lack, and they stop
  fetching from it (and it refuses their fetches of a newer epoch) once they learn
  the new leader: its acks=all entries then wait, unacknowledged.
* **min.insync.replicas**: whenever the ISR or the setting changes, the appender is
  told whether acks=all entries must be refused (``Appender.set_under_min_isr``).

Theory of operation
-------------------
The replica service owns one :class:`PartitionReplica` per hosted partition and
calls it on the loop thread: with a newer state (:meth:`apply_state`), with a fetch
to serve (:meth:`serve_fetch`), with a fetch response or an EPOCH_END answer to
apply. It does no I/O beyond the partition's log and appender row: the service sends
and receives, and writes ISR changes to ZooKeeper.
"""

from __future__ import annotations

import enum
import logging

import numpy as np

from ...broker.appender import Appender, HighWatermarkPolicy
from ...broker.partition_host import HostedPartition
from ...common import limits
from ...common.errors import CorruptRecordError, ShmlogError
from ...shm.completion import CompletionCode
from ..zk.paths import NO_LEADER, PartitionState
from .messages import UNDEFINED_EPOCH, ErrorCode, FetchPartition, FetchResponsePartition
from .rules import (
    IsrChangeKind,
    LeaderReplicaState,
    PendingIsrChange,
    TruncationAction,
    TruncationStep,
    follower_high_watermark,
    offset_out_of_range_step,
    truncation_step,
    validate_epoch_end,
    validate_fetch,
)

log = logging.getLogger("shmlog.broker")

__all__ = ["Role", "FetchPhase", "PartitionReplica"]

_NO_RECORDS = np.empty(0, np.uint8)


class Role(enum.Enum):
    """What this broker is to a partition."""
    NONE = "none"              # no state seen yet
    LEADER = "leader"
    FOLLOWER = "follower"      # an assigned replica, fetching from the leader
    OBSERVER = "observer"      # not assigned: a copy for this host's readers
    OFFLINE = "offline"        # the partition has no leader


class FetchPhase(enum.Enum):
    """Where a follower (or observer) is in its fetching."""
    TRUNCATING = "truncating"  # finding where its log and the leader's agree
    FETCHING = "fetching"
    WAITING = "waiting"        # the leader refused it (fenced, not leader): wait for a new state


# What a leader may answer only because it has not applied the state the follower
# already has (ZooKeeper's watches reach brokers in no set order): the follower keeps
# its phase and asks again after a back-off (Kafka's fetcher delays a partition in
# error by replica.fetch.backoff.ms and retries it). Waiting for a newer state
# instead would wait forever: no newer state is coming.
RETRIED_ERRORS = frozenset({ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})


class PartitionReplica:
    """One hosted partition's replication state and duties (see the module's rules).

    Parameters
    ----------
    broker_id : int
        This broker.
    hosted : HostedPartition
        The partition: its row and log.
    appender : Appender
    topic_key : int
        The partition's identity on the wire (its topic id's key).
    replica_lag_time_max_ms : int
    high_watermark : int, optional
        Where its high watermark starts (``high_watermark_checkpoint.
        start_high_watermark``: the checkpointed one, else the log start); by default
        it stays where the row has it.
    """

    def __init__(self, broker_id: int, hosted: HostedPartition, appender: Appender,
                 topic_key: int, replica_lag_time_max_ms: int,
                 high_watermark: int | None = None):
        self.broker_id = broker_id
        self.hosted = hosted
        self.appender = appender
        self.topic_key = topic_key
        self.role = Role.NONE
        self.state: PartitionState | None = None
        self.state_version = -1
        self.replicas: tuple[int, ...] = ()
        self.min_insync_replicas = 1
        self.leader = LeaderReplicaState(broker_id, replica_lag_time_max_ms)
        self.phase = FetchPhase.WAITING
        self.retry_at = 0              # a refused follower asks again from then (ms)
        self.leader_log_start_offset = -1
        appender.set_high_watermark_policy(hosted.row, HighWatermarkPolicy.EXTERNAL,
                                           high_watermark=high_watermark)
        appender.set_is_leader(hosted.row, False)

    # -- naming ------------------------------------------------------------------------------
    @property
    def key(self) -> tuple[int, int]:
        """The partition's name on the wire: (topic key, partition)."""
        return (self.topic_key, self.hosted.partition)

    @property
    def log(self):
        return self.hosted.log

    @property
    def row(self) -> int:
        return self.hosted.row

    @property
    def leader_id(self) -> int:
        return NO_LEADER if self.state is None else self.state.leader

    @property
    def leader_epoch(self) -> int:
        return UNDEFINED_EPOCH if self.state is None else self.state.leader_epoch

    def __repr__(self) -> str:
        return f"{self.hosted.topic}-{self.hosted.partition}"

    # -- roles ---------------------------------------------------------------------------------
    def apply_state(self, state: PartitionState, version: int, replicas: tuple[int, ...],
                    now: int) -> bool:
        """Take a newer state of the partition; True when the role or epoch changed
        (fetches waiting on it must be answered, fetchers re-planned)."""
        if self.state is not None and state.leader_epoch < self.state.leader_epoch:
            log.warning("%r: ignoring state %s older than epoch %d", self, state,
                        self.state.leader_epoch)
            return False
        previous, self.state, self.state_version = self.state, state, version
        self.replicas = tuple(replicas)
        new_epoch = previous is None or previous.leader_epoch != state.leader_epoch \
            or previous.leader != state.leader
        if state.leader == self.broker_id:
            if new_epoch or self.role is not Role.LEADER:
                self._become_leader(now)
                return True
            self.leader.isr_change_committed(state.isr)     # our own ISR write, or the controller's
            self.leader.replicas = self.replicas
            self.update_min_insync()
            return False
        if not new_epoch and self.role in (Role.FOLLOWER, Role.OBSERVER, Role.OFFLINE):
            return False                                     # an ISR change elsewhere
        self._become_follower()
        return True

    def _become_leader(self, now: int) -> None:
        end = self.log.log_end_offset
        self.log.epochs.assign(self.state.leader_epoch, end)
        self.appender.set_leader_epoch(self.row, self.state.leader_epoch)
        self.leader.become_leader(leader_epoch=self.state.leader_epoch, epoch_start_offset=end,
                                  replicas=self.replicas, isr=self.state.isr, now_ms=now)
        self.role = Role.LEADER
        self.phase = FetchPhase.WAITING
        self.update_min_insync()
        self.appender.set_is_leader(self.row, True)
        log.info("%r: leader at epoch %d from offset %d, isr %s", self, self.state.leader_epoch,
                 end, sorted(self.state.isr))

    def _become_follower(self) -> None:
        self.appender.set_is_leader(self.row, False)
        if self.role is Role.LEADER:
            self.leader.resign()
        if self.state.leader == NO_LEADER:
            self.role, self.phase = Role.OFFLINE, FetchPhase.WAITING
            return
        self.role = Role.FOLLOWER if self.broker_id in self.replicas else Role.OBSERVER
        self.phase = FetchPhase.TRUNCATING
        self.retry_at = 0
        self.leader_log_start_offset = -1
        log.info("%r: %s of broker %d at epoch %d", self, self.role.value, self.state.leader,
                 self.state.leader_epoch)

    def resign(self, code: CompletionCode = CompletionCode.NOT_LEADER_OR_FOLLOWER) -> None:
        """Stop leading without knowing what survives (the ZooKeeper session was lost):
        every parked acks=all entry fails; the role is OFFLINE until a state is read."""
        if self.role is Role.LEADER:
            self.leader.resign()
            self.appender.refuse_parked(self.row, code)
        self.appender.set_is_leader(self.row, False)
        self.role, self.phase, self.state, self.state_version = \
            Role.OFFLINE, FetchPhase.WAITING, None, -1

    def update_min_insync(self) -> None:
        """Tell the appender whether acks=all entries are refused with
        ``NOT_ENOUGH_REPLICAS``: by a leader whose ISR is below min.insync.replicas."""
        if self.role is not Role.LEADER:
            return
        self.appender.set_under_min_isr(self.row,
                                        len(self.leader.isr) < self.min_insync_replicas)

    # -- the leader's side --------------------------------------------------------------------
    def serve_fetch(self, replica_id: int, observer: bool, request: FetchPartition,
                    max_bytes: int, now: int) -> tuple[FetchResponsePartition, bool]:
        """Answer one partition of a fetch (Kafka's ``Partition.readRecords`` after
        ``updateFollowerFetchState``); also whether it found records to send."""
        log_ = self.log
        error = validate_fetch(
            is_leader=self.role is Role.LEADER, leader_epoch=self.leader_epoch,
            request_epoch=request.current_leader_epoch, replica_id=replica_id,
            replicas=self.replicas, observer=observer, fetch_offset=request.fetch_offset,
            log_start_offset=log_.log_start_offset, log_end_offset=log_.log_end_offset)
        if error is not ErrorCode.NONE:
            return self._fetch_answer(request, error), False
        # Whether it observes is the partition's to say, not the fetch's: one fetch
        # from a broker carries the partitions it follows and those it observes.
        self.leader.record_fetch(replica_id, request.fetch_offset, now, log_.log_end_offset,
                                 log_start_offset=request.log_start_offset,
                                 observer=replica_id not in self.replicas)
        self.maybe_advance_high_watermark(now)
        records = self.read(request.fetch_offset, min(max_bytes, request.partition_max_bytes))
        return self._fetch_answer(request, ErrorCode.NONE, records), records.size > 0

    def read(self, offset: int, max_bytes: int) -> np.ndarray:
        """Whole batches from ``offset`` up to the log end (not the HW: followers
        replicate what is not committed yet), as a view of the segment."""
        if offset >= self.log.log_end_offset or max_bytes <= 0:
            return _NO_RECORDS
        return self.log.read(offset, max_bytes).data

    def _fetch_answer(self, request: FetchPartition, error: ErrorCode,
                      records: np.ndarray | None = None) -> FetchResponsePartition:
        return FetchResponsePartition(
            request.topic_key, request.partition, error,
            self.appender.high_watermark(self.row), self.log.log_start_offset,
            self.log.log_end_offset, None if records is None or records.size == 0 else records)

    def answer_parked_fetch(self, request: FetchPartition, max_bytes: int
                            ) -> FetchResponsePartition:
        """Answer a fetch that waited (its fetch state was recorded when it came)."""
        if self.role is not Role.LEADER or request.current_leader_epoch != self.leader_epoch:
            error = validate_fetch(
                is_leader=self.role is Role.LEADER, leader_epoch=self.leader_epoch,
                request_epoch=request.current_leader_epoch, replica_id=-1, replicas=(),
                observer=True, fetch_offset=request.fetch_offset,
                log_start_offset=self.log.log_start_offset,
                log_end_offset=self.log.log_end_offset)
            return self._fetch_answer(request, error if error is not ErrorCode.NONE
                                      else ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if request.fetch_offset > self.log.log_end_offset:
            return self._fetch_answer(request, ErrorCode.OFFSET_OUT_OF_RANGE)
        records = self.read(request.fetch_offset, min(max_bytes, request.partition_max_bytes))
        return self._fetch_answer(request, ErrorCode.NONE, records)

    def end_offset_for(self, replica_id: int, request_epoch: int, epoch: int
                       ) -> tuple[ErrorCode, int, int]:
        """Answer an EPOCH_END: (error, epoch, end offset) (Kafka's
        ``Partition.lastOffsetForLeaderEpoch``)."""
        error = validate_epoch_end(is_leader=self.role is Role.LEADER,
                                   leader_epoch=self.leader_epoch, request_epoch=request_epoch,
                                   replica_id=replica_id, replicas=self.replicas, observer=True)
        if error is not ErrorCode.NONE:
            return error, UNDEFINED_EPOCH, -1
        found_epoch, end = self.log.epochs.end_offset_for(epoch, self.log.log_end_offset)
        return ErrorCode.NONE, found_epoch, end

    def maybe_advance_high_watermark(self, now: int) -> int | None:
        """Move the leader's high watermark to the lowest log end over the maximal
        ISR; the new one, or None when it did not move."""
        if self.role is not Role.LEADER:
            return None
        current = self.appender.high_watermark(self.row)
        new = self.leader.high_watermark(self.log.log_end_offset, current, now)
        if new <= current:
            return None
        return self.appender.advance_high_watermark(self.row, new)

    def isr_change(self, now: int, replica_id: int | None = None) -> PendingIsrChange | None:
        """The ISR change to write now, if any: ``replica_id`` joining (it just
        fetched), or the members out of sync dropping."""
        if self.role is not Role.LEADER or self.leader.pending is not None:
            return None
        if replica_id is not None:
            if self.leader.expand_candidate(replica_id, self.appender.high_watermark(self.row)):
                return self.leader.begin_isr_change(IsrChangeKind.EXPAND, {replica_id})
            return None
        out = self.leader.shrink_candidates(self.log.log_end_offset, now)
        return self.leader.begin_isr_change(IsrChangeKind.SHRINK, out) if out else None

    def state_for(self, change: PendingIsrChange) -> PartitionState:
        """The state znode body that commits ``change`` (leader, epoch and controller
        epoch as held: the write is conditional on the version held)."""
        return PartitionState(self.state.leader, self.state.leader_epoch,
                              tuple(sorted(change.proposed_isr)), self.state.controller_epoch)

    def isr_change_written(self, change: PendingIsrChange, version: int | None) -> None:
        """The ISR write's outcome: its new zkVersion, or None when refused (the watch
        brings the newer state)."""
        if self.leader.pending is not change:
            return
        if version is None:
            self.leader.isr_change_failed()
            return
        self.leader.isr_change_committed(change.proposed_isr)
        self.state = self.state_for(change)
        self.state_version = version
        self.update_min_insync()
        log.info("%r: isr now %s", self, sorted(change.proposed_isr))

    # -- the follower's side ---------------------------------------------------------------------
    def fetch_request(self, max_bytes: int) -> FetchPartition:
        return FetchPartition(self.topic_key, self.hosted.partition, self.leader_epoch,
                              self.log.log_end_offset, self.log.log_start_offset, max_bytes)

    def truncation_start(self) -> TruncationStep:
        """The first step of the truncation loop (before asking the leader)."""
        return truncation_step(
            follower_latest_epoch=self.log.epochs.latest_epoch,
            follower_log_end_offset=self.log.log_end_offset,
            follower_high_watermark=self.appender.high_watermark(self.row),
            leader_log_start_offset=self.leader_log_start_offset)

    def truncation_answer(self, leader_epoch: int, end_offset: int) -> TruncationStep:
        """The next step, given the leader's end of the epoch asked about."""
        return truncation_step(
            follower_latest_epoch=self.log.epochs.latest_epoch,
            follower_log_end_offset=self.log.log_end_offset,
            follower_high_watermark=self.appender.high_watermark(self.row),
            leader_log_start_offset=self.leader_log_start_offset,
            leader_epoch_end=(leader_epoch, end_offset),
            follower_epoch_end=self.log.epochs.end_offset_for(leader_epoch,
                                                              self.log.log_end_offset))

    def take_step(self, step: TruncationStep) -> bool:
        """Carry out a truncation step; True when the leader must be asked (again)."""
        if step.action is TruncationAction.ASK_LEADER:
            return True
        if step.action is TruncationAction.TRUNCATE_FULLY:
            self.log.truncate_fully_and_start_at(step.offset)
            self._after_truncation(step.offset)
        else:
            self.truncate(step.offset)
        if step.action is TruncationAction.TRUNCATE_AND_ASK_AGAIN:
            return True
        self.phase = FetchPhase.FETCHING
        return False

    def truncate(self, offset: int) -> None:
        """Cut the log to ``offset`` (see the module's rules)."""
        if offset < self.log.log_end_offset:
            log.info("%r: truncating from %d to %d", self, self.log.log_end_offset, offset)
            self.log.truncate_to(offset)
            self._after_truncation(offset)

    def _after_truncation(self, offset: int) -> None:
        self.appender.rebuild_producer_state(self.row)
        self.appender.refuse_parked_from(self.row, offset, CompletionCode.NOT_LEADER_OR_FOLLOWER)

    def apply_fetched(self, answer: FetchResponsePartition, now: int = 0) -> bool:
        """Apply the leader's answer for this partition (at ``now``, ms: a refusal
        that is retried backs off from then); True when the follower's high
        watermark moved."""
        self.leader_log_start_offset = answer.log_start_offset
        if answer.error is ErrorCode.OFFSET_OUT_OF_RANGE:
            self.take_step(offset_out_of_range_step(
                follower_log_end_offset=self.log.log_end_offset,
                leader_log_start_offset=answer.log_start_offset,
                leader_log_end_offset=answer.log_end_offset))
            return False
        if answer.error is not ErrorCode.NONE:
            self.refused(answer.error, now)
            return False
        if answer.records is not None:
            try:
                self.appender.append_replicated(self.row, answer.records)
            except CorruptRecordError as error:      # bases not where ours end: truncate again
                log.warning("%r: leader's batches do not follow ours (%s): truncating", self,
                            error)
                self.phase = FetchPhase.TRUNCATING
                return False
        high_watermark = follower_high_watermark(answer.high_watermark, self.log.log_end_offset,
                                                 self.log.log_start_offset)
        moved = high_watermark > self.appender.high_watermark(self.row)
        if moved:
            self.appender.advance_high_watermark(self.row, high_watermark)
        # Kafka's maybeIncrementLogStartOffset: the leader deleted records (retention,
        # delete-records); never past our high watermark.
        start = min(answer.log_start_offset, self.appender.high_watermark(self.row))
        if start > self.log.log_start_offset:
            try:
                self.log.advance_log_start_offset(start)
            except ShmlogError as error:
                log.warning("%r: cannot follow the leader's log start %d: %s", self, start,
                            error)
        return moved

    def refused(self, error: ErrorCode, now: int) -> None:
        """The leader refused a fetch or an EPOCH_END with ``error``: ask again after
        ``limits.FETCH_BACKOFF_MS`` when the leader may just be behind (``RETRIED_ERRORS``),
        else wait for a newer state (we are fenced: it is coming)."""
        if error in RETRIED_ERRORS:
            self.retry_at = now + limits.FETCH_BACKOFF_MS
            log.debug("%r: the leader answered %s: asking again in %d ms", self, error.name,
                      limits.FETCH_BACKOFF_MS)
            return
        log.info("%r: the leader refused our fetch (%s): waiting for a newer state", self,
                 error.name)
        self.phase = FetchPhase.WAITING

    def may_ask(self, now: int) -> bool:
        """Does this follower (or observer) have a request to make now?"""
        return self.role in (Role.FOLLOWER, Role.OBSERVER) and \
            self.phase is not FetchPhase.WAITING and now >= self.retry_at
