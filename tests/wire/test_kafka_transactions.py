"""Kafka's transactions through librdkafka (confluent-kafka), unchanged, against a
broker's Kafka listener: a transactional producer commits over two partitions and
aborts another transaction, and a read_committed consumer sees exactly the committed
records while a read_uncommitted one sees them all (markers never as records);
offsets sent to a transaction are committed for the group only when it commits; a
second producer of the same transactional id fences the first, whose commit then
fails fatally; a read_committed consumer stops at an open transaction's first
offset (the last stable offset, which ListOffsets answers too) until it commits.
Raw requests check the versions that do not know PRODUCER_FENCED.

Method: the module's broker (``kafka_broker``), a topic and a transactional id per
test; every wait bounded; every client closed.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaException, TopicPartition
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import Producer as KafkaClientProducer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonPartition
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from kafka_clients.raw import ask_once
from shmlog import Admin

WAIT_S = 20.0
QUIET_S = 1.5                 # how long a reader must see nothing more


@pytest.fixture
def clients():
    """A list the test puts its producers and consumers in: each closed at its end (a
    fenced producer's close reports its fatal error; dropped, it is destroyed)."""
    made: list = []
    yield made
    for client in reversed(made):
        try:
            client.close()
        except KafkaException as error:
            assert error.args[0].fatal(), error
    made.clear()


def transactional_producer(clients: list, address: str,
                           transactional_id: str) -> KafkaClientProducer:
    producer = KafkaClientProducer({"bootstrap.servers": address,
                                    "transactional.id": transactional_id, "linger.ms": 2})
    clients.append(producer)
    producer.init_transactions(WAIT_S)
    return producer


def plain_producer(clients: list, address: str) -> KafkaClientProducer:
    producer = KafkaClientProducer({"bootstrap.servers": address})
    clients.append(producer)
    return producer


def consumer(address: str, isolation: str, **config) -> KafkaClientConsumer:
    return KafkaClientConsumer({"bootstrap.servers": address, "group.id": "readers",
                                "enable.auto.commit": False, "isolation.level": isolation,
                                "auto.offset.reset": "earliest", **config})


def read(reader: KafkaClientConsumer, count: int) -> list:
    """(partition, offset, value) of what ``reader`` returns: ``count`` records, then
    whatever more comes within QUIET_S (so an extra record is seen)."""
    found, deadline = [], time.monotonic() + WAIT_S
    while len(found) < count and time.monotonic() < deadline:
        message = reader.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            found.append((message.partition(), message.offset(), message.value()))
    quiet = time.monotonic() + QUIET_S
    while time.monotonic() < quiet:
        message = reader.poll(0.1)
        if message is not None:
            assert message.error() is None, message.error()
            found.append((message.partition(), message.offset(), message.value()))
    return found


def read_topic(address: str, topic: str, partitions: int, isolation: str, count: int) -> list:
    reader = consumer(address, isolation)
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        return read(reader, count)
    finally:
        reader.close()


def produce(producer: KafkaClientProducer, topic: str, values: list[bytes],
            partitions: int = 1) -> None:
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=index % partitions)
    assert producer.flush(WAIT_S) == 0


def test_a_read_committed_consumer_sees_exactly_the_committed_transactions(kafka_broker,
                                                                        clients):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("txn-two", 2)
    producer = transactional_producer(clients, address, "tx-two")
    committed = [f"commit-{index}".encode() for index in range(10)]
    aborted = [f"abort-{index}".encode() for index in range(6)]
    later = [f"later-{index}".encode() for index in range(4)]
    producer.begin_transaction()
    produce(producer, "txn-two", committed, partitions=2)
    producer.commit_transaction(WAIT_S)
    producer.begin_transaction()
    produce(producer, "txn-two", aborted, partitions=2)
    producer.abort_transaction(WAIT_S)
    producer.begin_transaction()
    produce(producer, "txn-two", later, partitions=2)
    producer.commit_transaction(WAIT_S)
    seen = read_topic(address, "txn-two", 2, "read_committed", len(committed + later))
    assert sorted(value for _, _, value in seen) == sorted(committed + later)
    everything = read_topic(address, "txn-two", 2, "read_uncommitted",
                            len(committed + aborted + later))
    assert sorted(value for _, _, value in everything) == sorted(committed + aborted + later)
    # Three markers in each partition took an offset each; none came as a record.
    for partition in (0, 1):
        offsets = [offset for part, offset, _ in everything if part == partition]
        assert offsets == sorted(offsets) and offsets[-1] == 10 + 2 - 1 and len(offsets) == 10
    # Each transaction's records were appended in its partition before its marker.
    for partition in (0, 1):
        in_order = [value for part, _, value in sorted(everything) if part == partition]
        assert [value[:5] for value in in_order] == [b"commi"] * 5 + [b"abort"] * 3 + \
            [b"later"] * 2


def test_offsets_sent_to_a_transaction_are_committed_with_it(kafka_broker, clients):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("txn-in", 1)
    Admin(data_dir).create_topic("txn-out", 1)
    plain = plain_producer(clients, address)
    produce(plain, "txn-in", [f"in-{index}".encode() for index in range(5)])
    member = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "txn-group",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "isolation.level": "read_committed"})
    producer = transactional_producer(clients, address, "tx-offsets")
    try:
        member.subscribe(["txn-in"])
        consumed = read(member, 5)
        assert [value for _, _, value in consumed] == [f"in-{i}".encode() for i in range(5)]
        producer.begin_transaction()
        produce(producer, "txn-out", [value.upper() for _, _, value in consumed])
        position = [TopicPartition("txn-in", 0, consumed[-1][1] + 1)]
        producer.send_offsets_to_transaction(position, member.consumer_group_metadata(),
                                             WAIT_S)
        before = member.committed([TopicPartition("txn-in", 0)], WAIT_S)
        assert before[0].offset == OFFSET_INVALID            # pending: not committed yet
        producer.commit_transaction(WAIT_S)
        after = member.committed([TopicPartition("txn-in", 0)], WAIT_S)
        assert after[0].offset == 5
    finally:
        member.close()
    assert sorted(value for _, _, value in read_topic(address, "txn-out", 1,
                                                      "read_committed", 5)) == \
        sorted(f"IN-{index}".encode() for index in range(5))


def test_a_second_producer_of_the_id_fences_the_first(kafka_broker, clients):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("txn-zombie", 1)
    zombie = transactional_producer(clients, address, "tx-zombie")
    zombie.begin_transaction()
    produce(zombie, "txn-zombie", [b"zombie-0", b"zombie-1"])
    successor = transactional_producer(clients, address, "tx-zombie")   # aborts the zombie's
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(WAIT_S)
    error = fenced.value.args[0]
    assert error.fatal(), error
    assert error.name() in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), error
    successor.begin_transaction()
    produce(successor, "txn-zombie", [b"successor"])
    successor.commit_transaction(WAIT_S)
    seen = read_topic(address, "txn-zombie", 1, "read_committed", 1)
    assert [value for _, _, value in seen] == [b"successor"]


def test_a_read_committed_consumer_stops_at_an_open_transaction(kafka_broker, clients):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("txn-open", 1)
    plain = plain_producer(clients, address)
    produce(plain, "txn-open", [b"before-0", b"before-1"])
    producer = transactional_producer(clients, address, "tx-open")
    producer.begin_transaction()
    produce(producer, "txn-open", [b"open-0", b"open-1", b"open-2"])
    produce(plain, "txn-open", [b"after-0"])                  # past the open transaction
    committed_reader = consumer(address, "read_committed")
    uncommitted_reader = consumer(address, "read_uncommitted")
    try:
        committed_reader.assign([TopicPartition("txn-open", 0, 0)])
        seen = read(committed_reader, 2)
        assert [value for _, _, value in seen] == [b"before-0", b"before-1"]
        # ListOffsets: the latest offset is the last stable one for read_committed.
        assert committed_reader.get_watermark_offsets(
            TopicPartition("txn-open", 0), WAIT_S, cached=False) == (0, 2)
        assert uncommitted_reader.get_watermark_offsets(
            TopicPartition("txn-open", 0), WAIT_S, cached=False) == (0, 6)
        producer.commit_transaction(WAIT_S)
        rest = read(committed_reader, 4)
        assert [(offset, value) for _, offset, value in rest] == \
            [(2, b"open-0"), (3, b"open-1"), (4, b"open-2"), (5, b"after-0")]
        assert committed_reader.get_watermark_offsets(
            TopicPartition("txn-open", 0), WAIT_S, cached=False) == (0, 7)
    finally:
        committed_reader.close()
        uncommitted_reader.close()


def test_kafka_python_commits_and_aborts_transactions(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("txn-kafka-python", 2)
    producer = KafkaProducer(bootstrap_servers=address, transactional_id="tx-kafka-python",
                             max_block_ms=int(WAIT_S * 1000))
    reader = KafkaConsumer(bootstrap_servers=address, isolation_level="read_committed",
                           enable_auto_commit=False, consumer_timeout_ms=int(QUIET_S * 1000))
    try:
        producer.init_transactions()
        for committed in (True, False, True):
            producer.begin_transaction()
            for partition in (0, 1):
                producer.send("txn-kafka-python", f"{committed}-{partition}".encode(),
                              partition=partition)
            producer.flush(timeout=WAIT_S)              # appended, then ended
            (producer.commit_transaction if committed else producer.abort_transaction)()
        reader.assign([KafkaPythonPartition("txn-kafka-python", p) for p in (0, 1)])
        reader.seek_to_beginning()
        found, deadline = [], time.monotonic() + WAIT_S
        while len(found) < 4 and time.monotonic() < deadline:
            for batch in reader.poll(timeout_ms=200).values():
                found += [(record.partition, record.offset, record.value) for record in batch]
        found += [(record.partition, record.offset, record.value) for record in reader]
    finally:
        reader.close()
        producer.close(timeout=WAIT_S)
    # Each transaction took a record and a marker in each partition.
    assert sorted(found) == [(partition, offset, f"True-{partition}".encode())
                             for partition in (0, 1) for offset in (0, 4)]


def _ask(address: str, request, response_class):
    return ask_once(address, request, response_class, WAIT_S)


@pytest.mark.parametrize("version, fenced", [(3, 47), (4, 90)])
def test_an_init_producer_id_naming_an_old_epoch_is_fenced_as_its_version_says(
        kafka_broker, version, fenced):
    _, address = kafka_broker
    transactional_id = f"tx-raw-{version}"
    first = _ask(address, InitProducerIdRequest[version](
        transactional_id=transactional_id, transaction_timeout_ms=60_000, producer_id=-1,
        producer_epoch=-1), InitProducerIdResponse)
    assert first.error_code == 0 and first.producer_id >= 0
    second = _ask(address, InitProducerIdRequest[version](
        transactional_id=transactional_id, transaction_timeout_ms=60_000,
        producer_id=first.producer_id, producer_epoch=first.producer_epoch),
        InitProducerIdResponse)
    assert (second.error_code, second.producer_id) == (0, first.producer_id)
    assert second.producer_epoch == first.producer_epoch + 1
    stale = _ask(address, InitProducerIdRequest[version](
        transactional_id=transactional_id, transaction_timeout_ms=60_000,
        producer_id=first.producer_id, producer_epoch=first.producer_epoch),
        InitProducerIdResponse)
    assert stale.error_code == fenced
