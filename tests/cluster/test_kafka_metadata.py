"""A cluster's Kafka listeners as a Kafka client sees them: every broker at its
advertised listener (registered in its broker znode), each partition's leader,
replicas and in-sync replicas as ZooKeeper holds them, the same answer from any
broker, a topic created on first use, and the leader moved after a broker is gone;
the admin APIs through any member (topics made and deleted, settings described and
changed on every member, the cluster and each broker's log directory described).

Method: the shared fault cluster (each broker has a listener: LocalCluster gives
one); librdkafka's AdminClient asks each broker in turn; a replicated topic made
and waited in sync; every wait is bounded.
"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient

from cluster.workload import WAIT_S
from shmlog import Admin

TOPIC = "kafka-metadata"


def metadata(cluster, broker_id: int, topic: str | None = None):
    """What broker ``broker_id`` alone answers (bootstrapped from it only)."""
    client = AdminClient({"bootstrap.servers": cluster.kafka_address(broker_id),
                          "topic.metadata.refresh.interval.ms": 1000})
    return client.list_topics(topic=topic, timeout=WAIT_S)


def partitions_of(answer, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    return {number: (partition.leader, sorted(partition.replicas), sorted(partition.isrs))
            for number, partition in answer.topics[topic].partitions.items()}


def test_every_broker_lists_every_listener_and_the_same_leaders(fault_cluster):
    cluster = fault_cluster
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        TOPIC, 6, replication_factor=3)
    deadline = time.monotonic() + WAIT_S
    while True:              # until every broker answers every partition led, ISR whole
        answers = [metadata(cluster, broker_id, TOPIC) for broker_id in (1, 2, 3)]
        if all(len(answer.topics[TOPIC].partitions) == 6 and
               all(leader > 0 and isr == [1, 2, 3]
                   for leader, _, isr in partitions_of(answer, TOPIC).values())
               for answer in answers):
            break
        assert time.monotonic() < deadline, "the topic was not led and in sync in time"
        time.sleep(0.2)
    expected = {broker_id: tuple(cluster.kafka_address(broker_id).rsplit(":", 1))
                for broker_id in (1, 2, 3)}
    for answer in answers:
        assert {broker.id: (broker.host, str(broker.port))
                for broker in answer.brokers.values()} == expected
        assert answer.cluster_id == cluster.cluster_id
    leaders = partitions_of(answers[0], TOPIC)
    assert all(partitions_of(answer, TOPIC) == leaders for answer in answers[1:])
    assert {leader for leader, _, _ in leaders.values()} == {1, 2, 3}
    assert all(replicas == [1, 2, 3] and isr == [1, 2, 3]
               for _, replicas, isr in leaders.values())


def test_a_topic_is_created_on_first_use_and_then_led(fault_cluster):
    cluster = fault_cluster
    deadline = time.monotonic() + WAIT_S
    while True:
        topic = metadata(cluster, 2, "kafka-made-on-first-use").topics["kafka-made-on-first-use"]
        if topic.error is None and all(partition.leader > 0
                                       for partition in topic.partitions.values()):
            break
        assert time.monotonic() < deadline, f"not led in {WAIT_S} s: {topic.error}"
        time.sleep(0.2)
    assert len(topic.partitions) == 1


def test_admin_client_creates_and_deletes_a_replicated_topic(fault_cluster):
    from confluent_kafka.admin import NewTopic
    cluster = fault_cluster
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    [made] = client.create_topics([NewTopic("kafka-admin-made", 3, 3)],
                                  request_timeout=WAIT_S).values()
    assert made.result(WAIT_S) is None          # answered once the cluster has it
    described = Admin(cluster.data_dir(3)).describe_topic("kafka-admin-made")
    assert len(described["partitions"]) == 3
    [gone] = client.delete_topics(["kafka-admin-made"], request_timeout=WAIT_S).values()
    assert gone.result(WAIT_S) is None


def test_admin_client_reads_and_changes_a_replicated_topics_settings(fault_cluster):
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )
    cluster = fault_cluster
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    [made] = client.create_topics([NewTopic("kafka-admin-configs", 2, 3,
                                            config={"retention.ms": "60000"})],
                                  request_timeout=WAIT_S).values()
    made.result(WAIT_S)
    try:
        topic = ConfigResource(ResourceType.TOPIC, "kafka-admin-configs")
        [described] = client.describe_configs([topic], request_timeout=WAIT_S).values()
        assert described.result(WAIT_S)["retention.ms"].value == "60000"
        change = ConfigResource(ResourceType.TOPIC, "kafka-admin-configs", incremental_configs=[
            ConfigEntry("retention.ms", "120000",
                        incremental_operation=AlterConfigOpType.SET)])
        [altered] = client.incremental_alter_configs([change]).values()
        assert altered.result(WAIT_S) is None          # answered once ZooKeeper has it
        for broker_id in range(1, cluster.count + 1):  # every member applies it
            deadline = time.monotonic() + WAIT_S
            while str(Admin(cluster.data_dir(broker_id)).describe_topic(
                    "kafka-admin-configs")["overrides"].get("retention.ms")) != "120000":
                assert time.monotonic() < deadline, f"broker {broker_id} kept the old value"
                time.sleep(0.2)
    finally:
        client.delete_topics(["kafka-admin-configs"], request_timeout=WAIT_S)


def test_admin_clients_describe_the_cluster_its_brokers_and_their_log_dirs(fault_cluster):
    """Through each broker: DescribeCluster names every broker at its listener (the
    broker asked as the controller: any member carries out the controller's
    requests); a broker's settings are described by that broker (librdkafka sends a
    BROKER resource to the broker it names) with its id; DescribeLogDirs lists the
    partitions that broker holds a copy of (every one: as leader, follower or
    observer), in the log directory its own Admin names; and AlterConfigs through a
    member replaces the topic's overrides on every member."""
    from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType
    from kafka.protocol.admin import DescribeLogDirsRequest

    from kafka_clients.raw import RawConnection
    from shmlog.wire.codec import response_class
    cluster = fault_cluster
    addresses = {broker_id: tuple(cluster.kafka_address(broker_id).rsplit(":", 1))
                 for broker_id in range(1, cluster.count + 1)}
    for broker_id in addresses:
        alone = AdminClient({"bootstrap.servers": cluster.kafka_address(broker_id)})
        described = alone.describe_cluster(request_timeout=WAIT_S).result(WAIT_S)
        assert described.cluster_id == cluster.cluster_id
        assert {node.id: (node.host, str(node.port)) for node in described.nodes} == addresses
        assert described.controller.id == broker_id
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for broker_id in addresses:
        [settings] = client.describe_configs([ConfigResource(ResourceType.BROKER, str(broker_id))],
                                             request_timeout=WAIT_S).values()
        assert settings.result(WAIT_S)["broker.id"].value == str(broker_id)
    [made] = client.create_topics([NewTopic("kafka-log-dirs", 3, 2, config={
        "retention.ms": "60000", "segment.ms": "600000"})], request_timeout=WAIT_S).values()
    made.result(WAIT_S)
    try:
        wanted = DescribeLogDirsRequest.DescribableLogDirTopic
        request = DescribeLogDirsRequest(version=4, topics=[
            wanted(topic="kafka-log-dirs", partitions=[0, 1, 2])])
        for broker_id in addresses:      # until it holds its copy of every partition
            deadline = time.monotonic() + WAIT_S
            while True:
                with RawConnection(cluster.kafka_address(broker_id)) as connection:
                    [result] = connection.ask(request, response_class(35), 4).results
                listed = sorted(partition.partition_index for topic in result.topics
                                for partition in topic.partitions)
                if listed == [0, 1, 2]:
                    break
                assert time.monotonic() < deadline, f"broker {broker_id} lists {listed}"
                time.sleep(0.2)
            own = Admin(cluster.data_dir(broker_id)).describe_log_dirs(["kafka-log-dirs"])
            assert result.error_code == 0 and result.log_dir == own["log_dir"]
            assert sorted(entry["partition"] for entry in own["partitions"]) == listed
        [altered] = client.alter_configs([ConfigResource(
            ResourceType.TOPIC, "kafka-log-dirs", set_config={"retention.ms": "90000"})],
            request_timeout=WAIT_S).values()
        assert altered.result(WAIT_S) is None
        for broker_id in addresses:                 # every member: one override left
            deadline = time.monotonic() + WAIT_S
            while {key: str(value) for key, value in Admin(cluster.data_dir(broker_id))
                   .describe_topic("kafka-log-dirs")["overrides"].items()} != \
                    {"retention.ms": "90000"}:
                assert time.monotonic() < deadline, f"broker {broker_id} kept old overrides"
                time.sleep(0.2)
    finally:
        client.delete_topics(["kafka-log-dirs"], request_timeout=WAIT_S)
