"""A partition whose log holds a transaction's marker between records (written with
the log's own append before the broker starts: no API writes markers yet): every
reader returns the records around it and never the marker, and moves past it -
shmlog's poll, poll_batch and iteration, and librdkafka (confluent-kafka) through the
Kafka listener, which is handed Kafka's control bits and skips the batch itself.

Method: one broker process on a data directory prepared offline; every wait bounded.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import TopicPartition as KafkaClientPartition

from helpers import kafka_broker_process
from shmlog import Consumer, LogManager
from shmlog.client.consumer import TopicPartition
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.records import encode_batch

WAIT_S = 30.0
VALUES = [b"before-1", b"before-2", b"after"]


@pytest.fixture
def marked(data_dir):
    """(data directory, Kafka "host:port") of a broker serving topic "marked": two
    records of a transaction, its COMMIT marker (offset 2), one record (offset 3)."""
    with LogManager(data_dir) as logs:
        logs.create_topic("marked", 1)
        log = logs.partition_log("marked", 0)
        log.append(encode_batch(VALUES[:2], producer_id=11, producer_epoch=0, base_sequence=0,
                                transactional=True))
        log.append(encode_marker(EndTransactionMarker(11, 0, True, 0)))
        log.append(encode_batch(VALUES[2:]))
    with kafka_broker_process(data_dir) as broker:
        yield broker


def _reader(data_dir) -> Consumer:
    consumer = Consumer(bootstrap=data_dir, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("marked", 0)])
    return consumer


def test_poll_and_iteration_skip_the_marker(marked):
    data_dir, _ = marked
    with _reader(data_dir) as consumer:
        records = [record for batch in consumer.poll(timeout_ms=int(WAIT_S * 1000)).values()
                   for record in batch]
        assert [(record.offset, record.value) for record in records] == \
            [(0, VALUES[0]), (1, VALUES[1]), (3, VALUES[2])]
        assert consumer.position(TopicPartition("marked", 0)) == 4
    with Consumer("marked", bootstrap=data_dir, auto_offset_reset="earliest",
                  consumer_timeout_ms=2000) as consumer:
        assert [record.value for record in consumer] == VALUES


def test_poll_batch_columns_skip_the_marker(marked):
    data_dir, _ = marked
    with _reader(data_dir) as consumer:
        columns = consumer.poll_batch(timeout_ms=int(WAIT_S * 1000))[TopicPartition("marked", 0)]
        assert columns.offsets.tolist() == [0, 1, 3]


def test_librdkafka_reads_around_the_marker(marked):
    _, address = marked
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "marked",
                                    "auto.offset.reset": "earliest",
                                    "enable.auto.commit": False})
    try:
        consumer.assign([KafkaClientPartition("marked", 0, 0)])
        read, deadline = [], time.monotonic() + WAIT_S
        while len(read) < 3:
            assert time.monotonic() < deadline, f"read {read} in {WAIT_S} s"
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                read.append((message.offset(), message.value()))
        assert read == [(0, VALUES[0]), (1, VALUES[1]), (3, VALUES[2])]
        assert consumer.position([KafkaClientPartition("marked", 0)])[0].offset == 4
    finally:
        consumer.close()
