"""``format("shmlog")`` in a real local Spark against a real broker: batch reads
equal what was produced (every column, Kafka's schema), offsets and timestamps
bound them, planning splits large ranges, data lost to retention is governed by
failOnDataLoss, and batch writes round-trip.

Method: records are produced through ``Producer`` and compared with what Spark
returns; expectations come from the producer's acknowledgements (offsets,
partitions), never from shmlog's reading code.
"""

from __future__ import annotations

import datetime
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from shmlog import Admin, Producer
from shmlog.client.partitioner import partition_for_key
from shmlog.spark import SCHEMA, SCHEMA_WITH_HEADERS

TIMEOUT_S = 60


def produce(data_dir, topic, count, *, start=0, timestamp_ms=None, partition=None):
    """``count`` keyed records with headers on odd numbers; their (partition, offset)
    -> (key, value, headers, timestamp), from the acknowledgements."""
    sent = {}
    with Producer(data_dir, batch_size=4096) as producer:
        futures = []
        for number in range(start, start + count):
            headers = [("n", b"%d" % number), ("null", None)] if number % 2 else []
            stamp = timestamp_ms(number) if timestamp_ms else None
            futures.append((producer.send(topic, b"value-%d" % number,
                                          key=b"key-%d" % (number % 11), headers=headers,
                                          partition=partition, timestamp_ms=stamp),
                            (b"key-%d" % (number % 11), b"value-%d" % number, headers)))
        for future, (key, value, headers) in futures:
            meta = future.get(timeout=TIMEOUT_S)
            sent[(meta.partition, meta.offset)] = (key, value, headers, meta.timestamp)
    return sent


def read(spark, data_dir, **options):
    return spark.read.format("shmlog").options(bootstrap=data_dir, **options).load()


def by_position(rows):
    return {(row.partition, row.offset): row for row in rows}


def test_a_batch_read_of_every_partition_equals_what_was_produced(spark, broker):
    Admin(broker).create_topic("events", 3)
    sent = produce(broker, "events", 600)
    frame = read(spark, broker, subscribe="events", includeHeaders="true")
    assert frame.schema == SCHEMA_WITH_HEADERS
    rows = by_position(frame.collect())
    assert rows.keys() == sent.keys()
    for position, (key, value, headers, timestamp) in sent.items():
        row = rows[position]
        assert (row.key, row.value, row.topic, row.timestampType) == (key, value, "events", 0)
        assert [(h.key, h.value) for h in row.headers] == headers
        assert row.timestamp == datetime.datetime.fromtimestamp(
            timestamp / 1000, datetime.timezone.utc).replace(tzinfo=None)
    assert read(spark, broker, subscribe="events").schema == SCHEMA


def test_starting_and_ending_offsets_and_timestamps_bound_the_read(spark, broker):
    Admin(broker).create_topic("bounded", 2)
    base = int(time.time() * 1000) - 3_600_000      # within the default retention
    sent = produce(broker, "bounded", 200, partition=None,
                   timestamp_ms=lambda number: base + 1000 * number)
    ends = {partition: max(o for p, o in sent if p == partition) + 1 for partition in (0, 1)}

    frame = read(spark, broker, subscribe="bounded",
                 startingOffsets='{"bounded": {"0": 5, "1": -2}}',
                 endingOffsets='{"bounded": {"0": 20, "1": -1}}')
    positions = set(by_position(frame.collect()))
    assert positions == {(0, o) for o in range(5, 20)} | {(1, o) for o in range(ends[1])}

    middle = base + 1000 * 100
    frame = read(spark, broker, subscribe="bounded", startingTimestamp=str(middle),
                 endingTimestamp=str(middle + 1000 * 50))
    got = {(row.partition, row.offset) for row in frame.collect()}
    assert got == {position for position, (*_, stamp) in sent.items()
                   if middle <= stamp < middle + 1000 * 50}

    with pytest.raises(PySparkException, match="startingOffsetsByTimestampStrategy"):
        read(spark, broker, subscribe="bounded",
             startingTimestamp=str(base + 10**9)).collect()
    assert read(spark, broker, subscribe="bounded", startingTimestamp=str(base + 10**9),
                startingOffsetsByTimestampStrategy="latest").count() == 0


def test_large_ranges_and_min_partitions_split_the_plan(spark, broker):
    Admin(broker).create_topic("split", 2)
    sent = produce(broker, "split", 1000)
    whole = read(spark, broker, subscribe="split")
    assert whole.rdd.getNumPartitions() == 2, "one Spark partition per log partition"
    pieces = read(spark, broker, subscribe="split", maxRecordsPerPartition="100")
    assert pieces.rdd.getNumPartitions() >= 10
    assert set(by_position(pieces.collect())) == set(sent)
    wider = read(spark, broker, subscribe="split", minPartitions="7")
    assert wider.rdd.getNumPartitions() >= 7
    assert sorted(by_position(wider.collect())) == sorted(sent)


def test_subscribe_pattern_and_assign_choose_the_partitions(spark, broker):
    for name in ("logs-a", "logs-b", "other"):
        Admin(broker).create_topic(name, 2)
        produce(broker, name, 20)
    topics = {row.topic for row in read(spark, broker, subscribePattern="logs-.*").collect()}
    assert topics == {"logs-a", "logs-b"}
    rows = read(spark, broker, assign='{"other": [1]}').collect()
    assert rows and {(row.topic, row.partition) for row in rows} == {("other", 1)}


def test_bad_options_are_clear_errors(spark, broker):
    Admin(broker).create_topic("known", 1)
    for options, message in (({}, "exactly one of"),
                             ({"subscribe": "nope"}, "unknown topics"),
                             ({"subscribe": "known", "startingOffsets": "{bad"}, "JSON"),
                             ({"subscribe": "known", "minPartitions": "x"}, "integer")):
        with pytest.raises(PySparkException, match=message):
            read(spark, broker, **options).collect()


def test_records_deleted_by_retention_fail_the_read_unless_failondataloss_is_false(
        spark, broker):
    Admin(broker).create_topic("short", 1, {"segment.bytes": 4096, "retention.bytes": 8192})
    produce(broker, "short", 400, partition=0)
    deadline = time.monotonic() + TIMEOUT_S
    # Until retention deleted a segment. This look may race the deletion itself (its
    # range planned from offset 0, the segment gone before it is read): it skips.
    while read(spark, broker, subscribe="short",
               failOnDataLoss="false").agg(F.min("offset")).first()[0] == 0:
        assert time.monotonic() < deadline, "retention never deleted a segment"
        time.sleep(0.2)
    frame = read(spark, broker, subscribe="short", startingOffsets='{"short": {"0": 0}}')
    with pytest.raises(PySparkException, match="failOnDataLoss"):
        frame.collect()
    rows = read(spark, broker, subscribe="short", startingOffsets='{"short": {"0": 0}}',
                failOnDataLoss="false").collect()
    offsets = sorted(row.offset for row in rows)
    assert offsets == list(range(offsets[0], 400)) and offsets[0] > 0


def test_a_batch_write_round_trips(spark, broker):
    Admin(broker).create_topic("out", 2)
    frame = spark.createDataFrame(
        [(f"key-{n % 5}", f"value-{n}", n % 2, [("h", b"%d" % n)]) for n in range(300)],
        "key string, value string, partition int, headers array<struct<key:string,value:binary>>")
    frame.write.format("shmlog").mode("append").option("bootstrap", broker) \
        .option("topic", "out").save()
    rows = read(spark, broker, subscribe="out", includeHeaders="true").collect()
    assert sorted((row.value, row.key, row.partition, [(h.key, h.value) for h in row.headers])
                  for row in rows) == sorted(
        (b"value-%d" % n, b"key-%d" % (n % 5), n % 2, [("h", b"%d" % n)]) for n in range(300))
    with pytest.raises(PySparkException, match="topic"):
        spark.createDataFrame([("v",)], "value string").write.format("shmlog") \
            .mode("append").option("bootstrap", broker).save()


def test_written_rows_go_where_kafka_would_put_them_in_batches_the_topic_takes(spark, broker):
    Admin(broker).create_topic("keyed", 3, {"max.message.bytes": 16384})
    rows = [(f"key-{n % 17}" if n % 4 else None, "x" * 1000 + str(n)) for n in range(2000)]
    spark.createDataFrame(rows, "key string, value string").write.format("shmlog") \
        .mode("append").option("bootstrap", broker).option("topic", "keyed").save()
    written = read(spark, broker, subscribe="keyed").collect()
    assert sorted(row.value for row in written) == sorted(value.encode() for _, value in rows)
    for row in written:
        if row.key is not None:
            assert row.partition == partition_for_key(row.key, 3), "Kafka's key partitioner"
    assert len({row.partition for row in written if row.key is None}) > 1, \
        "unkeyed rows move on between batches"
