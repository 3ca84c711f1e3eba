"""State-change notices (shmlog.cluster.zk.state_changes): what a multi writing
partition states announces, how a broker's view and the controller's cache take a
notice in, and what a malformed one costs."""

from __future__ import annotations

import pytest

from shmlog.cluster.controller.controller_context import StateCache
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk import state_changes
from shmlog.cluster.zk.events import EventKind, WatchEvent
from shmlog.cluster.zk.paths import PartitionState, TopicAssignment
from shmlog.cluster.zk.session import DeleteOp, chunk_ops, op_size
from shmlog.cluster.zk.view import ClusterView, PartitionStateChanged
from shmlog.common import limits
from shmlog.common.errors import ZnodeFormatError

TOPIC_ID = "0123456789abcdef0123456789abcdef"
OLD_ID = "fedcba9876543210fedcba9876543210"


def notice_event(*ops, sequence=1) -> WatchEvent:
    """What a broker's watch queues for the notice of ``ops``' multi."""
    notice = state_changes.notice_op(ops)
    assert notice.path == state_changes.STATE_CHANGE_PREFIX and notice.sequential
    return WatchEvent(EventKind.PARTITION_STATES, state_changes.STATE_CHANGES_PATH,
                      state_changes.decode_notice(notice.body), sequence)


def topic_event(topic_id=TOPIC_ID) -> WatchEvent:
    assignment = TopicAssignment("t", topic_id, {0: (1, 2, 3), 1: (2, 3, 1)})
    return WatchEvent(EventKind.TOPIC, "t", zk_paths.encode_topic_assignment(assignment), 0)


def test_a_notice_names_each_state_written_with_the_version_it_then_has():
    elected = PartitionState(2, 1, (2, 3), 4)
    created = PartitionState(1, 0, (1, 2, 3), 4)
    ops = [state_changes.state_set_op("t", TOPIC_ID, 0, elected, 6),
           DeleteOp("/admin/preferred_replica_election"),          # no notice of its own
           state_changes.state_create_op("t", TOPIC_ID, 1, created)]
    changes = notice_event(*ops).body
    assert changes == (state_changes.StateChange("t", TOPIC_ID, 0, elected, 7),
                       state_changes.StateChange("t", TOPIC_ID, 1, created, 0))
    # The state inside is the znode's body as written.
    assert ops[0].body == zk_paths.encode_partition_state(elected)
    assert state_changes.notice_op([DeleteOp("/x")]) is None, "no state written, no notice"


def test_an_op_with_a_notice_counts_twice_so_a_multi_and_its_notice_fit():
    op = state_changes.state_set_op("t", TOPIC_ID, 0, PartitionState(1, 0, (1,), 1), 0)
    alone = len(op.path) + len(op.body) + limits.ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE
    assert op_size(op) == 2 * alone
    ops = [state_changes.state_set_op("t", TOPIC_ID, partition,
                                      PartitionState(1, 0, (1, 2, 3), 1), 3)
           for partition in range(20_000)]
    for chunk in chunk_ops(ops):
        notice = state_changes.notice_op(chunk)
        written = sum(len(op.path) + len(op.body) for op in chunk) + len(notice.body)
        assert written < limits.ZOOKEEPER_MULTI_SIZE_MAX


def test_the_view_takes_a_notices_states_only_for_the_topic_incarnation_it_holds():
    view = ClusterView()
    view.apply(topic_event())
    state = PartitionState(2, 1, (2, 3), 4)
    assert view.apply(notice_event(state_changes.state_set_op("t", TOPIC_ID, 0, state, 0))) == \
        [PartitionStateChanged("t", 0, state, 1)]
    # The same notice again (a reconnection's listing), and an older state: no news.
    assert view.apply(notice_event(state_changes.state_set_op("t", TOPIC_ID, 0, state, 0))) == []
    assert view.apply(notice_event(state_changes.state_create_op("t", TOPIC_ID, 0, state))) == []
    # A notice of the topic's earlier incarnation, read late, changes nothing.
    stale = PartitionState(3, 9, (3,), 4)
    assert view.apply(notice_event(state_changes.state_set_op("t", OLD_ID, 1, stale, 8))) == []
    assert view.state("t", 1) is None
    # A notice of a topic not known yet is left to the topic's own first read.
    assert view.apply(notice_event(state_changes.state_create_op("u", TOPIC_ID, 0, state))) == []


def test_the_controllers_cache_takes_a_notice_and_names_its_brokers():
    cache = StateCache()
    cache.watched([topic_event()])
    assignment = TopicAssignment("t", TOPIC_ID, {0: (1, 2, 3), 1: (2, 3, 1)})
    cache.remember(assignment, {0: (PartitionState(1, 0, (1, 2, 3), 4), 0),
                                1: (PartitionState(2, 0, (2, 3, 1), 4), 0)})
    named = cache.watched([notice_event(
        state_changes.state_set_op("t", TOPIC_ID, 0, PartitionState(2, 1, (2, 3), 4), 0))])
    assert named == {2, 3}
    assert cache.states(assignment)[0] == (PartitionState(2, 1, (2, 3), 4), 1)
    # An old incarnation's notice is not taken.
    assert cache.watched([notice_event(
        state_changes.state_set_op("t", OLD_ID, 1, PartitionState(5, 9, (5,), 4), 3))]) == set()
    assert cache.states(assignment)[1] == (PartitionState(2, 0, (2, 3, 1), 4), 0)


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"version":2,"states":[]}', b'{"version":1}',
    b'{"version":1,"states":[["t","id",0,1]]}',
    b'{"version":1,"states":[["t","id",-1,1,{}]]}',
    b'{"version":1,"states":[["t","id",0,true,{}]]}',
    b'{"version":1,"states":[["t","id",0,1,{"version":1,"leader":5,"leader_epoch":0,'
    b'"isr":[1],"controller_epoch":1}]]}',                       # the leader not in its ISR
])
def test_a_malformed_notice_is_a_typed_error(body):
    with pytest.raises(ZnodeFormatError):
        state_changes.decode_notice(body, "/state_changes/change-0000000001")


def test_notice_names_give_their_sequence_and_state_paths_are_known():
    assert state_changes.notice_sequence("change-0000000042") == 42
    assert state_changes.notice_sequence("stray") is None
    assert state_changes.notice_sequence("change-") is None
    assert state_changes.is_state_path(zk_paths.partition_state_path("t", 3))
    assert not state_changes.is_state_path(zk_paths.topic_path("t"))
