"""The Producer against a real broker: futures resolve to the offsets the records
got, keys land on Kafka's partitions, batches go through in one piece, a lone record
ships after linger.ms without a flush, bad input fails at the call, and a record
lands only in the topic it was sent to, even after that topic was deleted and its
row in the broker's state table was given to another, and a producer goes on after
the broker refused one of its batches (KIP-360).

Method: ``Broker`` runs the real broker as a child process on a temporary data
directory; the records are checked in the logs after the broker stopped.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time

import numpy as np
import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.client.admin import Admin
from shmlog.client.partitioner import partition_for_key
from shmlog.client.producer import Producer
from shmlog.common import limits
from shmlog.common.errors import (
    BrokerNotAvailableError,
    ClientClosedError,
    CorruptRingError,
    InvalidTopicError,
    LocalProtocolError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
)
from shmlog.record import batch_layout as B
from shmlog.server.broker import Broker, request, shared_memory_prefix
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory
from shmlog.shm.ring_layout import COMPLETION_SLOTS


@pytest.fixture
def data_dir(clean_data_dir):
    return clean_data_dir


def logged(data_dir, topic, partitions):
    with LogManager(data_dir) as logs:
        return {partition: all_records(logs.partition_log(topic, partition))
                for partition in range(partitions)}


def test_keyed_records_land_on_kafkas_partitions_with_their_offsets(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("events", 4)
        with Producer(data_dir, batch_size=512) as producer:
            futures = [producer.send("events", b"value-%d" % n, key=b"key-%d" % (n % 10))
                       for n in range(300)]
            metadata = [future.get(timeout=30) for future in futures]
    records = logged(data_dir, "events", 4)
    for number, meta in enumerate(metadata):
        assert meta.partition == partition_for_key(b"key-%d" % (number % 10), 4)
        record = records[meta.partition][meta.offset]
        assert (record.key, record.value) == (b"key-%d" % (number % 10), b"value-%d" % number)
    for partition_records in records.values():   # per-key order is kept
        for key in {r.key for r in partition_records}:
            values = [int(r.value.split(b"-")[1]) for r in partition_records if r.key == key]
            assert values == sorted(values)


def test_every_field_of_a_sent_record_arrives(data_dir):
    sent = [(b"k", b"v", [("trace", b"abc"), ("empty", b""), ("null", None)], 1_700_000_000_000),
            (None, bytearray(b"from a bytearray"), [], 1_600_000_000_000),
            (memoryview(b"mv-key"), None, None, 1_700_000_000_005),
            (b"", b"", [], -1)]
    with Broker(data_dir):
        Admin(data_dir).create_topic("fields")
        with Producer(data_dir) as producer:
            futures = [producer.send("fields", value, key=key, headers=headers, partition=0,
                                     timestamp_ms=timestamp)
                       for key, value, headers, timestamp in sent]
            offsets = [future.get(timeout=30).offset for future in futures]
    records = logged(data_dir, "fields", 1)[0]
    assert offsets == [0, 1, 2, 3]
    for record, (key, value, headers, timestamp) in zip(records, sent, strict=True):
        assert record.key == (None if key is None else bytes(key))
        assert record.value == (None if value is None else bytes(value))
        assert record.headers == list(headers or [])
        assert record.timestamp == timestamp


def test_a_refused_batch_leaves_no_gap_in_the_sequence(data_dir):
    """A batch refused at the call (too large) must not use up sequence numbers, or
    the broker would take the next batch for one sent after a lost one."""
    with Broker(data_dir):
        Admin(data_dir).create_topic("seq", 1, {"max.message.bytes": 4096})
        with Producer(data_dir) as producer:
            producer.send_batch("seq", [b"a" * 100] * 3, partition=0).get(timeout=30)
            with pytest.raises(RecordTooLargeError):
                producer.send_batch("seq", [b"b" * 100] * 100, partition=0)
            meta = producer.send_batch("seq", [b"c" * 100] * 3, partition=0).get(timeout=30)
    assert (meta.base_offset, meta.record_count) == (3, 3)
    assert [r.value[:1] for r in logged(data_dir, "seq", 1)[0]] == [b"a"] * 3 + [b"c"] * 3


def test_record_metadata_carries_the_brokers_time_on_a_log_append_time_topic(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("appended", 1, {"message.timestamp.type": "LogAppendTime"})
        Admin(data_dir).create_topic("created", 1)
        with Producer(data_dir) as producer:
            before = int(time.time() * 1000)
            stamped = producer.send("appended", b"x", timestamp_ms=1000).get(timeout=30)
            batch = producer.send_batch("appended", [b"y"], timestamp_ms=1000).get(timeout=30)
            created = producer.send("created", b"z", timestamp_ms=1000).get(timeout=30)
            after = int(time.time() * 1000)
    assert before <= stamped.timestamp <= after and before <= batch.timestamp <= after
    assert created.timestamp == 1000
    assert [r.timestamp for r in logged(data_dir, "appended", 1)[0]] == \
        [stamped.timestamp, batch.timestamp]


def test_send_batch_sends_one_numpy_batch(data_dir):
    rows = np.arange(1000 * 16, dtype=np.uint8).reshape(1000, 16)
    with Broker(data_dir):
        Admin(data_dir).create_topic("t", 2)
        with Producer(data_dir, compression="zstd") as producer:
            batch = producer.send_batch("t", rows, partition=1).get(timeout=30)
    assert (batch.partition, batch.base_offset, batch.record_count) == (1, 0, 1000)
    values = [r.value for r in logged(data_dir, "t", 2)[1]]
    assert values == [row.tobytes() for row in rows]


def test_a_lone_record_ships_after_linger_without_flush(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        producer = Producer(data_dir, linger_ms=20)
        try:
            future = producer.send("t", b"alone")
            assert producer._pending, "the record waits for company first"
            deadline = time.monotonic() + 30
            while producer._pending:                      # only the linger thread ships it
                assert time.monotonic() < deadline, "linger.ms never shipped the batch"
                time.sleep(0.005)
            assert future.get(timeout=30).offset == 0
        finally:
            producer.close()


def test_acks_0_returns_without_offsets_and_still_delivers(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, acks=0) as producer:
            assert producer.producer_id == -1, "idempotence needs acks, as in Kafka"
            futures = [producer.send("t", b"%d" % n, partition=0) for n in range(50)]
            producer.flush()
            assert {future.get(timeout=30).offset for future in futures} == {-1}
            # More batches than the ring has completion slots: the producer harvests
            # the completions to reuse them, and keeps none of the results.
            for n in range(50, 50 + 2 * COMPLETION_SLOTS + 1):
                producer.send("t", b"%d" % n, partition=0)
                producer.flush()
            assert producer.ring.results_held == 0
    total = 50 + 2 * COMPLETION_SLOTS + 1
    assert [r.value for r in logged(data_dir, "t", 1)[0]] == [b"%d" % n for n in range(total)]


def test_bad_input_fails_at_the_call(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("small", config={"max.message.bytes": 1000})
        with Producer(data_dir) as producer:
            with pytest.raises(UnknownTopicOrPartitionError, match="shmlog topics create"):
                producer.send("missing", b"x")
            with pytest.raises(UnknownTopicOrPartitionError):
                producer.send("small", b"x", partition=5)
            with pytest.raises(LocalProtocolError, match="must be bytes"):
                producer.send("small", "text")
            with pytest.raises(RecordTooLargeError):
                producer.send("small", b"x" * 2000)
            with pytest.raises(RecordTooLargeError):
                producer.send_batch("small", [b"x" * 600, b"y" * 600])
            assert producer.send("small", b"fine").get(timeout=30).offset == 0
        with pytest.raises(ClientClosedError, match="producer is closed"):
            producer.send("small", b"late")


def test_timestamps_beyond_what_a_batch_stores_are_refused_at_the_call(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        # Edge values of the settings are valid.
        with Producer(data_dir, linger_ms=0, batch_size=np.int64(0), max_block_ms=0,
                      acks="all", compression="zstd") as producer:
            for timestamp in (2**70, 2**63 - 1, -2, 1.5, True):
                with pytest.raises(LocalProtocolError, match="timestamp_ms must be an integer"):
                    producer.send("t", b"x", timestamp_ms=timestamp)
                with pytest.raises(LocalProtocolError, match="timestamp"):
                    producer.send_batch("t", [b"x"], timestamp_ms=timestamp)
            # The largest storable timestamp, after the smallest: their delta fits.
            producer.send("t", b"first", timestamp_ms=-1)
            assert producer.send("t", b"last", timestamp_ms=2**63 - 2).get(timeout=30).offset == 1
    assert [(r.value, r.timestamp) for r in logged(data_dir, "t", 1)[0]] == \
        [(b"first", -1), (b"last", 2**63 - 2)]


def test_batches_carry_the_producer_id_and_following_sequences(data_dir):
    from shmlog.record.records import iter_batches
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, batch_size=256) as first, Producer(data_dir) as second:
            for number in range(40):
                first.send("t", b"%03d" % number, partition=0)
            second.send("t", b"other", partition=0)
            first.flush()
            assert first.producer_id != second.producer_id
        with Producer(data_dir, enable_idempotence=False) as plain:
            plain.send("t", b"plain", partition=0).get(timeout=30)
    with LogManager(data_dir) as logs:
        partition_log = logs.partition_log("t", 0)
        batches = list(iter_batches(partition_log.read(0, max_bytes=1 << 20).data))
    mine = [b for b in batches if b.producer_id == first.producer_id]
    assert [b.base_sequence for b in mine] == \
        [sum(m.record_count for m in mine[:i]) for i in range(len(mine))]
    assert sum(b.record_count for b in mine) == 40
    assert batches[-1].producer_id == -1


def test_batches_stay_under_the_topics_size_limit(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("small", config={"segment.bytes": 4096})
        with Producer(data_dir, batch_size=1 << 20) as producer:
            futures = [producer.send("small", b"%04d" % number, partition=0)
                       for number in range(2000)]
            assert [future.get(timeout=30).offset for future in futures] == list(range(2000))


def test_a_send_to_a_deleted_topic_fails_and_never_lands_in_the_next_topic(data_dir):
    """The issue's scenario: b takes the row a had; the producer's route to a is stale."""
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("a")
        with Producer(data_dir) as producer:
            assert producer.send("a", b"to a").get(timeout=30).offset == 0
            row = admin.describe_topic("a")["partitions"][0]["row"]
            admin.delete_topic("a")
            admin.create_topic("b")
            assert admin.describe_topic("b")["partitions"][0]["row"] == row, "b took a's row"
            with pytest.raises(UnknownTopicOrPartitionError):
                producer.send("a", b"sent after a was deleted").get(timeout=30)
            with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic 'a'"):
                producer.send("a", b"the route was read again")
            assert producer.send("b", b"to b").get(timeout=30).offset == 0
    assert [r.value for r in logged(data_dir, "b", 1)[0]] == [b"to b"]


def test_a_send_to_a_recreated_topic_goes_to_the_new_one(data_dir):
    from shmlog.record.records import iter_batches
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("a")
        with Producer(data_dir) as producer:
            for number in range(3):
                producer.send("a", b"old %d" % number, partition=0).get(timeout=30)
            admin.delete_topic("a")
            admin.create_topic("a", 2)
            with pytest.raises(UnknownTopicOrPartitionError):
                producer.send("a", b"to the deleted a", partition=0).get(timeout=30)
            assert producer.partitions_for("a") == [0, 1]
            metadata = [producer.send("a", b"new %d" % number, partition=0).get(timeout=30)
                        for number in range(2)]
    assert [(m.topic, m.partition, m.offset) for m in metadata] == [("a", 0, 0), ("a", 0, 1)]
    assert [r.value for r in logged(data_dir, "a", 2)[0]] == [b"new 0", b"new 1"]
    with LogManager(data_dir) as logs:
        batches = list(iter_batches(logs.partition_log("a", 0).read(0, max_bytes=1 << 20).data))
    assert [b.base_sequence for b in batches] == [0, 1], "fresh sequences for the new topic"


def test_producing_to_the_offsets_topic_is_refused(data_dir):
    """Kafka: "Cannot append to internal topic"; only the broker writes commits."""
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        with Producer(data_dir) as producer:
            with pytest.raises(InvalidTopicError, match="internal topic"):
                producer.send("__consumer_offsets", b"forged", key=b"group")
            with pytest.raises(InvalidTopicError, match="internal topic"):
                producer.send_batch("__consumer_offsets", [b"forged"])
            assert producer.send("t", b"fine").get(timeout=30).offset == 0


def refuse_one_batch(admin, producer, acknowledged: list) -> None:
    """Lower max.message.bytes under the producer (its cached limit is the old one),
    so the broker refuses a batch of one record too large while small ones are in
    flight behind it; then raise it again. The refused batch fails with the broker's
    error (one record alone: nothing to split, KIP-126), the ones behind it are sent
    again and acknowledged, and the producer has read the new limit (it refuses the
    next large batch at the call)."""
    admin.alter_topic_config("t", set={"max.message.bytes": 4096})
    refused = producer.send_batch("t", [b"x" * 8000], partition=0)
    behind = [producer.send_batch("t", [b"behind-%d" % n, b"more"], partition=0)
              for n in range(3)]
    with pytest.raises(RecordTooLargeError):
        refused.get(timeout=30)
    for number, future in enumerate(behind):
        assert future.get(timeout=30).record_count == 2
        acknowledged += [b"behind-%d" % number, b"more"]
    with pytest.raises(RecordTooLargeError, match=r"max.message.bytes \(4096\)"):
        producer.send_batch("t", [b"x" * 1000] * 8, partition=0)      # the new limit, known
    admin.alter_topic_config("t", set={"max.message.bytes": 1 << 20})


def test_a_producer_goes_on_after_the_broker_refused_a_batch(data_dir, monkeypatch):
    import shmlog.common.limits
    from shmlog.record.records import iter_batches
    acknowledged = []
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("t")
        with Producer(data_dir) as producer:
            producer.send_batch("t", [b"first"], partition=0).get(timeout=30)
            acknowledged.append(b"first")
            refuse_one_batch(admin, producer, acknowledged)
            futures = [producer.send("t", b"after-%d" % number, partition=0)
                       for number in range(200)]
            for future in futures:
                future.get(timeout=30)
            acknowledged += [b"after-%d" % number for number in range(200)]
            # Once its metadata is old (metadata.max.age.ms), the raised limit is read.
            monkeypatch.setattr(shmlog.common.limits, "METADATA_MAX_AGE_S", 0.0)
            producer.send_batch("t", [b"y" * 1000] * 8, partition=0).get(timeout=30)
            acknowledged += [b"y" * 1000] * 8
    assert [r.value for r in logged(data_dir, "t", 1)[0]] == acknowledged
    with LogManager(data_dir) as logs:
        batches = list(iter_batches(logs.partition_log("t", 0).read(0, max_bytes=1 << 20).data))
    assert [(b.producer_epoch, b.base_sequence) for b in batches[:5]] == \
        [(0, 0), (1, 0), (1, 2), (1, 4), (1, 6)], "the kept-out batches, again under epoch 1"


def test_a_producer_takes_a_new_id_once_its_epochs_are_used_up(data_dir):
    acknowledged = []
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("t")
        with Producer(data_dir) as producer:
            producer.producer_epoch = B.PRODUCER_EPOCH_MAX      # as after 32767 refusals
            used_up = producer.producer_id
            producer.send_batch("t", [b"first"], partition=0).get(timeout=30)
            acknowledged.append(b"first")
            refuse_one_batch(admin, producer, acknowledged)
            assert (producer.producer_id != used_up, producer.producer_epoch) == (True, 0)
            producer.send("t", b"last", partition=0).get(timeout=30)
            acknowledged.append(b"last")
        with pytest.raises(LocalProtocolError, match="not registered"):
            request(data_dir, "init_producer_id", ring=producer.ring.name + "-other")
    assert [r.value for r in logged(data_dir, "t", 1)[0]] == acknowledged


def test_a_producer_whose_ring_was_poisoned_closes_and_fails_what_was_not_acknowledged(
        data_dir):
    """A buggy client moves its ring's tail past bytes that are no entry: the broker
    poisons the ring and reclaims it, and the producer's close() without a timeout
    returns (the test's own bound: a thread joined with a timeout), its batches not
    acknowledged failed with CorruptRingError; another producer is unaffected."""
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        other = Producer(data_dir)
        buggy = Producer(data_dir)
        assert buggy.send("t", b"before", partition=0).get(timeout=30).offset == 0
        name = buggy._sender.ring.name
        descriptor = os.open(f"/dev/shm/{name}", os.O_RDWR)
        try:
            with mmap.mmap(descriptor, R.HEAD_OFFSET) as header:
                words = np.frombuffer(header, np.int64)
                words[R.TAIL_WORD] += 64             # 64 bytes of zeros: no entry
                del words
        finally:
            os.close(descriptor)
        futures = [buggy.send("t", b"after %d" % n, partition=0) for n in range(5)]
        _closes_and_fails(buggy, futures, CorruptRingError, "stopped reading")
        assert other.send("t", b"other", partition=0).get(timeout=30).offset == 1
        other.close()
    assert [r.value for r in logged(data_dir, "t", 1)[0]] == [b"before", b"other"]


def _closes_and_fails(producer: Producer, futures: list, error: type, match: str) -> None:
    """``producer.close()`` without a timeout returns (bounded here by a thread's
    join), and each of ``futures`` failed with ``error``."""
    closing = threading.Thread(target=producer.close, daemon=True)
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive(), "close() without a timeout did not return within 60 s"
    for future in futures:
        with pytest.raises(error, match=match):
            future.get(timeout=0)


def test_a_producer_whose_broker_is_gone_closes_and_fails_what_was_not_acknowledged(
        data_dir, monkeypatch):
    """The broker is killed with batches in the ring: close() without a timeout waits
    limits.CLOSE_BROKER_WAIT_S for a broker to come back (shortened here), then fails
    them with BrokerNotAvailableError and returns."""
    monkeypatch.setattr(limits, "CLOSE_BROKER_WAIT_S", 2.0)
    broker = Broker(data_dir).start()
    try:
        Admin(data_dir).create_topic("t")
        producer = Producer(data_dir)
        assert producer.send("t", b"before", partition=0).get(timeout=30).offset == 0
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait(timeout=30)
        futures = [producer.send("t", b"after %d" % n, partition=0) for n in range(3)]
        _closes_and_fails(producer, futures, BrokerNotAvailableError, "not acknowledged")
    finally:
        broker.stop()
        for name in shared_memory.names(shared_memory_prefix(data_dir)):
            shared_memory.unlink(name)
