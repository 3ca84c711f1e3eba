"""Kafka's admin APIs on the listener against real clients: confluent-kafka's
AdminClient (librdkafka) and kafka-python's KafkaAdminClient create, grow and delete
topics, read and change their settings, delete records and describe the cluster,
and shmlog's own Admin sees the effect; every error path gets Kafka's code.

Method: one broker process for the module (``kafka_broker``) with a listener on a
loopback port; every test uses topics of its own. Each API's every advertised
version is also sent raw, encoded by kafka-python's message classes, and its answer
decoded at that version. Every wait is bounded.
"""

from __future__ import annotations

import socket
import struct
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeLogDirsRequest,
    IncrementalAlterConfigsRequest,
)

from kafka_clients.raw import receive_exactly
from shmlog import Admin, Producer
from shmlog.common.internal_topics import OFFSETS_TOPIC
from shmlog.wire import codec
from shmlog.wire import error_codes as E

WAIT_S = 30.0


@pytest.fixture(scope="module")
def admin_client(kafka_broker):
    _, address = kafka_broker
    return AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 20_000})


@pytest.fixture(scope="module")
def python_admin(kafka_broker):
    _, address = kafka_broker
    client = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=20_000)
    yield client
    client.close()


def _outcome(future) -> int:
    """The Kafka error code a confluent-kafka future ended with (0: success)."""
    try:
        future.result(timeout=WAIT_S)
    except KafkaException as error:
        return error.args[0].code()
    return 0


def _outcomes(futures: dict) -> dict:
    return {key: _outcome(future) for key, future in futures.items()}


# -- CreateTopics ---------------------------------------------------------------------------
def test_librdkafka_creates_topics_shmlog_lists(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    futures = admin_client.create_topics([
        NewTopic("made-three", num_partitions=3, replication_factor=1,
                 config={"retention.ms": "60000", "cleanup.policy": "compact"}),
        NewTopic("made-default", num_partitions=-1)], request_timeout=WAIT_S)
    assert _outcomes(futures) == {"made-three": 0, "made-default": 0}
    admin = Admin(data_dir)
    assert {"made-three", "made-default"} <= set(admin.list_topics())
    described = admin.describe_topic("made-three")
    assert len(described["partitions"]) == 3
    assert described["overrides"] == {"retention.ms": 60000, "cleanup.policy": "compact"}
    assert len(admin.describe_topic("made-default")["partitions"]) == 1    # num_partitions


def test_create_topics_validate_only_creates_nothing(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    futures = admin_client.create_topics([NewTopic("only-checked", 2)], validate_only=True,
                                          request_timeout=WAIT_S)
    assert _outcomes(futures) == {"only-checked": 0}
    assert "only-checked" not in Admin(data_dir).list_topics()
    bad = NewTopic("only-checked", 2, config={"retention.ms": "x"})
    refused = admin_client.create_topics([bad], validate_only=True, request_timeout=WAIT_S)
    assert _outcomes(refused) == {"only-checked": E.INVALID_CONFIG}


def test_create_topics_errors(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("taken", 1)
    for validate_only in (False, True):
        futures = admin_client.create_topics([
            NewTopic("taken", 1),
            NewTopic("bad name!", 1),
            NewTopic("too-many", 20_000),
            NewTopic("bad-config", 1, config={"retention.ms": "soon"}),
            NewTopic("unknown-config", 1, config={"no.such.setting": "1"}),
            NewTopic("three-copies", 1, replication_factor=3),
            NewTopic(OFFSETS_TOPIC, 1)], validate_only=validate_only, request_timeout=WAIT_S)
        assert _outcomes(futures) == {
            "taken": E.TOPIC_ALREADY_EXISTS, "bad name!": E.INVALID_TOPIC_EXCEPTION,
            "too-many": E.INVALID_PARTITIONS, "bad-config": E.INVALID_CONFIG,
            "unknown-config": E.INVALID_CONFIG, "three-copies": E.INVALID_REPLICATION_FACTOR,
            OFFSETS_TOPIC: E.INVALID_TOPIC_EXCEPTION}, f"validate_only={validate_only}"
    assert not {"too-many", "bad-config", "three-copies"} & set(Admin(data_dir).list_topics())


def test_create_topics_error_messages(kafka_broker, admin_client):
    futures = admin_client.create_topics([NewTopic("bad name!", 1)], request_timeout=WAIT_S)
    with pytest.raises(KafkaException) as refused:
        futures["bad name!"].result(timeout=WAIT_S)
    assert "bad name!" in refused.value.args[0].str()


def test_kafka_python_creates_topics(kafka_broker, python_admin):
    data_dir, _ = kafka_broker
    result = python_admin.create_topics(
        {"python-made": {"num_partitions": 2, "configs": {"segment.ms": "3600000"}}})
    (entry,) = result["topics"]
    assert (entry["name"], entry["error_code"], entry["num_partitions"],
            entry["replication_factor"]) == ("python-made", 0, 2, 1)
    assert uuid.UUID(str(entry["topic_id"])) == uuid.UUID(hex=Admin(data_dir).describe_topic(
        "python-made")["topic_id"])
    assert entry["configs"]["segment.ms"]["value"] == "3600000"
    assert Admin(data_dir).describe_topic("python-made")["overrides"] == {"segment.ms": 3600000}
    again = python_admin.create_topics({"python-made": {"num_partitions": 2}},
                                       raise_errors=False)
    assert again["topics"][0]["error_code"] == E.TOPIC_ALREADY_EXISTS
    assert "already exists" in again["topics"][0]["error_message"]


def test_kafka_python_deletes_topics(kafka_broker, python_admin):
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("python-doomed", 1)
    result = python_admin.delete_topics(["python-doomed", "python-never"], raise_errors=False)
    codes = {entry["name"]: entry["error_code"] for entry in result["topics"]}
    assert codes == {"python-doomed": 0, "python-never": E.UNKNOWN_TOPIC_OR_PARTITION}
    assert "python-doomed" not in Admin(data_dir).list_topics()


# -- CreatePartitions -----------------------------------------------------------------------
def test_create_partitions(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("growing", 2)
    checked = admin_client.create_partitions([NewPartitions("growing", 5)], validate_only=True,
                                             request_timeout=WAIT_S)
    assert _outcomes(checked) == {"growing": 0}
    assert len(admin.describe_topic("growing")["partitions"]) == 2
    futures = admin_client.create_partitions([
        NewPartitions("growing", 5), NewPartitions("never-grown", 3),
        NewPartitions(OFFSETS_TOPIC, 100)], request_timeout=WAIT_S)
    assert _outcomes(futures) == {"growing": 0, "never-grown": E.UNKNOWN_TOPIC_OR_PARTITION,
                                  OFFSETS_TOPIC: E.INVALID_TOPIC_EXCEPTION}
    assert len(admin.describe_topic("growing")["partitions"]) == 5
    for validate_only in (False, True):
        shrink = admin_client.create_partitions([NewPartitions("growing", 4)],
                                                validate_only=validate_only,
                                                request_timeout=WAIT_S)
        assert _outcomes(shrink) == {"growing": E.INVALID_PARTITIONS}


def test_kafka_python_creates_partitions(kafka_broker, python_admin):
    from kafka.admin import NewPartitions as PythonNewPartitions
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("python-growing", 1)
    result = python_admin.create_partitions({"python-growing": PythonNewPartitions(3)})
    assert [entry.error_code for entry in result.results] == [0]
    assert len(Admin(data_dir).describe_topic("python-growing")["partitions"]) == 3


# -- DescribeConfigs ------------------------------------------------------------------------
def _described(admin_client, resource: ConfigResource) -> dict:
    (future,) = admin_client.describe_configs([resource], request_timeout=WAIT_S).values()
    return future.result(timeout=WAIT_S)


def test_describe_topic_configs(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("described", 1, config={"retention.ms": 1234})
    entries = _described(admin_client, ConfigResource("topic", "described"))
    shmlog_view = Admin(data_dir).describe_topic("described")["config"]
    assert set(entries) == set(shmlog_view)
    retention = entries["retention.ms"]
    assert (retention.value, retention.source, retention.is_read_only, retention.is_sensitive,
            retention.is_default) == ("1234", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False,
                                      False, False)
    segment = entries["segment.bytes"]
    assert (segment.value, segment.source, segment.is_default) == \
        (str(1 << 30), ConfigSource.DEFAULT_CONFIG.value, True)
    picked = admin_client.describe_configs(
        [ConfigResource("topic", "described", set_config=None)], request_timeout=WAIT_S)
    assert len(next(iter(picked.values())).result(timeout=WAIT_S)) == len(entries)


def test_describe_broker_configs(kafka_broker, admin_client):
    entries = _described(admin_client, ConfigResource("broker", "0"))
    listeners = entries["listeners"]
    assert (listeners.value, listeners.source, listeners.is_read_only) == \
        ("PLAINTEXT://127.0.0.1:0", ConfigSource.STATIC_BROKER_CONFIG.value, True)
    assert entries["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["auto.create.topics.enable"].value == "true"


def test_describe_configs_errors(kafka_broker, admin_client):
    futures = admin_client.describe_configs([ConfigResource("topic", "not-described")],
                                            request_timeout=WAIT_S)
    assert list(_outcomes(futures).values()) == [E.UNKNOWN_TOPIC_OR_PARTITION]
    futures = admin_client.describe_configs([ConfigResource("topic", "bad name!")],
                                            request_timeout=WAIT_S)
    assert list(_outcomes(futures).values()) == [E.INVALID_TOPIC_EXCEPTION]


def test_kafka_python_describes_configs(kafka_broker, python_admin):
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("python-described", 1, config={"flush.ms": 5000})
    described = python_admin.describe_configs(
        [KafkaPythonConfigResource(ConfigResourceType.TOPIC, "python-described")],
        include_synonyms=True)
    entries = described["topic"]["python-described"]
    assert set(entries) == {"flush.ms"}                 # kafka-python shows the modified
    flush = entries["flush.ms"]
    assert flush["value"] == "5000"
    assert [synonym["source"] for synonym in flush["synonyms"]] == \
        ["DYNAMIC_TOPIC_CONFIG", "DEFAULT_CONFIG"]
    broker = python_admin.describe_configs(
        [KafkaPythonConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
    assert broker["broker"]["0"]["listeners"]["value"] == "PLAINTEXT://127.0.0.1:0"


# -- AlterConfigs and IncrementalAlterConfigs -----------------------------------------------
def _altered(futures: dict) -> list[int]:
    return list(_outcomes(futures).values())


def test_alter_configs_replaces_the_overrides(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("replaced", 1, config={"retention.ms": 1000, "segment.ms": 2000})
    resource = ConfigResource("topic", "replaced", set_config={"retention.bytes": "4096"})
    assert _altered(admin_client.alter_configs([resource], validate_only=True,
                                               request_timeout=WAIT_S)) == [0]
    assert admin.describe_topic("replaced")["overrides"] == {"retention.ms": 1000,
                                                             "segment.ms": 2000}
    assert _altered(admin_client.alter_configs([resource], request_timeout=WAIT_S)) == [0]
    assert admin.describe_topic("replaced")["overrides"] == {"retention.bytes": 4096}
    bad = ConfigResource("topic", "replaced", set_config={"retention.bytes": "lots"})
    unknown = ConfigResource("topic", "not-replaced", set_config={"retention.ms": "1"})
    broker = ConfigResource("broker", "0", set_config={"num.partitions": "3"})
    assert _altered(admin_client.alter_configs([bad], request_timeout=WAIT_S)) == \
        [E.INVALID_CONFIG]
    assert _altered(admin_client.alter_configs([unknown], request_timeout=WAIT_S)) == \
        [E.UNKNOWN_TOPIC_OR_PARTITION]
    assert _altered(admin_client.alter_configs([broker], request_timeout=WAIT_S)) == \
        [E.INVALID_CONFIG]
    assert admin.describe_topic("replaced")["overrides"] == {"retention.bytes": 4096}


def test_incremental_alter_configs(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("stepped", 1, config={"retention.ms": 1000})
    resource = ConfigResource("topic", "stepped", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("segment.ms", "7000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    assert _altered(admin_client.incremental_alter_configs([resource], validate_only=True)) == [0]
    assert admin.describe_topic("stepped")["overrides"] == {"retention.ms": 1000}
    assert _altered(admin_client.incremental_alter_configs([resource])) == [0]
    assert admin.describe_topic("stepped")["overrides"] == {
        "segment.ms": 7000, "cleanup.policy": "delete,compact"}
    subtract = ConfigResource("topic", "stepped", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    assert _altered(admin_client.incremental_alter_configs([subtract])) == [0]
    assert admin.describe_topic("stepped")["config"]["cleanup.policy"] == "compact"
    not_a_list = ConfigResource("topic", "stepped", incremental_configs=[
        ConfigEntry("segment.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])
    bad_value = ConfigResource("topic", "stepped", incremental_configs=[
        ConfigEntry("segment.ms", "-5", incremental_operation=AlterConfigOpType.SET)])
    for refused in (not_a_list, bad_value):
        for validate_only in (False, True):
            assert _altered(admin_client.incremental_alter_configs(
                [refused], validate_only=validate_only)) == [E.INVALID_CONFIG]
    assert admin.describe_topic("stepped")["overrides"] == {"segment.ms": 7000,
                                                            "cleanup.policy": "compact"}


def test_internal_topic_config_refused(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("committed-to", 1)
    admin.alter_consumer_group_offsets("config-group", {("committed-to", 0): 0})
    assert OFFSETS_TOPIC in admin.list_topics()           # made by the first commit
    policy = ConfigResource("topic", OFFSETS_TOPIC, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)])
    for validate_only in (False, True):
        assert _altered(admin_client.incremental_alter_configs(
            [policy], validate_only=validate_only)) == [E.INVALID_CONFIG]
    assert admin.describe_topic(OFFSETS_TOPIC)["config"]["cleanup.policy"] == "compact"


def test_kafka_python_alters_configs(kafka_broker, python_admin):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("python-altered", 1)
    topic = ConfigResourceType.TOPIC
    result = python_admin.alter_configs(
        [KafkaPythonConfigResource(topic, "python-altered", {"retention.ms": "5000"})])
    assert result == {"topic": {"python-altered": "OK"}}
    assert admin.describe_topic("python-altered")["overrides"] == {"retention.ms": 5000}
    result = python_admin.alter_configs(
        [KafkaPythonConfigResource(topic, "python-altered", {"segment.ms": "6000"})],
        incremental=False)
    assert result == {"topic": {"python-altered": "OK"}}
    assert admin.describe_topic("python-altered")["overrides"] == {"retention.ms": 5000,
                                                                   "segment.ms": 6000}


# -- DeleteRecords ----------------------------------------------------------------------------
def test_delete_records(kafka_broker, admin_client):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("trimmed", 2)
    with Producer(data_dir) as producer:
        for future in [producer.send("trimmed", b"record %d" % index, partition=0)
                       for index in range(10)]:
            future.get(timeout=WAIT_S)
    futures = admin_client.delete_records([TopicPartition("trimmed", 0, 6)],
                                          request_timeout=WAIT_S)
    (deleted,) = futures.values()
    assert deleted.result(timeout=WAIT_S).low_watermark == 6        # the new low watermark
    offsets = {entry["partition"]: entry for entry in admin.list_offsets("trimmed")}
    assert offsets[0]["log_start_offset"] == 6
    refused = admin_client.delete_records([TopicPartition("trimmed", 1, 5)],
                                          request_timeout=WAIT_S)
    assert _altered(refused) == [E.OFFSET_OUT_OF_RANGE]        # past the high watermark
    # The offsets topic exists once something is committed (this test's own commit:
    # the module's other tests may run in any order, or on another broker).
    admin.alter_consumer_group_offsets("trimming-group", {("trimmed", 0): 6})
    assert OFFSETS_TOPIC in admin.list_topics()
    internal = admin_client.delete_records([TopicPartition(OFFSETS_TOPIC, 0, 0)],
                                           request_timeout=WAIT_S)
    assert _altered(internal) == [E.INVALID_TOPIC_EXCEPTION]


def test_kafka_python_deletes_records(kafka_broker, python_admin):
    from kafka import TopicPartition as PythonTopicPartition
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("python-trimmed", 1)
    with Producer(data_dir) as producer:
        for future in [producer.send("python-trimmed", b"x", partition=0) for _ in range(5)]:
            future.get(timeout=WAIT_S)
    result = python_admin.delete_records({PythonTopicPartition("python-trimmed", 0): -1})
    assert result[PythonTopicPartition("python-trimmed", 0)]["low_watermark"] == 5
    assert admin.list_offsets("python-trimmed")[0]["log_start_offset"] == 5


# -- DescribeCluster and DescribeLogDirs -----------------------------------------------------
def test_describe_cluster(kafka_broker, admin_client, python_admin):
    from shmlog.wire.local_metadata import cluster_id_of
    data_dir, address = kafka_broker
    host, port = address.rsplit(":", 1)
    described = admin_client.describe_cluster(request_timeout=WAIT_S).result(timeout=WAIT_S)
    assert described.cluster_id == cluster_id_of(data_dir)
    assert [(node.id, node.host, node.port) for node in described.nodes] == [(0, host, int(port))]
    assert described.controller.id == 0
    python_view = python_admin.describe_cluster()
    assert python_view["cluster_id"] == cluster_id_of(data_dir)
    assert python_view["controller_id"] == 0
    assert [(b["broker_id"], b["host"], b["port"]) for b in python_view["brokers"]] == \
        [(0, host, int(port))]


def test_kafka_python_describes_log_dirs(kafka_broker, python_admin):
    data_dir, _ = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("on-disk", 2)
    with Producer(data_dir) as producer:
        producer.send("on-disk", b"some bytes", partition=1).get(timeout=WAIT_S)
    described = python_admin.describe_log_dirs()
    shmlog_view = admin.describe_log_dirs(["on-disk"])
    ((broker, (log_dir,)),) = [(entry["broker"], entry["log_dirs"]) for entry in described]
    assert broker == 0
    assert log_dir["log_dir"] == shmlog_view["log_dir"]
    sizes = {(topic["name"], partition["partition_index"]): partition["partition_size"]
             for topic in log_dir["topics"] for partition in topic["partitions"]}
    assert {key: size for key, size in sizes.items() if key[0] == "on-disk"} == \
        {("on-disk", entry["partition"]): entry["size"] for entry in shmlog_view["partitions"]}
    assert sizes[("on-disk", 1)] > 0


# -- every advertised version, raw ------------------------------------------------------------
def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _ask(address: str, request, version: int):
    """``request`` sent at ``version`` on a raw socket; its response decoded."""
    api_key = request.API_KEY
    flexible = request.flexible_version_q(version)
    header = struct.pack(">hhih", api_key, version, 99, 4) + b"test" + \
        (b"\x00" if flexible else b"")
    payload = header + bytes(request.encode(version=version))
    with _connect(address) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", receive_exactly(sock, 4))[0]
        response = receive_exactly(sock, size)
    assert struct.unpack(">i", response[:4])[0] == 99
    cls = codec.response_class(api_key)
    return cls.decode(response[5 if cls.flexible_version_q(version) else 4:], version=version)


def _versions(api_key: int) -> list[int]:
    from shmlog.wire.admin_apis import AdminApis
    from shmlog.wire.config_apis import ConfigApis
    table = {**AdminApis(None, None, None).apis(), **ConfigApis(None, 0, None).apis()}
    low, high, _ = table[api_key]
    return list(range(low, high + 1))


def test_advertised_versions_are_kafkas(kafka_broker):
    """The ranges advertised are Kafka 4's own (what librdkafka 2.x, kafka-python
    3.0.12 and Kafka's tools negotiate within)."""
    from shmlog.wire.admin_apis import AdminApis
    from shmlog.wire.config_apis import ConfigApis
    table = {**AdminApis(None, None, None).apis(), **ConfigApis(None, 0, None).apis()}
    assert {key: (low, high) for key, (low, high, _) in table.items()} == {
        19: (2, 7), 20: (1, 6), 37: (0, 3), 21: (0, 2), 60: (0, 2), 35: (1, 5),
        32: (1, 4), 33: (0, 2), 44: (0, 1)}


@pytest.mark.parametrize("version", _versions(19))
def test_create_topics_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-made-{version}"
    topic = CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=2, replication_factor=-1, assignments=[],
        configs=[CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(
            name="retention.ms", value="9000")])
    response = _ask(address, CreateTopicsRequest(version=version, topics=[topic],
                                                 timeout_ms=5000, validate_only=False), version)
    (result,) = response.topics
    assert (result.name, result.error_code) == (name, 0)
    if version >= 5:
        assert (result.num_partitions, result.replication_factor) == (2, 1)
        configs = {config.name: (config.value, config.config_source) for config in result.configs}
        assert configs["retention.ms"] == ("9000", 1)
    if version >= 7:
        assert result.topic_id == uuid.UUID(hex=Admin(data_dir).describe_topic(name)["topic_id"])
    response = _ask(address, CreateTopicsRequest(version=version, topics=[topic, topic],
                                                 timeout_ms=5000), version)
    assert [(result.name, result.error_code) for result in response.topics] == \
        [(name, E.INVALID_REQUEST)]


@pytest.mark.parametrize("version", _versions(20))
def test_delete_topics_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    admin = Admin(data_dir)
    name = f"raw-doomed-{version}"
    admin.create_topic(name, 1)
    topic_id = uuid.UUID(hex=admin.describe_topic(name)["topic_id"])
    if version >= 6:
        request = DeleteTopicsRequest(version=version, timeout_ms=5000, topics=[
            DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=topic_id),
            DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=uuid.uuid4())])
    else:
        request = DeleteTopicsRequest(version=version, timeout_ms=5000,
                                      topic_names=[name, "raw-never"])
    response = _ask(address, request, version)
    codes = [(result.name, result.error_code) for result in response.responses]
    if version >= 6:
        assert codes == [(name, 0), (None, E.UNKNOWN_TOPIC_ID)]
        assert response.responses[0].topic_id == topic_id
    else:
        assert codes == [(name, 0), ("raw-never", E.UNKNOWN_TOPIC_OR_PARTITION)]
    assert name not in admin.list_topics()


def test_delete_topics_by_a_stale_id_deletes_nothing(kafka_broker):
    """A topic deleted and made again under its name has a new id: the old id names
    no topic (UNKNOWN_TOPIC_ID), and the new topic stays."""
    data_dir, address = kafka_broker
    admin = Admin(data_dir)
    admin.create_topic("reborn", 1)
    old_id = uuid.UUID(hex=admin.describe_topic("reborn")["topic_id"])
    state = DeleteTopicsRequest.DeleteTopicState
    response = _ask(address, DeleteTopicsRequest(version=6, timeout_ms=5000, topics=[
        state(name=None, topic_id=old_id)]), 6)
    assert [r.error_code for r in response.responses] == [0]
    admin.create_topic("reborn", 1)
    response = _ask(address, DeleteTopicsRequest(version=6, timeout_ms=5000, topics=[
        state(name=None, topic_id=old_id)]), 6)
    assert [r.error_code for r in response.responses] == [E.UNKNOWN_TOPIC_ID]
    assert "reborn" in admin.list_topics()


@pytest.mark.parametrize("version", _versions(37))
def test_create_partitions_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-growing-{version}"
    Admin(data_dir).create_topic(name, 1)
    topic = CreatePartitionsRequest.CreatePartitionsTopic
    request = CreatePartitionsRequest(version=version, timeout_ms=5000, validate_only=False,
                                      topics=[topic(name=name, count=3, assignments=None),
                                              topic(name="raw-never", count=3, assignments=None)])
    response = _ask(address, request, version)
    assert [(result.name, result.error_code) for result in response.results] == \
        [(name, 0), ("raw-never", E.UNKNOWN_TOPIC_OR_PARTITION)]
    assert len(Admin(data_dir).describe_topic(name)["partitions"]) == 3


@pytest.mark.parametrize("version", _versions(21))
def test_delete_records_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-trimmed-{version}"
    Admin(data_dir).create_topic(name, 1)
    with Producer(data_dir) as producer:
        for future in [producer.send(name, b"x", partition=0) for _ in range(4)]:
            future.get(timeout=WAIT_S)
    topic = DeleteRecordsRequest.DeleteRecordsTopic
    partition = topic.DeleteRecordsPartition
    request = DeleteRecordsRequest(version=version, timeout_ms=5000, topics=[
        topic(name=name, partitions=[partition(partition_index=0, offset=3),
                                     partition(partition_index=1, offset=3)]),
        topic(name="raw-never", partitions=[partition(partition_index=0, offset=1)])])
    response = _ask(address, request, version)
    assert [(t.name, [(p.partition_index, p.low_watermark, p.error_code) for p in t.partitions])
            for t in response.topics] == [
        (name, [(0, 3, 0), (1, -1, E.UNKNOWN_TOPIC_OR_PARTITION)]),
        ("raw-never", [(0, -1, E.UNKNOWN_TOPIC_OR_PARTITION)])]
    assert Admin(data_dir).list_offsets(name)[0]["log_start_offset"] == 3


@pytest.mark.parametrize("version", _versions(60))
def test_describe_cluster_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    response = _ask(address, DescribeClusterRequest(
        version=version, include_cluster_authorized_operations=True, endpoint_type=1,
        include_fenced_brokers=True), version)
    assert (response.error_code, response.controller_id, len(response.brokers)) == (0, 0, 1)
    assert {8, 10} <= response.authorized_operations        # DESCRIBE, DESCRIBE_CONFIGS
    if version >= 1:
        controllers = _ask(address, DescribeClusterRequest(
            version=version, include_cluster_authorized_operations=False, endpoint_type=2),
            version)
        assert controllers.error_code == E.MISMATCHED_ENDPOINT_TYPE


@pytest.mark.parametrize("version", _versions(35))
def test_describe_log_dirs_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-on-disk-{version}"
    Admin(data_dir).create_topic(name, 2)
    topic = DescribeLogDirsRequest.DescribableLogDirTopic
    response = _ask(address, DescribeLogDirsRequest(version=version, topics=[
        topic(topic=name, partitions=[1]), topic(topic="raw-nowhere", partitions=[0])]), version)
    (result,) = response.results
    assert result.error_code == 0
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == \
        [(name, [1])]
    if version >= 4:
        assert result.total_bytes > 0 and result.usable_bytes >= 0


@pytest.mark.parametrize("version", _versions(32))
def test_describe_configs_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-described-{version}"
    Admin(data_dir).create_topic(name, 1, config={"retention.ms": 4321})
    resource = DescribeConfigsRequest.DescribeConfigsResource
    response = _ask(address, DescribeConfigsRequest(
        version=version, include_synonyms=True, include_documentation=True, resources=[
            resource(resource_type=2, resource_name=name,
                     configuration_keys=["retention.ms", "cleanup.policy"]),
            resource(resource_type=4, resource_name="7", configuration_keys=None),
            resource(resource_type=4, resource_name="", configuration_keys=None)]), version)
    topic, other_broker, defaults = response.results
    assert topic.error_code == 0
    entries = {config.name: config for config in topic.configs}
    assert set(entries) == {"retention.ms", "cleanup.policy"}
    retention = entries["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == ("4321", 1, False)
    assert [(s.value, s.source) for s in retention.synonyms] == \
        [("4321", 1), (str(7 * 24 * 3600 * 1000), 5)]
    if version >= 3:
        assert (retention.config_type, entries["cleanup.policy"].config_type) == (5, 7)
        assert retention.documentation
    assert other_broker.error_code == E.INVALID_REQUEST
    assert "Unexpected broker id" in other_broker.error_message
    assert (defaults.error_code, defaults.configs) == (0, [])


@pytest.mark.parametrize("version", _versions(33))
def test_alter_configs_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-replaced-{version}"
    Admin(data_dir).create_topic(name, 1, config={"retention.ms": 1000})
    resource = AlterConfigsRequest.AlterConfigsResource
    config = resource.AlterableConfig
    response = _ask(address, AlterConfigsRequest(version=version, validate_only=False, resources=[
        resource(resource_type=2, resource_name=name,
                 configs=[config(name="segment.ms", value="8000")]),
        resource(resource_type=2, resource_name="raw-never",
                 configs=[config(name="segment.ms", value="8000")]),
        resource(resource_type=2, resource_name=name,
                 configs=[config(name="segment.ms", value=None)])]), version)
    assert [(r.resource_name, r.error_code) for r in response.responses] == [
        (name, 0), ("raw-never", E.UNKNOWN_TOPIC_OR_PARTITION), (name, E.INVALID_REQUEST)]
    assert Admin(data_dir).describe_topic(name)["overrides"] == {"segment.ms": 8000}


@pytest.mark.parametrize("version", _versions(44))
def test_incremental_alter_configs_every_version(kafka_broker, version):
    data_dir, address = kafka_broker
    name = f"raw-stepped-{version}"
    Admin(data_dir).create_topic(name, 1, config={"retention.ms": 1000})
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    config = resource.AlterableConfig
    response = _ask(address, IncrementalAlterConfigsRequest(
        version=version, validate_only=False, resources=[
            resource(resource_type=2, resource_name=name, configs=[
                config(name="retention.ms", config_operation=1, value=None),
                config(name="flush.ms", config_operation=0, value="500")]),
            resource(resource_type=2, resource_name=name, configs=[
                config(name="flush.ms", config_operation=0, value="1"),
                config(name="flush.ms", config_operation=1, value=None)]),
            resource(resource_type=2, resource_name=name, configs=[
                config(name="flush.ms", config_operation=9, value="1")]),
            resource(resource_type=8, resource_name="0", configs=[])]), version)
    assert [r.error_code for r in response.responses] == \
        [0, E.INVALID_REQUEST, E.INVALID_REQUEST, E.INVALID_REQUEST]
    assert Admin(data_dir).describe_topic(name)["overrides"] == {"flush.ms": 500}


def test_delete_records_error_names_have_codes():
    from shmlog.storage import delete_records as deletion
    for name in (deletion.OFFSET_OUT_OF_RANGE, deletion.NOT_LEADER_OR_FOLLOWER,
                 deletion.UNKNOWN_TOPIC_OR_PARTITION, deletion.REQUEST_TIMED_OUT,
                 deletion.KAFKA_STORAGE_ERROR, deletion.INVALID_TOPIC_EXCEPTION):
        assert E.for_name(name) == getattr(E, name) != E.UNKNOWN_SERVER_ERROR
    assert E.for_name("NO_SUCH_ERROR") == E.for_name("for_name") == E.UNKNOWN_SERVER_ERROR


def test_error_codes_are_kafkas():
    """The codes added for these APIs carry Kafka's numbers (kafka-python's errors)."""
    import kafka.errors as errors
    assert errors.InvalidReplicationAssignmentError.errno == E.INVALID_REPLICA_ASSIGNMENT
    assert errors.UnknownTopicIdError.errno == E.UNKNOWN_TOPIC_ID
    assert errors.MismatchedEndpointTypeError.errno == E.MISMATCHED_ENDPOINT_TYPE
    assert errors.UnsupportedEndpointTypeError.errno == E.UNSUPPORTED_ENDPOINT_TYPE
    assert KafkaError.INVALID_REPLICA_ASSIGNMENT == E.INVALID_REPLICA_ASSIGNMENT
