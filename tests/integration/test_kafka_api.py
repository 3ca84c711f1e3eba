"""kafka-python's API shape on shmlog's clients, against a real broker: the futures'
callbacks and status, serializers and deserializers, commit_async and the
consumer's metadata methods, Admin's plural methods with config sources, and a
kafka-python program run with only its imports changed.

Method: one broker for the module (a process, no initial rebalance delay), a topic
of its own per test. The kafka-python program (kafka_python_program.py) is copied
with its ``kafka`` import lines pointed at ``shmlog.kafka`` (and nothing else
changed) and run as a subprocess given the data directory as its bootstrap
servers, as a kafka-python program is given host:port.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin, ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedKafkaOptionError,
)
from shmlog.kafka import KafkaAdminClient, KafkaConsumer, OffsetAndMetadata
from shmlog.server.broker import Broker
from shmlog.storage.topic_config import ConfigSource

WAIT_S = 30
GROUP_SETTINGS = {"session_timeout_ms": 6_000, "heartbeat_interval_ms": 200,
                  "auto_offset_reset": "earliest", "enable_auto_commit": False}
PROGRAM = os.path.join(os.path.dirname(__file__), "kafka_python_program.py")
GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                     "MIGRATING_FROM_KAFKA_PYTHON.md")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kafka-api") / "data")
    with Broker(path, group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=500):
        yield path
    unlink_shared_memory(path)


@pytest.fixture
def topic(data_dir, request):
    name = re.sub(r"[^a-zA-Z0-9_-]", "-", request.node.name)[:100]
    Admin(data_dir).create_topic(name, partitions=2)
    return name


def poll_until(consumer: Consumer, condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        consumer.poll(timeout_ms=100)


# -- the kafka-python program ------------------------------------------------------------
def with_shmlog_imports(source: str) -> str:
    """The program with its kafka import lines pointed at shmlog.kafka; every other
    line as it was."""
    return re.sub(r"^(from|import) kafka\b", r"\1 shmlog.kafka", source, flags=re.MULTILINE)


def test_a_kafka_python_program_runs_with_only_its_imports_changed(data_dir, tmp_path):
    with open(PROGRAM) as file:
        original = file.read()
    rewritten = with_shmlog_imports(original)
    changed = [(old, new) for old, new in zip(original.splitlines(), rewritten.splitlines())
               if old != new]
    assert changed and all(old.startswith(("from kafka", "import kafka")) for old, _ in changed)
    program = tmp_path / "program.py"
    program.write_text(rewritten)
    finished = subprocess.run([sys.executable, str(program), data_dir, "program-topic",
                               "program-group"], capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stdout.strip().endswith("OK")


def test_the_migration_guides_examples_run(data_dir, tmp_path):
    """Its ``python`` blocks, in order, as one program (the guide says so)."""
    with open(GUIDE) as file:
        blocks = re.findall(r"^```python\n(.*?)^```", file.read(), re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 4
    program = tmp_path / "guide.py"
    program.write_text("\n".join(blocks))
    finished = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "SHMLOG_DATA_DIR": data_dir})
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "86400000 TOPIC" in finished.stdout and "1073741824 DEFAULT" in finished.stdout


# -- futures ---------------------------------------------------------------------------
def test_callbacks_run_once_after_flush_and_at_once_when_added_late(data_dir, topic):
    seen = []
    with Producer(bootstrap_servers=data_dir, linger_ms=10_000) as producer:
        futures = [producer.send(topic, b"v%d" % index, partition=0) for index in range(5)]
        for future in futures:
            future.add_callback(seen.append).add_errback(seen.append)
        assert not futures[0].is_done and futures[0].value is None, "still gathering"
        producer.flush(timeout=WAIT_S)
        assert [metadata.offset for metadata in seen] == [0, 1, 2, 3, 4]
        late = []
        futures[2].add_callback(late.append, ).add_both(lambda result, tag: late.append(tag),
                                                        tag="both")
        assert late == [seen[2], "both"], "added after completion: run at once"
        assert futures[2].succeeded() and not futures[2].failed()
        assert futures[2].value == seen[2] and futures[2].exception is None
    assert len(seen) == 5, "each callback ran once"


def test_callbacks_run_without_flush_on_the_callback_thread(data_dir, topic):
    done = threading.Event()
    threads = []
    with Producer(data_dir, linger_ms=50) as producer:
        producer.send(topic, b"x").add_callback(
            lambda metadata: (threads.append(threading.current_thread().name), done.set()))
        assert done.wait(WAIT_S)
    assert threads == ["shmlog-callbacks"]


def test_errbacks_get_the_batch_error_and_a_raising_callback_is_logged(data_dir, caplog):
    admin = Admin(data_dir)
    admin.create_topic("doomed", partitions=1)
    errors, after = [], []
    with Producer(data_dir, linger_ms=60_000) as producer:
        future = producer.send("doomed", b"x")
        future.add_callback(lambda metadata: 1 / 0)            # never runs: the batch fails
        future.add_errback(errors.append)
        future.add_errback(lambda error: 1 / 0)                # raises: logged, not raised
        future.add_errback(after.append)
        admin.delete_topic("doomed")
        with caplog.at_level(logging.ERROR, logger="shmlog.client.producer_batch"):
            producer.flush(timeout=WAIT_S)
        assert future.failed() and not future.succeeded()
        assert isinstance(future.exception, UnknownTopicOrPartitionError)
        assert errors == [future.exception] and after == [future.exception]
        assert "errback" in caplog.text and "ZeroDivisionError" in caplog.text


def test_serializers_apply_to_every_send_and_deserializers_to_every_record(data_dir, topic):
    with Producer(data_dir, key_serializer=str.encode,
                  value_serializer=lambda value: repr(value).encode()) as producer:
        for index in range(6):
            producer.send(topic, {"n": index}, key=f"k{index}", partition=index % 2)
        producer.flush(timeout=WAIT_S)
    with Consumer(topic, bootstrap=data_dir, auto_offset_reset="earliest",
                  key_deserializer=bytes.decode,
                  value_deserializer=lambda data: ast.literal_eval(data.decode()),
                  consumer_timeout_ms=2_000) as consumer:
        polled = [record for records in consumer.poll(timeout_ms=WAIT_S * 1000,
                                                      max_records=2).values()
                  for record in records]
        iterated = list(consumer)
    received = polled + iterated
    assert sorted((record.key, record.value["n"]) for record in received) == \
        [(f"k{index}", index) for index in range(6)]


# -- the consumer ------------------------------------------------------------------------
def test_commit_async_calls_back_from_poll_with_success_or_the_error(data_dir, topic):
    with Producer(data_dir) as producer:
        for index in range(4):
            producer.send(topic, b"v", partition=index % 2)
    outcomes = []
    with Consumer(topic, bootstrap=data_dir, group_id=f"{topic}-g", **GROUP_SETTINGS,
                  default_offset_commit_callback=lambda *outcome: outcomes.append(
                      ("default", *outcome))) as consumer:
        poll_until(consumer, lambda: len(consumer.assignment()) == 2 and all(
            consumer.position(partition) == 2 for partition in consumer.assignment()),
            "the records")
        future = consumer.commit_async(callback=lambda *outcome: outcomes.append(outcome))
        assert future.result(timeout=WAIT_S) is None
        assert outcomes == [], "callbacks run in a later poll, on the consumer's thread"
        consumer.poll(timeout_ms=0)
        offsets, response = outcomes.pop()
        assert response is None and {p: o.offset for p, o in offsets.items()} == \
            {TopicPartition(topic, 0): 2, TopicPartition(topic, 1): 2}
        # A kafka-python OffsetAndMetadata (three fields) is taken too.
        consumer.commit_async({TopicPartition(topic, 0): OffsetAndMetadata(1, "m", -1)})
        consumer.commit_async({TopicPartition("no-such-topic", 0): 1})
        consumer.commit()                       # runs the callbacks before it commits
        assert [entry[0] for entry in outcomes] == ["default", "default"]
        assert outcomes[0][2] is None and consumer.committed(TopicPartition(topic, 0)) == 2
        assert isinstance(outcomes[1][2], UnknownTopicOrPartitionError)


def test_consumer_metadata_methods(data_dir, topic):
    with Producer(data_dir) as producer:
        for _ in range(3):
            producer.send(topic, b"v", partition=0)
    first = TopicPartition(topic, 0)
    with KafkaConsumer(topic, bootstrap_servers=data_dir, api_version=(2, 8)) as consumer:
        assert topic in consumer.topics() and "__consumer_offsets" not in consumer.topics()
        assert consumer.partitions_for_topic(topic) == {0, 1}
        assert consumer.partitions_for_topic("no-such-topic") is None
        assert consumer.highwater(first) == 3
        consumer.pause(first)
        assert consumer.paused() == {first}
        consumer.resume(first)
        assert consumer.paused() == set()
        consumer.seek_to_beginning(first)
        assert [record.offset for record in consumer.poll(
            timeout_ms=WAIT_S * 1000, update_offsets=True)[first]] == [0, 1, 2]
        with pytest.raises(UnsupportedKafkaOptionError, match="update_offsets"):
            consumer.poll(update_offsets=False)


# -- Admin -------------------------------------------------------------------------------
def test_create_topics_validate_only_and_errors(data_dir):
    with Admin(bootstrap_servers=data_dir) as admin:
        assert admin.create_topics([NewTopic("checked", 2, 1)], validate_only=True) == \
            {"checked": {}}
        assert "checked" not in admin.list_topics(), "validate_only creates nothing"
        for bad, error in ((NewTopic("bad name!", 1, 1), "InvalidTopicError"),
                           (NewTopic("t", 0, 1), "InvalidPartitionsError"),
                           (NewTopic("t", 1, 1, topic_configs={"retention.ms": "x"}),
                            "InvalidConfigError")):
            with pytest.raises(Exception) as raised:
                admin.create_topics([bad], validate_only=True)
            assert type(raised.value).__name__ == error
        created = admin.create_topics([NewTopic("made", topic_configs={"retention.ms": 5000}),
                                       NewTopic("made-too", 3)])
        assert [len(created[name]["partitions"]) for name in ("made", "made-too")] == [1, 3]
        with pytest.raises(TopicExistsError):
            admin.create_topics([NewTopic("made", 1, 1), NewTopic("made-third", 1, 1)])
        assert "made-third" in admin.list_topics(), "the other topics are created"
        with pytest.raises(TopicExistsError):
            admin.create_topics([NewTopic("made", 1, 1)], validate_only=True)
        with pytest.raises(InvalidReplicationFactorError, match="single broker"):
            admin.create_topics([NewTopic("replicated", 1, 3)])
        with pytest.raises(UnsupportedKafkaOptionError, match="replica_assignments"):
            admin.create_topics([NewTopic("placed", replica_assignments={0: [0]})])
        admin.create_partitions({"made": NewPartitions(3)}, validate_only=True)
        assert len(admin.describe_topic("made")["partitions"]) == 1
        admin.create_partitions({"made": NewPartitions(3)})
        assert len(admin.describe_topic("made")["partitions"]) == 3
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"made": NewPartitions(2)}, validate_only=True)
        admin.delete_topics(["made", "made-too", "made-third"])
        assert not {"made", "made-too", "made-third"} & set(admin.list_topics())
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["made"])


def test_describe_and_alter_configs_with_their_sources(data_dir):
    admin = Admin(data_dir)
    admin.create_topics([NewTopic("configured", 1, 1, topic_configs={
        "retention.ms": "60000", "cleanup.policy": "compact"})])
    [described] = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "configured")])
    assert described["retention.ms"].value == "60000"
    assert described["retention.ms"].source is ConfigSource.TOPIC
    assert not described["retention.ms"].is_default
    assert described["segment.bytes"].source is ConfigSource.DEFAULT
    assert described["segment.bytes"].value == str(1 << 30)
    admin.alter_configs([ConfigResource("topic", "configured", {"segment.ms": "1000"})])
    [described] = admin.describe_configs([ConfigResource("topic", "configured",
                                                         ["segment.ms", "retention.ms"])])
    assert set(described) == {"segment.ms", "retention.ms"}, "only the settings named"
    assert described["segment.ms"].source is ConfigSource.TOPIC
    assert described["retention.ms"].source is ConfigSource.DEFAULT, \
        "alter_configs replaces the overrides (Kafka's AlterConfigs)"
    [broker] = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")])
    assert broker["group_initial_rebalance_delay_ms"].value == "0"
    assert broker["group_initial_rebalance_delay_ms"].source is ConfigSource.BROKER
    assert broker["partitions_max"].source is ConfigSource.DEFAULT
    assert broker["partitions_max"].read_only
    with pytest.raises(InvalidConfigError, match="static"):
        admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "0", {"x": "1"})])
    with pytest.raises(InvalidConfigError):
        admin.alter_configs([ConfigResource("topic", "configured", {"no.such": "1"})])
    admin.delete_topics(["configured"])


def test_groups_described_listed_and_deleted_in_kafka_pythons_shape(data_dir, topic):
    group = f"{topic}-g"
    with Producer(data_dir) as producer:
        producer.send(topic, b"v", partition=1)
    with Consumer(topic, bootstrap=data_dir, group_id=group, client_id="me",
                  **GROUP_SETTINGS) as consumer:
        poll_until(consumer, lambda: len(consumer.assignment()) == 2, "the assignment")
        consumer.commit({TopicPartition(topic, 1): 1})
        admin = KafkaAdminClient(bootstrap_servers=data_dir)
        [described, missing] = admin.describe_consumer_groups([group, "no-such-group"])
        assert described.group == group and described.state == "Stable"
        assert described.protocol_type == "consumer" and described.error_code == 0
        [member] = described.members
        assert member.client_host == socket.gethostname()
        assert member.client_id == "me" and sorted(member.member_assignment) == \
            [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        assert missing.state == "Dead" and missing.members == []
        assert (group, "consumer") in admin.list_consumer_groups()
        offsets = admin.list_consumer_group_offsets(group)
        assert offsets == {TopicPartition(topic, 1): OffsetAndMetadata(1, "", -1)}
        [(name, error)] = admin.delete_consumer_groups([group])
        assert name == group and type(error).__name__ == "NonEmptyGroupError"
    assert admin.delete_consumer_groups([group]) == [(group, None)]
    assert Admin(data_dir).list_consumer_group_offsets(group) == {}
