"""Adding a broker and moving a partition onto it, under acks=all load: the procedure
of docs/OPERATIONS.md, step by step, with the same commands; and the throttle's bound
on a new broker's copy, through real brokers.

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
replica's segment files (``workload.check_replicas``).

The throttle: a backlog of 1000-byte records is written, a fifth broker is started
with a follower rate in its ``/config/brokers/5`` and its pair in the topic's
``follower.replication.throttled.replicas``, and its copy (an observer's) is sampled
for seconds: what it holds never exceeds rate × (time since it started + the
bucket's one second) + one fetch. Then the leader's rate and pair alone bound it
the same way (the new broker's throttle removed once the leader logged it took
its own); then the throttles go and the copy catches up, byte-identical. The
bound holds however slow the machine is (slowness only copies less); times are
printed, never asserted. Both tests share one cluster (module scope: each adds a
broker). Every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cluster.history import History
from cluster.workload import (
    ADMIN_TIMEOUT_MS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    broker_output,
    check_replicas,
    create_topic,
    describe,
    replica_offsets,
    start_cluster,
    stop_cluster,
    wait_acked,
    wait_for_leader,
    wait_in_sync,
)
from shmlog.client.producer import Producer
from shmlog.cluster import reassign as cluster_reassign
from shmlog.cluster.zk.client import ClusterZooKeeper

TOPIC = "grown"
# Bytes/s the moving replicas may copy: the move takes a few seconds at most, with
# the bucket's limit in force.
THROTTLE_BYTES_PER_S = 200_000
ACKS_BEFORE = 300
ACKS_AFTER = 200
CLI_TIMEOUT_S = 60
# The throttle test: a backlog of BACKLOG_RECORDS records of RECORD_SIZE bytes, copied
# at most at THROTTLED_BYTES_PER_S; the copy is sampled every SAMPLE_S for SAMPLES times
# per side. A fetch asks for at most replica.fetch.max.bytes (1 MiB by default) and
# the leader reads whole batches: one of those is the slack of the bound.
THROTTLED = "throttled"
RECORD_SIZE = 1000
BACKLOG_RECORDS = 5000
THROTTLED_BYTES_PER_S = 50_000
FETCH_SLACK_BYTES = 1 << 20
BURST_S = 1.0
SAMPLE_S = 0.5
SAMPLES = 6
# What a broker logs when it takes THROTTLED_BYTES_PER_S as both rates.
RATES_TAKEN = f"throttle rates (leader, follower): ({THROTTLED_BYTES_PER_S}, " \
              f"{THROTTLED_BYTES_PER_S})"


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    """Three brokers of their own (each test adds one)."""
    made = start_cluster(str(tmp_path_factory.mktemp("reassign")), zookeeper, log_files=True)
    try:
        yield made
    finally:
        stop_cluster(made)


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


def test_add_a_broker_and_move_a_partition_onto_it_under_acks_all(cluster, tmp_path):
    history = History()
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
    # broker 1 keeps a copy for its host's readers, as for any partition it does not
    # hold a replica of
    assert describe(cluster, 1, TOPIC, timeout_ms=ADMIN_TIMEOUT_MS)["role"] == "observer"
    check_replicas(cluster, TOPIC, history)


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
        started_at = time.monotonic()
        executed = reassign(cluster, "--execute", "--reassignment-json-file", str(plan),
                            "--throttle", str(THROTTLE_BYTES_PER_S))
        assert executed.returncode == 0, executed.stderr
        brokers, topic = throttles(zookeeper)
        for broker_id in (1, 2, 3, 4):      # the origin's and the target's brokers
            assert brokers[broker_id]["leader.replication.throttled.rate"] == \
                str(THROTTLE_BYTES_PER_S)
        assert topic["follower.replication.throttled.replicas"] == "0:4"
        assert sorted(topic["leader.replication.throttled.replicas"].split(",")) == \
            ["0:1", "0:2", "0:3"]
        assert topic["min.insync.replicas"] == "2"
        verify_until_complete(cluster, plan)
        print(f"the move to {target} took {time.monotonic() - started_at:.1f} s at "
              f"{THROTTLE_BYTES_PER_S} B/s")
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


def test_the_throttle_bounds_a_new_brokers_copy_on_each_side(cluster):
    history = History()
    create_topic(cluster, THROTTLED, {"min.insync.replicas": "2"}, 3)
    leader, _ = wait_for_leader(cluster, THROTTLED)
    write_backlog(cluster, leader, history)
    new = cluster.count + 1
    rate = {"leader.replication.throttled.rate": str(THROTTLED_BYTES_PER_S),
            "follower.replication.throttled.rate": str(THROTTLED_BYTES_PER_S)}
    with ClusterZooKeeper(cluster.zookeeper_connect) as zookeeper:
        config = zookeeper.read_topic_config(THROTTLED)
        zookeeper.set_broker_config(new, rate)
        zookeeper.set_topic_config(THROTTLED, {**config, "follower.replication.throttled."
                                               "replicas": f"0:{new}"})
        started_at = time.monotonic()
        assert cluster.add_broker() == new
        sample_the_copy(cluster, new, started_at, 0, "follower")
        # The leader's side alone: the leader's throttle comes, and once the leader
        # says it took it (its topic config came before: one session's watches fire
        # in order), the new broker's goes.
        zookeeper.set_topic_config(THROTTLED, {
            **config, "follower.replication.throttled.replicas": f"0:{new}",
            "leader.replication.throttled.replicas": f"0:{leader}"})
        zookeeper.set_broker_config(leader, rate)
        cluster.wait_for(lambda: RATES_TAKEN in broker_output(cluster, leader), WAIT_S,
                         f"broker {leader} to take its throttle rate")
        since, copied = time.monotonic(), replica_offsets(cluster, new, THROTTLED)[0]
        zookeeper.set_broker_config(new, {})
        sample_the_copy(cluster, new, since, copied, "leader")
        cluster_reassign.clear_throttles(zookeeper, [THROTTLED])
    check_replicas(cluster, THROTTLED, history)


def write_backlog(cluster, leader: int, history: History) -> None:
    with Producer(cluster.data_dir(leader), acks="all") as producer:
        values = [b"%08d" % number + bytes(RECORD_SIZE - 8) for number in range(BACKLOG_RECORDS)]
        futures = []
        for value in values:
            history.send(value, 0)
            futures.append(producer.send(THROTTLED, value, partition=0))
        for value, future in zip(values, futures):
            history.ack(value, future.get(timeout=WAIT_S).offset)


def sample_the_copy(cluster, broker_id: int, since: float, copied_before: int,
                    side: str) -> int:
    """Sample the copy's log end for a while, asserting the throttle's bound on each
    sample; the last log end."""
    end = copied_before
    for _ in range(SAMPLES):
        time.sleep(SAMPLE_S)
        end, _ = replica_offsets(cluster, broker_id, THROTTLED)
        elapsed = time.monotonic() - since
        bound = THROTTLED_BYTES_PER_S * (elapsed + BURST_S) + FETCH_SLACK_BYTES
        copied = (end - copied_before) * RECORD_SIZE
        print(f"{side} throttle: {copied} bytes copied in {elapsed:.1f} s (bound {bound:.0f})")
        assert copied <= bound, f"the {side} throttle let {copied} bytes through in " \
                                f"{elapsed:.1f} s (bound {bound:.0f})"
    return end
