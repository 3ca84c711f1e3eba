"""A rolling restart of a three-broker cluster under acks=all load, with controlled
shutdown, then preferred leader election on demand.

Goal (issue 15, "Operations"): each broker in turn gets SIGTERM, moves its
leaderships away (controlled shutdown), flushes, leaves and starts again; no
acknowledged record is lost or stored twice, the replicas agree, and at the end
``shmlog cluster elect-leaders`` gives every partition back to its preferred replica.

Method: a cluster of its own (it stops brokers); a topic of three partitions, RF 3,
min.insync.replicas 2; one ``workload.LeaderFollowingProducer`` (idempotent,
acks=all) per partition. Each round: wait for acknowledgements, SIGTERM one broker
and wait for its exit (status 0), check that its own log says the controlled
shutdown ended with no partition left to it before it flushed and closed its logs
(and, for the controller's broker, before its controller resigned: what is asserted
is the order the broker logged, never a duration) and that no partition names it
leader, start it
again and wait until it is back in every ISR. Automatic rebalance is off, so what
restores the preferred leaders is the command. The history checker judges every
partition against every replica's segment files.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster.history import History
from cluster.workload import (
    LeaderFollowingProducer,
    broker_output,
    check_replicas,
    start_cluster,
    stop_cluster,
    wait_acked,
    wait_in_sync,
)
from shmlog.client.admin import Admin
from shmlog.cluster.zk.client import ClusterZooKeeper

TOPIC = "rolling"
PARTITIONS = 3
BROKERS = (1, 2, 3)
# Acknowledgements per partition between two restarts.
ACKS_PER_ROUND = 60
COMMAND_TIMEOUT_S = 60
DONE = "controlled shutdown done"


@pytest.fixture
def rolling_cluster(zookeeper, tmp_path):
    cluster = start_cluster(str(tmp_path / "rolling"), zookeeper,
                            {"auto.leader.rebalance.enable": False}, log_files=True)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def read(cluster, reader):
    """``reader(session)`` on a ZooKeeper session of its own."""
    session = ClusterZooKeeper(cluster.zookeeper_connect).start(create_paths=False)
    try:
        return reader(session)
    finally:
        session.close()


def states(cluster) -> dict:
    """partition → (replicas, state) of the topic, read from ZooKeeper."""
    def reader(session):
        assignment = session.read_assignment(TOPIC)
        return {partition: (replicas, session.read_partition_state(TOPIC, partition)[0])
                for partition, replicas in assignment.partitions.items()}
    return read(cluster, reader)


def restart(cluster, broker_id: int, producers: list) -> None:
    for producer in producers:
        wait_acked(producer, producer.acked + ACKS_PER_ROUND)
    controller = read(cluster, lambda session: session.read_controller())
    assert cluster.brokers[broker_id].stop() == 0
    output = broker_output(cluster, broker_id)
    assert output.count(DONE) == 1, output[-3000:]
    assert "controlled shutdown gave up" not in output
    # The order the broker logged: leaderships gone, then the logs flushed and closed
    # (and, in the controller's broker, the controller moved them before it resigned).
    assert output.index(DONE) < output.rindex("draining rings, flushing and closing")
    if controller is not None and controller.broker_id == broker_id:
        assert output.index(DONE) < output.rindex(f"controller {broker_id} resigns")
    cluster.brokers.pop(broker_id)
    for partition, (_, state) in states(cluster).items():
        assert state.leader != broker_id, (partition, state)
        assert broker_id not in state.isr, (partition, state)
    cluster.start_broker(broker_id)
    for partition in range(PARTITIONS):
        wait_in_sync(cluster, TOPIC, BROKERS, partition)


def elect_leaders(cluster) -> tuple[int, str, list]:
    command = [sys.executable, "-m", "shmlog", "cluster", "elect-leaders",
               "--zookeeper-connect", cluster.zookeeper_connect, "--topic", TOPIC]
    text = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    as_json = subprocess.run(command + ["--json"], capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT_S)
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    return text.returncode, text.stdout, json.loads(as_json.stdout)


def test_rolling_restart_under_acks_all_load_loses_nothing(rolling_cluster):
    cluster = rolling_cluster
    Admin(cluster.data_dir(1)).create_topic(TOPIC, PARTITIONS, {"min.insync.replicas": "2"},
                                            replication_factor=3)
    for partition in range(PARTITIONS):
        wait_in_sync(cluster, TOPIC, BROKERS, partition)
    histories = [History() for _ in range(PARTITIONS)]
    producers = [LeaderFollowingProducer(cluster, TOPIC, histories[partition], f"p{partition}",
                                         partition) for partition in range(PARTITIONS)]
    for producer in producers:
        producer.start()
    try:
        for broker_id in BROKERS:
            restart(cluster, broker_id, producers)
        for producer in producers:
            wait_acked(producer, producer.acked + ACKS_PER_ROUND)
    finally:
        for producer in producers:
            producer.stop()
    code, text, answers = elect_leaders(cluster)
    print(text)
    assert code == 0, text
    assert f"{PARTITIONS} of {PARTITIONS} partitions led by their preferred replica" in text
    # The last broker restarted led nothing when it came back: its partitions moved.
    assert ": elected (leader " in text
    # Asked again (the JSON run, after the text one): nothing left to elect.
    assert {answer["outcome"] for answer in answers} == {"already_preferred"}, answers
    for partition, (replicas, state) in states(cluster).items():
        assert state.leader == replicas[0], (partition, replicas, state)
    for partition in range(PARTITIONS):
        check_replicas(cluster, TOPIC, histories[partition], partition)
