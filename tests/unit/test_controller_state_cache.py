"""The controller's partition state cache (``controller_context.StateCache``): newest
version wins, a topic's states are trusted only under the topic id they were cached
for, and what it is told by the watch names the brokers a controller must check.
(That a decision from a stale cached state is refused and made again from a fresh
read is tested against a real ZooKeeper: ``tests/integration/test_controller.py``.)
"""

from __future__ import annotations

from shmlog.cluster.controller.controller_context import StateCache
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.events import EventKind, WatchEvent
from shmlog.cluster.zk.paths import NO_LEADER, PartitionState, TopicAssignment

ASSIGNMENT = TopicAssignment("t", "a" * 32, {0: (1, 2), 1: (2, 1)})
RECREATED = TopicAssignment("t", "b" * 32, {0: (1, 2), 1: (2, 1)})


def state(leader: int, *isr: int) -> PartitionState:
    return PartitionState(leader, 0, tuple(isr), 1)


def state_event(partition: int, value: PartitionState | None, version: int) -> WatchEvent:
    body = None if value is None else zk_paths.encode_partition_state(value)
    return WatchEvent(EventKind.PARTITION_STATE, ("t", partition), body, version)


def topic_event(assignment: TopicAssignment | None) -> WatchEvent:
    body = None if assignment is None else zk_paths.encode_topic_assignment(assignment)
    return WatchEvent(EventKind.TOPIC, "t", body, 0)


def remembered() -> StateCache:
    cache = StateCache()
    cache.remember(ASSIGNMENT, {0: (state(1, 1, 2), 3), 1: (state(2, 2, 1), 0)})
    return cache


def test_only_a_topic_with_every_partition_cached_is_answered():
    cache = StateCache()
    assert cache.states(ASSIGNMENT) is None
    cache.remember(ASSIGNMENT, {0: (state(1, 1, 2), 0)})
    assert cache.states(ASSIGNMENT) is None                      # partition 1 missing
    cache.remember(ASSIGNMENT, {1: (state(2, 2), 0)})
    assert cache.states(ASSIGNMENT) == {0: (state(1, 1, 2), 0), 1: (state(2, 2), 0)}


def test_the_newest_version_wins_whoever_brings_it():
    cache = remembered()
    assert cache.watched([state_event(0, state(1, 1), 2)]) == set()     # older: ignored
    cache.remember(ASSIGNMENT, {0: (state(2, 2), 1)})
    assert cache.states(ASSIGNMENT)[0] == (state(1, 1, 2), 3)
    assert cache.watched([state_event(0, state(1, 1), 4)]) == {1}
    assert cache.states(ASSIGNMENT)[0] == (state(1, 1), 4)


def test_the_watch_names_the_leader_and_isr_of_each_news_but_no_missing_leader():
    cache = remembered()
    named = cache.watched([state_event(0, state(1, 1, 3), 4),
                           state_event(1, PartitionState(NO_LEADER, 1, (2,), 1), 1)])
    assert named == {1, 3, 2}


def test_a_state_deleted_or_undecodable_is_no_longer_trusted():
    cache = remembered()
    cache.watched([state_event(1, None, -1)])
    assert cache.states(ASSIGNMENT) is None
    cache = remembered()
    cache.watched([WatchEvent(EventKind.PARTITION_STATE, ("t", 1), b"{not json", 7)])
    assert cache.states(ASSIGNMENT) is None


def test_a_topic_created_again_starts_over():
    cache = remembered()
    assert cache.states(RECREATED) is None                   # another id: not these states
    cache = remembered()
    cache.watched([topic_event(RECREATED)])
    cache.watched([state_event(0, state(2, 2), 0), state_event(1, state(1, 1), 0)])
    # States first seen by the watch after the new id: trusted under it.
    assert cache.states(RECREATED) == {0: (state(2, 2), 0), 1: (state(1, 1), 0)}
    assert cache.states(ASSIGNMENT) is None


def test_states_seen_before_their_topic_are_trusted_only_after_a_fresh_read():
    cache = StateCache()
    cache.watched([state_event(0, state(1, 1), 0), state_event(1, state(2, 2), 0)])
    assert cache.states(ASSIGNMENT) is None
    cache.remember(ASSIGNMENT, {0: (state(1, 1), 0), 1: (state(2, 2), 0)})
    assert cache.states(ASSIGNMENT) == {0: (state(1, 1), 0), 1: (state(2, 2), 0)}


def test_a_topic_gone_from_the_list_or_deleted_is_forgotten():
    cache = remembered()
    cache.watched([WatchEvent(EventKind.TOPICS, zk_paths.TOPICS_PATH, ("u",), -1)])
    assert cache.states(ASSIGNMENT) is None
    cache = remembered()
    cache.watched([topic_event(None)])
    assert cache.states(ASSIGNMENT) is None
    cache = remembered()
    cache.forget("t")
    assert cache.states(ASSIGNMENT) is None
    cache = remembered()
    cache.clear()
    assert cache.states(ASSIGNMENT) is None
