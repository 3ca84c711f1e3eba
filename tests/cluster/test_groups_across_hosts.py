"""Consumer groups across hosts: the coordinator of a group is the leader of its
``__consumer_offsets`` partition, members talk to their local broker (which forwards
to the coordinator), and commits are replicated with acks=all, so a coordinator
failover loses no acknowledged commit.

Method: a real ZooKeeper and three real brokers on 127.0.0.x (LocalCluster, the
offsets topic made with 3 partitions and 3 replicas). First, on a cluster shared by
the tests that leave it whole: a commit sent through a broker that does not
coordinate the group is answered only once it is in the coordinator's log, and
every replica of the offsets partition then holds it. Then, on a cluster of its
own: member processes on every host consume and commit a replicated topic that an
acks=all producer writes, and the coordinator's broker (with the member on its
host) is killed with SIGKILL. Every acknowledged record must be processed at least
once, each member's last acknowledged commit must be at or below what the new
coordinator returns, and the group must settle again (every partition assigned,
once) within a bound derived from the timeouts. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cluster.workload import SETTINGS, stop_cluster
from shmlog.broker.group_offsets import parse_offset_record
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import CoordinatorError, RequestTimedOutError, ShmlogError
from shmlog.devtools.local_cluster import LocalCluster
from shmlog.groups import OFFSETS_TOPIC, offsets_partition
from shmlog.protocol.control_client import request

OFFSETS_PARTITIONS = 3
# Broker settings: a small offsets topic, and a short initial rebalance delay (Kafka's
# 3 s would only lengthen every settle).
BROKER_SETTINGS = {"offsets_topic_num_partitions": OFFSETS_PARTITIONS,
                   "group_initial_rebalance_delay_ms": 300}
# A forward to a dead broker is given up after 3 s (members ask again), a producer's
# batch after 10 s (the failover takes a session timeout, 3 s).
CLUSTER_SETTINGS = {**SETTINGS, "forward.request.timeout.ms": 3000,
                    "forward.delivery.timeout.ms": 10_000}
WAIT_S = 60.0
MEMBER_SCRIPT = os.path.join(os.path.dirname(__file__), "group_member_process.py")
# The member processes' session timeout (group_member_process.SESSION_TIMEOUT_MS).
MEMBER_SESSION_TIMEOUT_MS = 6_000


def start(directory: str, zookeeper) -> LocalCluster:
    return LocalCluster(directory, 3, zookeeper_connect=zookeeper.connect_string,
                        settings=CLUSTER_SETTINGS, broker_settings=BROKER_SETTINGS,
                        log_files=True).start()


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = start(str(tmp_path_factory.mktemp("groups-across-hosts")), zookeeper)
    try:
        yield running
    finally:
        stop_cluster(running)


def ask(cluster: LocalCluster, broker_id: int, request_type: str, **fields) -> dict:
    """A group request through broker ``broker_id``, asked again while the
    coordinator is being found (the offsets topic made, a failover)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return request(cluster.data_dir(broker_id), request_type, timeout_ms=10_000,
                           **fields)
        except (CoordinatorError, RequestTimedOutError):
            assert time.monotonic() < deadline, f"{request_type} through broker {broker_id}"
            time.sleep(0.1)


def coordinator_of(cluster: LocalCluster, group_id: str, not_in: tuple = ()) -> int:
    """The leader of the group's offsets partition, once every running broker agrees."""
    partition = offsets_partition(group_id, OFFSETS_PARTITIONS)

    def agreed():
        try:
            leaders = {Admin(cluster.data_dir(broker_id)).describe_topic(OFFSETS_TOPIC)
                       ["partitions"][partition]["leader"] for broker_id in cluster.brokers}
        except ShmlogError:
            return None
        leader = leaders.pop() if len(leaders) == 1 else None
        return leader if leader in cluster.brokers and leader not in not_in else None
    return cluster.wait_for(agreed, WAIT_S, f"the coordinator of {group_id}", interval_s=0.1)


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    Admin(cluster.data_dir(1)).create_topic(name, partitions, {"min.insync.replicas": "2"},
                                            replication_factor=3)

    def hosted():
        try:
            return all(entry["leader"] in cluster.brokers for broker_id in cluster.brokers
                       for entry in Admin(cluster.data_dir(broker_id)).describe_topic(name)
                       ["partitions"])
        except ShmlogError:
            return False
    cluster.wait_for(hosted, WAIT_S, f"every broker to host {name}", interval_s=0.1)


def offset_records(data_dir: str, partition: int) -> list:
    """The commits in a broker's replica of an offsets partition, below its HW."""
    tp = TopicPartition(OFFSETS_TOPIC, partition)
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        records, deadline = [], time.monotonic() + WAIT_S
        while (records[-1].offset + 1 if records else 0) < end:
            assert time.monotonic() < deadline, f"{data_dir}: {OFFSETS_TOPIC}-{partition}"
            records += consumer.poll(timeout_ms=200).get(tp, [])
    return [parse_offset_record(record.key, record.value) for record in records]


def test_a_commit_through_another_broker_lands_on_every_replica(cluster):
    topic, group_id = "groups-commit-through", "through-a-follower"
    create_topic(cluster, topic, 2)
    with Producer(cluster.data_dir(1), acks="all") as producer:
        for n in range(10):
            producer.send(topic, b"%d" % n, partition=n % 2).get(timeout=WAIT_S)
    # The first group request makes the offsets topic (asked again until it leads).
    ask(cluster, 1, "fetch_offsets", group_id=group_id)
    coordinator = coordinator_of(cluster, group_id)
    through, other = sorted(set(cluster.brokers) - {coordinator})
    ask(cluster, through, "commit_offsets", group_id=group_id,
        offsets=[[topic, 0, 5, "five"], [topic, 1, 4, ""]])
    # Answered: the high watermark covers the commit, so every replica holds it.
    partition = offsets_partition(group_id, OFFSETS_PARTITIONS)
    for broker_id in cluster.brokers:
        def landed(broker_id=broker_id):
            commits = {(entry[1], entry[2]): entry[3].offset
                       for entry in offset_records(cluster.data_dir(broker_id), partition)
                       if entry is not None and entry[0] == group_id}
            return commits == {(topic, 0): 5, (topic, 1): 4}
        cluster.wait_for(landed, WAIT_S, f"the commit in broker {broker_id}'s replica",
                         interval_s=0.2)
    fetched = ask(cluster, other, "fetch_offsets", group_id=group_id)["offsets"]
    assert fetched == [[topic, 0, 5, "five"], [topic, 1, 4, ""]]


def test_list_groups_through_any_broker_lists_the_whole_clusters_groups(cluster):
    """Each coordinator knows its own groups; the broker a client asks gathers them
    all (Kafka's admin client asks every broker)."""
    topic = "groups-listed"
    create_topic(cluster, topic, 1)
    names = {}
    for n in range(100):
        names.setdefault(offsets_partition(f"listed-{n}", OFFSETS_PARTITIONS), f"listed-{n}")
    assert len(names) == OFFSETS_PARTITIONS
    for group_id in names.values():
        ask(cluster, 1, "commit_offsets", group_id=group_id, offsets=[[topic, 0, 0, ""]])
    for broker_id in cluster.brokers:
        listed = ask(cluster, broker_id, "list_groups")
        assert set(names.values()) <= {group["group_id"] for group in listed["groups"]}, \
            f"broker {broker_id} lists every coordinator's groups"
        assert listed["unreachable_brokers"] == []


# --- the coordinator killed under a consuming group --------------------------------------

class AckedProducer(threading.Thread):
    """Sends to every partition with acks=all through one broker, recording the
    (partition, offset) of every acknowledged record; refusals are retried by
    sending the next record."""

    def __init__(self, data_dir: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        self.data_dir, self.topic, self.partitions = data_dir, topic, partitions
        self._acked: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    @property
    def acked(self) -> set[tuple[int, int]]:
        with self._lock:
            return set(self._acked)

    def run(self) -> None:
        with Producer(self.data_dir, acks="all", linger_ms=1) as producer:
            n = 0
            while not self.stopping.is_set():
                futures = [producer.send(self.topic, b"%d" % (n + k), partition=(n + k)
                                         % self.partitions) for k in range(20)]
                n += 20
                for future in futures:
                    try:
                        metadata = future.get(timeout=WAIT_S)
                    except ShmlogError:
                        continue                   # refused, or its outcome unknown
                    with self._lock:
                        self._acked.add((metadata.partition, metadata.offset))
                time.sleep(0.02)


def read_member_log(path: str) -> dict:
    processed, commits, assignment = set(), {}, None
    with open(path) as lines:
        for line in lines:
            if not line.endswith("\n"):
                break                          # a line a kill cut short
            kind, *rest = line.split()
            if kind == "P":
                processed.add((int(rest[0]), int(rest[1])))
            elif kind == "C":
                commits[int(rest[0])] = int(rest[1])
            elif kind == "A":
                assignment = [int(p) for p in rest[0].split(",")] if rest else []
    return {"processed": processed, "commits": commits, "assignment": assignment}


def settled(cluster: LocalCluster, broker_id: int, group_id: str, members: int,
            partitions: int) -> bool:
    """Is the group stable with ``members`` members holding every partition once?"""
    try:
        described = request(cluster.data_dir(broker_id), "describe_group", group_id=group_id,
                            timeout_ms=5_000)
    except ShmlogError:
        return False
    held = [tuple(entry) for member in described["members"] for entry in member["assignment"]]
    return described["state"] == "Stable" and len(described["members"]) == members and \
        len(held) == len(set(held)) == partitions


def start_member(cluster, broker_id, group_id, topic, directory, name):
    log_path = os.path.join(directory, f"{name}.log")
    process = subprocess.Popen(
        [sys.executable, MEMBER_SCRIPT, cluster.data_dir(broker_id), group_id, topic, log_path,
         os.path.join(directory, "stop")], env=dict(os.environ))
    return process, log_path


def test_killing_the_coordinator_loses_no_acknowledged_commit(zookeeper, tmp_path):
    topic, group_id, partitions = "groups-failover", "failover-group", 6
    cluster = start(str(tmp_path / "cluster"), zookeeper)
    members, producer = [], None
    try:
        create_topic(cluster, topic, partitions)
        ask(cluster, 1, "fetch_offsets", group_id=group_id)     # make the offsets topic
        coordinator = coordinator_of(cluster, group_id)
        survivors = sorted(set(cluster.brokers) - {coordinator})
        producer = AckedProducer(cluster.data_dir(survivors[0]), topic, partitions)
        producer.start()
        for index, broker_id in enumerate([coordinator] + survivors * 2):
            members.append((broker_id, *start_member(cluster, broker_id, group_id, topic,
                                                     str(tmp_path), f"member-{index}")))
        cluster.wait_for(lambda: settled(cluster, survivors[0], group_id, len(members),
                                         partitions), WAIT_S, "the group to settle")
        cluster.wait_for(lambda: sum(bool(read_member_log(log)["commits"])
                                     for _, _, log in members) >= 3, WAIT_S,
                         "members to commit")
        # The coordinator's host dies: its broker and its member.
        cluster.kill(coordinator)
        members[0][1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        new_coordinator = coordinator_of(cluster, group_id, not_in=(coordinator,))
        bound_s = (SETTINGS["zookeeper.session.timeout.ms"]
                   + 3 * MEMBER_SESSION_TIMEOUT_MS) / 1000 + 10
        cluster.wait_for(lambda: settled(cluster, survivors[1], group_id, len(members) - 1,
                                         partitions),
                         bound_s - (time.monotonic() - killed),
                         f"the group to settle within {bound_s} s of the kill")
        time.sleep(1.0)                              # consume and commit after it
        producer.stopping.set()
        producer.join(timeout=WAIT_S)
        acked = producer.acked

        def all_processed():
            seen = set().union(*(read_member_log(log)["processed"] for _, _, log in members))
            return acked <= seen
        cluster.wait_for(all_processed, WAIT_S, "every acknowledged record processed",
                         interval_s=0.2)
        open(os.path.join(str(tmp_path), "stop"), "w").close()
        for _, process, _ in members[1:]:
            process.wait(timeout=WAIT_S)
        committed = {entry[1]: entry[2] for entry in ask(
            cluster, survivors[0], "fetch_offsets", group_id=group_id)["offsets"]}
        for broker_id, _, log in members:
            for partition, offset in read_member_log(log)["commits"].items():
                assert offset <= committed.get(partition, -1), \
                    f"a commit acknowledged to a member on broker {broker_id} " \
                    f"({topic}-{partition} at {offset}) was lost: the new coordinator " \
                    f"(broker {new_coordinator}) has {committed.get(partition)}"
        assert len(acked) > 0
    finally:
        if producer is not None:
            producer.stopping.set()
        for _, process, _ in members:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=WAIT_S)
        stop_cluster(cluster)
