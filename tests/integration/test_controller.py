"""The ZooKeeper client (``shmlog.cluster.zk.client``) and the controller
(``shmlog.cluster.controller.controller``)
against a real ZooKeeper: election and fencing (two controllers race and one wins at
epoch + 1; a deposed controller's checked write is refused and changes nothing; a
zombie leader's stale ISR write is refused), the controller's jobs (a new topic's
states; a broker gone: re-election with epoch + 1, a dead follower out of the ISR; a
bounced broker; deletion of every znode), its state cache (a decision from a state
the cache holds behind ZooKeeper is refused and made again from a fresh read; a
state written late naming a broker gone is answered), cluster-wide producer-id blocks, the
cluster id check, the watches' events, and the SUSPENDED state when ZooKeeper stops
answering (SIGSTOP), cleared when it answers again (SIGCONT).

Method: one process; the session's ZooKeeper (tickTime 500 ms) with a chroot of
its own per test (deleted afterwards), and a ZooKeeper of the test's own where the
test stops it. Each "broker" is a ClusterZooKeeper session (2 s timeout) with its
registration, and a Controller. A session is expired the way ZooKeeper's own tests
do it: a second client opened with the session's id and password, then closed.
Every wait is bounded; times (re-election) are printed, never asserted.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest
from kazoo.client import KazooClient

from shmlog.cluster.controller.controller import Controller
from shmlog.cluster.controller.controller_context import ControllerEpoch, StateCache
from shmlog.cluster.controller.partition_state_machine import PartitionStateMachine
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.client import ClusterZooKeeper
from shmlog.cluster.zk.events import EventKind, EventQueue, SessionState
from shmlog.cluster.zk.paths import BrokerRegistration, PartitionState, TopicAssignment
from shmlog.cluster.zk.session import CreateOp, DeleteOp, SetDataOp
from shmlog.cluster.zk.state_changes import STATE_CHANGES_PATH, state_set_op
from shmlog.cluster.zk.view import ClusterView
from shmlog.common import limits
from shmlog.common.errors import (
    ControllerMovedError,
    InconsistentClusterIdError,
    StaleStateVersionError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    ZooKeeperConnectionError,
)
from shmlog.devtools.local_cluster import poll_until
from shmlog.devtools.zookeeper import ZooKeeperServer

TIMEOUT_S = 30.0
STEP_S = 0.02
SESSION_TIMEOUT_MS = 2000
CLUSTER_ID = "test-cluster"


def wait_until(condition, what: str, timeout_s: float = TIMEOUT_S):
    return poll_until(condition, timeout_s, what, STEP_S)


def expire(hosts: str, session: ClusterZooKeeper) -> None:
    """Expire ``session`` on the server: another client takes it over and closes it."""
    session_id, password = session.client_id
    thief = KazooClient(hosts=hosts, client_id=(session_id, password))
    thief.start(timeout=TIMEOUT_S)
    thief.stop()
    thief.close()


@pytest.fixture
def cluster(hosts):
    """``cluster.broker(id)`` registers a broker (a session of its own),
    ``cluster.controller(session)`` starts its controller; all stopped after."""
    class Cluster:
        def __init__(self):
            self.sessions: list[ClusterZooKeeper] = []
            self.controllers: list[Controller] = []

        def session(self) -> ClusterZooKeeper:
            session = ClusterZooKeeper(hosts, session_timeout_ms=SESSION_TIMEOUT_MS).start()
            self.sessions.append(session)
            return session

        def broker(self, broker_id: int) -> ClusterZooKeeper:
            session = self.session()
            session.register_broker(BrokerRegistration(broker_id, f"host-{broker_id}",
                                                       f"tcp://127.0.0.1:{9000 + broker_id}"),
                                    CLUSTER_ID)
            return session

        def controller(self, session: ClusterZooKeeper, broker_id: int) -> Controller:
            controller = Controller(session, broker_id).start()
            self.controllers.append(controller)
            return controller

    made = Cluster()
    yield made
    for controller in made.controllers:
        controller.stop()
    for session in made.sessions:
        session.close()


def state_of(session: ClusterZooKeeper, topic: str, partition: int = 0):
    found = session.read_partition_state(topic, partition)
    return None if found is None else found[0]


def new_topic(session: ClusterZooKeeper, topic: str, partitions: dict, config=None):
    assignment = TopicAssignment(topic, zk_paths.new_topic_id(), partitions)
    session.create_topic(assignment, config or {})
    return assignment


def test_registration_gives_the_czxid_and_checks_the_cluster_id(cluster, hosts):
    session = cluster.broker(1)
    brokers = session.read_brokers()
    assert list(brokers) == [1]
    registration, epoch = brokers[1]
    assert epoch == session.broker_epoch > 0
    assert registration.replication_endpoint == "tcp://127.0.0.1:9001"
    assert registration.pid == os.getpid() and registration.timestamp_ms > 0
    other = cluster.session()
    with pytest.raises(InconsistentClusterIdError):
        other.register_broker(BrokerRegistration(2, "h", "tcp://h:1"), "another-cluster")
    assert list(other.read_brokers()) == [1]


def test_no_zookeeper_is_a_connection_error():
    with pytest.raises(ZooKeeperConnectionError):
        ClusterZooKeeper("127.0.0.1:1", connect_timeout_s=0.5).start()


def test_two_controllers_race_and_one_wins_at_the_next_epoch(cluster):
    sessions = [cluster.broker(broker_id) for broker_id in (1, 2)]
    epoch_before, _ = sessions[0].read_controller_epoch()
    controllers = [Controller(session, broker_id) for broker_id, session in
                   zip((1, 2), sessions)]
    starters = [threading.Thread(target=controller.start) for controller in controllers]
    for starter in starters:
        starter.start()
    for starter in starters:
        starter.join(TIMEOUT_S)
    cluster.controllers.extend(controllers)
    winner = wait_until(lambda: [c for c in controllers if c.is_active], "an election")
    time.sleep(0.5)                                   # the loser has had its chance too
    assert [c.is_active for c in controllers].count(True) == 1
    assert winner[0].epoch == epoch_before + 1
    assert sessions[0].read_controller_epoch()[0] == epoch_before + 1
    assert sessions[0].read_controller().broker_id == winner[0].broker_id


def test_a_deposed_controllers_write_is_refused_and_changes_nothing(cluster, hosts):
    session_a, session_b = cluster.broker(1), cluster.broker(2)
    controller_a = cluster.controller(session_a, 1)
    wait_until(lambda: controller_a.is_active, "A's election")
    controller_b = cluster.controller(session_b, 2)
    _, fence_a = session_a.read_controller_epoch()          # A's fence, as A holds it
    new_topic(session_a, "t", {0: [1, 2]})
    wait_until(lambda: state_of(session_a, "t"), "the state of t")
    state, version = session_a.read_partition_state("t", 0)

    epoch_a = controller_a.epoch
    expired_at = time.monotonic()
    expire(hosts, session_a)
    wait_until(lambda: controller_b.is_active, "B's election")
    print(f"\nre-election after the controller's session expired: "
          f"{controller_b.elected_at - expired_at:.3f} s")
    assert controller_b.epoch == epoch_a + 1 == session_b.read_controller_epoch()[0]
    wait_until(lambda: not controller_a.is_active, "A resigning")
    wait_until(lambda: session_a.client_id is not None, "A's new session")

    bogus = PartitionState(1, state.leader_epoch + 7, (1,), 1)
    with pytest.raises(ControllerMovedError):
        session_a.checked_multi([state_set_op("t", session_b.read_assignment("t").topic_id, 0,
                                              bogus, version)], fence_a)
    now, _ = session_b.read_partition_state("t", 0)
    assert now.leader_epoch < state.leader_epoch + 7
    assert now != bogus


def test_a_checked_multi_applies_all_of_its_ops_or_none(cluster):
    session = cluster.broker(1)
    epoch, fence = session.read_controller_epoch()
    new_topic(session, "t", {0: [1]})
    config_path = zk_paths.topic_config_path("t")
    scratch = zk_paths.partitions_path("t")
    with pytest.raises(StaleStateVersionError) as refused:
        session.checked_multi([CreateOp(scratch), SetDataOp(config_path, b"{}", 5)], fence)
    assert refused.value.path == config_path
    assert session.read_partition_states("t") == {}
    assert session.read_topic_config("t") == {}
    results = session.checked_multi(
        [CreateOp(scratch), SetDataOp(config_path, zk_paths.encode_topic_config({"a": "b"}), 0)],
        fence)
    assert results[0] == scratch and results[1].version == 1
    assert session.read_topic_config("t") == {"a": "b"}
    with pytest.raises(ControllerMovedError):
        session.checked_multi([DeleteOp(scratch)], fence + 1)
    assert session.read_controller_epoch() == (epoch, fence)


def test_a_stopped_controller_hands_over_at_once(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    first = cluster.controller(sessions[1], 1)
    wait_until(lambda: first.is_active, "an election")
    second = cluster.controller(sessions[2], 2)
    first_epoch = first.epoch
    stopped_at = time.monotonic()
    first.stop()
    wait_until(lambda: second.is_active, "the next election")
    print(f"\nelection after a clean stop: {second.elected_at - stopped_at:.3f} s")
    assert not first.is_active
    assert second.epoch == first_epoch + 1
    assert sessions[1].read_controller().broker_id == 2


def test_a_malformed_topic_does_not_stop_the_others_elections(cluster, hosts):
    session = cluster.broker(1)
    raw = KazooClient(hosts=hosts)
    raw.start(timeout=TIMEOUT_S)
    try:
        raw.create(zk_paths.topic_path("bad"), b"{not json")
    finally:
        raw.stop()
        raw.close()
    controller = cluster.controller(session, 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(session, "good", {0: [1]})
    assert wait_until(lambda: state_of(session, "good"), "good's state").leader == 1
    assert controller.is_active


def test_a_zombie_leaders_isr_write_is_refused(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    controller = cluster.controller(sessions[2], 2)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[2], "t", {0: [1, 2]})
    state, version = wait_until(lambda: sessions[2].read_partition_state("t", 0), "t's state")
    assert state.leader == 1
    zombie = cluster.session()                         # broker 1's writer, holding version
    sessions[1].close()                                # broker 1 is gone for the cluster
    wait_until(lambda: state_of(sessions[2], "t").leader == 2, "the re-election")
    shrunk = PartitionState(1, state.leader_epoch, (1,), state.controller_epoch)
    topic_id = sessions[2].read_assignment("t").topic_id
    with pytest.raises(StaleStateVersionError):
        zombie.update_partition_state("t", topic_id, 0, shrunk, version)
    assert state_of(sessions[2], "t").leader == 2
    # The leader's own conditional write goes through at the version it holds.
    current, current_version = sessions[2].read_partition_state("t", 0)
    written = sessions[2].update_partition_state("t", topic_id, 0, current, current_version)
    assert written == current_version + 1
    # The same without blocking: the outcome comes back on a kazoo thread.
    outcomes = queue.SimpleQueue()
    zombie.update_partition_states_async([("t", topic_id, 0, shrunk, version)], outcomes.put)
    refused, = outcomes.get(timeout=TIMEOUT_S)
    assert isinstance(refused, StaleStateVersionError)
    sessions[2].update_partition_states_async([("t", topic_id, 0, current, written)],
                                              outcomes.put)
    assert outcomes.get(timeout=TIMEOUT_S) == [written + 1]


def test_a_new_topics_states_name_the_first_live_replica(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    controller = cluster.controller(sessions[1], 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[2], "t", {0: [3, 2, 1], 1: [1, 2, 3]}, {"min.insync.replicas": "2"})
    with pytest.raises(TopicExistsError):
        new_topic(sessions[2], "t", {0: [1]})
    for partition, expected in ((0, PartitionState(2, 0, (2, 1), controller.epoch)),
                                (1, PartitionState(1, 0, (1, 2), controller.epoch))):
        assert wait_until(lambda partition=partition: state_of(sessions[1], "t", partition),
                          "t's states") \
            == expected
    assert sessions[1].read_topic_config("t") == {"min.insync.replicas": "2"}


def test_a_partition_without_live_replicas_gets_its_state_when_one_registers(cluster):
    session = cluster.broker(1)
    controller = cluster.controller(session, 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(session, "t", {0: [2, 3]})
    time.sleep(0.5)
    assert state_of(session, "t") is None
    cluster.broker(3)
    assert wait_until(lambda: state_of(session, "t"), "t's state") \
        == PartitionState(3, 0, (3,), controller.epoch)


def test_a_dead_leader_is_replaced_at_the_next_epoch_and_leaves_the_isr(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    controller = cluster.controller(sessions[3], 3)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[3], "t", {0: [1, 2, 3]})
    assert wait_until(lambda: state_of(sessions[3], "t"), "t's state").leader == 1
    gone_at = time.monotonic()
    sessions[1].close()
    after = wait_until(lambda: state_of(sessions[3], "t").leader == 2 and
                       state_of(sessions[3], "t"), "the re-election")
    print(f"\nre-election after the leader's registration went: "
          f"{time.monotonic() - gone_at:.3f} s")
    assert after == PartitionState(2, 1, (2, 3), controller.epoch)


def test_a_dead_follower_leaves_the_isr_without_a_new_epoch(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    controller = cluster.controller(sessions[1], 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[1], "t", {0: [1, 2, 3]})
    wait_until(lambda: state_of(sessions[1], "t"), "t's state")
    sessions[3].close()
    assert wait_until(lambda: state_of(sessions[1], "t").isr == (1, 2) and
                      state_of(sessions[1], "t"), "the ISR shrink") \
        == PartitionState(1, 0, (1, 2), controller.epoch)


def test_the_last_in_sync_replica_leads_again_when_it_comes_back(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    controller = cluster.controller(sessions[2], 2)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[2], "t", {0: [1]})
    wait_until(lambda: state_of(sessions[2], "t"), "t's state")
    sessions[1].close()
    assert wait_until(lambda: not state_of(sessions[2], "t").has_leader and
                      state_of(sessions[2], "t"), "the partition offline") \
        == PartitionState(zk_paths.NO_LEADER, 1, (1,), controller.epoch)
    cluster.broker(1)
    assert wait_until(lambda: state_of(sessions[2], "t").has_leader and
                      state_of(sessions[2], "t"), "the leader back") \
        == PartitionState(1, 2, (1,), controller.epoch)


def test_a_bounced_leader_loses_its_leadership_at_a_new_epoch(cluster, hosts):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    controller = cluster.controller(sessions[3], 3)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[3], "t", {0: [1, 2]})
    wait_until(lambda: state_of(sessions[3], "t"), "t's state")
    events = EventQueue()
    sessions[1].add_events(events)
    old_epoch = sessions[1].broker_epoch
    # Broker 1's session expires; it registers again by itself on its new session,
    # under the same id with a new czxid: a bounce.
    expire(hosts, sessions[1])
    registered = wait_until(lambda: [event for event in events.drain()
                                     if event.kind is EventKind.REGISTERED], "re-registration")
    assert registered[0].zk_version == sessions[1].broker_epoch != old_epoch
    assert sessions[3].read_brokers()[1][1] == sessions[1].broker_epoch
    assert wait_until(lambda: state_of(sessions[3], "t").leader == 2 and
                      state_of(sessions[3], "t"), "the re-election") \
        == PartitionState(2, 1, (2,), controller.epoch)


def test_a_decision_from_a_stale_cached_state_is_made_again_from_a_fresh_read(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    elected = ControllerEpoch(*sessions[1].try_become_controller(1))
    cache = StateCache()
    machine = PartitionStateMachine(sessions[1], 1, cache)    # no watch feeds this cache
    assignment = new_topic(sessions[1], "t", {0: [1, 2, 3]})
    machine.reconcile(elected, fresh=True)
    assert cache.states(assignment) == {0: (PartitionState(1, 0, (1, 2, 3), elected.epoch), 0)}
    # The leader drops 3 from the ISR; the cache still holds version 0.
    sessions[1].update_partition_state("t", assignment.topic_id, 0,
                                       PartitionState(1, 0, (1, 2), elected.epoch), 0)
    sessions[2].close()
    wait_until(lambda: 2 not in sessions[1].read_brokers(), "broker 2's registration gone")
    machine.reconcile(elected)
    # From the cache alone the ISR would have been (1, 3), a broker out of sync back in.
    expected = PartitionState(1, 0, (1,), elected.epoch)
    assert sessions[1].read_partition_state("t", 0) == (expected, 2)
    assert cache.states(assignment) == {0: (expected, 2)}


def test_a_state_written_late_naming_a_broker_gone_is_answered(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    controller = cluster.controller(sessions[1], 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(sessions[1], "t", {0: [1, 2]})
    wait_until(lambda: state_of(sessions[1], "t"), "t's state")
    writer = cluster.session()                  # the leader's ISR writer, running late
    sessions[2].close()
    shrunk, version = wait_until(lambda: state_of(sessions[1], "t").isr == (1,) and
                                 sessions[1].read_partition_state("t", 0), "the ISR shrink")
    # An expansion decided before broker 2 went lands after the controller's shrink.
    writer.update_partition_state("t", sessions[1].read_assignment("t").topic_id, 0,
                                  PartitionState(1, 0, (1, 2), shrunk.controller_epoch), version)
    assert wait_until(lambda: state_of(sessions[1], "t").isr == (1,) and
                      sessions[1].read_partition_state("t", 0), "broker 2 out again") \
        == (shrunk, version + 2)


def test_deletion_removes_every_znode_of_the_topic(cluster):
    session = cluster.broker(1)
    controller = cluster.controller(session, 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(session, "t", {0: [1], 1: [1]})
    new_topic(session, "u", {0: [1]})
    wait_until(lambda: state_of(session, "t", 1), "t's states")
    with pytest.raises(UnknownTopicOrPartitionError):
        session.mark_topic_deleted("nope")
    session.mark_topic_deleted("t")
    wait_until(lambda: session.read_topics() == ["u"], "the deletion")
    wait_until(lambda: session.read_topics_to_delete() == [], "the mark's removal")
    assert session.read_topic_config("t") == {}
    assert session.read_partition_states("t") == {}
    assert state_of(session, "u") is not None


def test_producer_id_blocks_from_two_clients_never_overlap(cluster):
    sessions = [cluster.session(), cluster.session()]
    blocks = [[], []]

    def take(index: int) -> None:
        for _ in range(15):
            blocks[index].append(sessions[index].next_producer_id_block(index + 1))

    takers = [threading.Thread(target=take, args=(index,)) for index in (0, 1)]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join(TIMEOUT_S)
    taken = sorted(blocks[0] + blocks[1], key=lambda block: block.block_start)
    assert len(taken) == 30
    assert taken[0].block_start == 0
    for before, after in zip(taken, taken[1:]):
        assert after.block_start == before.block_end + 1
    assert all(block.block_end - block.block_start + 1 == zk_paths.PRODUCER_ID_BLOCK_SIZE
               for block in taken)


def test_watches_queue_the_clusters_changes(cluster):
    session = cluster.broker(1)
    events, view = EventQueue(), ClusterView()
    session.watch_cluster(events)
    controller = cluster.controller(session, 1)
    wait_until(lambda: controller.is_active, "an election")
    assignment = new_topic(session, "t", {0: [1]})
    seen = []

    def saw(kind, key):
        seen.extend(events.drain())
        return any(event.kind is kind and event.key == key and event.body is not None
                   for event in seen)

    wait_until(lambda: saw(EventKind.BROKER, 1), "the broker's event")
    wait_until(lambda: saw(EventKind.TOPIC, "t"), "the topic's event")
    # The state's creation comes in its notice (the topic's first read may find none).
    wait_until(lambda: saw(EventKind.PARTITION_STATES, STATE_CHANGES_PATH), "the notice")
    notice = [event for event in seen if event.kind is EventKind.PARTITION_STATES][-1]
    change, = notice.body
    assert (change.topic, change.topic_id, change.partition, change.state.leader,
            change.zk_version) == ("t", assignment.topic_id, 0, 1, 0)
    view.apply_all(seen)
    assert view.state("t", 0) == (change.state, 0)
    broker_event = [event for event in seen if event.kind is EventKind.BROKER][-1]
    assert broker_event.zk_version == session.broker_epoch


def test_suspended_while_zookeeper_is_stopped(tmp_path):
    with ZooKeeperServer(str(tmp_path / "zk"), tick_time_ms=500) as server:
        session = ClusterZooKeeper(server.connect_string,
                                   session_timeout_ms=SESSION_TIMEOUT_MS).start()
        events = EventQueue()
        session.add_events(events)
        controller = Controller(session, 1).start()
        try:
            wait_until(lambda: controller.is_active, "an election")
            assert not session.suspended.is_set()
            stopped_at = time.monotonic()
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                session.suspended.wait(TIMEOUT_S)
                print(f"\nSUSPENDED {time.monotonic() - stopped_at:.3f} s after SIGSTOP "
                      f"(session timeout {SESSION_TIMEOUT_MS} ms)")
                assert session.suspended.is_set()
                assert not controller.is_active
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            wait_until(lambda: not session.suspended.is_set(), "reconnection")
            states = [event.key for event in events.drain() if event.kind is EventKind.SESSION]
            assert SessionState.SUSPENDED in states and SessionState.CONNECTED in states
            # Whether the session outlived the stop or not, a controller is elected again.
            wait_until(lambda: controller.is_active, "the controller acting again")
        finally:
            controller.stop()
            session.close()


def test_notices_are_deleted_after_their_retention_and_a_missed_one_means_a_reread(
        cluster, monkeypatch):
    """Goal: the controller deletes the state-change notices once they are
    STATE_CHANGE_RETENTION_S old (here 0), and a broker whose notice was gone
    before it read it reads every state again, so it misses nothing."""
    monkeypatch.setattr(limits, "STATE_CHANGE_RETENTION_S", 0.0)
    monkeypatch.setattr(limits, "STATE_CHANGE_COLLECT_INTERVAL_S", 0.0)
    session = cluster.broker(1)
    controller = cluster.controller(session, 1)
    wait_until(lambda: controller.is_active, "an election")
    new_topic(session, "t", {0: [1], 1: [1]})
    wait_until(lambda: len(session.read_partition_states("t")) == 2, "t's states")
    wait_until(lambda: session.read_state_change_notices() == [], "the notices deleted")

    events, view = EventQueue(), ClusterView()
    watch = cluster.broker(2).watch_cluster(events)

    def states_in_view() -> dict:
        view.apply_all(events.drain())
        return {partition: view.state("t", partition) for partition in (0, 1)}

    wait_until(lambda: all(states_in_view().values()), "the states read by a new broker")
    # A notice listed but deleted before its read: the watch reads every state again.
    before = dict(states_in_view())
    watch._read_notices([10 ** 9])
    reread: list = []

    def both_read_again() -> bool:       # the re-read's events may come in two drains
        reread.extend(event for event in events.drain()
                      if event.kind is EventKind.PARTITION_STATE)
        return {event.key for event in reread} >= {("t", 0), ("t", 1)}

    wait_until(both_read_again, "the re-read")
    assert {event.key for event in reread} == {("t", 0), ("t", 1)}
    view.apply_all(reread)
    assert states_in_view() == before


def test_a_topic_whose_states_come_with_its_assignment_is_learned_whole(cluster):
    """Goal: a broker learns every state of a topic whose notice it may read before
    its assignment's event (a fast controller: here the states, their notice and the
    assignment are one multi), for many topics in a row: the topic's own read, sent
    after its assignment's event, finds what a notice dropped by the view named."""
    session, writer = cluster.broker(1), cluster.session()
    events, view = EventQueue(), ClusterView()
    session.watch_cluster(events)
    state = PartitionState(1, 0, (1,), 1)
    topics = [f"fast-{index}" for index in range(20)]
    for topic in topics:
        topic_id = zk_paths.new_topic_id()
        assignment = TopicAssignment(topic, topic_id, {0: (1,), 1: (1,)})
        writer.multi([CreateOp(zk_paths.topic_config_path(topic), zk_paths.encode_topic_config({})),
                      CreateOp(zk_paths.topic_path(topic),
                               zk_paths.encode_topic_assignment(assignment)),
                      *writer.partition_state_creation_ops(topic, topic_id,
                                                           {0: state, 1: state})])

    def learned() -> bool:
        view.apply_all(events.drain())
        return all(view.state(topic, partition) == (state, 0)
                   for topic in topics for partition in (0, 1))

    wait_until(learned, "every state of every topic in the broker's view")
