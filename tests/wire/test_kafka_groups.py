"""Consumer groups over Kafka's protocol: librdkafka and kafka-python members share a
topic's partitions and read each record once, commit and fetch offsets that
shmlog's own coordinator keeps (``shmlog groups`` sees them), one group mixes a
shmlog Consumer and a librdkafka member, a member that closes hands its partitions
over, AdminClient lists and describes groups, and an assignor shmlog does not run is
refused as Kafka refuses it.

Method: the module's broker, with no initial rebalance delay; records put with
shmlog's own Producer; members polled in turn from this thread; every wait bounded.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import TopicPartition as KafkaClientPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.errors import KafkaError

from helpers import kafka_broker_process
from shmlog import Admin, Consumer, Producer
from shmlog.protocol.control_client import request

WAIT_S = 30.0


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory):
    """(data directory, "host:port"): groups rebalance at once (no initial delay)."""
    with kafka_broker_process(str(tmp_path_factory.mktemp("kafka-groups") / "data"),
                              group_initial_rebalance_delay_ms=0) as broker:
        yield broker


def put(data_dir: str, topic: str, partitions: int, per_partition: int) -> None:
    Admin(data_dir).create_topic(topic, partitions)
    with Producer(data_dir) as producer:
        for partition in range(partitions):
            for index in range(per_partition):
                producer.send(topic, b"%d-%d" % (partition, index), partition=partition)
        producer.flush(timeout=WAIT_S)


def member(address: str, group: str, **config) -> KafkaClientConsumer:
    return KafkaClientConsumer({"bootstrap.servers": address, "group.id": group,
                                "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                                "enable.auto.commit": False, **config})


def poll_until(members, count: int, done=lambda: True) -> list[tuple[int, int]]:
    """(partition, offset) of what ``members`` read, polling each in turn, until
    ``count`` different records are read and ``done()``."""
    read, deadline = [], time.monotonic() + WAIT_S
    while len(set(read)) < count or not done():
        assert time.monotonic() < deadline, f"read {len(set(read))} of {count} in {WAIT_S} s"
        for consumer in members:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                read.append((message.partition(), message.offset()))
    return read


def assignments(members) -> list[set[int]]:
    return [{partition.partition for partition in consumer.assignment()} for consumer in members]


def test_two_librdkafka_members_share_the_partitions_and_commit(group_broker):
    data_dir, address = group_broker
    put(data_dir, "shared", 4, 10)
    members = [member(address, "pair") for _ in range(2)]
    for consumer in members:
        consumer.subscribe(["shared"])
    try:
        read = poll_until(members, 40, lambda: all(assignments(members)))
        # Every record is read. Not each once: without an initial rebalance delay the
        # first member may join alone and read before the second joins, and the
        # partitions then handed over are read again from the start (nothing was
        # committed), as with Kafka's eager protocol.
        assert set(read) == {(p, o) for p in range(4) for o in range(10)}
        first, second = assignments(members)
        assert first | second == {0, 1, 2, 3} and not first & second
        for consumer in members:
            consumer.commit(offsets=[KafkaClientPartition("shared", p, 7)
                                     for p in (partition.partition
                                               for partition in consumer.assignment())],
                            asynchronous=False)
        committed = members[0].committed([KafkaClientPartition("shared", p) for p in range(4)],
                                         timeout=WAIT_S)
        assert [partition.offset for partition in committed] == [7, 7, 7, 7]
    finally:
        for consumer in members:
            consumer.close()
    described = request(data_dir, "describe_group", group_id="pair")
    assert [(entry["partition"], entry["committed"], entry["lag"])
            for entry in described["partitions"]] == [(p, 7, 3) for p in range(4)]


def test_a_member_that_closes_hands_its_partitions_over(group_broker):
    data_dir, address = group_broker
    put(data_dir, "handover", 2, 1)
    members = [member(address, "handover") for _ in range(2)]
    for consumer in members:
        consumer.subscribe(["handover"])
    poll_until(members, 2, lambda: all(assignments(members)))
    members[0].close()
    try:
        poll_until(members[1:], 0, lambda: assignments(members[1:]) == [{0, 1}])
    finally:
        members[1].close()


def test_a_group_mixes_a_shmlog_consumer_and_a_kafka_client(group_broker):
    data_dir, address = group_broker
    put(data_dir, "mixed", 4, 5)
    ours = Consumer("mixed", bootstrap=data_dir, group_id="mixed",
                    auto_offset_reset="earliest", session_timeout_ms=6000,
                    enable_auto_commit=False, partition_assignment_strategy=("range",))
    theirs = member(address, "mixed", **{"partition.assignment.strategy": "range"})
    theirs.subscribe(["mixed"])
    try:
        ours_read: list = []
        theirs_read: list = []
        deadline = time.monotonic() + WAIT_S

        def poll_both() -> None:
            message = theirs.poll(0.05)
            if message is not None and message.error() is None:
                theirs_read.append((message.partition(), message.offset()))
            for batch in ours.poll(timeout_ms=50).values():
                ours_read.extend((record.partition, record.offset) for record in batch)

        def each_read_its_share() -> bool:
            """Both hold partitions and each has read every record of its own. Without
            an initial rebalance delay one member may join alone and read before the
            other joins; what it hands over is read again from the start, as neither
            member commits."""
            shares = [({partition.partition for partition in ours.assignment()}, ours_read),
                      (assignments([theirs])[0], theirs_read)]
            return all(partitions and {(p, o) for p in partitions for o in range(5)} <= set(read)
                       for partitions, read in shares)

        while not each_read_its_share():
            assert time.monotonic() < deadline, \
                f"read {len(set(ours_read))} and {len(set(theirs_read))} in {WAIT_S} s"
            poll_both()
        mine = {partition.partition for partition in ours.assignment()}
        assert mine | assignments([theirs])[0] == {0, 1, 2, 3}
        assert not mine & assignments([theirs])[0]
    finally:
        ours.close()
        theirs.close()


def test_kafka_python_consumes_as_a_group_and_commits(group_broker):
    data_dir, address = group_broker
    put(data_dir, "kafka-python-group", 2, 5)
    consumer = KafkaConsumer("kafka-python-group", bootstrap_servers=address,
                             group_id="kp", auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 10:
                break
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(values) == sorted(b"%d-%d" % (p, i) for p in range(2) for i in range(5))
    fetched = request(data_dir, "fetch_offsets", group_id="kp")["offsets"]
    assert [(topic, partition, offset) for topic, partition, offset, _ in fetched] == \
        [("kafka-python-group", 0, 5), ("kafka-python-group", 1, 5)]


def test_admin_lists_and_describes_groups(group_broker):
    data_dir, address = group_broker
    put(data_dir, "described", 1, 1)
    consumer = member(address, "described")
    consumer.subscribe(["described"])
    try:
        poll_until([consumer], 1)
        admin = AdminClient({"bootstrap.servers": address})
        listed = {group.group_id for group in admin.list_consumer_groups().result(WAIT_S).valid}
        assert "described" in listed
        described = admin.describe_consumer_groups(["described"])["described"].result(WAIT_S)
        assert described.state.name == "STABLE"
        [only] = described.members
        assert {partition.partition for partition in only.assignment.topic_partitions} == {0}
    finally:
        consumer.close()


def test_an_assignor_shmlog_does_not_run_is_refused(group_broker):
    data_dir, address = group_broker
    put(data_dir, "sticky", 1, 1)
    consumer = KafkaConsumer("sticky", bootstrap_servers=address, group_id="sticky",
                             partition_assignment_strategy=[StickyPartitionAssignor],
                             consumer_timeout_ms=5_000)
    try:
        with pytest.raises(KafkaError, match="InconsistentGroupProtocol"):
            consumer.poll(timeout_ms=int(WAIT_S * 1000))
    finally:
        consumer.close()
