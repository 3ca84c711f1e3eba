"""Coordinator failover: how long a consumer group spread over three hosts is without
a working coordinator when the coordinator's broker is killed with SIGKILL.

A three-broker cluster (LocalCluster on 127.0.0.x, its own ZooKeeper) hosts a
replicated topic (6 partitions, RF 3) and ``__consumer_offsets`` (3 partitions,
RF 3). Four member processes, two on each of the two brokers that do not coordinate
the group, consume it and commit after every poll; an acks=all producer keeps
writing. Each round kills the coordinator's broker and times, from the kill:

* **elected**: a surviving broker leads the group's offsets partition (the
  ZooKeeper session timeout is the floor: only its expiry tells the controller);
* **settled**: the group is Stable again with every partition assigned once
  (members found the new coordinator, were unknown to it, joined again);
* **committing**: a member's commit is acknowledged again (read from the members'
  logs: their first acknowledged commit after the killed process is gone; timed
  from the wall clock at that moment).

Then the broker is restarted, and the next round kills the coordinator again.

Expected on the 2-vCPU development VM (November 2026, shared with other work):
elected at about the ZooKeeper session timeout (2.9-3.2 s with 3 s), commits
acknowledged again ~0.3 s after that, the group settled 3.6-5.1 s after the kill
(a member's next heartbeat meets NOT_COORDINATOR or an unknown member id, the
rejoin, the initial rebalance delay of 0.3 s). The election is seen by polling, so
its figure is an upper bound.
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

from harness import REPOSITORY  # noqa: E402 - before shmlog: this checkout's, here and in children

PARTITIONS = 6
OFFSETS_PARTITIONS = 3
ZOOKEEPER_SESSION_TIMEOUT_MS = 3000
SETTINGS = {"zookeeper.session.timeout.ms": ZOOKEEPER_SESSION_TIMEOUT_MS,
            "replica.lag.time.max.ms": 4000, "replica.fetch.wait.max.ms": 200,
            "replica.socket.timeout.ms": 1500, "forward.request.timeout.ms": 3000}
BROKER_SETTINGS = {"offsets_topic_num_partitions": OFFSETS_PARTITIONS,
                   "group_initial_rebalance_delay_ms": 300}
MEMBER_SESSION_TIMEOUT_MS = 6000
ROUNDS_DEFAULT = 3
GROUP = "failover-bench"
TOPIC = "failover-bench"
WAIT_S = 120.0
POLL_S = 0.02

# A member: consumes, commits after every poll, logs "C <wall time>" per
# acknowledged commit (flushed: the bench reads it while the member runs).
MEMBER = r"""
import os, sys, time
from shmlog.client.consumer import Consumer
from shmlog.common.errors import ShmlogError
data_dir, group, topic, log_path, stop_path, session_ms = sys.argv[1:7]
with open(log_path, "a", buffering=1) as out, Consumer(
        topic, bootstrap=data_dir, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, session_timeout_ms=int(session_ms),
        heartbeat_interval_ms=1000, max_poll_interval_ms=20000,
        partition_assignment_strategy=("range",)) as consumer:
    while not os.path.exists(stop_path):
        try:
            batches = consumer.poll(timeout_ms=200)
            if batches:
                consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
                out.write(f"C {time.time()}\n")
        except ShmlogError:
            time.sleep(0.05)
"""


def wait_for(condition, what: str):
    from shmlog.devtools.local_cluster import poll_until
    return poll_until(condition, WAIT_S, what, POLL_S)


def ask(cluster, broker_id: int, request_type: str, **fields):
    """A request through a broker; None when refused (the coordinator moving)."""
    from shmlog.common.errors import ShmlogError
    from shmlog.protocol.control_client import request
    try:
        return request(cluster.data_dir(broker_id), request_type, timeout_ms=2000, **fields)
    except ShmlogError:
        return None


def coordinator(cluster, not_in=()) -> int | None:
    """The group's coordinator, once every running broker names the same live one
    (a restarted broker's view may lag) and that one leads the partition itself."""
    from shmlog import Admin
    from shmlog.common.errors import ShmlogError
    from shmlog.groups import OFFSETS_TOPIC, offsets_partition
    partition = offsets_partition(GROUP, OFFSETS_PARTITIONS)
    try:
        seen = {broker_id: Admin(cluster.data_dir(broker_id), timeout_ms=2000).describe_topic(
            OFFSETS_TOPIC)["partitions"][partition] for broker_id in cluster.brokers}
    except ShmlogError:
        return None
    leaders = {entry["leader"] for entry in seen.values()}
    leader = leaders.pop() if len(leaders) == 1 else None
    if leader not in cluster.brokers or leader in not_in or seen[leader]["role"] != "leader":
        return None
    return leader


def live_brokers(cluster) -> list[int]:
    """The live brokers as the lowest running broker sees them (all, if it cannot say)."""
    from shmlog import Admin
    from shmlog.common.errors import ShmlogError
    try:
        return Admin(cluster.data_dir(min(cluster.brokers)), timeout_ms=2000).describe_topic(
            TOPIC)["live_brokers"]
    except ShmlogError:
        return list(range(1, cluster.count + 1))


def whole_isr(cluster) -> bool:
    """Is every broker in the ISR of the group's offsets partition (a restarted one
    caught up), so that any of them may be elected?"""
    from shmlog import Admin
    from shmlog.common.errors import ShmlogError
    from shmlog.groups import OFFSETS_TOPIC, offsets_partition
    try:
        entry = Admin(cluster.data_dir(1), timeout_ms=2000).describe_topic(OFFSETS_TOPIC)[
            "partitions"][offsets_partition(GROUP, OFFSETS_PARTITIONS)]
    except ShmlogError:
        return False
    return len(entry["isr"]) == len(cluster.brokers)


def settled(cluster, broker_id: int, members: int) -> bool:
    described = ask(cluster, broker_id, "describe_group", group_id=GROUP)
    if described is None:
        return False
    held = [tuple(entry) for member in described["members"] for entry in member["assignment"]]
    return described["state"] == "Stable" and len(described["members"]) == members and \
        len(held) == len(set(held)) == PARTITIONS


def first_commit_after(logs, moment: float) -> float | None:
    times = []
    for path in logs:
        with open(path) as lines:
            times += [float(line.split()[1]) for line in lines
                      if line.startswith("C ") and line.endswith("\n")]
    later = [at for at in times if at > moment]
    return min(later) if later else None


def start_members(cluster, brokers, directory: str, stop_path: str):
    processes, logs = [], []
    for index, broker_id in enumerate(brokers):
        log_path = os.path.join(directory, f"member-{index}.log")
        processes.append(subprocess.Popen(
            [sys.executable, "-c", MEMBER, cluster.data_dir(broker_id), GROUP, TOPIC, log_path,
             stop_path, str(MEMBER_SESSION_TIMEOUT_MS)]))
        logs.append(log_path)
    return processes, logs


def one_round(cluster, directory: str, round_number: int) -> dict:
    """Members on the two non-coordinators; kill the coordinator; time the recovery."""
    from shmlog.client.producer import Producer
    wait_for(lambda: whole_isr(cluster), "the offsets partition's whole ISR")
    victim = wait_for(lambda: coordinator(cluster), "coordinator")
    survivors = sorted(set(cluster.brokers) - {victim})
    stop_path = os.path.join(directory, f"stop-{round_number}")
    processes, logs = start_members(cluster, survivors * 2, directory, stop_path)
    producer = Producer(cluster.data_dir(survivors[0]), acks="all", linger_ms=5)
    try:
        wait_for(lambda: settled(cluster, survivors[0], len(processes)), "a settled group")
        for n in range(600):
            producer.send(TOPIC, b"%d" % n, partition=n % PARTITIONS)
        producer.flush()
        wait_for(lambda: first_commit_after(logs, 0.0), "a first commit")
        killed = time.monotonic()
        cluster.kill(victim)
        # A commit logged after this was answered by no broker of the dead one (its
        # process is gone once kill returns): the first such one is the new coordinator's.
        killed_wall = time.time()
        wait_for(lambda: coordinator(cluster, not_in=(victim,)), "a new coordinator")
        elected = time.monotonic() - killed
        # Members commit only after records arrive: keep some coming.
        for n in range(600):
            producer.send(TOPIC, b"after-%d" % n, partition=n % PARTITIONS)
        wait_for(lambda: settled(cluster, survivors[0], len(processes)), "a settled group")
        settle = time.monotonic() - killed
        committing = wait_for(lambda: first_commit_after(logs, killed_wall),
                              "a commit after the kill") - killed_wall
    finally:
        producer.close()
        open(stop_path, "w").close()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    # Its registration must be gone (its session expired) before it registers again.
    wait_for(lambda: victim not in live_brokers(cluster), f"broker {victim}'s session to end")
    cluster.start_broker(victim)
    return {"killed": victim, "elected_s": elected, "settled_s": settle,
            "committing_s": committing}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS_DEFAULT)
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "coordinator_failover.json"))
    arguments = parser.parse_args()
    from shmlog import Admin
    from shmlog.devtools.local_cluster import LocalCluster
    from shmlog.devtools.zookeeper import ZooKeeperServer
    directory = tempfile.mkdtemp(prefix="shmlog-bench-coordinator-")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with ZooKeeperServer(os.path.join(directory, "zookeeper"), tick_time_ms=500) as server, \
                LocalCluster(os.path.join(directory, "cluster"), 3,
                             zookeeper_connect=server.connect_string, settings=SETTINGS,
                             broker_settings=BROKER_SETTINGS) as cluster:
            Admin(cluster.data_dir(1)).create_topic(TOPIC, PARTITIONS,
                                                    {"min.insync.replicas": "2"},
                                                    replication_factor=3)
            wait_for(lambda: ask(cluster, 1, "fetch_offsets", group_id=GROUP) is not None,
                     "the offsets topic")
            rounds = [one_round(cluster, directory, number) for number in range(arguments.rounds)]
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(directory, ignore_errors=True)
    results = {"host": f"{platform.node()}, {os.cpu_count()} CPUs, "
                       f"Python {platform.python_version()}",
               "settings": SETTINGS, "broker_settings": BROKER_SETTINGS,
               "member_session_timeout_ms": MEMBER_SESSION_TIMEOUT_MS, "rounds": rounds}
    print(f"host {results['host']}; zookeeper.session.timeout.ms "
          f"{ZOOKEEPER_SESSION_TIMEOUT_MS}, member session.timeout.ms "
          f"{MEMBER_SESSION_TIMEOUT_MS}")
    for number, entry in enumerate(rounds):
        print(f"round {number}: killed broker {entry['killed']}: new coordinator after "
              f"{entry['elected_s']:.2f} s, group settled after {entry['settled_s']:.2f} s, "
              f"commits acknowledged again after {entry['committing_s']:.2f} s")
    os.makedirs(os.path.dirname(arguments.json), exist_ok=True)
    with open(arguments.json, "w") as target:
        json.dump(results, target, indent=2)
    print(f"results in {arguments.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
