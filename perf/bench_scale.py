"""One broker at scale: many partitions (10 to 10,000) and many producers (10 to 200),
each figure a curve with its growth, beside the goal of issue 26.

Goal
----
Say where every single-broker goal of issue 26 ("thousands of partitions per
broker") stands, as a curve over the partition counts of ``--partitions`` (default
10, 100, 1,000 and 10,000), with its growth per partition (the slope between the two
largest counts measured) and a verdict, "met" or "below". A goal stated at 10,000
partitions is judged at 10,000 when that was measured, else on the straight line
through the two largest counts (the verdict then says "extrapolated"). The goals:

* 10,000 partitions created in <= 5 s, as one topic and as 1,000 topics of 10;
* the first record sent to every partition in <= 10 s in all, under 1 ms each;
* resident memory <= 64 KiB per idle partition beyond the data it holds (RSS < 1 GB
  at 10,000);
* open files do not grow with segment count: at most about one per partition (the
  broker's RLIMIT_NOFILE soft/hard printed beside them);
* memory mappings (lines of /proc/PID/maps) fit under vm.max_map_count;
* idle CPU <= 2 % of a core;
* restart to serving in <= 10 s;
* a consumer assigned every partition pays per poll only for those with data: the
  median poll with every partition assigned and one busy, measured by
  perf/bench_poll_many.py on a broker of its own (``CONSUMER_POLL_MEASURE``).

And the many-producers goal: 200 producer processes on one broker, each with its
ring: the /dev/shm the rings take, how long registration takes, and drain fairness
(no producer starved, each one's acknowledged rate within 2x of the mean); past the
broker's ``producers_max`` a producer gets a typed error naming it.

Method
------
Partitions, for each count N of ``--partitions``, a fresh broker (``shmlog.Broker``,
a process of its own, ``partitions_max`` N + 64) in a fresh data directory:

1. its RSS (VmRSS, and its anonymous, file and shmem parts), open files
   (/proc/PID/fd), mappings (/proc/PID/maps) before anything is made;
2. create: one ``create_topic`` of N partitions, timed by the caller; the figures
   again (idle partitions: growth over step 1, per partition);
3. first record: a fresh producer process (acks=1, linger 5 ms) sends one record of
   100 bytes to each partition and waits for every future; the clock runs from the
   first send to the last future resolved (the producer's construction is reported
   on its own); the figures again, less the bytes the partitions hold
   (``list_offsets``' sizes): resident memory beyond the data. It sends to the first
   10 partitions, then waits while the broker's RSS settles: if the rest, at that
   rate, would not fit in half of MemAvailable, they are not sent and the step
   says so (on main 1,000 partitions would take ~40 GB);
4. idle CPU: the broker's utime + stime (/proc/PID/stat) over ``--idle-seconds``
   (10 s) of nothing to do, as a share of one core;
5. restart: a probe process (shmlog imported, the producer's kernels loaded) waits;
   the broker is stopped (SIGTERM, timed) and started again; from the start, the
   probe tries to construct a producer, send one record to the last partition, and
   read it back with a consumer assigned that partition, until both succeed:
   "restart to serving" is the start to that read;
6. topics of 10: another fresh broker, N/10 topics of 10 partitions made by one
   ``Admin.create_topics`` (Kafka's AdminClient.createTopics: the list in one
   request), timed as one; and on another fresh broker, one ``Admin.create_topic``
   request per topic (as ``kafka-topics --create`` makes them), timed as one.

Each point is bounded by ``--point-timeout`` (default 300 s): a request or child
process past it fails that figure. A figure that fails (a typed error, a timeout)
prints the error as its result and the point goes on with what it can; the next
point starts fresh.

Producers, for each count P of ``--producers`` (default 10, 50, 200), a fresh broker
(``producers_max`` P, so the limit is reached exactly) and a topic of P partitions:

1. P producer processes are started in waves of ``--start-concurrency`` (8; the
   next wave once the last is registered: 200 processes loading numba at once on
   2 cores starve the broker past a control request's 10 s timeout), with acks=1
   and ``ring_size`` from ``--ring-size`` (default the producer's); each times its
   ``Producer()`` (ctor) and its registration, ``Producer()`` to its first
   record's acknowledgement, then says "ready" (each wave bounded by
   ``READY_TIMEOUT_S``);
2. with all ready: the /dev/shm
   the rings take (st_size, and st_blocks: what tmpfs allocated), the broker's RSS,
   open files and mappings per producer (growth over before them);
3. one more producer is made here: past ``producers_max`` it must be refused with a
   typed error, printed;
4. "go": every producer sends ``send_batch``es of 100 records of 100 bytes to its own
   partition for ``--producer-seconds`` (5 s), with at most 8 batches
   unacknowledged, then waits for all; its acknowledged rate is its records over the
   time from "go" to its last acknowledgement. Reported: min, mean and max of the
   rates, max/mean and mean/min, and how many producers moved nothing (starved).

Before a producers point starts, MemAvailable must cover P x (``PRODUCER_MEMORY``
+ the ring): otherwise the point is skipped, with the reason (200 producer processes
take ~12 GB of private memory with numba and numpy loaded).

Beside each step, "others": how many cores processes other than the benchmark's
own (itself, its children, its broker) kept busy meanwhile (``bench_clients
.OtherLoad``); above 0.2 the report says the machine was not quiet. memcpy
(``bounds.memcpy_rate``) is printed for scale. Every data directory and every
/dev/shm object under its broker's prefix are removed at the end of each point, and
at the end of the run also when something failed or a SIGTERM came. ``--quick``
runs 10 and 100 partitions, 4 and 8 producers, short idle and send windows (a smoke
test of the script). ``--json`` writes every raw figure.

Expected figures
----------------
``--partitions 10,100,1000 --no-producers`` on the 2-vCPU development VM (24 GB,
Linux 6.18), November 2026, with main's storage (0b9f882, before the lead's storage
fix), a busy machine (others 1.6-1.9 cores: times are inflated):

==================================  =======  =======  ========  ===========  ==============
figure                              10       100      1,000     growth/part  goal at 10,000
==================================  =======  =======  ========  ===========  ==============
create, one topic                   0.04 s   0.10 s   3.4 s     3.6 ms       below (ext.)
create, topics of 10                0.01 s   0.37 s   10.1 s    11 ms        below (ext.)
first record to all                 0.58 s   9.9 s    (skipped) 104 ms       below (ext.)
RSS added, idle partitions          0.08 MiB 0.79 MiB 8.9 MiB   9 KiB        met
RSS added beyond data, 1 rec each   402 MiB  4.0 GiB  (skipped) 40 MiB       below
open files added, idle              60       599      6,000     6            below
mappings added, idle                30       301      3,004     3            met (ext.)
idle CPU, % of a core               0.6      0.6      0.7       ~0           met (ext.)
restart to serving                  3.8 s    5.7 s    9.0 s     3.7 ms       below (ext.)
==================================  =======  =======  ========  ===========  ==============

At 1,000 the first records stop after 10 partitions: at 40.3 MiB a partition the
rest would take ~42 GB. What bounds them on main: every partition's active segment
reserves and populates 40 MiB of page cache at its first append (8 MiB inline, the
prefaulter the rest), and keeps a descriptor per mapping (CPython's mmap keeps one)
and per file: 6 a partition, so 10,000 partitions exceed RLIMIT_NOFILE (20,000 here).

Producers: see the run's table; rings are allocated whole at creation
(``shared_memory._allocate``): 200 producers took 3.2 GB of /dev/shm with the old
16 MiB default ring, 400 MiB with the 2 MiB one.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import harness  # noqa: E402 - before shmlog: this checkout's, here and in children
from harness import REPOSITORY  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
RECORD_SIZE = 100
PARTITIONS_DEFAULT = (10, 100, 1000, 10_000)
PRODUCERS_DEFAULT = (10, 50, 200)
QUICK = {"partitions": (10, 100), "producers": (4, 8), "idle_seconds": 2.0,
         "producer_seconds": 1.0}
PARTITIONS_MAX_MARGIN = 64          # rows beyond N: __consumer_offsets is made on demand
TOPIC_OF_TEN = 10
IDLE_SECONDS_DEFAULT = 10.0
PRODUCER_SECONDS_DEFAULT = 5.0
POINT_TIMEOUT_S = 300.0             # one point's every request and child process
STOP_TIMEOUT_S = 60.0               # a broker's graceful stop, then SIGKILL
READY_TIMEOUT_S = 120.0             # a child's start-up (a cold numba cache) ...
READY_PER_PRODUCER_S = 2.0          # a producers point: this more per producer
# Producer processes started at once: a wave is started when the last one is
# registered. All at once, 200 processes loading numba on 2 cores starve the broker
# of CPU for longer than a control request's 10 s timeout.
START_CONCURRENCY = 8
RETRY_SLEEP_S = 0.02                # the restart probe between attempts
POLL_TIMEOUT_MS = 100
PROBE_PARTITIONS = 10               # first records sent before the memory is weighed
PROBE_MEMORY_SHARE = 0.5            # the rest must fit in this share of MemAvailable
SETTLE_INTERVAL_S = 0.25            # the broker's RSS is sampled this often ...
SETTLE_TIMEOUT_S = 15.0             # ... until it stops growing, at most this long
BATCH_ROWS = 100                    # a many-producers send_batch: 100 x 100 B
IN_FLIGHT_BATCHES = 8               # unacknowledged batches per producer, at most
# Private memory of a producer process (numba and numpy loaded: 60 MB measured)
# with a margin: a producers point needs P times this plus the rings available.
PRODUCER_MEMORY = 70 * MIB
OTHER_CORES_WARNING = 0.2

# Goals of issue 26 (one broker).
GOAL_PARTITIONS = 10_000
CREATE_GOAL_S = 5.0
FIRST_RECORDS_GOAL_S = 10.0
FIRST_RECORD_EACH_GOAL_MS = 1.0
RSS_PER_PARTITION_GOAL = 64 * KIB
RSS_TOTAL_GOAL = 1 << 30
FILES_PER_PARTITION_GOAL = 1.1      # "at most about one per partition"
IDLE_CPU_GOAL = 0.02
RESTART_GOAL_S = 10.0
FAIRNESS_GOAL = 2.0                 # max/mean and mean/min

def _consumer_poll_measure(data_dir: str, topic: str, partitions: int) -> dict:
    """The consumer's per-poll cost with every one of ``partitions`` assigned and one
    busy (perf/bench_poll_many.py, on a broker of its own: one partition there holds
    the batches the polls take); "per_poll_us" is printed in the table."""
    from bench_poll_many import measure
    figures = measure(partitions, seconds=1.0)
    return {**figures, "per_poll_us": figures["busy_poll_s"] * 1e6,
            "idle_poll_us": figures["idle_poll_s"] * 1e6}


# The consumer journal's per-poll figure, called as CONSUMER_POLL_MEASURE(data_dir,
# topic, partitions) with the broker serving; it returns a dict of figures, its
# "per_poll_us" printed in the table.
CONSUMER_POLL_MEASURE = _consumer_poll_measure


# --- the broker's process, from /proc -------------------------------------------------

def _status_kib(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0]) * KIB
    return fields


def process_figures(pid: int) -> dict:
    """Resident memory (and its parts), open files and memory mappings of ``pid``."""
    with open(f"/proc/{pid}/maps") as maps:
        mappings = sum(1 for _ in maps)
    status = _status_kib(pid)
    return {"rss": status.get("VmRSS", 0), "rss_anon": status.get("RssAnon", 0),
            "rss_file": status.get("RssFile", 0), "rss_shmem": status.get("RssShmem", 0),
            "open_files": len(os.listdir(f"/proc/{pid}/fd")), "mappings": mappings}


def open_files_limit(pid: int) -> tuple[str, str]:
    """RLIMIT_NOFILE of ``pid`` (soft, hard), as /proc/PID/limits says it."""
    with open(f"/proc/{pid}/limits") as limits_file:
        for line in limits_file:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    return "?", "?"


def max_map_count() -> int:
    with open("/proc/sys/vm/max_map_count") as source:
        return int(source.read())


def memory_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KIB
    return 0


def segment_files(data_dir: str) -> int:
    return sum(name.endswith(".log") for _, _, names in os.walk(data_dir) for name in names)


# --- the client processes (each prints JSON lines) ---------------------------------------

def _send_one_each(producer, topic: str, partitions: range, deadline: float) -> float:
    """One record to each of ``partitions``; seconds until every future resolved."""
    value = os.urandom(RECORD_SIZE)
    started = time.perf_counter()
    futures = [producer.send(topic, value, partition=partition) for partition in partitions]
    for future in futures:
        future.get(timeout=max(deadline - time.perf_counter(), 0.001))
    return time.perf_counter() - started


def first_records(data_dir: str, topic: str, partitions: int, wait_s: float) -> dict:
    """One record of RECORD_SIZE bytes to every partition (acks=1, linger 5 ms): the
    first PROBE_PARTITIONS, then (if the parent says "go" after weighing the memory
    they took) the rest; the clock runs from each phase's first send until its every
    future resolved, the two phases added."""
    from shmlog import Producer
    constructing = time.perf_counter()
    with Producer(data_dir, acks=1, linger_ms=5, max_block_ms=int(wait_s * 1000)) as producer:
        started = time.perf_counter()
        deadline = started + wait_s
        probe = min(PROBE_PARTITIONS, partitions)
        seconds = _send_one_each(producer, topic, range(probe), deadline)
        print("probe", flush=True)
        if sys.stdin.readline().strip() != "go":
            return {"seconds": None, "probe_seconds": seconds, "records": probe}
        seconds += _send_one_each(producer, topic, range(probe, partitions), deadline)
    return {"seconds": seconds, "construct_s": started - constructing, "records": partitions}


def _serve_once(data_dir: str, topic: str, partition: int) -> None:
    """Produce one record to ``partition`` and read it back (raises until it can)."""
    from shmlog import Consumer, Producer, TopicPartition
    with Producer(data_dir, acks=1, linger_ms=0, max_block_ms=1000) as producer:
        offset = producer.send(topic, b"restart", partition=partition).get(timeout=5).offset
    where = TopicPartition(topic, partition)
    with Consumer(bootstrap=data_dir) as consumer:
        consumer.assign([where])
        consumer.seek(where, offset)
        for _ in range(50):
            if consumer.poll(timeout_ms=POLL_TIMEOUT_MS).get(where):
                return
    raise RuntimeError(f"the record produced to {topic}[{partition}] at offset {offset} "
                       f"was not read back within 5 s")


def restart_probe(data_dir: str, topic: str, partition: int, wait_s: float) -> dict:
    """Load the clients' kernels, say "ready", wait for "go"; then try to produce to
    and fetch from ``partition`` until both succeed: the monotonic time they did."""
    from shmlog.client.producer import warm_kernels
    from shmlog.common.errors import ShmlogError
    warm_kernels()
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + wait_s
    attempts, last_error = 0, ""
    while time.monotonic() < deadline:
        attempts += 1
        try:
            _serve_once(data_dir, topic, partition)
            return {"served_at": time.monotonic(), "attempts": attempts}
        except (ShmlogError, RuntimeError) as error:
            last_error = f"{type(error).__name__}: {error}"
            time.sleep(RETRY_SLEEP_S)
    return {"served_at": None, "attempts": attempts, "error": last_error}


def many_producer(data_dir: str, topic: str, partition: int, seconds: float,
                  ring_size: int | None, wait_s: float) -> dict:
    """One of many producers: time its registration (construction to its first
    acknowledgement), say "ready" with it, wait for "go", send batches to its own
    partition for ``seconds`` (at most IN_FLIGHT_BATCHES unacknowledged)."""
    import numpy as np

    from shmlog import Producer
    rows = np.random.default_rng(partition).integers(0, 256, (BATCH_ROWS, RECORD_SIZE),
                                                     np.uint8)
    options = {} if ring_size is None else {"ring_size": ring_size}
    constructing = time.monotonic()
    with Producer(data_dir, acks=1, linger_ms=0, **options) as producer:
        constructed = time.monotonic()
        producer.send(topic, b"first", partition=partition).get(timeout=wait_s)
        print("ready " + json.dumps({"registration_s": time.monotonic() - constructing,
                                     "construct_s": constructed - constructing,
                                     "ring": producer.ring.name}), flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        deadline = started + seconds
        futures, acknowledged = [], 0
        while time.monotonic() < deadline:
            futures.append(producer.send_batch(topic, rows, partition=partition))
            if len(futures) > IN_FLIGHT_BATCHES:
                futures.pop(0).get(timeout=wait_s)
                acknowledged += BATCH_ROWS
        for future in futures:
            future.get(timeout=wait_s)
            acknowledged += BATCH_ROWS
        elapsed = time.monotonic() - started
    return {"records": acknowledged, "seconds": elapsed, "rate": acknowledged / elapsed}


ROLES = {function.__name__: function for function in (first_records, restart_probe,
                                                       many_producer)}


# --- running them ---------------------------------------------------------------------

class Processes:
    """Every process this run started and has not reaped: stopped at the end, also
    on an error or a SIGTERM."""

    def __init__(self):
        self.children: list[subprocess.Popen] = []
        self.brokers: list = []

    def start(self, role: str, **arguments) -> subprocess.Popen:
        # Unbuffered: the parent reads lines from many children with select.
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                  "--arguments", json.dumps(arguments)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.children.append(child)
        return child

    def broker(self, data_dir: str, **settings):
        from shmlog import Broker
        broker = Broker(data_dir, startup_timeout_s=READY_TIMEOUT_S, **settings)
        self.brokers.append(broker)
        return broker.start()

    def stop_broker(self, broker) -> float:
        """Stop ``broker`` (SIGTERM, SIGKILL after STOP_TIMEOUT_S); seconds taken."""
        started = time.monotonic()
        broker.stop(STOP_TIMEOUT_S)
        if broker in self.brokers:
            self.brokers.remove(broker)
        return time.monotonic() - started

    def stop_all(self) -> None:
        for child in self.children:
            _stop(child)
        self.children.clear()
        for broker in list(self.brokers):
            self.stop_broker(broker)


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=30)
    for stream in (child.stdin, child.stdout):
        if stream:
            try:
                stream.close()
            except OSError:
                pass             # a pipe to a killed child


def read_lines(children: list, prefix: bytes, deadline: float) -> list:
    """One line starting with ``prefix`` from each child, in order (their rest as
    text); RuntimeError when one exits first or the deadline passes."""
    lines = {child: b"" for child in children}
    waiting = set(children)
    while waiting:
        left = deadline - time.monotonic()
        ready = select.select([child.stdout for child in waiting], [], [], max(left, 0))[0] \
            if left > 0 else []
        if not ready:
            raise RuntimeError(f"{len(waiting)} of {len(children)} child processes did not "
                               f"say {prefix.decode()!r} in time")
        for child in [child for child in waiting if child.stdout in ready]:
            byte = child.stdout.read(1)
            if not byte:
                raise RuntimeError(f"a child process exited (status {child.wait(30)}) before "
                                   f"saying {prefix.decode()!r}; its errors are above")
            lines[child] += byte
            if byte == b"\n":
                waiting.discard(child)
    for line in lines.values():
        if not line.startswith(prefix):
            raise RuntimeError(f"a child process said {line!r}, expected {prefix!r}")
    return [lines[child][len(prefix):].strip().decode() for child in children]


def finish(processes: Processes, child: subprocess.Popen, role: str, deadline: float) -> dict:
    """The last JSON line ``child`` printed; killed if not done by ``deadline``."""
    try:
        output, _ = child.communicate(timeout=max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{role} did not finish within its point's timeout") from None
    finally:
        _stop(child)
        if child in processes.children:
            processes.children.remove(child)
    if child.returncode != 0:
        raise RuntimeError(f"{role} exited with status {child.returncode} (its errors are "
                           f"above)")
    return json.loads(output.splitlines()[-1])


def go(children: list, line: bytes = b"go\n") -> None:
    for child in children:
        child.stdin.write(line)
        child.stdin.flush()


def failure(error: BaseException) -> dict:
    return {"error": f"{type(error).__name__}: {error}"}


def _data_dir(prefix: str) -> str:
    data_dir = tempfile.mkdtemp(prefix=prefix)
    print(f"broker data directory {data_dir} (removed at the end)", flush=True)
    return data_dir


def remove_data(data_dir: str) -> list[str]:
    """Remove the data directory and the /dev/shm objects under its broker's prefix
    (a child killed on a timeout leaves its ring); those names."""
    from shmlog.server.broker import shared_memory_prefix
    from shmlog.shm import shared_memory
    prefix = shared_memory_prefix(data_dir)
    left = shared_memory.names(prefix)
    for name in left:
        shared_memory.unlink(name)
    shutil.rmtree(data_dir, ignore_errors=True)
    return left


# --- partitions -------------------------------------------------------------------------

def timed(step, deadline: float):
    """(seconds, result) of ``step(timeout_ms)``; the timeout is what is left of the
    point's."""
    left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
    started = time.perf_counter()
    result = step(left_ms)
    return time.perf_counter() - started, result


def measure_partitions(processes: Processes, count: int, options) -> dict:
    """Every partitions figure at ``count`` (see the module's method); a step that
    fails leaves its error in its figure's place."""
    point: dict = {"partitions": count}
    data_dir = _data_dir(f"shmlog-bench-scale-{count}-")
    deadline = time.monotonic() + options.point_timeout
    try:
        broker = processes.broker(data_dir, partitions_max=count + PARTITIONS_MAX_MARGIN)
        point["nofile_soft_hard"] = open_files_limit(broker.process.pid)
        point["before"] = process_figures(broker.process.pid)
        _run_steps(point, processes, broker, data_dir, count, options, deadline)
        processes.stop_broker(broker)
    except Exception as error:       # the point's result; the next one starts fresh
        point["broker"] = failure(error)
    finally:
        processes.stop_all()
        point["shared_memory_left"] = remove_data(data_dir)
    point["create_topics_of_ten"] = _topics_of_ten(processes, count, options, batch=True)
    point["create_topics_one_by_one"] = _topics_of_ten(processes, count, options, batch=False)
    return point


def _run_steps(point, processes, broker, data_dir, count, options, deadline) -> None:
    """The point's steps in order; "others" covers them up to the restart (which
    replaces the broker's process, whose CPU time it counts)."""
    from bench_clients import OtherLoad
    others = OtherLoad(broker.process.pid)
    steps = (("create", _create), ("first_records", _first_records), ("idle", _idle),
             ("consumer_poll", _consumer_poll), ("restart", _restart))
    for name, step in steps:
        if name == "restart":
            point["other_cores"] = others.cores()
        if time.monotonic() > deadline:
            point[name] = {"error": f"the point's {options.point_timeout:g} s were over"}
            continue
        try:
            point[name] = step(processes, broker, data_dir, count, options, deadline)
        except Exception as error:
            point[name] = failure(error)
            if name == "create":
                return              # no topic: nothing else can be measured


def _create(processes, broker, data_dir, count, options, deadline) -> dict:
    from shmlog import Admin
    seconds, _ = timed(lambda timeout_ms: Admin(data_dir, timeout_ms=timeout_ms)
                       .create_topic("scale", count), deadline)
    return {"seconds": seconds, **process_figures(broker.process.pid),
            "segment_files": segment_files(data_dir)}


def _first_records(processes, broker, data_dir, count, options, deadline) -> dict:
    """One record to each partition; after the first PROBE_PARTITIONS the broker's
    memory is weighed, and the rest are not sent if, at that rate, they would not fit
    in half of MemAvailable (on main, 1,000 partitions would take ~40 GB)."""
    from shmlog import Admin
    pid = broker.process.pid
    before = process_figures(pid)["rss"]
    child = processes.start("first_records", data_dir=data_dir, topic="scale",
                            partitions=count, wait_s=deadline - time.monotonic())
    read_lines([child], b"probe", deadline)
    probed = min(PROBE_PARTITIONS, count)
    per_partition = (_settled_rss(pid, deadline) - before) / probed
    needed, available = per_partition * (count - probed), memory_available()
    refusal = needed > available * PROBE_MEMORY_SHARE
    go([child], b"stop\n" if refusal else b"go\n")
    result = finish(processes, child, "first_records", deadline)
    if refusal:
        raise MemoryError(f"not sent to the other {count - probed:,} partitions: at "
                          f"{per_partition / MIB:,.1f} MiB a partition (the first {probed}) "
                          f"they would take ~{needed / 1e9:,.1f} GB of the broker's memory, "
                          f"{available / 1e9:,.1f} GB being available")
    sizes = Admin(data_dir, timeout_ms=int(max(deadline - time.monotonic(), 1) * 1000)) \
        .list_offsets("scale")
    return {**result, **process_figures(pid),
            "data_bytes": sum(partition["size"] for partition in sizes),
            "segment_files": segment_files(data_dir)}


def _settled_rss(pid: int, deadline: float) -> int:
    """The broker's RSS once it stopped growing (its prefaulter works after the
    append that asked for it), within SETTLE_TIMEOUT_S."""
    last = process_figures(pid)["rss"]
    until = min(deadline, time.monotonic() + SETTLE_TIMEOUT_S)
    while time.monotonic() < until:
        time.sleep(SETTLE_INTERVAL_S)
        now = process_figures(pid)["rss"]
        if now - last < MIB:
            return now
        last = now
    return last


def _idle(processes, broker, data_dir, count, options, deadline) -> dict:
    from bench_clients import _cpu_seconds
    pid = broker.process.pid
    seconds = min(options.idle_seconds, max(deadline - time.monotonic(), 0.1))
    cpu, started = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {"seconds": elapsed, "cpu_share": (_cpu_seconds(pid) - cpu) / elapsed}


def _consumer_poll(processes, broker, data_dir, count, options, deadline) -> dict:
    if CONSUMER_POLL_MEASURE is None:
        return {"error": "not measured: CONSUMER_POLL_MEASURE (the consumer journal's "
                         "function) is not set"}
    return CONSUMER_POLL_MEASURE(data_dir, "scale", count)


def _restart(processes, broker, data_dir, count, options, deadline) -> dict:
    probe = processes.start("restart_probe", data_dir=data_dir, topic="scale",
                            partition=count - 1, wait_s=max(deadline - time.monotonic(), 1))
    read_lines([probe], b"ready", min(deadline, time.monotonic() + READY_TIMEOUT_S))
    stop_s = processes.stop_broker(broker)
    started = time.monotonic()
    broker.launch()
    processes.brokers.append(broker)
    go([probe])
    result = finish(processes, probe, "restart_probe", deadline)
    if result["served_at"] is None:
        raise RuntimeError(f"not serving after {deadline - started:.0f} s: "
                           f"{result['error']}")
    broker.wait_until_serving()
    return {"stop_s": stop_s, "seconds": result["served_at"] - started,
            "attempts": result["attempts"], **process_figures(broker.process.pid)}


def _topics_of_ten(processes: Processes, count: int, options, *, batch: bool) -> dict:
    """N/10 topics of 10 on a fresh broker, in one create_topics (``batch``) or one
    request each: their creation timed as one."""
    from shmlog import Admin
    from shmlog.client.admin import NewTopic
    data_dir = _data_dir(f"shmlog-bench-scale-topics-{count}-")
    deadline = time.monotonic() + options.point_timeout
    try:
        broker = processes.broker(data_dir, partitions_max=count + PARTITIONS_MAX_MARGIN)
        topics = [NewTopic(f"ten-{index}", TOPIC_OF_TEN)
                  for index in range(max(count // TOPIC_OF_TEN, 1))]

        def create(timeout_ms: int) -> None:
            admin = Admin(data_dir, timeout_ms=timeout_ms)
            if batch:
                admin.create_topics(topics)
                return
            for topic in topics:
                admin.create_topic(topic.name, topic.num_partitions)
        seconds, _ = timed(create, deadline)
        result = {"seconds": seconds, "topics": len(topics),
                  **process_figures(broker.process.pid)}
        processes.stop_broker(broker)
        return result
    except Exception as error:
        return failure(error)
    finally:
        processes.stop_all()
        remove_data(data_dir)


# --- many producers ---------------------------------------------------------------------

def ring_usage(prefix: str) -> dict:
    """The producers' rings under ``prefix`` in /dev/shm: nominal bytes (st_size) and
    what tmpfs allocated (st_blocks)."""
    from shmlog.shm import shared_memory
    nominal = allocated = rings = 0
    for name in shared_memory.names(prefix + "-producer-"):
        try:
            status = os.stat(os.path.join(shared_memory.DIRECTORY, name))
        except FileNotFoundError:
            continue
        rings += 1
        nominal += status.st_size
        allocated += status.st_blocks * 512
    return {"rings": rings, "nominal_bytes": nominal, "allocated_bytes": allocated}


def measure_producers(processes: Processes, count: int, options) -> dict:
    """Every many-producers figure at ``count`` (see the module's method)."""
    from bench_clients import OtherLoad
    ring = options.ring_size or _ring_size_default()
    needed = count * (PRODUCER_MEMORY + ring)
    if memory_available() < needed:
        return {"producers": count, "error": f"skipped: {count} producers need ~"
                f"{needed / 1e9:.1f} GB and MemAvailable is {memory_available() / 1e9:.1f} GB"}
    point: dict = {"producers": count, "ring_size": ring}
    data_dir = _data_dir(f"shmlog-bench-scale-producers-{count}-")
    try:
        broker = processes.broker(data_dir, partitions_max=count + PARTITIONS_MAX_MARGIN,
                                  producers_max=count)
        others = OtherLoad(broker.process.pid)
        _run_producers(point, processes, broker, data_dir, count, options)
        point["other_cores"] = others.cores()
    except Exception as error:
        point["error"] = failure(error)["error"]
    finally:
        processes.stop_all()
        point["shared_memory_left"] = remove_data(data_dir)
    return point


def _ring_size_default() -> int:
    from shmlog.common import limits
    return limits.RING_SIZE_DEFAULT


def _run_producers(point, processes, broker, data_dir, count, options) -> None:
    from shmlog import Admin
    from shmlog.server.broker import shared_memory_prefix
    deadline = time.monotonic() + options.point_timeout + READY_PER_PRODUCER_S * count
    Admin(data_dir).create_topic("producers", count)
    point["before"] = process_figures(broker.process.pid)
    children, ready = [], []
    for first in range(0, count, options.start_concurrency):
        wave = [processes.start("many_producer", data_dir=data_dir, topic="producers",
                                partition=index, seconds=options.producer_seconds,
                                ring_size=options.ring_size, wait_s=options.point_timeout)
                for index in range(first, min(first + options.start_concurrency, count))]
        children += wave
        ready += read_lines(wave, b"ready", min(deadline, time.monotonic() + READY_TIMEOUT_S))
    point["registration_s"] = [json.loads(line)["registration_s"] for line in ready]
    point["construct_s"] = [json.loads(line)["construct_s"] for line in ready]
    point["registered"] = process_figures(broker.process.pid)
    point["shm"] = ring_usage(shared_memory_prefix(data_dir))
    point["past_the_limit"] = _one_too_many(data_dir)
    go(children)
    results = [finish(processes, child, "many_producer", deadline) for child in children]
    point["rates"] = [result["rate"] for result in results]
    point["records"] = [result["records"] for result in results]


def _one_too_many(data_dir: str) -> dict:
    """Construct one producer past the broker's producers_max: its typed error."""
    from shmlog import Producer
    from shmlog.common.errors import ShmlogError
    try:
        Producer(data_dir).close()
    except ShmlogError as error:
        return {"refused": True, **failure(error)}
    return {"refused": False}


# --- the report ---------------------------------------------------------------------------

def verdict(met: bool) -> str:
    return "met" if met else "below"


def figure(point: dict, path: tuple):
    """``point[a][b]...``, or None when a step failed or never ran."""
    value = point
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _rss_beyond_data(point: dict):
    after, before = figure(point, ("first_records", "rss")), figure(point, ("before", "rss"))
    data = figure(point, ("first_records", "data_bytes"))
    return None if None in (after, before, data) else after - before - data


def _idle_rss(point: dict):
    after, before = figure(point, ("create", "rss")), figure(point, ("before", "rss"))
    return None if None in (after, before) else after - before


def _per_record_ms(point: dict):
    seconds = figure(point, ("first_records", "seconds"))
    return None if seconds is None else seconds * 1000 / point["partitions"]


def _cpu_percent(point: dict):
    share = figure(point, ("idle", "cpu_share"))
    return None if share is None else share * 100


def _restart_s(point: dict):
    return figure(point, ("restart", "seconds"))


def _poll_us(point: dict):
    return figure(point, ("consumer_poll", "per_poll_us"))


def _added(path: tuple):
    def value(point: dict):
        after, before = figure(point, path), figure(point, ("before", path[-1]))
        return None if None in (after, before) else after - before
    return value


# (label, unit scale and name, value of a point, a total that grows with N?, its step
# for errors)
ROWS = (
    ("create, one topic", 1.0, "s", lambda p: figure(p, ("create", "seconds")), True, "create"),
    ("create, topics of 10", 1.0, "s", lambda p: figure(p, ("create_topics_of_ten", "seconds")),
     True, "create_topics_of_ten"),
    ("create, topics of 10, one per request", 1.0, "s",
     lambda p: figure(p, ("create_topics_one_by_one", "seconds")), True,
     "create_topics_one_by_one"),
    ("first record to all", 1.0, "s", lambda p: figure(p, ("first_records", "seconds")), True,
     "first_records"),
    ("first record, per partition", 1.0, "ms", _per_record_ms, False, "first_records"),
    ("RSS added, idle partitions", 1 / MIB, "MiB", _idle_rss, True, "create"),
    ("RSS added beyond data, 1 rec each", 1 / MIB, "MiB", _rss_beyond_data, True,
     "first_records"),
    ("open files added, idle", 1.0, "", _added(("create", "open_files")), True, "create"),
    ("open files added", 1.0, "", _added(("first_records", "open_files")), True,
     "first_records"),
    ("segment files", 1.0, "", lambda p: figure(p, ("first_records", "segment_files")), True,
     "first_records"),
    ("mappings added, idle", 1.0, "", _added(("create", "mappings")), True, "create"),
    ("mappings added", 1.0, "", _added(("first_records", "mappings")), True, "first_records"),
    ("idle CPU, % of a core", 1.0, "%", _cpu_percent, True, "idle"),
    ("restart to serving", 1.0, "s", _restart_s, True, "restart"),
    ("consumer poll, all assigned, 1 busy", 1.0, "us", _poll_us, False, "consumer_poll"),
)


def growth(points: list, value) -> tuple | None:
    """(slope per partition, the two counts) between the two largest counts measured."""
    measured = [(point["partitions"], value(point)) for point in points
                if value(point) is not None]
    if len(measured) < 2:
        return None
    (n1, v1), (n2, v2) = sorted(measured)[-2:]
    return (v2 - v1) / (n2 - n1), n1, n2


def at_goal_count(points: list, value) -> tuple | None:
    """(value at GOAL_PARTITIONS, extrapolated?) from the measured curve."""
    for point in points:
        if point["partitions"] == GOAL_PARTITIONS and value(point) is not None:
            return value(point), False
    slope = growth(points, value)
    if slope is None:
        return None
    rate, _, n2 = slope
    last = next(value(point) for point in points if point["partitions"] == n2)
    return last + rate * (GOAL_PARTITIONS - n2), True


def goals(points: list, maps_max: int) -> dict:
    """Each goal: (its text, met?) or None when nothing measured it."""
    def judged(value, test, text):
        found = at_goal_count(points, value)
        if found is None:
            return None
        amount, extrapolated = found
        return text + (" (extrapolated)" if extrapolated else ""), test(amount)

    def slope_judged(value, test, text):
        found = growth(points, value)
        return None if found is None else (text, test(found[0]))

    first_records = lambda p: figure(p, ("first_records", "seconds"))   # noqa: E731
    rows = {
        "create, one topic": judged(ROWS[0][3], lambda s: s <= CREATE_GOAL_S,
                                    f"<= {CREATE_GOAL_S:g} s at 10,000"),
        "create, topics of 10": judged(ROWS[1][3], lambda s: s <= CREATE_GOAL_S,
                                       f"<= {CREATE_GOAL_S:g} s at 10,000"),
        "create, topics of 10, one per request": judged(
            ROWS[2][3], lambda s: s <= CREATE_GOAL_S, f"<= {CREATE_GOAL_S:g} s at 10,000"),
        "first record to all": judged(first_records, lambda s: s <= FIRST_RECORDS_GOAL_S,
                                      f"<= {FIRST_RECORDS_GOAL_S:g} s at 10,000"),
        "first record, per partition": slope_judged(
            first_records, lambda s: s * 1000 < FIRST_RECORD_EACH_GOAL_MS,
            f"< {FIRST_RECORD_EACH_GOAL_MS:g} ms each (growth)"),
        "RSS added, idle partitions": slope_judged(
            _idle_rss, lambda b: b <= RSS_PER_PARTITION_GOAL, "<= 64 KiB per partition"),
        "RSS added beyond data, 1 rec each": judged(
            lambda p: figure(p, ("first_records", "rss")), lambda b: b < RSS_TOTAL_GOAL,
            "RSS < 1 GB at 10,000"),
        "open files added, idle": slope_judged(_added(("create", "open_files")),
                                               lambda f: f <= FILES_PER_PARTITION_GOAL,
                                               "about 1 per partition"),
        "open files added": slope_judged(_added(("first_records", "open_files")),
                                         lambda f: f <= FILES_PER_PARTITION_GOAL,
                                         "about 1 per partition"),
        "mappings added, idle": judged(lambda p: figure(p, ("create", "mappings")),
                                       lambda m: m < maps_max, "< vm.max_map_count at 10,000"),
        "mappings added": judged(lambda p: figure(p, ("first_records", "mappings")),
                                 lambda m: m < maps_max, "< vm.max_map_count at 10,000"),
        "idle CPU, % of a core": judged(_cpu_percent, lambda c: c <= IDLE_CPU_GOAL * 100,
                                        f"<= {IDLE_CPU_GOAL * 100:g} % at 10,000"),
        "restart to serving": judged(_restart_s, lambda s: s <= RESTART_GOAL_S,
                                     f"<= {RESTART_GOAL_S:g} s at 10,000"),
    }
    # The beyond-data figure has two goals: the slope and the total.
    beyond = slope_judged(_rss_beyond_data, lambda b: b <= RSS_PER_PARTITION_GOAL,
                          "<= 64 KiB per partition")
    if beyond is not None and rows["RSS added beyond data, 1 rec each"] is not None:
        text, met = rows["RSS added beyond data, 1 rec each"]
        rows["RSS added beyond data, 1 rec each"] = (f"{beyond[0]}, {text}",
                                                     beyond[1] and met)
    return rows


def _cell(point: dict, value, scale: float, step: str) -> str:
    amount = value(point)
    if amount is not None:
        return f"{amount * scale:,.3g}" if abs(amount * scale) < 1000 else \
            f"{amount * scale:,.0f}"
    error = figure(point, (step, "error")) or figure(point, ("broker", "error")) or ""
    return "error" if error and not error.startswith("not measured") else "-"


def report_partitions(points: list, maps_max: int) -> None:
    if not points:
        return
    counts = [point["partitions"] for point in points]
    judged = goals(points, maps_max)
    print(f"{'figure':<36}" + "".join(f"{count:>11,}" for count in counts)
          + f"  {'growth/partition':>18}   goal")
    for label, scale, unit, value, total, step in ROWS:
        cells = "".join(f"{_cell(point, value, scale, step):>11}" for point in points)
        slope = growth(points, value) if total else None
        slope_text = "-" if slope is None else f"{slope[0] * scale:,.3g} {unit}".strip()
        goal = judged.get(label)
        goal_text = "" if goal is None else f"{goal[0]}: {verdict(goal[1])}"
        print(f"{label + (f' ({unit})' if unit else ''):<36}{cells}  {slope_text:>18}   "
              f"{goal_text}")
    print()
    for point in points:
        print(f"{point['partitions']:,} partitions: broker RLIMIT_NOFILE soft/hard "
              f"{'/'.join(point.get('nofile_soft_hard', ('?', '?')))}, mappings "
              f"{figure(point, ('first_records', 'mappings')) or '?'} of vm.max_map_count "
              f"{maps_max:,}, open files {figure(point, ('first_records', 'open_files')) or '?'}"
              f", others {point.get('other_cores', float('nan')):.2f} cores")
        for step in ("broker", "create", "first_records", "idle", "consumer_poll", "restart",
                     "create_topics_of_ten", "create_topics_one_by_one"):
            error = figure(point, (step, "error"))
            if error:
                print(f"    {step}: {error}")


def report_producers(points: list) -> None:
    if not points:
        return
    print(f"{'producers':>9} {'ring':>8} {'shm nominal':>12} {'shm alloc.':>11} "
          f"{'ctor p50':>8} {'reg. p50/max s':>15} {'min/mean/max rec/s':>26} "
          f"{'max/mean':>8} {'mean/min':>8} "
          f"{'starved':>7} {'anon+shm/prod':>13} {'fds/prod':>8}  limit")
    for point in points:
        if "rates" not in point:
            print(f"{point['producers']:>9}   {point.get('error', 'no figures')}")
            continue
        print(_producers_line(point))
    refusals = [point["past_the_limit"] for point in points if "past_the_limit" in point]
    if refusals:
        print(f"one producer past producers_max: {refusals[-1].get('error', 'NOT refused')}")
    verdicts = [_fair(point) for point in points if "rates" in point]
    if verdicts:
        print(f"fairness goal (no producer starved, max/mean and mean/min <= "
              f"{FAIRNESS_GOAL:g}): {verdict(all(verdicts))}")


def _producers_line(point: dict) -> str:
    import numpy as np
    rates = np.array(point["rates"])
    registration = np.array(point["registration_s"])
    count = point["producers"]
    mean = rates.mean()
    # Anonymous and shared memory: the file pages are the partitions' segments.
    rss = sum(point["registered"][part] - point["before"][part]
              for part in ("rss_anon", "rss_shmem")) / count
    fds = (point["registered"]["open_files"] - point["before"]["open_files"]) / count
    limit_text = "refused" if point["past_the_limit"]["refused"] else "NOT refused"
    return (f"{count:>9} {point['ring_size'] / MIB:>6g}Mi "
            f"{point['shm']['nominal_bytes'] / MIB:>10,.0f}Mi "
            f"{point['shm']['allocated_bytes'] / MIB:>9,.0f}Mi "
            f"{np.median(point['construct_s']):>8.2f} "
            f"{np.median(registration):>7.2f}/{registration.max():<7.2f} "
            f"{rates.min():>8,.0f}/{mean:>8,.0f}/{rates.max():>8,.0f} "
            f"{rates.max() / max(mean, 1e-9):>8.2f} {mean / max(rates.min(), 1e-9):>8.2f} "
            f"{int((rates == 0).sum()):>7} {rss / MIB:>11.2f}Mi {fds:>8.2f}  {limit_text}")


def _fair(point: dict) -> bool:
    rates = point["rates"]
    mean = sum(rates) / len(rates)
    return min(rates) > 0 and max(rates) <= FAIRNESS_GOAL * mean \
        and mean <= FAIRNESS_GOAL * min(rates)


def report(document: dict) -> None:
    environment = document["environment"]
    print()
    print(f"shmlog {environment['shmlog_revision']} on {environment['host']}: "
          f"{environment['cpu_model']}, {environment['cpu_count']} cores, "
          f"{environment['memory_total_bytes'] / 1e9:.0f} GB, python {environment['python']}, "
          f"numpy {environment['numpy']}, numba {environment['numba']}")
    print(f"load average at start {environment['load_average_at_start'][0]:.2f}; memcpy "
          f"(np.copyto, 256 MiB) {document['memcpy_bytes_per_s'] / 1e9:.2f} GB/s; "
          f"vm.max_map_count {document['max_map_count']:,}")
    print()
    if document["partitions"]:
        print(f"One broker, one topic of N partitions, one {RECORD_SIZE}-byte record sent to "
              f"each (acks=1, linger 5 ms); growth between the two largest N measured:")
        report_partitions(document["partitions"], document["max_map_count"])
        print()
    if document["producers"]:
        print("Many producers on one broker, each its own partition, send_batch of "
              f"{BATCH_ROWS} x {RECORD_SIZE} B:")
        report_producers(document["producers"])
    busy = max([point.get("other_cores", 0.0) for point in
                document["partitions"] + document["producers"]] or [0.0])
    print()
    print("others: cores other processes kept busy meanwhile (on average)"
          + (f"; the machine was not quiet (up to {busy:.2f} cores): these figures are not "
             f"comparable with a quiet run's" if busy > OTHER_CORES_WARNING else ""))


# --- main -----------------------------------------------------------------------------------

def _counts(text: str) -> tuple:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"counts must be positive, got {text!r}")
    return counts


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=_counts, default=None,
                        help="partition counts, e.g. 10,100,1000 (default 10,100,1000,10000; "
                             "0 points with --partitions '' is not allowed: use --no-partitions)")
    parser.add_argument("--producers", type=_counts, default=None,
                        help="producer counts (default 10,50,200)")
    parser.add_argument("--no-partitions", action="store_true", help="skip the partitions")
    parser.add_argument("--no-producers", action="store_true", help="skip the producers")
    parser.add_argument("--cluster", type=_counts, default=None, metavar="COUNTS",
                        help="also the cluster figures (perf/bench_scale_cluster.py: three "
                             "brokers, one topic of each count x RF 3), e.g. 1000,3000")
    parser.add_argument("--ring-size", type=int, default=None,
                        help="the producers' ring_size (default: the producer's default)")
    parser.add_argument("--start-concurrency", type=int, default=START_CONCURRENCY,
                        help=f"producer processes started at once (default "
                             f"{START_CONCURRENCY})")
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument("--producer-seconds", type=float, default=None)
    parser.add_argument("--point-timeout", type=float, default=POINT_TIMEOUT_S,
                        help=f"seconds one point may take (default {POINT_TIMEOUT_S:g})")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 10 and 100 partitions, 4 and 8 producers")
    parser.add_argument("--json", metavar="FILE",
                        default=os.path.join(REPOSITORY, "perf", "results", "bench_scale.json"))
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--arguments", default="{}", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    arguments.partitions = () if arguments.no_partitions else (
        arguments.partitions or (QUICK["partitions"] if quick else PARTITIONS_DEFAULT))
    arguments.producers = () if arguments.no_producers else (
        arguments.producers or (QUICK["producers"] if quick else PRODUCERS_DEFAULT))
    arguments.idle_seconds = arguments.idle_seconds or (
        QUICK["idle_seconds"] if quick else IDLE_SECONDS_DEFAULT)
    arguments.producer_seconds = arguments.producer_seconds or (
        QUICK["producer_seconds"] if quick else PRODUCER_SECONDS_DEFAULT)
    return arguments


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    if harness.run_role(arguments, ROLES):
        return 0
    harness.unwind_on_sigterm()
    from bench_log import environment
    from bounds import memcpy_rate
    document = {"benchmark": "bench_scale", "environment": environment(tempfile.gettempdir()),
                "memcpy_bytes_per_s": memcpy_rate(), "max_map_count": max_map_count(),
                "record_size": RECORD_SIZE, "partitions": [], "producers": []}
    processes = Processes()
    try:
        for count in arguments.partitions:
            print(f"{count:,} partitions ...", flush=True)
            document["partitions"].append(measure_partitions(processes, count, arguments))
        for count in arguments.producers:
            print(f"{count:,} producers ...", flush=True)
            document["producers"].append(measure_producers(processes, count, arguments))
    finally:
        processes.stop_all()
    report(document)
    if arguments.cluster:
        from bench_scale_cluster import cluster_section
        document["cluster"] = cluster_section(arguments.cluster)
    os.makedirs(os.path.dirname(os.path.abspath(arguments.json)), exist_ok=True)
    with open(arguments.json, "w") as target:
        json.dump(document, target, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
