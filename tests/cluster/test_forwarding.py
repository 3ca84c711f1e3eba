"""Producers on a host whose broker does not lead their partition: the local broker
forwards each batch to the leader over ZeroMQ and completes the ring entry with the
leader's answer (acks honoured end to end; the client API unchanged).

Method: a real ZooKeeper and three real brokers on 127.0.0.x (LocalCluster). A
producer on a follower's host sends with acks=1, acks="all" and acks=0; the offsets
it is told must be where the leader's log holds the values, and every broker's
replica must read them back. Then the faults, on the same cluster: the leader killed
with SIGKILL under an idempotent acks=all producer on a follower (nothing
acknowledged is lost, nothing is stored twice), and a partition left without a
leader (its entries complete with REQUEST_TIMED_OUT once the forwarding bound,
``forward.delivery.timeout.ms``, passes). Every wait is bounded.
"""

from __future__ import annotations

import threading
import time

import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import RequestTimedOutError, ShmlogError
from shmlog.devtools.local_cluster import LocalCluster

# The forwarding bound is longer than a failover (a session timeout plus the
# election), short enough that waiting it out for a leaderless partition is cheap.
SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 4000,
            "replica.fetch.wait.max.ms": 200, "replica.socket.timeout.ms": 1500,
            "forward.delivery.timeout.ms": 8000, "forward.request.timeout.ms": 2000}
WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("forwarding")), 3,
                      zookeeper_connect=zookeeper.connect_string, settings=SETTINGS) as running:
        yield running


def leader_and_follower(cluster, topic, partition=0):
    """The partition's leader as broker 1 sees it, and one of its followers, once
    every broker knows that leader."""
    def agreed():
        leaders = {Admin(cluster.data_dir(broker_id)).describe_topic(topic)
                   ["partitions"][partition]["leader"] for broker_id in cluster.brokers}
        return leaders.pop() if len(leaders) == 1 and -1 not in leaders else None
    leader = cluster.wait_for(agreed, WAIT_S, f"every broker to know {topic}'s leader")
    return leader, next(broker_id for broker_id in sorted(cluster.brokers) if broker_id != leader)


def read_all(data_dir, topic, partition, count):
    """(offset, value) of the local replica's first ``count`` records, waiting for them."""
    tp = TopicPartition(topic, partition)
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        records = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < count and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=1000).get(tp, []))
        return [(record.offset, record.value) for record in records]


@pytest.mark.parametrize("acks", [1, "all"])
def test_a_producer_on_a_follower_gets_the_leaders_offsets(cluster, acks):
    topic = f"forwarded-{acks}"
    Admin(cluster.data_dir(1)).create_topic(topic, 1, {"min.insync.replicas": "2"},
                                            replication_factor=3)
    leader, follower = leader_and_follower(cluster, topic)
    values = [b"%s-%d" % (topic.encode(), n) for n in range(200)]
    with Producer(cluster.data_dir(follower), acks=acks, linger_ms=1) as producer:
        futures = [producer.send(topic, value, partition=0) for value in values]
        offsets = [future.get(timeout=WAIT_S).offset for future in futures]
    assert offsets == list(range(200)), "dense offsets, in send order"
    for broker_id in (leader, *sorted(set(cluster.brokers) - {leader})):
        assert read_all(cluster.data_dir(broker_id), topic, 0, 200) == \
            list(zip(offsets, values)), f"broker {broker_id} holds each value at its offset"


def test_an_acks_0_producers_batches_are_forwarded_too(cluster):
    Admin(cluster.data_dir(1)).create_topic("forwarded-0", 1, replication_factor=3)
    leader, follower = leader_and_follower(cluster, "forwarded-0")
    values = [b"fire-and-forget-%d" % n for n in range(50)]
    with Producer(cluster.data_dir(follower), acks=0) as producer:
        for value in values:
            producer.send("forwarded-0", value, partition=0)
        producer.flush()
    assert [value for _, value in read_all(cluster.data_dir(leader), "forwarded-0", 0, 50)] \
        == values


def test_entries_for_a_partition_without_a_leader_time_out_after_the_bound(cluster):
    """It stops a broker, and starts it again after."""
    live = sorted(cluster.brokers)
    created = Admin(cluster.data_dir(live[0])).create_topic("orphan", len(live),
                                                            replication_factor=1)
    leader = created["partitions"][0]["leader"]
    other = next(broker_id for broker_id in live if broker_id != leader)
    cluster.wait_for(lambda: Admin(cluster.data_dir(other)).describe_topic("orphan")
                     ["partitions"][0]["leader"] == leader, WAIT_S, "the partition's leader")
    cluster.stop_broker(leader)
    cluster.wait_for(lambda: Admin(cluster.data_dir(other)).describe_topic("orphan")
                     ["partitions"][0]["leader"] == -1, WAIT_S, "the partition to go offline")
    with Producer(cluster.data_dir(other), acks=1) as producer:
        started = time.monotonic()
        future = producer.send("orphan", b"nowhere", partition=0)
        with pytest.raises(RequestTimedOutError):
            future.get(timeout=WAIT_S)
        print(f"timed out after {time.monotonic() - started:.1f} s "
              f"(forward.delivery.timeout.ms {SETTINGS['forward.delivery.timeout.ms']})")
    cluster.start_broker(leader)


@pytest.mark.parametrize("next_leader", ["elsewhere", "here"])
def test_forwarded_batches_survive_the_leader_killed_neither_lost_nor_doubled(
        cluster, next_leader):
    """The module's last tests: each kills a leader. The producer's broker is the
    follower elected next ("here": what it holds queued is appended locally) or the
    other one (the same bytes go to the new leader, which dedupes them)."""
    topic = f"survive-{next_leader}"
    # Each run kills a broker: the second runs on the two left (min.insync then 1).
    live = sorted(cluster.brokers)
    created = Admin(cluster.data_dir(live[0])).create_topic(
        topic, 1, {"min.insync.replicas": str(len(live) - 1)}, replication_factor=len(live))
    leader, _ = leader_and_follower(cluster, topic)
    # The controller elects the first live in-sync replica in assignment order.
    followers = [broker_id for broker_id in created["partitions"][0]["replicas"]
                 if broker_id != leader]
    follower = followers[0] if next_leader == "here" else followers[-1]
    acked, failed, stop = {}, [], threading.Event()

    def produce():
        with Producer(cluster.data_dir(follower), acks="all", linger_ms=1) as producer:
            n = 0
            while not stop.is_set() or n < 400:
                value = b"survive-%d" % n
                try:
                    acked[value] = producer.send(topic, value, partition=0) \
                        .get(timeout=WAIT_S).offset
                except ShmlogError as error:
                    failed.append((value, error))
                n += 1
    sender = threading.Thread(target=produce)
    sender.start()
    cluster.wait_for(lambda: len(acked) >= 100, WAIT_S, "100 acknowledged sends")
    cluster.kill(leader)
    stop.set()
    sender.join(timeout=3 * WAIT_S)
    assert not sender.is_alive()
    print(f"acked {len(acked)}, failed {len(failed)}: {failed[:3]}")
    assert len(acked) >= 300, "the forwarder re-sent to the new leader"
    survivors = sorted(cluster.brokers)
    count = max(acked.values()) + 1
    for broker_id in survivors:
        records = read_all(cluster.data_dir(broker_id), topic, 0, count)
        values = [value for _, value in records]
        assert len(values) == len(set(values)), f"broker {broker_id}: a value stored twice"
        held = dict((value, offset) for offset, value in records)
        lost = {value for value, offset in acked.items() if held.get(value) != offset}
        assert not lost, f"broker {broker_id} lost acknowledged values {sorted(lost)[:5]}"
