"""Transactions: what a transactional producer sends next to an idempotent one, at
transactions of 1, 100 and 10 000 records and at a commit every 100 ms, and how long
a commit takes.

Goal
----
Say what exactly-once costs a producer on one host. Kafka's KIP-98 measured about 3 %
less throughput for a transactional producer committing every 100 ms than for an
idempotent one; a transaction's cost is fixed (its partitions added, its end, its
markers written, a marker's record in every partition), so it shrinks as transactions
grow. Every figure is printed beside the same run's memcpy bandwidth
(``bounds.memcpy_rate``) and the ratio to the idempotent producer's rate; a benchmark
never asserts.

Method
------
One broker process (``shmlog.Broker``); this process is the client. Records of 100
random bytes, made before the clocks start, to a topic of 2 partitions, sent with
``Producer.send`` (linger 5 ms, acks=1) alternately to partition 0 and 1, so every
transaction spans both partitions (two markers).

* idempotent: ``--records`` sends, then ``flush``; the clock stops at the flush's end.
* transactional, k records per transaction (k = 1, 100, 10 000): ``begin_transaction``,
  k sends, ``commit_transaction`` (which flushes), until ``--records`` records (k = 1:
  ``--records // 100`` of them: a transaction each); the clock runs over the whole loop.
  Each ``commit_transaction`` call is timed alone: p50, p99 and max for k = 100.
* commit every 100 ms: sends in one transaction, committed when 100 ms passed since it
  began (the KIP-98 workload), for 10 x ``--records`` records (the values over and
  over), beside an idempotent run of as many.
* ``send_batch`` (1000 x 100 B a call), idempotent and in transactions of 100 calls.

``--cluster``: the same on three brokers (a ZooKeeper of their own): every topic with
3 replicas and min.insync.replicas 2, the producer on broker 1 with acks=all (its
broker forwards what another leads), the coordinator wherever its id's partition of
``__transaction_state`` is led.

Expected on the 2-vCPU development VM (November 2026): transactions of 100 records and
more within a few per cent of idempotent; transactions of 1 record bound by the
commit's control round trips and markers (a few thousand per second).

Measured, 2026-11-29, quiet, memcpy ~20 GB/s, 200 000 records:

=================================  ==================  ==========================
figure                             one broker (acks=1) three brokers (acks=all)
=================================  ==================  ==========================
idempotent send                    1.659 M/s           0.092 M/s
transactions of 1                  1,040 commits/s     98 commits/s
transactions of 100                0.046x              0.078x
transactions of 10 000             0.818x              0.807x
commit every 100 ms                0.978x              1.222x
send_batch, 100 per transaction    0.740x              1.251x
commit p50 / p99 (100 records)     1.17 / 2.02 ms      13.4 / 20.8 ms
=================================  ==================  ==========================

In the cluster a commit is a chain of replication round trips on 2 shared cores:
the flush (acks=all, forwarded), EndTxn forwarded to the coordinator, its Prepare
state replicated, one WriteTxnMarkers per leader each replicated, the answer back.
Ratios above 1 there: while a commit's flush waits, the next records gather into
bigger batches, and the idempotent baseline (one forwarded batch in flight per
partition, each an acks=all round trip) gains less from the same linger.
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

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402

from shmlog import Admin, Broker, Producer  # noqa: E402

RECORD_SIZE = 100
PARTITIONS = 2
TRANSACTION_SIZES = (1, 100, 10_000)
COMMIT_INTERVAL_S = 0.1
BATCH_ROWS = 1000
BATCHES_PER_TRANSACTION = 100
LONG_RUN_FACTOR = 10             # the 100 ms commits' run: this many times --records


def _values(count: int) -> list[bytes]:
    data = np.random.default_rng(7).integers(0, 256, count * RECORD_SIZE, np.uint8).tobytes()
    return [data[index * RECORD_SIZE:(index + 1) * RECORD_SIZE] for index in range(count)]


def _idempotent(data_dir: str, topic: str, values: list[bytes], count: int,
                options: dict) -> float:
    """records/s of ``count`` sends (``values`` over and over)."""
    with Producer(data_dir, linger_ms=5, **options) as producer:
        started = time.perf_counter()
        for index in range(count):
            producer.send(topic, values[index % len(values)], partition=index % PARTITIONS)
        producer.flush()
        return count / (time.perf_counter() - started)


def _transactional(data_dir: str, topic: str, values: list[bytes], size: int,
                   transactional_id: str, options: dict) -> tuple[float, list[float]]:
    """(records/s, each commit's seconds) with ``size`` records per transaction."""
    commits = []
    with Producer(data_dir, linger_ms=5, transactional_id=transactional_id,
                  **options) as producer:
        producer.init_transactions()
        started = time.perf_counter()
        for first in range(0, len(values), size):
            producer.begin_transaction()
            for index in range(first, min(first + size, len(values))):
                producer.send(topic, values[index], partition=index % PARTITIONS)
            committing = time.perf_counter()
            producer.commit_transaction()
            commits.append(time.perf_counter() - committing)
        return len(values) / (time.perf_counter() - started), commits


def _every_interval(data_dir: str, topic: str, values: list[bytes], count: int,
                    options: dict) -> tuple[float, int]:
    """(records/s, transactions) of ``count`` sends committing every COMMIT_INTERVAL_S."""
    transactions = 0
    with Producer(data_dir, linger_ms=5, transactional_id="interval", **options) as producer:
        producer.init_transactions()
        started = time.perf_counter()
        producer.begin_transaction()
        began = started
        for index in range(count):
            producer.send(topic, values[index % len(values)], partition=index % PARTITIONS)
            if index % 256 == 0 and time.perf_counter() - began >= COMMIT_INTERVAL_S:
                producer.commit_transaction()
                transactions += 1
                producer.begin_transaction()
                began = time.perf_counter()
        producer.commit_transaction()
        return count / (time.perf_counter() - started), transactions + 1


def _batches(data_dir: str, topic: str, rows: np.ndarray, calls: int,
             transactional: bool, options: dict) -> float:
    settings = {"transactional_id": "batches"} if transactional else {}
    with Producer(data_dir, **settings, **options) as producer:
        if transactional:
            producer.init_transactions()
        started = time.perf_counter()
        for call in range(calls):
            if transactional and call % BATCHES_PER_TRANSACTION == 0:
                producer.begin_transaction()
            producer.send_batch(topic, rows, partition=call % PARTITIONS)
            if transactional and call % BATCHES_PER_TRANSACTION == BATCHES_PER_TRANSACTION - 1:
                producer.commit_transaction()
        if transactional and calls % BATCHES_PER_TRANSACTION:
            producer.commit_transaction()
        producer.flush()
        return calls * BATCH_ROWS / (time.perf_counter() - started)


def _percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


TOPICS = ("idempotent", "per-1", "per-100", "per-10000", "interval", "batches",
          "transactional-batches")


def _run(data_dir: str, values: list[bytes], rows: np.ndarray, calls: int, memcpy: float,
         options: dict, figures: dict) -> None:
    """Every figure, the producer on ``data_dir`` with ``options``; printed and put
    into ``figures``."""
    records = len(values)
    base = figures["idempotent_per_s"] = _idempotent(data_dir, "idempotent", values,
                                                     records, options)
    print(f"idempotent send              {base / 1e6:6.3f} M records/s "
          f"({base * RECORD_SIZE / memcpy:.2%} of memcpy)")
    for size in TRANSACTION_SIZES:
        sent = values if size > 1 else values[:records // 100]
        rate, commits = _transactional(data_dir, f"per-{size}", sent, size, f"per-{size}",
                                       options)
        figures[f"transactions_of_{size}_per_s"] = rate
        line = (f"transactions of {size:>6}       {rate / 1e6:6.3f} M records/s = "
                f"{rate / base:.3f}x idempotent ({len(commits)} transactions, "
                f"{len(commits) / sum(commits) if sum(commits) else 0:.0f} commits/s "
                f"of commit time)")
        if size == 100:
            p50, p99 = _percentile(commits, 0.5), _percentile(commits, 0.99)
            figures["commit_latency_s"] = {"p50": p50, "p99": p99, "max": max(commits)}
            line += (f"\n  commit latency (100 records, 2 partitions): p50 "
                     f"{p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us, max "
                     f"{max(commits) * 1e6:.0f} us")
        print(line)
    # A run of several 100 ms commits, beside an idempotent run as long.
    long_count = LONG_RUN_FACTOR * records
    long_base = figures["idempotent_long_per_s"] = _idempotent(
        data_dir, "idempotent", values, long_count, options)
    rate, transactions = _every_interval(data_dir, "interval", values, long_count, options)
    figures["commit_every_100ms_per_s"] = rate
    print(f"commit every 100 ms          {rate / 1e6:6.3f} M records/s = "
          f"{rate / long_base:.3f}x idempotent over {long_count} records "
          f"({long_base / 1e6:.3f} M/s; {transactions} transactions; KIP-98: ~0.97x)")
    plain = figures["send_batch_per_s"] = _batches(data_dir, "batches", rows, calls, False,
                                                   options)
    held = figures["send_batch_transactional_per_s"] = _batches(
        data_dir, "transactional-batches", rows, calls, True, options)
    print(f"send_batch idempotent        {plain / 1e6:6.3f} M records/s "
          f"({plain * RECORD_SIZE / memcpy:.2%} of memcpy)")
    print(f"send_batch, {BATCHES_PER_TRANSACTION} per transaction "
          f"{held / 1e6:6.3f} M records/s = {held / plain:.3f}x idempotent")


def _one_broker(directory: str, values, rows, calls, memcpy, figures) -> None:
    data_dir = os.path.join(directory, "broker")
    with Broker(data_dir):
        with Admin(data_dir) as admin:
            for topic in TOPICS:
                admin.create_topic(topic, PARTITIONS)
        print(f"one broker; memcpy {memcpy / 1e9:.1f} GB/s; {len(values)} records of "
              f"{RECORD_SIZE} B, {PARTITIONS} partitions, linger 5 ms, acks=1")
        _run(data_dir, values, rows, calls, memcpy, {}, figures)


def _three_brokers(directory: str, values, rows, calls, memcpy, figures) -> None:
    """The same figures on a three-broker cluster: every topic with 3 replicas and
    min.insync.replicas 2 (its two partitions' leaders spread over the brokers), the
    producer (acks=all, idempotent or transactional) on broker 1, whose loop forwards
    what another broker leads, and the coordinator on whichever broker leads its id's
    partition of ``__transaction_state``."""
    from shmlog.devtools.local_cluster import LocalCluster
    from shmlog.devtools.zookeeper import ZooKeeperServer
    with ZooKeeperServer(os.path.join(directory, "zookeeper"), tick_time_ms=500) as server, \
            LocalCluster(os.path.join(directory, "cluster"), 3,
                         zookeeper_connect=server.connect_string,
                         broker_settings={"transaction_state_log_num_partitions": 3,
                                          "offsets_topic_num_partitions": 3}) as cluster:
        with Admin(cluster.data_dir(1)) as admin:
            for topic in TOPICS:
                admin.create_topic(topic, PARTITIONS, {"min.insync.replicas": "2"},
                                   replication_factor=3)
        leaders = _wait_for_leaders(cluster)
        with Producer(cluster.data_dir(1), transactional_id="warm-up") as warm_up:
            warm_up.init_transactions()           # __transaction_state made and led
        print(f"three brokers (RF 3, min ISR 2, the producer on broker 1; leaders {leaders}); "
              f"memcpy {memcpy / 1e9:.1f} GB/s; {len(values)} records "
              f"of {RECORD_SIZE} B, {PARTITIONS} partitions, linger 5 ms, acks=all")
        _run(cluster.data_dir(1), values, rows, calls, memcpy, {"acks": "all"}, figures)


def _wait_for_leaders(cluster) -> dict:
    """{topic: [leader of each partition]} once every partition has one."""
    def led():
        with Admin(cluster.data_dir(1)) as admin:
            leaders = {topic: [entry["leader"] for entry in admin.describe_topic(topic)
                               ["partitions"]] for topic in TOPICS}
        return leaders if all(leader in cluster.brokers for found in leaders.values()
                              for leader in found) else None
    return cluster.wait_for(led, 60.0, "every partition led", interval_s=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--cluster", action="store_true",
                        help="on three brokers (a ZooKeeper of its own), acks=all")
    parser.add_argument("--json", help="write the figures here too")
    arguments = parser.parse_args()
    memcpy = memcpy_rate()
    values = _values(arguments.records)
    rows = np.frombuffer(b"".join(values[:BATCH_ROWS]), np.uint8).reshape(BATCH_ROWS, RECORD_SIZE)
    calls = max(BATCHES_PER_TRANSACTION, 10 * arguments.records // BATCH_ROWS)
    directory = tempfile.mkdtemp(prefix="bench-transactions-")
    figures: dict = {"host": platform.node(), "cores": os.cpu_count(),
                     "memcpy_bytes_per_s": memcpy, "records": arguments.records,
                     "brokers": 3 if arguments.cluster else 1}
    try:
        run = _three_brokers if arguments.cluster else _one_broker
        run(directory, values, rows, calls, memcpy, figures)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if arguments.json:
        with open(arguments.json, "w") as target:
            json.dump(figures, target, indent=2)


if __name__ == "__main__":
    main()
