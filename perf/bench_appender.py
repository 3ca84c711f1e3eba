"""Ring -> appender -> log throughput across two processes, next to memcpy.

Goal
----
Measure the same-host data plane built so far: a producer process puts pre-encoded
batches (``--batch-records`` records of ``--record-size`` bytes) into its
shared-memory ring while this process runs the compiled appender, which validates
each batch after copying it into the partition's mapped segment, completes it and
publishes the high watermark. The project's goal for the whole path through the
Producer API (``send_batch`` >= 15 M records/s on a host where producer and broker
have a core each) is printed for orientation; this benchmark measures the ring and
the appender alone, with batches encoded before the clock starts.

Method
------
The segment is sized to hold the whole run and its pages are populated before the
clock starts ("pages ready"), so the figure is the data plane's own rate; a second
run appends into fresh pages, whose cost on this VM the log benchmark measures.
The producer waits for a "go" line, puts every batch (blocking when the ring is
full), and the run ends when the appender has completed them all. Prints records/s,
GB/s, the ratio to the same run's memcpy, and the host; writes JSON.

Expected on the 2-vCPU development VM (the producer and the appender each take one
core; memcpy ~17 GB/s), 10 M records of 100 B: 40-60 M records/s with pages ready
(5-7.5 GB/s, 30-45 % of memcpy; each batch is copied twice, into the ring and then
into the log, and checked once in the log), and 4-22 M records/s into new pages,
bounded by how fast this VM hands out fresh page-cache pages (see bench_log.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402

from shmlog import LogManager  # noqa: E402
from shmlog.broker.appender import Appender  # noqa: E402
from shmlog.record.records import encode_batch  # noqa: E402
from shmlog.ring import Ring  # noqa: E402
from shmlog.shm import shared_memory  # noqa: E402
from shmlog.shm.state import PartitionStateTable, unlink_table  # noqa: E402

MIB = 1 << 20
RING_SIZE = 16 * MIB

PRODUCER = textwrap.dedent("""
    import sys
    import numpy as np
    from shmlog.record.records import encode_batch
    from shmlog.ring import Ring
    ring = Ring.attach(sys.argv[1])
    batches_total, records, size = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    destination = tuple(map(int, sys.argv[5].split(":")))
    batch = encode_batch(np.random.default_rng(1).integers(0, 256, (records, size), np.uint8))
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(batches_total):
        ring.put(destination, batch, timeout_ms=60_000)
""")


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def run(records_total: int, batch_records: int, record_size: int, pages_ready: bool) -> dict:
    prefix = f"shmlog-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    directory = tempfile.mkdtemp(prefix="shmlog-bench-appender-")
    batches_total = records_total // batch_records
    batch_size = encode_batch(np.zeros((batch_records, record_size), np.uint8)).size
    segment_bytes = min(2**31 - 1, batches_total * batch_size + MIB)
    logs = LogManager(directory)
    table = PartitionStateTable.create(prefix + "-state", 4)
    producer = None
    try:
        logs.create_topic("bench", config={"segment.bytes": segment_bytes})
        appender = Appender(logs, table)
        tag = appender.register_partition("bench", 0)
        if pages_ready:
            logs.partition_log("bench", 0).active.reserve(batches_total * batch_size)
        ring = Ring.create(prefix + "-ring", RING_SIZE)
        appender.add_ring(Ring.attach(ring.name))
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, ring.name, str(batches_total),
                                     str(batch_records), str(record_size),
                                     ":".join(map(str, appender.destination("bench", 0)))],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert producer.stdout.readline().strip() == "ready"
        appender.drain()                                   # compiled code is loaded
        producer.stdin.write("go\n")
        producer.stdin.flush()
        start = time.perf_counter()
        handled = 0
        deadline = start + 600
        while handled < batches_total:
            count = appender.drain()
            handled += count
            if not count and time.perf_counter() > deadline:
                raise RuntimeError(f"stalled after {handled} batches")
        seconds = time.perf_counter() - start
        assert table.high_watermark(tag) == batches_total * batch_records
        assert producer.wait(timeout=60) == 0
        return {"pages_ready": pages_ready, "records": batches_total * batch_records,
                "bytes": batches_total * batch_size, "seconds": seconds}
    finally:
        if producer is not None:
            producer.kill()
            producer.wait(timeout=30)
        logs.close()
        table.close()
        unlink_table(prefix + "-state")
        shared_memory.unlink(prefix + "-ring")
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "bench_appender.json"))
    args = parser.parse_args(argv)
    bound = memcpy_rate()
    print(f"host: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
          f"python {platform.python_version()}, numpy {np.__version__}")
    print(f"memcpy (np.copyto 256 MiB, best of 5): {bound / 1e9:.2f} GB/s")
    results = []
    for pages_ready in (True, False):
        result = run(args.records, args.batch_records, args.record_size, pages_ready)
        rate = result["records"] / result["seconds"]
        bandwidth = result["bytes"] / result["seconds"]
        result.update(records_per_s=rate, bytes_per_s=bandwidth, of_memcpy=bandwidth / bound)
        results.append(result)
        label = "pages ready" if pages_ready else "new pages  "
        print(f"ring -> appender -> log, {label}: {rate / 1e6:6.2f} M records/s, "
              f"{bandwidth / 1e9:5.2f} GB/s, {bandwidth / bound:6.1%} of memcpy "
              f"(the goal for Producer.send_batch, encoding included: >= 15 M records/s)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as target:
        json.dump({"memcpy_bytes_per_s": bound, "results": results,
                   "host": platform.node(), "cores": os.cpu_count()}, target, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
