"""Replication's rules and messages, sans-I/O: Kafka 2.8's follower replication as
pure functions and small state objects, and the codec of the frames brokers send
each other. No sockets, no files, no clock: the time is passed in (milliseconds),
and every offset is a plain number the caller read from its log.

Rules (each names its Kafka 2.8 source; each has a table test)
---------------------------------------------------------------
* **Fetch state** (``Replica.updateFetchState``): on a fetch at ``now`` whose
  offset (the follower's log end) reaches the leader's log end, the follower was
  caught up *now*; one that reaches the leader's log end as of its previous fetch
  was caught up *then*; otherwise its ``last_caught_up_time_ms`` stays.
* **Becoming leader** (``Partition.makeLeader``): a follower in the ISR is taken as
  caught up now, any other as never; a new leader knows no follower's log end until
  it fetches (so an ISR member holds the high watermark until its first fetch).
* **ISR shrink** (``Partition.getOutOfSyncReplicas``): a follower whose log end is
  not the leader's and that was last caught up more than
  ``replica.lag.time.max.ms`` ago. Never the leader; nothing while an ISR change is
  in flight (``isInflight``).
* **ISR expand** (``Partition.isFollowerAtHighwatermark``): a replica outside the
  ISR whose log end reached the high watermark *and* the start of the leader's
  epoch.
* **High watermark** (``Partition.maybeIncrementLeaderHW``): the lowest log end
  over the maximal ISR (the committed ISR plus a pending expansion; a pending shrink
  still counts its replicas, as Kafka's ``PendingShrinkIsr.maximalIsr`` does), and,
  as Kafka 2.8 does, over any replica caught up within the lag time (so it can
  join). It never goes back and never passes the leader's log end; a replica whose
  log end is unknown holds it.
* **Fetch validation on the leader** (``Partition.getLocalLog``,
  ``checkCurrentLeaderEpoch``, ``Log.read``): the request's epoch first (lower:
  ``FENCED_LEADER_EPOCH``, higher: ``UNKNOWN_LEADER_EPOCH``), then leadership and
  membership (``NOT_LEADER_OR_FOLLOWER``), then the offset (outside
  ``[log start, log end]``: ``OFFSET_OUT_OF_RANGE``).
* **Follower high watermark** (``Log.updateHighWatermark``): the leader's, capped
  by the follower's own log end (and raised to its log start).
* **Truncation** (``AbstractFetcherThread.getOffsetTruncationState``, KIP-101 with
  KIP-279's repeat): see :func:`truncation_step`; and the out-of-range reset
  (``fetchOffsetAndTruncate``), :func:`offset_out_of_range_step`.
* **Long poll** (``DelayedFetch``): a fetch with nothing to return waits in
  :class:`FetchPurgatory` until bytes arrive, the high watermark passes the one last
  sent, leadership changes, or its wait ends.

Messages
--------
:class:`Message` is a replication message: the envelope's sender broker id and
epoch and correlation id, and a body (:class:`Fetch`, :class:`FetchResponse`,
:class:`EpochEnd`, :class:`EpochEndResponse`, :class:`Produce`,
:class:`ProduceResponse`, :class:`Error`; the design note's §3.1-3.3 bodies, each
with a ``partitions`` tuple of entries except ERROR; and :class:`GroupRequest`,
:class:`GroupResponse`, a consumer-group control request and its reply carried as
their control frames' text to and from the group's coordinator, ``cluster_groups``;
:class:`DeleteRecords`, :class:`DeleteRecordsResponse`, a client's DeleteRecords
forwarded to the partitions' leader, ``delete_records``). :func:`encode` gives its
frames (``replication_layout`` draws them): records travel as their own frames,
as given (a numpy view of a segment is sent without a copy). :func:`decode`
checks everything a peer sent (each field's type and range, no unknown or
missing field, no partition named twice, the record frames' count and lengths)
and raises only ``ReplicationProtocolError``; records come back as uint8 numpy
views of their frames. :func:`encode` runs the same checks on what it builds, so
a broker never sends what its peer would refuse (``LocalProtocolError``).

Theory of operation
-------------------
The replica service (on the broker's loop thread) owns one
:class:`LeaderReplicaState` per partition it leads and asks these functions what
to do; it does the I/O (appends, truncations, ZooKeeper writes, sends) itself.
Nothing here can block or fail on I/O, so each rule is tested with plain numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import json
import operator
import struct
from typing import Any, ClassVar, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ...common import limits
from ...common.errors import LocalProtocolError, ReplicationProtocolError
from . import layout as replication_layout
from .layout import MessageType

__all__ = [
    "UNKNOWN_OFFSET", "UNDEFINED_EPOCH", "NO_EPOCH", "NEVER_MS", "ErrorCode",
    "FollowerState", "IsrChangeKind", "PendingIsrChange", "LeaderReplicaState",
    "out_of_sync_replicas", "can_join_isr", "high_watermark", "check_leader_epoch",
    "validate_fetch", "validate_epoch_end", "follower_high_watermark",
    "TruncationAction", "TruncationStep", "truncation_step", "offset_out_of_range_step",
    "FetchPurgatory", "partition_ready",
    "MessageType", "Message", "Fetch", "FetchPartition", "FetchResponse",
    "FetchResponsePartition", "EpochEnd", "EpochEndPartition", "EpochEndResponse",
    "EpochEndResponsePartition", "Produce", "ProducePartition", "ProduceResponse",
    "ProduceResponsePartition", "GroupRequest", "GroupResponse", "DeleteRecords",
    "DeleteRecordsPartition", "DeleteRecordsResponse", "DeleteRecordsResponsePartition",
    "Error", "encode", "decode",
]

# Kafka's Log.UnknownOffset / UNDEFINED_EPOCH_OFFSET: a log end not yet known.
UNKNOWN_OFFSET = -1
# Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH: an epoch cache's "no such epoch".
UNDEFINED_EPOCH = -1
# A request that carries no current leader epoch (Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH
# in a request's current_leader_epoch): its epoch check is skipped.
NO_EPOCH = -1
# "Never", as a time in ms: further back than any lag, whatever clock the caller
# uses (Kafka uses 0 with wall-clock time; a monotonic clock may read less than
# replica.lag.time.max.ms shortly after boot, so 0 would read as "just now").
NEVER_MS = -(2**62)


class ErrorCode(enum.IntEnum):
    """Error codes of replication messages: Kafka's numbers (``Errors.java``) for
    the errors Kafka has, so a log line reads as Kafka's would."""
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    INVALID_RECORD = 87


# --- the leader's view of its followers ---------------------------------------------

@dataclasses.dataclass
class FollowerState:
    """What a leader knows of one follower (Kafka's ``Replica``): its log end and
    log start (``UNKNOWN_OFFSET`` until it fetches), when it last fetched, the
    leader's log end at that fetch, and when it was last caught up (ms)."""
    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = NEVER_MS
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = NEVER_MS
    last_sent_high_watermark: int = UNKNOWN_OFFSET

    def update_fetch_state(self, fetch_offset: int, now_ms: int, leader_log_end_offset: int,
                           *, log_start_offset: int = UNKNOWN_OFFSET) -> None:
        """Record a fetch at ``fetch_offset`` (the follower's log end) made at
        ``now_ms`` while the leader's log end was ``leader_log_end_offset``
        (Kafka's ``Replica.updateFetchState``)."""
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            # It has everything the leader had at its previous fetch: it was
            # caught up as of that fetch.
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms,
                                              self.last_fetch_time_ms)
        self.log_start_offset = log_start_offset
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_time_ms = now_ms


def out_of_sync_replicas(*, leader_id: int, isr: Iterable[int],
                         followers: Mapping[int, FollowerState], leader_log_end_offset: int,
                         now_ms: int, replica_lag_time_max_ms: int) -> frozenset[int]:
    """The ISR members to drop (Kafka's ``getOutOfSyncReplicas``): a follower whose
    log end differs from the leader's and that was last caught up more than the lag
    time ago. The leader is never one; an ISR member the leader has no state for
    counts as never caught up."""
    out = set()
    for broker_id in isr:
        if broker_id == leader_id:
            continue
        state = followers.get(broker_id) or FollowerState(broker_id)
        if state.log_end_offset != leader_log_end_offset and \
                now_ms - state.last_caught_up_time_ms > replica_lag_time_max_ms:
            out.add(broker_id)
    return frozenset(out)


def can_join_isr(*, follower_log_end_offset: int, high_watermark: int,
                 epoch_start_offset: int) -> bool:
    """May a follower outside the ISR join it (Kafka's
    ``isFollowerAtHighwatermark``)? Its log end must have reached the high watermark
    and the offset where the leader's current epoch began (else it could join with
    a prefix of an older epoch that this leader truncated away)."""
    return follower_log_end_offset >= high_watermark and \
        follower_log_end_offset >= epoch_start_offset >= 0


def high_watermark(*, leader_id: int, leader_log_end_offset: int, current_high_watermark: int,
                   maximal_isr: Iterable[int], followers: Mapping[int, FollowerState],
                   now_ms: int, replica_lag_time_max_ms: int) -> int:
    """The leader's new high watermark (Kafka 2.8's ``maybeIncrementLeaderHW``).

    The lowest log end over the leader, every member of the maximal ISR, and every
    other follower caught up within the lag time (Kafka 2.8 waits for those too, so
    a replica about to join is not left behind). A member whose log end is unknown
    holds the mark where it is. The result is never below ``current_high_watermark``
    and, since the leader's own log end is in the minimum, never above it.
    """
    candidate = leader_log_end_offset
    members = set(maximal_isr)
    members.discard(leader_id)
    for broker_id in members:
        if broker_id not in followers:
            return current_high_watermark          # an ISR member never heard from
    for broker_id, state in followers.items():
        counts = broker_id in members or \
            now_ms - state.last_caught_up_time_ms <= replica_lag_time_max_ms
        if counts and state.log_end_offset < candidate:
            candidate = state.log_end_offset
    return candidate if candidate > current_high_watermark else current_high_watermark


class IsrChangeKind(enum.Enum):
    """An ISR change the leader has written and not yet seen committed."""
    EXPAND = "expand"
    SHRINK = "shrink"


@dataclasses.dataclass(frozen=True)
class PendingIsrChange:
    """An ISR write in flight (Kafka's ``PendingExpandIsr``/``PendingShrinkIsr``):
    the replicas it adds or drops and the ISR it proposes."""
    kind: IsrChangeKind
    replicas: frozenset[int]
    proposed_isr: frozenset[int]


class LeaderReplicaState:
    """A leader's state of one partition: the epoch it leads, where that epoch
    began, the assignment, the committed ISR and any ISR change in flight, and a
    :class:`FollowerState` per follower (observers are tracked apart and never
    counted for the ISR or the high watermark).

    Kafka allows one ISR change in flight at a time; so does this: while one is
    pending, :meth:`shrink_candidates` and :meth:`expand_candidate` propose nothing.
    """

    def __init__(self, local_broker_id: int, replica_lag_time_max_ms: int):
        self.local_broker_id = local_broker_id
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.is_leader = False
        self.leader_epoch = UNDEFINED_EPOCH
        self.epoch_start_offset = UNKNOWN_OFFSET
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self.pending: PendingIsrChange | None = None
        self.followers: dict[int, FollowerState] = {}
        self.observers: dict[int, FollowerState] = {}

    def become_leader(self, *, leader_epoch: int, epoch_start_offset: int,
                      replicas: Iterable[int], isr: Iterable[int], now_ms: int) -> None:
        """Lead ``leader_epoch``, which starts at ``epoch_start_offset`` (the log end
        when it was taken), with the assignment and ISR of the partition state
        (Kafka's ``Partition.makeLeader``).

        Each follower's last caught-up time becomes ``now_ms`` if it is in the ISR,
        else never. A broker that was not leading forgets every follower's log end (a
        follower must fetch before it counts); one re-elected keeps them.
        """
        was_leader = self.is_leader
        self.is_leader = True
        self.leader_epoch = leader_epoch
        self.epoch_start_offset = epoch_start_offset
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr)
        self.pending = None
        followers = {}
        for broker_id in self.replicas:
            if broker_id == self.local_broker_id:
                continue
            state = self.followers.get(broker_id) if was_leader else None
            state = state or FollowerState(broker_id)
            # Kafka's resetLastCaughtUpTime: as if each fetched at the epoch's start now.
            state.last_fetch_leader_log_end_offset = epoch_start_offset
            state.last_fetch_time_ms = now_ms
            state.last_caught_up_time_ms = now_ms if broker_id in self.isr else NEVER_MS
            if not was_leader:
                # Kafka then records an unknown fetch: the follower's log end is
                # unknown, and so is the leader's log end "at its last fetch".
                state.update_fetch_state(UNKNOWN_OFFSET, NEVER_MS, UNKNOWN_OFFSET)
            followers[broker_id] = state
        self.followers = followers
        self.observers = {}

    def resign(self) -> None:
        """Stop leading: the epoch, the ISR and every follower's state are forgotten."""
        self.is_leader = False
        self.leader_epoch = UNDEFINED_EPOCH
        self.epoch_start_offset = UNKNOWN_OFFSET
        self.replicas = ()
        self.isr = frozenset()
        self.pending = None
        self.followers = {}
        self.observers = {}

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR plus a pending expansion (a pending shrink still counts
        the replicas it drops: Kafka's ``maximalIsr``)."""
        if self.pending is not None and self.pending.kind is IsrChangeKind.EXPAND:
            return self.isr | self.pending.replicas
        return self.isr

    def record_fetch(self, broker_id: int, fetch_offset: int, now_ms: int,
                     leader_log_end_offset: int, *, log_start_offset: int = UNKNOWN_OFFSET,
                     observer: bool = False) -> FollowerState:
        """Record a validated fetch from a follower (or an observer)."""
        table = self.observers if observer and broker_id not in self.followers else self.followers
        state = table.setdefault(broker_id, FollowerState(broker_id))
        state.update_fetch_state(fetch_offset, now_ms, leader_log_end_offset,
                                 log_start_offset=log_start_offset)
        return state

    def high_watermark(self, leader_log_end_offset: int, current_high_watermark: int,
                       now_ms: int) -> int:
        """The new high watermark: :func:`high_watermark` over this state."""
        return high_watermark(
            leader_id=self.local_broker_id, leader_log_end_offset=leader_log_end_offset,
            current_high_watermark=current_high_watermark, maximal_isr=self.maximal_isr,
            followers=self.followers, now_ms=now_ms,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms)

    def shrink_candidates(self, leader_log_end_offset: int, now_ms: int) -> frozenset[int]:
        """The ISR members out of sync now (none while an ISR change is in flight)."""
        if self.pending is not None:
            return frozenset()
        return out_of_sync_replicas(
            leader_id=self.local_broker_id, isr=self.isr, followers=self.followers,
            leader_log_end_offset=leader_log_end_offset, now_ms=now_ms,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms)

    def expand_candidate(self, broker_id: int, high_watermark: int) -> bool:
        """May ``broker_id`` join the ISR now (an assigned replica outside it, no ISR
        change in flight, :func:`can_join_isr`)?"""
        state = self.followers.get(broker_id)
        return self.pending is None and state is not None and broker_id in self.replicas \
            and broker_id not in self.isr and can_join_isr(
                follower_log_end_offset=state.log_end_offset, high_watermark=high_watermark,
                epoch_start_offset=self.epoch_start_offset)

    def begin_isr_change(self, kind: IsrChangeKind, replicas: Iterable[int]) -> PendingIsrChange:
        """Mark an ISR write in flight and return it (the caller writes
        ``proposed_isr`` to ZooKeeper)."""
        assert self.pending is None, "one ISR change at a time"
        replicas = frozenset(replicas)
        assert self.local_broker_id not in replicas, "the ISR never loses its leader"
        proposed = self.isr | replicas if kind is IsrChangeKind.EXPAND else self.isr - replicas
        self.pending = PendingIsrChange(kind, replicas, proposed)
        return self.pending

    def isr_change_committed(self, isr: Iterable[int]) -> None:
        """The write succeeded (or ZooKeeper shows a newer ISR of this epoch).

        A follower the ISR lost (the controller took out a broker that died or
        shuts down) no longer holds the high watermark as "caught up within the lag
        time": Kafka 2.8 bumps the epoch for that, and ``Partition.makeLeader`` then
        resets the last caught-up time of every replica outside the ISR; this epoch
        is kept, so the reset is done here (else acks=all waits out
        ``replica.lag.time.max.ms`` for a follower gone). It catches up, and is
        counted, again from its next fetch."""
        isr = frozenset(isr)
        for broker_id in self.isr - isr:
            follower = self.followers.get(broker_id)
            if follower is not None:
                follower.last_caught_up_time_ms = NEVER_MS
        self.isr = isr
        self.pending = None

    def isr_change_failed(self) -> None:
        """The write was refused: the committed ISR stands."""
        self.pending = None


# --- validating a request on the leader ---------------------------------------------

def check_leader_epoch(request_epoch: int, leader_epoch: int) -> ErrorCode:
    """Kafka's ``Partition.checkCurrentLeaderEpoch``: a request epoch below ours is
    from a fenced replica; above ours, this broker has not yet learnt the new
    epoch (the leader should take it as a hint that its own state is stale)."""
    if request_epoch == NO_EPOCH:
        return ErrorCode.NONE
    if request_epoch < leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if request_epoch > leader_epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return ErrorCode.NONE


def validate_epoch_end(*, is_leader: bool, leader_epoch: int, request_epoch: int,
                       replica_id: int, replicas: Iterable[int], observer: bool) -> ErrorCode:
    """The checks of an EPOCH_END (OffsetForLeaderEpoch) request, in Kafka's order
    (``Partition.getLocalLog``): the epoch, then leadership, then membership.

    Kafka 2.8 answers a fetch from a broker that is not a replica with empty data;
    the design note answers ``NOT_LEADER_OR_FOLLOWER`` (as later Kafka does), unless
    the requester fetches as an observer."""
    error = check_leader_epoch(request_epoch, leader_epoch)
    if error is not ErrorCode.NONE:
        return error
    if not is_leader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if replica_id not in replicas and not observer:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NONE


def validate_fetch(*, is_leader: bool, leader_epoch: int, request_epoch: int,
                   replica_id: int, replicas: Iterable[int], observer: bool,
                   fetch_offset: int, log_start_offset: int, log_end_offset: int) -> ErrorCode:
    """The checks of one partition of a FETCH on the leader: those of
    :func:`validate_epoch_end`, then the offset (Kafka's ``Log.read``: an offset
    outside ``[log_start_offset, log_end_offset]`` is out of range; the log end
    itself is a valid, empty read)."""
    error = validate_epoch_end(is_leader=is_leader, leader_epoch=leader_epoch,
                               request_epoch=request_epoch, replica_id=replica_id,
                               replicas=replicas, observer=observer)
    if error is not ErrorCode.NONE:
        return error
    if not log_start_offset <= fetch_offset <= log_end_offset:
        return ErrorCode.OFFSET_OUT_OF_RANGE
    return ErrorCode.NONE


def follower_high_watermark(leader_high_watermark: int, log_end_offset: int,
                            log_start_offset: int = 0) -> int:
    """A follower's high watermark after a fetch response (Kafka's
    ``Log.updateHighWatermark``): the leader's, never past the follower's own log
    end, never below its log start. (The appender's ``advance_high_watermark``
    keeps it from moving back.)"""
    return max(log_start_offset, min(leader_high_watermark, log_end_offset))


# --- follower truncation ------------------------------------------------------------

class TruncationAction(enum.Enum):
    """What a truncating follower does next."""
    ASK_LEADER = "ask leader"             # send EPOCH_END for ``epoch``
    TRUNCATE = "truncate"                 # truncate to ``offset``, then fetch from it
    TRUNCATE_AND_ASK_AGAIN = "truncate and ask again"   # then EPOCH_END for the new latest epoch
    TRUNCATE_FULLY = "truncate fully"     # empty the log, start it at ``offset``


@dataclasses.dataclass(frozen=True)
class TruncationStep:
    """One step of the truncation loop: an action, its offset (``UNKNOWN_OFFSET`` for
    ASK_LEADER) and, for ASK_LEADER, the epoch to ask about."""
    action: TruncationAction
    offset: int = UNKNOWN_OFFSET
    epoch: int = UNDEFINED_EPOCH


def truncation_step(*, follower_latest_epoch: int, follower_log_end_offset: int,
                    follower_high_watermark: int, leader_log_start_offset: int = UNKNOWN_OFFSET,
                    leader_epoch_end: tuple[int, int] | None = None,
                    follower_epoch_end: tuple[int, int] | None = None) -> TruncationStep:
    """The next step of a follower's truncation (KIP-101, repeated as KIP-279 adds;
    Kafka's ``AbstractFetcherThread.maybeTruncate`` and ``getOffsetTruncationState``).

    Parameters
    ----------
    follower_latest_epoch
        The latest epoch in the follower's epoch cache (``UNDEFINED_EPOCH``: empty).
    follower_log_end_offset, follower_high_watermark
        The follower's log end and high watermark.
    leader_log_start_offset
        The leader's log start, if known (``UNKNOWN_OFFSET`` if not).
    leader_epoch_end
        The leader's EPOCH_END reply ``(epoch, end_offset)`` to the last ask, or None
        before asking.
    follower_epoch_end
        The follower's own ``end_offset_for(leader's epoch)`` (``(-1, -1)`` when
        undefined); given with ``leader_epoch_end``.

    Returns
    -------
    TruncationStep
        * No reply yet, an epoch cache: ASK_LEADER about the latest epoch.
        * No reply yet, an empty cache (a new replica): TRUNCATE_FULLY at the
          leader's log start if the log ends at or below it, else TRUNCATE to the
          high watermark (Kafka's ``truncateToHighWatermark`` fallback).
        * The leader knows no such epoch (end offset undefined): TRUNCATE to the
          high watermark.
        * The follower knows the leader's epoch: TRUNCATE to the lower of both ends.
        * The follower does not (it has a lower floor epoch): TRUNCATE_AND_ASK_AGAIN
          to its own end of that floor epoch (KIP-279: the logs may diverge further
          back, which only another ask can find).
        * The follower has no entry at or below the leader's epoch: TRUNCATE to the
          leader's end.
        Every offset is capped by the follower's log end (truncation never grows).
    """
    leo = follower_log_end_offset
    if leader_epoch_end is None:
        if follower_latest_epoch != UNDEFINED_EPOCH:
            return TruncationStep(TruncationAction.ASK_LEADER, epoch=follower_latest_epoch)
        if 0 <= leader_log_start_offset and leo <= leader_log_start_offset:
            return TruncationStep(TruncationAction.TRUNCATE_FULLY, leader_log_start_offset)
        return TruncationStep(TruncationAction.TRUNCATE, min(follower_high_watermark, leo))
    leader_epoch, leader_end = leader_epoch_end
    if leader_end == UNKNOWN_OFFSET:
        return TruncationStep(TruncationAction.TRUNCATE, min(follower_high_watermark, leo))
    if leader_epoch == UNDEFINED_EPOCH:
        # Kafka: a leader that answers an end offset without its epoch (an old
        # protocol): truncate to that end.
        return TruncationStep(TruncationAction.TRUNCATE, min(leader_end, leo))
    assert follower_epoch_end is not None, "look up the leader's epoch in the follower's cache"
    follower_epoch, follower_end = follower_epoch_end
    if follower_end == UNKNOWN_OFFSET:
        return TruncationStep(TruncationAction.TRUNCATE, min(leader_end, leo))
    if follower_epoch != leader_epoch:
        return TruncationStep(TruncationAction.TRUNCATE_AND_ASK_AGAIN, min(follower_end, leo))
    return TruncationStep(TruncationAction.TRUNCATE, min(leader_end, follower_end, leo))


def offset_out_of_range_step(*, follower_log_end_offset: int, leader_log_start_offset: int,
                             leader_log_end_offset: int) -> TruncationStep:
    """What a follower does when the leader answered its fetch with
    ``OFFSET_OUT_OF_RANGE`` (Kafka's ``AbstractFetcherThread.fetchOffsetAndTruncate``).

    * The leader's log ends below the follower's (only after an unclean election):
      TRUNCATE to the leader's log end.
    * The follower's log ends below the leader's log start (it was away while the
      leader deleted segments): TRUNCATE_FULLY at the leader's log start.
    * Otherwise the leader moved on meanwhile: TRUNCATE to its own log end (nothing
      to cut) and fetch again from there.
    """
    if leader_log_end_offset < follower_log_end_offset:
        return TruncationStep(TruncationAction.TRUNCATE, leader_log_end_offset)
    if leader_log_start_offset > follower_log_end_offset:
        return TruncationStep(TruncationAction.TRUNCATE_FULLY, leader_log_start_offset)
    return TruncationStep(TruncationAction.TRUNCATE, follower_log_end_offset)


# --- the long poll ------------------------------------------------------------------

def partition_ready(*, error: ErrorCode, fetch_offset: int, log_end_offset: int,
                    high_watermark: int, high_watermark_last_sent: int) -> bool:
    """Must a fetch be answered at once for this partition (Kafka 2.8's
    ``ReplicaManager.fetchMessages``: "respond immediately if ... has enough data,
    some error happens while reading data, any of the requested partitions need HW
    update", with ``replica.fetch.min.bytes`` 1)? A fetch is answered at once if it
    asks to wait 0 ms, names no partition, or any partition is ready; otherwise it
    is parked in :class:`FetchPurgatory`."""
    return error is not ErrorCode.NONE or log_end_offset > fetch_offset \
        or high_watermark > high_watermark_last_sent



@dataclasses.dataclass
class _ParkedFetch:
    deadline_ms: int
    partitions: dict[Hashable, tuple[int, int]]     # partition -> (fetch offset, HW sent)


class FetchPurgatory:
    """Fetches that found nothing to return (no partition :func:`partition_ready`),
    parked until the first of (Kafka's ``DelayedFetch``, plus the high-watermark rule
    of the design note §3.2, which Kafka applies only as a fetch arrives):

    * :meth:`log_end_moved`: one of its partitions' log end passed its fetch offset
      (a follower's ``min_bytes`` is 1, Kafka's ``replica.fetch.min.bytes`` default:
      any record is enough);
    * :meth:`high_watermark_moved`: a partition's high watermark passed the one last
      sent to that fetcher (so a follower's HW, and what its readers see, does not lag
      ``max_wait_ms`` on a quiet partition);
    * :meth:`leadership_changed`: its answer now carries errors;
    * :meth:`expire`: its deadline passed (answered empty).

    Keys are the caller's (for example ``(peer, correlation id)``); partitions are
    any hashable name (``(topic_key, partition)``). Each method returns the keys to
    answer now, each once, in the order they were parked, and forgets them. A parked
    fetch holds no data: the caller builds the answer when it fires.
    """

    def __init__(self) -> None:
        self._parked: dict[Hashable, _ParkedFetch] = {}
        self._by_partition: dict[Hashable, dict[Hashable, None]] = {}
        self._deadlines: list[tuple[int, int, Hashable]] = []
        self._order = itertools.count()
        self._rank: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._parked

    def park(self, key: Hashable, deadline_ms: int,
             partitions: Mapping[Hashable, tuple[int, int]]) -> None:
        """Park fetch ``key`` until ``deadline_ms``; ``partitions`` maps each
        partition it asks for to ``(fetch_offset, high_watermark_last_sent)``."""
        assert key not in self._parked, f"fetch {key!r} is already parked"
        rank = next(self._order)
        self._parked[key] = _ParkedFetch(deadline_ms, dict(partitions))
        self._rank[key] = rank
        for partition in partitions:
            self._by_partition.setdefault(partition, {})[key] = None
        heapq.heappush(self._deadlines, (deadline_ms, rank, key))

    def remove(self, key: Hashable) -> bool:
        """Forget a parked fetch (its peer is gone); was it parked?"""
        fetch = self._parked.pop(key, None)
        if fetch is None:
            return False
        del self._rank[key]
        for partition in fetch.partitions:
            waiting = self._by_partition[partition]
            del waiting[key]
            if not waiting:
                del self._by_partition[partition]
        return True

    def log_end_moved(self, partition: Hashable, log_end_offset: int) -> list[Hashable]:
        """A partition's log end is now ``log_end_offset``: fetches with records to read."""
        return self._fire(partition, lambda offsets: log_end_offset > offsets[0])

    def high_watermark_moved(self, partition: Hashable, high_watermark: int) -> list[Hashable]:
        """A partition's high watermark is now ``high_watermark``: fetches last sent a
        lower one."""
        return self._fire(partition, lambda offsets: high_watermark > offsets[1])

    def leadership_changed(self, partition: Hashable) -> list[Hashable]:
        """A partition's leader or epoch changed: every fetch waiting on it."""
        return self._fire(partition, lambda offsets: True)

    def expire(self, now_ms: int) -> list[Hashable]:
        """Fetches whose deadline is at or before ``now_ms``."""
        fired = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, rank, key = heapq.heappop(self._deadlines)
            if self._rank.get(key) == rank:        # not answered meanwhile
                self.remove(key)
                fired.append(key)
        return fired

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a parked fetch (for the loop's sleep), or None."""
        while self._deadlines and self._rank.get(self._deadlines[0][2]) != self._deadlines[0][1]:
            heapq.heappop(self._deadlines)         # answered before its deadline
        return self._deadlines[0][0] if self._deadlines else None

    def _fire(self, partition: Hashable, fires) -> list[Hashable]:
        waiting = self._by_partition.get(partition)
        if not waiting:
            return []
        fired = [key for key in waiting if fires(self._parked[key].partitions[partition])]
        fired.sort(key=self._rank.__getitem__)
        for key in fired:
            self.remove(key)
        return fired


# --- messages -----------------------------------------------------------------------
# The bodies of replication_layout's frames. Records are any contiguous byte buffer
# (bytes, memoryview, a uint8 numpy view of a segment); decode hands them on as uint8
# numpy views of the received frames, without a copy.

_I32_MAX = 2**31 - 1
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1

# Field kinds: ("int", lowest, highest), ("bool",), ("error",), ("str", longest).
_TOPIC_KEY = ("int", _I64_MIN, _I64_MAX)
_PARTITION = ("int", 0, limits.PARTITIONS_PER_TOPIC_MAX - 1)
_EPOCH = ("int", UNDEFINED_EPOCH, _I32_MAX)          # -1: none / undefined
_OFFSET = ("int", 0, limits.OFFSET_MAX)
_OFFSET_OR_UNKNOWN = ("int", UNKNOWN_OFFSET, limits.OFFSET_MAX)
_ERROR = ("error",)


@dataclasses.dataclass(frozen=True)
class FetchPartition:
    """One partition of a FETCH (Kafka's FetchRequest partition, trimmed): the
    follower's log end as ``fetch_offset`` and its log start."""
    topic_key: int
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, current_leader_epoch=_EPOCH,
        fetch_offset=_OFFSET, log_start_offset=_OFFSET_OR_UNKNOWN,
        partition_max_bytes=("int", 0, limits.REPLICATION_RECORDS_SIZE_MAX))


@dataclasses.dataclass(frozen=True)
class Fetch:
    """FETCH: a follower (or observer) asks the leader for records past its log end,
    waiting up to ``max_wait_ms`` for some (§3.2). ``replica_id`` must be the
    sender's broker id."""
    replica_id: int
    observer: bool
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: tuple[FetchPartition, ...]
    SCHEMA: ClassVar[dict] = dict(
        replica_id=("int", 0, _I32_MAX), observer=("bool",),
        max_wait_ms=("int", 0, limits.REPLICATION_FETCH_WAIT_MS_MAX),
        min_bytes=("int", 0, limits.FETCH_SIZE_MAX), max_bytes=("int", 0, limits.FETCH_SIZE_MAX))


@dataclasses.dataclass(frozen=True)
class FetchResponsePartition:
    """One partition of a FETCH_RESPONSE: an error (OFFSET_OUT_OF_RANGE carries the
    leader's log start and end), the leader's high watermark, and the records read
    from ``fetch_offset`` (None: none)."""
    topic_key: int
    partition: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    records: Any = dataclasses.field(default=None, compare=False, repr=False)
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
        high_watermark=_OFFSET_OR_UNKNOWN, log_start_offset=_OFFSET_OR_UNKNOWN,
        log_end_offset=_OFFSET_OR_UNKNOWN)
    RECORDS_SIZE_MIN: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class FetchResponse:
    """FETCH_RESPONSE: one entry per partition of the FETCH."""
    partitions: tuple[FetchResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class EpochEndPartition:
    """One partition of an EPOCH_END (Kafka's OffsetForLeaderEpoch): the end offset
    of ``leader_epoch`` on the leader, asked by a follower at ``current_leader_epoch``."""
    topic_key: int
    partition: int
    current_leader_epoch: int
    leader_epoch: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION,
                                     current_leader_epoch=_EPOCH, leader_epoch=_EPOCH)


@dataclasses.dataclass(frozen=True)
class EpochEnd:
    """EPOCH_END: a truncating follower asks where its epochs end on the leader (§3.3)."""
    partitions: tuple[EpochEndPartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class EpochEndResponsePartition:
    """The leader's ``end_offset_for``: ``(leader_epoch, end_offset)``, (-1, -1) when
    undefined."""
    topic_key: int
    partition: int
    error: ErrorCode
    leader_epoch: int
    end_offset: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
                                     leader_epoch=_EPOCH, end_offset=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class EpochEndResponse:
    """EPOCH_END_RESPONSE: one entry per partition of the EPOCH_END."""
    partitions: tuple[EpochEndResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class ProducePartition:
    """A batch (or run of batches) forwarded to a partition's leader."""
    topic_key: int
    partition: int
    records: Any = dataclasses.field(compare=False, repr=False)
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION)
    RECORDS_SIZE_MIN: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class Produce:
    """PRODUCE: a broker forwards its local producers' batches to the leader (§5),
    with the producer's ``acks`` (-1 all, 0, 1) and a timeout."""
    acks: int
    timeout_ms: int
    partitions: tuple[ProducePartition, ...]
    SCHEMA: ClassVar[dict] = dict(acks=("int", -1, 1),
                                     timeout_ms=("int", 0, limits.CLIENT_WAIT_MS_MAX))


@dataclasses.dataclass(frozen=True)
class ProduceResponsePartition:
    """The leader's answer for one forwarded partition: the base offset (-1 on an
    error), the LogAppendTime stamp (-1 if none) and the log start."""
    topic_key: int
    partition: int
    error: ErrorCode
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR, base_offset=_OFFSET_OR_UNKNOWN,
        log_append_time_ms=("int", -1, limits.TIMESTAMP_MS_MAX),
        log_start_offset=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class ProduceResponse:
    """PRODUCE_RESPONSE: one entry per partition of the PRODUCE."""
    partitions: tuple[ProduceResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """GROUP: a member's group request (join, sync, heartbeat, commit, ...) that its
    local broker forwards to the group's coordinator: the control request frame
    (``control.encode_request``) as text. The coordinator's broker checks it as it
    checks a control frame (``control.handle_frame``)."""
    request: str
    SCHEMA: ClassVar[dict] = dict(request=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class GroupResponse:
    """GROUP_RESPONSE: the coordinator's control reply frame (``control.encode_result``)
    as text, handed back to the member as its local broker's reply."""
    reply: str
    SCHEMA: ClassVar[dict] = dict(reply=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class DeleteRecordsPartition:
    """One partition of a DELETE_RECORDS: the log start asked for (-1: the leader's
    high watermark)."""
    topic_key: int
    partition: int
    offset: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION,
                                     offset=("int", -1, limits.OFFSET_MAX))


@dataclasses.dataclass(frozen=True)
class DeleteRecords:
    """DELETE_RECORDS: a broker forwards its client's DeleteRecords to the leader of
    the partitions (``delete_records``' rules)."""
    partitions: tuple[DeleteRecordsPartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class DeleteRecordsResponsePartition:
    """The leader's answer for one partition: the offset it resolved (-1 resolved
    to its high watermark; the refused one with an error) and the low watermark
    (``UNKNOWN_OFFSET`` until every live follower reported its log start)."""
    topic_key: int
    partition: int
    error: ErrorCode
    offset: int
    low_watermark: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
                                     offset=("int", _I64_MIN, limits.OFFSET_MAX),
                                     low_watermark=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class DeleteRecordsResponse:
    """DELETE_RECORDS_RESPONSE: one entry per partition of the DELETE_RECORDS."""
    partitions: tuple[DeleteRecordsResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class Error:
    """ERROR: the answer to a message that could not be read (or not served)."""
    error: ErrorCode
    message: str
    SCHEMA: ClassVar[dict] = dict(
        error=_ERROR, message=("str", limits.REPLICATION_ERROR_MESSAGE_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class Message:
    """A replication message: the envelope's fields and a body."""
    sender_broker_id: int
    sender_broker_epoch: int
    correlation_id: int
    body: (Fetch | FetchResponse | EpochEnd | EpochEndResponse | Produce | ProduceResponse
           | GroupRequest | GroupResponse | DeleteRecords | DeleteRecordsResponse | Error)

    @property
    def message_type(self) -> MessageType:
        return _TYPE_OF[type(self.body)]


_TYPE_OF = {Fetch: MessageType.FETCH, FetchResponse: MessageType.FETCH_RESPONSE,
            EpochEnd: MessageType.EPOCH_END, EpochEndResponse: MessageType.EPOCH_END_RESPONSE,
            Produce: MessageType.PRODUCE, ProduceResponse: MessageType.PRODUCE_RESPONSE,
            GroupRequest: MessageType.GROUP, GroupResponse: MessageType.GROUP_RESPONSE,
            DeleteRecords: MessageType.DELETE_RECORDS,
            DeleteRecordsResponse: MessageType.DELETE_RECORDS_RESPONSE,
            Error: MessageType.ERROR}
_BODY_OF = {message_type: body for body, message_type in _TYPE_OF.items()}
_ENTRY_OF = {Fetch: FetchPartition, FetchResponse: FetchResponsePartition,
             EpochEnd: EpochEndPartition, EpochEndResponse: EpochEndResponsePartition,
             Produce: ProducePartition, ProduceResponse: ProduceResponsePartition,
             DeleteRecords: DeleteRecordsPartition,
             DeleteRecordsResponse: DeleteRecordsResponsePartition}
_ENVELOPE = struct.Struct(replication_layout.ENVELOPE_FORMAT)


def _refuse(message: str) -> ReplicationProtocolError:
    return ReplicationProtocolError(message)


def _check(value: Any, kind: tuple, where: str) -> Any:
    """A body field of its kind, or a ReplicationProtocolError naming it."""
    name = kind[0]
    if name == "int":
        if type(value) is not int or not kind[1] <= value <= kind[2]:
            raise _refuse(f"{where} must be an integer in [{kind[1]}, {kind[2]}], "
                          f"got {value!r:.80}")
        return value
    if name == "bool":
        if type(value) is not bool:
            raise _refuse(f"{where} must be true or false, got {value!r:.80}")
        return value
    if name == "error":
        if type(value) is not int or value not in _ERROR_CODES:
            raise _refuse(f"{where} must be a known error code, got {value!r:.80}")
        return ErrorCode(value)
    if name == "list":
        if type(value) is not list:
            raise _refuse(f"{where} must be a list, got {type(value).__name__}")
        return value
    assert name == "str", kind
    if type(value) is not str or len(value) > kind[1]:
        raise _refuse(f"{where} must be a string of at most {kind[1]} characters, "
                      f"got {type(value).__name__} {value!r:.80}")
    return value


_ERROR_CODES = frozenset(int(code) for code in ErrorCode)


def _fields(obj: Any, schema: dict, where: str) -> dict:
    """The schema's fields of a decoded JSON object (exactly those, each checked)."""
    if not isinstance(obj, dict):
        raise _refuse(f"{where} must be a JSON object, got {type(obj).__name__}")
    if obj.keys() != schema.keys():
        missing, extra = schema.keys() - obj.keys(), obj.keys() - schema.keys()
        raise _refuse(f"{where} has fields {sorted(obj)[:20]!r:.300}: "
                      f"missing {sorted(missing)}, unknown {sorted(extra)[:10]!r:.200}")
    fields = {}
    for name, kind in schema.items():
        value = obj[name]
        # The common case inline: an integer in range needs no call and no message.
        if kind[0] == "int" and type(value) is int and kind[1] <= value <= kind[2]:
            fields[name] = value
        else:
            fields[name] = _check(value, kind, f"{where}.{name}")
    return fields


def _records_size(records: Any, where: str) -> int:
    try:
        view = memoryview(records)
    except TypeError:
        raise LocalProtocolError(f"{where}.records must be a bytes-like buffer, "
                                 f"got {type(records).__name__}") from None
    if not view.contiguous:
        raise LocalProtocolError(f"{where}.records must be contiguous")
    return view.nbytes


def _encode_entries(body: Any) -> tuple[list[dict], list]:
    """The body's partition entries as JSON objects, and their record frames."""
    entries, frames = [], []
    for index, entry in enumerate(body.partitions):
        item = {name: _plain(getattr(entry, name), f"partitions[{index}].{name}")
                for name in entry.SCHEMA}
        if hasattr(entry, "RECORDS_SIZE_MIN"):
            size = 0 if entry.records is None else \
                _records_size(entry.records, f"partitions[{index}]")
            item["records_bytes"] = size
            if size:
                frames.append(entry.records)
        entries.append(item)
    return entries, frames


def encode(message: Message) -> list:
    """The frames of a message (replication_layout): the envelope, the JSON body,
    then each partition entry's records, as given (no copy).

    Raises
    ------
    LocalProtocolError
        A field is out of range or of the wrong type, or the body is too large:
        a peer would refuse the message, so it is not sent.
    """
    body = message.body
    message_type = _TYPE_OF.get(type(body))
    if message_type is None:
        raise LocalProtocolError(f"not a replication message body: {type(body).__name__}")
    if message_type is MessageType.ERROR:
        body = dataclasses.replace(
            body, message=body.message[:limits.REPLICATION_ERROR_MESSAGE_LENGTH_MAX])
    fields = {name: _plain(getattr(body, name), name) for name in body.SCHEMA}
    record_frames: list = []
    if type(body) in _ENTRY_OF:
        fields["partitions"], record_frames = _encode_entries(body)
    frames = [_envelope_bytes(message, message_type), json.dumps(
        fields, separators=(",", ":"), ensure_ascii=False).encode()] + record_frames
    try:                        # what the peer will check, checked before it is sent
        _body_from_object(message_type, fields, record_frames, message.sender_broker_id)
    except ReplicationProtocolError as error:
        raise LocalProtocolError(f"cannot send {message_type.name}: {error}") from None
    return frames


def _plain(value: Any, where: str) -> Any:
    """A field as JSON takes it: bools and strings as they are, integers (enums,
    numpy integers) as int; anything else is the caller's mistake."""
    if type(value) is int or isinstance(value, (bool, str)):
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise LocalProtocolError(f"field {where} must be an integer, "
                                 f"got {type(value).__name__} {value!r:.80}") from None


def _envelope_bytes(message: Message, message_type: MessageType) -> bytes:
    _check_envelope(message.sender_broker_id, message.sender_broker_epoch,
                    message.correlation_id, message_type, LocalProtocolError)
    return _ENVELOPE.pack(replication_layout.MAGIC, replication_layout.VERSION,
                          message_type, message.sender_broker_id,
                          message.sender_broker_epoch, message.correlation_id)


def _check_envelope(sender_broker_id: Any, sender_broker_epoch: Any, correlation_id: Any,
                    message_type: MessageType, error_class: type) -> None:
    for name, value, low in (("sender_broker_id", sender_broker_id, 0),
                             ("sender_broker_epoch", sender_broker_epoch, 0),
                             ("correlation_id", correlation_id, 0)):
        high = _I32_MAX if name == "sender_broker_id" else _I64_MAX
        if type(value) is not int or not low <= value <= high:
            raise error_class(f"envelope {name} must be an integer in [{low}, {high}], "
                              f"got {value!r:.80}")
    if correlation_id == 0 and message_type is not MessageType.ERROR:
        raise error_class(f"a {message_type.name} needs a correlation id above 0")


def decode(frames: Sequence) -> Message:
    """The message in ``frames`` (bytes-like objects: bytes, memoryviews, zmq frames'
    buffers). Records come back as uint8 numpy views of their frames (no copy).

    Raises
    ------
    ReplicationProtocolError
        Anything that is not a well-formed message of this version: every field's
        type and range, the frame count and each record frame's length are checked.
    """
    if len(frames) < replication_layout.FIRST_RECORDS_FRAME:
        raise _refuse(f"a message has at least 2 frames (envelope, body), got {len(frames)}")
    envelope = _bytes(frames[replication_layout.ENVELOPE_FRAME], "envelope")
    if len(envelope) != replication_layout.ENVELOPE_LENGTH:
        raise _refuse(f"the envelope is {replication_layout.ENVELOPE_LENGTH} bytes, "
                      f"got {len(envelope)}")
    magic, version, type_number, sender_id, sender_epoch, correlation_id = \
        _ENVELOPE.unpack(envelope)
    if magic != replication_layout.MAGIC:
        raise _refuse(f"bad magic {magic:#06x} (expected {replication_layout.MAGIC:#06x}): "
                      f"not a replication message")
    if version != replication_layout.VERSION:
        raise _refuse(f"unsupported version {version}; this broker speaks "
                      f"{replication_layout.VERSION}")
    if type_number not in _TYPE_NUMBERS:
        raise _refuse(f"unknown message type {type_number}")
    message_type = MessageType(type_number)
    _check_envelope(sender_id, sender_epoch, correlation_id, message_type, ReplicationProtocolError)
    body = _decode_body(message_type, frames[replication_layout.BODY_FRAME],
                        frames[replication_layout.FIRST_RECORDS_FRAME:], sender_id)
    return Message(sender_id, sender_epoch, correlation_id, body)


_TYPE_NUMBERS = frozenset(int(message_type) for message_type in MessageType)


def _bytes(frame: Any, where: str) -> bytes:
    try:
        return memoryview(frame).tobytes()
    except TypeError:
        raise _refuse(f"the {where} frame is not a byte buffer ({type(frame).__name__})") from None


def _decode_body(message_type: MessageType, body_frame: Any, record_frames: Sequence,
                 sender_id: int) -> Any:
    text = _bytes(body_frame, "body")
    if len(text) > limits.REPLICATION_BODY_SIZE_MAX:
        raise _refuse(f"a body of {len(text)} bytes exceeds {limits.REPLICATION_BODY_SIZE_MAX}")
    try:
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise _refuse(f"the body is not UTF-8 JSON ({error})") from None
    except RecursionError:
        raise _refuse("the body nests too deep") from None
    return _body_from_object(message_type, obj, record_frames, sender_id)


def _body_from_object(message_type: MessageType, obj: Any, record_frames: Sequence,
                      sender_id: int) -> Any:
    body_class = _BODY_OF[message_type]
    entry_class = _ENTRY_OF.get(body_class)
    schema = dict(body_class.SCHEMA)
    if entry_class is not None:
        schema["partitions"] = ("list",)
    fields = _fields(obj, schema, message_type.name)
    if entry_class is None:
        if record_frames:
            raise _refuse(f"a {message_type.name} has 2 frames, got {2 + len(record_frames)}")
        return body_class(**fields)
    fields["partitions"] = _decode_entries(entry_class, fields["partitions"], record_frames,
                                           message_type.name)
    if body_class is Fetch and fields["replica_id"] != sender_id:
        raise _refuse(f"FETCH replica_id {fields['replica_id']} is not the sender's broker "
                      f"id {sender_id}")
    return body_class(**fields)


def _decode_entries(entry_class: type, items: list, record_frames: Sequence, where: str) -> tuple:
    schema = dict(entry_class.SCHEMA)
    carries_records = hasattr(entry_class, "RECORDS_SIZE_MIN")
    if carries_records:
        schema["records_bytes"] = ("int", entry_class.RECORDS_SIZE_MIN,
                                   limits.REPLICATION_RECORDS_SIZE_MAX)
    decoded = [_fields(item, schema, f"{where}.partitions[{index}]")
               for index, item in enumerate(items)]
    names = {(fields["topic_key"], fields["partition"]) for fields in decoded}
    if len(names) != len(decoded):
        raise _refuse(f"{where} names a partition twice")
    sizes = [fields.pop("records_bytes") for fields in decoded] if carries_records else []
    expected = sum(1 for size in sizes if size)
    if expected != len(record_frames):
        raise _refuse(f"{where} has {expected} record frames in its body and "
                      f"{len(record_frames)} after it")
    frames = iter(record_frames)
    entries = []
    for index, fields in enumerate(decoded):
        if carries_records:
            fields["records"] = _records(next(frames), sizes[index], where, index) \
                if sizes[index] else None
        entries.append(entry_class(**fields))
    return tuple(entries)


def _records(frame: Any, size: int, where: str, index: int) -> np.ndarray:
    try:
        records = np.frombuffer(frame, dtype=np.uint8)
    except (TypeError, ValueError):
        raise _refuse(f"{where}.partitions[{index}] records frame is not a byte buffer") from None
    if records.nbytes != size:
        raise _refuse(f"{where}.partitions[{index}] records_bytes is {size}, its frame has "
                      f"{records.nbytes}")
    return records
