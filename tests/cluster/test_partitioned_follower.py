"""A follower partitioned away from its peers, on a network of namespaces.

Goal: Kafka's ISR rules under a real partition (packets dropped, no resets): the
leader drops the cut follower from the ISR after replica.lag.time.max.ms, acks=all
goes on with min.insync.replicas=2 of 3, and after the heal the follower catches up
and rejoins the ISR; the history checker passes and the replicas end
byte-identical.

Method: ``netns.Topology`` (skipped, with the reason, without root, ``ip`` or
``nft``): ZooKeeper runs in namespace zk, broker i in namespace bi at its address
there (``LocalCluster``'s hosts and launch prefixes); clients reach the brokers
through their data directories, which no network carries. A producer thread
follows the leader (``workload.LeaderFollowingProducer``), a reader moves from
broker to broker, the cut one included (``workload.ReplicaReader``). One follower is cut
from the two other brokers only (ZooKeeper stays reachable, so its session lives
and the controller leaves the ISR alone: the shrink is the leader's), with
replica.lag.time.max.ms 1500 (short: this test is about the shrink).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cluster.history import History
from cluster.workload import (
    SETTINGS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    check_replicas,
    create_topic,
    describe,
    stop_cluster,
    wait_acked,
    wait_for_leader,
    wait_in_sync,
)
from shmlog.devtools.local_cluster import LocalCluster

TOPIC = "partitioned"
ZOOKEEPER_PORT = 2181
ZOOKEEPER_START_TIMEOUT_S = 120.0
LAG_MS = 1500
MEMBERS = {1: "b1", 2: "b2", 3: "b3"}


def ip_command() -> str:
    """``ip``'s path (root's tools live in sbin, which a PATH may leave out)."""
    found = shutil.which("ip", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin",
                                                     "/sbin"]))
    assert found, "ip is not installed"
    return found


def start_zookeeper(topology, directory: str) -> str:
    """ZooKeeper in namespace zk (``shmlog zookeeper``); its connect string."""
    return NamespacedZooKeeper(topology, directory).start()


class NamespacedZooKeeper:
    """``shmlog zookeeper`` in namespace zk, on ``directory``: started, killed -9 (its
    JVM, as a crashed host would lose it) and started again on the same data."""

    def __init__(self, topology, directory: str):
        self.topology, self.directory = topology, directory
        self.wrapper: subprocess.Popen | None = None

    def start(self) -> str:
        """Start it and wait until it serves; its connect string."""
        address = self.topology.address("zk")
        self.wrapper = self.topology.run_in(
            "zk", [sys.executable, "-m", "shmlog", "zookeeper", "--data-dir", self.directory,
                   "--host", address, "--port", str(ZOOKEEPER_PORT), "--tick-time-ms", "500"],
            stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.wrapper.stdout], [], [], ZOOKEEPER_START_TIMEOUT_S)
        assert ready, f"ZooKeeper did not start within {ZOOKEEPER_START_TIMEOUT_S} s"
        line = self.wrapper.stdout.readline()
        assert line.startswith("ZooKeeper serves"), line
        return f"{address}:{ZOOKEEPER_PORT}"

    def kill(self) -> None:
        """SIGKILL the JVM; its wrapper then exits."""
        for child in _children(self.wrapper.pid):
            os.kill(child, signal.SIGKILL)
        self.wrapper.wait(timeout=ZOOKEEPER_START_TIMEOUT_S)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (/proc's children lists of its threads)."""
    children = []
    for thread in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{thread}/children") as listed:
            children.extend(int(child) for child in listed.read().split())
    return children


def isr_seen_by(cluster, broker_id: int) -> list[int]:
    return sorted(describe(cluster, broker_id, TOPIC)["isr"])


@pytest.mark.timeout(600)
def test_a_partitioned_follower_leaves_the_isr_and_rejoins_after_the_heal(topology, tmp_path):
    connect = start_zookeeper(topology, str(tmp_path / "zookeeper"))
    cluster = LocalCluster(
        str(tmp_path / "cluster"), 3, zookeeper_connect=connect,
        settings={**SETTINGS, "replica.lag.time.max.ms": LAG_MS},
        hosts={broker_id: topology.address(member) for broker_id, member in MEMBERS.items()},
        launch_prefixes={broker_id: [ip_command(), "netns", "exec", topology.namespace(member)]
                         for broker_id, member in MEMBERS.items()},
        log_files=True)
    history = History()
    try:
        cluster.start()
        create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        leader, _ = wait_for_leader(cluster, TOPIC)
        cut = max(broker_id for broker_id in MEMBERS if broker_id != leader)
        others = [MEMBERS[broker_id] for broker_id in MEMBERS if broker_id != cut]
        producer = LeaderFollowingProducer(cluster, TOPIC, history, "netns")
        reader = ReplicaReader(cluster, TOPIC, history)
        producer.start()
        reader.start()
        try:
            wait_acked(producer, 200)
            topology.cut(MEMBERS[cut], others)
            cut_at = time.monotonic()
            in_sync = sorted(set(MEMBERS) - {cut})
            cluster.wait_for(lambda: isr_seen_by(cluster, leader) == in_sync, WAIT_S,
                             f"the leader to drop broker {cut} from the ISR")
            print(f"the ISR shrank to {in_sync} {time.monotonic() - cut_at:.1f} s after the "
                  f"cut (replica.lag.time.max.ms {LAG_MS})")
            acked = producer.acked
            wait_acked(producer, acked + 300)          # acks=all goes on with 2 of 3
            topology.heal(MEMBERS[cut])
            healed_at = time.monotonic()
            wait_in_sync(cluster, TOPIC, (1, 2, 3))
            print(f"broker {cut} back in the ISR {time.monotonic() - healed_at:.1f} s after "
                  f"the heal")
            wait_acked(producer, producer.acked + 200)
        finally:
            producer.stop()
            reader.stop()
        check_replicas(cluster, TOPIC, history)
    finally:
        stop_cluster(cluster)
