"""A leader cut from ZooKeeper alone, past its session, while it goes on serving.

Goal: the safety of Kafka's rule that a leader whose ZooKeeper session is suspended
goes on serving (``cluster.replication.hosted_replicas``). When one broker alone is
cut from ZooKeeper, its session expires and the controller elects another leader;
the cut broker, still SUSPENDED (it cannot hear of the expiry), still takes acks=all
sends from its host's producers, but acknowledges none of them: it cannot shrink its
ISR without ZooKeeper, and its followers, having learnt the new leader, fetch from
it no more. After the heal it learns its session was lost, resigns (its parked
sends fail), follows the new leader and truncates; the history checker passes over
every replica and the cluster serves acks=all again.

Method: ``netns.Topology`` (skipped, with the reason, without root, ``ip`` or
``nft``): ZooKeeper in namespace zk, broker i in bi. One partition on all three,
min.insync.replicas 2, ``workload.SETTINGS`` (session timeout 3 s). A producer
thread follows the leader and a reader moves from broker to broker
(``workload``); the leader's namespace is cut from ZooKeeper's only (its peers
stay reachable). Once the two others follow a new leader, a producer on the cut
broker's host sends acks=all; each send is recorded in the history, and none may
be acknowledged while the cut holds. Every wait is bounded.
"""

from __future__ import annotations

import time

import pytest

from cluster.history import History
from cluster.test_partitioned_follower import ip_command, start_zookeeper
from cluster.workload import (
    REFUSALS,
    SETTINGS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    check_replicas,
    create_topic,
    describe,
    stop_cluster,
    wait_acked,
    wait_in_sync,
)
from shmlog.client.producer import Producer
from shmlog.common.errors import ShmlogError
from shmlog.devtools.local_cluster import LocalCluster

TOPIC = "cut-leader"
MEMBERS = {1: "b1", 2: "b2", 3: "b3"}
CUT_SENDS = 40
# How long the cut broker's sends are watched, while the cut holds, for an
# acknowledgement that must not come (its followers fetch from it no more).
WATCH_S = 3.0


def follows(cluster, broker_id: int, leader: int) -> bool:
    try:
        entry = describe(cluster, broker_id, TOPIC)
    except ShmlogError:
        return False
    return entry["leader"] == leader and entry["role"] in ("leader", "follower")


def leads(cluster, broker_id: int) -> bool:
    """Leads again at a newer epoch (a preferred-leader election may give it back)."""
    try:
        entry = describe(cluster, broker_id, TOPIC)
    except ShmlogError:
        return False
    return entry["role"] == "leader" and entry["leader"] == broker_id and \
        all(describe(cluster, other, TOPIC)["leader_epoch"] == entry["leader_epoch"]
            for other in MEMBERS if other != broker_id)


def new_leader_seen_by_others(cluster, old: int) -> int | None:
    """The leader the two brokers other than ``old`` agree on, when it is not ``old``."""
    others = [broker_id for broker_id in MEMBERS if broker_id != old]
    try:
        seen = {describe(cluster, broker_id, TOPIC)["leader"] for broker_id in others}
    except ShmlogError:
        return None
    leader = seen.pop() if len(seen) == 1 else None
    if leader in others and all(follows(cluster, broker_id, leader) for broker_id in others):
        return leader
    return None


@pytest.mark.timeout(600)
def test_a_leader_cut_from_zookeeper_acknowledges_nothing_once_replaced(topology, tmp_path):
    connect = start_zookeeper(topology, str(tmp_path / "zookeeper"))
    cluster = LocalCluster(
        str(tmp_path / "cluster"), 3, zookeeper_connect=connect, settings=SETTINGS,
        hosts={broker_id: topology.address(member) for broker_id, member in MEMBERS.items()},
        launch_prefixes={broker_id: [ip_command(), "netns", "exec", topology.namespace(member)]
                         for broker_id, member in MEMBERS.items()},
        log_files=True)
    history = History()
    old = None
    try:
        cluster.start()
        create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        old = describe(cluster, 1, TOPIC)["leader"]
        producer = LeaderFollowingProducer(cluster, TOPIC, history, "live")
        reader = ReplicaReader(cluster, TOPIC, history)
        cut_side = Producer(cluster.data_dir(old), acks="all", linger_ms=1)
        producer.start()
        reader.start()
        try:
            wait_acked(producer, 200)
            topology.cut(MEMBERS[old], ["zk"])
            cut_at = time.monotonic()
            new = cluster.wait_for(lambda: new_leader_seen_by_others(cluster, old), WAIT_S,
                                   f"the brokers other than {old} to follow a new leader")
            print(f"\nbroker {new} leads {time.monotonic() - cut_at:.1f} s after broker {old} "
                  f"was cut from ZooKeeper; broker {old} sees itself as "
                  f"{describe(cluster, old, TOPIC)['role']}")
            sent = []
            for index in range(CUT_SENDS):
                value = f"cut-{index}".encode()
                history.send(value, 0, acks="all")
                sent.append((value, cut_side.send(TOPIC, value, partition=0)))
            watch_ends = time.monotonic() + WATCH_S
            while time.monotonic() < watch_ends:
                acknowledged = [value for value, future in sent
                                if future.done() and future.exception() is None]
                assert not acknowledged, \
                    f"broker {old}, cut from ZooKeeper and replaced, acknowledged {acknowledged}"
                time.sleep(0.05)
            topology.heal(MEMBERS[old])
            outcomes = {"acked": 0, "refused": 0, "unknown": 0}
            for value, future in sent:
                try:
                    history.ack(value, future.get(timeout=WAIT_S).offset)
                    outcomes["acked"] += 1
                except REFUSALS as error:
                    history.fail(value, error)
                    outcomes["refused"] += 1
                except ShmlogError:
                    outcomes["unknown"] += 1
            print(f"broker {old}'s sends while cut, after the heal: {outcomes}")
            cluster.wait_for(lambda: follows(cluster, old, new) or leads(cluster, old),
                             WAIT_S, f"broker {old} to take the new state")
            wait_in_sync(cluster, TOPIC, (1, 2, 3))
            wait_acked(producer, producer.acked + 200)
        finally:
            producer.stop()
            reader.stop()
            try:
                cut_side.close(timeout=1)
            except ShmlogError:
                pass
        check_replicas(cluster, TOPIC, history)
    finally:
        if old is not None:
            topology.heal(MEMBERS[old])
        stop_cluster(cluster)
