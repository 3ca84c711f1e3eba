"""Kafka's admin APIs through librdkafka's AdminClient (and kafka-python's where it
covers one): topics created (with configs, validate-only), refused as Kafka refuses
them, grown, deleted; records deleted below an offset; the cluster described; each
effect checked through shmlog's own Admin.

Method: the module's broker; every future waited with a bound.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaClientPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic

from shmlog import Admin, Producer

WAIT_S = 30.0


def admin(address: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": address})


def error_name(future) -> str:
    with pytest.raises(KafkaException) as refused:
        future.result(WAIT_S)
    return refused.value.args[0].name()


def test_topics_are_created_with_their_configs_and_refused_as_kafka_refuses(kafka_broker):
    data_dir, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    created = client.create_topics([
        NewTopic("admin-made", num_partitions=3, config={"retention.ms": "60000"}),
        NewTopic("admin-made-default", num_partitions=-1)], request_timeout=WAIT_S)
    for future in created.values():
        assert future.result(WAIT_S) is None
    described = Admin(data_dir).describe_topic("admin-made")
    assert len(described["partitions"]) == 3
    assert described["overrides"] == {"retention.ms": 60000} or \
        described["overrides"].get("retention.ms") in (60000, "60000")
    assert len(Admin(data_dir).describe_topic("admin-made-default")["partitions"]) == 1
    refused = client.create_topics([
        NewTopic("admin-made", 1), NewTopic("bad/name", 1), NewTopic("zero-partitions", 0),
        NewTopic("bad-config", 1, config={"cleanup.policy": "sometimes"}),
        NewTopic("__consumer_offsets", 1)], request_timeout=WAIT_S)
    names = {}
    for name, future in refused.items():
        try:
            future.result(WAIT_S)
            names[name] = "created"
        except KafkaException as error:
            names[name] = error.args[0].name()
    assert names == {
        "admin-made": "TOPIC_ALREADY_EXISTS", "bad/name": "TOPIC_EXCEPTION",   # librdkafka's
        "zero-partitions": "INVALID_PARTITIONS", "bad-config": "INVALID_CONFIG",
        "__consumer_offsets": "TOPIC_EXCEPTION"}


def test_validate_only_creates_nothing(kafka_broker):
    data_dir, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    [future] = client.create_topics([NewTopic("only-checked", 2)],
                                            validate_only=True).values()
    assert future.result(WAIT_S) is None
    assert "only-checked" not in Admin(data_dir).list_topics()


def test_partitions_are_added_and_topics_deleted(kafka_broker):
    data_dir, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    Admin(data_dir).create_topic("grown", 1)
    [future] = client.create_partitions([NewPartitions("grown", 4)]).values()
    assert future.result(WAIT_S) is None
    assert len(Admin(data_dir).describe_topic("grown")["partitions"]) == 4
    [shrink] = client.create_partitions([NewPartitions("grown", 2)]).values()
    assert error_name(shrink) == "INVALID_PARTITIONS"
    deleted = client.delete_topics(["grown", "never-made"], request_timeout=WAIT_S)
    assert deleted["grown"].result(WAIT_S) is None
    assert error_name(deleted["never-made"]) == "UNKNOWN_TOPIC_OR_PART"    # librdkafka's name
    assert "grown" not in Admin(data_dir).list_topics()


def test_records_are_deleted_below_an_offset(kafka_broker):
    data_dir, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    Admin(data_dir).create_topic("trimmed", 1)
    with Producer(data_dir) as producer:
        for index in range(10):
            producer.send("trimmed", b"%d" % index)
        producer.flush(timeout=WAIT_S)
    [future] = client.delete_records(
        [KafkaClientPartition("trimmed", 0, 6)], request_timeout=WAIT_S).values()
    assert future.result(WAIT_S).low_watermark == 6
    [partition] = Admin(data_dir).describe_log_dirs(["trimmed"])["partitions"]
    assert partition["log_start_offset"] == 6


def test_the_cluster_is_described(kafka_broker):
    _, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    described = client.describe_cluster(request_timeout=WAIT_S).result(WAIT_S)
    host, port = address.rsplit(":", 1)
    assert [(node.id, node.host, node.port) for node in described.nodes] == [(0, host, int(port))]
    assert described.controller.id == 0 and described.cluster_id


def test_kafka_python_creates_and_deletes_topics(kafka_broker):
    data_dir, address = kafka_broker
    client = admin(address)            # kept: its futures die with it
    client = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=int(WAIT_S * 1000))
    try:
        client.create_topics([KafkaPythonNewTopic("kafka-python-made", 2, 1)])
        assert len(Admin(data_dir).describe_topic("kafka-python-made")["partitions"]) == 2
        client.delete_topics(["kafka-python-made"])
        assert "kafka-python-made" not in Admin(data_dir).list_topics()
    finally:
        client.close()
