"""A restarted replica shows its readers only what was committed (Kafka's
replication-offset-checkpoint, KIP-101's rule that the checkpoint is never used to
truncate).

Goal: a follower holding records above the committed high watermark, restarted,
publishes its checkpointed high watermark, not its log end, until its leader's
high watermark covers more; records the new leader never had are truncated away
without a reader ever seeing them; the checkpoint survives restarts and is written
at a clean stop.

Method: three real brokers, one partition replicated on all. Broker G is stopped
(SIGSTOP, within its session timeout, so it stays in the ISR and holds the leader's
HW back) while the leader L appends acks=1 records that follower F fetches; L and F
are killed, G resumes and is elected with ISR {G}; G appends records of its own and
is killed, so the partition has no leader. F is restarted: its readers see the
committed prefix only, although its log holds the uncommitted records. G restarts
and leads again: F truncates the records G never had and follows G.
"""

from __future__ import annotations

import json
import os
import signal

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.cluster.replication.high_watermark_checkpoint import CHECKPOINT_FILE
from shmlog.devtools.local_cluster import LocalCluster

# A session timeout long enough for G's stop (a few hundred ms of work) to end well
# before ZooKeeper expires it; a lag time past it, so the leader keeps G in the ISR.
SETTINGS = {"zookeeper.session.timeout.ms": 4000, "replica.lag.time.max.ms": 20000,
            "replica.fetch.wait.max.ms": 200, "replica.socket.timeout.ms": 1500,
            "replica.high.watermark.checkpoint.interval.ms": 200}
WAIT_S = 60
TOPIC = "checkpointed"
TP = TopicPartition(TOPIC, 0)


def state_seen_by(cluster, broker_id):
    return Admin(cluster.data_dir(broker_id)).describe_topic(TOPIC)["partitions"][0]


def checkpoint_of(cluster, broker_id):
    try:
        with open(os.path.join(cluster.data_dir(broker_id), CHECKPOINT_FILE)) as source:
            return json.load(source).get(f"{TOPIC}/0")
    except (FileNotFoundError, ValueError):
        return None


def high_watermark(cluster, broker_id):
    with Consumer(bootstrap=cluster.data_dir(broker_id)) as consumer:
        return consumer.end_offsets([TP])[TP]


def log_end(cluster, broker_id):
    return Admin(cluster.data_dir(broker_id)).list_offsets(TOPIC)[0]["log_end_offset"]


def values_read(cluster, broker_id, count):
    with Consumer(bootstrap=cluster.data_dir(broker_id), auto_offset_reset="earliest") \
            as consumer:
        consumer.assign([TP])
        values = []
        while len(values) < count:
            batch = consumer.poll(timeout_ms=WAIT_S * 1000).get(TP, [])
            assert batch, f"broker {broker_id}: nothing past offset {len(values)}"
            values.extend(record.value for record in batch)
        return values


def produce(cluster, broker_id, values, acks, producer_ids):
    """Send ``values``; their offsets. The producer's id goes to ``producer_ids``."""
    with Producer(cluster.data_dir(broker_id), acks=acks) as producer:
        producer_ids.append(producer.producer_id)
        futures = [producer.send(TOPIC, value, partition=0) for value in values]
        return [future.get(timeout=WAIT_S).offset for future in futures]


def test_a_restarted_follower_shows_only_what_was_committed(zookeeper, tmp_path):
    with LocalCluster(str(tmp_path), 3, zookeeper_connect=zookeeper.connect_string,
                      settings=SETTINGS) as cluster:
        Admin(cluster.data_dir(1)).create_topic(TOPIC, 1, replication_factor=3)
        cluster.wait_for(lambda: len(state_seen_by(cluster, 1)["isr"]) == 3, WAIT_S,
                         "the whole ISR")
        leader = state_seen_by(cluster, 1)["leader"]
        follower, stopped = [broker_id for broker_id in (1, 2, 3) if broker_id != leader]
        producer_ids = []      # cluster-wide: else G takes its producer's first batch
        committed = [b"committed-%d" % n for n in range(20)]   # for a duplicate of this one
        assert produce(cluster, leader, committed, "all", producer_ids) == list(range(20))
        cluster.wait_for(lambda: checkpoint_of(cluster, follower) == 20, WAIT_S,
                         "the follower's checkpoint at the committed HW")

        # G stops in the ISR: L's HW stays at 20 while F fetches 10 more.
        cluster.brokers[stopped].process.send_signal(signal.SIGSTOP)
        try:
            produce(cluster, leader, [b"uncommitted-%d" % n for n in range(10)], 1,
                    producer_ids)
            cluster.wait_for(lambda: log_end(cluster, follower) == 30, WAIT_S,
                             "the follower fetching the uncommitted records")
            assert high_watermark(cluster, follower) == 20
            cluster.kill(leader)
            cluster.kill(follower)
        finally:
            cluster.brokers[stopped].process.send_signal(signal.SIGCONT)

        # G leads with ISR {G}, appends, and dies: the partition has no leader.
        cluster.wait_for(lambda: state_seen_by(cluster, stopped)["leader"] == stopped
                         and state_seen_by(cluster, stopped)["isr"] == [stopped],
                         WAIT_S, "the stopped follower elected")
        # G may have taken the uncommitted records too: the leader answered a fetch G had
        # waiting when it was stopped, and the answer lay in G's socket until SIGCONT.
        start = log_end(cluster, stopped)
        assert start in (20, 30)
        uncommitted_kept = [b"uncommitted-%d" % n for n in range(10)] if start == 30 else []
        new = [b"new-leader-%d" % n for n in range(5)]
        assert produce(cluster, stopped, new, "all", producer_ids) == list(range(start, start + 5))
        assert len(set(producer_ids)) == 3 and min(producer_ids) >= 0
        cluster.kill(stopped)

        cluster.start_broker(follower)
        assert log_end(cluster, follower) == 30, "the uncommitted records are in its log"
        assert high_watermark(cluster, follower) == 20, "but its readers see the committed"
        assert values_read(cluster, follower, 20) == committed

        cluster.start_broker(stopped)
        end = start + 5
        cluster.wait_for(lambda: high_watermark(cluster, follower) == end, WAIT_S,
                         "the follower truncated and caught up with the new leader")
        assert values_read(cluster, follower, end) == committed + uncommitted_kept + new
        cluster.wait_for(lambda: checkpoint_of(cluster, follower) == end, WAIT_S,
                         "the periodic checkpoint")
        cluster.stop_broker(follower)
        assert checkpoint_of(cluster, follower) == end, "written at the clean stop"
