"""Three real brokers and a real ZooKeeper on loopback addresses: topics made in
ZooKeeper, leaders elected, records replicated byte for byte, acks=all."""

from __future__ import annotations

import os

import pytest

from cluster.history import read_replica
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.devtools.local_cluster import LocalCluster

# A follower is dropped from the ISR after 4 s without catching up: on a loaded 2-core
# machine a shorter lag shrinks ISRs these tests expect to stay whole.
SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 4000,
            "replica.fetch.wait.max.ms": 200, "replica.socket.timeout.ms": 1500}
WAIT_S = 30
SEGMENT_BYTES = 1 << 20     # segment files are preallocated: small ones read quickly


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), 3,
                      zookeeper_connect=zookeeper.connect_string, settings=SETTINGS) as running:
        yield running


def partitions_of(cluster, broker_id, topic):
    return Admin(cluster.data_dir(broker_id)).describe_topic(topic)["partitions"]


def read_all(data_dir, topic, partition, end):
    """Every record of the local replica below ``end``, waiting for it."""
    tp = TopicPartition(topic, partition)
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        records = []
        while len(records) < end:
            batch = consumer.poll(timeout_ms=WAIT_S * 1000).get(tp, [])
            assert batch, f"{data_dir}: no records past offset {len(records)}"
            records.extend(batch)
        return [(record.offset, record.value) for record in records]


def batch_bytes(data_dir, topic, partition):
    """The bytes of every batch of the replica's segments (the files end in their
    preallocated zeros)."""
    directory = os.path.join(data_dir, "topics", topic, str(partition))
    return [batch for _, _, batch in read_replica(directory, 0).batches]


def test_a_replicated_topic_is_led_and_in_sync_on_every_broker(cluster):
    created = Admin(cluster.data_dir(1)).create_topic(
        "replicated", 3, {"min.insync.replicas": "2"}, replication_factor=3)
    assert [sorted(entry["replicas"]) for entry in created["partitions"]] == [[1, 2, 3]] * 3
    leaders = {entry["leader"] for entry in created["partitions"]}
    assert len(leaders) == 3, "the round-robin spreads the leaders"

    def in_sync_everywhere():
        return all(sorted(entry["isr"]) == [1, 2, 3]
                   for broker_id in (1, 2, 3)
                   for entry in partitions_of(cluster, broker_id, "replicated"))
    cluster.wait_for(in_sync_everywhere, WAIT_S, "every replica in sync on every broker")


def test_acks_all_records_are_replicated_byte_for_byte(cluster):
    Admin(cluster.data_dir(1)).create_topic("copies", 1, {"min.insync.replicas": "2",
                                                      "segment.bytes": str(SEGMENT_BYTES)},
                                            replication_factor=3)
    leader = partitions_of(cluster, 1, "copies")[0]["leader"]
    values = [b"value-%d" % n for n in range(500)]
    with Producer(cluster.data_dir(leader), acks="all") as producer:
        futures = [producer.send("copies", value, partition=0) for value in values]
        offsets = [future.get(timeout=WAIT_S).offset for future in futures]
    assert offsets == list(range(500))
    for broker_id in (1, 2, 3):
        assert read_all(cluster.data_dir(broker_id), "copies", 0, 500) == \
            list(enumerate(values)), f"broker {broker_id} holds the records at their offsets"
    for broker_id in (1, 2, 3):       # every replica's log was made with the topic's config
        directory = os.path.join(cluster.data_dir(broker_id), "topics", "copies", "0")
        assert [os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
                if name.endswith(".log")] == [SEGMENT_BYTES], f"broker {broker_id}"
    copies = {broker_id: batch_bytes(cluster.data_dir(broker_id), "copies", 0)
              for broker_id in (1, 2, 3)}
    assert sum(map(len, copies[1])) >= sum(map(len, values))
    assert copies[1] == copies[2] == copies[3]


def test_a_broker_without_a_replica_keeps_an_observer_copy_for_its_readers(cluster):
    Admin(cluster.data_dir(1)).create_topic("observed", 1, replication_factor=2)
    described = partitions_of(cluster, 1, "observed")[0]
    observer = next(broker_id for broker_id in (1, 2, 3) if broker_id not in described["replicas"])
    assert partitions_of(cluster, observer, "observed")[0]["role"] == "observer"
    values = [b"seen-%d" % n for n in range(50)]
    with Producer(cluster.data_dir(described["leader"]), acks="all") as producer:
        for future in [producer.send("observed", value, partition=0) for value in values]:
            future.get(timeout=WAIT_S)
    assert read_all(cluster.data_dir(observer), "observed", 0, 50) == list(enumerate(values))
    assert sorted(partitions_of(cluster, 1, "observed")[0]["isr"]) == \
        sorted(described["replicas"]), "an observer never joins the ISR"
