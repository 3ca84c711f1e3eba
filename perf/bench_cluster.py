"""Three brokers replicating on one machine: acks=1 vs acks=all throughput, acks=all
latency, failover after kill -9 of a leader, and a follower's catch-up, next to memcpy.

Goal
----
Say what replication costs on this 2-core machine, against issue 14's goals:
acks=all throughput >= 50 % of acks=1, acks=all latency p99 <= 2 ms, failover
within the ZooKeeper session timeout, and how fast a follower that was down catches
up. Each throughput is printed beside the same run's memcpy bandwidth
(``bounds.memcpy_rate``); a benchmark never asserts.

Method
------
A ZooKeeper of its own (tickTime 500 ms) and three brokers
(``shmlog.devtools.local_cluster.LocalCluster``, broker i on 127.0.0.i, session timeout
``SESSION_TIMEOUT_MS``); one partition, replication factor 3, min.insync.replicas 2.
The producer runs in this process, on the leader's "host" (its data directory).

* Throughput: ``shmlog.devtools.perf.produce`` (the ``shmlog perf produce`` tool) sends
  ``--records`` records of 100 bytes with ``send_batch`` (1000 rows a call) and
  ``--records / 10`` with one ``send`` per record, each with acks=1 and acks=all,
  into one topic per figure; the clock stops when the last is acknowledged. For
  acks=1 a second clock stops when every follower holds the records too: the
  followers' copying, which acks=1 leaves to after the first clock stops, on the
  same 2 cores.
* acks=all latency: ``LATENCY_RATE`` records/s for ``LATENCY_SECONDS``, one ``send``
  (linger 0) at a time, each timed from the call until its future resolved (the
  leader appended it and both followers fetched it: one replication round trip);
  the first second is reported apart (start-up). The same with acks=1 follows, as
  the reference: what the loaded machine costs without replication.
* Failover (``FAILOVER_RUNS`` times): kill -9 the leader, then send acks=all to
  whichever broker the survivors name leader until one is acknowledged; the time
  from the kill. The killed broker is restarted (and waited back into the ISR)
  before the next run. Bounded below by the session timeout: ZooKeeper notices a
  dead broker only when its session expires.
* Catch-up: kill -9 a follower, append ``--catch-up-mb`` MB with acks=1 (the ISR
  shrinks to 2), restart it, and time from its restart (it serves) until its log end
  equals the leader's: the rate is the bytes of those records' batches over that
  time.

* ``--curve-cost``: instead of the above, the acks=all figures (``send_batch``
  throughput and the latency at ``LATENCY_RATE``) of a cluster whose brokers talk
  plain TCP and of one talking CurveZMQ (``LocalCluster``'s default), one after the
  other in one run, and CurveZMQ's ratio to plain TCP.
  Measured quiet, 2026-11-29, two runs the same hour: send_batch acks=all CurveZMQ
  over plain x0.83 (1.79 / 2.15 M/s) and x0.66 (2.30 / 3.49 M/s); latency p50 x1.07
  and x1.04, p99 x1.18 and x0.96. libzmq encrypts on one I/O thread per context.

Every wait is bounded; the cluster and its directory are removed at the end.

Expected figures and what bounds them
-------------------------------------
One run of the defaults on the 2-vCPU development VM (memcpy 20.8 GB/s), 2026-11-29,
quiet (load average 0.9 before the run; three brokers, ZooKeeper's JVM and the
producer share the 2 cores):

==========================================  ===============  ========================
figure                                      result           goal
==========================================  ===============  ========================
send_batch, acks=1 / acks=all               10.05 / 2.47 M/s acks=all >= 50 %: 25 %
send_batch, acks=1 until replicated         2.09 M/s         (acks=all: 118 % of it)
send (one per record), acks=1 / acks=all    0.82 / 0.37 M/s  acks=all >= 50 %: 45 %
acks=all latency at 1000/s, p50 / p99       1.58 / 2.48 ms   p99 <= 2 ms: below
acks=1 latency (reference), p50 / p99       0.25 / 1.1 ms    -
failover after kill -9 of the leader        2.4-2.5 s        (session timeout 2 s)
catch-up of a follower down for 100 MB      482 MB/s         -
==========================================  ===============  ========================

acks=all's batch throughput is what three copies cost on two cores: it is above
acks=1's once acks=1 is timed until the followers hold the records too.

What bounds the latency: each replication message crosses libzmq's I/O thread on
both sides (a bare pyzmq DEALER/ROUTER round trip between two threads takes ~220 us
here, and ``ReplicationEndpoint``'s, pumped by its owner, 221 us:
``perf/bench_replication.py``), and a follower spends most of its share of the
round trip in Python: handing the next fetch to libzmq (a wake-up of its I/O thread)
and appending the records (py-spy, 2026-11-29). Until 2026-11-29 each endpoint had a
socket thread handing every message to the loop and back, and a future's ``get()``
polled with a backoff instead of sleeping on its ring's completions: acks=all
p50/p99 was then 2.5/4.7 ms.

An acks=all record needs every in-sync follower's next fetch: the leader's loop
answers their waiting fetches after the drain, each follower's loop appends and
fetches again, and only that fetch moves the high watermark: wake-ups of processes
and threads across three brokers, each of which waits for a CPU on a 2-core machine.
Failover is the session timeout (ZooKeeper notices the dead broker) plus the
election and the new leader's first fetch round. Catch-up moves 1 MiB fetches
(``replica.fetch.max.bytes``), each a round trip, copied into the follower's log
with the leader's offsets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

from harness import REPOSITORY  # noqa: E402 - before shmlog: this checkout's, here and in children

RECORD_SIZE = 100
BATCH_RECORDS = 1000
RECORDS_DEFAULT = 2_000_000
PER_RECORD_SHARE = 10                # per-record sends move --records / this
SESSION_TIMEOUT_MS = 2000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
            "replica.lag.time.max.ms": 4000, "replica.fetch.wait.max.ms": 200,
            "replica.socket.timeout.ms": 1500}
LATENCY_RATE = 1000                  # records/s
LATENCY_SECONDS = 6.0
FIRST_SECOND_S = 1.0
FAILOVER_RUNS = 3
CATCH_UP_MB_DEFAULT = 100
WAIT_S = 120.0                       # any one wait: an election, a restart, a catch-up
POLL_S = 0.005
ACKS_ALL_SHARE_GOAL = 0.5
P99_GOAL_US = 2000.0
QUICK = {"records": 20_000, "catch_up_mb": 2}


def wait_for(condition, what: str):
    from shmlog.devtools.local_cluster import poll_until
    return poll_until(condition, WAIT_S, what, POLL_S)


def describe(cluster, broker_id: int, topic: str) -> dict:
    from shmlog import Admin
    return Admin(cluster.data_dir(broker_id), timeout_ms=2000).describe_topic(topic)[
        "partitions"][0]


def log_end(cluster, broker_id: int, topic: str) -> int:
    from shmlog import Admin
    return Admin(cluster.data_dir(broker_id)).list_offsets(topic)[0]["log_end_offset"]


def create(cluster, topic: str) -> int:
    """Create ``topic`` (RF 3, min.insync 2), wait for its whole ISR; its leader."""
    from shmlog import Admin
    Admin(cluster.data_dir(1)).create_topic(topic, 1, {"min.insync.replicas": "2"},
                                            replication_factor=3)
    return wait_for(lambda: len(describe(cluster, 1, topic)["isr"]) == 3
                    and describe(cluster, 1, topic)["leader"], f"{topic}'s whole ISR")


def throughput(cluster, records: int) -> dict:
    from shmlog.devtools import perf
    found = {}
    for kind, count, batch in (("send_batch", records, BATCH_RECORDS),
                               ("send", records // PER_RECORD_SHARE, 0)):
        for acks, label in ((1, "acks_1"), (-1, "acks_all")):
            topic = f"{kind}-{label}"
            leader = create(cluster, topic)
            started = time.perf_counter()
            found[topic] = perf.produce(cluster.data_dir(leader), topic, count, RECORD_SIZE,
                                        batch_records=batch, acks=acks)
            if acks == 1:           # the followers' share of the work, done after the clock
                end = log_end(cluster, leader, topic)
                wait_for(lambda topic=topic, end=end: all(
                    log_end(cluster, broker_id, topic) >= end for broker_id in cluster.brokers),
                    f"{topic} replicated")
                found[topic]["replicated_records_per_s"] = \
                    count / (time.perf_counter() - started)
    return found


def _percentiles(micros) -> dict:
    import numpy as np
    if not len(micros):
        return {"count": 0}
    return {"count": len(micros), "p50_us": float(np.percentile(micros, 50)),
            "p99_us": float(np.percentile(micros, 99)), "max_us": float(np.max(micros))}


def latency(cluster, acks) -> dict:
    """One record at a time at LATENCY_RATE: send -> acknowledged."""
    from shmlog import Producer
    topic = f"latency-acks-{acks}"
    leader = create(cluster, topic)
    count = int(LATENCY_RATE * LATENCY_SECONDS)
    stamps = []
    with Producer(cluster.data_dir(leader), acks=acks, linger_ms=0) as producer:
        started = time.perf_counter()
        for number in range(count):
            due = started + number / LATENCY_RATE
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sent = time.perf_counter()
            producer.send(topic, os.urandom(RECORD_SIZE), partition=0).get(timeout=WAIT_S)
            stamps.append((sent - started, (time.perf_counter() - sent) * 1e6))
    first = [micros for at, micros in stamps if at < FIRST_SECOND_S]
    after = [micros for at, micros in stamps if at >= FIRST_SECOND_S]
    return {"rate": LATENCY_RATE, "seconds": LATENCY_SECONDS,
            "whole": _percentiles([micros for _, micros in stamps]),
            "first_second": _percentiles(first), "after_first_second": _percentiles(after)}


def _acknowledged_somewhere(cluster, topic: str, survivors) -> bool:
    from shmlog import Producer
    from shmlog.common.errors import ShmlogError
    try:
        leader = describe(cluster, survivors[0], topic)["leader"]
        if leader not in survivors:
            return False
        with Producer(cluster.data_dir(leader), acks="all") as producer:
            producer.send(topic, b"after-failover", partition=0).get(timeout=5)
        return True
    except ShmlogError:
        return False


def failover(cluster) -> list[float]:
    topic = "failover"
    create(cluster, topic)
    times = []
    for _ in range(FAILOVER_RUNS):
        leader = wait_for(lambda: describe(cluster, 1 if 1 in cluster.brokers else 2,
                                           topic)["leader"], "a leader")
        survivors = [broker_id for broker_id in cluster.brokers if broker_id != leader]
        killed_at = time.perf_counter()
        cluster.kill(leader)
        wait_for(lambda survivors=survivors: _acknowledged_somewhere(cluster, topic, survivors),
                 "an acks=all record acknowledged by a new leader")
        times.append(time.perf_counter() - killed_at)
        cluster.start_broker(leader)
        wait_for(lambda leader=leader: len(describe(cluster, leader, topic)["isr"]) == 3,
                 "the restarted broker back in the ISR")
    return times


def catch_up(cluster, megabytes: int) -> dict:
    from shmlog.devtools import perf
    topic = "catch-up"
    leader = create(cluster, topic)
    follower = next(broker_id for broker_id in cluster.brokers if broker_id != leader)
    cluster.kill(follower)
    records = megabytes * 1_000_000 // RECORD_SIZE
    perf.produce(cluster.data_dir(leader), topic, records, RECORD_SIZE,
                 batch_records=BATCH_RECORDS, acks=1)
    target = log_end(cluster, leader, topic)
    restarting = time.perf_counter()
    cluster.start_broker(follower)
    serving = time.perf_counter()
    wait_for(lambda: log_end(cluster, follower, topic) >= target, "the follower caught up")
    done = time.perf_counter()
    batch_bytes = records * RECORD_SIZE   # the payload; batches add ~0.2 % of headers
    return {"records": records, "payload_bytes": batch_bytes,
            "restart_s": serving - restarting, "catch_up_s": done - serving,
            "bytes_per_s": batch_bytes / (done - serving),
            "records_per_s": records / (done - serving)}


def acks_all_figures(cluster, records: int) -> dict:
    """send_batch acks=all throughput and acks=all latency: what CurveZMQ may cost."""
    from shmlog.devtools import perf
    topic = "curve-cost-send-batch"
    leader = create(cluster, topic)
    found = perf.produce(cluster.data_dir(leader), topic, records, RECORD_SIZE,
                         batch_records=BATCH_RECORDS, acks=-1)
    steady = latency(cluster, "all")["after_first_second"]
    return {"send_batch_acks_all_records_per_s": found["records_per_s"],
            "latency_acks_all_p50_us": steady.get("p50_us", float("nan")),
            "latency_acks_all_p99_us": steady.get("p99_us", float("nan"))}


def curve_cost(server, directory: str, records: int) -> dict:
    """The acks=all figures with plain TCP and with CurveZMQ, and their ratio."""
    from shmlog.devtools.local_cluster import LocalCluster
    found = {}
    for security in ("plaintext", "curve"):
        with LocalCluster(os.path.join(directory, security), 3,
                          zookeeper_connect=server.connect_string, settings=SETTINGS,
                          curve=security == "curve") as cluster:
            found[security] = acks_all_figures(cluster, records)
    found["curve_over_plaintext"] = {name: value / found["plaintext"][name]
                                     for name, value in found["curve"].items()}
    for name, figures in found.items():
        print(f"{name}:")
        for figure, value in figures.items():
            print(f"  {figure:36} {value:12.3f}")
    return found


def report(results: dict, memcpy: float) -> None:
    print(f"memcpy {memcpy / 1e9:.1f} GB/s; first touch of fresh memory (np.ones, 1 GiB) "
          f"{results['first_touch_bytes_per_s'] / 1e9:.2f} GB/s; {results['host']}")
    rates = results["throughput"]
    for kind in ("send_batch", "send"):
        one, all_ = rates[f"{kind}-acks_1"], rates[f"{kind}-acks_all"]
        share = all_["records_per_s"] / one["records_per_s"]
        for label, figure in (("acks=1  ", one), ("acks=all", all_)):
            print(f"{kind:10s} {label}: {figure['records_per_s'] / 1e6:6.3f} M records/s "
                  f"{figure['bytes_per_s'] / 1e9:6.3f} GB/s "
                  f"({100 * figure['bytes_per_s'] / memcpy:.2f} % of memcpy)")
        print(f"{kind:10s} acks=1 until every replica holds it: "
              f"{one['replicated_records_per_s'] / 1e6:6.3f} M records/s (acks=all: "
              f"{100 * all_['records_per_s'] / one['replicated_records_per_s']:.0f} % of it)")
        verdict = "met" if share >= ACKS_ALL_SHARE_GOAL else "below"
        print(f"{kind:10s} acks=all / acks=1: {100 * share:.0f} % (goal >= "
              f"{100 * ACKS_ALL_SHARE_GOAL:.0f} %: {verdict})")
    for key, label in (("latency", "acks=all"), ("latency_acks_1", "acks=1 (reference)")):
        measured = results[key]
        for span in ("whole", "first_second", "after_first_second"):
            figure = measured[span]
            if figure["count"]:
                print(f"{label} latency at {measured['rate']}/s, {span.replace('_', ' ')}: "
                      f"p50 {figure['p50_us']:.0f} us, p99 {figure['p99_us']:.0f} us, "
                      f"max {figure['max_us']:.0f} us ({figure['count']} records)")
    measured = results["latency"]
    steady = measured["after_first_second"]
    if steady["count"]:
        print(f"acks=all p99 after the first second: goal <= {P99_GOAL_US:.0f} us: "
              f"{'met' if steady['p99_us'] <= P99_GOAL_US else 'below'}")
    times = results["failover_s"]
    print(f"failover after kill -9 of the leader (session timeout {SESSION_TIMEOUT_MS} ms): "
          + ", ".join(f"{seconds:.2f} s" for seconds in times))
    caught = results["catch_up"]
    print(f"catch-up of a follower down for {caught['payload_bytes'] / 1e6:.0f} MB: "
          f"{caught['bytes_per_s'] / 1e6:.0f} MB/s ({caught['records_per_s'] / 1e6:.2f} M "
          f"records/s, {100 * caught['bytes_per_s'] / memcpy:.2f} % of memcpy) in "
          f"{caught['catch_up_s']:.2f} s after its restart ({caught['restart_s']:.1f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--catch-up-mb", type=int, default=CATCH_UP_MB_DEFAULT)
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--curve-cost", action="store_true",
                        help="only acks=all throughput and latency, plain TCP vs CurveZMQ")
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "cluster.json"))
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.records, arguments.catch_up_mb = QUICK["records"], QUICK["catch_up_mb"]
    from bounds import first_touch_rate, memcpy_rate

    from shmlog.devtools.local_cluster import LocalCluster
    from shmlog.devtools.zookeeper import ZooKeeperServer
    memcpy, first_touch = memcpy_rate(), first_touch_rate()
    directory = tempfile.mkdtemp(prefix="shmlog-bench-cluster-")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if arguments.curve_cost:
            with ZooKeeperServer(os.path.join(directory, "zookeeper"), tick_time_ms=500) as server:
                results = curve_cost(server, directory, arguments.records)
            arguments.json = arguments.json.replace("cluster.json", "cluster-curve.json")
            os.makedirs(os.path.dirname(arguments.json), exist_ok=True)
            with open(arguments.json, "w") as target:
                json.dump(results, target, indent=2)
            print(f"results in {arguments.json}")
            return 0
        with ZooKeeperServer(os.path.join(directory, "zookeeper"), tick_time_ms=500) as server, \
                LocalCluster(os.path.join(directory, "cluster"), 3,
                             zookeeper_connect=server.connect_string,
                             settings=SETTINGS) as cluster:
            results = {"host": f"{platform.node()}, {os.cpu_count()} CPUs, "
                               f"Python {platform.python_version()}",
                       "memcpy_bytes_per_s": memcpy, "first_touch_bytes_per_s": first_touch,
                       "settings": SETTINGS}
            results["throughput"] = throughput(cluster, arguments.records)
            results["latency"] = latency(cluster, "all")
            results["latency_acks_1"] = latency(cluster, 1)
            results["failover_s"] = failover(cluster)
            results["catch_up"] = catch_up(cluster, arguments.catch_up_mb)
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(directory, ignore_errors=True)
    report(results, memcpy)
    os.makedirs(os.path.dirname(arguments.json), exist_ok=True)
    with open(arguments.json, "w") as target:
        json.dump(results, target, indent=2)
    print(f"results in {arguments.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
