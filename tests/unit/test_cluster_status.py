"""cluster_status.summarize and describe on made-up ZooKeeper contents: which
partitions are under-replicated or offline, and leaders per broker."""

from __future__ import annotations

import json

from shmlog.cluster.status import describe, summarize
from shmlog.cluster.zk.paths import NO_LEADER, BrokerRegistration, PartitionState, TopicAssignment


def broker(broker_id: int, rack: str | None = None) -> BrokerRegistration:
    return BrokerRegistration(broker_id, f"host-{broker_id}",
                              f"tcp://127.0.0.{broker_id}:9{broker_id}00", rack)


BROKERS = {1: broker(1), 2: broker(2, "r2"), 3: broker(3)}
ASSIGNMENTS = {"orders": TopicAssignment("orders", "id-orders",
                                         {0: (1, 2, 3), 1: (2, 3, 1), 2: (3, 1, 2)}),
               "audit": TopicAssignment("audit", "id-audit", {0: (1, 2)})}


def state(leader: int, *isr: int) -> PartitionState:
    return PartitionState(leader, 4, isr, 2)


def test_a_whole_cluster_has_nothing_to_show():
    found = summarize(BROKERS, 2, ASSIGNMENTS, {
        ("orders", 0): state(1, 1, 2, 3), ("orders", 1): state(2, 2, 3, 1),
        ("orders", 2): state(3, 3, 1, 2), ("audit", 0): state(1, 1, 2)})
    assert found.under_replicated == [] and found.offline == []
    assert found.leaders_per_broker == {1: 2, 2: 1, 3: 1}
    assert [(status.topic, status.partition) for status in found.partitions] == \
        [("audit", 0), ("orders", 0), ("orders", 1), ("orders", 2)]
    text = describe(found)
    assert "brokers: 3 live" in text and "(controller)" in text
    assert "partitions: 4, under-replicated 0, offline 0" in text
    assert "rack r2" in text


def test_shrunk_isrs_dead_leaders_and_missing_states():
    found = summarize({1: broker(1), 3: broker(3)}, None, ASSIGNMENTS, {
        ("orders", 0): state(1, 1, 3),                  # broker 2 dropped from the ISR
        ("orders", 1): state(2, 2),                     # its leader is dead: offline
        ("orders", 2): state(NO_LEADER, 3),             # no leader: offline
        # ("audit", 0) has no state yet: offline
    })
    assert [(status.topic, status.partition) for status in found.offline] == \
        [("audit", 0), ("orders", 1), ("orders", 2)]
    assert [(status.topic, status.partition) for status in found.under_replicated] == \
        [("audit", 0), ("orders", 0), ("orders", 1), ("orders", 2)]
    assert found.leaders_per_broker == {1: 1, 3: 0}, "a broker leading nothing counts 0"
    text = describe(found)
    assert "no controller elected" in text
    assert "orders-1  offline  leader 2" in text
    assert "orders-0  under-replicated  leader 1  replicas [1, 2, 3]  isr [1, 3]" in text
    as_json = json.loads(json.dumps(found.as_dict()))
    assert as_json["controller"] is None
    assert as_json["leaders_per_broker"] == {"1": 1, "3": 0}
    assert as_json["offline"][0] == {"topic": "audit", "partition": 0, "replicas": [1, 2],
                                     "leader": NO_LEADER, "leader_epoch": -1, "isr": []}
