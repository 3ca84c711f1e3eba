"""Kafka's record batch v2 to shmlog's layout and back (``record.kafka_batches``),
next to the same run's memcpy.

Goal
----
Say what the Kafka listener's conversion costs per record and per byte, against the
bound of a conversion that is one copy per byte: ``np.copyto``. Each direction
rewrites every record's header fields (varints to fixed width and back) and copies
its key and value once, and checks or computes a CRC32C over the batch, so its
rate is a fraction of memcpy; the figure says which fraction. A benchmark never
asserts.

Method
------
1. memcpy: ``np.copyto`` between two pre-touched 256 MiB arrays, best of 5
   (``bounds.memcpy_rate``).
2. Produce (``from_kafka``): one Kafka batch of ``--batch-records`` records of
   ``--record-size`` random value bytes and a 16-byte key, built by kafka-python's
   ``DefaultRecordBatchBuilder`` (uncompressed, gzip and zstd; idempotent fields
   set), converted ``--batches`` times; the best of ``--repeats`` rounds is kept.
   Compressed batches include inflating their records (zlib or zstd, in Python's
   bindings) and compressing them again as shmlog's zstd.
3. Fetch (``to_kafka``): a run of ``--batches`` stored batches (the uncompressed
   batch of 2, and its zstd form) back to back, as a read of the log returns them,
   converted (a) whole, in one call, and (b) as 1 MiB reads, one call each (what a
   Fetch with the default partition budget asks), best of ``--repeats``.
4. Everything runs once before timing, so numba's compile or cache load is paid.

Rates are records/s and MB/s (10^6 bytes/s) of the Kafka form of the batches,
uncompressed (the bytes a client sends or receives uncompressed), whichever the
direction, so both directions compare with each other and with memcpy.

Figures
-------
The defaults on a 2-vCPU VM shared with other work (load average 2.5, so a quiet
machine does better), November 2026; runs at load 7-10 gave half these rates:

=========================================  =========  =======  =========
figure                                     records/s  MB/s     of memcpy
=========================================  =========  =======  =========
memcpy (np.copyto 256 MiB, best of 5)      -          12,198   100 %
Produce: from_kafka, none                  15.3 M     1,935    15.9 %
Produce: from_kafka, gzip                  0.92 M     117      1.0 %
Produce: from_kafka, zstd                  1.63 M     206      1.7 %
Fetch: to_kafka, stored none, whole run    22.9 M     2,912    23.9 %
Fetch: to_kafka, stored none, 1 MiB reads  21.2 M     2,694    22.1 %
Fetch: to_kafka, stored zstd, whole run    7.1 M      902      7.4 %
Fetch: to_kafka, stored zstd, 1 MiB reads  9.2 M      1,169    9.6 %
=========================================  =========  =======  =========

What bounds them: uncompressed, two compiled passes over the records (check and
size, then write) and two CRC32Cs per batch (~5 us each for 127 KB); compressed
Produce, zlib's or zstd's inflating and above all zstd compressing the records again
at level 3 (~0.5 ms a batch of random values, which do not compress); Fetch of a
stored zstd batch, inflating it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import harness  # noqa: F401  (this checkout's shmlog, numba's cache in it)
import numpy as np
from bounds import memcpy_rate
from kafka.record.default_records import DefaultRecordBatchBuilder

from shmlog.record.kafka_batches import from_kafka, to_kafka

KEY_SIZE = 16
READ_BYTES = 1 << 20
CODECS = {"none": 0, "gzip": 1, "zstd": 4}


def kafka_batch(records: int, record_size: int, codec: int) -> bytes:
    rng = np.random.default_rng(1)
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=4242,
        producer_epoch=0, base_sequence=0, batch_size=1 << 30)
    timestamp = 1_700_000_000_000
    for index in range(records):
        builder.append(index, timestamp=timestamp + index, key=b"key-%012d" % index,
                       value=rng.bytes(record_size), headers=[])
    return bytes(builder.build())


def best(repeats: int, function) -> float:
    """The shortest of ``repeats`` timed calls of ``function`` (seconds)."""
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def produce(batch: bytes, batches: int) -> None:
    for _ in range(batches):
        from_kafka(batch)


def fetch_in_reads(run: np.ndarray, cuts: list) -> int:
    size = 0
    for start, end in cuts:
        size += to_kafka(run[start:end]).size
    return size


def read_cuts(run: np.ndarray, batch_size: int) -> list:
    """Whole-batch slices of about ``READ_BYTES`` each, as reads of the log return."""
    per_read = max(READ_BYTES // batch_size, 1) * batch_size
    return [(start, min(start + per_read, run.size)) for start in range(0, run.size, per_read)]


def line(name: str, records: int, kafka_bytes: int, seconds: float, bound: float) -> None:
    rate = kafka_bytes / seconds
    print(f"{name:<42} {records / seconds / 1e6:8.2f} M  {rate / 1e6:9.0f}  "
          f"{rate / bound:7.1%}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    bound = memcpy_rate()
    records = args.batch_records * args.batches
    batches = {name: kafka_batch(args.batch_records, args.record_size, codec)
               for name, codec in CODECS.items()}
    kafka_size = len(batches["none"])
    print(f"{args.batches} batches of {args.batch_records} records of {args.record_size} "
          f"value bytes and a {KEY_SIZE}-byte key; a batch is {kafka_size:,} bytes as Kafka's")
    print(f"{'figure':<42} {'records/s':>10}  {'MB/s':>9}  {'of memcpy':>8}")
    print(f"{'memcpy (np.copyto 256 MiB, best of 5)':<42} {'-':>10}  {bound / 1e6:9.0f}  "
          f"{1:7.0%}")
    for name, batch in batches.items():
        produce(batch, 1)                                  # compile, or load the cache
        seconds = best(args.repeats, lambda batch=batch: produce(batch, args.batches))
        line(f"Produce: from_kafka, {name}", records, kafka_size * args.batches, seconds, bound)
    for name in ("none", "zstd"):
        stored = from_kafka(batches[name])
        run = np.concatenate([stored] * args.batches)
        assert to_kafka(run).size == kafka_size * args.batches
        seconds = best(args.repeats, lambda run=run: to_kafka(run))
        line(f"Fetch: to_kafka, stored {name}, whole run", records,
             kafka_size * args.batches, seconds, bound)
        cuts = read_cuts(run, stored.size)
        seconds = best(args.repeats, lambda run=run, cuts=cuts: fetch_in_reads(run, cuts))
        line(f"Fetch: to_kafka, stored {name}, 1 MiB reads", records,
             kafka_size * args.batches, seconds, bound)
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
