"""A consumer's cost per poll against the number of partitions assigned, one busy.

Goal
----
Issue 26 ("thousands of partitions per broker"): a consumer assigned every partition
of a broker pays per poll for the partitions that have data, not for every one
assigned. This measures the cost of a poll with 10 / 100 / 1,000 / ... partitions
assigned when one of them has records: it should not grow with the count.

Method
------
For each count a broker (a child process, on a data directory of its own) hosts one
topic of that many partitions (1 MiB segments: the busy partition reserves that
much, not a default segment's steps); a consumer in this process is assigned all of
them and takes its first poll (a full look at every partition) before the clock
starts. Then, with partition 0 holding ``--batches`` batches of ``--batch-records``
records of ``--record-size`` bytes (sent before the clock starts), and the consumer's
``fetch_max_bytes`` at 1 (each fetch takes one batch of a partition), the consumer
polls until it has taken them all or ``--seconds`` passed: the busy figure, each
poll timed (its median and mean printed: the median is the typical poll on a host
whose other work preempts some), with its records/s and the bytes/s beside
memcpy's. Then it polls with nothing new anywhere for ``--seconds``: the idle figure,
what a poll's every look costs while it waits (``wakeup.pause`` looks as often as it
can for a millisecond before it yields); its mean includes the full look at every
partition the fetcher takes once a second.

``measure(partitions, ...)`` is the measuring function (for perf/bench_scale.py);
``main`` prints a line per count and writes JSON. Run it on another tree's code by
copying this file and ``bounds.py`` into ``<tree>/perf``: it imports shmlog from the
tree it sits in, and its broker processes do too.

Limits: a broker holds ~6 file descriptors per partition (until the lead's branch
lowers that), so with this host's limit of 20,000 descriptors a count above ~3,000
does not fit; such a count is reported as not fitting, with the error that said so.

Measured on the 2-vCPU development VM while other work kept its load average at
30-50 (medians; a quiet host is faster, the shape is the same): before the journal
of changed rows (main at 9e54445) a busy poll took 87 us / 411 us / 15.9 ms / 80 ms
with 10 / 100 / 1,000 / 3,000 partitions assigned, and an idle one 32 us / 321 us /
24.5 ms / 76 ms, growing with every partition assigned; with it, a busy poll takes
52-72 us and an idle one 2.7-3.0 us at every count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402
from harness import REPOSITORY  # noqa: E402 - before shmlog: this checkout's, here and in children

from shmlog.client.admin import Admin  # noqa: E402
from shmlog.client.consumer import Consumer, TopicPartition  # noqa: E402
from shmlog.client.producer import Producer  # noqa: E402
from shmlog.common.errors import ShmlogError  # noqa: E402
from shmlog.server.broker import Broker, shared_memory_prefix  # noqa: E402
from shmlog.shm import shared_memory  # noqa: E402

COUNTS = (10, 100, 1000, 3000)
TOPIC = "many"
SEGMENT_BYTES = 1 << 20
# Partitions the broker hosts beside the topic's: __consumer_offsets' 50, and room.
OTHER_PARTITIONS = 100
# Creating thousands of partitions takes the broker seconds (three files each), more
# on a loaded host than a control request's default wait.
CREATE_TIMEOUT_MS = 300_000


def _send(data_dir: str, batches: int, batch_records: int, record_size: int) -> int:
    """``batches`` batches to partition 0, acknowledged; the bytes of record values."""
    values = np.random.default_rng(1).integers(0, 256, (batch_records, record_size), np.uint8)
    with Producer(data_dir) as producer:
        futures = [producer.send_batch(TOPIC, values, partition=0) for _ in range(batches)]
        for future in futures:
            future.get(timeout=60)
    return batches * batch_records * record_size


def _polls(consumer: Consumer, seconds: float, enough: int) -> tuple[np.ndarray, int, float]:
    """Poll (timeout 0) until ``enough`` records or ``seconds``: (each poll's time,
    records, s in all). Each poll is timed (a clock read per poll, not per record):
    its median is the typical cost on a host whose other work preempts some polls."""
    times = []
    records = 0
    started = now = time.perf_counter()
    deadline = started + seconds
    while records < enough and now < deadline:
        for batch in consumer.poll(timeout_ms=0).values():
            records += len(batch)
        before, now = now, time.perf_counter()
        times.append(now - before)
    return np.array(times), records, now - started


def measure(partitions: int, *, batches: int = 2000, batch_records: int = 10,
            record_size: int = 100, seconds: float = 1.0) -> dict:
    """One count's figures: per-poll cost busy (one partition with a batch for every
    poll) and idle, in seconds; records and bytes per second of the busy polls."""
    directory = tempfile.mkdtemp(prefix="shmlog-bench-poll-many-")
    data_dir = os.path.join(directory, "data")
    try:
        with Broker(data_dir, partitions_max=partitions + OTHER_PARTITIONS,
                    output=os.path.join(directory, "broker.log")):
            Admin(data_dir, timeout_ms=CREATE_TIMEOUT_MS).create_topic(
                TOPIC, partitions, config={"segment.bytes": SEGMENT_BYTES})
            with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                          fetch_max_bytes=1) as consumer:
                consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
                consumer.poll(timeout_ms=0)                  # the first, full look
                size = _send(data_dir, batches, batch_records, record_size)
                busy, records, busy_s = _polls(consumer, seconds, batches * batch_records)
                consumer.seek_to_end()
                consumer.poll(timeout_ms=0)
                idle, _, _ = _polls(consumer, seconds, 1)
        return {"partitions": partitions, "busy_poll_s": float(np.median(busy)),
                "busy_poll_mean_s": float(busy.mean()),
                "busy_records_per_s": records / busy_s,
                "busy_bytes_per_s": records * record_size / busy_s,
                "idle_poll_s": float(np.median(idle)), "idle_poll_mean_s": float(idle.mean()),
                "busy_polls": len(busy), "idle_polls": len(idle), "records": records,
                "bytes_sent": size}
    finally:
        for name in shared_memory.names(shared_memory_prefix(data_dir)):
            shared_memory.unlink(name)
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default=",".join(map(str, COUNTS)),
                        help="the counts of partitions assigned, comma-separated")
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--batch-records", type=int, default=10)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "bench_poll_many.json"))
    options = parser.parse_args(argv)
    bound = memcpy_rate()
    print(f"memcpy (np.copyto 256 MiB, best of 5): {bound / 1e9:.2f} GB/s")
    print(f"one busy partition: {options.batches} batches of {options.batch_records} x "
          f"{options.record_size} B, one batch a poll; code from {REPOSITORY}")
    results = []
    for count in (int(part) for part in options.partitions.split(",")):
        try:
            result = measure(count, batches=options.batches,
                             batch_records=options.batch_records,
                             record_size=options.record_size, seconds=options.seconds)
        except (ShmlogError, OSError) as error:
            print(f"{count:>6} partitions: does not fit on this host ({error})")
            results.append({"partitions": count, "error": str(error)})
            continue
        result["of_memcpy"] = result["busy_bytes_per_s"] / bound
        results.append(result)
        print(f"{count:>6} partitions: busy poll {result['busy_poll_s'] * 1e6:8.1f} us "
              f"(mean {result['busy_poll_mean_s'] * 1e6:8.1f}; "
              f"{result['busy_records_per_s'] / 1e6:6.3f} M records/s, "
              f"{result['busy_bytes_per_s'] / 1e6:6.1f} MB/s, {result['of_memcpy']:7.3%} "
              f"of memcpy), idle poll {result['idle_poll_s'] * 1e6:8.1f} us "
              f"(mean {result['idle_poll_mean_s'] * 1e6:8.1f})")
    print(f"load average (1, 5, 15 min) at the end: "
          f"{', '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs")
    os.makedirs(os.path.dirname(os.path.abspath(options.json)), exist_ok=True)
    with open(options.json, "w") as out:
        json.dump({"memcpy_bytes_per_s": bound, "results": results, "host": platform.node(),
                   "load": os.getloadavg(), "repository": REPOSITORY}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
