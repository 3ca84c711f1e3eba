"""What the fault tests share: a cluster fixture's settings, finding a partition's
leader, an acks=all producer that follows the leader through failovers, and the
final check of a partition's replicas with the history checker.

* :class:`LeaderFollowingProducer` is one thread sending unique values with an
  idempotent acks=all producer on the current leader's broker (a producer on another
  host is refused with NOT_LEADER_OR_FOLLOWER until forwarding exists). Every send is
  recorded in a :class:`History`: an acknowledgement at its offset, a broker's
  refusal as failed, and a send whose answer never came (its broker killed or
  stopped) as unknown. After any error it closes its producer, finds the leader
  again and goes on with a new producer there.
* :func:`check_replicas` waits (bounded) until every replica holds the same log
  end and high watermark, reads every replica's segment files
  (``history.read_replica``) and the leader's committed records, and asserts the
  history's five rules (:func:`replica_verdict` returns the verdict instead, for a
  test that reports several partitions' verdicts together).
"""

from __future__ import annotations

import os
import threading
import time

from cluster.history import History, Verdict, read_replica
from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    MetadataUnavailableError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    ShmlogError,
    TopicExistsError,
    ZooKeeperUnavailableError,
)
from shmlog.devtools.local_cluster import LocalCluster

# Sessions expire 3 s after a broker's last word; followers have 4 s to catch up
# before the ISR drops them (the machine is loaded: with 2 s, sessions of live brokers
# expired under a full suite's load, and shorter lags shrink ISRs the tests expect
# to stay whole).
SESSION_TIMEOUT_MS = 3000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS, "replica.lag.time.max.ms": 4000,
            "replica.fetch.wait.max.ms": 200, "replica.socket.timeout.ms": 1500}
# Every wait of these tests is bounded by this (a failover takes seconds).
WAIT_S = 60.0
# A look at a broker that may be paused or dead (finding a leader) waits 2 s; a request
# to one that must answer (the final checks) waits 10 s: a loaded 2-core machine can
# keep a busy broker's loop from answering for seconds.
LOOK_TIMEOUT_MS = 2_000
ADMIN_TIMEOUT_MS = 10_000
# How long a window of sends may wait for its answers before those missing count as
# unknown.
SEND_WAIT_S = 5.0
# How often a send's future is looked at, and its leader looked up while it waits.
ANSWER_POLL_S = 0.05
LEADER_LOOK_S = 0.5
# How long a ReplicaReader reads from one broker before it moves to the next.
READER_TURN_S = 1.0
# Sends in flight at once per producer.
WINDOW = 16
# A broker's own refusals: the batch is not in the log, or (after append) promises
# nothing; either way the send is recorded as failed.
REFUSALS = (NotLeaderOrFollowerError, NotEnoughReplicasError, NotEnoughReplicasAfterAppendError)


def start_cluster(directory: str, zookeeper, settings: dict | None = None,
                  brokers: int = 3, **options) -> LocalCluster:
    """A started cluster on the session's ZooKeeper (its own chroot); ``options``
    go to :class:`LocalCluster`."""
    return LocalCluster(directory, brokers, zookeeper_connect=zookeeper.connect_string,
                        settings={**SETTINGS, **(settings or {})}, **options).start()


def broker_output(cluster: LocalCluster, broker_id: int) -> str:
    """What a broker of a cluster started with ``log_files=True`` printed so far."""
    with open(cluster.log_file(broker_id), errors="replace") as output:
        return output.read()


def create_topic(cluster: LocalCluster, name: str, config: dict, replication_factor: int) -> None:
    """Create a one-partition topic through a running broker, again if the broker's
    ZooKeeper session failed under it (a loaded machine) or is not back yet after an
    outage (refused, nothing written): a write whose outcome is unknown may have
    created it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        broker_id = min(set(cluster.brokers) - cluster.paused)
        try:
            Admin(cluster.data_dir(broker_id)).create_topic(name, 1, config,
                                                            replication_factor=replication_factor)
            return
        except TopicExistsError:
            return
        except (ZooKeeperUnavailableError, MetadataUnavailableError):
            assert time.monotonic() < deadline, f"topic {name} not created in {WAIT_S} s"
            time.sleep(0.2)


def stop_cluster(cluster: LocalCluster) -> None:
    """Stop every broker, and remove the shared memory killed ones left."""
    try:
        cluster.stop()
    finally:
        for broker_id in range(1, cluster.count + 1):
            unlink_shared_memory(cluster.data_dir(broker_id))


def describe(cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0, *,
             timeout_ms: int = LOOK_TIMEOUT_MS) -> dict:
    """The partition as broker ``broker_id`` sees it (leader, epoch, isr, role); a
    short wait by default (a look that may go to a paused or dead broker)."""
    return Admin(cluster.data_dir(broker_id), timeout_ms=timeout_ms).describe_topic(
        topic)["partitions"][partition]


def leader_of(cluster: LocalCluster, topic: str, partition: int = 0,
              not_in: tuple = ()) -> tuple[int, int] | None:
    """(leader, epoch) as a running broker that agrees with the leader sees it: a
    running leader not in ``not_in``, or None. Paused brokers are not asked."""
    for broker_id in sorted(set(cluster.brokers) - cluster.paused):
        try:
            entry = describe(cluster, broker_id, topic, partition)
        except ShmlogError:
            continue
        leader = entry["leader"]
        if leader in cluster.brokers and leader not in cluster.paused and leader not in not_in:
            try:
                own = describe(cluster, leader, topic, partition)
            except ShmlogError:
                continue
            if own["role"] == "leader" and own["leader_epoch"] == entry["leader_epoch"]:
                return leader, entry["leader_epoch"]
    return None


def wait_for_leader(cluster: LocalCluster, topic: str, not_in: tuple = (),
                    partition: int = 0) -> tuple[int, int]:
    return cluster.wait_for(lambda: leader_of(cluster, topic, partition, not_in), WAIT_S,
                            f"a leader of {topic}-{partition} outside {not_in}",
                            interval_s=0.05)


def wait_in_sync(cluster: LocalCluster, topic: str, members: tuple, partition: int = 0) -> None:
    """Wait until every running broker sees the ISR as ``members``."""
    def whole():
        try:
            return all(sorted(describe(cluster, broker_id, topic, partition)["isr"])
                       == sorted(members) for broker_id in set(cluster.brokers) - cluster.paused)
        except ShmlogError:
            return False
    cluster.wait_for(whole, WAIT_S, f"isr {sorted(members)} of {topic}-{partition}",
                     interval_s=0.05)


class LeaderFollowingProducer(threading.Thread):
    """Unique values sent with acks=all to ``topic``'s partition 0 leader, through
    failovers (module docstring). ``acked`` counts acknowledgements;
    :meth:`first_ack_after` gives the time of the first one from a producer
    made after a moment (a failover's end)."""

    def __init__(self, cluster: LocalCluster, topic: str, history: History, tag: str,
                 partition: int = 0):
        super().__init__(name=f"producer-{tag}", daemon=True)
        self.cluster, self.topic, self.history, self.tag = cluster, topic, history, tag
        self.partition = partition
        self.stopping = threading.Event()
        self.acked = 0
        self.errors: list[str] = []
        self._sent = 0
        self._lock = threading.Lock()
        self._acks: list[tuple[float, float, int]] = []   # (producer made, acked at, leader)
        self._closing: list[threading.Thread] = []

    def stop(self) -> None:
        self.stopping.set()
        self.join(WAIT_S)
        assert not self.is_alive(), "the producer thread did not stop"
        for closing in self._closing:
            closing.join(WAIT_S)

    def first_ack_after(self, moment: float, not_leader: int | None = None) -> float | None:
        with self._lock:
            return min((acked for made, acked, leader in self._acks
                        if made > moment and leader != not_leader), default=None)

    def run(self) -> None:
        while not self.stopping.is_set():
            found = leader_of(self.cluster, self.topic, self.partition)
            if found is None:
                time.sleep(0.05)
                continue
            leader = found[0]
            try:
                producer = Producer(self.cluster.data_dir(leader), acks="all", linger_ms=1,
                                    max_block_ms=1000)
            except ShmlogError:          # its broker just died, or is starting
                time.sleep(0.05)
                continue
            made = time.monotonic()
            try:
                while not self.stopping.is_set() and self._window(producer, made, leader):
                    pass
            finally:
                self._abandon(producer)

    def _abandon(self, producer: Producer) -> None:
        """Close a producer on another thread: a dead broker's producer takes seconds
        to give up, and the next one must not wait for that."""
        closing = threading.Thread(target=_close_quietly, args=(producer,), daemon=True)
        closing.start()
        self._closing.append(closing)

    def _window(self, producer: Producer, made: float, leader: int) -> bool:
        """Send a window of values and wait for each; False after any error, or once
        ``leader`` no longer leads (the answers missing then are unknown)."""
        sent = []
        try:
            for _ in range(WINDOW):
                value = f"{self.tag}-{self._sent}".encode()
                self._sent += 1
                self.history.send(value, self.partition, acks="all")
                sent.append((value, producer.send(self.topic, value, partition=self.partition)))
        except ShmlogError as error:      # a full ring: its broker is gone
            self.errors.append(repr(error))
        deadline = time.monotonic() + SEND_WAIT_S
        for value, future in sent:
            try:
                offset = self._answer(future, deadline, leader)
            except REFUSALS as error:
                self.history.fail(value, error)
                return False
            except ShmlogError as error:  # no answer: this and the rest are unknown
                self.errors.append(repr(error))
                return False
            self.history.ack(value, offset)
            with self._lock:
                self.acked += 1
                self._acks.append((made, time.monotonic(), leader))
        return bool(sent)

    def _answer(self, future, deadline: float, leader: int) -> int:
        """The future's offset; ShmlogError when it gives up waiting."""
        looked = time.monotonic()
        while True:
            try:
                return future.get(timeout=ANSWER_POLL_S).offset
            except ShmlogError:
                if future.done():
                    raise                 # the broker's answer: an error
            now = time.monotonic()
            if now > deadline or leader not in self.cluster.brokers:
                raise ShmlogError(f"no answer from broker {leader}")
            if now - looked > LEADER_LOOK_S:
                looked = now
                found = leader_of(self.cluster, self.topic, self.partition)
                if found is not None and found[0] != leader:
                    raise ShmlogError(f"broker {leader} no longer leads")


def _close_quietly(producer: Producer) -> None:
    try:
        producer.close(timeout=0.5)
    except ShmlogError:
        pass                              # its broker is gone: nothing to flush to


class ReplicaReader(threading.Thread):
    """Reads ``topic``'s partition 0 from one running broker after another (each for
    ``READER_TURN_S``, leaders and followers alike, carrying on from the next
    offset), recording every record in the history: rule 4 then checks that no
    replica ever showed a record a failover took back."""

    def __init__(self, cluster: LocalCluster, topic: str, history: History, partition: int = 0):
        super().__init__(name=f"reader-{topic}", daemon=True)
        self.cluster, self.topic, self.history, self.partition = cluster, topic, history, partition
        self.stopping = threading.Event()
        self.position = 0
        self.turns = 0

    def stop(self) -> None:
        self.stopping.set()
        self.join(WAIT_S)
        assert not self.is_alive(), "the reader thread did not stop"

    def run(self) -> None:
        tp = TopicPartition(self.topic, self.partition)
        while not self.stopping.is_set():
            running = sorted(set(self.cluster.brokers) - self.cluster.paused)
            if not running:
                time.sleep(0.05)
                continue
            broker_id = running[self.turns % len(running)]
            self.turns += 1
            try:
                self._turn(broker_id, tp)
            except ShmlogError:              # its broker died or restarts: the next one
                time.sleep(0.05)

    def _turn(self, broker_id: int, tp: TopicPartition) -> None:
        ends = time.monotonic() + READER_TURN_S
        with Consumer(bootstrap=self.cluster.data_dir(broker_id)) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, self.position)
            while time.monotonic() < ends and not self.stopping.is_set():
                records = consumer.poll(timeout_ms=100).get(tp, [])
                if records:
                    self.history.read_many(self.partition, [(record.offset, record.value)
                                                            for record in records],
                                           reader=f"broker {broker_id}")
                    self.position = records[-1].offset + 1


def wait_acked(producer: LeaderFollowingProducer, count: int) -> None:
    """Wait until ``producer`` has ``count`` acknowledgements in all."""
    deadline = time.monotonic() + WAIT_S
    while producer.acked < count:
        assert producer.is_alive(), "the producer thread died"
        assert time.monotonic() < deadline, \
            f"{producer.acked} of {count} sends acknowledged after {WAIT_S} s: " \
            f"{producer.errors[-3:]}"
        time.sleep(0.02)


def replica_offsets(cluster: LocalCluster, broker_id: int, topic: str,
                    partition: int = 0) -> tuple[int, int]:
    """(log end offset, high watermark) of a running broker's replica."""
    tp = TopicPartition(topic, partition)
    admin = Admin(cluster.data_dir(broker_id), timeout_ms=ADMIN_TIMEOUT_MS)
    end = admin.list_offsets(topic)[partition]
    with Consumer(bootstrap=cluster.data_dir(broker_id)) as consumer:
        high_watermark = consumer.end_offsets([tp])[tp]
    return end["log_end_offset"], high_watermark


def read_committed(data_dir: str, topic: str, partition: int, end: int) -> list:
    """(offset, value) of every record below ``end`` in a broker's replica."""
    tp = TopicPartition(topic, partition)
    records = []
    deadline = time.monotonic() + WAIT_S
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        while not records or records[-1][0] < end - 1:
            assert time.monotonic() < deadline, f"{data_dir}: read up to {records[-1:]} of {end}"
            records += [(record.offset, record.value)
                        for record in consumer.poll(timeout_ms=200).get(tp, [])]
    return records


def check_replicas(cluster: LocalCluster, topic: str, history: History,
                   partition: int = 0) -> None:
    """Wait for the running replicas to agree (log end = high watermark, the same on
    each), then assert the history's rules over them and the leader's records."""
    verdict = replica_verdict(cluster, topic, history, partition)
    print(verdict)
    verdict.assert_ok()


def replica_verdict(cluster: LocalCluster, topic: str, history: History,
                    partition: int = 0) -> Verdict:
    """:func:`check_replicas`'s verdict, returned instead of asserted."""
    def settled():
        try:
            offsets = {replica_offsets(cluster, broker_id, topic, partition)
                       for broker_id in cluster.brokers}
        except ShmlogError:
            return None
        if len(offsets) == 1:
            end, high_watermark = next(iter(offsets))
            return end if end == high_watermark else None
        return None
    end = cluster.wait_for(settled, WAIT_S, f"the replicas of {topic}-{partition} to agree",
                           interval_s=0.1)
    leader, _ = wait_for_leader(cluster, topic, partition=partition)
    final = read_committed(cluster.data_dir(leader), topic, partition, end) if end else []
    directory = describe(cluster, leader, topic, partition,
                         timeout_ms=ADMIN_TIMEOUT_MS)["directory"]
    replicas = {}
    for broker_id in cluster.brokers:
        own = describe(cluster, broker_id, topic, partition,
                       timeout_ms=ADMIN_TIMEOUT_MS)["directory"]
        assert os.path.basename(own) == os.path.basename(directory)
        replicas[broker_id] = read_replica(own, end)
    return history.check({partition: final}, {partition: replicas})
