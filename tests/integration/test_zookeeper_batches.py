"""The controller's and the watches' ZooKeeper work at thousands of partitions
(issue 26), against a real ZooKeeper: reads pipelined (``get_many``,
``children_many``), writes larger than ZooKeeper's request size cut into fenced
multis (``checked_multi_chunked``, one after another or pipelined), many znodes
read by one ``ZnodeReads``, and
a controller electing, and re-electing after a broker goes, a topic of
``PARTITIONS`` partitions at replication factor 3 in one pass each.

Method: one process; the session's ZooKeeper (tickTime 500 ms), a chroot per test
(``hosts``). Each "broker" is a ClusterZooKeeper session with its registration (as
``test_controller``). Every wait is bounded; times are printed, never asserted.
"""

from __future__ import annotations

import time

import pytest

from shmlog.cluster.controller.controller import Controller
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.client import ClusterZooKeeper
from shmlog.cluster.zk.events import EventQueue
from shmlog.cluster.zk.paths import BrokerRegistration, PartitionState, TopicAssignment
from shmlog.cluster.zk.session import CreateOp, SetDataOp
from shmlog.cluster.zk.view import ClusterView
from shmlog.common import limits
from shmlog.common.errors import ControllerMovedError, StaleStateVersionError
from shmlog.devtools.local_cluster import poll_until

TIMEOUT_S = 60.0
STEP_S = 0.05
SESSION_TIMEOUT_MS = 2000
CLUSTER_ID = "test-cluster"
PARTITIONS = 2000


def wait_until(condition, what: str, timeout_s: float = TIMEOUT_S):
    return poll_until(condition, timeout_s, what, STEP_S)


@pytest.fixture
def sessions(hosts):
    """``sessions(broker_id)`` registers a broker (a session of its own); all closed
    after, with the controllers started on them."""
    made: list[ClusterZooKeeper] = []
    controllers: list[Controller] = []

    def broker(broker_id: int | None = None) -> ClusterZooKeeper:
        session = ClusterZooKeeper(hosts, session_timeout_ms=SESSION_TIMEOUT_MS).start()
        made.append(session)
        if broker_id is not None:
            session.register_broker(BrokerRegistration(broker_id, f"host-{broker_id}",
                                                       f"tcp://127.0.0.1:{9000 + broker_id}"),
                                    CLUSTER_ID)
        return session

    broker.controllers = controllers
    yield broker
    for controller in controllers:
        controller.stop()
    for session in made:
        session.close()


def spread(partitions: int, brokers=(1, 2, 3)) -> dict[int, list[int]]:
    """Round-robin replicas (RF 3), each partition's first replica its preferred."""
    count = len(brokers)
    return {partition: [brokers[(partition + shift) % count] for shift in range(count)]
            for partition in range(partitions)}


def test_many_reads_go_in_one_pipeline(sessions):
    session = sessions()
    paths = [f"/many/{index}" for index in range(PARTITIONS)]
    session.ensure_path("/many")
    session.multi_chunked([CreateOp(path, str(index).encode())
                           for index, path in enumerate(paths)])
    started = time.monotonic()
    found = session.get_many(paths + ["/many/absent"])
    print(f"\n{len(paths)} znodes read in one pipeline: {time.monotonic() - started:.3f} s")
    assert found["/many/absent"] is None
    assert all(found[path][0] == str(index).encode() for index, path in enumerate(paths))
    children = session.children_many(["/many", "/many/0", "/nowhere"])
    assert sorted(children["/many"]) == sorted(str(index) for index in range(PARTITIONS))
    assert children["/many/0"] == [] and children["/nowhere"] == []


def test_a_write_above_the_request_size_goes_as_fenced_multis(sessions):
    session = sessions(1)
    _, fence = session.read_controller_epoch()
    session.ensure_path("/big")
    body = b"x" * 1000                  # 2,000 ops of ~1 KB: ~4 multis
    ops = [CreateOp(f"/big/{index}", body) for index in range(PARTITIONS)]
    assert sum(len(op.body) for op in ops) > limits.ZOOKEEPER_MULTI_SIZE_MAX
    results = session.checked_multi_chunked(ops, fence)
    assert results == [op.path for op in ops]
    assert len(session.children("/big")) == PARTITIONS
    # A stale version refuses its multi and stops the rest; those before stay.
    other = b"y" * 1000
    sets = [SetDataOp(f"/big/{index}", other, 0 if index < PARTITIONS // 2 else 5)
            for index in range(PARTITIONS)]
    with pytest.raises(StaleStateVersionError):
        session.checked_multi_chunked(sets, fence)
    found = session.get_many(op.path for op in sets)
    assert found["/big/0"][0] == other and found[f"/big/{PARTITIONS - 1}"][0] == body
    with pytest.raises(ControllerMovedError):     # the fence goes with every multi
        session.checked_multi_chunked(ops[:10], fence + 1)


def test_pipelined_multis_are_applied_in_order_and_a_refused_one_stops_no_other(sessions):
    session = sessions(1)
    _, fence = session.read_controller_epoch()
    session.ensure_path("/piped")
    body = b"x" * 1000
    creates = [CreateOp(f"/piped/{index}", body) for index in range(PARTITIONS)]
    # The later multis create under parents the first made: ZooKeeper applies them in order.
    ops = [CreateOp("/piped/a")] + [CreateOp(f"/piped/a/{index}", body)
                                    for index in range(PARTITIONS)] + creates
    assert session.checked_multi_chunked(ops, fence, pipelined=True) == [op.path for op in ops]
    assert len(session.children("/piped/a")) == PARTITIONS
    # The first half's multis refused (a stale version in each); the second half's applied.
    other = b"y" * 1000
    sets = [SetDataOp(f"/piped/{index}", other, 5 if index < PARTITIONS // 2 else 0)
            for index in range(PARTITIONS)]
    with pytest.raises(StaleStateVersionError):
        session.checked_multi_chunked(sets, fence, pipelined=True)
    found = session.get_many(op.path for op in sets)
    assert found["/piped/0"][0] == body and found[f"/piped/{PARTITIONS - 1}"][0] == other
    with pytest.raises(ControllerMovedError):
        session.checked_multi_chunked(sets[-10:], fence + 1, pipelined=True)


def test_znode_reads_report_each_path_when_added_and_again_on_demand(sessions):
    session, writer = sessions(), sessions()
    reports: dict[str, list] = {}

    def changed(path, body, stat):
        reports.setdefault(path, []).append((body, None if stat is None else stat.version))
        return False if body == b"stop" else None

    writer.ensure_path("/read")
    paths = [f"/read/{index}" for index in range(PARTITIONS)]
    writer.multi_chunked([CreateOp(path, b"0") for path in paths[:-1]])
    reads = session.znode_reads(changed)
    reads.add(paths)
    wait_until(lambda: len(reports) == PARTITIONS, "every path's first report")
    assert reports[paths[0]] == [(b"0", 0)] and reports[paths[-1]] == [(None, None)]
    writer.multi_chunked([SetDataOp(path, b"1", 0) for path in paths[:-1]])
    writer.create(paths[-1], b"new")
    writer.delete(paths[0])
    writer.set(paths[1], b"stop")                 # its callback ends its reads
    reads.remove([paths[2]])
    reads.read_all()                              # what a reconnection does
    wait_until(lambda: all(reports[path][-1] == (b"1", 1) for path in paths[3:-1]),
               "every change read")
    assert reports[paths[-1]][-1] == (b"new", 0) and reports[paths[0]][-1] == (None, None)
    assert reports[paths[1]][-1] == (b"stop", 2) and reports[paths[2]] == [(b"0", 0)]
    writer.set(paths[1], b"after")
    reads.read_all()
    wait_until(lambda: reports[paths[3]][-1] == (b"1", 1) and len(reports[paths[3]]) == 3,
               "the second re-read")
    assert reports[paths[1]][-1][0] == b"stop", "a path its callback refused is read no more"
    reads.stop()


def test_a_controller_elects_and_reelects_thousands_of_partitions(sessions):
    brokers = {broker_id: sessions(broker_id) for broker_id in (1, 2, 3)}
    controller = Controller(brokers[1], 1).start()
    sessions.controllers.append(controller)
    wait_until(lambda: controller.is_active, "an election")
    events, view = EventQueue(), ClusterView()
    brokers[2].watch_cluster(events)
    seen: dict[tuple[str, int], PartitionState] = {}

    def states_seen(condition) -> bool:
        """What a broker's view holds: the states read and those the notices bring."""
        view.apply_all(events.drain())
        seen.update((key, state) for key, (state, _) in view.states.items())
        return len(seen) == PARTITIONS and all(condition(state) for state in seen.values())

    created_at = time.monotonic()
    brokers[1].create_topic(TopicAssignment("t", zk_paths.new_topic_id(), spread(PARTITIONS)),
                            {})
    wait_until(lambda: states_seen(lambda state: state.leader != zk_paths.NO_LEADER),
               "every state seen by another broker's watches")
    print(f"\n{PARTITIONS} partitions x RF 3 elected, seen by a broker's watches: "
          f"{time.monotonic() - created_at:.2f} s")
    assert all(seen[("t", partition)].leader == replicas[0]
               for partition, replicas in spread(PARTITIONS).items())

    gone_at = time.monotonic()
    brokers[3].close()                            # its registration goes at once
    wait_until(lambda: states_seen(lambda state: 3 not in state.isr and state.leader != 3),
               "every partition re-elected without broker 3")
    print(f"broker 3 gone: every partition without it, seen by a broker's watches, "
          f"{time.monotonic() - gone_at:.2f} s")
    for partition, replicas in spread(PARTITIONS).items():
        state = seen[("t", partition)]
        assert state.leader == next(replica for replica in replicas if replica != 3)
        assert state.leader_epoch == (1 if replicas[0] == 3 else 0)
        assert sorted(state.isr) == [1, 2]
