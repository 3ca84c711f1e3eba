"""The controller's leader balance jobs against a real ZooKeeper: controlled shutdown
(a broker's ``/admin/controlled_shutdown/<id>`` moves its leaderships to the next
in-sync replica at epoch + 1 and takes it out of the ISRs it follows; a partition
nobody else can lead keeps it; a request of an earlier incarnation is ignored; a
broker shutting down gets no new partition), preferred leader election on demand
(``/admin/preferred_replica_election``: elected where the preferred replica is live
and in sync, the znode deleted) and automatic (the imbalance check).

Method: one process; the session's ZooKeeper with a chroot per test (``hosts``).
Each "broker" is a ClusterZooKeeper session with its registration; one of them runs
a Controller. The leader's ISR writes a real broker would make are made with
``update_partition_state``. Every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from shmlog.cluster.controller.controller import Controller
from shmlog.cluster.controller.leader_balance import RebalancePolicy
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.client import ClusterZooKeeper
from shmlog.cluster.zk.paths import BrokerRegistration, PartitionState, TopicAssignment
from shmlog.common.errors import PreferredElectionInProgressError
from shmlog.devtools.local_cluster import poll_until

TIMEOUT_S = 30.0
STEP_S = 0.02
SESSION_TIMEOUT_MS = 2000
CLUSTER_ID = "test-cluster"
# Long enough that nothing the test did not ask for happens in between.
SETTLE_S = 0.5
COMMAND_TIMEOUT_S = 60


def wait_until(condition, what: str, timeout_s: float = TIMEOUT_S):
    return poll_until(condition, timeout_s, what, STEP_S)


@pytest.fixture
def cluster(hosts):
    """``cluster.broker(id)`` registers a broker (a session of its own);
    ``cluster.controller(session, id, rebalance)`` starts a controller; all stopped
    after."""
    class Cluster:
        def __init__(self):
            self.sessions: list[ClusterZooKeeper] = []
            self.controllers: list[Controller] = []

        def broker(self, broker_id: int) -> ClusterZooKeeper:
            session = ClusterZooKeeper(hosts, session_timeout_ms=SESSION_TIMEOUT_MS).start()
            self.sessions.append(session)
            session.register_broker(BrokerRegistration(broker_id, f"host-{broker_id}",
                                                       f"tcp://127.0.0.1:{9000 + broker_id}"),
                                    CLUSTER_ID)
            return session

        def controller(self, session, broker_id,
                       rebalance=RebalancePolicy(enable=False)) -> Controller:
            controller = Controller(session, broker_id, rebalance).start()
            self.controllers.append(controller)
            wait_until(lambda: controller.is_active, "an election")
            return controller

    made = Cluster()
    yield made
    for controller in made.controllers:
        controller.stop()
    for session in made.sessions:
        session.close()


def state_of(session, topic: str, partition: int = 0) -> PartitionState | None:
    found = session.read_partition_state(topic, partition)
    return None if found is None else found[0]


def new_topic(session, topic: str, partitions: dict) -> None:
    session.create_topic(TopicAssignment(topic, zk_paths.new_topic_id(), partitions), {})
    for partition in partitions:
        wait_until(lambda partition=partition: state_of(session, topic, partition),
                   f"{topic}-{partition}'s state")


def set_isr(session, topic: str, partition: int, isr: tuple) -> None:
    """What the leader writes when a follower catches up (epoch kept)."""
    state, version = session.read_partition_state(topic, partition)
    topic_id = session.read_assignment(topic).topic_id
    session.update_partition_state(topic, topic_id, partition, PartitionState(
        state.leader, state.leader_epoch, isr, state.controller_epoch), version)


def test_controlled_shutdown_moves_leaders_and_leaves_the_isrs(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    controller = cluster.controller(sessions[3], 3)
    new_topic(sessions[3], "t", {0: [1, 2, 3], 1: [2, 1, 3], 2: [1], 3: [1, 3, 2]})
    set_isr(sessions[3], "t", 3, (1, 2))                  # 3 lags: it cannot take over
    sessions[1].request_controlled_shutdown(1, sessions[1].broker_epoch)
    epoch = controller.epoch
    expected = {0: PartitionState(2, 1, (2, 3), epoch),   # the next in-sync, epoch + 1
                1: PartitionState(2, 0, (2, 3), epoch),   # a follower: out of the ISR
                2: PartitionState(1, 0, (1,), epoch),     # nobody else: it keeps it
                3: PartitionState(2, 1, (2,), epoch)}     # in sync beats assignment order
    wait_until(lambda: all(state_of(sessions[3], "t", partition) == state
                           for partition, state in expected.items()),
               f"the states {expected}")
    assert sessions[3].read_controlled_shutdowns() == {1: sessions[1].broker_epoch}


def test_a_shutting_broker_gets_no_new_partition_and_an_old_request_is_ignored(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    controller = cluster.controller(sessions[2], 2)
    sessions[1].request_controlled_shutdown(1, sessions[1].broker_epoch + 1)   # stale epoch
    new_topic(sessions[2], "t", {0: [1, 2]})
    time.sleep(SETTLE_S)
    assert state_of(sessions[2], "t") == PartitionState(1, 0, (1, 2), controller.epoch)
    sessions[1].request_controlled_shutdown(1, sessions[1].broker_epoch)
    wait_until(lambda: state_of(sessions[2], "t").leader == 2, "the move")
    new_topic(sessions[2], "u", {0: [1, 2]})
    assert state_of(sessions[2], "u") == PartitionState(2, 0, (2,), controller.epoch)


def test_preferred_election_on_demand(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2, 3)}
    controller = cluster.controller(sessions[3], 3)
    new_topic(sessions[3], "t", {0: [1, 2, 3], 1: [1, 3, 2], 2: [2, 3]})
    sessions[1].close()                              # 1 leaves: 2 and 3 lead its partitions
    wait_until(lambda: state_of(sessions[3], "t", 1).leader == 3, "the failover")
    sessions[1] = cluster.broker(1)                  # back, and caught up on partition 0 only
    set_isr(sessions[3], "t", 0, (2, 3, 1))
    sessions[3].request_preferred_replica_election([("t", 0)])
    wait_until(lambda: sessions[3].read_preferred_replica_election() is None,
               "the election's znode to go")
    assert state_of(sessions[3], "t", 0) == PartitionState(1, 2, (2, 3, 1), controller.epoch)
    sessions[3].request_preferred_replica_election([("t", 1), ("t", 2)])
    wait_until(lambda: sessions[3].read_preferred_replica_election() is None,
               "the election's znode to go")
    assert state_of(sessions[3], "t", 1).leader == 3     # 1 is not in sync: not elected
    assert state_of(sessions[3], "t", 2).leader == 2     # preferred already


def test_a_second_election_request_is_refused_while_one_is_pending(cluster):
    session = cluster.broker(1)                          # no controller: it stays pending
    session.request_preferred_replica_election([("t", 0)])
    with pytest.raises(PreferredElectionInProgressError):
        session.request_preferred_replica_election([("t", 1)])
    assert session.read_preferred_replica_election()[0] == (("t", 0),)


def test_automatic_rebalance_elects_the_preferred_replicas(cluster):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    cluster.controller(sessions[2], 2, RebalancePolicy(True, 10, 1))
    new_topic(sessions[2], "t", {0: [1, 2], 1: [2, 1]})
    sessions[1].close()
    wait_until(lambda: state_of(sessions[2], "t").leader == 2, "the failover")
    sessions[1] = cluster.broker(1)
    time.sleep(SETTLE_S)
    assert state_of(sessions[2], "t").leader == 2        # not in sync yet: stays
    set_isr(sessions[2], "t", 0, (2, 1))
    wait_until(lambda: state_of(sessions[2], "t").leader == 1, "the rebalance")
    assert state_of(sessions[2], "t", 1).leader == 2


# --- shmlog cluster elect-leaders ----------------------------------------------------------

def elect_leaders(hosts: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlog", "cluster", "elect-leaders",
                           "--zookeeper-connect", hosts, *arguments],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def test_elect_leaders_says_per_partition_what_happened(cluster, hosts):
    sessions = {broker_id: cluster.broker(broker_id) for broker_id in (1, 2)}
    cluster.controller(sessions[2], 2)
    new_topic(sessions[2], "t", {0: [1, 2], 1: [2, 1]})
    sessions[1].close()
    wait_until(lambda: state_of(sessions[2], "t").leader == 2, "the failover")
    done = elect_leaders(hosts, "--all-topic-partitions")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        "t-0: preferred replica not alive (preferred 1, leader 2)",
        "t-1: already the preferred leader (leader 2, epoch 0)",
        "1 of 2 partitions led by their preferred replica; 1 failed"]
    sessions[1] = cluster.broker(1)                      # back, not in sync yet
    done = elect_leaders(hosts, "--topic", "t", "--partition", "0")
    assert (done.returncode, done.stdout.splitlines()[0]) == \
        (1, "t-0: preferred replica not in sync (preferred 1, leader 2)")
    set_isr(sessions[2], "t", 0, (2, 1))
    done = elect_leaders(hosts, "--topic", "t", "--json")
    assert done.returncode == 0, done.stderr
    assert [(answer["outcome"], answer["leader"], answer["leader_epoch"])
            for answer in json.loads(done.stdout)] == [("elected", 1, 2),
                                                       ("already_preferred", 2, 0)]


def test_elect_leaders_refuses_what_it_cannot_do(cluster, hosts):
    session = cluster.broker(1)
    session.create_topic(TopicAssignment("t", zk_paths.new_topic_id(), {0: [1]}), {})
    unknown = elect_leaders(hosts, "--topic", "nope")
    assert unknown.returncode == 1 and "topic 'nope' does not exist" in unknown.stderr
    no_partition = elect_leaders(hosts, "--topic", "t", "--partition", "5")
    assert no_partition.returncode == 1 and "has no partition 5" in no_partition.stderr
    usage = elect_leaders(hosts, "--partition", "0", "--all-topic-partitions")
    assert usage.returncode == 2 and "--partition needs --topic" in usage.stderr
    # No controller runs: the request stays for the next one, the command gives up.
    waited = elect_leaders(hosts, "--all-topic-partitions", "--timeout-ms", "300")
    assert waited.returncode == 1 and "no controller carried out" in waited.stderr
    assert session.read_preferred_replica_election()[0] == (("t", 0),)
    busy = elect_leaders(hosts, "--all-topic-partitions")
    assert busy.returncode == 1 and "still in progress" in busy.stderr
