"""An example pipeline: JSON log lines in a topic -> Spark Structured Streaming
(parse, 10-second windowed counts per service and level) -> counts in a topic.

    python tools/spark_pipeline.py [--master local[*]] [--data-dir DIR] [--lines N]

It starts an embedded broker on DIR (a temporary one by default), produces N JSON
log lines to ``logs``, runs the streaming query until it has caught up, stops it
and prints the counts read back from ``log-counts``; the counts are checked against
the lines produced, and the exit status says whether they agree. On the standalone
cluster of tools/spark_cluster.py::

    python tools/spark_cluster.py run -- python tools/spark_pipeline.py \\
        --master spark://127.0.0.1:7077
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

from shmlog import Admin, Broker, Consumer, Producer  # noqa: E402
from shmlog.spark import session  # noqa: E402

SERVICES = ("api", "db", "web")
LEVELS = ("INFO", "WARN", "ERROR")
WINDOW_MS = 10_000


def produce_lines(data_dir: str, count: int, start_ms: int) -> collections.Counter:
    """JSON log lines, one every 10 ms of event time; the expected window counts."""
    rng = random.Random(7)
    expected = collections.Counter()
    with Producer(data_dir) as producer:
        for number in range(count):
            stamp = start_ms + 10 * number
            line = {"ts": stamp, "service": rng.choice(SERVICES),
                    "level": rng.choices(LEVELS, (90, 8, 2))[0],
                    "message": f"request {number}", "latency_ms": rng.randint(1, 500)}
            producer.send("logs", json.dumps(line).encode(), key=line["service"].encode())
            expected[(stamp // WINDOW_MS * WINDOW_MS, line["service"], line["level"])] += 1
    return expected


def run_query(spark, data_dir: str, checkpoint: str) -> None:
    from pyspark.sql import functions as F
    schema = "ts long, service string, level string, message string, latency_ms int"
    lines = (spark.readStream.format("shmlog").option("bootstrap", data_dir)
             .option("subscribe", "logs").option("startingOffsets", "earliest").load())
    counts = (lines.select(F.from_json(F.col("value").cast("string"), schema).alias("line"))
              .select((F.col("line.ts") / 1000).cast("timestamp").alias("time"),
                      "line.service", "line.level")
              .groupBy(F.window("time", "10 seconds"), "service", "level").count())
    query = (counts.select(
                F.concat_ws("/", "service", "level").alias("key"),
                F.to_json(F.struct((F.unix_timestamp("window.start") * 1000).alias("window"),
                                   "service", "level", "count")).alias("value"))
             .writeStream.format("shmlog").option("bootstrap", data_dir)
             .option("topic", "log-counts").option("checkpointLocation", checkpoint)
             .outputMode("complete").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def read_counts(data_dir: str) -> dict:
    """The latest count written for each (window, service, level)."""
    latest = {}
    with Consumer("log-counts", bootstrap=data_dir, auto_offset_reset="earliest",
                  consumer_timeout_ms=2000) as consumer:
        for record in consumer:
            row = json.loads(record.value)
            latest[(row["window"], row["service"], row["level"])] = row["count"]
    return latest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER_URL", "local[*]"))
    parser.add_argument("--data-dir", help="default: a temporary directory")
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="shmlog-pipeline-")
    data_dir = os.path.abspath(args.data_dir or os.path.join(work, "data"))
    spark = session(args.master, "shmlog-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with Broker(data_dir):
            for topic in ("logs", "log-counts"):
                if topic not in Admin(data_dir).list_topics():
                    Admin(data_dir).create_topic(topic, 2)
            expected = produce_lines(data_dir, args.lines, 1_800_000_000_000)
            run_query(spark, data_dir, os.path.join(work, "checkpoint"))
            counts = read_counts(data_dir)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    for (window, service, level), count in sorted(counts.items())[:12]:
        print(f"window {window} {service:<4} {level:<5} {count}")
    print(f"... {len(counts)} (window, service, level) counts from {args.lines} lines")
    if counts != dict(expected):
        print("the counts disagree with the lines produced", file=sys.stderr)
        return 1
    print("counts agree with the lines produced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
