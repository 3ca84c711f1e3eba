"""Consumer groups: how long rebalances take, and what a group consumes next to one
consumer that is assigned every partition.

Figures:

* **Rebalance, 8 members on 48 partitions**, per assignor (eager ``range`` and
  incremental ``cooperative-sticky``): a ninth member joins (from its first poll to
  the moment every member has its final assignment, all 48 partitions owned once);
  one member is killed with SIGKILL (from the kill until the same; the session
  timeout is a floor the coordinator must wait out, so the time past it is printed
  as well).
* **Throughput**: records/s of ``poll_batch`` for one consumer with all 48
  partitions assigned, and for groups of 2 and 8 members sharing them (100-byte
  values, catch-up reads), with the same run's memcpy bandwidth as the bound.

Every member is a process of its own; the broker runs in a child process. Members
report through files (one JSON line per event, wall-clock times) so this process
only watches.

Expected on the 2-vCPU development VM (November 2026): a join rebalances in ~0.1 s
(range) and in two generations for cooperative-sticky; a kill is noticed after the
session timeout and rebalanced ~0.1 s later; a group on 2 cores consumes about what
one consumer does (the cores, not the protocol, bound it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402

from shmlog import Admin, Broker, Producer  # noqa: E402
from shmlog.common.errors import GroupIdNotFoundError  # noqa: E402
from shmlog.server.broker import request  # noqa: E402

PARTITIONS = 48
MEMBERS = 8
SESSION_TIMEOUT_MS = 3_000
RECORD_SIZE = 100
WAIT_S = 300

MEMBER = r"""
import json, os, sys, time
from shmlog.client.consumer import Consumer, ConsumerRebalanceListener, TopicPartition

data_dir, group, strategy, events_path, stop_path, session_ms, go_path = sys.argv[1:8]
events = open(events_path, "a", buffering=1)

def report(**fields):
    events.write(json.dumps({"t": time.time(), **fields}) + "\n")

going = os.path.exists(go_path)

class Listener(ConsumerRebalanceListener):
    def on_partitions_assigned(self, assigned):
        # Until the go file appears, a member takes part in the group but reads
        # nothing (paused), so a throughput run starts with the group settled.
        if not going:
            consumer.pause(*assigned)
        report(event="assigned", generation=consumer.group_metadata().generation_id,
               partitions=len(consumer.assignment()))

if group == "-":
    going = True
    from shmlog import Admin
    consumer = Consumer(bootstrap=data_dir, auto_offset_reset="earliest")
    partitions = len(Admin(data_dir).describe_topic("bench")["partitions"])
    consumer.assign([TopicPartition("bench", p) for p in range(partitions)])
else:
    consumer = Consumer(bootstrap=data_dir, group_id=group, auto_offset_reset="earliest",
                        session_timeout_ms=int(session_ms), heartbeat_interval_ms=300,
                        partition_assignment_strategy=[strategy])
    consumer.subscribe(["bench"], listener=Listener())
report(event="started", pid=os.getpid())
count, first, last, reported = 0, None, None, 0.0
while not os.path.exists(stop_path):
    if not going and os.path.exists(go_path):
        going = True
        consumer.resume(*consumer.assignment())
    polled = consumer.poll_batch(timeout_ms=50)
    found = sum(len(columns) for columns in polled.values())
    if found:
        now = time.time()
        first = first or now
        last, count = now, count + found
    if count and time.monotonic() - reported > 0.1:
        reported = time.monotonic()
        report(event="progress", count=count, first=first, last=last)
report(event="progress", count=count, first=first, last=last)
consumer.close()
"""


class Members:
    """Member processes of one experiment, and their event files."""

    def __init__(self, data_dir: str, work: str, group: str, strategy: str):
        self.data_dir, self.work, self.group, self.strategy = data_dir, work, group, strategy
        self.stop_path = os.path.join(work, f"stop-{group}")
        self.go_path = os.path.join(work, f"go-{group}")
        if group.startswith("rebalance"):
            open(self.go_path, "w").close()
        self.processes: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        path = os.path.join(self.work, f"{self.group}-{len(self.processes)}.jsonl")
        process = subprocess.Popen([sys.executable, "-c", MEMBER, self.data_dir, self.group,
                                    self.strategy, path, self.stop_path,
                                    str(SESSION_TIMEOUT_MS), self.go_path])
        process.events_path = path
        self.processes.append(process)
        return process

    def events(self, process) -> list[dict]:
        try:
            with open(process.events_path) as source:
                return [json.loads(line) for line in source if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        open(self.stop_path, "w").close()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def settled(data_dir: str, group: str, members: int):
    """The coordinator's view once stable with ``members`` members owning every
    partition once."""
    try:
        described = request(data_dir, "describe_group", group_id=group)
    except GroupIdNotFoundError:
        return None
    owned = sorted(partition for member in described["members"]
                   for _, partition in member["assignment"])
    if described["state"] == "Stable" and len(described["members"]) == members and \
            owned == list(range(PARTITIONS)):
        return described
    return None


def last_assignment_time(members: Members, generation: int) -> float:
    """When the last live member heard of its assignment in ``generation``."""
    def reported():
        times = []
        for process in members.processes:
            if process.poll() is not None:
                continue
            found = [event["t"] for event in members.events(process)
                     if event["event"] == "assigned" and event["generation"] >= generation]
            if not found:
                return None
            times.append(min(found))
        return max(times)
    return wait_for(reported, f"every member in generation {generation}")


def rebalances(data_dir: str, work: str, strategy: str) -> dict:
    members = Members(data_dir, work, f"rebalance-{strategy}", strategy)
    try:
        for _ in range(MEMBERS):
            members.start()
        wait_for(lambda: settled(data_dir, members.group, MEMBERS), "eight members")
        time.sleep(1.0)                         # heartbeats settle

        joined_at = time.time()
        newcomer = members.start()
        described = wait_for(lambda: settled(data_dir, members.group, MEMBERS + 1),
                             "the ninth member")
        started = wait_for(lambda: [event["t"] for event in members.events(newcomer)
                                    if event["event"] == "started"], "the newcomer")[0]
        join_s = last_assignment_time(members, described["generation"]) - max(started, joined_at)
        join_generations = described["generation"]

        time.sleep(1.0)
        victim = members.processes[0]
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        described = wait_for(lambda: settled(data_dir, members.group, MEMBERS), "the kill")
        kill_s = last_assignment_time(members, described["generation"]) - killed_at
        return {"join_s": join_s, "kill_s": kill_s, "generations": join_generations}
    finally:
        members.stop()


def consume(data_dir: str, work: str, group: str, count: int, total: int) -> dict:
    """Aggregate poll_batch throughput of ``count`` members (group "-": one
    consumer assigned every partition), catching up on ``total`` records."""
    members = Members(data_dir, work, group, "range")
    try:
        for _ in range(count):
            members.start()
        if group != "-":
            wait_for(lambda: settled(data_dir, group, count), f"the group of {count}")
            time.sleep(0.5)                     # every member has heard its assignment
        open(members.go_path, "w").close()

        def progress():
            latest = []
            for process in members.processes:
                reports = [event for event in members.events(process)
                           if event["event"] == "progress"]
                if reports:
                    latest.append(reports[-1])
            if sum(report["count"] for report in latest) >= total:
                return latest
            return None
        latest = wait_for(progress, f"{total} records consumed")
        first = min(report["first"] for report in latest)
        last = max(report["last"] for report in latest)
        consumed = sum(report["count"] for report in latest)
        return {"records_per_s": consumed / (last - first), "records": consumed}
    finally:
        members.stop()


def produce(data_dir: str, total: int) -> None:
    per_partition = total // PARTITIONS
    batch = np.frombuffer(np.random.default_rng(1).bytes(1000 * RECORD_SIZE),
                          np.uint8).reshape(1000, RECORD_SIZE)
    with Producer(data_dir) as producer:
        for partition in range(PARTITIONS):
            for _ in range(per_partition // 1000):
                producer.send_batch("bench", batch, partition=partition)
        producer.flush(timeout=WAIT_S)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4_800_000,
                        help="records for the throughput runs (a multiple of 48 000)")
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "bench_groups.json"))
    args = parser.parse_args(argv)
    bound = memcpy_rate()
    work = tempfile.mkdtemp(prefix="shmlog-bench-groups-")
    data_dir = os.path.join(work, "data")
    results: dict = {}
    try:
        with Broker(data_dir, group_initial_rebalance_delay_ms=0,
                    group_min_session_timeout_ms=1_000):
            Admin(data_dir).create_topic("bench", partitions=PARTITIONS)
            for strategy in ("range", "cooperative-sticky"):
                results[strategy] = rebalances(data_dir, work, strategy)
            produce(data_dir, args.records)
            results["assigned"] = consume(data_dir, work, "-", 1, args.records)
            for count in (2, MEMBERS):
                results[f"group-{count}"] = consume(data_dir, work, f"consume-{count}", count,
                                                    args.records)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"host {platform.node()} {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}; memcpy {bound / 1e9:.2f} GB/s")
    print(f"rebalance, {MEMBERS} members on {PARTITIONS} partitions, session timeout "
          f"{SESSION_TIMEOUT_MS / 1000:.1f} s:")
    for strategy in ("range", "cooperative-sticky"):
        result = results[strategy]
        print(f"  {strategy:<19} join of a 9th member {result['join_s'] * 1000:7.1f} ms   "
              f"kill -9 of one {result['kill_s']:6.2f} s "
              f"({(result['kill_s'] - SESSION_TIMEOUT_MS / 1000) * 1000:+7.1f} ms past the "
              f"session timeout)")
    single = results["assigned"]["records_per_s"]
    for name in ("assigned", "group-2", f"group-{MEMBERS}"):
        rate = results[name]["records_per_s"]
        label = "one consumer, 48 assigned" if name == "assigned" else \
            f"group of {name.split('-')[1]} members"
        print(f"  {label:<26} {rate / 1e6:7.2f} M records/s  "
              f"{rate * RECORD_SIZE / bound:6.1%} of memcpy  {rate / single:5.2f}x one consumer")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as target:
        json.dump({"memcpy_bytes_per_s": bound, **results}, target, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
