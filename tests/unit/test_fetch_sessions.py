"""Incremental fetch sessions (KIP-227): the leader's cache
(shmlog.cluster.replication.fetch_sessions), the follower's side of a session
(fetcher._Fetcher) and the ISR's caught-up time of a partition a session left
unnamed (rules.FollowerState.session_fetched).

Goal: a session opens with a full fetch, later fetches name only what changed, a
wrong id or epoch is a session error (the follower then fetches in full), sessions
are evicted by count and idleness, news is kept per session, and an idle caught-up
follower keeps its caught-up time without naming the partition.
Method: the sans-I/O parts driven directly, with the time passed in.
"""

from __future__ import annotations

from shmlog.cluster.replication.fetch_sessions import FetchSessionCache
from shmlog.cluster.replication.fetcher import _Fetcher
from shmlog.cluster.replication.messages import (
    INITIAL_SESSION_EPOCH,
    NO_SESSION,
    ErrorCode,
    FetchPartition,
)
from shmlog.cluster.replication.rules import FollowerState


def request(partition: int, offset: int = 0) -> FetchPartition:
    return FetchPartition(7, partition, 1, offset, 0, 1 << 20)


def test_a_session_continues_with_each_next_epoch_only():
    cache = FetchSessionCache()
    session, closed = cache.open(peer=2, now=0)
    assert closed == [] and session.epoch == 1
    assert cache.lookup(session.session_id, 1, 2, now=10) == (session, ErrorCode.NONE)
    assert cache.lookup(session.session_id, 1, 2, now=20) == \
        (None, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
    assert cache.lookup(session.session_id, 2, 3, now=20) == \
        (None, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)          # another peer's id
    assert cache.lookup(session.session_id + 1, 2, 2, now=20)[1] is \
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert cache.lookup(session.session_id, 2, 2, now=30)[0] is session
    assert session.last_used_ms == 30


def test_opening_a_session_closes_the_peers_older_one_and_its_partitions():
    cache = FetchSessionCache()
    old, _ = cache.open(peer=2, now=0)
    cache.set_partition(old, request(0))
    other, _ = cache.open(peer=3, now=0)
    cache.set_partition(other, request(0))
    new, closed = cache.open(peer=2, now=5)
    assert closed == [old] and len(cache) == 2
    assert cache.holding((7, 0)) == [other]
    assert cache.lookup(old.session_id, 1, 2, now=6)[1] is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert new.session_id != old.session_id


def test_the_least_recently_used_session_makes_room_and_idle_ones_are_evicted():
    cache = FetchSessionCache(slots=2, idle_eviction_ms=1000)
    first, _ = cache.open(peer=1, now=0)
    second, _ = cache.open(peer=2, now=0)
    cache.lookup(first.session_id, 1, 1, now=100)               # first used last
    third, closed = cache.open(peer=3, now=200)
    assert closed == [second] and len(cache) == 2
    assert cache.evict_idle(now=1099) == []
    assert cache.evict_idle(now=1100) == [first]
    assert cache.evict_idle(now=1200) == [third]
    assert len(cache) == 0


def test_news_is_kept_per_session_and_a_removed_partition_has_none():
    cache = FetchSessionCache()
    a, _ = cache.open(peer=2, now=0)
    b, _ = cache.open(peer=3, now=0)
    for session in (a, b):
        cache.set_partition(session, request(0))
        cache.set_partition(session, request(1))
    assert set(map(id, cache.holding((7, 1)))) == {id(a), id(b)}
    assert cache.mark(a, (7, 1)) is False                      # no fetch parked
    b.parked = "key"
    assert cache.mark(b, (7, 1)) is True                       # answer it now
    assert list(a.news) == [(7, 1)]
    cache.remove_partition(a, (7, 1))
    assert a.news == {} and cache.holding((7, 1)) == [b]
    entry = cache.set_partition(b, request(1, offset=50))     # a changed request
    assert entry.request.fetch_offset == 50 and len(b.partitions) == 2


def test_the_follower_names_only_what_changed_and_reopens_after_an_error():
    fetcher = _Fetcher(leader_id=1)
    first = (request(0), request(1), request(2))
    named, session_id, epoch, forgotten = fetcher.session_fetch(first)
    assert (named, session_id, epoch, forgotten) == (first, NO_SESSION, INITIAL_SESSION_EPOCH, ())
    fetcher.session_answered(41)
    assert (fetcher.session_id, fetcher.session_epoch) == (41, 1)
    # Partition 0 moved on, 2 left, 3 joined; 1 is as the leader holds it.
    named, session_id, epoch, forgotten = fetcher.session_fetch(
        (request(0, offset=9), request(1), request(3)))
    assert named == (request(0, offset=9), request(3))
    assert (session_id, epoch, forgotten) == (41, 1, ((7, 2),))
    fetcher.session_answered(41)
    assert fetcher.session_epoch == 2 and set(fetcher.sent) == {(7, 0), (7, 1), (7, 3)}
    named, *_ = fetcher.session_fetch((request(0, offset=9), request(1), request(3)))
    assert named == ()                                          # idle: names nothing
    fetcher.reset_session()
    named, session_id, epoch, _ = fetcher.session_fetch((request(1),))
    assert (named, session_id, epoch) == ((request(1),), NO_SESSION, INITIAL_SESSION_EPOCH)


def test_an_idle_caught_up_follower_stays_caught_up_through_its_last_session_fetch():
    state = FollowerState(2)
    state.update_fetch_state(100, now_ms=1_000, leader_log_end_offset=100)
    # Its session fetched at 40 s without naming the partition; then an append.
    state.session_fetched(100, 40_000)
    assert state.last_caught_up_time_ms == 40_000 and state.last_fetch_time_ms == 40_000
    # Its next fetch, at the old log end, was caught up as of that session fetch.
    state.update_fetch_state(100, now_ms=40_010, leader_log_end_offset=120)
    assert state.last_caught_up_time_ms == 40_000


def test_a_follower_behind_at_its_last_served_fetch_gains_nothing_from_its_session():
    state = FollowerState(2)
    state.update_fetch_state(80, now_ms=1_000, leader_log_end_offset=100)
    state.session_fetched(80, 40_000)
    assert state.last_caught_up_time_ms < 1_000
    state.session_fetched(90, 40_000)                           # not where it fetched from
    assert state.last_caught_up_time_ms < 1_000
