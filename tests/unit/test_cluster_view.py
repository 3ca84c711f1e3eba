"""The cluster view: ZooKeeper's watch events in, the changes they make out."""

from __future__ import annotations

from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.events import EventKind, SessionState, WatchEvent
from shmlog.cluster.zk.paths import BrokerRegistration, PartitionState, TopicAssignment
from shmlog.cluster.zk.view import (
    BrokerConfigChanged,
    BrokersChanged,
    ClusterView,
    PartitionStateChanged,
    Reregistered,
    SessionChanged,
    TopicChanged,
    TopicConfigChanged,
    TopicGone,
    TopicsToDelete,
)

TOPIC_ID = "0123456789abcdef0123456789abcdef"
OTHER_ID = "fedcba9876543210fedcba9876543210"


def broker(broker_id, epoch):
    body = zk_paths.encode_broker_registration(
        BrokerRegistration(broker_id, "host", f"tcp://127.0.0.{broker_id}:9000"))
    return WatchEvent(EventKind.BROKER, broker_id, body, epoch)


def topic(name="t", topic_id=TOPIC_ID, partitions=None):
    assignment = TopicAssignment(name, topic_id, partitions or {0: (1, 2, 3)})
    return WatchEvent(EventKind.TOPIC, name, zk_paths.encode_topic_assignment(assignment), 0)


def state(leader, epoch, isr, version, name="t", partition=0):
    body = zk_paths.encode_partition_state(PartitionState(leader, epoch, tuple(isr), 1))
    return WatchEvent(EventKind.PARTITION_STATE, (name, partition), body, version)


def test_brokers_come_and_go_with_their_epochs():
    view = ClusterView()
    assert view.apply(broker(1, 10)) == [BrokersChanged(frozenset({1}))]
    assert view.apply(broker(2, 11)) == [BrokersChanged(frozenset({1, 2}))]
    assert view.apply(broker(1, 10)) == [], "the same registration again changes nothing"
    assert view.apply(broker(1, 12)) == [BrokersChanged(frozenset({1, 2}))], "a bounce"
    assert view.brokers[1].epoch == 12
    assert view.apply(WatchEvent(EventKind.BROKER, 2, None, -1)) == \
        [BrokersChanged(frozenset({1}))]
    assert view.apply(WatchEvent(EventKind.BROKER_IDS, zk_paths.BROKER_IDS_PATH, (), -1)) == \
        [BrokersChanged(frozenset())], "the id list going empty removes the rest"


def test_a_partition_state_is_applied_only_when_newer():
    view = ClusterView()
    view.apply(topic())
    assert view.apply(state(1, 0, [1, 2, 3], 0)) == \
        [PartitionStateChanged("t", 0, PartitionState(1, 0, (1, 2, 3), 1), 0)]
    assert view.apply(state(1, 0, [1, 2], 2)) != []
    assert view.apply(state(1, 0, [1, 2, 3], 1)) == [], "an older version arriving late"
    assert view.state("t", 0) == (PartitionState(1, 0, (1, 2), 1), 2)
    assert view.replicas("t", 0) == (1, 2, 3)


def test_a_state_before_its_topic_is_ignored():
    view = ClusterView()
    assert view.apply(state(1, 0, [1], 0)) == []
    assert view.state("t", 0) is None


def test_a_recreated_topic_starts_its_states_over():
    view = ClusterView()
    view.apply(topic())
    view.apply(state(1, 3, [1], 7))
    changes = view.apply(topic(topic_id=OTHER_ID))
    assert changes[0] == TopicGone("t") and isinstance(changes[1], TopicChanged)
    assert view.state("t", 0) is None
    assert view.apply(state(2, 0, [2], 0)) != [], "version 0 of the new topic is newer"


def test_topics_leave_with_their_states_and_configs():
    view = ClusterView()
    view.apply(topic())
    view.apply(WatchEvent(EventKind.TOPIC_CONFIG, "t",
                          zk_paths.encode_topic_config({"min.insync.replicas": "2"}), 0))
    view.apply(state(1, 0, [1], 0))
    assert view.configs["t"] == {"min.insync.replicas": "2"}
    assert view.apply(WatchEvent(EventKind.TOPICS, zk_paths.TOPICS_PATH, (), -1)) == \
        [TopicGone("t")]
    assert view.topics == {} and view.configs == {} and view.states == {}


def test_config_changes_are_reported_once():
    view = ClusterView()
    view.apply(topic())
    event = WatchEvent(EventKind.TOPIC_CONFIG, "t", zk_paths.encode_topic_config({"a": "1"}), 0)
    assert view.apply(event) == [TopicConfigChanged("t", {"a": "1"})]
    assert view.apply(event) == []


def test_a_body_that_does_not_decode_is_ignored():
    view = ClusterView()
    view.apply(topic())
    view.apply(state(1, 0, [1], 0))
    bad = WatchEvent(EventKind.PARTITION_STATE, ("t", 0), b"{not json", 5)
    assert view.apply(bad) == []
    assert view.state("t", 0)[1] == 0, "the state held stays"
    assert view.apply(WatchEvent(EventKind.TOPIC, "u", b"[]", 0)) == []


def test_session_registration_and_deletions_are_passed_on():
    view = ClusterView()
    assert view.apply(WatchEvent(EventKind.SESSION, SessionState.SUSPENDED, None, -1)) == \
        [SessionChanged(SessionState.SUSPENDED)]
    assert view.session is SessionState.SUSPENDED
    assert view.apply(WatchEvent(EventKind.REGISTERED, 1, None, 42)) == [Reregistered(42)]
    assert view.apply(WatchEvent(EventKind.DELETE_TOPICS, zk_paths.DELETE_TOPICS_PATH,
                                 ("t",), -1)) == [TopicsToDelete(("t",))]


def test_a_brokers_config_is_passed_on_and_its_deletion_as_empty():
    view = ClusterView()
    body = zk_paths.encode_broker_config({"leader.replication.throttled.rate": "1000"})
    assert view.apply(WatchEvent(EventKind.BROKER_CONFIG, 4, body, 0)) == \
        [BrokerConfigChanged(4, {"leader.replication.throttled.rate": "1000"})]
    assert view.apply(WatchEvent(EventKind.BROKER_CONFIG, 4, None, -1)) == \
        [BrokerConfigChanged(4, {})]
    assert view.apply(WatchEvent(EventKind.BROKER_CONFIG, 4, b"{", 1)) == []
