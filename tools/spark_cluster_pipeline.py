"""The example pipeline on a cluster: three brokers and a Spark standalone cluster
whose workers run on the broker hosts - three hosts made of network namespaces
(``--namespaces``, as root), or this machine's loopback addresses.

    python tools/spark_cluster_pipeline.py [--namespaces] [--lines N] [--directory DIR]
                                           [--zookeeper HOST:PORT]

One command starts everything, runs the pipeline, prints what it read, and stops
and removes everything it started, also when it fails or is interrupted (Ctrl-C,
SIGTERM).

Hosts
-----
* ``--namespaces``: three network namespaces ``shmlog-<pid>-host1..3`` joined by
  a bridge (``shmlog.devtools.netns``; nothing is added to this machine's own network),
  each a host with its own address (10.213.0.1-3) running one broker and one Spark
  worker bound to it. host1 also runs ZooKeeper, the Spark master and the driver:
  this program starts itself there (``--inside-namespaces``, not for users) and,
  once that copy has ended, removes the namespaces and whatever still runs in
  them, and the shared memory of a broker that could not stop. Making namespaces
  needs root (CAP_NET_ADMIN) and ``ip``: without them it says so and exits 2.
* Without it: broker i and worker i - 1 on 127.0.0.(i + 1); ZooKeeper (unless
  ``--zookeeper`` names one), the master and the driver on 127.0.0.1.

Either way one machine's files and /dev/shm are seen from every host, so the
driver reaches every broker through its data directory; replication, ZooKeeper
and Spark's own traffic go between the hosts' addresses. Each worker is pointed
at its host's broker (``SHMLOG_SPARK_BOOTSTRAP``) and every broker registers its
host's address, which is the one its host's worker registers with Spark: the
preferred locations of ``bulk_read``'s ranges are executors' hosts.

The pipeline
------------
It creates ``logs`` (3 partitions, replication factor 2: every host lacks an
in-sync replica of some partition), produces N JSON log lines with acks=all, and
reads them back twice - with ``bulk_read`` (the JVM reader, which Spark places on
the replica hosts) and with ``format("shmlog")`` (Python tasks, placed anywhere) -
computing the same 10-second windowed counts per service and level as
tools/spark_pipeline.py.

For each reader it prints the counts, whether every record was read exactly once,
and the local/remote reads (``includeReadLocality``): tasks and records read from
an in-sync replica on the task's own host, and those read from its broker's other
copy (observer or out-of-sync follower). Then, per reader, where its tasks ran
(each task's host: its executor's ``SPARK_LOCAL_IP``) and whether every task's read
counted as its host says (``locality.placement_locality``: local exactly on a host
of an in-sync replica of its partition) - judged when the in-sync replicas stayed
the same during the reads. That agreement, not the number of local reads, is what
can go wrong: Spark places ``format("shmlog")``'s tasks at will, and in about 1 run
of 6 every one of them lands on the host of its partition's observer (local 0,
correctly). A task whose host's broker was not the one it read through, or whose
broker answered with a wrong role or ISR, disagrees. The exit status is 0 when every
read agrees with the lines produced and every task's locality with its host, 1 when
one does not, 2 when it cannot run as asked.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.join(REPOSITORY, "tools"))

import spark_cluster  # noqa: E402

from shmlog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from shmlog.devtools import netns  # noqa: E402
from shmlog.devtools.local_cluster import LocalCluster  # noqa: E402
from shmlog.devtools.zookeeper import ZooKeeperServer  # noqa: E402
from shmlog.spark import bulk_read, session  # noqa: E402
from shmlog.spark.locality import placement_locality  # noqa: E402
from shmlog.spark.source import replica_hosts  # noqa: E402

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
# The host a task ran on, evaluated in its executor's JVM within the task that read
# the rows: the executor's SPARK_LOCAL_IP, the address its worker binds and
# registers with Spark (spark_cluster gives each daemon its own), which is the
# address its host's broker registers too.
TASK_HOST = "java_method('java.lang.System', 'getenv', 'SPARK_LOCAL_IP')"
# The namespaces of --namespaces, one per host; the first also holds ZooKeeper, the
# Spark master and the driver.
HOST_MEMBERS = ("host1", "host2", "host3")
# How long the copy of this program in host1 may take to stop everything after an
# interrupt: the Spark daemons get 30 s (spark_cluster.STOP_TIMEOUT_S), then each
# broker leaves the cluster (controlled shutdown) and ZooKeeper stops.
NAMESPACE_RUN_STOP_TIMEOUT_S = 120
# How often the program the user started looks whether its copy in host1 has ended
# (and whether it waited too long after an interrupt).
INSIDE_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class Hosts:
    """Where everything runs: broker ``i`` and Spark worker ``i - 1`` bind
    ``brokers[i]`` and are started under ``launch_prefixes[i]`` (none: as this
    process); ZooKeeper, the Spark master and the driver bind ``master``."""
    brokers: dict[int, str]
    master: str
    launch_prefixes: dict[int, list[str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def loopback(cls) -> "Hosts":
        """Broker ``i`` on worker ``i - 1``'s address (spark_cluster.worker_hosts)."""
        return cls(dict(zip(range(1, BROKERS + 1), spark_cluster.worker_hosts(BROKERS))),
                   spark_cluster.MASTER_HOST)

    @classmethod
    def namespaces(cls, topology: netns.Topology) -> "Hosts":
        """Broker ``i`` in namespace ``host<i>``; the master where this program runs,
        host1."""
        members = dict(enumerate(HOST_MEMBERS, start=1))
        return cls({broker_id: topology.address(member) for broker_id, member in members.items()},
                   topology.address(HOST_MEMBERS[0]),
                   {broker_id: topology.launch_prefix(member)
                    for broker_id, member in members.items()})

    def workers(self) -> list[str]:
        return [self.brokers[broker_id] for broker_id in sorted(self.brokers)]


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


def check_read(name: str, frame, lines: int, expected: dict) -> tuple[bool, dict]:
    """Print one reader's counts, exactly-once check and local/remote reads (tasks
    and records); whether all agree, and each task's (partition, host, locality)
    triples (one, unless something is wrong). The frame is read once (persisted)."""
    from pyspark.sql import functions as F
    frame = frame.withColumn("task", F.spark_partition_id()) \
        .withColumn("host", F.expr(TASK_HOST)).persist()
    try:
        counts = window_counts(frame)
        rows = frame.select("partition", "offset", "readLocality", "task", "host").collect()
    finally:
        frame.unpersist()
    distinct = len({(row.partition, row.offset) for row in rows})
    tasks = collections.defaultdict(set)
    records = collections.Counter()
    placements = collections.defaultdict(set)
    for row in rows:
        tasks[row.readLocality].add(row.task)
        records[row.readLocality] += 1
        placements[row.task].add((row.partition, row.host, row.readLocality))
    print(f"{name}: {len(rows)} records read, {distinct} distinct (partition, offset), "
          f"{len(counts)} (window, service, level) counts")
    print(f"{name} reads: local {len(tasks['local'])} tasks {records['local']} records, "
          f"remote {len(tasks['remote'])} tasks {records['remote']} records", flush=True)
    agreed = len(rows) == distinct == lines and counts == expected and \
        set(records) <= {"local", "remote"}
    print(f"{name}: {'every record read exactly once, counts agree' if agreed else 'DISAGREES'}")
    return agreed, dict(placements)


def check_placement(name: str, placements: dict, hosts: dict) -> bool:
    """Print where the reader's tasks ran and whether each task's read counted as its
    host says (``locality.placement_locality``: local exactly on a host of an in-sync
    replica of its partition, ``hosts``); True when every task's did. How many tasks
    land on such hosts is Spark's choice for ``format("shmlog")`` (it cannot pin
    them): only the agreement is certain, so only it decides."""
    wrong = []
    on_replica_hosts = 0
    for task, seen in sorted(placements.items()):
        (partition, host, locality), *more = sorted(seen)
        preferred = hosts[(TOPIC, partition)]
        on_replica_hosts += host in preferred
        expected = placement_locality(host, preferred).value
        if more or locality != expected:
            wrong.append(f"task {task} on {host} read partition {partition} {locality}, "
                         f"its host says {expected} (in-sync replicas on {preferred})"
                         + (f", and also read {more}" if more else ""))
    print(f"{name} placement: {on_replica_hosts} tasks on a host of an in-sync replica of "
          f"their partition, {len(placements) - on_replica_hosts} elsewhere; "
          + (f"DISAGREES: {'; '.join(wrong)}" if wrong else
             "every task's read counted as its host says"), flush=True)
    return not wrong


def run(directory: str, lines: int, zookeeper: str | None, hosts: Hosts) -> bool:
    state = os.path.join(directory, "spark")
    with LocalCluster(os.path.join(directory, "brokers"), BROKERS, zookeeper_connect=zookeeper,
                      settings=SETTINGS, hosts=hosts.brokers,
                      launch_prefixes=hosts.launch_prefixes, log_files=True) as cluster:
        spark_cluster.stop(state)
        spark_cluster.start(state, BROKERS, 1, "1g",
                            {host: cluster.data_dir(broker_id)
                             for broker_id, host in hosts.brokers.items()},
                            hosts=hosts.workers(), master_host=hosts.master,
                            launch_prefixes={hosts.brokers[broker_id]: prefix for broker_id, prefix
                                             in hosts.launch_prefixes.items()})
        try:
            return read_pipeline(cluster.data_dir(1), lines, hosts.master)
        finally:
            spark_cluster.stop(state)


def read_pipeline(driver_broker: str, lines: int, driver_host: str) -> bool:
    """Produce the lines through the driver's host's broker, read them with both
    readers; True when both agree."""
    Admin(driver_broker).create_topic(TOPIC, PARTITIONS, replication_factor=REPLICATION_FACTOR)
    expected = produce_lines(driver_broker, lines, 1_800_000_000_000)
    wait_caught_up(driver_broker, lines)
    # The executors connect back to the driver: at its host's address, which every
    # host reaches (this machine's host name may resolve to none of them); the
    # driver's JVM binds it too (SPARK_LOCAL_IP, as spark_cluster gives each daemon).
    os.environ["SPARK_LOCAL_IP"] = driver_host
    spark = session(spark_cluster.master_url(driver_host), "shmlog-cluster-pipeline",
                    **{"spark.ui.showConsoleProgress": "false",
                       "spark.sql.shuffle.partitions": str(PARTITIONS),
                       "spark.driver.host": driver_host,
                       "spark.driver.bindAddress": driver_host})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        options = {"bootstrap": driver_broker, "subscribe": TOPIC,
                   "includeReadLocality": "true"}
        hosts = replica_hosts(driver_broker, [TOPIC])
        reads = {"bulk_read": check_read("bulk_read", bulk_read(spark, **options), lines,
                                         dict(expected)),
                 "format(shmlog)": check_read(
                     "format(shmlog)", spark.read.format("shmlog").options(**options).load(),
                     lines, dict(expected))}
    finally:
        spark.stop()
    return all([agreed for agreed, _ in reads.values()]) and \
        placements_agree(reads, hosts, replica_hosts(driver_broker, [TOPIC]))


def placements_agree(reads: dict, hosts: dict, hosts_after: dict) -> bool:
    """:func:`check_placement` of every read, when the in-sync replicas stayed the
    same while they ran (else what counts as local changed under them: said, not
    judged)."""
    if hosts_after != hosts:
        print(f"the in-sync replicas changed during the reads ({hosts} -> {hosts_after}): "
              f"placements not judged", flush=True)
        return True
    return all([check_placement(name, placements, hosts)
                for name, (_, placements) in reads.items()])


def run_inside_namespaces(directory: str, lines: int, prefix: str) -> bool:
    """The run in host1 (``--inside-namespaces``): ZooKeeper on host1's address,
    then :func:`run` on the namespaces' hosts."""
    hosts = Hosts.namespaces(netns.Topology(HOST_MEMBERS, prefix=prefix))
    with ZooKeeperServer(os.path.join(directory, "zookeeper"), host=hosts.master) as zookeeper:
        return run(directory, lines, zookeeper.connect_string, hosts)


def run_in_namespaces(directory: str, lines: int) -> bool:
    """Make the hosts, run this program in host1 (:func:`run_inside_namespaces`),
    then remove the hosts, whatever still runs there, and the shared memory of a
    broker that did not stop by itself."""
    netns.sweep_dead_namespaces()                # those of an earlier run killed with -9
    topology = netns.Topology(HOST_MEMBERS)
    try:
        topology.create()
        for number, member in enumerate(HOST_MEMBERS, start=1):
            extra = " + ZooKeeper, Spark master, driver" if number == 1 else ""
            print(f"{member}: network namespace {topology.namespace(member)}, address "
                  f"{topology.address(member)}: broker {number}, Spark worker{extra}",
                  flush=True)
        inside = topology.run_in(HOST_MEMBERS[0], [
            sys.executable, os.path.abspath(__file__), "--lines", str(lines),
            "--directory", directory, "--inside-namespaces", topology.prefix])
        return wait_for_inside(inside) == 0
    finally:
        topology.teardown()
        # A broker killed (here or by the teardown) leaves its state table and
        # rings in /dev/shm; stop() on a cluster of no running broker removes them.
        LocalCluster(os.path.join(directory, "brokers"), BROKERS).stop()


def wait_for_inside(process: subprocess.Popen) -> int:
    """Its exit status. Ctrl-C reaches it too (one process group) and SIGTERM is
    passed on to it: it stops everything itself, so this waits for it, at most
    NAMESPACE_RUN_STOP_TIMEOUT_S, then raises KeyboardInterrupt; a second interrupt
    raises at once (the teardown stops whatever is left)."""
    interrupted_at: list[float] = []

    def pass_on(signal_number, _frame):
        if signal_number == signal.SIGTERM:
            process.send_signal(signal.SIGTERM)
        if interrupted_at:
            raise KeyboardInterrupt
        interrupted_at.append(time.monotonic())

    handlers = {number: signal.signal(number, pass_on)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                status = process.wait(timeout=INSIDE_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if interrupted_at and \
                        time.monotonic() > interrupted_at[0] + NAMESPACE_RUN_STOP_TIMEOUT_S:
                    raise KeyboardInterrupt from None
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if interrupted_at:
        raise KeyboardInterrupt
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", action="store_true",
                        help="run each host in a network namespace of its own (needs root)")
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--directory", help="default: a temporary directory, removed after")
    parser.add_argument("--zookeeper", help="a running ZooKeeper's HOST:PORT (default: start "
                        "one; not with --namespaces)")
    parser.add_argument("--inside-namespaces", metavar="PREFIX", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.namespaces:
        if args.zookeeper:
            parser.error("--zookeeper: with --namespaces, ZooKeeper runs on host1 (a "
                         "ZooKeeper of this machine's network is out of the hosts' reach)")
        reason = netns.unavailable_reason(nftables=False)
        if reason:
            print(f"{parser.prog} --namespaces: {reason}: the three hosts are network "
                  f"namespaces, which only root (CAP_NET_ADMIN) can make. Run it as root "
                  f"(e.g. with sudo), or without --namespaces to use loopback addresses.",
                  file=sys.stderr)
            return 2
    # SIGTERM stops everything as Ctrl-C does (KeyboardInterrupt: every finally runs).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    directory = os.path.abspath(args.directory or tempfile.mkdtemp(prefix="shmlog-cluster-"))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        if args.inside_namespaces:
            agreed = run_inside_namespaces(directory, args.lines, args.inside_namespaces)
        elif args.namespaces:
            agreed = run_in_namespaces(directory, args.lines)
        else:
            agreed = run(directory, args.lines, args.zookeeper, Hosts.loopback())
    except KeyboardInterrupt:
        if not args.inside_namespaces:
            print("interrupted: everything it started is stopped and removed", file=sys.stderr)
        return 130                           # a shell's status after SIGINT
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)
    if not args.inside_namespaces:           # said once, by the program the user started
        print("all reads agree with the lines produced" if agreed else
              "a read disagrees with the lines produced",
              file=sys.stdout if agreed else sys.stderr)
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
