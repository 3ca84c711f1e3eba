"""A leader whose ZooKeeper session is suspended fences itself (the design's rule for
kazoo's SUSPENDED state: this broker may have been replaced, ZooKeeper expiring its
session a timeout after it last heard from it).

Goal: with ZooKeeper stopped, the leader refuses new acks=all entries with
NOT_LEADER_OR_FOLLOWER (not NOT_ENOUGH_REPLICAS: its ISR cannot shrink without
ZooKeeper, so min.insync.replicas proves nothing), goes on appending acks=1 entries,
and moves its high watermark no further even when its followers have the records;
when ZooKeeper answers again it acknowledges acks=all and its high watermark
covers what was appended meanwhile.

Method: a ZooKeeper of the test's own (it is stopped with SIGSTOP, resumed with
SIGCONT), three real brokers, one partition on all three with min.insync.replicas 2.
Every wait is bounded; the time from the stop to the first refusal is printed.
"""

from __future__ import annotations

import os
import signal
import time

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import NotLeaderOrFollowerError, ShmlogError
from shmlog.devtools.local_cluster import LocalCluster
from shmlog.devtools.zookeeper import ZooKeeperServer

SESSION_TIMEOUT_MS = 4000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
            "replica.lag.time.max.ms": 10000, "replica.fetch.wait.max.ms": 200,
            "replica.socket.timeout.ms": 1500}
WAIT_S = 60
TOPIC = "fenced"
TP = TopicPartition(TOPIC, 0)
# Fetch rounds a follower makes in this long (replica.fetch.wait.max.ms 200 when idle):
# long enough for a leader that were not fenced to learn their log ends.
FETCH_ROUNDS_S = 1.0
# An acks=all record not acknowledged within this long is taken as parked.
PARKED_WAIT_S = 2.0


def high_watermark(cluster, broker_id):
    with Consumer(bootstrap=cluster.data_dir(broker_id)) as consumer:
        return consumer.end_offsets([TP])[TP]


def log_end(cluster, broker_id):
    return Admin(cluster.data_dir(broker_id)).list_offsets(TOPIC)[0]["log_end_offset"]


def leader_of(cluster):
    return Admin(cluster.data_dir(1)).describe_topic(TOPIC)["partitions"][0]["leader"]


def send_until_refused(data_dir, parked):
    """Send acks=all records, each from a producer of its own, until one is refused
    with NOT_LEADER_OR_FOLLOWER; how many were acknowledged before. A record appended
    just before the leader fenced itself stays parked (its HW no longer moves) and
    holds back its ring: its (producer, future) goes to ``parked``, open."""
    acknowledged = 0
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        producer = Producer(data_dir, acks="all")
        future = producer.send(TOPIC, b"before", partition=0)
        try:
            future.get(timeout=PARKED_WAIT_S)
            acknowledged += 1
        except NotLeaderOrFollowerError:
            producer.close()
            return acknowledged
        except ShmlogError:
            parked.append((producer, future))
            continue
        producer.close()
        time.sleep(0.05)
    raise AssertionError("the leader never refused acks=all while ZooKeeper was stopped")


def send_until_acknowledged(cluster, value):
    """Send one acks=all record to whichever broker leads, until acknowledged."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with Producer(cluster.data_dir(leader_of(cluster)), acks="all") as producer:
                return producer.send(TOPIC, value, partition=0).get(timeout=WAIT_S).offset
        except ShmlogError:
            assert time.monotonic() < deadline, "acks=all never acknowledged again"
            time.sleep(0.1)


def test_a_leader_cut_from_zookeeper_stops_acknowledging_acks_all(tmp_path):
    with ZooKeeperServer(str(tmp_path / "zk"), tick_time_ms=500) as server, \
            LocalCluster(str(tmp_path / "cluster"), 3, zookeeper_connect=server.connect_string,
                         settings=SETTINGS) as cluster:
        Admin(cluster.data_dir(1)).create_topic(TOPIC, 1, {"min.insync.replicas": "2"},
                                                replication_factor=3)
        cluster.wait_for(lambda: len(Admin(cluster.data_dir(1)).describe_topic(TOPIC)
                                     ["partitions"][0]["isr"]) == 3, WAIT_S, "the whole ISR")
        leader = leader_of(cluster)
        followers = [broker_id for broker_id in (1, 2, 3) if broker_id != leader]
        parked = []
        with Producer(cluster.data_dir(leader), acks="all") as strict, \
                Producer(cluster.data_dir(leader), acks=1) as eager:
            assert strict.send(TOPIC, b"first", partition=0).get(timeout=WAIT_S).offset == 0
            stopped_at = time.monotonic()
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                acknowledged = send_until_refused(cluster.data_dir(leader), parked)
                print(f"\nacks=all refused {time.monotonic() - stopped_at:.2f} s after "
                      f"ZooKeeper stopped (session timeout {SESSION_TIMEOUT_MS} ms), "
                      f"{acknowledged} acknowledged and {len(parked)} parked meanwhile")
                fenced_at = high_watermark(cluster, leader)
                appended = eager.send(TOPIC, b"while-fenced", partition=0) \
                    .get(timeout=WAIT_S).offset
                assert appended >= fenced_at, "acks=1 is still appended"
                cluster.wait_for(lambda: all(log_end(cluster, follower) == appended + 1
                                             for follower in followers),
                                 WAIT_S, "the followers fetching it")
                time.sleep(FETCH_ROUNDS_S)
                assert high_watermark(cluster, leader) == fenced_at <= appended, \
                    "the followers have it, but the fenced leader's HW does not move"
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
        for producer, future in parked:         # acknowledged, or refused if it lost the lead
            try:
                assert future.get(timeout=WAIT_S).offset < appended
            except NotLeaderOrFollowerError:
                pass
            producer.close()
        after = send_until_acknowledged(cluster, b"after")
        assert after > appended
        for broker_id in (1, 2, 3):
            cluster.wait_for(
                lambda broker_id=broker_id: high_watermark(cluster, broker_id) >= after + 1, WAIT_S,
                             f"broker {broker_id}'s HW covering what was appended")
