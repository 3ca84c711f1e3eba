"""Replication's rules, sans-I/O: Kafka 2.8's follower replication as pure
functions and small state objects. No sockets, no files, no clock: the time is passed
in (milliseconds), and every offset is a plain number the caller read from its log.

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

Theory of operation
-------------------
The replica service (on the broker's loop thread) owns one
:class:`LeaderReplicaState` per partition it leads and asks these functions what
to do; it does the I/O (appends, truncations, ZooKeeper writes, sends) itself.
Nothing here can block or fail on I/O, so each rule is tested with plain numbers.
A check's verdict is a wire :class:`~shmlog.cluster.replication.messages.ErrorCode`,
so the leader sends it as it is.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Mapping

from .messages import NO_EPOCH, UNDEFINED_EPOCH, UNKNOWN_OFFSET, ErrorCode

__all__ = [
    "NEVER_MS", "FollowerState", "IsrChangeKind", "PendingIsrChange", "LeaderReplicaState",
    "out_of_sync_replicas", "can_join_isr", "high_watermark", "check_leader_epoch",
    "validate_fetch", "validate_epoch_end", "follower_high_watermark",
    "TruncationAction", "TruncationStep", "truncation_step", "offset_out_of_range_step",
]

# "Never", as a time in ms: further back than any lag, whatever clock the caller
# uses (Kafka uses 0 with wall-clock time; a monotonic clock may read less than
# replica.lag.time.max.ms shortly after boot, so 0 would read as "just now").
NEVER_MS = -(2**62)


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

    def session_fetched(self, fetch_offset: int, fetch_time_ms: int) -> None:
        """A fetch session (KIP-227) whose fetches since the last one served this
        partition did not name it (its position unchanged) fetched last at
        ``fetch_time_ms``, and the partition was not appended to since: each of
        those fetches found the follower where the last served one did. If that
        one had it caught up, it stayed caught up through ``fetch_time_ms`` (what
        Kafka's per-fetch ``updateFollowerFetchState`` of every session partition
        would have recorded), so the ISR does not drop an idle, caught-up follower
        as soon as the partition is appended to again."""
        if fetch_offset == self.log_end_offset and \
                fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
            self.last_fetch_time_ms = max(self.last_fetch_time_ms, fetch_time_ms)


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
