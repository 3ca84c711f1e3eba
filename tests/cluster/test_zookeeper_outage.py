"""A ZooKeeper outage stops only what needs ZooKeeper (issue 27, row 6).

Goal: with ZooKeeper killed -9 for longer than the session timeout under an acks=all
producer with a whole ISR, the leader goes on acknowledging acks=all (its ISR needs
no change), followers go on fetching (a consumer on a follower's host sees new
records), ``create_topic`` is refused at once with ``MetadataUnavailableError`` and
the topic never appears; once ZooKeeper is back, nothing acknowledged is lost (the
history checker over every replica) and the cluster serves again: acks=all and
topic creation. And a topic write that ZooKeeper takes but does not answer (it is
stopped before the session notices) is answered "outcome unknown" within the
admin's timeout, not "no broker answered".

Method: a ZooKeeper of the test's own (it is killed with SIGKILL and started again on
its data directory and port: ZooKeeper restores the sessions, so the brokers keep
theirs), three real brokers (``workload.SETTINGS``: session timeout 3 s), one
partition on all three with min.insync.replicas 2. ``workload.LeaderFollowingProducer``
sends acks=all and records every send in the ``History``; ``workload.ReplicaReader``
reads from each broker in turn, and the test reads from a follower itself during the
outage, both recorded too. Every wait is bounded; the figures are printed.
"""

from __future__ import annotations

import os
import signal
import time

from cluster.history import History
from cluster.workload import (
    SESSION_TIMEOUT_MS,
    SETTINGS,
    WAIT_S,
    LeaderFollowingProducer,
    ReplicaReader,
    broker_output,
    check_replicas,
    create_topic,
    stop_cluster,
    wait_acked,
    wait_for_leader,
    wait_in_sync,
)
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.common.errors import (
    BrokerNotAvailableError,
    MetadataUnavailableError,
    TopicExistsError,
    ZooKeeperConnectionError,
)
from shmlog.devtools.local_cluster import LocalCluster
from shmlog.devtools.zookeeper import ZooKeeperServer

TOPIC = "outage"
REFUSED_TOPIC = "created-during-outage"
AFTER_TOPIC = "created-after-outage"
TICK_MS = 500                       # lets ZooKeeper grant the 3 s session timeout
ACKS_BEFORE = 50
# Acknowledgements the producer must get while ZooKeeper is down: some soon after the
# kill, and more once the outage is longer than a session timeout.
ACKS_EARLY = 20
ACKS_LATE = 20
ACKS_AFTER = 50
# The outage lasts at least the session timeout and this much more.
PAST_SESSION_S = 2.0
# The admin's request timeout: a request the broker held until it ran out would end
# in BrokerNotAvailableError, not the typed refusal.
ADMIN_TIMEOUT_MS = 10_000


def kill_zookeeper(server: ZooKeeperServer) -> None:
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=WAIT_S)


def wait_acks_while_down(producer: LeaderFollowingProducer, server: ZooKeeperServer,
                         count: int) -> int:
    """Wait until ``producer`` has ``count`` acknowledgements in all, ZooKeeper
    staying dead meanwhile; the count reached."""
    deadline = time.monotonic() + WAIT_S
    while producer.acked < count:
        assert server.process.poll() is not None, "ZooKeeper must stay down"
        assert producer.is_alive(), "the producer thread died"
        assert time.monotonic() < deadline, \
            f"acks=all stopped while ZooKeeper is down: {producer.acked} of {count} " \
            f"acknowledged after {WAIT_S} s; last errors {producer.errors[-3:]}"
        time.sleep(0.02)
    return producer.acked


def read_from_follower(cluster: LocalCluster, follower: int, history: History,
                       beyond: int) -> int:
    """Read the partition from ``follower``'s host until a record at or past
    ``beyond`` is seen (recorded in the history); the highest offset read."""
    tp = TopicPartition(TOPIC, 0)
    highest = -1
    deadline = time.monotonic() + WAIT_S
    with Consumer(bootstrap=cluster.data_dir(follower)) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, beyond)
        while highest < beyond:
            assert time.monotonic() < deadline, \
                f"a consumer on follower {follower} saw nothing at or past {beyond} in {WAIT_S} s"
            records = consumer.poll(timeout_ms=100).get(tp, [])
            if records:
                history.read_many(0, [(record.offset, record.value) for record in records],
                                  reader=f"follower {follower} during the outage")
                highest = records[-1].offset
    return highest


def follower_high_watermark(cluster: LocalCluster, follower: int) -> int:
    tp = TopicPartition(TOPIC, 0)
    with Consumer(bootstrap=cluster.data_dir(follower)) as consumer:
        return consumer.end_offsets([tp])[tp]


def test_a_zookeeper_outage_stops_only_what_needs_zookeeper(tmp_path):
    server = ZooKeeperServer(str(tmp_path / "zk"), tick_time_ms=TICK_MS).start()
    cluster = LocalCluster(str(tmp_path / "cluster"), 3, zookeeper_connect=server.connect_string,
                           settings=SETTINGS, log_files=True)
    history = History()
    try:
        cluster.start()
        create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        leader, epoch = wait_for_leader(cluster, TOPIC)
        follower = min(broker_id for broker_id in (1, 2, 3) if broker_id != leader)
        producer = LeaderFollowingProducer(cluster, TOPIC, history, "outage")
        reader = ReplicaReader(cluster, TOPIC, history)
        producer.start()
        reader.start()
        try:
            wait_acked(producer, ACKS_BEFORE)
            kill_zookeeper(server)
            killed_at = time.monotonic()
            acked_at_kill = producer.acked
            seen_at_kill = follower_high_watermark(cluster, follower)

            early = wait_acks_while_down(producer, server, acked_at_kill + ACKS_EARLY)
            asked_at = time.monotonic()
            try:
                Admin(cluster.data_dir(leader), timeout_ms=ADMIN_TIMEOUT_MS).create_topic(
                    REFUSED_TOPIC, 1, replication_factor=3)
                raise AssertionError("create_topic succeeded with ZooKeeper down")
            except MetadataUnavailableError as error:
                refused_in = time.monotonic() - asked_at
                print(f"\ncreate_topic refused in {refused_in:.3f} s: {error}")
            read = read_from_follower(cluster, follower, history, seen_at_kill)
            time.sleep(max(0.0, killed_at + SESSION_TIMEOUT_MS / 1000 + PAST_SESSION_S
                           - time.monotonic()))
            late_from = producer.acked
            late = wait_acks_while_down(producer, server, late_from + ACKS_LATE)
            read_late = read_from_follower(cluster, follower, history, read + 1)
            outage_s = time.monotonic() - killed_at
            print(f"ZooKeeper down {outage_s:.1f} s (session timeout {SESSION_TIMEOUT_MS} ms): "
                  f"acks=all acknowledged {early - acked_at_kill} soon after the kill and "
                  f"{producer.acked - acked_at_kill} in all while down ({late_from} -> {late} "
                  f"past the session timeout); follower {follower} read up to offset "
                  f"{read_late} from {seen_at_kill}")
            assert wait_for_leader(cluster, TOPIC) == (leader, epoch), \
                "no election happened: the leader kept its epoch through the outage"

            server = ZooKeeperServer(server.data_dir, port=server.port,
                                     tick_time_ms=TICK_MS).start()
            wait_acked(producer, producer.acked + ACKS_AFTER)
            create_topic(cluster, AFTER_TOPIC, {}, 3)
            wait_in_sync(cluster, AFTER_TOPIC, (1, 2, 3))
            for broker_id in (1, 2, 3):
                topics = Admin(cluster.data_dir(broker_id),
                               timeout_ms=ADMIN_TIMEOUT_MS).list_topics()
                assert AFTER_TOPIC in topics and REFUSED_TOPIC not in topics, \
                    f"broker {broker_id} lists {topics}: the refused create took effect"
            try:
                Admin(cluster.data_dir(leader), timeout_ms=ADMIN_TIMEOUT_MS).create_topic(
                    REFUSED_TOPIC, 1, replication_factor=3)
            except TopicExistsError:
                raise AssertionError("the topic refused during the outage exists") from None
        finally:
            producer.stop()
            reader.stop()
        wait_in_sync(cluster, TOPIC, (1, 2, 3))
        check_replicas(cluster, TOPIC, history)
    finally:
        try:
            stop_cluster(cluster)
        finally:
            server.stop()


# A session long enough that kazoo notices nothing for longer than a topic write
# waits (it reports SUSPENDED after 2/3 of it: 6.7 s > limits.CLUSTER_TOPIC_WRITE_WAIT_MS).
LONG_SESSION_MS = 10_000


def test_a_topic_write_zookeeper_does_not_answer_is_answered_outcome_unknown(tmp_path):
    """ZooKeeper stopped (SIGSTOP: the connection stays up, so the session is not
    yet suspended and the write is sent): the request is answered within the admin's
    timeout with ZooKeeperConnectionError saying the outcome is unknown, not "no
    broker answered"; after SIGCONT the broker serves metadata requests again."""
    server = ZooKeeperServer(str(tmp_path / "zk"), tick_time_ms=TICK_MS).start()
    cluster = LocalCluster(str(tmp_path / "cluster"), 1, zookeeper_connect=server.connect_string,
                           settings={**SETTINGS, "zookeeper.session.timeout.ms": LONG_SESSION_MS},
                           log_files=True)
    try:
        cluster.start()
        admin = Admin(cluster.data_dir(1), timeout_ms=ADMIN_TIMEOUT_MS)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            asked_at = time.monotonic()
            try:
                admin.create_topic(REFUSED_TOPIC, 1, replication_factor=1)
                raise AssertionError("create_topic succeeded with ZooKeeper stopped")
            except ZooKeeperConnectionError as error:
                print(f"\nanswered in {time.monotonic() - asked_at:.1f} s: {error}")
                assert "outcome is unknown" in str(error)
            except BrokerNotAvailableError:
                # Unanswered: what the broker's threads were doing goes with the failure.
                cluster.brokers[1].process.send_signal(signal.SIGQUIT)
                time.sleep(1)
                raise AssertionError("the broker did not answer; its threads:\n" +
                                     broker_output(cluster, 1)[-20_000:]) from None
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        create_topic(cluster, AFTER_TOPIC, {}, 1)
        assert AFTER_TOPIC in admin.list_topics()
    finally:
        try:
            stop_cluster(cluster)
        finally:
            server.stop()
