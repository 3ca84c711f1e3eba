"""A cluster member's ``stats`` and ``shmlog status``: one controller among the
brokers, every live broker seen, leaderships counted, and ``shmlog status`` on a
broker shows the cluster summary of ``shmlog cluster status`` (read from the
ZooKeeper the broker names). Under ``-m slow`` (a kill and a restart, half a
minute): after kill -9 of a follower the leader's stats count the partition it
leads under-replicated and the summary shows it; the follower restarted, the leader
counts the ISR expand it wrote.

Method: the shared fault cluster (left whole: the killed broker is restarted), a
replicated topic made and seen in sync; every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster.workload import WAIT_S, create_topic, wait_for_leader, wait_in_sync
from shmlog.protocol.control_client import request

TOPIC = "status-stats"
COMMAND_TIMEOUT_S = 60


def stats(cluster, broker_id: int) -> dict:
    return request(cluster.data_dir(broker_id), "stats")["cluster"]


def status(cluster, broker_id: int, *options: str) -> str:
    done = subprocess.run([sys.executable, "-m", "shmlog", "status", "--data-dir",
                           cluster.data_dir(broker_id), *options],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_members_stats_count_leaderships_and_status_shows_the_cluster(fault_cluster):
    create_topic(fault_cluster, TOPIC, {"min.insync.replicas": "1"}, replication_factor=3)
    wait_in_sync(fault_cluster, TOPIC, (1, 2, 3))
    leader, _ = wait_for_leader(fault_cluster, TOPIC)
    members = {broker_id: stats(fault_cluster, broker_id) for broker_id in (1, 2, 3)}
    assert [broker_id for broker_id, seen in members.items() if seen["controller"]] in \
        ([1], [2], [3])
    assert all(seen["live_brokers"] == [1, 2, 3] for seen in members.values())
    assert all(seen["broker_id"] == broker_id for broker_id, seen in members.items())
    assert members[leader]["leader_count"] >= 1
    summary = json.loads(status(fault_cluster, leader, "--json"))["cluster_status"]
    assert [broker["id"] for broker in summary["brokers"]] == [1, 2, 3]
    lines = status(fault_cluster, leader).splitlines()
    assert any(line.startswith(f"cluster: broker {leader}") for line in lines)
    assert any(line.startswith("brokers: 3 live") for line in lines)


@pytest.mark.slow
def test_a_dead_follower_is_counted_under_replicated_and_its_return_as_an_isr_expand(
        fault_cluster):
    create_topic(fault_cluster, TOPIC, {"min.insync.replicas": "1"}, replication_factor=3)
    wait_in_sync(fault_cluster, TOPIC, (1, 2, 3))
    leader, _ = wait_for_leader(fault_cluster, TOPIC)
    expands = stats(fault_cluster, leader)["isr_expands"]
    # A dead broker leaves the ISRs by the controller's hand (Kafka's too), not as a
    # leader's shrink; it comes back by the leader's expand.
    victim = max({1, 2, 3} - {leader})
    fault_cluster.kill(victim)
    wait_in_sync(fault_cluster, TOPIC, tuple(sorted({1, 2, 3} - {victim})))
    fault_cluster.wait_for(
        lambda: stats(fault_cluster, leader)["under_replicated_partitions"] >= 1, WAIT_S,
        "the leader's under-replicated partition counted")
    assert victim not in stats(fault_cluster, leader)["live_brokers"]
    summary = json.loads(status(fault_cluster, leader, "--json"))["cluster_status"]
    assert [broker["id"] for broker in summary["brokers"]] == sorted({1, 2, 3} - {victim})
    assert TOPIC in {entry["topic"] for entry in summary["under_replicated"]}
    lines = status(fault_cluster, leader).splitlines()
    assert any(line.startswith("brokers: 2 live") for line in lines)
    assert any(line.strip().startswith(f"{TOPIC}-0  under-replicated") for line in lines)

    fault_cluster.start_broker(victim)
    wait_in_sync(fault_cluster, TOPIC, (1, 2, 3))
    fault_cluster.wait_for(lambda: stats(fault_cluster, leader)["isr_expands"] > expands,
                           WAIT_S, "the leader's ISR expand counted")
