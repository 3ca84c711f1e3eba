"""Compaction in a running broker: the cleaner thread cleans a compacted topic
while a producer appends and consumers read. Readers never see a broken view (every
record read is the one produced at its offset, offsets only grow), and a read from
the beginning ends with the final value of every key.

Method: a real broker process with a 100 ms cleaner backoff and small segments; one
producer, one partition, so a record's offset equals its sequence number, which its
value carries. Every wait is bounded."""

from __future__ import annotations

import random
import threading
import time

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.server.broker import Broker

KEYS = 50
RECORDS = 30_000
PARTITION = TopicPartition("table", 0)
DEADLINE_S = 120


@pytest.fixture
def data_dir(tmp_path):
    path = str(tmp_path / "data")
    with Broker(path, cleaner_backoff_ms=100):
        Admin(path).create_topic("table", partitions=1, config={
            "cleanup.policy": "compact", "segment.bytes": 32768,
            "min.cleanable.dirty.ratio": 0.1})
        yield path
    unlink_shared_memory(path)


def read_all(consumer: Consumer, end: int) -> list:
    consumer.seek_to_beginning(PARTITION)
    records = []
    deadline = time.monotonic() + DEADLINE_S
    while consumer.position(PARTITION) < end and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200, max_records=5000).get(PARTITION, [])
    return records


def check_view(records: list) -> None:
    offsets = [record.offset for record in records]
    assert offsets == sorted(set(offsets)), "offsets only grow"
    for record in records:
        key, sequence = record.value.split(b":")
        assert int(sequence) == record.offset and record.key == key, record


def test_readers_see_a_consistent_log_while_the_cleaner_works(data_dir):
    rng = random.Random(1)
    keys = [f"k{rng.randrange(KEYS)}".encode() for _ in range(RECORDS)]
    failures = []
    stop = threading.Event()

    def keep_reading():
        """Reads from the beginning again and again, through cleanings."""
        try:
            with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as reader:
                reader.assign([PARTITION])
                while not stop.is_set():
                    end = reader.end_offsets([PARTITION])[PARTITION]
                    check_view(read_all(reader, end))
        except Exception as error:            # noqa: BLE001 - reported below
            failures.append(error)

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        with Producer(data_dir) as producer:
            for sequence, key in enumerate(keys):
                producer.send("table", key + b":" + str(sequence).encode(), key=key, partition=0)
            producer.flush(timeout=60)
        last = {key: sequence for sequence, key in enumerate(keys)}
        with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            consumer.assign([PARTITION])
            deadline = time.monotonic() + DEADLINE_S
            while True:
                records = read_all(consumer, RECORDS)
                check_view(records)
                if len(records) < RECORDS // 4 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert len(records) < RECORDS // 4, "the cleaner removed superseded records"
            seen = {record.key: record.offset for record in records}
            assert seen == last, "the final value of every key is there"
            assert len(records) - len(set(record.key for record in records)) < RECORDS // 4
    finally:
        stop.set()
        reader.join(timeout=DEADLINE_S)
    assert not reader.is_alive()
    assert not failures, failures
