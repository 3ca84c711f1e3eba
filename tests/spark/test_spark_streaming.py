"""Structured Streaming with ``format("shmlog")`` in a real local Spark: a query to
a file sink while a producer appends, stopped and restarted from its checkpoint,
outputs every record exactly once; ``maxOffsetsPerTrigger`` bounds each
micro-batch; a stream written back to a topic round-trips.

Method: a producer thread appends while the query runs; what the sink holds is
compared with the producer's acknowledgements. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time

from shmlog import Admin, Producer

TIMEOUT_S = 120


def produce(data_dir, topic, numbers, *, pause_s=0.0):
    """Send ``numbers`` as values (and keys); their (partition, offset) -> value."""
    sent = {}
    with Producer(data_dir, linger_ms=1) as producer:
        for number in numbers:
            meta = producer.send(topic, b"%d" % number, key=b"k%d" % (number % 7)) \
                .get(timeout=TIMEOUT_S)
            sent[(meta.partition, meta.offset)] = b"%d" % number
            if pause_s:
                time.sleep(pause_s)
    return sent


def stream(spark, data_dir, **options):
    return spark.readStream.format("shmlog").options(bootstrap=data_dir, **options).load()


def run_to_files(spark, data_dir, output, checkpoint, producing=None):
    """Run the query until it has caught up (with the producer, if one runs)."""
    query = (stream(spark, data_dir, subscribe="live", startingOffsets="earliest")
             .select("partition", "offset", "value")
             .writeStream.format("parquet").option("path", output)
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
             .start())
    try:
        if producing is not None:
            producing.join(timeout=TIMEOUT_S)
            assert not producing.is_alive(), "the producer did not finish"
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


def test_a_restarted_query_outputs_every_record_exactly_once(spark, broker, tmp_path):
    Admin(broker).create_topic("live", 3)
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sent = {}

    def producing(numbers):
        thread = threading.Thread(target=lambda: sent.update(
            produce(broker, "live", numbers, pause_s=0.002)))
        thread.start()
        return thread

    run_to_files(spark, broker, output, checkpoint, producing(range(0, 400)))
    first = spark.read.parquet(output).count()
    run_to_files(spark, broker, output, checkpoint, producing(range(400, 800)))
    rows = spark.read.parquet(output).collect()
    got = [((row.partition, row.offset), row.value) for row in rows]
    assert 0 < first <= 400
    assert len(got) == len(set(got)), "no record twice"
    assert dict(got) == sent, "every record, with its value"


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, broker):
    Admin(broker).create_topic("limited", 2)
    sent = produce(broker, "limited", range(500))
    query = (stream(spark, broker, subscribe="limited", startingOffsets="earliest",
                    maxOffsetsPerTrigger="60")
             .writeStream.format("memory").queryName("limited").start())
    try:
        query.processAllAvailable()
        sizes = [progress["numInputRows"] for progress in query.recentProgress
                 if progress["numInputRows"]]
    finally:
        query.stop()
    assert sizes and max(sizes) <= 60 and sum(sizes) == len(sent)
    assert len(sizes) >= len(sent) // 60
    rows = spark.sql("select partition, offset, value from limited").collect()
    assert {(row.partition, row.offset): row.value for row in rows} == sent


def test_a_stream_written_to_a_topic_round_trips(spark, broker, tmp_path):
    Admin(broker).create_topic("source", 2)
    Admin(broker).create_topic("sink", 1)
    sent = produce(broker, "source", range(300))
    query = (stream(spark, broker, subscribe="source", startingOffsets="earliest")
             .selectExpr("key", "upper(cast(value as string)) as value")
             .writeStream.format("shmlog").option("bootstrap", broker).option("topic", "sink")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    written = spark.read.format("shmlog").option("bootstrap", broker) \
        .option("subscribe", "sink").load().collect()
    assert sorted(row.value for row in written) == sorted(sent.values())
    assert {row.partition for row in written} == {0}
