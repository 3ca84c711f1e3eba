"""The example pipeline on a cluster: three brokers and a Spark standalone cluster
whose workers run on the broker hosts, on this machine's loopback addresses.

    python tools/spark_cluster_pipeline.py [--lines N] [--directory DIR]
                                           [--zookeeper HOST:PORT]

One command starts everything: a ZooKeeper (unless ``--zookeeper`` names one), a
``LocalCluster`` of three brokers on 127.0.0.2, 127.0.0.3 and 127.0.0.4, and
tools/spark_cluster.py's master and three workers bound to those same addresses,
each pointed at its host's broker (``SHMLOG_SPARK_BOOTSTRAP``). It creates ``logs``
(3 partitions, replication factor 2: every host lacks an in-sync replica of some
partition), produces N JSON log lines with acks=all, and reads them back twice -
with ``bulk_read`` (the JVM reader, which Spark places on the replica hosts) and
with ``format("shmlog")`` (Python tasks, placed anywhere) - computing the same
10-second windowed counts per service and level as tools/spark_pipeline.py.

For each reader it prints the counts, whether every record was read exactly once,
and the local/remote reads (``includeReadLocality``): tasks and records read from
an in-sync replica on the task's own host, and those read from its broker's other
copy (observer or out-of-sync follower). The exit status is 0 when every read
agrees with the lines produced and every row was read either locally or remotely.
Everything is stopped at the end, whatever happened.
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
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.join(REPOSITORY, "tools"))

import spark_cluster  # noqa: E402
from shmlog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from shmlog.local_cluster import LocalCluster  # noqa: E402
from shmlog.spark import bulk_read, session  # noqa: E402

BROKERS = 3
TOPIC, PARTITIONS, REPLICATION_FACTOR = "logs", 3, 2
SERVICES = ("api", "db", "web")
LEVELS = ("INFO", "WARN", "ERROR")
WINDOW_MS = 10_000
# The settings of the cluster tests: a loaded 2-core machine shrinks ISRs otherwise.
SETTINGS = {"zookeeper.session.timeout.ms": 4000, "replica.lag.time.max.ms": 4000,
            "replica.fetch.wait.max.ms": 200}
# How long the driver's broker may take to see every acknowledged record (one fetch
# round trip, on a loaded machine many).
CAUGHT_UP_TIMEOUT_S = 60
ACK_TIMEOUT_S = 60


def broker_hosts() -> dict[int, str]:
    """Broker ``i`` on worker ``i - 1``'s address (spark_cluster.worker_hosts)."""
    return dict(zip(range(1, BROKERS + 1), spark_cluster.worker_hosts(BROKERS)))


def produce_lines(data_dir: str, count: int, start_ms: int) -> collections.Counter:
    """JSON log lines, one every 10 ms of event time, acknowledged by every in-sync
    replica; the expected window counts."""
    rng = random.Random(7)
    expected = collections.Counter()
    with Producer(data_dir, acks="all") as producer:
        futures = []
        for number in range(count):
            stamp = start_ms + 10 * number
            line = {"ts": stamp, "service": rng.choice(SERVICES),
                    "level": rng.choices(LEVELS, (90, 8, 2))[0],
                    "message": f"request {number}", "latency_ms": rng.randint(1, 500)}
            futures.append(producer.send(TOPIC, json.dumps(line).encode(),
                                         key=line["service"].encode()))
            expected[(stamp // WINDOW_MS * WINDOW_MS, line["service"], line["level"])] += 1
        for future in futures:
            future.get(timeout=ACK_TIMEOUT_S)
    return expected


def wait_caught_up(data_dir: str, count: int) -> None:
    """Until the driver's broker's copies hold every acknowledged line below their
    high watermarks (the plan reads its high watermarks)."""
    partitions = [TopicPartition(TOPIC, number) for number in range(PARTITIONS)]
    deadline = time.monotonic() + CAUGHT_UP_TIMEOUT_S
    with Consumer(bootstrap=data_dir) as consumer:
        while sum(consumer.end_offsets(partitions).values()) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"the broker at {data_dir} did not see all {count} lines "
                                 f"within {CAUGHT_UP_TIMEOUT_S} s")
            time.sleep(0.05)


def window_counts(frame) -> dict:
    from pyspark.sql import functions as F
    schema = "ts long, service string, level string, message string, latency_ms int"
    counted = (frame.select(F.from_json(F.col("value").cast("string"), schema).alias("line"))
               .select((F.col("line.ts") / 1000).cast("timestamp").alias("time"),
                       "line.service", "line.level")
               .groupBy(F.window("time", "10 seconds"), "service", "level").count()
               .select((F.unix_timestamp("window.start") * 1000).alias("window"),
                       "service", "level", "count"))
    return {(row.window, row.service, row.level): row["count"] for row in counted.collect()}


def check_read(name: str, frame, lines: int, expected: dict) -> bool:
    """Print one reader's counts, exactly-once check and local/remote reads (tasks
    and records); True when all agree. The frame is read once (persisted)."""
    from pyspark.sql import functions as F
    frame = frame.withColumn("task", F.spark_partition_id()).persist()
    try:
        counts = window_counts(frame)
        rows = frame.select("partition", "offset", "readLocality", "task").collect()
    finally:
        frame.unpersist()
    distinct = len({(row.partition, row.offset) for row in rows})
    tasks = collections.defaultdict(set)
    records = collections.Counter()
    for row in rows:
        tasks[row.readLocality].add(row.task)
        records[row.readLocality] += 1
    print(f"{name}: {len(rows)} records read, {distinct} distinct (partition, offset), "
          f"{len(counts)} (window, service, level) counts")
    print(f"{name} reads: local {len(tasks['local'])} tasks {records['local']} records, "
          f"remote {len(tasks['remote'])} tasks {records['remote']} records", flush=True)
    agreed = len(rows) == distinct == lines and counts == expected and \
        set(records) <= {"local", "remote"}
    print(f"{name}: {'every record read exactly once, counts agree' if agreed else 'DISAGREES'}")
    return agreed


def run(directory: str, lines: int, zookeeper: str | None) -> bool:
    state = os.path.join(directory, "spark")
    with LocalCluster(os.path.join(directory, "brokers"), BROKERS, zookeeper_connect=zookeeper,
                      settings=SETTINGS, hosts=broker_hosts(), log_files=True) as cluster:
        spark_cluster.stop(state)
        spark_cluster.start(state, BROKERS, 1, "1g",
                            {host: cluster.data_dir(broker_id)
                             for broker_id, host in broker_hosts().items()})
        try:
            driver_broker = cluster.data_dir(1)
            Admin(driver_broker).create_topic(TOPIC, PARTITIONS,
                                              replication_factor=REPLICATION_FACTOR)
            expected = produce_lines(driver_broker, lines, 1_800_000_000_000)
            wait_caught_up(driver_broker, lines)
            spark = session(spark_cluster.MASTER_URL, "shmlog-cluster-pipeline",
                            **{"spark.ui.showConsoleProgress": "false",
                               "spark.sql.shuffle.partitions": str(PARTITIONS)})
            spark.sparkContext.setLogLevel("ERROR")
            try:
                options = {"bootstrap": driver_broker, "subscribe": TOPIC,
                           "includeReadLocality": "true"}
                bulk = check_read("bulk_read", bulk_read(spark, **options), lines,
                                  dict(expected))
                python = check_read("format(shmlog)",
                                    spark.read.format("shmlog").options(**options).load(),
                                    lines, dict(expected))
            finally:
                spark.stop()
        finally:
            spark_cluster.stop(state)
    return bulk and python


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--directory", help="default: a temporary directory, removed after")
    parser.add_argument("--zookeeper", help="a running ZooKeeper's HOST:PORT (default: start one)")
    args = parser.parse_args(argv)
    directory = os.path.abspath(args.directory or tempfile.mkdtemp(prefix="shmlog-cluster-"))
    try:
        agreed = run(directory, args.lines, args.zookeeper)
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)
    print("all reads agree with the lines produced" if agreed else
          "a read disagrees with the lines produced", file=sys.stdout if agreed else sys.stderr)
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
