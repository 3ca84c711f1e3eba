"""The host-pinned bulk reader (``shmlog.spark.bulk_read``, a JVM data source)
returns what ``format("shmlog")`` returns, reads only the columns a query uses,
refuses a range stored on another host, reads a cluster range from the task's
broker's copy below its high watermark (local only on a preferred host) and fails
clearly when that copy cannot cover it, fails on a corrupt batch, steps over the
offsets compaction removed, and waits out a compaction swap. Where the reader cannot
be compiled, a session still reads with ``format("shmlog")``, says why once, and
``bulk_read`` raises ``BulkReaderUnavailableError`` with the reason.

Method: the same records (plain and zstd batches, null keys and values) are read
both ways and compared; the other host and the corruption are made by hand. A JDK
whose javac fails is a directory of our own (its java links to the real one), given
to a fresh Spark in a subprocess as JAVA_HOME, with an empty jar cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from shmlog import Admin, Broker, Consumer, Producer, TopicPartition
from shmlog.common.errors import BulkReaderUnavailableError
from shmlog.segments import SWAP_MANIFEST_FILE
from shmlog.server.broker import shared_memory_prefix
from shmlog.shm import shared_memory
from shmlog.shm.state import topic_key
from shmlog.spark import bulk_jar, bulk_read

TIMEOUT_S = 60
# Reads of a compacted partition until two agree (each cleaning pass changes it once).
STABLE_READS_MAX = 20


def fill(data_dir):
    Admin(data_dir).create_topic("bulk", 3)
    for compression, numbers in ((None, range(0, 1500)), ("zstd", range(1500, 2500))):
        with Producer(data_dir, compression=compression, batch_size=2048) as producer:
            futures = [producer.send("bulk", None if n % 7 == 0 else b"value-%d" % n,
                                     key=None if n % 3 == 0 else b"key-%d" % (n % 10))
                       for n in numbers]
            for future in futures:
                future.get(timeout=TIMEOUT_S)


def in_order(frame):
    return sorted(frame.collect(), key=lambda row: (row.partition, row.offset))


def test_the_bulk_reader_returns_what_the_python_source_returns(spark, broker):
    fill(broker)
    with Consumer(bootstrap=broker) as consumer:
        middle = consumer.end_offsets([TopicPartition("bulk", 1)])[TopicPartition("bulk", 1)] // 2
    options = {"bootstrap": broker, "subscribe": "bulk", "startingOffsets": '{"bulk": {"0": 5}}',
               "endingOffsets": json.dumps({"bulk": {"1": middle}})}
    python = spark.read.format("shmlog").options(**options).load()
    bulk = bulk_read(spark, maxRecordsPerPartition="300", **options)
    assert bulk.schema == python.schema
    rows = in_order(bulk)
    assert rows == in_order(python)
    assert len(rows) > 1000 and any(row.key is None for row in rows) \
        and any(row.value is None for row in rows)
    assert bulk.rdd.getNumPartitions() > 3


def test_the_bulk_reader_reads_only_the_columns_used(spark, broker):
    fill(broker)
    offsets = bulk_read(spark, bootstrap=broker, subscribe="bulk").select("partition", "offset")
    assert offsets.schema.fieldNames() == ["partition", "offset"]
    scan = offsets._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan shmlog-bulk[partition#" in scan and "value#" not in scan, scan
    assert offsets.count() == 2500


def test_a_range_stored_on_another_host_is_refused(spark, broker):
    fill(broker)
    plan = [{"topic": "bulk", "partition": 0, "start": 0, "end": 10, "host": "elsewhere",
             "directory": os.path.join(broker, "topics", "bulk", "0")}]
    frame = spark.read.format("io.shmlog.spark.BulkSource").option("plan", json.dumps(plan)) \
        .load()
    with pytest.raises((PySparkException, Py4JJavaError),
                       match="run the executors on the broker hosts"):
        frame.collect()


def cluster_range(broker, **changes):
    """A range as bulk_plan makes it in a cluster (hosts, the copy's directory under
    any broker's data directory, its state-table key, the wait)."""
    topic_id = Admin(broker).describe_topic("bulk")["topic_id"]
    with Consumer(bootstrap=broker) as consumer:
        end = consumer.end_offsets([TopicPartition("bulk", 0)])[TopicPartition("bulk", 0)]
    return {"topic": "bulk", "partition": 0, "start": 0, "end": end, "bootstrap": broker,
            "directory": os.path.join(broker, "topics", "bulk", "0"),
            "relative": os.path.join("topics", "bulk", "0"), "hosts": ["elsewhere"],
            "topicKey": topic_key(topic_id), "waitMs": 200, "pollMs": 10, **changes}


def bulk_frame(spark, *ranges):
    return spark.read.format("io.shmlog.spark.BulkSource").option("plan", json.dumps(ranges)) \
        .option("includeReadLocality", "true").load()


def test_a_cluster_range_reads_the_tasks_brokers_copy_and_counts_locality(spark, broker):
    """The task's broker here is the plan's bootstrap (no SHMLOG_SPARK_BOOTSTRAP): its
    copy is read through its state-table row, local only on a preferred host."""
    fill(broker)
    elsewhere = cluster_range(broker)
    here = cluster_range(broker, hosts=[spark.sparkContext.getConf().get("spark.driver.host")])
    for entry, locality in ((elsewhere, "remote"), (here, "local")):
        rows = bulk_frame(spark, entry).select("offset", "readLocality").collect()
        assert [row.offset for row in rows] == list(range(entry["end"]))
        assert {row.readLocality for row in rows} == {locality}


@pytest.mark.parametrize("change, message", [
    (lambda entry: {"end": entry["end"] + 1},
     r"bulk-0: the copy at .* on host .* has high watermark \d+, below the planned end"),
    (lambda entry: {"topicKey": entry["topicKey"] ^ 1}, r"bulk-0: the broker at .* holds no copy"),
    (lambda entry: {"bootstrap": "/nonexistent"},
     r"bulk-0: no shmlog broker at /nonexistent on host .*SHMLOG_SPARK_BOOTSTRAP"),
])
def test_a_cluster_range_its_hosts_broker_cannot_cover_fails_clearly(spark, broker, change,
                                                                     message):
    fill(broker)
    entry = cluster_range(broker)
    with pytest.raises((PySparkException, Py4JJavaError), match=message):
        bulk_frame(spark, {**entry, **change(entry)}).collect()


def test_a_corrupt_batch_fails_the_read(spark, broker):
    fill(broker)
    directory = os.path.join(broker, "topics", "bulk", "1")
    segment = sorted(name for name in os.listdir(directory) if name.endswith(".log"))[0]
    with open(os.path.join(directory, segment), "r+b") as target:
        target.seek(100)                           # inside the first batch's records
        byte = target.read(1)[0]
        target.seek(100)
        target.write(bytes([byte ^ 0x40]))
    with pytest.raises((PySparkException, Py4JJavaError), match="CRC mismatch"):
        bulk_read(spark, bootstrap=broker, assign='{"bulk": [1]}').collect()


def test_log_append_time_topics_read_the_same_both_ways(spark, broker):
    """A LogAppendTime batch gives every record the broker's append time, whatever
    the producer stamped (Kafka's rule), in both readers."""
    Admin(broker).create_topic("stamped", 1, config={"message.timestamp.type": "LogAppendTime"})
    with Producer(broker, batch_size=4096, linger_ms=50) as producer:
        for n in range(200):
            producer.send("stamped", b"value-%d" % n, partition=0, timestamp_ms=1_000 + n)
        producer.flush(timeout=TIMEOUT_S)
    options = {"bootstrap": broker, "subscribe": "stamped"}
    python = in_order(spark.read.format("shmlog").options(**options).load())
    bulk = in_order(bulk_read(spark, **options))
    assert bulk == python and len(python) == 200
    assert all(row.timestampType == 1 and row.timestamp.year >= 2025 for row in python)


def compacted_records(data_dir, enough):
    """(offset, value) of every record of table-0, read again until ``enough`` of
    them or TIMEOUT_S."""
    partition = TopicPartition("table", 0)
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([partition])
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            consumer.seek_to_beginning(partition)
            left = []
            while consumer.position(partition) < 3000:
                left += consumer.poll(timeout_ms=1000).get(partition, [])
            left = [(record.offset, record.value) for record in left]
            if enough(left) or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def test_both_readers_step_over_what_compaction_removed(spark, tmp_path):
    """Ranges planned over a compacted topic start, end and run over offsets whose
    records are gone; both readers return exactly the records that are left."""
    data_dir = str(tmp_path / "compacted")
    try:
        with Broker(data_dir, cleaner_backoff_ms=100):
            Admin(data_dir).create_topic("table", 1, config={
                "cleanup.policy": "compact", "segment.bytes": 4096,
                "min.cleanable.dirty.ratio": 0.01})
            for compression, numbers in ((None, range(0, 2000)), ("zstd", range(2000, 3000))):
                with Producer(data_dir, compression=compression, batch_size=512) as producer:
                    for n in numbers:
                        producer.send("table", b"value-%d" % n, key=b"key-%d" % (n % 20),
                                      partition=0)
                    producer.flush(timeout=TIMEOUT_S)
            left = compacted_records(data_dir, lambda left: len(left) < 1000)
            assert len(left) < 1000, "the cleaner ran"
            # No more cleaning (the dirty ratio left is far below 0.99), and a pass under
            # way when it was set has ended once two reads agree: the readers below
            # must see what `left` holds.
            Admin(data_dir).alter_topic_config("table", set={"min.cleanable.dirty.ratio": 0.99})
            for _ in range(STABLE_READS_MAX):
                previous, left = left, compacted_records(data_dir, lambda _: True)
                if left == previous:
                    break
            assert left == previous, "the cleaner stopped"
            options = {"bootstrap": data_dir, "subscribe": "table",
                       "maxRecordsPerPartition": "250"}
            python = in_order(spark.read.format("shmlog").options(**options).load())
            bulk = in_order(bulk_read(spark, **options))
            assert bulk == python
            assert [(row.offset, row.value) for row in python] == left
            assert {row.key: row.value for row in python} == \
                {b"key-%d" % k: b"value-%d" % (2980 + k) for k in range(20)}
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith(shared_memory_prefix(data_dir)):
                shared_memory.unlink(name)


def test_the_bulk_reader_waits_out_a_compaction_swap(spark, broker):
    """While a swap manifest says segments are being replaced, a task does not trust
    its listing (it could hold a group's old first segment without the rest): it
    waits until the swap is over, then reads everything."""
    fill(broker)
    directories = [os.path.join(broker, "topics", "bulk", str(partition)) for partition in range(3)]
    for directory in directories:
        with open(os.path.join(directory, SWAP_MANIFEST_FILE), "w") as manifest:
            manifest.write('{"version": 1, "groups": []}')
    ended = threading.Event()

    def end_the_swap():
        time.sleep(3)
        ended.set()
        for directory in directories:
            os.unlink(os.path.join(directory, SWAP_MANIFEST_FILE))

    swap = threading.Thread(target=end_the_swap)
    swap.start()
    try:
        count = bulk_read(spark, bootstrap=broker, subscribe="bulk").select("offset").count()
        assert ended.is_set(), "the read finished while the swap was still going on"
        assert count == 2500
    finally:
        swap.join(timeout=TIMEOUT_S)


def test_without_javac_the_bulk_reader_is_unavailable_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jre-only"))
    with pytest.raises(BulkReaderUnavailableError, match="no javac at .*jre-only"):
        bulk_jar()


WITHOUT_BULK_READER = textwrap.dedent("""
    import json, logging, sys
    from shmlog.common.errors import BulkReaderUnavailableError
    from shmlog.spark import bulk_read, session
    logging.basicConfig(level=logging.WARNING)
    spark = session("local[1]", "shmlog-no-bulk-reader")
    again = session("local[1]", "shmlog-no-bulk-reader")
    try:
        options = {"bootstrap": sys.argv[1], "subscribe": "bulk", "startingOffsets": "earliest"}
        count = spark.read.format("shmlog").options(**options).load().count()
        try:
            bulk_read(again, **options)
            refusal = None
        except BulkReaderUnavailableError as error:
            refusal = str(error)
    finally:
        spark.stop()
    print(json.dumps({"count": count, "refusal": refusal}))
""")


def test_a_session_without_the_bulk_reader_reads_and_says_why_once(broker, tmp_path):
    fill(broker)
    jdk = tmp_path / "broken-jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "java").symlink_to(os.path.realpath(shutil.which("java")))
    (jdk / "javac").write_text("#!/bin/sh\necho 'error: this javac is broken' >&2\nexit 2\n")
    (jdk / "javac").chmod(0o755)
    variables = {**os.environ, "JAVA_HOME": str(jdk.parent),
                 "SHMLOG_CACHE_DIR": str(tmp_path / "jars")}
    done = subprocess.run([sys.executable, "-c", WITHOUT_BULK_READER, broker], env=variables,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["count"] == 2500
    assert "failed with status 2" in result["refusal"]
    assert "format('shmlog')" in result["refusal"]
    assert done.stderr.count("the shmlog bulk reader is unavailable") == 1
    assert "this javac is broken" in done.stderr


def test_both_readers_skip_a_transactions_marker(spark, tmp_path):
    """A log holding a COMMIT marker between records (written with the log's own
    append before the broker starts): neither reader returns a row for it."""
    from shmlog import LogManager
    from shmlog.record.control import EndTransactionMarker, encode_marker
    from shmlog.record.records import encode_batch
    data_dir = str(tmp_path / "data")
    with LogManager(data_dir) as logs:
        logs.create_topic("marked", 1)
        log = logs.partition_log("marked", 0)
        log.append(encode_batch([b"a", b"b"], producer_id=5, producer_epoch=0, base_sequence=0,
                                transactional=True))
        log.append(encode_marker(EndTransactionMarker(5, 0, True, 0)))
        log.append(encode_batch([b"c"]))
    try:
        with Broker(data_dir):
            options = {"bootstrap": data_dir, "subscribe": "marked"}
            expected = [(0, b"a"), (1, b"b"), (3, b"c")]
            for frame in (spark.read.format("shmlog").options(**options).load(),
                          bulk_read(spark, **options)):
                assert [(row.offset, bytes(row.value)) for row in in_order(frame)] == expected
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith(shared_memory_prefix(data_dir)):
                shared_memory.unlink(name)
