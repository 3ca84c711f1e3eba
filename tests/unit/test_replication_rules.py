"""Replication's rules (shmlog.cluster.replication.rules, purgatory), one Kafka 2.8 rule per test.

Goal: each sans-I/O rule does what Kafka 2.8 does, so the replica service built on
them replicates as Kafka's brokers do. Method: plain numbers in tables; each test
names the Kafka source it follows. The truncation loop is driven end to end against
two replicas' epoch caches (a reference ``end_offset_for`` below, Kafka's
``LeaderEpochFileCache.endOffsetFor``), through the KIP-101 and KIP-279 scenarios.
"""

from __future__ import annotations

import pytest

from shmlog.cluster.replication.messages import NO_EPOCH, UNDEFINED_EPOCH, UNKNOWN_OFFSET, ErrorCode
from shmlog.cluster.replication.purgatory import FetchPurgatory, partition_ready
from shmlog.cluster.replication.rules import (
    NEVER_MS,
    FollowerState,
    IsrChangeKind,
    LeaderReplicaState,
    TruncationAction,
    TruncationStep,
    can_join_isr,
    check_leader_epoch,
    follower_high_watermark,
    high_watermark,
    offset_out_of_range_step,
    out_of_sync_replicas,
    truncation_step,
    validate_epoch_end,
    validate_fetch,
)

LAG_MS = 10_000


# --- Replica.updateFetchState ------------------------------------------------------

@pytest.mark.parametrize("fetch_offset, leader_leo, last_fetch_leader_leo, expected_lcu", [
    (100, 100, 90, 5_000),     # at the leader's log end: caught up now
    (101, 100, 90, 5_000),     # past it (a racing append): caught up now
    (95, 100, 90, 2_000),      # reached the log end of its previous fetch: caught up then
    (90, 100, 90, 2_000),
    (89, 100, 90, 1_000),      # neither: unchanged
])
def test_update_fetch_state_last_caught_up_time(fetch_offset, leader_leo, last_fetch_leader_leo,
                                                expected_lcu):
    """Kafka 2.8 Replica.updateFetchState."""
    state = FollowerState(2, log_end_offset=80, last_fetch_time_ms=2_000,
                          last_fetch_leader_log_end_offset=last_fetch_leader_leo,
                          last_caught_up_time_ms=1_000)
    state.update_fetch_state(fetch_offset, 5_000, leader_leo, log_start_offset=7)
    assert state.last_caught_up_time_ms == expected_lcu
    assert (state.log_end_offset, state.log_start_offset) == (fetch_offset, 7)
    assert (state.last_fetch_time_ms, state.last_fetch_leader_log_end_offset) == (5_000, leader_leo)


def test_update_fetch_state_never_moves_last_caught_up_back():
    """Kafka 2.8 Replica.updateFetchState: math.max keeps the later time."""
    state = FollowerState(2, last_fetch_time_ms=100, last_fetch_leader_log_end_offset=10,
                          last_caught_up_time_ms=900)
    state.update_fetch_state(10, 1_000, 20)          # caught up as of t=100 < 900
    assert state.last_caught_up_time_ms == 900


# --- Partition.makeLeader ----------------------------------------------------------

def test_become_leader_resets_followers():
    """Kafka 2.8 Partition.makeLeader: ISR members caught up now, others never; a new
    leader knows no follower's log end."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=4, epoch_start_offset=50, replicas=[1, 2, 3], isr=[1, 2],
                         now_ms=7_000)
    assert set(leader.followers) == {2, 3}
    assert leader.followers[2].last_caught_up_time_ms == 7_000
    assert leader.followers[3].last_caught_up_time_ms == NEVER_MS
    for state in leader.followers.values():
        assert state.log_end_offset == UNKNOWN_OFFSET
        assert state.last_fetch_leader_log_end_offset == UNKNOWN_OFFSET
    assert (leader.leader_epoch, leader.epoch_start_offset, leader.isr) == (4, 50, {1, 2})
    # ISR member 2 has not fetched: the high watermark holds.
    assert leader.high_watermark(60, 40, 7_001) == 40
    leader.record_fetch(2, 60, 7_002, 60)
    assert leader.high_watermark(60, 40, 7_002) == 60


def test_become_leader_again_keeps_known_log_ends():
    """Kafka 2.8 Partition.makeLeader: only a new leader (isNewLeader) forgets the
    followers' log ends; a re-elected one resets their caught-up times only."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=4, epoch_start_offset=50, replicas=[1, 2], isr=[1, 2],
                         now_ms=1_000)
    leader.record_fetch(2, 55, 2_000, 60)
    leader.become_leader(leader_epoch=5, epoch_start_offset=60, replicas=[1, 2], isr=[1],
                         now_ms=3_000)
    state = leader.followers[2]
    assert (state.log_end_offset, state.last_caught_up_time_ms) == (55, NEVER_MS)
    assert (state.last_fetch_leader_log_end_offset, state.last_fetch_time_ms) == (60, 3_000)
    leader.resign()
    assert not leader.is_leader and leader.followers == {}


# --- Partition.getOutOfSyncReplicas ---------------------------------------------------

@pytest.mark.parametrize("follower_leo, lcu, now, out", [
    (100, 0, 50_000, False),          # at the leader's log end: never out of sync
    (90, 39_999, 50_000, True),       # behind, caught up 10 001 ms ago
    (90, 40_000, 50_000, False),      # exactly the lag: still in sync (strictly greater)
    (UNKNOWN_OFFSET, 45_000, 50_000, False),
    (UNKNOWN_OFFSET, NEVER_MS, 50_000, True),
    (UNKNOWN_OFFSET, NEVER_MS, 0, True),      # "never" is never within the lag
])
def test_out_of_sync_replicas(follower_leo, lcu, now, out):
    """Kafka 2.8 Partition.getOutOfSyncReplicas / isFollowerOutOfSync."""
    followers = {2: FollowerState(2, log_end_offset=follower_leo, last_caught_up_time_ms=lcu)}
    result = out_of_sync_replicas(leader_id=1, isr=[1, 2], followers=followers,
                                  leader_log_end_offset=100, now_ms=now,
                                  replica_lag_time_max_ms=LAG_MS)
    assert result == ({2} if out else set())


def test_out_of_sync_never_the_leader_and_nothing_while_in_flight():
    """Kafka 2.8 Partition.getOutOfSyncReplicas (candidates = ISR - local broker) and
    maybeShrinkIsr (no change while isInflight)."""
    assert out_of_sync_replicas(leader_id=1, isr=[1], followers={}, leader_log_end_offset=5,
                                now_ms=10**9, replica_lag_time_max_ms=LAG_MS) == set()
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=0, epoch_start_offset=0, replicas=[1, 2, 3],
                         isr=[1, 2, 3], now_ms=0)
    assert leader.shrink_candidates(10, 20_000) == {2, 3}
    leader.begin_isr_change(IsrChangeKind.SHRINK, [3])
    assert leader.shrink_candidates(10, 20_000) == set()
    assert leader.expand_candidate(3, 0) is False


# --- Partition.isFollowerAtHighwatermark ------------------------------------------------

@pytest.mark.parametrize("follower_leo, hw, epoch_start, joins", [
    (100, 100, 80, True),
    (120, 100, 110, True),
    (99, 100, 80, False),       # below the high watermark
    (105, 100, 110, False),     # at the HW but below the current epoch's start
    (UNKNOWN_OFFSET, 0, 0, False),
])
def test_can_join_isr(follower_leo, hw, epoch_start, joins):
    """Kafka 2.8 Partition.isFollowerAtHighwatermark."""
    assert can_join_isr(follower_log_end_offset=follower_leo, high_watermark=hw,
                        epoch_start_offset=epoch_start) is joins


def test_expand_candidate_is_an_assigned_replica_outside_the_isr():
    """Kafka 2.8 Partition.canAddReplicaToIsr / needsExpandIsr."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=2, epoch_start_offset=10, replicas=[1, 2, 3], isr=[1, 2],
                         now_ms=0)
    leader.record_fetch(3, 12, 1, 12)
    leader.record_fetch(2, 12, 1, 12)
    leader.record_fetch(9, 12, 1, 12, observer=True)
    assert leader.expand_candidate(3, 12) is True
    assert leader.expand_candidate(2, 12) is False     # already in the ISR
    assert leader.expand_candidate(9, 12) is False     # an observer never joins
    change = leader.begin_isr_change(IsrChangeKind.EXPAND, [3])
    assert change.proposed_isr == {1, 2, 3}
    assert leader.maximal_isr == {1, 2, 3}
    leader.isr_change_committed(change.proposed_isr)
    assert leader.pending is None and leader.isr == {1, 2, 3}


# --- Partition.maybeIncrementLeaderHW ---------------------------------------------------

def _followers(**leos_and_lcus):
    return {int(name[1:]): FollowerState(int(name[1:]), log_end_offset=leo,
                                         last_caught_up_time_ms=lcu)
            for name, (leo, lcu) in leos_and_lcus.items()}


@pytest.mark.parametrize("isr, followers, current, expected", [
    ([1, 2, 3], dict(b2=(80, 0), b3=(90, 0)), 50, 80),          # min over the ISR
    ([1], dict(), 50, 100),                                     # the leader alone
    ([1, 2], dict(b2=(40, 0)), 50, 50),                         # never backwards
    ([1, 2], dict(b2=(120, 0)), 50, 100),                       # never past the LEO
    ([1, 2], dict(b2=(UNKNOWN_OFFSET, 99_000)), 50, 50),        # unknown LEO holds it
    ([1, 2, 3], dict(b2=(90, 0)), 50, 50),                      # ISR member with no state
    ([1, 2], dict(b2=(95, 0), b3=(70, 95_000)), 50, 70),        # 3 caught up in lag: waits
    ([1, 2], dict(b2=(95, 0), b3=(70, 80_000)), 50, 95),        # 3 lagging outside: ignored
])
def test_high_watermark(isr, followers, current, expected):
    """Kafka 2.8 Partition.maybeIncrementLeaderHW (incl. the lastCaughtUpTimeMs rule for
    replicas outside the ISR) and Log.maybeIncrementHighWatermark (never backwards)."""
    assert high_watermark(leader_id=1, leader_log_end_offset=100, current_high_watermark=current,
                          maximal_isr=isr, followers=_followers(**followers), now_ms=100_000,
                          replica_lag_time_max_ms=LAG_MS) == expected


def test_a_follower_the_controller_took_out_of_the_isr_no_longer_holds_the_high_watermark():
    """Kafka 2.8: the controller's ISR removal bumps the epoch, and Partition.makeLeader
    resets the last caught-up time of replicas outside the ISR, so a follower that
    died or shuts down stops holding maybeIncrementLeaderHW at once. The epoch is
    kept here (the design), so isr_change_committed resets it."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=4, epoch_start_offset=50, replicas=[1, 2, 3],
                         isr=[1, 2, 3], now_ms=7_000)
    leader.record_fetch(2, 60, 7_100, 60)
    leader.record_fetch(3, 60, 7_100, 60)
    # 3 stops fetching; records come; within the lag time it still holds the mark.
    leader.record_fetch(2, 80, 7_200, 80)
    leader.isr_change_committed([1, 2, 3])
    assert leader.high_watermark(80, 60, 7_300) == 60
    leader.isr_change_committed([1, 2])                    # the controller's write
    assert leader.followers[3].last_caught_up_time_ms == NEVER_MS
    assert leader.high_watermark(80, 60, 7_300) == 80
    leader.record_fetch(3, 80, 7_400, 80)                  # back and caught up: counts again
    assert leader.followers[3].last_caught_up_time_ms == 7_400


def test_high_watermark_counts_pending_expand_and_pending_shrink():
    """Kafka 2.8 IsrState.maximalIsr: PendingExpandIsr = isr + new replica;
    PendingShrinkIsr = the old isr (the shrink counts only once committed)."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=0, epoch_start_offset=0, replicas=[1, 2, 3], isr=[1, 2],
                         now_ms=0)
    leader.record_fetch(2, 90, 1, 100)
    leader.record_fetch(3, 60, 1, 100)
    now = 50_000                                 # 3's catch-up is too old to count by itself
    assert leader.high_watermark(100, 0, now) == 90
    leader.begin_isr_change(IsrChangeKind.EXPAND, [3])
    assert leader.high_watermark(100, 0, now) == 60          # pending expand counted
    leader.isr_change_failed()
    assert leader.isr == {1, 2}
    leader.begin_isr_change(IsrChangeKind.SHRINK, [2])
    assert leader.high_watermark(100, 0, now) == 90          # pending shrink: 2 still counts
    leader.isr_change_committed([1])
    assert leader.high_watermark(100, 0, now) == 100


def test_observers_never_count():
    """The design note §5: an observer is never in the ISR and never holds the HW."""
    leader = LeaderReplicaState(1, LAG_MS)
    leader.become_leader(leader_epoch=0, epoch_start_offset=0, replicas=[1], isr=[1], now_ms=0)
    leader.record_fetch(7, 3, 1, 100, observer=True)
    assert 7 in leader.observers and 7 not in leader.followers
    assert leader.high_watermark(100, 0, 1) == 100


# --- checkCurrentLeaderEpoch, getLocalLog, Log.read --------------------------------------

@pytest.mark.parametrize("request_epoch, expected", [
    (4, ErrorCode.NONE), (3, ErrorCode.FENCED_LEADER_EPOCH),
    (5, ErrorCode.UNKNOWN_LEADER_EPOCH), (NO_EPOCH, ErrorCode.NONE),
])
def test_check_leader_epoch(request_epoch, expected):
    """Kafka 2.8 Partition.checkCurrentLeaderEpoch."""
    assert check_leader_epoch(request_epoch, 4) is expected


@pytest.mark.parametrize("change, expected", [
    (dict(), ErrorCode.NONE),
    (dict(fetch_offset=100), ErrorCode.NONE),                 # the log end: an empty read
    (dict(fetch_offset=101), ErrorCode.OFFSET_OUT_OF_RANGE),
    (dict(fetch_offset=9), ErrorCode.OFFSET_OUT_OF_RANGE),    # below the log start
    (dict(request_epoch=3), ErrorCode.FENCED_LEADER_EPOCH),
    (dict(request_epoch=5), ErrorCode.UNKNOWN_LEADER_EPOCH),
    (dict(is_leader=False), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (dict(replica_id=9), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (dict(replica_id=9, observer=True), ErrorCode.NONE),
    # The epoch is checked first (getLocalLog), then leadership, then the offset.
    (dict(is_leader=False, request_epoch=3), ErrorCode.FENCED_LEADER_EPOCH),
    (dict(is_leader=False, fetch_offset=500), ErrorCode.NOT_LEADER_OR_FOLLOWER),
])
def test_validate_fetch(change, expected):
    """Kafka 2.8 Partition.fetchRecords → getLocalLog (epoch, then leader), Log.read
    (offset in [logStartOffset, logEndOffset])."""
    request = dict(is_leader=True, leader_epoch=4, request_epoch=4, replica_id=2,
                   replicas=[1, 2, 3], observer=False, fetch_offset=50, log_start_offset=10,
                   log_end_offset=100)
    request.update(change)
    assert validate_fetch(**request) is expected


def test_validate_epoch_end():
    """Kafka 2.8 Partition.lastOffsetForLeaderEpoch → getLocalLog."""
    base = dict(is_leader=True, leader_epoch=4, request_epoch=4, replica_id=2, replicas=[1, 2],
                observer=False)
    assert validate_epoch_end(**base) is ErrorCode.NONE
    assert validate_epoch_end(**{**base, "request_epoch": 2}) is ErrorCode.FENCED_LEADER_EPOCH
    assert validate_epoch_end(**{**base, "is_leader": False}) is ErrorCode.NOT_LEADER_OR_FOLLOWER


# --- Log.updateHighWatermark on the follower ------------------------------------------

@pytest.mark.parametrize("leader_hw, leo, log_start, expected", [
    (100, 120, 0, 100), (100, 80, 0, 80), (5, 80, 10, 10), (100, 100, 0, 100),
])
def test_follower_high_watermark(leader_hw, leo, log_start, expected):
    """Kafka 2.8 ReplicaFetcherThread.processPartitionData → Log.updateHighWatermark."""
    assert follower_high_watermark(leader_hw, leo, log_start) == expected


# --- the truncation loop ----------------------------------------------------------------

def end_offset_for(cache: dict[int, int], epoch: int, log_end_offset: int) -> tuple[int, int]:
    """Kafka 2.8 LeaderEpochFileCache.endOffsetFor over {epoch: start offset}."""
    if epoch == UNDEFINED_EPOCH:
        return UNDEFINED_EPOCH, UNKNOWN_OFFSET
    if cache and max(cache) == epoch:
        return epoch, log_end_offset
    higher = [entry for entry in cache if entry > epoch]
    if not higher:
        return UNDEFINED_EPOCH, UNKNOWN_OFFSET
    floor = [entry for entry in cache if entry <= epoch]
    return (max(floor) if floor else epoch), cache[min(higher)]


class Replica:
    """A log as its epoch cache and its end (records are implied by the offsets)."""

    def __init__(self, cache: dict[int, int], log_end_offset: int, high_watermark: int = 0):
        self.cache = dict(cache)
        self.log_end_offset = log_end_offset
        self.high_watermark = high_watermark

    @property
    def latest_epoch(self) -> int:
        return max(self.cache) if self.cache else UNDEFINED_EPOCH

    def truncate_to(self, offset: int) -> None:
        self.log_end_offset = min(self.log_end_offset, offset)
        self.high_watermark = min(self.high_watermark, offset)
        self.cache = {epoch: start for epoch, start in self.cache.items() if start < offset}


def truncate(follower: Replica, leader: Replica) -> tuple[list[int], int]:
    """Drive truncation_step as the fetcher does: the epochs asked, the final offset."""
    asked: list[int] = []
    reply = mine = None
    for _ in range(20):
        step = truncation_step(
            follower_latest_epoch=follower.latest_epoch,
            follower_log_end_offset=follower.log_end_offset,
            follower_high_watermark=follower.high_watermark, leader_log_start_offset=0,
            leader_epoch_end=reply, follower_epoch_end=mine)
        if step.action is TruncationAction.ASK_LEADER:
            asked.append(step.epoch)
            reply = end_offset_for(leader.cache, step.epoch, leader.log_end_offset)
            mine = end_offset_for(follower.cache, reply[0], follower.log_end_offset)
            continue
        follower.truncate_to(step.offset)
        if step.action is TruncationAction.TRUNCATE:
            return asked, step.offset
        assert step.action is TruncationAction.TRUNCATE_AND_ASK_AGAIN
        reply = mine = None
    raise AssertionError("the truncation loop did not end")


def test_kip_101_scenario_1_truncating_to_the_high_watermark_loses_a_message():
    """KIP-101 scenario 1 (high-watermark truncation followed by immediate leader
    election). A leads epoch 0 with m1, m2; B fetched m2 but not the HW that covers
    it (HW 1), then restarts. Truncating to its HW would drop m2, and A dying next
    would lose it; asking for epoch 0's end keeps m2."""
    leader_a = Replica({0: 0}, log_end_offset=2, high_watermark=2)
    follower_b = Replica({0: 0}, log_end_offset=2, high_watermark=1)
    assert truncate(follower_b, leader_a) == ([0], 2)
    assert follower_b.log_end_offset == 2


def test_kip_101_scenario_2_replica_divergence_after_multiple_hard_failures():
    """KIP-101 scenario 2 (replica divergence on restart after multiple hard
    failures). A leads epoch 0 with m1, m2; B has m1 only; both lose power. B comes
    back first, leads epoch 1 and writes m3 at offset 1. A comes back as follower
    with HW 2: the HW rule keeps m2 at offset 1 (diverged); epoch 0's end on B is 1."""
    leader_b = Replica({0: 0, 1: 1}, log_end_offset=2, high_watermark=2)
    follower_a = Replica({0: 0}, log_end_offset=2, high_watermark=2)
    assert truncate(follower_a, leader_b) == ([0], 1)
    assert follower_a.cache == {0: 0}


def test_kip_279_fast_leader_failover_one_round():
    """KIP-279's fast double failover. A leads epoch 1 (m0, m1 at 0, 1); B has m0.
    A fails, B leads epoch 2 and writes m2 at 1; B fails before A truncates, A
    leads epoch 3 (its cache gains 3 -> 2) and writes m3 at 2. B follows: it asks
    for epoch 2, which A never had; A answers (1, 2) (its floor epoch and the start
    of the next). KIP-101 alone truncated B to 2 and kept m2 at 1 (diverged);
    KIP-279 compares epochs: B's end of epoch 1 is 1, so B truncates to 1."""
    leader_a = Replica({1: 0, 3: 2}, log_end_offset=3, high_watermark=1)
    follower_b = Replica({1: 0, 2: 1}, log_end_offset=2, high_watermark=1)
    assert end_offset_for(leader_a.cache, 2, 3) == (1, 2)
    assert min(2, follower_b.log_end_offset) == 2                 # KIP-101's answer
    assert truncate(follower_b, leader_a) == ([2], 1)
    assert follower_b.cache == {1: 0}


def test_kip_279_asks_again_when_the_follower_lacks_the_leaders_epoch():
    """KIP-279's repeat (AbstractFetcherThread: followerEpoch != leaderEpoch →
    truncationCompleted = false). The follower asks for its epoch 2; the leader's
    floor is epoch 1, which the follower never had: it truncates to its own end of
    epoch 0 (5) and asks again for 0, whose end on the leader is 3."""
    leader = Replica({0: 0, 1: 3, 3: 6}, log_end_offset=8)
    follower = Replica({0: 0, 2: 5}, log_end_offset=7)
    assert truncate(follower, leader) == ([2, 0], 3)
    assert (follower.log_end_offset, follower.cache) == (3, {0: 0})


@pytest.mark.parametrize("kwargs, expected", [
    # No reply yet: ask about the latest epoch.
    (dict(follower_latest_epoch=3), TruncationStep(TruncationAction.ASK_LEADER, epoch=3)),
    # Empty cache: below (or at) the leader's log start → start over there.
    (dict(follower_latest_epoch=UNDEFINED_EPOCH, follower_log_end_offset=0,
          leader_log_start_offset=40), TruncationStep(TruncationAction.TRUNCATE_FULLY, 40)),
    # Empty cache, data past the leader's log start: Kafka's HW fallback.
    (dict(follower_latest_epoch=UNDEFINED_EPOCH, follower_log_end_offset=90,
          follower_high_watermark=70, leader_log_start_offset=40),
     TruncationStep(TruncationAction.TRUNCATE, 70)),
    (dict(follower_latest_epoch=UNDEFINED_EPOCH, follower_log_end_offset=90,
          follower_high_watermark=70), TruncationStep(TruncationAction.TRUNCATE, 70)),
    # The leader's end is undefined: the HW (capped by the LEO).
    (dict(leader_epoch_end=(UNDEFINED_EPOCH, UNKNOWN_OFFSET)),
     TruncationStep(TruncationAction.TRUNCATE, 70)),
    # An end without an epoch (an old leader): that end.
    (dict(leader_epoch_end=(UNDEFINED_EPOCH, 80)), TruncationStep(TruncationAction.TRUNCATE, 80)),
    # The follower has no entry at or below the leader's epoch: the leader's end.
    (dict(leader_epoch_end=(2, 85), follower_epoch_end=(UNDEFINED_EPOCH, UNKNOWN_OFFSET)),
     TruncationStep(TruncationAction.TRUNCATE, 85)),
    (dict(leader_epoch_end=(2, 95), follower_epoch_end=(UNDEFINED_EPOCH, UNKNOWN_OFFSET)),
     TruncationStep(TruncationAction.TRUNCATE, 90)),
    # Same epoch: the lower end, never past the LEO.
    (dict(leader_epoch_end=(2, 85), follower_epoch_end=(2, 88)),
     TruncationStep(TruncationAction.TRUNCATE, 85)),
    (dict(leader_epoch_end=(2, 99), follower_epoch_end=(2, 95)),
     TruncationStep(TruncationAction.TRUNCATE, 90)),
    # Different epochs: truncate to the follower's end and ask again.
    (dict(leader_epoch_end=(2, 85), follower_epoch_end=(1, 60)),
     TruncationStep(TruncationAction.TRUNCATE_AND_ASK_AGAIN, 60)),
])
def test_truncation_step_table(kwargs, expected):
    """Kafka 2.8 AbstractFetcherThread.maybeTruncate / getOffsetTruncationState, with
    the design note §3.4's start-over for an empty cache below the leader's log start."""
    args = dict(follower_latest_epoch=3, follower_log_end_offset=90, follower_high_watermark=70)
    args.update(kwargs)
    assert truncation_step(**args) == expected


@pytest.mark.parametrize("follower_leo, leader_start, leader_leo, expected", [
    (100, 0, 80, TruncationStep(TruncationAction.TRUNCATE, 80)),         # unclean: leader behind
    (10, 50, 200, TruncationStep(TruncationAction.TRUNCATE_FULLY, 50)),  # leader deleted past us
    (100, 50, 200, TruncationStep(TruncationAction.TRUNCATE, 100)),      # fetch again
])
def test_offset_out_of_range_step(follower_leo, leader_start, leader_leo, expected):
    """Kafka 2.8 AbstractFetcherThread.fetchOffsetAndTruncate."""
    assert offset_out_of_range_step(follower_log_end_offset=follower_leo,
                                    leader_log_start_offset=leader_start,
                                    leader_log_end_offset=leader_leo) == expected


# --- DelayedFetch -------------------------------------------------------------------------

@pytest.mark.parametrize("change, ready", [
    (dict(), False),                                   # nothing new: park it
    (dict(log_end_offset=11), True),                   # records to send
    (dict(high_watermark=9), True),                    # the follower's HW is stale
    (dict(error=ErrorCode.FENCED_LEADER_EPOCH), True),
])
def test_partition_ready(change, ready):
    """Kafka 2.8 ReplicaManager.fetchMessages: respond immediately on enough data (min
    bytes 1), an error, or a partition whose follower needs a HW update
    (followerNeedsHwUpdate: lastSentHighWatermark < HW, KIP-392)."""
    partition = dict(error=ErrorCode.NONE, fetch_offset=10, log_end_offset=10, high_watermark=8,
                     high_watermark_last_sent=8)
    partition.update(change)
    assert partition_ready(**partition) is ready


P0, P1 = (123, 0), (123, 1)


def test_purgatory_fires_on_bytes():
    """Kafka 2.8 DelayedFetch.tryComplete: records past the fetch offset (min bytes 1)."""
    purgatory = FetchPurgatory()
    purgatory.park("a", 500, {P0: (10, 5), P1: (20, 5)})
    purgatory.park("b", 500, {P0: (12, 5)})
    assert purgatory.log_end_moved(P0, 10) == []
    assert purgatory.log_end_moved(P0, 11) == ["a"]
    assert purgatory.log_end_moved(P1, 30) == []              # "a" was answered already
    assert purgatory.log_end_moved(P0, 13) == ["b"]
    assert len(purgatory) == 0 and purgatory.next_deadline_ms() is None


def test_purgatory_fires_when_the_high_watermark_passes_the_one_sent():
    """The design note §3.2 rule 2 (beyond Kafka's DelayedFetch)."""
    purgatory = FetchPurgatory()
    purgatory.park("a", 500, {P0: (10, 5)})
    purgatory.park("b", 500, {P0: (10, 8)})
    assert purgatory.high_watermark_moved(P0, 5) == []
    assert purgatory.high_watermark_moved(P0, 7) == ["a"]
    assert purgatory.high_watermark_moved(P0, 9) == ["b"]


def test_purgatory_fires_on_leadership_change_and_deadline():
    """Kafka 2.8 DelayedFetch.tryComplete (NotLeaderOrFollower / fenced epoch cases,
    forceComplete) and onExpiration."""
    purgatory = FetchPurgatory()
    purgatory.park("late", 900, {P1: (1, 0)})
    purgatory.park("early", 300, {P1: (1, 0)})
    purgatory.park("other", 400, {P0: (1, 0)})
    assert purgatory.next_deadline_ms() == 300
    assert purgatory.leadership_changed(P0) == ["other"]
    assert purgatory.expire(299) == []
    assert purgatory.expire(1_000) == ["early", "late"]     # by deadline
    purgatory.park("x", 100, {P0: (1, 0)})
    assert purgatory.remove("x") and not purgatory.remove("x")
    assert purgatory.expire(10_000) == [] and purgatory.next_deadline_ms() is None


def test_purgatory_answers_in_park_order():
    """Kafka answers watchers of a key in the order they were added."""
    purgatory = FetchPurgatory()
    for key in ("c", "a", "b"):
        purgatory.park(key, 100, {P0: (5, 0)})
    assert purgatory.leadership_changed(P0) == ["c", "a", "b"]
