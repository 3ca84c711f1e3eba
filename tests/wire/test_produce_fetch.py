"""Produce and Fetch through real Kafka clients: librdkafka (confluent-kafka) and
kafka-python produce (idempotent, zstd, gzip, acks 0/1/all) and shmlog's own
Consumer reads every field back; shmlog's own Producer writes and the Kafka clients
read every field; a long poll is woken by an append; a re-sent batch is not appended
twice, one stored in pieces included; and what shmlog refuses (snappy, an unknown
partition, an out-of-range offset) gets Kafka's error.

Method: the module's broker (``kafka_broker``), a topic per test; every wait bounded.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import Producer as KafkaClientProducer
from confluent_kafka import TopicPartition as KafkaClientPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafka_clients.raw import ask_once
from shmlog import Admin, Consumer, Producer
from shmlog.client.consumer import TopicPartition as ShmlogPartition
from shmlog.native.crc32c import crc32c
from shmlog.record.kafka_batches import from_kafka
from shmlog.record.records import validate_batches

WAIT_S = 20.0
BASE_MS = 1_700_000_000_000


def shmlog_records(data_dir: str, topic: str, partitions: int, count: int) -> list:
    consumer = Consumer(bootstrap=data_dir)
    try:
        consumer.assign([ShmlogPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        found, deadline = [], time.monotonic() + WAIT_S
        while len(found) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                found += batch
        return found
    finally:
        consumer.close()


def librdkafka_records(address: str, topic: str, partitions: int, count: int,
                       start: int = 0, **config) -> list:
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "unused",
                                    "enable.auto.commit": False, **config})
    try:
        consumer.assign([KafkaClientPartition(topic, p, start) for p in range(partitions)])
        found, deadline = [], time.monotonic() + WAIT_S
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                found.append(message)
        return found
    finally:
        consumer.close()


def test_librdkafka_produces_idempotently_and_every_reader_agrees(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("rdkafka-in", 3)
    producer = KafkaClientProducer({"bootstrap.servers": address, "enable.idempotence": True,
                                    "linger.ms": 5, "compression.type": "zstd"})
    delivered = []
    for index in range(600):
        producer.produce("rdkafka-in", value=b"v%d" % index, key=b"k%d" % (index % 7),
                         headers=[("n", str(index).encode())], timestamp=BASE_MS + index,
                         on_delivery=lambda error, message: delivered.append(
                             (error, message.partition(), message.offset())))
    assert producer.flush(WAIT_S) == 0
    assert [error for error, _, _ in delivered if error is not None] == []
    offsets = {(partition, offset) for _, partition, offset in delivered}
    assert len(offsets) == 600                                  # dense, none twice
    read = shmlog_records(data_dir, "rdkafka-in", 3, 600)
    assert sorted(int(record.value[1:]) for record in read) == list(range(600))
    by_value = {record.value: record for record in read}
    record = by_value[b"v42"]
    assert (record.key, record.headers, record.timestamp) == (b"k0", [("n", b"42")],
                                                              BASE_MS + 42)
    again = librdkafka_records(address, "rdkafka-in", 3, 600)
    assert {(message.partition(), message.offset()) for message in again} == offsets
    assert {message.value() for message in again} == set(by_value)


def test_kafka_python_produces_with_gzip_and_every_acks(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("kafka-python-in", 1)
    for acks in (0, 1, "all"):
        producer = KafkaProducer(bootstrap_servers=address, acks=acks, compression_type="gzip",
                                 linger_ms=2)
        for index in range(50):
            producer.send("kafka-python-in", key=b"key", value=f"{acks}-{index}".encode())
        producer.flush(timeout=WAIT_S)
        producer.close(timeout=WAIT_S)
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                             consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        consumer.assign([TopicPartition("kafka-python-in", 0)])
        consumer.seek_to_beginning()
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 150:
                break
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"{acks}-{index}".encode() for acks in (0, 1, "all")
                                    for index in range(50))


def test_shmlog_records_reach_kafka_clients_whole(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("shmlog-out", 1)
    with Producer(data_dir, compression="zstd") as producer:
        producer.send("shmlog-out", b"compressed", key=b"k", headers=[("h", None)],
                      timestamp_ms=BASE_MS)
        producer.flush(timeout=WAIT_S)
    with Producer(data_dir) as producer:
        producer.send("shmlog-out", None, key=b"tombstone", timestamp_ms=BASE_MS + 1)
        producer.send("shmlog-out", b"", timestamp_ms=BASE_MS + 2)
        producer.flush(timeout=WAIT_S)
    [first, second, third] = librdkafka_records(address, "shmlog-out", 1, 3)
    assert (first.value(), first.key(), first.headers(), first.timestamp()[1]) == \
        (b"compressed", b"k", [("h", None)], BASE_MS)
    assert (second.value(), second.key(), third.value(), third.key()) == \
        (None, b"tombstone", b"", None)
    assert [message.offset() for message in (first, second, third)] == [0, 1, 2]


def test_a_long_poll_is_woken_by_an_append(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("long-poll", 1)
    got = []
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "unused",
                                    "fetch.wait.max.ms": 60_000})
    consumer.assign([KafkaClientPartition("long-poll", 0, 0)])
    consumer.poll(1.0)                             # connected, its first fetch held

    def wait() -> None:
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())

    waiter = threading.Thread(target=wait)
    waiter.start()
    with Producer(data_dir) as producer:
        producer.send("long-poll", b"wake up")
        producer.flush(timeout=WAIT_S)
    waiter.join(WAIT_S + 5)
    consumer.close()
    # Well inside the 60 s the fetch asked to wait: the append answered it.
    assert got == [b"wake up"]


def test_an_out_of_range_offset_resets_as_the_client_asks(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("out-of-range", 1)
    with Producer(data_dir) as producer:
        for index in range(3):
            producer.send("out-of-range", b"%d" % index)
        producer.flush(timeout=WAIT_S)
    read = librdkafka_records(address, "out-of-range", 1, 3, start=1000,
                              **{"auto.offset.reset": "earliest"})
    assert [message.offset() for message in read] == [0, 1, 2]


def _ask(address: str, request, response_class):
    return ask_once(address, request, response_class, WAIT_S)


def _produce_raw(address: str, batch: bytes, partition: int = 0, topic: str = "raw"):
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=10_000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition,
                                                                 records=batch)])])
    return _ask(address, request, ProduceResponse).responses[0].partition_responses[0]


def _batch(producer_id: int, sequence: int, values: list[bytes], codec: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=0,
                                        base_sequence=sequence, batch_size=1 << 20)
    for index, value in enumerate(values):
        builder.append(index, timestamp=BASE_MS, key=None, value=value, headers=[])
    return bytes(builder.build())


def test_a_resent_batch_is_acknowledged_once_and_a_gap_is_refused(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("raw", 2)
    first = _produce_raw(address, _batch(77, 0, [b"a", b"b"]))
    again = _produce_raw(address, _batch(77, 0, [b"a", b"b"]))
    assert (first.error_code, first.base_offset) == (0, 0)
    assert (again.error_code, again.base_offset) == (0, 0)           # the same offset
    assert _produce_raw(address, _batch(77, 5, [b"c"])).error_code == 45  # OUT_OF_ORDER
    assert _produce_raw(address, _batch(77, 2, [b"c"])).base_offset == 2
    assert [record.value for record in shmlog_records(data_dir, "raw", 1, 3)] == \
        [b"a", b"b", b"c"]
    assert _produce_raw(address, _batch(-1, -1, [b"x"]), partition=9).error_code == 3
    assert _produce_raw(address, b"\x00" * 70).error_code == 87      # INVALID_RECORD


def test_every_request_in_flight_resent_is_acknowledged_with_its_first_offsets(kafka_broker):
    # What an idempotent client does after a reconnection: re-send the (up to five)
    # requests it had in flight, in order.
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("resent", 1)
    batches = [_batch(88, 3 * index, [b"%d-%d" % (index, n) for n in range(3)], codec=4)
               for index in range(5)]
    first = [_produce_raw(address, batch, topic="resent").base_offset for batch in batches]
    again = [_produce_raw(address, batch, topic="resent") for batch in batches]
    assert first == [0, 3, 6, 9, 12]
    assert [(answer.error_code, answer.base_offset) for answer in again] == \
        [(0, offset) for offset in first]
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "unused"})
    try:                                                # none appended twice
        assert consumer.get_watermark_offsets(KafkaClientPartition("resent", 0),
                                              timeout=WAIT_S) == (0, 15)
    finally:
        consumer.close()


def test_snappy_and_lz4_get_unsupported_compression_type(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("codecs", 1)
    producer = KafkaClientProducer({"bootstrap.servers": address, "compression.type": "snappy",
                                    "message.timeout.ms": 10_000})
    errors = []
    producer.produce("codecs", b"x" * 2000,
                     on_delivery=lambda error, message: errors.append(error))
    producer.flush(WAIT_S)
    assert [error.name() for error in errors] == ["UNSUPPORTED_COMPRESSION_TYPE"]
    # lz4 (librdkafka may send a small batch uncompressed): the codec bits set by hand.
    batch = bytearray(_batch(-1, -1, [b"y" * 100]))
    batch[22] |= 3
    batch[17:21] = crc32c(bytes(batch[21:])).to_bytes(4, "big")
    assert _produce_raw(address, bytes(batch), topic="codecs").error_code == 76


def test_init_producer_id_without_a_transactional_id_gives_a_new_producer(kafka_broker):
    _, address = kafka_broker
    # (A transactional id goes to the transaction coordinator:
    # test_kafka_transactions.py.)
    answers = [_ask(address, InitProducerIdRequest[4](
        transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1,
        producer_epoch=-1), InitProducerIdResponse) for _ in range(2)]
    assert [(answer.error_code, answer.producer_epoch) for answer in answers] == [(0, 0)] * 2
    assert 0 <= answers[0].producer_id < answers[1].producer_id


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_kafka_batches_of_a_megabyte_are_taken_though_they_grow_when_stored(kafka_broker,
                                                                           compression):
    # librdkafka fills batches up to max.message.bytes (1 MB); stored, 100-byte records
    # take ~20 % more: the broker stores such a batch in pieces, never refuses it.
    data_dir, address = kafka_broker
    topic = f"full-batches-{compression}"
    Admin(data_dir).create_topic(topic, 1)
    producer = KafkaClientProducer({"bootstrap.servers": address, "linger.ms": 100,
                                    "batch.size": 1_000_000, "enable.idempotence": True,
                                    "compression.type": compression})
    errors, delivered = [], []
    values = [bytes([index % 256]) + bytes(range(99)) for index in range(30_000)]
    for value in values:
        while True:
            try:
                producer.produce(topic, value, on_delivery=lambda error, message: (
                    errors if error else delivered).append(error or message.offset()))
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(WAIT_S) == 0
    assert errors == [] and sorted(delivered) == list(range(30_000))
    read = librdkafka_records(address, topic, 1, 30_000)
    assert [message.value() for message in read] == values


def test_a_resent_batch_stored_in_pieces_is_acknowledged_once(kafka_broker):
    # A batch whose stored form passes max.message.bytes is stored in pieces
    # (from_kafka); its re-send is matched on its first sequence and its last
    # piece's last, and acknowledged with its first offset, not appended again.
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("pieces", 1, config={"max.message.bytes": 4_000})
    values = [bytes([index]) * 300 for index in range(40)]
    batches = [_batch(91, 0, values), _batch(91, 40, [b"next"])]
    assert len(validate_batches(from_kafka(batches[0], 4_000))) >= 3      # stored in pieces
    first = [_produce_raw(address, batch, topic="pieces") for batch in batches]
    again = [_produce_raw(address, batch, topic="pieces") for batch in batches]
    assert [(answer.error_code, answer.base_offset) for answer in first + again] == \
        [(0, 0), (0, 40)] * 2
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "unused"})
    try:                                                # none appended twice
        assert consumer.get_watermark_offsets(KafkaClientPartition("pieces", 0),
                                              timeout=WAIT_S) == (0, 41)
    finally:
        consumer.close()
    assert [record.value for record in shmlog_records(data_dir, "pieces", 1, 41)] == \
        values + [b"next"]
