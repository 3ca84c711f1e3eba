"""kill -9 of a partition's leader under acks=all load, round after round.

Goal: no acknowledged acks=all record is lost, none is stored twice, and the
replicas' committed prefixes stay byte-identical, however often the leader dies
(issue 14's "kill -9 the leader under acks=all load, many times"); and how long a
failover takes, printed next to the session timeout it is bounded by.

Method: three real brokers (RF 3, min.insync.replicas 2), a producer thread
(``workload.LeaderFollowingProducer``: idempotent, acks=all, on the leader's broker,
made again on the new leader after each failover, a send without an answer recorded
as unknown). Each round: wait for acknowledgements on the current leader, SIGKILL it,
wait for the first acknowledgement from the new leader (the failover time), restart
the killed broker and wait until it is back in the ISR. At the end the history
checker judges what the producer saw against every replica's segment files.
``--cluster-kills N`` sets the rounds (5 by default; the ``slow`` soak runs 20).
"""

from __future__ import annotations

import time

import pytest

from cluster.history import History
from cluster.workload import (SESSION_TIMEOUT_MS, WAIT_S, LeaderFollowingProducer,
                              check_replicas, start_cluster, stop_cluster, wait_acked,
                              wait_for_leader, wait_in_sync)
from shmlog.admin import Admin

TOPIC = "killed"
# Acknowledgements on each leader before it is killed.
ACKS_PER_ROUND = 100
SOAK_KILLS = 20


def kill_leaders(tmp_path, zookeeper, kills: int) -> None:
    cluster = start_cluster(str(tmp_path / "cluster"), zookeeper)
    history = History()
    try:
        Admin(cluster.data_dir(1)).create_topic(TOPIC, 1, {"min.insync.replicas": "2"},
                                                replication_factor=3)
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        producer = LeaderFollowingProducer(cluster, TOPIC, history, "kill")
        producer.start()
        failovers = []
        try:
            for round_ in range(kills):
                wait_acked(producer, (round_ + 1) * ACKS_PER_ROUND)
                leader, epoch = wait_for_leader(cluster, TOPIC)
                killed_at = time.monotonic()
                cluster.kill(leader)
                new_leader, new_epoch = wait_for_leader(cluster, TOPIC, not_in=(leader,))
                assert new_epoch > epoch
                acked = cluster.wait_for(lambda: producer.first_ack_after(killed_at, leader),
                                         WAIT_S, "an acks=all acknowledgement on the new leader")
                failovers.append(acked - killed_at)
                print(f"round {round_}: leader {leader} (epoch {epoch}) killed; leader "
                      f"{new_leader} (epoch {new_epoch}) acknowledged after "
                      f"{(acked - killed_at) * 1000:.0f} ms")
                cluster.start_broker(leader)
                wait_in_sync(cluster, TOPIC, (1, 2, 3))
            wait_acked(producer, (kills + 1) * ACKS_PER_ROUND)
        finally:
            producer.stop()
        print(f"failover (kill -9 to the first acks=all acknowledgement): "
              f"{', '.join(f'{seconds * 1000:.0f}' for seconds in failovers)} ms; "
              f"session timeout {SESSION_TIMEOUT_MS} ms")
        check_replicas(cluster, TOPIC, history)
    finally:
        stop_cluster(cluster)


def test_kill_the_leader_under_acks_all_load(tmp_path, zookeeper, request):
    kill_leaders(tmp_path, zookeeper, request.config.getoption("--cluster-kills"))


@pytest.mark.slow
def test_kill_the_leader_under_acks_all_load_soak(tmp_path, zookeeper):
    kill_leaders(tmp_path, zookeeper, SOAK_KILLS)
