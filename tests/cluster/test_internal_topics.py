"""A cluster's internal topic keeps its commits (issue 27, row 5): DeleteRecords of
``__consumer_offsets`` and a config change that could let retention delete its
records are refused, asked of any broker, and the group's committed offsets are
still there after every broker restarted.

Method: the shared three-broker cluster (``fault_cluster``: a topic and a group of
this test's own), Admin against each broker, then a rolling restart (each broker
stopped and started again once every offsets partition is back in sync) and the
group's commits read through each broker.
"""

from __future__ import annotations

import pytest

from cluster.workload import ADMIN_TIMEOUT_MS, WAIT_S
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    InternalTopicConfigError,
    InternalTopicError,
    LocalProtocolError,
    ShmlogError,
)
from shmlog.common.internal_topics import OFFSETS_TOPIC
from shmlog.protocol.control_client import request
from shmlog.storage import delete_records as deletion

TOPIC = "kept-27"
GROUP = "keeper-27"
COMMITTED = {(TOPIC, 0): 7}
BROKERS = (1, 2, 3)


def _admin(cluster, broker_id: int) -> Admin:
    return Admin(cluster.data_dir(broker_id), timeout_ms=ADMIN_TIMEOUT_MS)


def _committed(cluster, broker_id: int) -> dict | None:
    """The group's commits as broker ``broker_id`` finds them (None while its
    coordinator cannot answer yet: moving, loading)."""
    try:
        offsets = _admin(cluster, broker_id).list_consumer_group_offsets(GROUP)
    except ShmlogError:
        return None
    return {tuple(partition): entry.offset for partition, entry in offsets.items()}


def _commit(cluster, broker_id: int) -> bool:
    """Commit the group's offsets through ``broker_id``; False while the coordinator
    cannot take it yet (``__consumer_offsets`` being created, a coordinator moving)."""
    try:
        _admin(cluster, broker_id).alter_consumer_group_offsets(GROUP, COMMITTED)
    except ShmlogError:
        return False
    return True


def _restart(cluster, broker_id: int) -> None:
    """Stop and start ``broker_id`` once every offsets partition is in sync (as another
    broker sees it), so each keeps a live in-sync replica; back once the group's
    commit reads back through it."""
    other = next(other for other in BROKERS if other != broker_id)
    cluster.wait_for(lambda: _offsets_topic_in_sync(cluster, other), WAIT_S,
                     f"every offsets partition in sync before broker {broker_id} restarts")
    cluster.stop_broker(broker_id)
    cluster.start_broker(broker_id)
    cluster.wait_for(lambda: _committed(cluster, broker_id) == COMMITTED, WAIT_S,
                     f"the group's commit read back through broker {broker_id}")


def _offsets_topic_in_sync(cluster, broker_id: int) -> bool:
    try:
        described = _admin(cluster, broker_id).describe_topic(OFFSETS_TOPIC)
    except ShmlogError:
        return False
    return all(sorted(entry["isr"]) == list(BROKERS) and entry["leader"] in BROKERS
               for entry in described["partitions"])


def test_the_offsets_topic_keeps_its_commits_in_a_cluster(fault_cluster):
    cluster = fault_cluster
    created = _admin(cluster, 1).create_topic(TOPIC, 1, replication_factor=3)
    with Producer(cluster.data_dir(created["partitions"][0]["leader"]), acks="all") as producer:
        for future in [producer.send(TOPIC, b"record", partition=0) for _ in range(20)]:
            future.get(timeout=WAIT_S)
    cluster.wait_for(lambda: _admin(cluster, 1).list_offsets(TOPIC)[0]["high_watermark"] == 20,
                     WAIT_S, "the records committed")
    cluster.wait_for(lambda: _commit(cluster, 2), WAIT_S, "the group's commit taken")
    cluster.wait_for(lambda: all(_committed(cluster, b) == COMMITTED for b in BROKERS),
                     WAIT_S, "the group's commit seen through every broker")

    partitions = len(_admin(cluster, 1).describe_topic(OFFSETS_TOPIC)["partitions"])
    everything = {(OFFSETS_TOPIC, partition): deletion.HIGH_WATERMARK
                  for partition in range(partitions)}
    for broker_id in BROKERS:               # the leaders of some, followers of others
        admin = _admin(cluster, broker_id)
        with pytest.raises(InternalTopicError, match="internal topic"):
            admin.delete_records(everything, timeout_ms=int(WAIT_S * 1000))
        report = admin.delete_records_report(everything, timeout_ms=int(WAIT_S * 1000))
        assert {entry["error"] for entry in report} == {deletion.INVALID_TOPIC_EXCEPTION}
        with pytest.raises(InternalTopicConfigError, match="Nothing was changed"):
            admin.alter_topic_config(OFFSETS_TOPIC, set={"cleanup.policy": "delete",
                                                         "retention.ms": "1"})
        with pytest.raises(InternalTopicConfigError):
            admin.alter_topic_config(OFFSETS_TOPIC, delete=["cleanup.policy"])
    for broker_id in BROKERS:
        described = _admin(cluster, broker_id).describe_topic(OFFSETS_TOPIC)
        assert described["config"]["cleanup.policy"] == "compact"
        assert {entry["log_start_offset"]
                for entry in _admin(cluster, broker_id).list_offsets(OFFSETS_TOPIC)} == {0}

    for broker_id in BROKERS:
        _restart(cluster, broker_id)
    cluster.wait_for(lambda: all(_committed(cluster, b) == COMMITTED for b in BROKERS),
                     WAIT_S, "the group's commit through every broker after the restarts")


@pytest.mark.parametrize("bad", [["kept"], {"name": "kept"}, 7, None],
                         ids=["list", "dict", "int", "none"])
def test_a_malformed_topic_name_is_a_typed_error_in_a_cluster(fault_cluster, bad):
    """A cluster member's own handlers (create, delete and alter go through
    ZooKeeper) check the name's type before anything else (issue 27, row 8)."""
    admin = _admin(fault_cluster, 1)
    for call in (lambda: admin.create_topic(bad), lambda: admin.delete_topic(bad),
                 lambda: admin.describe_topic(bad), lambda: admin.alter_topic_config(bad),
                 lambda: admin.list_offsets(bad)):
        with pytest.raises(LocalProtocolError, match="must be str"):
            call()
    with pytest.raises(LocalProtocolError, match=r"\[topic, partition, offset\]"):
        request(fault_cluster.data_dir(1), "delete_records", partitions=[[bad, 0, 0]])
    assert isinstance(admin.list_topics(), list)                      # still serving

