"""kill -9 of a partition's leader under acks=all load, round after round.

Goal: no acknowledged acks=all record is lost, none is stored twice, and the
replicas' committed prefixes stay byte-identical, however often the leader dies
(issue 14's "kill -9 the leader under acks=all load, many times"); and how long a
failover takes, printed next to the session timeout it is bounded by.

Method: the shared three brokers (``fault_cluster``; RF 3, min.insync.replicas 2), a
producer thread (``workload.LeaderFollowingProducer``: idempotent, acks=all, on the
leader's broker, made again on the new leader after each failover, a send without an
answer recorded as unknown) and a reader moving from broker to broker every second
(``workload.ReplicaReader``: every record any replica showed is recorded). Each
round: wait for acknowledgements on the current leader, SIGKILL it, wait for the
first acknowledgement from the new leader (the failover time), restart the killed
broker and wait until it is back in the ISR. At the end the history checker judges
what the producer and the reader saw against every replica's segment files.
``--cluster-kills N`` sets the rounds (3 by default; the ``slow`` soak runs 20).
"""

from __future__ import annotations

import time

import pytest

from cluster.history import History
from cluster.workload import (
    SESSION_TIMEOUT_MS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    check_replicas,
    create_topic,
    wait_acked,
    wait_for_leader,
    wait_in_sync,
)

# Acknowledgements on each leader before it is killed.
ACKS_PER_ROUND = 100
SOAK_KILLS = 20


def kill_leaders(cluster, topic: str, kills: int) -> None:
    history = History()
    create_topic(cluster, topic, {"min.insync.replicas": "2"}, 3)
    wait_in_sync(cluster, topic, (1, 2, 3))
    producer = LeaderFollowingProducer(cluster, topic, history, topic)
    reader = ReplicaReader(cluster, topic, history)
    producer.start()
    reader.start()
    failovers = []
    try:
        for round_ in range(kills):
            wait_acked(producer, (round_ + 1) * ACKS_PER_ROUND)
            failovers.append(kill_and_restart_the_leader(cluster, topic, producer, round_))
        wait_acked(producer, (kills + 1) * ACKS_PER_ROUND)
    finally:
        producer.stop()
        reader.stop()
    print(f"failover (kill -9 to the first acks=all acknowledgement): "
          f"{', '.join(f'{seconds * 1000:.0f}' for seconds in failovers)} ms; "
          f"session timeout {SESSION_TIMEOUT_MS} ms")
    check_replicas(cluster, topic, history)


def kill_and_restart_the_leader(cluster, topic: str, producer: LeaderFollowingProducer,
                                round_: int) -> float:
    """One round; the failover time (s)."""
    leader, epoch = wait_for_leader(cluster, topic)
    killed_at = time.monotonic()
    cluster.kill(leader)
    new_leader, new_epoch = wait_for_leader(cluster, topic, not_in=(leader,))
    assert new_epoch > epoch
    acked = cluster.wait_for(lambda: producer.first_ack_after(killed_at, leader), WAIT_S,
                             "an acks=all acknowledgement on the new leader")
    print(f"round {round_}: leader {leader} (epoch {epoch}) killed; leader {new_leader} "
          f"(epoch {new_epoch}) acknowledged after {(acked - killed_at) * 1000:.0f} ms")
    cluster.start_broker(leader)
    wait_in_sync(cluster, topic, (1, 2, 3))
    return acked - killed_at


def test_kill_the_leader_under_acks_all_load(fault_cluster, request):
    kill_leaders(fault_cluster, "killed", request.config.getoption("--cluster-kills"))


@pytest.mark.slow
def test_kill_the_leader_under_acks_all_load_soak(fault_cluster):
    kill_leaders(fault_cluster, "killed-soak", SOAK_KILLS)
