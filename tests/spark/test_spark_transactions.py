"""Transactions and Spark: the source in read_committed (``kafka.isolation.level``)
leaves an aborted transaction's records out and stops at an open transaction's last
stable offset, through ``format("shmlog")`` (batch and streaming) and the JVM bulk
reader; the streaming sink writes each input exactly once across a query stopped
mid-batch and restarted from its checkpoint, and across a micro-batch Spark runs
again after its sink commit; the driver's recovery of a decided micro-batch commits
the decided transactions and aborts the re-run's.

Method: transactions are made by hand with the transactional Producer; the sink's
output is read back read_committed and compared, as a multiset, with the input.
Every wait is bounded.
"""

from __future__ import annotations

import collections
import os
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from shmlog import Admin, Consumer, Producer, TopicPartition
from shmlog.common.errors import LocalProtocolError
from shmlog.protocol.control_client import request
from shmlog.spark import bulk_read
from shmlog.spark import sink_transactions as T

TIMEOUT_S = 120


def rows_of(frame):
    return sorted((row.offset, bytes(row.value)) for row in frame.collect())


def make_transactions(data_dir):
    """One partition: plain a b, committed c d, aborted e f, plain g, then h in a
    transaction left open, and plain i. Returns the open producer (commit it later)."""
    Admin(data_dir).create_topic("txn", 1)
    with Producer(data_dir, linger_ms=0) as plain:
        for value in (b"a", b"b"):
            plain.send("txn", value, partition=0).get(timeout=TIMEOUT_S)
        with Producer(data_dir, transactional_id="t-commit") as committing:
            committing.init_transactions()
            committing.begin_transaction()
            committing.send("txn", b"c", partition=0)
            committing.send("txn", b"d", partition=0)
            committing.commit_transaction()
        with Producer(data_dir, transactional_id="t-abort") as aborting:
            aborting.init_transactions()
            aborting.begin_transaction()
            aborting.send("txn", b"e", partition=0)
            aborting.send("txn", b"f", partition=0)
            aborting.flush()
            aborting.abort_transaction()
        plain.send("txn", b"g", partition=0).get(timeout=TIMEOUT_S)
        open_one = Producer(data_dir, transactional_id="t-open")
        open_one.init_transactions()
        open_one.begin_transaction()
        open_one.send("txn", b"h", partition=0)
        open_one.flush()
        plain.send("txn", b"i", partition=0).get(timeout=TIMEOUT_S)
    return open_one


def test_read_committed_leaves_aborted_out_and_stops_at_an_open_transaction(spark, broker):
    open_one = make_transactions(broker)
    try:
        committed = {"bootstrap": broker, "subscribe": "txn",
                     "kafka.isolation.level": "read_committed"}
        values = lambda rows: [value for _, value in rows]          # noqa: E731
        for frame in (spark.read.format("shmlog").options(**committed).load(),
                      bulk_read(spark, **committed)):
            assert values(rows_of(frame)) == [b"a", b"b", b"c", b"d", b"g"]
        for frame in (spark.read.format("shmlog").options(bootstrap=broker,
                                                          subscribe="txn").load(),
                      bulk_read(spark, bootstrap=broker, subscribe="txn")):
            assert values(rows_of(frame)) == [b"a", b"b", b"c", b"d", b"e", b"f", b"g",
                                              b"h", b"i"]
        # A stream in read_committed stops at the open transaction too, then goes on.
        query = (spark.readStream.format("shmlog")
                 .options(startingOffsets="earliest", isolationLevel="read_committed",
                          bootstrap=broker, subscribe="txn").load()
                 .writeStream.format("memory").queryName("committed_stream").start())
        try:
            query.processAllAvailable()
            assert values(rows_of(spark.table("committed_stream"))) == \
                [b"a", b"b", b"c", b"d", b"g"]
            open_one.commit_transaction()
            query.processAllAvailable()
            assert values(rows_of(spark.table("committed_stream"))) == \
                [b"a", b"b", b"c", b"d", b"g", b"h", b"i"]
        finally:
            query.stop()
        for frame in (spark.read.format("shmlog").options(**committed).load(),
                      bulk_read(spark, **committed)):
            assert values(rows_of(frame)) == [b"a", b"b", b"c", b"d", b"g", b"h", b"i"]
    finally:
        open_one.close()


def test_a_bad_isolation_level_is_a_clear_error(spark, broker):
    Admin(broker).create_topic("txn", 1)
    with pytest.raises(Exception, match="read_uncommitted or read_committed"):
        spark.read.format("shmlog").options(bootstrap=broker, subscribe="txn",
                                            isolationLevel="serializable").load().collect()


def read_committed_values(data_dir, topic):
    """Every value of ``topic`` a read_committed consumer sees, as a multiset."""
    found = collections.Counter()
    with Consumer(bootstrap=data_dir, isolation_level="read_committed",
                  auto_offset_reset="earliest") as consumer:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + TIMEOUT_S
        while any(consumer.position(p) < ends[p] for p in partitions):
            assert time.monotonic() < deadline, "the read did not reach the end"
            for records in consumer.poll(timeout_ms=200).values():
                found.update(record.value for record in records)
    return found


def fill_input(data_dir, count):
    Admin(data_dir).create_topic("in", 2)
    with Producer(data_dir, linger_ms=1) as producer:
        for number in range(count):
            producer.send("in", b"%d" % number, key=b"%d" % number)
        producer.flush()


def start_copy(spark, data_dir, checkpoint, pause_s):
    slow = F.udf(lambda value: (time.sleep(pause_s), value)[1], BinaryType())
    return (spark.readStream.format("shmlog")
            .options(bootstrap=data_dir, subscribe="in", startingOffsets="earliest",
                     maxOffsetsPerTrigger="120").load()
            .select(slow("value").alias("value"), "key")
            .writeStream.format("shmlog").options(bootstrap=data_dir, topic="out")
            .option("checkpointLocation", checkpoint).start())


def wait_for(condition, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_stream_stopped_mid_batch_and_restarted_writes_each_input_once(spark, broker,
                                                                         tmp_path):
    count = 1200
    fill_input(broker, count)
    Admin(broker).create_topic("out", 3)
    checkpoint = str(tmp_path / "checkpoint")
    expected = collections.Counter(b"%d" % number for number in range(count))
    commits = os.path.join(checkpoint, "commits")

    def batches(log="commits"):
        where = os.path.join(checkpoint, log)
        return sorted(int(name) for name in os.listdir(where) if name.isdigit()) \
            if os.path.isdir(where) else []

    # Stopped while a micro-batch runs (its tasks are sleeping in the UDF), twice.
    for _ in range(2):
        query = start_copy(spark, broker, checkpoint, pause_s=0.01)
        try:
            done = len(batches())
            wait_for(lambda done=done: len(batches()) > done, "a micro-batch committed")
            time.sleep(0.6)                   # into the next one (1.2 s per batch)
        finally:
            query.stop()
        assert query.exception() is None
        assert batches("offsets")[-1] > batches()[-1], "stopped in a micro-batch"
        seen = read_committed_values(broker, "out")
        assert max(seen.values(), default=1) == 1, "nothing twice"
        assert set(seen) <= set(expected)
    # A micro-batch Spark runs again after its sink commit (the driver died before
    # the commit log): its stored decision is kept and the re-run's writes aborted.
    last = batches()[-1]
    os.remove(os.path.join(commits, str(last)))
    query = start_copy(spark, broker, checkpoint, pause_s=0)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert read_committed_values(broker, "out") == expected
    # Nothing of the query is left open.
    assert not [entry for entry in request(broker, "list_transactions",
                                           states=["Ongoing"])["transactions"]
        if entry["transactional_id"].startswith(T.STREAM_PREFIX)]


def prepare(data_dir, query, run, partition, values):
    """A task's prepared transaction, made by hand: ``values`` sent and left open."""
    name = T.transactional_id(query, run, partition, 0)
    producer = Producer(data_dir, transactional_id=name)
    producer.init_transactions()
    producer.begin_transaction()
    for value in values:
        producer.send("out", value, partition=partition)
    producer.flush()
    prepared = T.Prepared(name, producer.producer_id, producer.producer_epoch, partition, 0,
                          ("out", partition))
    producer.close()
    return prepared


def test_a_decided_micro_batch_is_completed_and_a_rerun_aborted(broker):
    Admin(broker).create_topic("out", 2)
    query = "q-recovery"
    first = [prepare(broker, query, "run1", p, [b"x%d" % p, b"y%d" % p]) for p in (0, 1)]
    # The first run's driver stored its decision, then died before committing.
    T.store_decision(broker, query, 7, "run1", first, ("out", 0))
    assert T.stored_decision(broker, query) == (7, [p.transactional_id for p in first])
    assert read_committed_values(broker, "out") == collections.Counter()
    # The restarted query ran micro-batch 7 again (one task this time).
    second = [prepare(broker, query, "run2", 0, [b"x0", b"y0", b"x1", b"y1"])]
    T.commit_micro_batch(broker, query, 7, "run2", second, 60_000)
    assert read_committed_values(broker, "out") == collections.Counter(
        [b"x0", b"y0", b"x1", b"y1"])
    # Committing it once more (Spark's commit retried) changes nothing.
    T.commit_micro_batch(broker, query, 7, "run2", second, 60_000)
    assert read_committed_values(broker, "out") == collections.Counter(
        [b"x0", b"y0", b"x1", b"y1"])
    # The next micro-batch is decided anew.
    third = [prepare(broker, query, "run2", 1, [b"z"])]
    T.commit_micro_batch(broker, query, 8, "run2", third, 60_000)
    assert read_committed_values(broker, "out")[b"z"] == 1
    assert T.stored_decision(broker, query)[0] == 8


def test_a_transactional_batch_write_commits_once_every_task_succeeded(spark, broker):
    Admin(broker).create_topic("out", 2)
    frame = spark.createDataFrame([(b"%d" % n,) for n in range(300)], ["value"]) \
        .repartition(3)
    frame.write.format("shmlog").mode("append").options(
        bootstrap=broker, topic="out", transactional="true").save()
    assert read_committed_values(broker, "out") == collections.Counter(
        b"%d" % n for n in range(300))
    with pytest.raises(Exception, match="transactional must be true or false"):
        frame.write.format("shmlog").mode("append").options(
            bootstrap=broker, topic="out", transactional="maybe").save()


def test_isolation_level_option_names_agree():
    from shmlog.spark.options import isolation_level
    assert isolation_level({}) == "read_uncommitted"
    assert isolation_level({"kafka.isolation.level": "READ_COMMITTED"}) == "read_committed"
    with pytest.raises(LocalProtocolError):
        isolation_level({"kafka.isolation.level": "read_committed",
                         "isolationlevel": "read_uncommitted"})
