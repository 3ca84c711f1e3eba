"""The records ``Consumer.poll`` and iteration hand out: the reference decoder's, field
for field, for every shape a log holds; made only for what is returned; and the
buffered-but-unreturned records kept exactly as the positions, commits, pauses and
``poll_batch`` expect. Also: nothing the consumer does compiles a kernel after it is
made (its cold start is paid at construction).

Method: one real broker process (``Broker``) for the module, with one topic per
shape: keys and values null, empty or set, headers with null values, zstd batches,
LogAppendTime, and a compacted topic whose offsets have gaps (the cleaner runs every
100 ms). The expected records are ``tests/reference.py``'s ``reference_decode`` of
the partition's segment files, read independently of shmlog. Every wait is bounded.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import random
import struct
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests/reference.py
from helpers import unlink_shared_memory  # noqa: E402
from reference import CODEC_ZSTD, reference_decode  # noqa: E402
from shmlog.client.admin import Admin  # noqa: E402
from shmlog.client.consumer import Consumer, ConsumerRecord, TopicPartition  # noqa: E402
from shmlog.client.producer import Producer  # noqa: E402
from shmlog.server.broker import Broker  # noqa: E402

WAIT_S = 60
CREATE_TIME, LOG_APPEND_TIME = 0, 1
SHAPES = ["plain", "zstd", "appended", "compacted"]
BATCH_LENGTH = struct.Struct("<I")
BULK_RECORDS = 5000
ATTRIBUTES_POSITION = 24     # restated from the diagram in batch_layout.py
CODEC_MASK = 0x07


def shaped_batch(seed: int, count: int):
    """Values, keys and headers cycling through every combination of null, empty
    and set (and header values null, empty and set)."""
    values = [None if n % 5 == 1 else b"" if n % 5 == 2 else b"v%d-%d" % (seed, n) * (n % 4 + 1)
              for n in range(count)]
    keys = [None if n % 3 == 1 else b"" if n % 3 == 2 else b"k%d" % (n % 11)
            for n in range(count)]
    headers = [[] if n % 4 == 0 else [("a", None)] if n % 4 == 1 else
               [("h", b"x%d" % n), ("empty", b""), ("nul", None)] if n % 4 == 2 else
               [("\u00e9t\u00e9", b"%d" % seed)] for n in range(count)]
    return values, keys, headers


def produce_shapes(data_dir: str, topic: str, compression=None) -> None:
    with Producer(data_dir, compression=compression) as producer:
        for seed in range(6):
            values, keys, headers = shaped_batch(seed, 40 + seed)
            producer.send_batch(topic, values, keys, partition=0, headers=headers)
        producer.flush()


def produce_compacted(data_dir: str) -> None:
    # Random keys: the last record of each lies anywhere, so the cleaned log has gaps.
    keys = random.Random(7)
    with Producer(data_dir) as producer:
        for seed in range(30):
            producer.send_batch("compacted", [b"c%d-%d" % (seed, n) * 8 for n in range(60)],
                                [b"k%d" % keys.randrange(20) for n in range(60)], partition=0,
                                headers=[[("s", b"%d" % seed)] if n % 2 else [] for n in range(60)])
        producer.flush()


def log_records(data_dir: str, topic: str, partition: int = 0) -> list:
    """The reference decoding of a partition's segment files, in offset order."""
    directory = Admin(data_dir).describe_topic(topic)["partitions"][partition]["directory"]
    records = []
    for name in sorted(name for name in os.listdir(directory) if name.endswith(".log")):
        data = pathlib.Path(directory, name).read_bytes()
        end = 0
        while end + BATCH_LENGTH.size <= len(data):
            length = BATCH_LENGTH.unpack_from(data, end)[0]
            if length == 0 or end + length > len(data):
                break                            # preallocated zeros: the end of the log
            end += length
        records += reference_decode(data[:end])
    return records


def wait_for_compaction(data_dir: str) -> list:
    """The compacted topic's records once the cleaner has removed superseded ones
    and the log stays the same for a second."""
    deadline = time.monotonic() + WAIT_S
    previous = None
    while time.monotonic() < deadline:
        records = log_records(data_dir, "compacted")
        if len(records) < 30 * 60 and records == previous:
            return records
        previous = records
        time.sleep(1)
    raise AssertionError("the cleaner did not compact the topic in time")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("consumer-records") / "data")
    with Broker(path, cleaner_backoff_ms=100):
        admin = Admin(path)
        admin.create_topic("plain")
        admin.create_topic("zstd")
        admin.create_topic("appended", config={"message.timestamp.type": "LogAppendTime"})
        admin.create_topic("compacted", config={
            "cleanup.policy": "compact", "segment.bytes": 16384,
            "min.cleanable.dirty.ratio": 0.1})
        admin.create_topic("spread", 3)
        admin.create_topic("bulk")
        produce_shapes(path, "plain")
        produce_shapes(path, "zstd", compression="zstd")
        produce_shapes(path, "appended")
        produce_compacted(path)
        with Producer(path) as producer:
            for partition in range(3):
                producer.send_batch("spread", [b"s%d" % n for n in range(10)],
                                    partition=partition)
            for seed in range(BULK_RECORDS // 1000):
                producer.send_batch("bulk", [b"%099d" % (seed * 1000 + n) for n in range(1000)],
                                    partition=0)
        expected = {topic: log_records(path, topic) for topic in ("plain", "zstd", "appended")}
        expected["compacted"] = wait_for_compaction(path)
        yield path, expected
    unlink_shared_memory(path)


def as_reference(records: list) -> list:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


def check_records(records: list, topic: str, expected: list) -> None:
    assert as_reference(records) == expected
    timestamp_type = LOG_APPEND_TIME if topic == "appended" else CREATE_TIME
    assert {(r.topic, r.partition, r.timestamp_type) for r in records} == \
        {(topic, 0, timestamp_type)}
    assert all(type(r) is ConsumerRecord for r in records)


def test_the_shapes_are_all_there(broker):
    """The fixture's logs hold what the other tests claim to cover."""
    _, expected = broker
    plain = expected["plain"]
    assert {row[2] is None for row in plain} == {row[3] is None for row in plain} == {True, False}
    assert b"" in {row[2] for row in plain} and b"" in {row[3] for row in plain}
    assert any(value is None for row in plain for _, value in row[4])
    offsets = [row[0] for row in expected["compacted"]]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets))), "no gaps"
    assert [row[2:] for row in expected["zstd"]] == [row[2:] for row in plain]
    assert zstd_batches(broker[0], "zstd") == 6 and zstd_batches(broker[0], "plain") == 0


def zstd_batches(data_dir: str, topic: str) -> int:
    directory = Admin(data_dir).describe_topic(topic)["partitions"][0]["directory"]
    found = 0
    for name in os.listdir(directory):
        if name.endswith(".log"):
            data = pathlib.Path(directory, name).read_bytes()
            position = 0
            while position + ATTRIBUTES_POSITION + 2 <= len(data):
                length = BATCH_LENGTH.unpack_from(data, position)[0]
                if length == 0:
                    break
                attributes = struct.unpack_from("<H", data, position + ATTRIBUTES_POSITION)[0]
                found += (attributes & CODEC_MASK) == CODEC_ZSTD
                position += length
    return found


@pytest.mark.parametrize("topic", SHAPES)
@pytest.mark.parametrize("max_records", [1, 7, 500])
def test_poll_returns_the_reference_records(broker, topic, max_records):
    path, expected = broker
    records = []
    with Consumer(topic, bootstrap=path, auto_offset_reset="earliest") as consumer:
        deadline = time.monotonic() + WAIT_S
        while len(records) < len(expected[topic]) and time.monotonic() < deadline:
            for found in consumer.poll(timeout_ms=100, max_records=max_records).values():
                assert len(found) <= max_records
                records += found
        assert consumer.poll(timeout_ms=50) == {}
    check_records(records, topic, expected[topic])


@pytest.mark.parametrize("topic", SHAPES)
@pytest.mark.parametrize("max_poll_records", [1, 5, 500])
def test_iteration_returns_the_reference_records(broker, topic, max_poll_records):
    path, expected = broker
    with Consumer(topic, bootstrap=path, auto_offset_reset="earliest",
                  max_poll_records=max_poll_records, consumer_timeout_ms=1000) as consumer:
        records = list(consumer)
        assert list(consumer) == [], "a second run after the timeout finds nothing new"
    check_records(records, topic, expected[topic])


def test_poll_makes_records_only_for_what_it_returns(broker):
    """A fetch of 246 records, a poll of 5: only those 5 exist as objects (the rest
    stay columns); iteration likewise makes only max_poll_records at a time."""
    path, expected = broker
    # Counted from what lives already: in a whole run, an earlier test's objects may
    # still hold records of their own.
    before = live_consumer_records()
    with Consumer("plain", bootstrap=path, auto_offset_reset="earliest",
                  max_poll_records=10, consumer_timeout_ms=5000) as consumer:
        found = consumer.poll(timeout_ms=5000, max_records=5)
        assert [len(records) for records in found.values()] == [5]
        assert live_consumer_records() - before == 5
        del found
        first = next(consumer)
        assert first.offset == 5
        assert live_consumer_records() - before <= 10
        assert consumer.position(TopicPartition("plain", 0)) == 6
    assert len(expected["plain"]) > 100


def live_consumer_records() -> int:
    gc.collect()
    return sum(1 for thing in gc.get_objects() if type(thing) is ConsumerRecord)


def test_iteration_starts_no_garbage_collection(broker):
    """Iteration makes few enough records at a time that, with the previous ones
    freed, the collector's youngest generation stays below its threshold: looping
    over thousands of records starts no collection (each would walk the live
    records and age them toward full collections of the whole heap)."""
    path, _ = broker
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    with Consumer(bootstrap=path, auto_offset_reset="earliest",
                  consumer_timeout_ms=1000) as consumer:
        consumer.assign([TopicPartition("bulk", 0)])
        consumer.poll_batch(timeout_ms=5000, max_bytes=1)        # the first fetch's setup
        consumer.seek(TopicPartition("bulk", 0), 0)
        seen = size = 0
        gc.collect()
        gc.callbacks.append(count)
        try:
            for record in consumer:
                seen += 1
                size += len(record.value)
                if seen == BULK_RECORDS:
                    break
        finally:
            gc.callbacks.remove(count)
    assert (seen, size) == (BULK_RECORDS, 99 * BULK_RECORDS)
    assert collections == []


def test_max_records_spans_partitions(broker):
    """One fetch finds all three partitions; polls hand out at most max_records in
    all, taking from the next partition where one ends, every record once."""
    path, _ = broker
    seen = []
    with Consumer("spread", bootstrap=path, auto_offset_reset="earliest") as consumer:
        first = consumer.poll(timeout_ms=5000, max_records=25)
        while sum(map(len, first.values())) < 25:     # a partition fetched later
            for partition, records in consumer.poll(timeout_ms=100, max_records=25 - sum(
                    map(len, first.values()))).items():
                first.setdefault(partition, []).extend(records)
        assert sum(map(len, first.values())) == 25
        seen += [r for records in first.values() for r in records]
        deadline = time.monotonic() + WAIT_S
        while len(seen) < 30 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100, max_records=25).values():
                seen += records
    by_partition = {}
    for record in seen:
        by_partition.setdefault(record.partition, []).append((record.offset, record.value))
    assert by_partition == {partition: [(n, b"s%d" % n) for n in range(10)]
                            for partition in range(3)}


def test_poll_then_poll_batch_then_poll_go_on_from_one_position(broker):
    path, expected = broker
    partition = TopicPartition("plain", 0)
    offsets = [row[0] for row in expected["plain"]]
    with Consumer(bootstrap=path, auto_offset_reset="earliest") as consumer:
        consumer.assign([partition])
        got = [r.offset for r in consumer.poll(timeout_ms=5000, max_records=7)[partition]]
        assert got == offsets[:7]
        columns = consumer.poll_batch(timeout_ms=5000, max_bytes=1)[partition]
        got += columns.offsets.tolist()
        assert got == offsets[:len(got)] and len(got) < len(offsets)
        got += [r.offset for r in consumer.poll(timeout_ms=5000, max_records=3)[partition]]
        iterated = iter(consumer)
        got += [next(iterated).offset for _ in range(4)]
        got += consumer.poll_batch(timeout_ms=5000, max_bytes=1)[partition].offsets.tolist()
        got += [next(consumer).offset]
        assert got == offsets[:len(got)]
        assert consumer.position(partition) == offsets[len(got)]


def test_commit_after_iterating_k_records_commits_offset_k(broker):
    """What iteration made but has not handed out is not committed, and comes next."""
    path, expected = broker
    partition = TopicPartition("plain", 0)
    offsets = [row[0] for row in expected["plain"]]
    with Consumer(bootstrap=path, group_id="iterating", auto_offset_reset="earliest",
                  consumer_timeout_ms=5000) as consumer:
        consumer.assign([partition])
        got = []
        for record in consumer:
            got.append(record.offset)
            if len(got) == 13:
                break
        consumer.commit()
        assert consumer.committed(partition) == 13
        assert consumer.position(partition) == 13
        got += [r.offset for r in consumer.poll(max_records=5)[partition]]
        for record in consumer:
            got.append(record.offset)
            if len(got) == 20:
                break
        consumer.commit()
        assert consumer.committed(partition) == 20
        got.append(next(consumer).offset)
        consumer.seek(partition, 2)
        got.append(next(consumer).offset)
        consumer.commit()
        assert consumer.committed(partition) == 3
    assert got == offsets[:21] + [2]


def test_pause_keeps_buffered_records_until_resume(broker):
    """Records buffered for a paused partition (by poll or by iteration) are not
    handed out while it is paused, nor dropped: they come first after resume."""
    path, _ = broker
    partitions = [TopicPartition("spread", n) for n in range(3)]
    with Consumer(bootstrap=path, auto_offset_reset="earliest",
                  consumer_timeout_ms=2000) as consumer:
        consumer.assign(partitions)
        found = consumer.poll(timeout_ms=5000, max_records=2)
        (paused, records), = found.items()
        assert [r.offset for r in records] == [0, 1]
        consumer.pause(paused)
        others = []
        for record in consumer:
            assert record.partition != paused.partition
            others.append(record)
        assert len(others) == 20
        assert consumer.position(paused) == 2
        consumer.resume(paused)
        assert [r.offset for r in next(iter(consumer.poll(max_records=3).values()))] == [2, 3, 4]
        assert next(consumer).offset == 5
        consumer.pause(paused)                 # iteration had made 6..9: not handed out
        assert consumer.position(paused) == 6
        assert consumer.poll(timeout_ms=50) == {}
        consumer.resume(paused)
        assert [r.offset for r in consumer] == [6, 7, 8, 9]


# Run in a fresh process: every numba dispatcher of shmlog right after the Consumer
# is made, and the signatures its work added since.
COLD_START = r"""
import json, sys
import numba
from shmlog.client.consumer import Consumer, TopicPartition

def signatures():
    return {f"{name}.{attribute}": len(value.signatures)
            for name, module in list(sys.modules.items()) if name.startswith("shmlog")
            for attribute, value in list(vars(module).items())
            if isinstance(value, numba.core.registry.CPUDispatcher)}

data_dir, group_id = sys.argv[1], sys.argv[2] or None
topics = ["plain", "zstd", "appended", "compacted"]
consumer = Consumer(bootstrap=data_dir, group_id=group_id, auto_offset_reset="earliest",
                    consumer_timeout_ms=3000, session_timeout_ms=10_000,
                    heartbeat_interval_ms=200)
before = signatures()
if group_id:
    consumer.subscribe(topics)
else:
    consumer.assign([TopicPartition(topic, 0) for topic in topics])
count = sum(map(len, consumer.poll(timeout_ms=10_000, max_records=3).values()))
count += sum(map(len, consumer.poll_batch(timeout_ms=1000, max_bytes=1).values()))
count += sum(1 for _ in zip(range(50), consumer))
if group_id:
    consumer.commit()
count += sum(1 for _ in consumer)
count += sum(map(len, consumer.poll_batch(timeout_ms=100).values()))
if group_id:
    consumer.commit()
after = signatures()
consumer.close()
compiled = sorted(name for name, n in after.items() if n > before.get(name, 0))
print(json.dumps({"records": count, "kernels": len(before), "compiled": compiled}))
"""


@pytest.mark.parametrize("group_id", ["", "cold-start"])
def test_nothing_compiles_after_the_consumer_is_made(broker, group_id):
    """Poll, poll_batch, iteration and commits over every shape of record (zstd
    batches, headers, nulls, compaction gaps), with and without a group, load no
    kernel: the constructor did (a compile in a poll holds the GIL for seconds)."""
    path, expected = broker
    found = subprocess.run([sys.executable, "-c", COLD_START, path, group_id],
                           capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert result["kernels"] > 10, "the walk found shmlog's kernels"
    assert result["records"] == sum(len(expected[topic]) for topic in SHAPES)
    assert result["compiled"] == [], f"loaded after the consumer was made: {result}"
