"""Adding a broker and moving a partition onto it, under acks=all load: the procedure
of docs/OPERATIONS.md, step by step, with the same commands.

Goal: ``shmlog cluster reassign`` moves a partition's replicas onto a new broker while
an acks=all producer keeps writing, and nothing acknowledged is lost: the new replica
catches up into the ISR, the old one leaves the assignment and the ISR, the replicas
end byte-identical, and the throttle is in ZooKeeper during the move and gone after
``--verify`` reports it complete.

Method: a LocalCluster of three brokers on the session's ZooKeeper (its own chroot), a
topic (RF 3, min.insync.replicas 2) written by ``workload.LeaderFollowingProducer``
(idempotent, acks=all, following the leader through the move) and read by a
``workload.ReplicaReader``. Broker 4 is started (``LocalCluster.add_broker``), then the
CLI runs as an operator runs it: ``--generate`` for the topic over brokers 2,3,4 (so
broker 1 leaves, whatever the proposal's order), ``--execute`` of the proposal with
``--throttle``, ``--verify`` until it exits 0. The history checker
(tests/cluster/history.py) judges what was acknowledged and read against every
replica's segment files (``workload.check_replicas``). Every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from cluster.history import History
from cluster.workload import (WAIT_S, LeaderFollowingProducer, ReplicaReader, check_replicas,
                              create_topic, start_cluster, stop_cluster, wait_acked,
                              wait_in_sync)
from shmlog.zk_client import ClusterZooKeeper

TOPIC = "grown"
# Bytes/s the moving replicas may copy: the move takes a few seconds at most, with
# the bucket's limit in force.
THROTTLE_BYTES_PER_S = 200_000
ACKS_BEFORE = 300
ACKS_AFTER = 200
CLI_TIMEOUT_S = 60


def reassign(cluster, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlog", "cluster", "reassign",
                           "--zookeeper-connect", cluster.zookeeper_connect, *arguments],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def proposal(generated: str) -> dict:
    """The proposed assignment ``--generate`` printed (the JSON after its heading)."""
    lines = generated.splitlines()
    return json.loads(lines[lines.index("Proposed partition reassignment configuration") + 1])


def throttles(zookeeper: ClusterZooKeeper) -> tuple[dict, dict]:
    """(broker configs of 1..4, the topic's config) as ZooKeeper holds them."""
    return ({broker_id: zookeeper.read_broker_config(broker_id) for broker_id in (1, 2, 3, 4)},
            zookeeper.read_topic_config(TOPIC))


def test_add_a_broker_and_move_a_partition_onto_it_under_acks_all(zookeeper, tmp_path):
    cluster = start_cluster(str(tmp_path / "cluster"), zookeeper, log_files=True)
    history = History()
    try:
        create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        producer = LeaderFollowingProducer(cluster, TOPIC, history, TOPIC)
        reader = ReplicaReader(cluster, TOPIC, history)
        producer.start()
        reader.start()
        try:
            wait_acked(producer, ACKS_BEFORE)
            assert cluster.add_broker() == 4
            move_onto_broker_4(cluster, tmp_path)
            wait_acked(producer, producer.acked + ACKS_AFTER)
        finally:
            producer.stop()
            reader.stop()
        wait_in_sync(cluster, TOPIC, (2, 3, 4))
        check_replicas(cluster, TOPIC, history)
    finally:
        stop_cluster(cluster)


def move_onto_broker_4(cluster, tmp_path) -> None:
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"topics": [{"topic": TOPIC}], "version": 1}))
    generated = reassign(cluster, "--generate", "--topics-to-move-json-file", str(topics_file),
                         "--broker-list", "2,3,4")
    assert generated.returncode == 0, generated.stderr
    proposed = proposal(generated.stdout)
    target = proposed["partitions"][0]["replicas"]
    assert sorted(target) == [2, 3, 4]
    plan = tmp_path / "reassignment.json"
    plan.write_text(json.dumps(proposed))
    with ClusterZooKeeper(cluster.zookeeper_connect) as zookeeper:
        executed = reassign(cluster, "--execute", "--reassignment-json-file", str(plan),
                            "--throttle", str(THROTTLE_BYTES_PER_S))
        assert executed.returncode == 0, executed.stderr
        again = reassign(cluster, "--execute", "--reassignment-json-file", str(plan))
        assert again.returncode == 1 or zookeeper.read_reassignment() is None, again.stdout
        brokers, topic = throttles(zookeeper)
        for broker_id in (1, 2, 3, 4):      # the origin's and the target's brokers
            assert brokers[broker_id]["leader.replication.throttled.rate"] == \
                str(THROTTLE_BYTES_PER_S)
        assert topic["follower.replication.throttled.replicas"] == "0:4"
        assert sorted(topic["leader.replication.throttled.replicas"].split(",")) == \
            ["0:1", "0:2", "0:3"]
        assert topic["min.insync.replicas"] == "2"
        verify_until_complete(cluster, plan)
        brokers, topic = throttles(zookeeper)
        assert all(not config for config in brokers.values()), brokers
        assert topic == {"min.insync.replicas": "2"}
        assignment = zookeeper.read_assignment(TOPIC)
        assert assignment.partitions[0] == tuple(target)
        assert (assignment.adding_replicas, assignment.removing_replicas) == ({}, {})
        state, _ = zookeeper.read_partition_state(TOPIC, 0)
        assert 1 not in state.isr and sorted(state.isr) == [2, 3, 4]


def verify_until_complete(cluster, plan) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        verified = reassign(cluster, "--verify", "--reassignment-json-file", str(plan))
        assert "failed" not in verified.stdout, verified.stdout
        if verified.returncode == 0:
            assert "is complete" in verified.stdout
            print(verified.stdout)
            return
        assert verified.returncode == 1 and "in progress" in verified.stdout, \
            (verified.stdout, verified.stderr)
        assert time.monotonic() < deadline, f"not complete within {WAIT_S} s: {verified.stdout}"
        time.sleep(0.5)
