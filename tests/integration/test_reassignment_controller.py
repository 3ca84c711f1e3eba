"""The controller's partition reassignment (``Controller``'s PartitionReassignment job,
``shmlog.cluster.controller.reassignment``'s rules) against a real ZooKeeper: a move
starts (the moving
assignment with its adding and removing replicas, the leader epoch + 1), waits for
the new replica to join the ISR, and completes (the target assignment, a leader from
the target, the removed replica out of the ISR, the request gone); a request naming
a broker that does not exist is refused whole; a controller elected mid-way resumes
the move; a cancel (the origin replicas as the target) reverts it at once. And the
command's work (``cluster_reassign``): a bad request refused whole before anything is
written, a second one for a moving partition refused, the throttles written with the
request and cleared by a verify that finds it complete (or by a cancel), the
proposal of ``--generate``.

Method: one process; the session's ZooKeeper with a chroot of the test's own. Each
"broker" is a ClusterZooKeeper session with its registration; the leader's ISR
expansion is written as a leader writes it (a conditional state write keeping the
leader and epoch). Every wait is bounded.
"""

from __future__ import annotations

import time

import pytest

from shmlog.cluster import reassign as cluster_reassign
from shmlog.cluster.controller.controller import Controller
from shmlog.cluster.controller.reassignment import ReassignmentStatus
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.client import ClusterZooKeeper
from shmlog.cluster.zk.paths import BrokerRegistration, PartitionState, TopicAssignment
from shmlog.common.errors import InvalidReassignmentError, ReassignmentInProgressError
from shmlog.devtools.local_cluster import poll_until

TIMEOUT_S = 30.0
STEP_S = 0.02
SESSION_TIMEOUT_MS = 2000
CLUSTER_ID = "test-reassign"


def wait_until(condition, what: str, timeout_s: float = TIMEOUT_S):
    return poll_until(condition, timeout_s, what, STEP_S)


@pytest.fixture
def brokers(hosts):
    """Brokers 1..4 registered (sessions of their own); ``controllers`` are stopped after."""
    sessions, controllers = {}, []
    for broker_id in (1, 2, 3, 4):
        session = ClusterZooKeeper(hosts, session_timeout_ms=SESSION_TIMEOUT_MS).start()
        session.register_broker(BrokerRegistration(broker_id, f"host-{broker_id}",
                                                   f"tcp://127.0.0.1:{9000 + broker_id}"),
                                CLUSTER_ID)
        sessions[broker_id] = session
    yield sessions, controllers
    for controller in controllers:
        controller.stop()
    for session in sessions.values():
        session.close()


def start_controller(sessions, controllers, broker_id: int) -> Controller:
    controller = Controller(sessions[broker_id], broker_id).start()
    controllers.append(controller)
    wait_until(lambda: controller.is_active, "an election")
    return controller


def with_topic(session: ClusterZooKeeper) -> PartitionState:
    session.create_topic(TopicAssignment("t", zk_paths.new_topic_id(), {0: (1, 2, 3)}), {})
    return wait_until(lambda: session.read_partition_state("t", 0), "t's state")[0]


def assignment(session: ClusterZooKeeper) -> TopicAssignment:
    return session.read_assignment("t")


def started(session: ClusterZooKeeper) -> TopicAssignment:
    return wait_until(lambda: assignment(session).adding_replicas and assignment(session),
                      "the move's start")


def join_isr(session: ClusterZooKeeper, broker_id: int) -> None:
    """Broker ``broker_id`` joins the ISR, written as the leader writes it."""
    state, version = session.read_partition_state("t", 0)
    topic_id = session.read_assignment("t").topic_id
    session.update_partition_state("t", topic_id, 0, PartitionState(
        state.leader, state.leader_epoch, state.isr + (broker_id,), state.controller_epoch),
        version)


def test_a_move_starts_waits_for_the_isr_and_completes(brokers):
    sessions, controllers = brokers
    controller = start_controller(sessions, controllers, 2)
    before = with_topic(sessions[2])
    sessions[2].create_reassignment({("t", 0): (4, 2, 3)})
    moving = started(sessions[2])
    assert (moving.partitions, moving.adding_replicas, moving.removing_replicas) == \
        ({0: (4, 2, 3, 1)}, {0: (4,)}, {0: (1,)})
    during = sessions[2].read_partition_state("t", 0)[0]
    assert during == PartitionState(1, before.leader_epoch + 1, (1, 2, 3), controller.epoch)
    time.sleep(0.3)
    assert sessions[2].read_reassignment() is not None, "done before 4 joined the ISR"
    join_isr(sessions[1], 4)
    wait_until(lambda: sessions[2].read_reassignment() is None, "the move's completion")
    done = assignment(sessions[2])
    assert (done.partitions, done.adding_replicas, done.removing_replicas) == \
        ({0: (4, 2, 3)}, {}, {})
    # the leader was being removed: the first target replica in the ISR leads
    assert sessions[2].read_partition_state("t", 0)[0] == \
        PartitionState(4, before.leader_epoch + 2, (2, 3, 4), controller.epoch)


def test_a_request_naming_an_unknown_broker_is_refused_whole(brokers):
    sessions, controllers = brokers
    start_controller(sessions, controllers, 1)
    with_topic(sessions[1])
    sessions[1].create_topic(TopicAssignment("u", zk_paths.new_topic_id(), {0: (1, 2)}), {})
    sessions[1].create_reassignment({("t", 0): (4, 2, 3), ("u", 0): (9, 2)})
    wait_until(lambda: sessions[1].read_reassignment() is None, "the refusal")
    assert assignment(sessions[1]).partitions == {0: (1, 2, 3)}
    assert assignment(sessions[1]).adding_replicas == {}


def test_a_new_controller_resumes_a_move_from_the_znodes(brokers):
    sessions, controllers = brokers
    first = start_controller(sessions, controllers, 2)
    with_topic(sessions[2])
    sessions[2].create_reassignment({("t", 0): (4, 2, 3)})
    started(sessions[2])
    first_epoch = first.epoch
    first.stop()
    controllers.remove(first)
    second = start_controller(sessions, controllers, 3)
    assert second.epoch > first_epoch
    join_isr(sessions[1], 4)
    wait_until(lambda: sessions[3].read_reassignment() is None, "the resumed move's completion")
    assert assignment(sessions[3]).partitions == {0: (4, 2, 3)}
    assert sessions[3].read_partition_state("t", 0)[0].controller_epoch == second.epoch


def test_a_cancel_reverts_to_the_origin_replicas(brokers):
    sessions, controllers = brokers
    start_controller(sessions, controllers, 2)
    before = with_topic(sessions[2])
    sessions[2].create_reassignment({("t", 0): (4, 2, 3)})
    started(sessions[2])
    found = sessions[2].read_reassignment()          # waiting: 4 is not in the ISR
    sessions[2].replace_reassignment({("t", 0): (1, 2, 3)}, found[1])
    wait_until(lambda: sessions[2].read_reassignment() is None, "the cancel")
    assert assignment(sessions[2]).partitions == {0: (1, 2, 3)}
    state = sessions[2].read_partition_state("t", 0)[0]
    assert state == PartitionState(1, before.leader_epoch + 2, (1, 2, 3), state.controller_epoch)


# -- the command's work (cluster_reassign) against the same znodes -------------------------

def test_execute_refuses_a_bad_request_whole_and_a_second_one_for_a_moving_partition(brokers):
    sessions, controllers = brokers
    start_controller(sessions, controllers, 2)
    with_topic(sessions[2])
    with pytest.raises(InvalidReassignmentError, match="t-5 does not exist"):
        cluster_reassign.execute(sessions[1], {("t", 0): (4, 2, 3), ("t", 5): (1,)}, 1000)
    assert sessions[1].read_reassignment() is None
    assert sessions[1].read_broker_config(4) == {}, "throttles written for a refused request"
    cluster_reassign.execute(sessions[1], {("t", 0): (4, 2, 3)})
    started(sessions[1])
    with pytest.raises(ReassignmentInProgressError):
        cluster_reassign.execute(sessions[1], {("t", 0): (3, 2, 4)})


def test_execute_throttles_verify_reports_and_clears_cancel_reverts(brokers):
    sessions, controllers = brokers
    start_controller(sessions, controllers, 2)
    with_topic(sessions[2])
    sessions[1].set_topic_config("t", {"min.insync.replicas": "2"})
    request = {("t", 0): (4, 2, 3)}
    rollback = cluster_reassign.execute(sessions[1], request, 5000)
    assert rollback == {("t", 0): (1, 2, 3)}
    rates = {"leader.replication.throttled.rate": "5000",
             "follower.replication.throttled.rate": "5000"}
    assert all(sessions[1].read_broker_config(broker_id) == rates for broker_id in (1, 2, 3, 4))
    assert sessions[1].read_topic_config("t") == {
        "min.insync.replicas": "2", "leader.replication.throttled.replicas": "0:1,0:2,0:3",
        "follower.replication.throttled.replicas": "0:4"}
    started(sessions[1])
    statuses, complete = cluster_reassign.verify(sessions[1], request)
    assert (statuses, complete) == ({("t", 0): ReassignmentStatus.IN_PROGRESS}, False)
    assert sessions[1].read_broker_config(4) == rates, "cleared before completion"
    assert cluster_reassign.cancel(sessions[1], request) == [("t", 0)]
    wait_until(lambda: sessions[1].read_reassignment() is None, "the cancel")
    assert sessions[1].read_broker_config(4) == {}
    assert sessions[1].read_topic_config("t") == {"min.insync.replicas": "2"}
    statuses, complete = cluster_reassign.verify(sessions[1], request)
    assert (statuses, complete) == ({("t", 0): ReassignmentStatus.FAILED}, False)
    # the origin replicas in the moving set's order (Kafka's originReplicas)
    assert assignment(sessions[1]).partitions == {0: (2, 3, 1)}
    assert cluster_reassign.verify(sessions[1], {("t", 0): (2, 3, 1)}) == \
        ({("t", 0): ReassignmentStatus.COMPLETE}, True)


def test_generate_spreads_the_topic_over_the_listed_brokers(brokers):
    sessions, controllers = brokers
    sessions[1].create_topic(TopicAssignment("g", zk_paths.new_topic_id(),
                                             {0: (1, 2), 1: (2, 3), 2: (3, 1)}), {})
    current, proposed = cluster_reassign.generate(sessions[1], ["g"], [2, 4])
    assert current == {("g", 0): (1, 2), ("g", 1): (2, 3), ("g", 2): (3, 1)}
    assert sorted(proposed) == sorted(current)
    assert all(sorted(replicas) == [2, 4] for replicas in proposed.values())
    with pytest.raises(InvalidReassignmentError, match=r"\[9\]"):
        cluster_reassign.generate(sessions[1], ["g"], [2, 9])
