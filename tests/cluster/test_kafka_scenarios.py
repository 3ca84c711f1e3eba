"""The issue's client scenarios, each run unchanged against one broker and against
a three-broker cluster: every client (librdkafka, kafka-python, aiokafka, kcat,
kafkajs) lists the brokers, produces with its own producer, and reads as a group of
three with each assignor it has of range and cooperative-sticky (kafkajs: its only
one, roundrobin): the group settles with every partition held once, each record
produced afterwards is read exactly once, by the member holding its partition,
the members' commits reach the partitions' ends, and the members leave the group
empty when stopped; and each client with Kafka's consumer API (librdkafka,
kafka-python, aiokafka) assigns, finds an offset by time, seeks, pauses and
resumes a partition, and commits, through the harness's ``reader``.

Method: the target is a broker of this module (no initial rebalance delay) or the
shared fault cluster (its topics at replication factor 3, led by all three
brokers; Kafka's default initial rebalance delay); clients bootstrap from every
listener of the target. The group is watched through librdkafka's AdminClient
(DescribeGroups, OffsetFetch), as an operator would. Each test has its own topic
and group; every wait is bounded.
"""

from __future__ import annotations

import time
import uuid

import pytest

from helpers import kafka_broker_process
from kafka_clients import CLIENTS, Record
from shmlog import Admin

WAIT_S = 60.0
PARTITIONS = 6
PER_PARTITION = 5
BASE_MS = 1_700_000_000_000
# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: asked again.
COORDINATOR_MOVING = (14, 15, 16)
# The assignors the issue names; a client having neither runs its own (kafkajs).
ASSIGNORS = ("range", "cooperative-sticky")


class Target:
    """A broker or cluster: its bootstrap servers, and how to make a topic there
    (returned once every partition is led, as a client's metadata says)."""

    def __init__(self, name: str, bootstrap: str, create, brokers: int) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self._create = create
        self.brokers = brokers

    def topic(self, stem: str, partitions: int = PARTITIONS) -> str:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        self._create(name, partitions)
        deadline = time.monotonic() + WAIT_S
        while True:
            listing = CLIENTS["librdkafka"].metadata(self.bootstrap, [name], timeout_s=WAIT_S)
            leaders = listing.topics.get(name, {})
            if len(leaders) == partitions and all(leader >= 0 for leader in leaders.values()):
                return name
            assert time.monotonic() < deadline, f"{name} not led in {WAIT_S} s: {leaders}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def one_broker(tmp_path_factory):
    with kafka_broker_process(str(tmp_path_factory.mktemp("kafka-scenarios") / "data"),
                              group_initial_rebalance_delay_ms=0) as broker:
        yield broker


@pytest.fixture(params=["one broker", "three brokers"])
def target(request) -> Target:
    if request.param == "one broker":
        data_dir, address = request.getfixturevalue("one_broker")
        return Target(request.param, address,
                      lambda name, partitions: Admin(data_dir).create_topic(name, partitions),
                      brokers=1)
    cluster = request.getfixturevalue("fault_cluster")

    def create(name: str, partitions: int) -> None:
        Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
            name, partitions, replication_factor=3)
    return Target(request.param, cluster.bootstrap_servers, create, brokers=3)


def skip_missing(name: str):
    client = CLIENTS[name]
    reason = client.missing()
    if reason:
        pytest.skip(reason)
    return client


def group_cases():
    """(client, assignor): each of the issue's assignors a client has, else its own."""
    return [(name, assignor) for name in sorted(CLIENTS)
            for assignor in (sorted(set(ASSIGNORS) & CLIENTS[name].ASSIGNORS)
                             or sorted(CLIENTS[name].ASSIGNORS))]


# -- watching a group as an operator would -----------------------------------------------

def describe(bootstrap: str, group_id: str):
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group_id])[group_id].result(WAIT_S)


def held(description, topic: str) -> dict[str, set[int]]:
    """{member's client id: partitions of ``topic`` the coordinator gave it}."""
    return {member.client_id: {partition.partition
                               for partition in member.assignment.topic_partitions
                               if partition.topic == topic}
            for member in description.members}


def committed(bootstrap: str, group_id: str, topic: str,
              partitions: int = PARTITIONS) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions as Asked
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = Asked(group_id, [TopicPartition(topic, p) for p in range(partitions)])
    answer = admin.list_consumer_group_offsets([asked])[group_id].result(WAIT_S)
    return {partition.partition: partition.offset for partition in answer.topic_partitions}


def wait_until(condition, what: str, members=None):
    """``condition()``'s first true answer, asked until the bound; a retriable error
    of the AdminClient (a coordinator moving or not elected yet) is asked again."""
    from confluent_kafka import KafkaException
    deadline, last = time.monotonic() + WAIT_S, None
    while True:
        try:
            found = condition()
        except KafkaException as error:
            if error.args[0].code() not in COORDINATOR_MOVING and \
                    not error.args[0].retriable():
                raise
            found, last = None, error
        if found:
            return found
        errors = members.errors if members is not None else []
        assert time.monotonic() < deadline, \
            f"waited {WAIT_S} s for {what}; members' errors: {errors}; last refusal: {last}"
        time.sleep(0.2)


def settled(bootstrap: str, group_id: str, topic: str, members: int):
    """The group's holdings once it is stable with ``members`` members holding every
    partition once (each at least one), else None."""
    def look():
        description = describe(bootstrap, group_id)
        holdings = held(description, topic)
        every = [p for partitions in holdings.values() for p in partitions]
        if description.state.name == "STABLE" and len(holdings) == members and \
                all(holdings.values()) and sorted(every) == list(range(PARTITIONS)):
            return holdings
        return None
    return look


# -- the scenarios -------------------------------------------------------------------------

def test_every_client_lists_every_broker_of_the_target(target):
    topic = target.topic("listed")
    for name in sorted(CLIENTS):
        if CLIENTS[name].missing():
            continue
        listing = CLIENTS[name].metadata(target.bootstrap, [topic], timeout_s=WAIT_S)
        assert len(listing.brokers) == target.brokers, (name, listing)
        assert sorted(listing.topics[topic]) == list(range(PARTITIONS)), (name, listing)
        assert set(listing.topics[topic].values()) <= set(listing.brokers), (name, listing)
        if target.brokers == 3:                    # the cluster spreads its leaders
            assert len(set(listing.topics[topic].values())) > 1, (name, listing)


@pytest.mark.parametrize("name, assignor", group_cases())
def test_a_group_of_three_reads_each_record_once_and_commits(target, name, assignor):
    client = skip_missing(name)
    topic = target.topic("group3")
    group_id = f"three-{uuid.uuid4().hex[:8]}"
    sent = [Record(b"value %d" % index, key=b"key %d" % index, partition=index % PARTITIONS)
            for index in range(PARTITIONS * PER_PARTITION)]
    with client.group(target.bootstrap, topic, group_id=group_id, members=3,
                      assignor=assignor, timeout_s=3 * WAIT_S) as members:
        holdings = wait_until(settled(target.bootstrap, group_id, topic, 3),
                              "three members holding every partition once", members)
        deliveries = client.produce(target.bootstrap, topic, sent, timeout_s=WAIT_S)
        assert [delivery.error for delivery in deliveries] == [None] * len(sent)
        ends = {partition: PER_PARTITION for partition in range(PARTITIONS)}
        wait_until(lambda: members.total() >= len(sent)
                   and committed(target.bootstrap, group_id, topic) == ends,
                   "every record read and committed", members)
        read = members.stop()
    assert sorted((r.partition, r.offset, r.key, r.value) for each in read for r in each) == \
        sorted((r.partition, index // PARTITIONS, r.key, r.value) for index, r in enumerate(sent))
    assert sorted(holdings) == [f"member-{index}" for index in range(3)]
    for index, each in enumerate(read):             # each read what it held, and only that
        assert {r.partition for r in each} == holdings[f"member-{index}"], (index, holdings)
    wait_until(lambda: not describe(target.bootstrap, group_id).members,
               "the members to leave the group")


def read_until(reader, count: int) -> list:
    """What ``reader`` polls until ``count`` records (or the bound: the caller asserts)."""
    found, deadline = [], time.monotonic() + WAIT_S
    while len(found) < count and time.monotonic() < deadline:
        found += reader.poll()
    return found


def places(records) -> list[tuple[int, int]]:
    return sorted((record.partition, record.offset) for record in records)


@pytest.mark.parametrize("name", sorted(name for name in CLIENTS
                                        if "positions" in CLIENTS[name].CAN))
def test_commit_seek_offsets_for_times_and_pause(target, name):
    client = skip_missing(name)
    topic = target.topic("positions", 2)
    group_id = f"positions-{uuid.uuid4().hex[:8]}"
    # Partition 0 holds offsets 0-9 stamped BASE + 20k, partition 1 BASE + 10 + 20k.
    sent = [Record(b"value %d" % index, partition=index % 2, timestamp_ms=BASE_MS + 10 * index)
            for index in range(20)]
    deliveries = client.produce(target.bootstrap, topic, sent, timeout_s=WAIT_S)
    assert [delivery.error for delivery in deliveries] == [None] * len(sent)
    reader = client.reader(target.bootstrap, topic, group_id=group_id, timeout_s=WAIT_S)
    try:
        reader.assign({0: 0, 1: 0})
        assert places(read_until(reader, 20)) == [(p, o) for p in (0, 1) for o in range(10)]
        assert reader.offsets_for_times({0: BASE_MS + 45, 1: BASE_MS + 1_000}) == \
            {0: 3, 1: None}
        reader.seek(0, 3)
        assert places(read_until(reader, 7)) == [(0, offset) for offset in range(3, 10)]
        reader.pause([1])
        more = [Record(b"more %d" % index, partition=index % 2) for index in range(4)]
        deliveries = client.produce(target.bootstrap, topic, more, timeout_s=WAIT_S)
        assert [delivery.error for delivery in deliveries] == [None] * len(more)
        assert places(read_until(reader, 2)) == [(0, 10), (0, 11)]    # 1 paused: none of it
        reader.resume([1])
        assert places(read_until(reader, 2)) == [(1, 10), (1, 11)]
        reader.commit({0: 12, 1: 7})
        assert reader.committed([0, 1]) == {0: 12, 1: 7}
    finally:
        reader.close()
    assert committed(target.bootstrap, group_id, topic, 2) == {0: 12, 1: 7}
