"""Per-partition unavailability during a rolling restart with controlled shutdown, next
to a kill -9 failover in the same run.

Goal
----
Issue 15: during a rolling restart of all three brokers, each partition is
unavailable for at most a few hundred ms. Measure it, and compare with what the same
partition costs when its leader is killed (the session timeout bounds that one). A
benchmark never asserts.

Method
------
A ZooKeeper of its own (tickTime 500 ms), three brokers
(``shmlog.devtools.local_cluster.LocalCluster``, session timeout ``SESSION_TIMEOUT_MS``,
automatic leader rebalance off), a topic of ``PARTITIONS`` partitions, RF 3,
min.insync.replicas 2. One probe thread per partition sends one acks=all record at a
time (linger 0) to the partition's current leader (found by asking the brokers, as
the tests' ``LeaderFollowingProducer`` does) and stamps every acknowledgement; after
any error, or when ZooKeeper names another leader while it waits, it goes on with a
new producer on the leader ZooKeeper names (a client with fresh metadata).

Per broker, in turn: SIGTERM; a ZooKeeper reader polls the partition states every
``POLL_S`` and stamps when each partition the broker led names another leader
(*SIGTERM to new leader*); the broker's exit is stamped; it is started again and
waited back into every ISR. A partition's *unavailability* is the longest gap
between two consecutive acknowledgements that overlaps the span from the SIGTERM to
the broker's exit (so it includes the move of its leadership and the producer's
switch to the new leader; a gap that begins after the exit is the restarting
broker's start-up load on the two cores, listed apart in the JSON's ``long_gaps_s``).
The same is then measured for one kill -9 of the broker leading most partitions (its
partitions move once its session expires), and the typical gap outside any restart is
reported as the baseline.

Expected figures
----------------
Two runs of the defaults on the 2-vCPU development VM, November 2026, on a busy
machine (load average 22: other work shared the two cores with the three brokers,
ZooKeeper's JVM and the probes):

==============================================  ===================  ===================
figure                                          run 1                run 2
==============================================  ===================  ===================
acks=all gap outside restarts, median / max     15 / 131 ms          18 / 44 ms
SIGTERM to new leader (per broker)              99, 139, 412-440 ms  92, 112, 153 ms
SIGTERM to exit (move, flush, close)            0.65-1.06 s          0.81-2.33 s
longest gap, partitions whose leader left       median 163, max 466  median 134, max 254
longest gap, any partition, per restart         106, 182, 466 ms     353, 133, 233 ms
kill -9 of a leader (session 2 s): longest gap  2.44 s               2.06 s
==============================================  ===================  ===================

What bounds them: a controlled shutdown costs a partition the controller's reaction
to the shutdown znode (a watch, fresh reads, one multi: tens of ms), the brokers'
reaction to the new state (a watch each), the producer's move to the new leader, and
the first acks=all round trip there, each a few wake-ups of processes that wait for a
CPU on a loaded 2-core machine. A partition the broker only follows pauses until the
controller takes it out of the ISR (it stops fetching at once). A kill -9 costs the
session timeout first. Before the leader learnt to stop counting a follower the
controller took out of the ISR (``replication.LeaderReplicaState.isr_change_committed``)
every partition paused for ``replica.lag.time.max.ms`` (4 s here) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

from harness import REPOSITORY  # noqa: E402 - before shmlog: this checkout's, here and in children

TOPIC = "rolling"
PARTITIONS = 3
SESSION_TIMEOUT_MS = 2000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
            "replica.lag.time.max.ms": 4000, "replica.fetch.wait.max.ms": 200,
            "replica.socket.timeout.ms": 1500, "auto.leader.rebalance.enable": False}
WAIT_S = 120.0                 # any one wait: a restart, an ISR, an exit
POLL_S = 0.005                 # the ZooKeeper reader's and the waits' period
LOOK_TIMEOUT_MS = 1000         # a probe's question to a broker that may be leaving
SEND_TIMEOUT_S = 5.0           # a probe's wait for one acknowledgement
LEADER_LOOK_S = 0.01           # how often a waiting probe reads its partition's state
AFTER_EXIT_S = 1.0             # the calm after a broker is back, before the next step
LONG_GAP_S = 0.2              # gaps listed one by one (from the signal, in s)
STEADY_S = 2.0                 # acknowledgements before the first restart (the baseline)


def wait_for(condition, what: str):
    from shmlog.devtools.local_cluster import poll_until
    return poll_until(condition, WAIT_S, what, POLL_S)


def whole_isr(cluster, broker_id: int, partition: int) -> bool:
    """Whether ``broker_id`` sees every broker in the partition's ISR (False when it
    does not answer in time: a loaded machine)."""
    from shmlog import Admin
    from shmlog.common.errors import ShmlogError
    try:
        described = Admin(cluster.data_dir(broker_id), timeout_ms=LOOK_TIMEOUT_MS).describe_topic(
            TOPIC)["partitions"][partition]
    except ShmlogError:
        return False
    return sorted(described["isr"]) == [1, 2, 3]


class Probe(threading.Thread):
    """One acks=all record at a time to ``partition``'s leader; ``acks`` holds the
    monotonic time of every acknowledgement. While it waits for one, it reads the
    partition's state in ZooKeeper every ``LEADER_LOOK_S``: a new leader named there
    makes it go to that one (as a Kafka producer does on NOT_LEADER_OR_FOLLOWER or a
    metadata refresh), so a send waiting on a broker that died is not what is
    measured."""

    def __init__(self, cluster, session, partition: int):
        super().__init__(name=f"probe-{partition}", daemon=True)
        self.cluster, self.session, self.partition = cluster, session, partition
        self.acks: list[float] = []
        self.stopping = threading.Event()

    def _leader(self) -> int | None:
        """The running leader ZooKeeper names (None: none, or not running here)."""
        from shmlog.common.errors import ShmlogError
        try:
            state, _ = self.session.read_partition_state(TOPIC, self.partition)
        except ShmlogError:
            return None
        return state.leader if state.leader in self.cluster.brokers else None

    def _leader_moved(self, leader: int) -> bool:
        found = self._leader()
        return found is not None and found != leader

    def _acknowledged(self, future, leader: int) -> bool:
        """Wait for ``future``; False when the leader moved meanwhile."""
        from shmlog.common.errors import ShmlogError
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                future.get(timeout=LEADER_LOOK_S)
                return True
            except ShmlogError:
                if future.done():
                    raise
            if self._leader_moved(leader):
                return False
        return False

    def run(self) -> None:
        from shmlog import Producer
        from shmlog.common.errors import ShmlogError
        while not self.stopping.is_set():
            leader = self._leader()
            if leader is None:
                time.sleep(POLL_S)
                continue
            try:
                producer = Producer(self.cluster.data_dir(leader), acks="all", linger_ms=0,
                                    max_block_ms=LOOK_TIMEOUT_MS)
            except ShmlogError:
                time.sleep(POLL_S)
                continue
            try:
                while not self.stopping.is_set() and self._acknowledged(
                        producer.send(TOPIC, b"probe", partition=self.partition), leader):
                    self.acks.append(time.monotonic())
            except ShmlogError:
                pass                      # its leader moved or left: find the new one
            finally:
                threading.Thread(target=_close_quietly, args=(producer,), daemon=True).start()


def _close_quietly(producer) -> None:
    from shmlog.common.errors import ShmlogError
    try:
        producer.close(timeout=0.5)
    except ShmlogError:
        pass


def states(session) -> dict:
    return {partition: session.read_partition_state(TOPIC, partition)[0]
            for partition in range(PARTITIONS)}


def longest_gap(acks: list[float], start: float, end: float) -> float:
    """The longest gap between consecutive acknowledgements overlapping [start, end]."""
    longest = 0.0
    for before, after in zip(acks, acks[1:]):
        if after >= start and before <= end:
            longest = max(longest, after - before)
    return longest


def leave(cluster, session, broker_id: int, probes, how: signal.Signals) -> dict:
    """Stop ``broker_id`` with ``how``, stamp its partitions' new leaders and its
    exit, start it again; the per-partition figures."""
    led = [partition for partition, state in states(session).items()
           if state.leader == broker_id]
    broker = cluster.brokers[broker_id]
    signalled = time.monotonic()
    broker.process.send_signal(how)
    moved: dict[int, float] = {}
    exited = None
    while len(moved) < len(led) or exited is None:
        now = time.monotonic()
        assert now - signalled < WAIT_S, f"broker {broker_id}: no new leaders in {WAIT_S} s"
        for partition, state in states(session).items():
            if partition in led and partition not in moved and state.leader != broker_id \
                    and state.has_leader:
                moved[partition] = time.monotonic() - signalled
        if exited is None and broker.process.poll() is not None:
            exited = time.monotonic()
        time.sleep(POLL_S)
    cluster.brokers.pop(broker_id)
    restarted = time.monotonic()
    cluster.start_broker(broker_id)
    for partition in range(PARTITIONS):
        wait_for(lambda partition=partition: whole_isr(cluster, broker_id, partition),
                 f"broker {broker_id} back in the ISR of {TOPIC}-{partition}")
    time.sleep(AFTER_EXIT_S)
    back = time.monotonic()
    return {"broker": broker_id, "signal": how.name, "led": led,
            "long_gaps_s": {str(probe.partition): [
                (round(before - signalled, 3), round(after - signalled, 3))
                for before, after in zip(probe.acks, probe.acks[1:])
                if after - before > LONG_GAP_S and after >= signalled and before <= back]
                for probe in probes},
            "back_in_isr_s": back - AFTER_EXIT_S - signalled,
            "exit_s": exited - signalled, "restart_s": time.monotonic() - restarted,
            "new_leader_s": {str(partition): seconds for partition, seconds in moved.items()},
            "unavailable_s": {str(probe.partition): longest_gap(probe.acks, signalled, exited)
                              for probe in probes}}


def run(directory: str) -> dict:
    from shmlog import Admin
    from shmlog.cluster.zk.client import ClusterZooKeeper
    from shmlog.devtools.local_cluster import LocalCluster
    from shmlog.devtools.zookeeper import ZooKeeperServer
    results = {"host": f"{platform.node()}, {os.cpu_count()} CPUs, "
                       f"Python {platform.python_version()}", "settings": SETTINGS,
               "partitions": PARTITIONS, "restarts": []}
    with ZooKeeperServer(os.path.join(directory, "zookeeper"), tick_time_ms=500) as server, \
            LocalCluster(os.path.join(directory, "cluster"), 3,
                         zookeeper_connect=server.connect_string, settings=SETTINGS,
                         log_files=True) as cluster:
        Admin(cluster.data_dir(1)).create_topic(TOPIC, PARTITIONS, {"min.insync.replicas": "2"},
                                                replication_factor=3)
        for partition in range(PARTITIONS):
            wait_for(lambda partition=partition: whole_isr(cluster, 1, partition), "a whole ISR")
        session = ClusterZooKeeper(cluster.zookeeper_connect).start(create_paths=False)
        probes = [Probe(cluster, session, partition) for partition in range(PARTITIONS)]
        try:
            for probe in probes:
                probe.start()
            wait_for(lambda: all(probe.acks for probe in probes), "every probe's first ack")
            since = time.monotonic()
            time.sleep(STEADY_S)
            steady = [after - before for probe in probes
                      for before, after in zip(probe.acks, probe.acks[1:]) if before >= since]
            results["baseline_gap_s"] = {"median": statistics.median(steady),
                                         "max": max(steady)}
            for broker_id in (1, 2, 3):
                results["restarts"].append(leave(cluster, session, broker_id, probes,
                                                 signal.SIGTERM))
            busiest = max((1, 2, 3), key=lambda broker_id: sum(
                state.leader == broker_id for state in states(session).values()))
            results["kill"] = leave(cluster, session, busiest, probes, signal.SIGKILL)
        finally:
            for probe in probes:
                probe.stopping.set()
                probe.join(WAIT_S)
            session.close()
    return results


def report(results: dict) -> None:
    print(results["host"])
    baseline = results["baseline_gap_s"]
    print(f"acks=all gap between acknowledgements outside restarts: median "
          f"{baseline['median'] * 1000:.1f} ms, max {baseline['max'] * 1000:.0f} ms")
    worst = []
    for figure in results["restarts"] + [results["kill"]]:
        moved = ", ".join(f"p{partition} {seconds * 1000:.0f} ms"
                          for partition, seconds in figure["new_leader_s"].items()) or "none"
        gaps = ", ".join(f"p{partition} {seconds * 1000:.0f} ms"
                         for partition, seconds in figure["unavailable_s"].items())
        print(f"broker {figure['broker']} {figure['signal']}: led {figure['led']}; SIGNAL to "
              f"new leader: {moved}; exit after {figure['exit_s'] * 1000:.0f} ms; longest "
              f"acks=all gap: {gaps}")
        if figure["signal"] == "SIGTERM":
            worst += [figure["unavailable_s"][str(partition)] for partition in figure["led"]]
    if worst:
        print(f"controlled shutdown, partitions whose leader left: longest gap "
              f"median {statistics.median(worst) * 1000:.0f} ms, max {max(worst) * 1000:.0f} ms")
    kill = results["kill"]
    killed = [kill["unavailable_s"][str(partition)] for partition in kill["led"]]
    if killed:
        print(f"kill -9 (session timeout {SESSION_TIMEOUT_MS} ms), partitions it led: longest "
              f"gap max {max(killed) * 1000:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "rolling_restart.json"))
    parser.add_argument("--keep-directory", action="store_true",
                        help="keep the cluster's directory (the brokers' logs) and print it")
    arguments = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="shmlog-bench-rolling-")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        results = run(directory)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if arguments.keep_directory:
            print(f"the cluster's directory: {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    report(results)
    os.makedirs(os.path.dirname(arguments.json), exist_ok=True)
    with open(arguments.json, "w") as target:
        json.dump(results, target, indent=2)
    print(f"results in {arguments.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
