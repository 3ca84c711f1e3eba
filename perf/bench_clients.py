"""The client path one record per call, next to memcpy: ``Producer.send``,
``Consumer.poll``, iteration, their batch counterparts, and end-to-end latency.

Goal
----
Say how fast an application that logs the way applications log - one record per
call - moves records through shmlog on one host, in the workload the issue that set
these goals compares other systems on: records of 100 random bytes, one partition,
the broker (``shmlog.Broker``) a process of its own on the same host, and every
client a fresh process of its own. Each figure is printed beside the same run's
memcpy bandwidth (``bounds.memcpy_rate``) and beside its goal ("met" or "below");
a benchmark never asserts. The goals (``RATE_GOALS``, ``P50_GOAL_US``): per-record
``send`` >= 2 M records/s and e2e p50 <= 50 us, from the per-record client path's
issue; ``send_batch``, ``poll`` and ``poll_batch`` keep the design's goals for a host
where producer, broker and consumer have a core each; iteration must not be 4x
slower than ``poll``. The issue's other goals are ratios to other systems (a Kafka
client over TCP, Redis Streams) run on the same workload outside this project; the
JSON output (``--json``) holds the raw figures to compute them from.

Two figures say what a host with more cores would see (issue 29, step 3): the
aggregate rate of 1, 2 and 4 producer processes sending at once, and the broker's
appender draining rings alone, with no producer running beside it. They have no
goal: they are printed beside memcpy and the host's core count (on two cores,
more than one producer beside the appender cannot scale).

Method
------
One broker for the whole run; one topic per figure, created up front.

* ``send``, linger 0 ms and 5 ms: a producer process (acks=1, ``partition=0``
  given) calls ``send`` once per value of ``--records`` distinct random values made
  before the clock starts; the clock runs from the first ``send`` until the last
  future resolved (``flush`` then ``get``).
* ``send_batch``: 10 x ``--records`` rows in batches of 1000 (``shmlog.devtools.perf.produce``,
  the ``shmlog perf produce`` tool).
* ``poll``: a fresh consumer process (``auto_offset_reset="earliest"``) calls
  ``poll(timeout_ms=500, max_records=10_000)`` and touches every record's value
  (``for r in recs: n += len(r.value)``) until it has read the linger-5 run's records.
* iteration: another fresh consumer reads the same records with ``for record in
  consumer`` (``consumer_timeout_ms`` bounds an idle wait), touching every value.
* ``poll_batch``: columns of the ``send_batch`` run (``shmlog.devtools.perf.consume``).
  The consumers' clocks start once the consumer is constructed and stop at the
  last record read; the constructors' own times are in the JSON (``construct_s``).
* e2e latency: a consumer process (``poll`` as above) is started and waits on an
  empty topic; then a producer process (linger 0, acks=1) is started and at once
  sends 10 000 records/s for 5 s, paced by the clock (every 0.5 ms it sends those
  due: the same pacing as the systems it is compared with). Value bytes 0-7 are
  ``time.monotonic_ns()`` at the send (CLOCK_MONOTONIC is one clock for every process
  on the host); the consumer takes the time once per ``poll`` that returned records.
  Percentiles p50/p99/p99.9/max for the whole run, for the records sent in its
  first second (the processes' start-up shows there: kernels loaded, pages first
  touched) and for those sent after it.

* producer scaling: for N = 1, 2 and 4, a fresh topic of N partitions and N producer
  processes (acks=1), producer i sending to partition i - what a Kafka user runs to
  read "aggregate producer throughput": one topic, as many partitions as producers,
  none waiting on another's partition. Each producer appends one batch (one record
  with ``send``) first, which makes its partition's segment and populates its first
  pages, as in a log already running. The records are split evenly, each producer
  sending ``--records // N`` with ``send`` (linger ``SCALE_LINGER_MS``: the "linger
  5 ms" figure's) or 10 x ``--records // N`` with ``send_batch`` (1000 rows of 100
  B a call), so every N moves as many records. Each producer, constructed and its
  topic's route read, says "ready" and waits; once all are ready the parent takes
  the time (CLOCK_MONOTONIC, every process's) and writes "go" to each one's stdin;
  the figure runs to the last producer's last acknowledgement (``flush`` then
  ``get``). Printed: the aggregate rate, the mean of each producer's own rate (its
  "go" to its last acknowledgement) and the ratio to one producer's aggregate. The
  topic is deleted after its figure.
* appender drain alone: ``--records`` records in batches of 1000 x 100 B, in
  ceil(``--records`` / 256 000) rings (a stopped broker completes nothing, and a
  producer has at most ``COMPLETION_SLOTS`` = 256 entries unacknowledged), the
  records split evenly, each ring sized to hold its share, all bound for partition
  0 of a fresh topic (one partition: the appender is one thread, and a Kafka user
  reads "how fast can the broker take one partition's burst"). A filler process
  makes the producers and appends one batch (the partition's segment made); then
  the parent stops the real broker process (SIGSTOP), the filler puts every batch
  into the rings and says "filled", and the clock runs from the broker's SIGCONT
  until the partition's high watermark (read from the state table, waiting on the
  consumers' doorbell the broker rings after each drain that appended) covers
  every record. The broker is resumed whatever happens. Twice (``DRAIN_ROUNDS``):
  first with the partition idle before, then right after that first drain - the
  figure of a partition kept busy, which a host with many producers' cores sees:
  a partition keeps room reserved and populated ahead of its writes at a distance
  that follows its write rate (``storage/reservation.py``), least for one idle
  before, most right after a burst. Printed in records/s, value GB/s beside
  memcpy, and the batches' GB/s (what the appender copies into the log: 128 B a
  record).

Beside each figure, "others": how many cores processes other than the benchmark's
own (itself, its clients, its broker) kept busy meanwhile, from /proc/stat; above
``OTHER_CORES_WARNING`` the report says the machine was not quiet. For the scaling
figures it covers the producers' start-up too, and for the drain the filler's whole
run (a drain of ``--quick``'s size is shorter than /proc/stat's clock ticks).

Every wait is bounded: each client process by ``CHILD_TIMEOUT_S`` (then killed),
each loop inside by a deadline, each line a process waits for from another (a
"ready", a "go") by ``READY_TIMEOUT_S`` or ``LOOP_DEADLINE_S``. The broker's data
directory (a temporary one) and its /dev/shm objects are removed at the end, also
when something failed or a SIGTERM came. ``--quick`` runs tiny counts (a smoke test
of the script: its figures are mostly start-up).

Expected figures and what bounds them
-------------------------------------
Runs of the defaults on the 2-vCPU development VM (AMD EPYC, CPython 3.11 without
optimisations: an empty method call ~110 ns, a slotted object ~250 ns), November
2026, "others" as printed. Before the per-record rewrite (72852a5, memcpy
13.6 GB/s, other work on the machine) and after it (cfa5ebf, 16.7 GB/s, quiet):

=====================================  ===========  ===========  =========  ==================
figure                                 before       after        of memcpy  goal
=====================================  ===========  ===========  =========  ==================
send, acks=1, linger 0 ms              0.043 M/s    0.39 M/s     0.24 %     >= 2 M/s: below
send, acks=1, linger 5 ms              0.19 M/s     0.55 M/s     0.33 %     >= 2 M/s: below
send_batch, 1000 per call              1.6 M/s      2.1 M/s      1.3 %      >= 15 M/s: below
poll, record objects                   0.33 M/s     1.15 M/s     0.68 %     >= 3 M/s: below
iteration                              0.053 M/s    0.80 M/s     0.48 %     > 1/4 of poll: met
poll_batch                             25 M/s       21 M/s       13 %       >= 50 M/s: below
=====================================  ===========  ===========  =========  ==================

e2e latency at 10 000 records/s, p50 / p99 / max, after the rewrite (before): whole
run 547 us / 3.5 ms / 25 ms (370 us / 15.5 ms / 223 ms); first second 577 us /
12.9 ms / 25 ms (561 us / 23.8 ms / 223 ms); after it 539 us / 2.0 ms / 11 ms
(340 us / 1.6 ms / 10 ms). Latency varies by +-30 % from run to run here.

What bounds each figure on two vCPUs (profiled):

* ``send``: CPython. A call is ~1 us of bytecode and nothing compiled: of it ~0.16 us
  the producer's lock, ~0.16 us the future, ~0.08 us the type checks, ~0.06 us the
  clock, the rest the call and the batch's bookkeeping; shipping a 16 KiB batch
  costs ~30 us (~0.25 us a 100-byte record: lengths and timestamps out of Python
  lists, one encoding call, the ring put). The broker's appender takes the other
  core. With linger 0 ms a record ships at once when nothing of its partition waits
  in the ring, and records sent meanwhile ship together (Kafka's sender), so a busy
  producer does not pay a batch's fixed cost per record.
* ``send_batch``: three consumers of CPU on two cores - the producer encoding, the
  appender copying, and the segment's fresh page-cache pages. Those are the bound
  on this VM: its host backs a guest page only when it is first touched, and takes
  back what the guest frees or leaves idle for a minute (virtio-balloon free page
  reporting, a DAMON pageout scheme), so the first write of a page costs a host
  fault. ``np.ones`` over 6 GiB ran at 0.43 GiB/s the first time and 14 GiB/s
  straight after (2026-11-29). Profiled then (``perf record -a``, four 1 GB runs of
  ``send_batch`` in a row: 15.6, 14.1, 5.1, 2.9 M/s), 36 % of both cores went to
  ``copy_folio_from_iter_atomic`` under the prefaulter's ``pwrite`` of zeros: the
  first touch of each page, not the copy. The report prints this run's first-touch
  rate (``bounds.first_touch_rate``) beside memcpy; with the pages backed,
  ``send_batch`` runs at 14-18 M/s.
* ``poll``: CPython object churn. A poll makes records only for what it returns,
  with C-level operations (records.py): per record ~0.16 us for the named tuple,
  ~0.06 us for its own headers list, ~0.03 us for the value, then the garbage
  collector's pass over those two tracked objects and freeing them.
* iteration: a poll's fixed cost per chunk of at most 250 records (a chunk that
  keeps the garbage collector's youngest generation below its threshold) plus
  ~30 ns a record for the generator.
* ``poll_batch``: reading each record's bytes from memory once. Per 100-byte record
  (py-spy and timers over 10 M records, 1 MiB reads, 28 M/s): ~20 ns the first
  read's CRC32C of each batch (``collect_batches``; of it ~4.5 ns the kernel mapping
  the page-cache pages on first touch, the rest memory bandwidth, ~11 GB/s here),
  ~10 ns the column decode (one walk that checks and indexes the records, from the
  last-level cache where the CRC left them) and a few ns of per-fetch Python.
* latency: producer, broker and consumer share two vCPUs, so one of them is always
  waiting for a CPU, and waking a process whose vCPU went idle takes 15-90 us on
  this VM (a bare futex ping-pong measures the same). In the first second no kernel
  is loaded any more (every client and the broker load theirs when made); its
  tail is the new partition's first append, which reserves and populates the
  segment's first 8 MiB inline (~10-25 ms here) and has the prefaulter populate
  32 MiB more beside the three processes.

Producer scaling and the drain alone, two runs of the defaults on the 2-vCPU VM, by
then on an Intel Xeon host (memcpy 12.2 GB/s), November 2026: the first
(e60d67f: one drain round) with others <= 0.2 cores in every scaling figure, the
second (162bfe4) with others ~0.9 cores during the "2 producers" rows and 0.7
during the drain:

=========================================  =============  =============  ===========
figure                                     first run      second run     of memcpy
=========================================  =============  =============  ===========
1 producer, send, linger 5 ms              1.45 M/s       1.11 M/s       0.9-1.2 %
2 producers, send (each)                   1.83 (0.99)    1.03 (0.54)    0.8-1.5 %
4 producers, send (each)                   2.14 (0.55)    1.61 (0.46)    1.3-1.8 %
1 producer, send_batch, 1000 per call      7.53 M/s       7.38 M/s       6.0-6.2 %
2 producers, send_batch (each)             10.1 (5.08)    6.16 (3.14)    5.0-8.3 %
4 producers, send_batch (each)             10.0 (2.61)    10.3 (2.79)    8.2-8.4 %
drain, the partition idle before           8.65 M/s       9.14 M/s       7.1-7.5 %
drain, right after another                 -              11.7 M/s       9.6 %
=========================================  =============  =============  ===========

* producer scaling: two cores. A per-record producer is a CPython loop on one core;
  the appender needs little of the other for 16 KiB batches, so a second producer
  adds ~0.4 M/s and four take turns on the two cores. With ``send_batch`` one
  producer's encoding, the appender's copy and the kernel populating the segments'
  fresh pages (~1-1.3 GB/s of batches on this VM) share the two cores; a second
  producer takes what the first left idle (x1.3 when the machine is quiet), four
  take no more. The last of four producers gets its "go" 5-12 ms after the first
  (``start_spread_s`` in the JSON), inside the figure.
* drain alone: the segment's fresh pages. Profiles of the broker during a drain
  (``perf record -g -p``, 5 kHz; shares of all its samples): the partition idle
  before, 72 % in its prefaulter thread, nearly all the kernel's memset of new
  page-cache pages (``MADV_POPULATE_WRITE``), and 27 % in the appender's thread:
  19 % kernel (faulting in and zeroing the pages the prefaulter had not reached),
  4 % memmove (the copy into the segment), 3 % compiled kernels, 1.4 % Python.
  Right after another drain, 56 % in the prefaulter (the kernel populating page
  cache) and 40 % in the appender: 17 % memmove, 8 % kernel, 8 % compiled kernels
  (validation, CRC), 4.5 % Python. The appender waits on the pages: 1.2-1.5 GB/s
  of batches is how fast this VM hands out page cache, and a partition idle
  before keeps the least reserved ahead and stalls while its pace doubles. With
  pages populated before the clock, bench_appender.py's appender runs at 40-60 M
  records/s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness  # noqa: E402 - before shmlog: this checkout's, here and in children
from harness import REPOSITORY  # noqa: E402

RECORD_SIZE = 100
STAMP_SIZE = 8                      # value bytes 0-7: time.monotonic_ns() at the send
RECORDS_DEFAULT = 1_000_000
BATCH_RECORDS = 1000                # rows per send_batch call
BATCH_RUN_FACTOR = 10               # send_batch/poll_batch move this many times --records
POLL_TIMEOUT_MS = 500
POLL_RECORDS_MAX = 10_000
ITERATION_IDLE_MS = 10_000          # consumer_timeout_ms: the longest wait for a record
LATENCY_RATE = 10_000               # records/s
LATENCY_SECONDS = 5.0
FIRST_SECOND_NS = 1_000_000_000
PACING_S = 0.0005                   # the paced producer sends what is due this often
CHILD_TIMEOUT_S = 600.0             # a client process's whole run, start-up included
READY_TIMEOUT_S = 120.0             # a latency consumer's start-up (a cold numba cache)
LOOP_DEADLINE_S = 300.0             # a client's own loop, inside CHILD_TIMEOUT_S
# Other processes keeping more cores than this busy during a figure skew it: the
# report says so (as bench_log.py does).
OTHER_CORES_WARNING = 0.2
QUICK = {"records": 2_000, "latency_rate": 1_000, "latency_seconds": 1.5}
SCALE_PRODUCERS = (1, 2, 4)         # producer processes sending at once
SCALE_LINGER_MS = 5                 # the per-record scaling figure's: the "linger 5 ms" row's
# The drain figure's rounds: the partition idle before (it was written once, and
# keeps its least reserved ahead), then right after the first (its most).
DRAIN_ROUNDS = ("after_idle", "after_a_drain")
DRAIN_FILL_BLOCK_MS = 2_000         # a fill that finds its ring full fails this fast
DRAIN_WAKE_S = 0.1                  # the drain's watcher looks again at least this often

TOPICS = ("send_linger_0", "send_linger_5", "send_batch", "latency")
# records/s. Per-record send: issue 12's goal. The others: the design's, for a host
# where producer, broker and consumer have a core each.
RATE_GOALS = {"send_linger_0": 2e6, "send_linger_5": 2e6, "send_batch": 15e6,
              "poll": 3e6, "poll_batch": 50e6}
ITERATION_SHARE_OF_POLL_GOAL = 0.25  # issue 12: iteration not 4x slower than poll
P50_GOAL_US = 50.0
LABELS = {"send_linger_0": "send, acks=1, linger 0 ms",
          "send_linger_5": "send, acks=1, linger 5 ms",
          "send_batch": f"send_batch, {BATCH_RECORDS} per call",
          "poll": "poll, record objects",
          "iteration": "iteration (for record in consumer)",
          "poll_batch": "poll_batch, columns"}
SCALE_LABELS = {"send": f"send, acks=1, linger {SCALE_LINGER_MS} ms",
                "send_batch": f"send_batch, {BATCH_RECORDS} per call"}
DRAIN_LABELS = {"after_idle": "drain, the partition idle before",
                "after_a_drain": "drain, right after another"}
SPANS = (("whole", "whole run"), ("first_second", "first second"),
         ("after_first_second", "after the first second"))


# --- the client processes (each prints one JSON line: its figures) -------------------

def _rate(records: int, value_bytes: int, seconds: float, construct_s: float) -> dict:
    seconds = max(seconds, 1e-9)
    return {"records": records, "bytes": value_bytes, "seconds": seconds,
            "records_per_s": records / seconds, "bytes_per_s": value_bytes / seconds,
            "construct_s": construct_s}


def _ring(ring_size: int | None) -> dict:
    return {} if ring_size is None else {"ring_size": ring_size}


def send_records(data_dir: str, topic: str, records: int, linger_ms: int,
                 ring_size: int | None = None) -> dict:
    """One ``send`` per record; the clock stops when the last future resolved."""
    from shmlog import Producer
    entropy = os.urandom(records * RECORD_SIZE)
    values = [entropy[start:start + RECORD_SIZE]
              for start in range(0, len(entropy), RECORD_SIZE)]
    constructing = time.perf_counter()
    with Producer(data_dir, acks=1, linger_ms=linger_ms, **_ring(ring_size)) as producer:
        started = time.perf_counter()
        for value in values:
            future = producer.send(topic, value, partition=0)
        producer.flush(timeout=LOOP_DEADLINE_S)
        future.get(timeout=LOOP_DEADLINE_S)
        seconds = time.perf_counter() - started
    return _rate(records, records * RECORD_SIZE, seconds, started - constructing)


def send_batches(data_dir: str, topic: str, records: int, ring_size: int | None = None) -> dict:
    from shmlog.devtools import perf
    return perf.produce(data_dir, topic, records, RECORD_SIZE, batch_records=BATCH_RECORDS,
                        ring_size=ring_size)


def poll_records(data_dir: str, topic: str, records: int) -> dict:
    """``poll`` until ``records`` were read, touching every value."""
    from shmlog import Consumer
    seen = value_bytes = 0
    constructing = time.perf_counter()
    with Consumer(topic, bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        started = finished = time.perf_counter()
        deadline = started + LOOP_DEADLINE_S
        while seen < records and time.perf_counter() < deadline:
            for partition_records in consumer.poll(timeout_ms=POLL_TIMEOUT_MS,
                                                   max_records=POLL_RECORDS_MAX).values():
                for record in partition_records:
                    value_bytes += len(record.value)
                seen += len(partition_records)
                finished = time.perf_counter()
    return _rate(seen, value_bytes, finished - started, started - constructing)


def iterate_records(data_dir: str, topic: str, records: int) -> dict:
    """``for record in consumer`` until ``records`` were read (or none came for
    ``ITERATION_IDLE_MS``), touching every value."""
    from shmlog import Consumer
    seen = value_bytes = 0
    constructing = time.perf_counter()
    with Consumer(topic, bootstrap=data_dir, auto_offset_reset="earliest",
                  consumer_timeout_ms=ITERATION_IDLE_MS) as consumer:
        started = finished = time.perf_counter()
        for record in consumer:
            value_bytes += len(record.value)
            seen += 1
            if seen >= records:
                break
        # Iteration that ran dry ended with an idle wait the rate must not count.
        finished = time.perf_counter() - (ITERATION_IDLE_MS / 1000 if seen < records else 0)
    return _rate(seen, value_bytes, finished - started, started - constructing)


def poll_batches(data_dir: str, topic: str, records: int) -> dict:
    from shmlog.devtools import perf
    return perf.consume(data_dir, topic, records, batch=True)


def latency_consumer(data_dir: str, topic: str, records: int, wait_s: float) -> dict:
    """Say "ready" once constructed, then ``poll`` until ``records`` came (or
    ``wait_s`` passed); the latency of each, split at the first second."""
    import numpy as np

    from shmlog import Consumer
    sent = np.zeros(records, np.int64)
    received = np.zeros(records, np.int64)
    seen = 0
    with Consumer(topic, bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        print("ready", flush=True)
        deadline = time.monotonic() + wait_s
        while seen < records and time.monotonic() < deadline:
            for partition_records in consumer.poll(timeout_ms=POLL_TIMEOUT_MS,
                                                   max_records=POLL_RECORDS_MAX).values():
                now = time.monotonic_ns()
                for record in partition_records[:records - seen]:
                    sent[seen] = int.from_bytes(record.value[:STAMP_SIZE], "little")
                    received[seen] = now
                    seen += 1
    sent, received = sent[:seen], received[:seen]
    latencies = received - sent
    first = sent - (sent[0] if seen else 0) < FIRST_SECOND_NS
    return {"received": seen, "whole": _percentiles(latencies),
            "first_second": _percentiles(latencies[first]),
            "after_first_second": _percentiles(latencies[~first])}


def _percentiles(latencies_ns) -> dict:
    import numpy as np
    if not len(latencies_ns):
        return {"count": 0}
    micros = latencies_ns / 1000
    return {"count": int(len(micros)), "p50_us": float(np.percentile(micros, 50)),
            "p99_us": float(np.percentile(micros, 99)),
            "p999_us": float(np.percentile(micros, 99.9)), "max_us": float(micros.max())}


def latency_producer(data_dir: str, topic: str, rate: int, seconds: float) -> dict:
    """``rate`` records/s for ``seconds``, each stamped with its send time."""
    from shmlog import Producer
    count = int(rate * seconds)
    tails = [os.urandom(RECORD_SIZE - STAMP_SIZE) for _ in range(1024)]
    sent = 0
    with Producer(data_dir, acks=1, linger_ms=0) as producer:
        started = time.monotonic()
        deadline = started + seconds * 3 + 10          # a producer that falls far behind
        while sent < count and time.monotonic() < deadline:
            due = min(count, int((time.monotonic() - started) * rate) + 1)
            while sent < due:
                producer.send(topic, time.monotonic_ns().to_bytes(STAMP_SIZE, "little") +
                              tails[sent % len(tails)], partition=0)
                sent += 1
            time.sleep(PACING_S)
        elapsed = time.monotonic() - started
        producer.flush(timeout=LOOP_DEADLINE_S)
    return {"sent": sent, "achieved_rate": sent / elapsed}


def _await_command(expected: bytes, timeout_s: float) -> None:
    """In a client process: wait for the parent's line ``expected`` on stdin."""
    _await_line(sys.stdin.fileno(), expected, timeout_s, "the benchmark")


def scale_producer(data_dir: str, topic: str, partition: int, records: int,
                   batch_records: int) -> dict:
    """One of the producers started together: constructed, and its first record
    (or batch) appended, it says "ready" and waits for "go"; then ``records`` to
    ``partition``, one ``send`` per record (linger ``SCALE_LINGER_MS``) or
    ``send_batch`` of ``batch_records`` rows, until the last is acknowledged. Its
    start and finish on CLOCK_MONOTONIC, which the parent shares."""
    import numpy as np

    from shmlog import Producer
    if batch_records:
        rows = np.random.default_rng(partition).integers(
            0, 256, (batch_records, RECORD_SIZE), np.uint8)
    else:
        entropy = os.urandom(records * RECORD_SIZE)
        values = [entropy[start:start + RECORD_SIZE]
                  for start in range(0, len(entropy), RECORD_SIZE)]
    with Producer(data_dir, acks=1, linger_ms=SCALE_LINGER_MS) as producer:
        # The partition's segment made and its first pages populated before "go", as
        # in a log already running (the appender does that inline, ~10-25 ms here).
        if batch_records:
            producer.send_batch(topic, rows, partition=partition).get(timeout=LOOP_DEADLINE_S)
        else:
            producer.send(topic, values[0], partition=partition).get(timeout=LOOP_DEADLINE_S)
        print("ready", flush=True)
        _await_command(b"go", READY_TIMEOUT_S)
        started = time.monotonic()
        if batch_records:
            for first in range(0, records, batch_records):
                future = producer.send_batch(
                    topic, rows[:min(batch_records, records - first)], partition=partition)
        else:
            for value in values:
                future = producer.send(topic, value, partition=partition)
        producer.flush(timeout=LOOP_DEADLINE_S)
        future.get(timeout=LOOP_DEADLINE_S)
        finished = time.monotonic()
    return {"records": records, "started": started, "finished": finished}


def drain_filler(data_dir: str, topic: str, rings: int, records_per_ring: int,
                 rounds: int) -> dict:
    """The drain figure's producers, ``rings`` of them in this process. One batch is
    appended first (the partition's segment made and its first pages populated);
    then, ``rounds`` times: "ready", and on "fill" (the broker is stopped) each ring
    gets ``records_per_ring`` in batches of ``BATCH_RECORDS`` without waiting;
    "filled"; on "drained" every batch's acknowledgement is checked (which frees the
    rings' completion slots for the next round)."""
    import numpy as np

    from shmlog import Producer
    rows = np.random.default_rng(0).integers(0, 256, (BATCH_RECORDS, RECORD_SIZE), np.uint8)
    ring_size = drain_ring_size(rows, records_per_ring)
    producers, batch_bytes = [], []
    try:
        for _ in range(rings):
            producers.append(Producer(data_dir, acks=1, ring_size=ring_size,
                                      max_block_ms=DRAIN_FILL_BLOCK_MS))
            producers[-1].batch_bytes_max(topic)
        producers[0].send_batch(topic, rows, partition=0).get(timeout=LOOP_DEADLINE_S)
        for _ in range(rounds):
            before = sum(_bytes_put(producer) for producer in producers)
            print("ready", flush=True)
            _await_command(b"fill", READY_TIMEOUT_S)
            last = []
            for producer in producers:
                for first in range(0, records_per_ring, BATCH_RECORDS):
                    future = producer.send_batch(
                        topic, rows[:min(BATCH_RECORDS, records_per_ring - first)], partition=0)
                last.append(future)
            batch_bytes.append(sum(_bytes_put(producer) for producer in producers) - before)
            print("filled", flush=True)
            _await_command(b"drained", LOOP_DEADLINE_S)
            for producer, future in zip(producers, last):
                producer.flush(timeout=LOOP_DEADLINE_S)
                future.get(timeout=LOOP_DEADLINE_S)
    finally:
        for producer in producers:
            producer.close(timeout=LOOP_DEADLINE_S)
    return {"rings": rings, "ring_size": ring_size, "batch_bytes": batch_bytes,
            "warm_up_records": BATCH_RECORDS}


def drain_ring_size(rows, records_per_ring: int) -> int:
    """The smallest ring (a power of two) that holds ``records_per_ring`` records in
    entries of ``rows`` as a batch, and one entry more: an entry does not wrap, so
    the space left at the region's end when the next does not fit is padding."""
    from shmlog.record.records import encode_batch
    from shmlog.shm import ring_layout
    entry = ring_layout.aligned_entry_size(encode_batch(rows, None, None).size)
    needed = (-(-records_per_ring // len(rows)) + 1) * entry
    return max(ring_layout.CAPACITY_MIN, 1 << (needed - 1).bit_length())


def _bytes_put(producer) -> int:
    """The bytes of the batches ``producer`` put into its ring (what the appender
    copies into the log)."""
    return producer.metrics()["producer-metrics"]["byte-total"]


ROLES = {function.__name__: function for function in (
    send_records, send_batches, poll_records, iterate_records, poll_batches,
    latency_consumer, latency_producer, scale_producer, drain_filler)}


# --- running them --------------------------------------------------------------------

def _start(role: str, commanded: bool = False, **arguments) -> subprocess.Popen:
    """A client process; ``commanded``: its stdin a pipe the parent writes commands
    to (``_command``)."""
    # Unbuffered: the parent reads the "ready" line byte by byte, leaving the rest
    # in the pipe for communicate().
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                             "--arguments", json.dumps(arguments)],
                            stdout=subprocess.PIPE, bufsize=0,
                            stdin=subprocess.PIPE if commanded else None)


def _command(process: subprocess.Popen, command: bytes) -> None:
    process.stdin.write(command + b"\n")


def _finish(process: subprocess.Popen, role: str, timeout_s: float = CHILD_TIMEOUT_S) -> dict:
    """The figures ``process`` printed; it is killed if not done within ``timeout_s``."""
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{role} did not finish within {timeout_s} s") from None
    finally:
        _stop(process)
    if process.returncode != 0:
        raise RuntimeError(f"{role} exited with status {process.returncode} (its errors "
                           f"are above)")
    return json.loads(output.splitlines()[-1])


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)
    for pipe in (process.stdin, process.stdout):
        if pipe:
            pipe.close()


def _await_line(descriptor: int, expected: bytes, timeout_s: float,
                sender: str = "a client process") -> None:
    """Read a line from ``descriptor`` byte by byte (what follows stays in the
    pipe: a client's figures, which ``communicate`` reads) and check it is
    ``expected``."""
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([descriptor], [], [], left)[0]:
            raise RuntimeError(f"no {expected!r} from {sender} within {timeout_s} s")
        byte = os.read(descriptor, 1)
        if not byte:
            raise RuntimeError(f"{sender} closed its pipe (it exited: its errors are "
                               f"above) before saying {expected!r}")
        line += byte
    if line.strip() != expected:
        raise RuntimeError(f"{sender} said {line!r}, expected {expected!r}")


def run(role: str, **arguments) -> dict:
    return _finish(_start(role, **arguments), role)


def end_to_end(data_dir: str, rate: int, seconds: float) -> dict:
    """The latency consumer, ready; then the paced producer; both fresh processes."""
    count = int(rate * seconds)
    consumer = _start("latency_consumer", data_dir=data_dir, topic="latency", records=count,
                      wait_s=seconds * 3 + 30)
    producer = None
    try:
        _await_line(consumer.stdout.fileno(), b"ready", READY_TIMEOUT_S)
        producer = _start("latency_producer", data_dir=data_dir, topic="latency", rate=rate,
                          seconds=seconds)
        produced = _finish(producer, "latency_producer")
        return {"rate": rate, "seconds": seconds, "linger_ms": 0, **produced,
                **_finish(consumer, "latency_consumer")}
    finally:
        for process in (consumer, producer):
            if process is not None:
                _stop(process)


def _cpu_seconds(pid: int) -> float:
    """CPU time a running process has used (utime + stime of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """How many cores processes other than this benchmark's (itself, its clients,
    its broker) kept busy over a figure: on a shared machine they skew it."""

    def __init__(self, broker_pid: int):
        self.broker_pid = broker_pid
        self.started = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        from bench_log import system_busy_seconds
        own = sum(getattr(resource.getrusage(who), field)
                  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                  for field in ("ru_utime", "ru_stime"))  # clients count once waited for
        return time.perf_counter(), system_busy_seconds(), own + _cpu_seconds(self.broker_pid)

    def cores(self) -> float:
        (started, busy_started, own_started), (now, busy, own) = self.started, self._sample()
        return max(0.0, (busy - busy_started) - (own - own_started)) / max(now - started, 1e-9)


def measure(data_dir: str, broker_pid: int, records: int, rate: int, seconds: float,
            ring_size: int | None = None) -> dict:
    from shmlog import Admin
    admin = Admin(data_dir)
    for topic in TOPICS:
        admin.create_topic(topic)
    batch_records = records * BATCH_RUN_FACTOR
    # figure: (client role, its arguments); the consumers read what the producers sent.
    plan = {"send_linger_0": ("send_records", {"topic": "send_linger_0", "records": records,
                                               "linger_ms": 0, "ring_size": ring_size}),
            "send_linger_5": ("send_records", {"topic": "send_linger_5", "records": records,
                                               "linger_ms": 5, "ring_size": ring_size}),
            "send_batch": ("send_batches", {"topic": "send_batch", "records": batch_records,
                                            "ring_size": ring_size}),
            "poll": ("poll_records", {"topic": "send_linger_5", "records": records}),
            "iteration": ("iterate_records", {"topic": "send_linger_5", "records": records}),
            "poll_batch": ("poll_batches", {"topic": "send_batch", "records": batch_records})}
    results = {}
    for name, (role, arguments) in plan.items():
        others = OtherLoad(broker_pid)
        results[name] = run(role, data_dir=data_dir, **arguments)
        results[name]["other_cores"] = others.cores()
        results[name]["records_planned"] = arguments["records"]
    others = OtherLoad(broker_pid)
    results["e2e"] = end_to_end(data_dir, rate, seconds)
    results["e2e"]["other_cores"] = others.cores()
    return results


def producer_scaling(data_dir: str, broker_pid: int, producers: int, records: int,
                     batch_records: int) -> dict:
    """``producers`` processes at once, each ``records // producers`` to a partition
    of its own of a fresh topic; timed from the parent's "go" (every one ready) to
    the last acknowledgement. The topic is deleted afterwards (its files go)."""
    from shmlog import Admin
    topic = f"scale_{'batch' if batch_records else 'send'}_{producers}"
    admin = Admin(data_dir)
    admin.create_topic(topic, producers)
    share = max(1, records // producers)
    others = OtherLoad(broker_pid)       # the producers' start-up inside: their CPU counts
    processes = []
    try:
        for partition in range(producers):
            processes.append(_start("scale_producer", commanded=True, data_dir=data_dir,
                                    topic=topic, partition=partition, records=share,
                                    batch_records=batch_records))
        for process in processes:
            _await_line(process.stdout.fileno(), b"ready", READY_TIMEOUT_S)
        started = time.monotonic()
        for process in processes:
            _command(process, b"go")
        each = [_finish(process, "scale_producer") for process in processes]
    finally:
        for process in processes:
            _stop(process)
    other_cores = others.cores()
    admin.delete_topic(topic)
    moved = sum(result["records"] for result in each)
    result = _rate(moved, moved * RECORD_SIZE, max(r["finished"] for r in each) - started, 0.0)
    del result["construct_s"]
    return {**result, "producers": producers, "records_planned": share * producers,
            "per_producer_records_per_s": [r["records"] / max(r["finished"] - r["started"], 1e-9)
                                           for r in each],
            "start_spread_s": max(r["started"] for r in each) - started,
            "other_cores": other_cores}


def appender_drain(data_dir: str, broker_pid: int, records: int) -> dict:
    """Rings filled while the broker is stopped (SIGSTOP), then drained, once per
    ``DRAIN_ROUNDS``: each timed from the broker's SIGCONT until the partition's high
    watermark covers every record."""
    from shmlog import Admin, Consumer, TopicPartition
    from shmlog.protocol.control_client import request
    from shmlog.shm.ring_layout import COMPLETION_SLOTS
    from shmlog.shm.state import PartitionStateTable
    Admin(data_dir).create_topic("drain")
    # A stopped broker completes nothing: a ring holds at most COMPLETION_SLOTS entries.
    per_ring_max = COMPLETION_SLOTS * BATCH_RECORDS
    rings = -(-records // per_ring_max)
    per_ring = -(-records // rings)
    partition = TopicPartition("drain", 0)
    # Over the filler's whole run (waited for): a drain of --quick's size is shorter
    # than the clock ticks /proc/stat counts in.
    others = OtherLoad(broker_pid)
    filler = _start("drain_filler", commanded=True, data_dir=data_dir, topic="drain",
                    rings=rings, records_per_ring=per_ring, rounds=len(DRAIN_ROUNDS))
    drained = []
    try:
        with Consumer(bootstrap=data_dir) as consumer, \
                PartitionStateTable.attach(request(data_dir, "metadata")["state_table"]) as table:
            consumer.assign([partition])
            for _ in DRAIN_ROUNDS:
                _await_line(filler.stdout.fileno(), b"ready", READY_TIMEOUT_S)
                drained.append(_drain_once(filler, broker_pid, consumer, table, partition,
                                           rings * per_ring))
                _command(filler, b"drained")
        filled = _finish(filler, "drain_filler")
        other_cores = others.cores()
    finally:
        _stop(filler)
    result = {name: {**_rate(moved, moved * RECORD_SIZE, seconds, 0.0),
                     "records_planned": rings * per_ring, "batch_bytes": batch_bytes,
                     "batch_bytes_per_s": batch_bytes / max(seconds, 1e-9),
                     "other_cores": other_cores}
              for name, (moved, seconds), batch_bytes in zip(DRAIN_ROUNDS, drained,
                                                              filled["batch_bytes"])}
    for figures in result.values():
        del figures["construct_s"]
    return {**result, "rings": rings, "ring_size": filled["ring_size"],
            "warm_up_records": filled["warm_up_records"]}


def _drain_once(filler, broker_pid: int, consumer, table, partition,
                records: int) -> tuple[int, float]:
    """One round: the broker stopped, the rings filled, the broker resumed (whatever
    happens) and the clock run until the high watermark covers ``records`` more;
    the records it covered and the seconds."""
    try:                            # SIGCONT to a running broker does nothing
        os.kill(broker_pid, signal.SIGSTOP)
        _command(filler, b"fill")
        _await_line(filler.stdout.fileno(), b"filled", LOOP_DEADLINE_S)
        first = consumer.end_offsets([partition])[partition]
        started = time.perf_counter()
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    reached = _await_end_offset(consumer, table, partition, first + records)
    return reached - first, time.perf_counter() - started


def _await_end_offset(consumer, table, partition, target: int) -> int:
    """Sleep on the consumers' doorbell (rung after every drain that appended) until
    the partition's high watermark reaches ``target``; that high watermark."""
    deadline = time.monotonic() + LOOP_DEADLINE_S

    def reached() -> bool:
        return consumer.end_offsets([partition])[partition] >= target

    while not reached():
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"the appender did not drain the rings within "
                               f"{LOOP_DEADLINE_S} s (high watermark "
                               f"{consumer.end_offsets([partition])[partition]:,} of "
                               f"{target:,})")
        table.consumer_doorbell.wait(reached, min(left, DRAIN_WAKE_S))
    return consumer.end_offsets([partition])[partition]


def measure_scaling(data_dir: str, broker_pid: int, records: int) -> dict:
    """The producer scaling figures, then the appender's drain alone."""
    results = {}
    for mode, total, batch_records in (("send", records, 0),
                                       ("send_batch", records * BATCH_RUN_FACTOR, BATCH_RECORDS)):
        results[mode] = [producer_scaling(data_dir, broker_pid, producers, total, batch_records)
                         for producers in SCALE_PRODUCERS]
    return {"producer_scaling": results, "drain": appender_drain(data_dir, broker_pid, records)}


def remove_data(data_dir: str) -> list[str]:
    """Remove the data directory and every /dev/shm object its broker or clients
    left (a client killed on a timeout leaves its ring); those names."""
    from shmlog.server.broker import shared_memory_prefix
    from shmlog.shm import shared_memory
    prefix = shared_memory_prefix(data_dir)
    left = [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]
    for name in left:
        shared_memory.unlink(name)
    shutil.rmtree(data_dir, ignore_errors=True)
    return left


# --- the report ----------------------------------------------------------------------

def verdict(met: bool) -> str:
    return "met" if met else "below"


def report(document: dict) -> None:
    environment, results = document["environment"], document["results"]
    bound = document["memcpy_bytes_per_s"]
    print(f"shmlog {environment['shmlog_revision']} on {environment['host']}: "
          f"{environment['cpu_model']}, {environment['cpu_count']} cores, python "
          f"{environment['python']}, numpy {environment['numpy']}, numba {environment['numba']}")
    print(f"load average at start {environment['load_average_at_start'][0]:.2f}")
    print(f"memcpy (np.copyto, 256 MiB) {bound / 1e9:.2f} GB/s; first touch of fresh "
          f"memory (np.ones, 1 GiB) {document['first_touch_bytes_per_s'] / 1e9:.2f} GB/s; "
          f"records of {RECORD_SIZE} random bytes, one partition, the broker and every "
          f"client a process of its own")
    print()
    print(f"{'figure':<36} {'records':>10} {'M rec/s':>8} {'GB/s':>7} {'of memcpy':>9} "
          f"{'others':>6}   goal")
    for name, label in LABELS.items():
        result = results[name]
        print(f"{label:<36} {rate_columns(result, bound)} "
              f"{result['other_cores']:6.2f}   {goal_text(name, results)}")
    e2e = results["e2e"]
    print()
    print(f"e2e latency, {e2e['rate']:,} records/s for {e2e['seconds']:g} s (linger 0 ms, "
          f"acks=1; producer and consumer started just before): sent {e2e['sent']:,} at "
          f"{e2e['achieved_rate']:,.0f}/s, received {e2e['received']:,}; others "
          f"{e2e['other_cores']:.2f}")
    print(f"{'span':<24} {'records':>8} {'p50 us':>9} {'p99 us':>9} {'p99.9 us':>9} "
          f"{'max us':>10}   goal p50 <= {P50_GOAL_US:g} us")
    for span, label in SPANS:
        figures = e2e[span]
        if not figures["count"]:
            print(f"{label:<24} {0:>8}   (no records)")
            continue
        print(f"{label:<24} {figures['count']:>8,} {figures['p50_us']:9.1f} "
              f"{figures['p99_us']:9.1f} {figures['p999_us']:9.1f} {figures['max_us']:10.1f}   "
              f"{verdict(figures['p50_us'] <= P50_GOAL_US)}")
    counts = [(name, results[name]["records"], results[name]["records_planned"])
              for name in LABELS] + [("e2e", e2e["received"], e2e["sent"])]
    for name, moved, planned in counts:
        if moved < planned:
            print(f"WARNING: {name} moved only {moved:,} of {planned:,} records: its figures "
                  f"cover those")
    report_scaling(document)
    busy = max([result["other_cores"] for result in results.values()] +
               [result["other_cores"] for result in scaling_results(document["scaling"])])
    print()
    print("others: cores other processes kept busy meanwhile (on average)"
          + (f"; the machine was not quiet (up to {busy:.2f} cores): these figures are not "
             f"comparable with a quiet run's" if busy > OTHER_CORES_WARNING else ""))


def scaling_results(scaling: dict) -> list[dict]:
    return [result for runs in scaling["producer_scaling"].values() for result in runs] + \
        [scaling["drain"][name] for name in DRAIN_ROUNDS]


def report_scaling(document: dict) -> None:
    scaling, bound = document["scaling"], document["memcpy_bytes_per_s"]
    cores = document["environment"]["cpu_count"]
    print()
    print(f"producer scaling on {cores} cores (the broker's appender takes one): N producer "
          f"processes at once, one topic of N partitions, one each; the records split evenly; "
          f"from a common start to the last acknowledgement")
    print(f"{'figure':<39} {'records':>10} {'M rec/s':>8} {'GB/s':>7} "
          f"{'of memcpy':>9} {'each M/s':>8} {'x 1 prod':>8} {'others':>6}")
    for mode, label in SCALE_LABELS.items():
        runs = scaling["producer_scaling"][mode]
        single = runs[0]["records_per_s"]
        for result in runs:
            each = result["per_producer_records_per_s"]
            print(f"{scale_label(result['producers'], label):<39} "
                  f"{rate_columns(result, bound)} {sum(each) / len(each) / 1e6:8.3f} "
                  f"{result['records_per_s'] / max(single, 1e-9):8.2f} "
                  f"{result['other_cores']:6.2f}")
    drain = scaling["drain"]
    rings = f"{drain['rings']} ring{'s' if drain['rings'] > 1 else ''}"
    print()
    print(f"appender drain alone: {rings} of {drain['ring_size'] / 2**20:g} MiB filled while "
          f"the broker was stopped (SIGSTOP), timed from its SIGCONT until the high watermark "
          f"covered them; twice, into one partition")
    print(f"{'figure':<39} {'records':>10} {'M rec/s':>8} {'GB/s':>7} {'of memcpy':>9} "
          f"{'batch GB/s':>10} {'others':>6}")
    for name, label in DRAIN_LABELS.items():
        result = drain[name]
        print(f"{label:<39} {rate_columns(result, bound)} "
              f"{result['batch_bytes_per_s'] / 1e9:10.3f} {result['other_cores']:6.2f}")
    for result in scaling_results(scaling):
        if result["records"] < result["records_planned"]:
            print(f"WARNING: a scaling figure moved only {result['records']:,} of "
                  f"{result['records_planned']:,} records")


def scale_label(producers: int, label: str) -> str:
    return f"{producers} producer{'s' if producers > 1 else ''}, {label}"


def rate_columns(result: dict, bound: float) -> str:
    """A figure's records, M records/s, GB/s and share of memcpy, as the tables align
    them."""
    return (f"{result['records']:>10,} {result['records_per_s'] / 1e6:8.3f} "
            f"{result['bytes_per_s'] / 1e9:7.3f} {result['bytes_per_s'] / bound:9.2%}")


def goal_text(name: str, results: dict) -> str:
    rate = results[name]["records_per_s"]
    if name == "iteration":
        share = rate / max(results["poll"]["records_per_s"], 1e-9)
        return (f"> 1/{1 / ITERATION_SHARE_OF_POLL_GOAL:g} of poll: "
                f"{verdict(share > ITERATION_SHARE_OF_POLL_GOAL)} ({share:.2f} of poll)")
    return f">= {RATE_GOALS[name] / 1e6:g} M/s: {verdict(rate >= RATE_GOALS[name])}"


# --- main ----------------------------------------------------------------------------

def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=None,
                        help=f"records per per-record figure (default {RECORDS_DEFAULT:,}; "
                             f"the batch figures move {BATCH_RUN_FACTOR}x as many, the "
                             f"scaling figures split them among their producers, the "
                             f"drain figure drains as many)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK['records']:,} records, latency at "
                             f"{QUICK['latency_rate']:,}/s for {QUICK['latency_seconds']:g} s")
    parser.add_argument("--ring-size", type=int, default=None,
                        help="the producers' ring_size in bytes (default: the producer's "
                             "default); the ring size is chosen by this run's send figures")
    parser.add_argument("--json", metavar="FILE",
                        default=os.path.join(REPOSITORY, "perf", "results", "bench_clients.json"),
                        help="write the figures here as one JSON object "
                             "(default perf/results/bench_clients.json)")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--arguments", default="{}", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.records is not None and arguments.records < 1:
        parser.error("--records must be at least 1")
    return arguments


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    if harness.run_role(arguments, ROLES):
        return 0
    harness.unwind_on_sigterm()
    from bench_log import environment
    from bounds import first_touch_rate, memcpy_rate

    from shmlog import Broker
    records = arguments.records or (QUICK["records"] if arguments.quick else RECORDS_DEFAULT)
    rate = QUICK["latency_rate"] if arguments.quick else LATENCY_RATE
    seconds = QUICK["latency_seconds"] if arguments.quick else LATENCY_SECONDS
    data_dir = tempfile.mkdtemp(prefix="shmlog-bench-clients-")
    print(f"broker data directory {data_dir} (removed at the end)", flush=True)
    try:
        document = {"benchmark": "bench_clients", "environment": environment(data_dir),
                    "memcpy_bytes_per_s": memcpy_rate(),
                    "first_touch_bytes_per_s": first_touch_rate(), "record_size": RECORD_SIZE,
                    "goals": {"records_per_s": RATE_GOALS, "e2e_p50_us": P50_GOAL_US,
                              "iteration_share_of_poll": ITERATION_SHARE_OF_POLL_GOAL}}
        with Broker(data_dir) as broker:
            document["results"] = measure(data_dir, broker.process.pid, records, rate, seconds,
                                          arguments.ring_size)
            document["scaling"] = measure_scaling(data_dir, broker.process.pid, records)
        document["ring_size"] = arguments.ring_size
    finally:
        left = remove_data(data_dir)
    document["shared_memory_left_by_the_run"] = left
    report(document)
    os.makedirs(os.path.dirname(os.path.abspath(arguments.json)), exist_ok=True)
    with open(arguments.json, "w") as target:
        json.dump(document, target, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
