"""Spark scans of shmlog against Parquet, and streaming throughput, in one run.

Workload: 10 M records of distinct 100-byte values in 4 partitions (written with
``send_batch`` through a real broker). The same records are written once to
Parquet (all of Kafka's columns, snappy, as Spark writes by default). Each scan
runs ``groupBy(partition).agg(sum(length(value)), max(timestamp), count)`` - every
column that matters is touched - three times; the best time counts. The same
aggregation over a Python data source that replays one prepared Arrow batch (no
reading at all) measures Spark's own cost of the Python Data Source path, and
``shmlog.spark.bulk_read`` (the JVM bulk reader: segments straight into Spark's
columnar batches, only the columns used) runs the same aggregation. Then a
streaming query (``format("shmlog")`` -> a no-op sink, ``maxOffsetsPerTrigger``
1 M) reads the topic from the start and reports records per second. Spark runs
``local[2]`` on this machine; memcpy is measured in the same run, as the bound of
anything that moves bytes.

Expected on the 2-vCPU development VM (November 2026): see the closing note of
the session that built this; the figures depend mostly on Python worker speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402

from shmlog import Admin, Broker, Producer  # noqa: E402
from shmlog.spark import bulk_read, session  # noqa: E402

PARTITIONS = 4


def fill(data_dir: str, records: int, size: int) -> None:
    """Random values, each made distinct by its record number in the first 8 bytes
    (repeated values would let Parquet dictionary-encode them: a different test)."""
    rows = np.random.default_rng(0).integers(0, 256, (1000, size), np.uint8)
    numbers = rows[:, :8].view(np.int64)
    with Producer(data_dir) as producer:
        for number in range(records // 1000):
            numbers[:, 0] = np.arange(number * 1000, (number + 1) * 1000)
            producer.send_batch("bench", rows, partition=number % PARTITIONS)
        producer.flush()


def best_of(runs: int, action) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def aggregate(frame):
    from pyspark.sql import functions as F
    return frame.groupBy("partition").agg(F.sum(F.length("value")), F.max("timestamp"),
                                          F.count("*")).collect()


class _ReplaySource:
    """A Python data source that yields one prepared Arrow batch of shmlog's schema
    over and over: Spark's own cost of the Python Data Source path, with no reading
    at all - the bound of any Python source on this machine."""

    @staticmethod
    def register(spark, batch_path: str, repeats: int, tasks: int) -> None:
        from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

        from shmlog.spark import SCHEMA

        class Reader(DataSourceReader):
            def partitions(self):
                return [InputPartition(index) for index in range(tasks)]

            def read(self, partition):
                import pyarrow as pa
                with pa.memory_map(batch_path) as source:
                    batch = pa.ipc.open_file(source).get_batch(0)
                for _ in range(repeats // tasks):
                    yield batch

        class Replay(DataSource):
            @classmethod
            def name(cls):
                return "replay"

            def schema(self):
                return SCHEMA

            def reader(self, schema):
                return Reader()

        spark.dataSource.register(Replay)


def prepared_batch(data_dir: str, path: str) -> int:
    """Write the first Arrow batch a shmlog task would yield to ``path``; its rows."""
    import pyarrow as pa

    from shmlog.spark import OffsetRange, ReadOptions, read_range
    options = ReadOptions.parse({"subscribe": "bench", "bootstrap": data_dir})
    end = Admin(data_dir).list_offsets("bench")[0]["log_end_offset"]   # a task's plan ends there
    batch = next(read_range(OffsetRange("bench", 0, 0, end), options))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return batch.num_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args(argv)
    bound = memcpy_rate()
    work = tempfile.mkdtemp(prefix="shmlog-bench-spark-")
    data_dir = os.path.join(work, "data")
    spark = session("local[2]", "shmlog-bench", **{"spark.driver.memory": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with Broker(data_dir):
            Admin(data_dir).create_topic("bench", PARTITIONS)
            started = time.perf_counter()
            fill(data_dir, args.records, args.size)
            produced_s = time.perf_counter() - started
            shmlog_frame = spark.read.format("shmlog").option("bootstrap", data_dir) \
                .option("subscribe", "bench").load()
            parquet_path = os.path.join(work, "parquet")
            shmlog_frame.write.parquet(parquet_path)
            parquet_frame = spark.read.parquet(parquet_path)
            expected = sorted(aggregate(parquet_frame))
            assert sorted(aggregate(shmlog_frame)) == expected, "both scans agree"
            shmlog_s = best_of(3, lambda: aggregate(shmlog_frame))
            parquet_s = best_of(3, lambda: aggregate(parquet_frame))
            bulk_frame = bulk_read(spark, bootstrap=data_dir, subscribe="bench")
            assert sorted(aggregate(bulk_frame)) == expected, "the bulk reader agrees"
            bulk_s = best_of(3, lambda: aggregate(bulk_frame))
            batch_path = os.path.join(work, "batch.arrow")
            rows = prepared_batch(data_dir, batch_path)
            _ReplaySource.register(spark, batch_path, args.records // rows, PARTITIONS)
            replay_s = best_of(3, lambda: aggregate(spark.read.format("replay").load()))

            query = (spark.readStream.format("shmlog").option("bootstrap", data_dir)
                     .option("subscribe", "bench").option("startingOffsets", "earliest")
                     .option("maxOffsetsPerTrigger", "1000000").load()
                     .writeStream.format("noop").start())
            started = time.perf_counter()
            query.processAllAvailable()
            streaming_s = time.perf_counter() - started
            query.stop()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    value_bytes = args.records * args.size
    print(f"{args.records / 1e6:.0f} M records of {args.size} B in {PARTITIONS} partitions; "
          f"memcpy {bound / 1e9:.2f} GB/s; produced in {produced_s:.1f} s")
    for name, seconds in (("shmlog scan", shmlog_s), ("bulk scan", bulk_s),
                          ("parquet scan", parquet_s), ("replay bound", replay_s),
                          ("shmlog stream", streaming_s)):
        print(f"{name:<14} {seconds:7.2f} s {args.records / seconds / 1e6:7.2f} M records/s "
              f"{value_bytes / seconds / 1e9:6.2f} GB/s of values "
              f"({value_bytes / seconds / bound:.1%} of memcpy)")
    for name, seconds in (("format('shmlog')", shmlog_s), ("bulk_read", bulk_s)):
        ratio = parquet_s / seconds
        print(f"{name} / parquet speed: {ratio:.2f}x (goal >= 1.0x: reading the log in place "
              f"should cost no more than Parquet) {'met' if ratio >= 1 else 'below'}")
    print(f"shmlog / replay bound (Spark's Python data source path, no reading): "
          f"{replay_s / shmlog_s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
