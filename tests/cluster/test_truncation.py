"""KIP-101's and KIP-279's cases on real brokers: a restarted follower never
truncates to its high watermark, and replicas that diverged over two quick leader
changes end byte-identical.

Both run on the shared three brokers (``fault_cluster``).

KIP-101 (RF 2, min.insync.replicas 1; the third broker observes): acks=all records
are acknowledged; the follower is killed at once (it fetched them, but may not have
learnt the high watermark that covers them), restarted (its high watermark is
stale: no checkpoint covers the last records), and rejoins the ISR; then the leader
is killed. With truncation to the high watermark the restarted follower would have
dropped the acknowledged records and, once leader, lost them; with leader epochs
it truncates nothing (its log says so) and they survive.

KIP-279 (RF 3, unclean.leader.election.enable, so a replica that was away may lead):
the followers B and C are paused (SIGSTOP), the leader A appends x (acks=1) and is
killed; B is resumed and elected, appends y (acks=1) and is killed before C, still
paused, ever fetches from it; C is resumed and elected. Two leader changes passed
while C fetched nothing, and A (x, epoch e0) and B (y, epoch e1) each hold a tail C
never had. A and B are restarted: the EPOCH_END loop truncates both to where the
logs agree, and all three end byte-identical. The acks=all records committed before
the faults survive (history rule 2); x and y were acks=1 (not promised).
"""

from __future__ import annotations

from cluster.history import History, read_replica
from cluster.workload import (
    broker_output,
    check_replicas,
    create_topic,
    describe,
    replica_offsets,
    wait_for_leader,
    wait_in_sync,
)
from shmlog.client.producer import Producer

WAIT_S = 60.0


def produce(cluster, broker_id: int, topic: str, history: History, values: list,
            acks="all") -> list[int]:
    """Send ``values`` to partition 0 through broker ``broker_id``; their offsets.

    Not idempotent: producer ids are handed out per broker (each from 0) until they
    come from ZooKeeper, so a producer on a new leader may get the id of the old
    leader's producer and have its batches taken for re-sends of that one's
    (acknowledged at the old batches' offsets, never appended)."""
    offsets = []
    with Producer(cluster.data_dir(broker_id), acks=acks, linger_ms=1,
                  enable_idempotence=False) as producer:
        futures = []
        for value in values:
            history.send(value, 0, acks=acks)
            futures.append(producer.send(topic, value, partition=0))
        for value, future in zip(values, futures):
            offset = future.get(timeout=WAIT_S).offset
            history.ack(value, offset)
            offsets.append(offset)
    return offsets


def test_kip_101_a_restarted_follower_keeps_what_was_acknowledged(fault_cluster):
    cluster = fault_cluster
    history = History()
    topic = "kip101"
    create_topic(cluster, topic, {"min.insync.replicas": "1"}, 2)
    leader, _ = wait_for_leader(cluster, topic)
    replicas = tuple(describe(cluster, leader, topic)["replicas"])
    wait_in_sync(cluster, topic, replicas)
    follower = next(broker_id for broker_id in replicas if broker_id != leader)
    offsets = produce(cluster, leader, topic, history, [b"m-%d" % n for n in range(300)])
    cluster.kill(follower)
    directory = describe(cluster, leader, topic)["directory"].replace(
        f"broker-{leader}", f"broker-{follower}")
    held = read_replica(directory, 0).records
    print(f"the killed follower holds offsets up to {held[-1][0] if held else None}; "
          f"the last acknowledged is {offsets[-1]}")
    restarted_from = len(broker_output(cluster, follower))
    cluster.start_broker(follower)
    end, high_watermark = replica_offsets(cluster, follower, topic)
    print(f"restarted follower: log end {end}, high watermark {high_watermark}")
    wait_in_sync(cluster, topic, replicas)
    after_restart = broker_output(cluster, follower)[restarted_from:]
    if held:
        assert "truncating" not in after_restart, after_restart
    cluster.kill(leader)
    wait_for_leader(cluster, topic, not_in=(leader,))
    produce(cluster, follower, topic, history, [b"n-%d" % n for n in range(50)])
    cluster.start_broker(leader)
    wait_in_sync(cluster, topic, replicas)
    check_replicas(cluster, topic, history)


def test_kip_279_two_quick_leader_changes_end_byte_identical(fault_cluster):
    cluster = fault_cluster
    history = History()
    topic = "kip279"
    create_topic(cluster, topic,
                 {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}, 3)
    wait_in_sync(cluster, topic, (1, 2, 3))
    a, _ = wait_for_leader(cluster, topic)
    replicas = describe(cluster, a, topic)["replicas"]
    b, c = [broker for broker in replicas if broker != a]     # election order
    produce(cluster, a, topic, history, [b"p-%d" % n for n in range(200)])
    wait_in_sync(cluster, topic, (1, 2, 3))
    cluster.pause(b)
    cluster.pause(c)
    produce(cluster, a, topic, history, [b"x-%d" % n for n in range(30)], acks=1)
    cluster.kill(a)
    cluster.resume(b)
    wait_for_leader(cluster, topic, not_in=(a,))
    assert wait_for_leader(cluster, topic)[0] == b
    produce(cluster, b, topic, history, [b"y-%d" % n for n in range(20)], acks=1)
    cluster.kill(b)
    cluster.resume(c)
    _, epoch = wait_for_leader(cluster, topic, not_in=(a, b))
    print(f"leaders {a} -> {b} -> {c} (epoch {epoch}) while {c} fetched nothing")
    produce(cluster, c, topic, history, [b"z-%d" % n for n in range(20)], acks=1)
    cluster.start_broker(a)
    cluster.start_broker(b)
    wait_in_sync(cluster, topic, (1, 2, 3))
    produce(cluster, c, topic, history, [b"q-%d" % n for n in range(50)])
    check_replicas(cluster, topic, history)
    for broker in (a, b):
        print(f"broker {broker}: " + " | ".join(
            line.split("INFO shmlog.broker: ")[-1] for line in
            broker_output(cluster, broker).splitlines() if "truncating" in line
            and topic in line))
