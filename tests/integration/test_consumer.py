"""The Consumer against a real broker and producer: every record once and in order
per partition, zero-copy columns, positions and seeks, offsets by time, iteration,
and clear errors.

Method: ``Broker`` runs the real broker as a child process; a ``Producer`` in this
process writes through its shared-memory ring; the consumer reads the segments
directly. Every wait is bounded.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import (
    Consumer,
    ConsumerRebalanceListener,
    OffsetAndTimestamp,
    TopicPartition,
)
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    ClientClosedError,
    LocalProtocolError,
    NotAssignedError,
    UnknownTopicOrPartitionError,
)
from shmlog.server.broker import Broker, shared_memory_prefix
from shmlog.shm import shared_memory

TIMEOUT_S = 30


@pytest.fixture
def broker(tmp_path):
    path = str(tmp_path / "data")
    with Broker(path):
        yield path
    for name in os.listdir("/dev/shm"):
        if name.startswith(shared_memory_prefix(path)):
            shared_memory.unlink(name)


def produce(data_dir, topic, count, **options):
    with Producer(data_dir, batch_size=2048) as producer:
        futures = [producer.send(topic, b"v%d" % n, key=b"k%d" % (n % 7), **options)
                   for n in range(count)]
        return [future.get(timeout=TIMEOUT_S) for future in futures]


def drain(consumer, count):
    records = []
    for _ in range(10_000):
        for batch in consumer.poll(timeout_ms=50).values():
            records += batch
        if len(records) >= count:
            break
    return records


def test_every_record_once_in_order_per_partition(broker):
    Admin(broker).create_topic("events", 3)
    sent = produce(broker, "events", 2000)
    with Consumer("events", bootstrap=broker, auto_offset_reset="earliest") as consumer:
        records = drain(consumer, 2000)
        assert consumer.poll(timeout_ms=20) == {}
    assert sorted(r.value for r in records) == sorted(b"v%d" % n for n in range(2000))
    by_partition = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record.offset)
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))
    assert {(m.partition, m.offset) for m in sent} == {(r.partition, r.offset) for r in records}


def test_poll_batch_gives_zero_copy_columns(broker):
    Admin(broker).create_topic("t")
    with Producer(broker) as producer:
        producer.send_batch("t", np.arange(4000, dtype=np.uint8).reshape(1000, 4),
                            partition=0).get(timeout=TIMEOUT_S)
    with Consumer("t", bootstrap=broker, auto_offset_reset="earliest") as consumer:
        columns = consumer.poll_batch(timeout_ms=5000)[TopicPartition("t", 0)]
    assert columns.offsets.tolist() == list(range(1000))
    assert columns.data.base is not None, "a view of the mapped segment, not a copy"
    assert columns.value(10) == bytes([40, 41, 42, 43])


def test_latest_is_the_default_and_seeks_move_the_position(broker):
    Admin(broker).create_topic("t")
    produce(broker, "t", 10, partition=0)
    partition = TopicPartition("t", 0)
    with Consumer("t", bootstrap=broker) as consumer:
        assert consumer.position(partition) == 10
        assert consumer.poll(timeout_ms=20) == {}
        produce(broker, "t", 5, partition=0)
        assert [r.offset for r in drain(consumer, 5)] == [10, 11, 12, 13, 14]
        consumer.seek(partition, 3)
        assert consumer.poll(max_records=2)[partition][0].offset == 3
        assert consumer.position(partition) == 5
        consumer.seek_to_beginning()
        assert consumer.position(partition) == 0
        consumer.seek_to_end(partition)
        assert consumer.position(partition) == 15
        assert consumer.end_offsets([partition]) == {partition: 15}
        assert consumer.beginning_offsets([partition]) == {partition: 0}


def test_offsets_for_times(broker):
    Admin(broker).create_topic("t")
    base = 1_900_000_000_000
    with Producer(broker) as producer:
        for number in range(10):
            producer.send("t", b"%d" % number, partition=0, timestamp_ms=base + 100 * number)
        producer.flush(timeout=TIMEOUT_S)
    with Consumer(bootstrap=broker) as consumer:
        found = consumer.offsets_for_times({("t", 0): base + 250})
        assert found == {TopicPartition("t", 0): OffsetAndTimestamp(3, base + 300)}
        assert consumer.offsets_for_times({("t", 0): base + 10_000}) == {("t", 0): None}


def test_iteration_stops_after_consumer_timeout(broker):
    Admin(broker).create_topic("t")
    produce(broker, "t", 20, partition=0)
    with Consumer("t", bootstrap=broker, auto_offset_reset="earliest",
                  consumer_timeout_ms=200) as consumer:
        assert [record.offset for record in consumer] == list(range(20))


def test_clear_errors(broker):
    with pytest.raises(LocalProtocolError, match="group_id"):
        Consumer(bootstrap=broker, group_id="")
    with pytest.raises(LocalProtocolError, match="partition_assignment_strategy"):
        Consumer(bootstrap=broker, group_id="g", partition_assignment_strategy=["sticky"])
    with pytest.raises(UnknownTopicOrPartitionError):
        Consumer("missing", bootstrap=broker)
    with pytest.raises(LocalProtocolError):
        Consumer(bootstrap=broker, auto_offset_reset="sometimes")


def test_polling_a_closed_consumer_says_it_is_closed(broker):
    Admin(broker).create_topic("t")
    produce(broker, "t", 3, partition=0)
    # Edge values of the settings are valid.
    consumer = Consumer("t", bootstrap=broker, auto_offset_reset="earliest",
                        max_poll_records=np.int64(1), fetch_max_bytes=1, consumer_timeout_ms=0)
    assert [r.offset for r in drain(consumer, 1)] == [0]
    consumer.close()
    consumer.close()                       # closing again does nothing
    for poll in (consumer.poll, consumer.poll_batch):
        with pytest.raises(ClientClosedError, match="consumer is closed"):
            poll(timeout_ms=0)
    with pytest.raises(ClientClosedError):
        next(consumer)


def test_a_position_deleted_by_retention_is_reset(tmp_path):
    data_dir = str(tmp_path / "retained")
    partition = TopicPartition("short", 0)
    try:
        with Broker(data_dir, retention_check_interval_ms=50):
            Admin(data_dir).create_topic("short", config={"segment.bytes": 4096})
            with Producer(data_dir) as producer:
                for number in range(300):            # the first half long expired
                    stamp = 1_000_000_000_000 + number if number < 150 else None
                    producer.send("short", b"%d" % number, partition=0, timestamp_ms=stamp)
                producer.flush(timeout=TIMEOUT_S)
            with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
                consumer.assign([partition])
                deadline = time.monotonic() + TIMEOUT_S
                while consumer.beginning_offsets([partition])[partition] <= 5:
                    assert time.monotonic() < deadline, "retention never ran"
                    time.sleep(0.05)
                start = consumer.beginning_offsets([partition])[partition]
                assert 5 < start <= 150
                consumer.seek(partition, 5)                  # below the log start now
                records = consumer.poll(timeout_ms=5000)[partition]
                assert records[0].offset == start, "reset to the earliest offset left"
                assert records[0].value == b"%d" % start
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith(shared_memory_prefix(data_dir)):
                shared_memory.unlink(name)


def test_poll_and_poll_batch_share_one_position(broker):
    """Mixing poll(max_records=...) and poll_batch returns every offset once, in
    order: poll_batch goes on from what poll buffered, not past it."""
    Admin(broker).create_topic("t")
    produce(broker, "t", 3000, partition=0)
    partition = TopicPartition("t", 0)
    offsets = []
    # A fetch takes one batch of ~2 KiB (about 200 records): poll buffers most of
    # it while later batches wait in the log.
    with Consumer("t", bootstrap=broker, auto_offset_reset="earliest",
                  fetch_max_bytes=1024) as consumer:
        for turn in range(10_000):
            if turn % 2:
                found = consumer.poll_batch(timeout_ms=50, max_bytes=1024).get(partition)
                offsets += found.offsets.tolist() if found is not None else []
            else:
                offsets += [record.offset for record in
                            consumer.poll(timeout_ms=50, max_records=7).get(partition, [])]
            if len(offsets) >= 3000:
                break
        assert consumer.position(partition) == 3000
    assert offsets == list(range(3000))


def test_a_topic_deleted_under_a_consumer_assigned_by_hand_is_unknown(broker):
    """The deleted topic's row goes to a new topic: the reader sees its row name
    another partition and poll raises UnknownTopicOrPartitionError (not a corrupt
    segment, never the new topic's records), losing nothing of the other partition."""
    admin = Admin(broker)
    admin.create_topic("a")
    admin.create_topic("c")
    produce(broker, "a", 10, partition=0)
    produce(broker, "c", 10, partition=0)
    a_0, c_0 = TopicPartition("a", 0), TopicPartition("c", 0)
    with Consumer(bootstrap=broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([a_0, c_0])
        assert sorted((r.topic, r.offset) for r in drain(consumer, 20)) == \
            sorted([("a", n) for n in range(10)] + [("c", n) for n in range(10)])
        row = admin.describe_topic("a")["partitions"][0]["row"]
        admin.delete_topic("a")
        assert admin.create_topic("b")["partitions"][0]["row"] == row, "the row is reused"
        produce(broker, "b", 5, partition=0)
        produce(broker, "c", 10, partition=0)
        for _ in range(3):
            with pytest.raises(UnknownTopicOrPartitionError,
                               match=r"topic was deleted and its state table row \d+ "
                                     r"was reused by another partition"):
                consumer.poll(timeout_ms=100)
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.end_offsets([a_0])             # not b-0's high watermark
        consumer.assign([c_0])
        assert [record.offset for record in drain(consumer, 10)] == list(range(10, 20))


def test_a_topic_deleted_under_a_consumer_assigned_by_hand_raises_from_poll_and_position(broker):
    """Assigned by hand, a deleted topic's partition is an error for the application
    from position (even with a position known) and poll, with a text saying the
    topic was deleted and its row is free (no other topic took it)."""
    admin = Admin(broker)
    admin.create_topic("a")
    admin.create_topic("c")
    produce(broker, "a", 10, partition=0)
    a_0, c_0 = TopicPartition("a", 0), TopicPartition("c", 0)
    with Consumer(bootstrap=broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([a_0, c_0])
        assert len(drain(consumer, 10)) == 10 and consumer.position(a_0) == 10
        admin.delete_topic("a")
        free = r"topic was deleted: its state table row \d+ is free now"
        with pytest.raises(UnknownTopicOrPartitionError, match=free):
            consumer.position(a_0)
        with pytest.raises(UnknownTopicOrPartitionError, match=free):
            consumer.poll(timeout_ms=100)
        assert consumer.assignment() == {a_0, c_0}, "by hand: the application drops it"
        produce(broker, "c", 5, partition=0)
        consumer.assign([c_0])
        assert [record.offset for record in drain(consumer, 5)] == list(range(5))


class _Lost(ConsumerRebalanceListener):
    def __init__(self):
        self.lost: set = set()

    def on_partitions_lost(self, lost):
        self.lost |= lost


def test_a_subscribed_topic_deleted_leaves_the_assignment_and_position_agrees(broker):
    """Subscribed through a group: once the topic is deleted, assignment() no longer
    lists its partition and position() says it is not assigned because its topic was
    deleted (NotAssignedError); the group's next generation leaves it out too, and
    the other topic is still consumed."""
    admin = Admin(broker)
    admin.create_topic("a")
    admin.create_topic("keep")
    a_0, keep_0 = TopicPartition("a", 0), TopicPartition("keep", 0)
    listener = _Lost()
    with Consumer(bootstrap=broker, group_id="g", auto_offset_reset="earliest",
                  heartbeat_interval_ms=200) as consumer:
        consumer.subscribe(["a", "keep"], listener=listener)
        deadline = time.monotonic() + TIMEOUT_S
        while consumer.assignment() != {a_0, keep_0} and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        assert consumer.assignment() == {a_0, keep_0}
        generation = consumer.group_metadata().generation_id
        admin.delete_topic("a")
        assert consumer.assignment() == {keep_0}
        with pytest.raises(NotAssignedError, match="left the assignment when its topic "
                                                   "was deleted"):
            consumer.position(a_0)
        assert listener.lost == {a_0}
        produce(broker, "keep", 5, partition=0)
        records = []
        while (len(records) < 5 or consumer.group_metadata().generation_id == generation) \
                and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=100).values():
                records += batch
        assert consumer.group_metadata().generation_id > generation, "the group rebalanced"
        assert consumer.assignment() == {keep_0}
        assert [(r.topic, r.offset) for r in records] == [("keep", n) for n in range(5)]
        with pytest.raises(NotAssignedError, match="deleted"):
            consumer.position(a_0)
        assert consumer.position(keep_0) == 5


def test_kafka_pythons_illegal_state_error_catches_a_position_not_assigned(broker):
    """kafka-python raises IllegalStateError from position() of a partition not
    assigned, and from a closed client: shmlog's two are that class."""
    from shmlog.kafka.errors import IllegalStateError
    Admin(broker).create_topic("t")
    consumer = Consumer(bootstrap=broker)
    with pytest.raises(IllegalStateError, match="not assigned to this consumer"):
        consumer.position(TopicPartition("t", 0))
    consumer.close()
    with pytest.raises(IllegalStateError, match="closed"):
        consumer.poll()
