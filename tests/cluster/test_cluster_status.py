"""``shmlog cluster status`` on a running cluster: every broker and the controller
when it is whole; after kill -9 of a follower, the broker gone, the partition
under-replicated and the exit status 1 (a probe's failure)."""

from __future__ import annotations

import json
import subprocess
import sys

from cluster.workload import create_topic, wait_for_leader, wait_in_sync

TOPIC = "status"
COMMAND_TIMEOUT_S = 60


def status(cluster) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "shmlog", "cluster", "status",
                           "--zookeeper-connect", cluster.zookeeper_connect, "--json"],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_status_shows_the_brokers_and_a_partition_a_dead_follower_left_under_replicated(
        fault_cluster):
    create_topic(fault_cluster, TOPIC, {"min.insync.replicas": "2"}, replication_factor=3)
    wait_in_sync(fault_cluster, TOPIC, (1, 2, 3))
    _, whole = status(fault_cluster)
    assert [broker["id"] for broker in whole["brokers"]] == [1, 2, 3]
    assert whole["controller"] in (1, 2, 3)
    assert TOPIC not in {entry["topic"] for entry in whole["under_replicated"]}
    assert set(whole["leaders_per_broker"]) == {"1", "2", "3"}
    assert sum(whole["leaders_per_broker"].values()) == whole["partitions"] - len(whole["offline"])

    leader, _ = wait_for_leader(fault_cluster, TOPIC)
    victim = max(set((1, 2, 3)) - {leader})
    survivors = tuple(sorted(set((1, 2, 3)) - {victim}))
    fault_cluster.kill(victim)
    wait_in_sync(fault_cluster, TOPIC, survivors)
    code, cut = status(fault_cluster)
    assert code == 1, "an under-replicated partition fails the status"
    assert [broker["id"] for broker in cut["brokers"]] == list(survivors)
    assert str(victim) not in cut["leaders_per_broker"]
    mine = [entry for entry in cut["under_replicated"] if entry["topic"] == TOPIC]
    assert mine == [{"topic": TOPIC, "partition": 0, "replicas": mine[0]["replicas"],
                     "leader": leader, "leader_epoch": mine[0]["leader_epoch"],
                     "isr": mine[0]["isr"]}]
    assert sorted(mine[0]["isr"]) == list(survivors)
    assert sorted(mine[0]["replicas"]) == [1, 2, 3]
