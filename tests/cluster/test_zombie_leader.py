"""A zombie leader: a leader stopped past its ZooKeeper session, replaced, resumed.

Goal: the old leader never acknowledges an acks=all write it can no longer commit
(issue 14: "a zombie leader's writes are refused"), it becomes a follower of the new
leader and truncates what the new leader does not have, and the history checker
passes over every replica.

Method: the shared three brokers (``fault_cluster``; RF 3, min.insync.replicas 2, as
the design note asks: with min.insync.replicas 1 a resumed leader alone in its ISR
may acknowledge once more, as Kafka's may). A producer thread follows the leader
(``workload.LeaderFollowingProducer``), and a reader moves from broker to broker
(``workload.ReplicaReader``: nothing the zombie shows may be taken back). The leader
is SIGSTOPped for longer than both the session timeout and replica.lag.time.max.ms
(so on waking it also wants to shrink its ISR to itself: that conditional write must
fail), while a second producer on its host puts acks=all sends into its ring. A new
leader is elected; the old one is resumed and drains those sends: each must fail or
stay unanswered, or, if acknowledged, be in the final log at its offset (history
rule 2).
"""

from __future__ import annotations

import time

from cluster.history import History
from cluster.workload import (
    REFUSALS,
    SETTINGS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    check_replicas,
    create_topic,
    describe,
    wait_acked,
    wait_for_leader,
    wait_in_sync,
)
from shmlog.client.producer import Producer
from shmlog.common.errors import ShmlogError

TOPIC = "zombie"
ZOMBIE_SENDS = 40
# Paused past the session timeout and the lag time, with a margin.
PAUSE_S = (max(SETTINGS["zookeeper.session.timeout.ms"], SETTINGS["replica.lag.time.max.ms"])
           + 1500) / 1000


def test_a_zombie_leader_acknowledges_nothing_it_cannot_commit(fault_cluster):
    cluster = fault_cluster
    history = History()
    create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
    wait_in_sync(cluster, TOPIC, (1, 2, 3))
    leader, epoch = wait_for_leader(cluster, TOPIC)
    follower = LeaderFollowingProducer(cluster, TOPIC, history, "live")
    reader = ReplicaReader(cluster, TOPIC, history)
    zombie_side = Producer(cluster.data_dir(leader), acks="all", linger_ms=1)
    follower.start()
    reader.start()
    try:
        wait_acked(follower, 200)
        cluster.pause(leader)
        paused_at = time.monotonic()
        sent = []
        for index in range(ZOMBIE_SENDS):
            value = f"zombie-{index}".encode()
            history.send(value, 0, acks="all")
            sent.append((value, zombie_side.send(TOPIC, value, partition=0)))
        new_leader, new_epoch = wait_for_leader(cluster, TOPIC, not_in=(leader,))
        assert new_epoch > epoch
        time.sleep(max(0.0, PAUSE_S - (time.monotonic() - paused_at)))
        acked_before = follower.acked
        cluster.resume(leader)
        outcomes = {"acked": 0, "refused": 0, "unknown": 0}
        for value, future in sent:
            try:
                history.ack(value, future.get(timeout=10).offset)
                outcomes["acked"] += 1
            except REFUSALS as error:
                history.fail(value, error)
                outcomes["refused"] += 1
            except ShmlogError:
                outcomes["unknown"] += 1
        print(f"the zombie's sends after it woke: {outcomes}")
        cluster.wait_for(lambda: describe(cluster, leader, TOPIC)["role"] == "follower"
                         and describe(cluster, leader, TOPIC)["leader"] == new_leader,
                         WAIT_S, f"broker {leader} to follow broker {new_leader}")
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        wait_acked(follower, acked_before + 200)
    finally:
        follower.stop()
        reader.stop()
        try:
            zombie_side.close(timeout=1)
        except ShmlogError:
            pass
    check_replicas(cluster, TOPIC, history)
