"""Throughput and latency of the same-host path, like Kafka's perf tools.

Used by ``shmlog perf produce|consume|e2e`` and by ``perf/bench_clients.py``.
Nothing here prints: progress goes to an optional callback, results are returned.
Every tool uses partition 0 of its topic; ``data_dir`` None means the default data
directory, as for the clients.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time
from typing import Callable

import numpy as np

from ..client.consumer import Consumer, TopicPartition
from ..client.producer import Producer
from ..common import limits
from ..common.paths import default_data_dir

__all__ = ["produce", "consume", "end_to_end"]

Progress = Callable[[int, float], None] | None
IDLE_TIMEOUT_MS_DEFAULT = limits.PERF_IDLE_TIMEOUT_MS


def _report(progress: Progress, done: int, started: float, last: list) -> None:
    now = time.perf_counter()
    if progress is not None and now - last[0] >= limits.PERF_PROGRESS_EVERY_S:
        last[0] = now
        progress(done, now - started)


def produce(data_dir: str | None, topic: str, records: int, record_size: int, *,
            batch_records: int = 0, acks: int = 1, ring_size: int | None = None,
            progress: Progress = None) -> dict:
    """Send ``records`` values of ``record_size`` bytes to partition 0: one ``send``
    per record, or ``send_batch`` of ``batch_records`` rows at a time, through a ring
    of ``ring_size`` bytes (None: the producer's default); the clock stops when the
    last one is acknowledged (acks=1) or in the ring (acks=0)."""
    rows = np.random.default_rng(0).integers(0, 256, (max(batch_records, 1000), record_size),
                                            np.uint8)
    values = [row.tobytes() for row in rows[:1000]]
    last = [time.perf_counter()]
    ring = {} if ring_size is None else {"ring_size": ring_size}
    with Producer(data_dir, acks=acks, **ring) as producer:
        started = time.perf_counter()
        futures = []
        sent = 0
        while sent < records:
            if batch_records:
                count = min(batch_records, records - sent)
                futures.append(producer.send_batch(topic, rows[:count], partition=0))
                sent += count
            else:
                futures.append(producer.send(topic, values[sent % 1000], partition=0))
                sent += 1
            if len(futures) >= 4096:
                futures[-1].get()                     # keep the futures list short
                futures = []
            _report(progress, sent, started, last)
        producer.flush()
        for future in futures[-1:]:
            future.get()
        seconds = time.perf_counter() - started
    return {"records": records, "bytes": records * record_size, "seconds": seconds,
            "records_per_s": records / seconds, "bytes_per_s": records * record_size / seconds}


def consume(data_dir: str | None, topic: str, records: int, *, batch: bool = False,
            timeout_ms: int = IDLE_TIMEOUT_MS_DEFAULT, progress: Progress = None) -> dict:
    """Read ``records`` from the start of partition 0: ``poll`` (record objects) or
    ``poll_batch`` (columns). Stops early when nothing arrives for ``timeout_ms`` (a
    topic shorter than ``records``); the clock stops at the last record read."""
    last = [time.perf_counter()]
    value_bytes = 0
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        started = finished = time.perf_counter()
        seen = 0
        while seen < records and time.perf_counter() - finished < timeout_ms / 1000:
            if batch:
                for columns in consumer.poll_batch(timeout_ms=limits.PERF_POLL_TIMEOUT_MS).values():
                    seen += len(columns)
                    value_bytes += int(columns.value_lengths.sum())
                    finished = time.perf_counter()
            else:
                for partition_records in consumer.poll(timeout_ms=limits.PERF_POLL_TIMEOUT_MS,
                                                       max_records=10_000).values():
                    seen += len(partition_records)
                    value_bytes += sum(len(record.value) for record in partition_records)
                    finished = time.perf_counter()
            _report(progress, seen, started, last)
        seconds = max(finished - started, 1e-9)
    return {"records": seen, "bytes": value_bytes, "seconds": seconds,
            "records_per_s": seen / seconds, "bytes_per_s": value_bytes / seconds}


_LATENCY_CONSUMER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from shmlog.client.consumer import Consumer, TopicPartition
    data_dir, topic, start, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    warmup = int(sys.argv[5])
    latencies = np.empty(count, np.int64)
    seen = -warmup
    with Consumer(bootstrap=data_dir) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), start)
        print("ready", flush=True)
        while seen < count:
            for columns in consumer.poll_batch(timeout_ms=1000).values():
                now = time.monotonic_ns()
                for index in range(len(columns)):
                    sent = int.from_bytes(columns.value(index)[:8], "little")
                    if 0 <= seen < count:
                        latencies[seen] = now - sent
                    seen += 1
    np.save(sys.stdout.buffer, latencies)
""")


def end_to_end(data_dir: str | None, topic: str, rate: int, seconds: float, record_size: int,
               *, linger_ms: int = 0, warmup_s: float = 1.0) -> dict:
    """Send ``rate`` records per second for ``warmup_s + seconds`` (each carrying its
    send time, CLOCK_MONOTONIC, which all processes on a host share); a consumer in
    another process records send-to-poll latency of those after the warm-up (which
    loads the compiled code and settles the processes). Returns percentiles in µs."""
    count = int(rate * seconds)
    warmup = int(rate * warmup_s)
    data_dir = data_dir or default_data_dir()       # the reader's argument list needs a path
    with Consumer(bootstrap=data_dir) as probe:
        start = probe.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    reader = subprocess.Popen([sys.executable, "-c", _LATENCY_CONSUMER, data_dir, topic,
                               str(start), str(count), str(warmup)],
                              stdout=subprocess.PIPE)
    try:
        assert reader.stdout.readline().strip() == b"ready"
        padding = bytes(max(record_size - 8, 0))
        with Producer(data_dir, linger_ms=linger_ms, acks=1) as producer:
            interval = 1 / rate
            began = time.perf_counter()
            for number in range(warmup + count):
                delay = began + number * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)             # a paced producer leaves the CPU to others
                producer.send(topic, time.monotonic_ns().to_bytes(8, "little") + padding,
                              partition=0)
            producer.flush()
        latencies = np.load(io.BytesIO(reader.stdout.read()))
        reader.wait(timeout=60)
    finally:
        reader.kill()
        reader.wait(timeout=30)
        reader.stdout.close()
    micros = latencies / 1000
    return {"records": count, "rate": rate,
            "p50_us": float(np.percentile(micros, 50)), "p99_us": float(np.percentile(micros, 99)),
            "p999_us": float(np.percentile(micros, 99.9)), "max_us": float(micros.max())}
