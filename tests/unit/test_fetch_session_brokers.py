"""A fetch session between a leader's and a follower's replication parts in one
process: the follower's quiet fetches (shmlog.cluster.replication.fetcher) and the
leader's session serving and ISR bookkeeping (fetch_serving, partition, rules).

Goal: a partition the follower starts to follow (or observe) from a leader while
its quiet session fetch to that leader is in flight is named by its next fetch, so
the leader records its fetch position at once; the leader's ISR then keeps the
caught-up follower (a fetch that left it out until the session's rescan left the
leader with no position for it, and the ISR shrank after replica.lag.time.max.ms:
the observer test's flake in tests/cluster/test_replication.py). An observed
partition in the same session is kept apart from the followed one.
Method: two brokers' real partition hosts (logs on disk, appender state in
/dev/shm), hosted replicas, fetch serving and fetcher; the partition states set in
a ClusterView as ZooKeeper's watches would; the replication transport replaced by
an in-process queue that delivers requests and replies in order through the real
codec; the time passed in.
"""

from __future__ import annotations

import collections
import itertools
import uuid

import pytest

from shmlog.broker.partition_host import PartitionHost
from shmlog.cluster.replication.codec import decode, encode
from shmlog.cluster.replication.fetch_serving import FetchServing
from shmlog.cluster.replication.fetcher import ReplicaFetcher
from shmlog.cluster.replication.hosted_replicas import HostedReplicas
from shmlog.cluster.replication.isr_manager import IsrManager
from shmlog.cluster.replication.messages import EpochEnd, Fetch, Message
from shmlog.cluster.replication.partition import Role
from shmlog.cluster.replication.throttle import ReplicationThrottle
from shmlog.cluster.zk.paths import PartitionState, TopicAssignment
from shmlog.cluster.zk.view import ClusterView, PartitionStateChanged
from shmlog.common import limits
from shmlog.config.cluster import ClusterConfig
from shmlog.record.records import now_ms
from shmlog.zmq_replication import ReceivedRequest, ReceivedResponse

LEADER, FOLLOWER, ELSEWHERE = 1, 2, 3
LAG_MS, WAIT_MS = 4000, 200


class Wire:
    """The replication transport between this process's brokers: each request and
    reply encoded and decoded by the real codec and queued, delivered in order."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()
        self._correlation = itertools.count(1)
        self.sent: list[tuple[int, object]] = []         # (to, body) of every request

    def endpoint(self, broker_id: int) -> _Endpoint:
        return _Endpoint(self, broker_id)

    def carry(self, to: int, message: Message):
        return to, decode(encode(message))


class _Endpoint:
    """One broker's end of the wire (ReplicationEndpoint's request and reply)."""

    def __init__(self, wire: Wire, broker_id: int):
        self.wire, self.broker_id, self.broker_epoch = wire, broker_id, 0

    def request(self, peer_id: int, body, timeout_ms: int = 0) -> int:
        correlation_id = next(self.wire._correlation)
        self.wire.sent.append((peer_id, body))
        to, message = self.wire.carry(peer_id, Message(self.broker_id, 0, correlation_id, body))
        self.wire.queue.append((to, ReceivedRequest(b"%d" % self.broker_id, message)))
        return correlation_id

    def reply(self, to: ReceivedRequest, body) -> None:
        peer, message = self.wire.carry(
            to.message.sender_broker_id,
            Message(self.broker_id, 0, to.message.correlation_id, body))
        self.wire.queue.append((peer, ReceivedResponse(self.broker_id, message)))


class Broker:
    """One broker's replication parts, wired as its replica service wires them."""

    def __init__(self, broker_id: int, data_dir: str, view: ClusterView, wire: Wire):
        self.config = ClusterConfig(
            cluster_id="test", broker_id=broker_id, zookeeper_connect="127.0.0.1:2181",
            replication_endpoint=f"tcp://127.0.0.1:{19090 + broker_id}",
            security_inter_broker_protocol="plaintext", replica_lag_time_max_ms=LAG_MS,
            replica_fetch_wait_max_ms=WAIT_MS)
        self.host = PartitionHost(data_dir, partitions_max=8, cleaner_dedupe_buffer_size=1 << 20)
        self.hosted = HostedReplicas(self.host, self.config, view, suspended=False)
        endpoint, throttle = wire.endpoint(broker_id), ReplicationThrottle(broker_id)
        # No ISR change is written here (the follower stays in sync): no ZooKeeper.
        isr = IsrManager(self.hosted, None, self.config, lambda: None)
        self.serving = FetchServing(self.hosted, endpoint, throttle, isr, lambda: None)
        self.hosted.listen(self.serving)
        self.fetcher = ReplicaFetcher(self.hosted, endpoint, self.config, throttle, lambda: None)

    def receive(self, event, now: int) -> None:
        """What the dispatch does with a FETCH, an EPOCH_END or an answer."""
        if isinstance(event, ReceivedRequest):
            body = event.message.body
            if isinstance(body, Fetch):
                self.serving.serve_fetch(event, body, now)
            else:
                assert isinstance(body, EpochEnd), body
                self.serving.serve_epoch_end(event, body)
        else:
            self.fetcher.answered(event, now)

    def replica(self, topic: str):
        return self.hosted.replicas[(topic, 0)]


@pytest.fixture
def cluster(tmp_path):
    view, wire = ClusterView(), Wire()
    brokers = {}
    try:
        for broker_id in (LEADER, FOLLOWER):
            brokers[broker_id] = Broker(broker_id, str(tmp_path / f"broker-{broker_id}"), view,
                                        wire)
        yield view, wire, brokers
    finally:
        for broker in brokers.values():
            broker.host.close()


def create(view: ClusterView, brokers: dict, topic: str, replicas: tuple, now: int) -> None:
    """The controller's topic and state znodes, then each broker's watch (the leader's
    first, as in the flake)."""
    assignment = TopicAssignment(topic, uuid.uuid4().hex, {0: replicas})
    view.topics[topic] = assignment
    view.states[(topic, 0)] = (PartitionState(LEADER, 0, replicas, 1), 0)
    for broker in brokers.values():
        broker.hosted.host_topic(assignment, now)


def deliver(wire: Wire, brokers: dict, now: int) -> None:
    """Every message queued, and those they bring, delivered."""
    while wire.queue:
        to, event = wire.queue.popleft()
        brokers[to].receive(event, now)


def wait_out(wire: Wire, brokers: dict, now: int) -> int:
    """The follower's fetch parked at the leader waits out max_wait_ms and is
    answered; what follows is delivered. The time then."""
    now += WAIT_MS
    brokers[LEADER].serving.expire(now)
    deliver(wire, brokers, now)
    return now


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.OBSERVER])
def test_a_partition_followed_while_a_quiet_fetch_is_in_flight_is_named_by_the_next(
        cluster, role):
    view, wire, brokers = cluster
    leader, follower = brokers[LEADER], brokers[FOLLOWER]
    now = now_ms()
    create(view, brokers, "a", (LEADER, FOLLOWER), now)
    follower.fetcher.send_requests(now)
    deliver(wire, brokers, now)
    for _ in range(5):                    # until its session is quiet, a fetch parked
        now = wait_out(wire, brokers, now)
    session_fetcher = follower.fetcher._fetchers[LEADER]
    assert session_fetcher.quiet and session_fetcher.in_flight is not None
    assert wire.sent[-1][1].partitions == ()                   # a quiet fetch names nothing

    # "b" is created while that fetch waits at the leader; the follower's loop turns.
    create(view, brokers, "b", (LEADER, FOLLOWER) if role is Role.FOLLOWER
           else (LEADER, ELSEWHERE), now)
    assert follower.replica("b").role is role
    follower.fetcher.send_requests(now)
    sent = len(wire.sent)
    now = wait_out(wire, brokers, now)
    for _ in range(3):
        now = wait_out(wire, brokers, now)
    led = leader.replica("b")
    state = (led.leader.followers if role is Role.FOLLOWER else led.leader.observers).get(FOLLOWER)
    assert state is not None and state.log_end_offset == led.log.log_end_offset == 0, \
        "the leader has no fetch position of broker 2 for b-0"
    if role is Role.FOLLOWER:
        # Caught up, it stays in the ISR past the lag time while b-0 is idle.
        assert led.leader.shrink_candidates(0, now + LAG_MS + 1) == frozenset()
        assert led.isr_change(now + LAG_MS + 1) is None
    else:
        assert FOLLOWER not in led.leader.followers and FOLLOWER not in led.leader.isr
    assert leader.replica("a").leader.shrink_candidates(0, now + LAG_MS + 1) == frozenset()
    named = {(request.topic_key, request.partition) for _, body in wire.sent[sent:]
             if isinstance(body, Fetch) for request in body.partitions}
    assert named == {led.key}, "only b-0 is named: a-0's request is as the leader holds it"


def test_a_dead_leaders_backed_off_fetcher_leaves_no_deadline_once_nothing_follows_it(cluster):
    """Goal: after a failover away from a dead leader, the follower's loop has no
    deadline left from that leader (a backed-off fetcher's retry, long past, made the
    survivors' loops spin at a full core after every kill -9)."""
    view, wire, brokers = cluster
    follower = brokers[FOLLOWER]
    now = now_ms()
    create(view, brokers, "a", (LEADER, FOLLOWER), now)
    follower.fetcher.send_requests(now)
    wire.queue.clear()                                     # the leader died: no answer
    follower.fetcher.failed(LEADER, follower.fetcher._fetchers[LEADER].in_flight, now)
    assert follower.fetcher.next_deadline() == now + limits.FETCH_BACKOFF_MS

    # The controller moves the leadership to the follower.
    state = PartitionState(FOLLOWER, 1, (FOLLOWER,), 1)
    view.states[("a", 0)] = (state, 1)
    follower.hosted.apply_partition_state(PartitionStateChanged("a", 0, state, 1), now)
    assert follower.replica("a").role is Role.LEADER
    later = now + limits.FETCH_BACKOFF_MS + 1
    follower.fetcher.send_requests(later)
    assert follower.fetcher.next_deadline() is None, "a deadline nothing will send on"
