"""Partition reassignment's rules (shmlog.cluster.controller.reassignment) and the replication
throttle
(shmlog.cluster.replication.throttle), with plain numbers: one Kafka 2.8 rule per test, each
naming its source; the clock is a number passed in."""

from __future__ import annotations

import pytest

from shmlog.cluster.controller.reassignment import (
    MovingAssignment,
    ReassignmentStatus,
    StepKind,
    check_request,
    follower_throttled_replicas,
    leader_throttled_replicas,
    moving_assignment,
    status,
    step,
)
from shmlog.cluster.replication.throttle import ReplicationThrottle, TokenBucket
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.paths import PartitionState
from shmlog.common.errors import InvalidConfigError, InvalidReassignmentError, ZnodeFormatError
from shmlog.storage.topic_config import ALL_REPLICAS, parse_throttled_replicas

CONTROLLER_EPOCH = 7


def state(leader: int, epoch: int, *isr: int) -> PartitionState:
    return PartitionState(leader, epoch, isr, 3)


# -- KafkaController.validateReassignment / ReassignPartitionsCommand -----------------------

@pytest.mark.parametrize("request_, fault", [
    ({("t", 1): (1, 2)}, "t-1 does not exist"),
    ({("u", 0): (1, 2)}, "u-0 does not exist"),
    ({("t", 0): ()}, "empty"),
    ({("t", 0): (1, 1)}, "repeat"),
    ({("t", 0): (1, 9)}, "not registered: [9]"),
])
def test_validate_reassignment_refuses_the_request_whole(request_, fault):
    with pytest.raises(InvalidReassignmentError, match=fault.replace("[", r"\[")
                       .replace("]", r"\]")):
        # with a valid partition besides: the request is refused whole all the same
        check_request({**request_, ("v", 0): (1, 2)}, {"t": 1, "v": 1}, {1, 2, 3})


def test_validate_reassignment_takes_a_valid_request():
    check_request({("t", 0): (4, 2, 3)}, {"t": 1}, {1, 2, 3, 4})


# -- ReplicaAssignment.reassignTo -----------------------------------------------------------

@pytest.mark.parametrize("origin, target, replicas, adding, removing", [
    ((1, 2, 3), (4, 2, 3), (4, 2, 3, 1), (4,), (1,)),
    ((1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 4), (4,), ()),
    ((1, 2, 3), (2, 3), (2, 3, 1), (), (1,)),
    ((1, 2, 3), (4, 5, 6), (4, 5, 6, 1, 2, 3), (4, 5, 6), (1, 2, 3)),
    ((1, 2, 3), (3, 1, 2), (3, 1, 2), (), ()),
])
def test_reassign_to_is_target_then_the_rest_of_the_origin(origin, target, replicas, adding,
                                                           removing):
    moving = moving_assignment(origin, target)
    assert moving == MovingAssignment(replicas, adding, removing)
    assert moving.origin == tuple(sorted(origin, key=replicas.index))
    assert moving.target == target


# -- KafkaController.onPartitionReassignment, phase A ------------------------------------------

def test_phase_a_writes_the_moving_assignment_and_bumps_the_leader_epoch():
    found = step(MovingAssignment((1, 2, 3)), (4, 2, 3), state(1, 5, 1, 2, 3), {1, 2, 3, 4},
                 CONTROLLER_EPOCH)
    assert found.kind is StepKind.START
    assert found.assignment == MovingAssignment((4, 2, 3, 1), (4,), (1,))
    assert found.state == PartitionState(1, 6, (1, 2, 3), CONTROLLER_EPOCH)


def test_phase_a_resumed_by_a_new_controller_waits_without_writing():
    """initializePartitionReassignments: the topic znode holds the moving assignment."""
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (4, 2, 3), state(1, 6, 1, 2, 3),
                 {1, 2, 3, 4}, CONTROLLER_EPOCH)
    assert (found.kind, found.state) == (StepKind.WAIT, None)


def test_a_new_target_replaces_a_move_under_way():
    """reassignTo from the origin: 4 was being added, 5 replaces it; 4 leaves the ISR."""
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (5, 2, 3), state(1, 6, 1, 2, 3, 4),
                 {1, 2, 3, 4, 5}, CONTROLLER_EPOCH)
    assert found.kind is StepKind.START
    assert found.assignment == MovingAssignment((5, 2, 3, 1), (5,), (1,))
    assert found.state == PartitionState(1, 7, (1, 2, 3), CONTROLLER_EPOCH)


# -- isReassignmentComplete and phase B ----------------------------------------------------------

def test_phase_b_waits_until_every_target_replica_is_in_the_isr():
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (4, 2, 3), state(1, 6, 1, 2, 3),
                 {1, 2, 3, 4}, CONTROLLER_EPOCH)
    assert found.kind is StepKind.WAIT


def test_phase_b_keeps_a_leader_that_is_a_live_target_replica():
    found = step(MovingAssignment((2, 3, 4, 1), (4,), (1,)), (2, 3, 4), state(2, 6, 1, 2, 3, 4),
                 {1, 2, 3, 4}, CONTROLLER_EPOCH)
    assert found.kind is StepKind.COMPLETE
    assert found.assignment == MovingAssignment((2, 3, 4))
    assert found.state == PartitionState(2, 7, (2, 3, 4), CONTROLLER_EPOCH)


def test_reassign_partition_leader_election_moves_a_leader_being_removed():
    """reassignPartitionLeaderElection: the first target replica live and in the ISR."""
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (4, 2, 3), state(1, 6, 1, 2, 3, 4),
                 {1, 2, 3, 4}, CONTROLLER_EPOCH)
    assert found.state == PartitionState(4, 7, (2, 3, 4), CONTROLLER_EPOCH)


def test_reassign_partition_leader_election_skips_a_dead_target_replica():
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (4, 2, 3), state(1, 6, 1, 2, 3, 4),
                 {1, 2, 3}, CONTROLLER_EPOCH)
    assert found.state == PartitionState(2, 7, (2, 3, 4), CONTROLLER_EPOCH)


def test_phase_b_waits_while_no_target_replica_can_lead():
    found = step(MovingAssignment((4, 1), (4,), (1,)), (4,), state(1, 6, 1, 4), {1},
                 CONTROLLER_EPOCH)
    assert found.kind is StepKind.WAIT


def test_a_partition_at_its_target_completes_without_a_write():
    found = step(MovingAssignment((1, 2, 3)), (1, 2, 3), state(1, 5, 1, 2), {1, 2, 3},
                 CONTROLLER_EPOCH)
    assert (found.kind, found.assignment, found.state) == \
        (StepKind.COMPLETE, MovingAssignment((1, 2, 3)), None)


# -- cancelPartitionReassignment -------------------------------------------------------------------

def test_a_cancel_reverts_to_the_origin_at_once():
    found = step(MovingAssignment((4, 2, 3, 1), (4,), (1,)), (2, 3, 1), state(1, 6, 1, 2, 4),
                 {1, 2, 3, 4}, CONTROLLER_EPOCH)
    assert found.kind is StepKind.COMPLETE
    assert found.assignment == MovingAssignment((2, 3, 1))
    assert found.state == PartitionState(1, 7, (1, 2), CONTROLLER_EPOCH)


# -- ReassignPartitionsCommand: verify and the throttled replicas ---------------------------------

@pytest.mark.parametrize("replicas, moving, requested, verdict", [
    ((4, 2, 3), False, False, ReassignmentStatus.COMPLETE),
    ((4, 2, 3, 1), True, True, ReassignmentStatus.IN_PROGRESS),
    ((1, 2, 3), False, True, ReassignmentStatus.IN_PROGRESS),
    ((1, 2, 3), False, False, ReassignmentStatus.FAILED),
])
def test_verify_names_each_partition_complete_in_progress_or_failed(replicas, moving, requested,
                                                                  verdict):
    assert status((4, 2, 3), replicas, moving, requested) is verdict


def test_calculate_leader_and_follower_throttles():
    moves = {0: ((1, 2, 3), (4, 2, 3)), 1: ((2, 3, 1), (2, 3, 1)), 2: ((3, 1), (3, 4, 5))}
    assert leader_throttled_replicas(moves) == "0:1,0:2,0:3,2:3,2:1"
    assert follower_throttled_replicas(moves) == "0:4,2:4,2:5"


# -- the reassignment znode (ReassignPartitionsZNode) -----------------------------------------

def test_the_reassignment_znode_round_trips_and_refuses_repeats():
    request = {("t", 0): (4, 2, 3), ("t", 1): (1,)}
    assert zk_paths.decode_reassignment(zk_paths.encode_reassignment(request)) == request
    with pytest.raises(ZnodeFormatError, match="named twice"):
        zk_paths.decode_reassignment(
            b'{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]},'
            b'{"topic":"t","partition":0,"replicas":[2]}]}')
    with pytest.raises(ZnodeFormatError, match="twice"):
        zk_paths.decode_reassignment(
            b'{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,1]}]}')


def test_the_topic_znode_keeps_adding_and_removing_replicas():
    assignment = zk_paths.TopicAssignment("t", zk_paths.new_topic_id(), {0: (4, 2, 3, 1), 1: (1,)},
                                          {0: (4,)}, {0: (1,)})
    body = zk_paths.encode_topic_assignment(assignment)
    assert zk_paths.decode_topic_assignment("t", body) == assignment
    with pytest.raises(ZnodeFormatError, match="not all among"):
        zk_paths.decode_topic_assignment("t", body.replace(b'"adding_replicas":{"0":[4]}',
                                                           b'"adding_replicas":{"0":[9]}'))


# -- ReplicationQuotaManager, shouldLeaderThrottle, shouldFollowerThrottle ---------------------

def test_token_bucket_refills_at_its_rate_up_to_one_burst():
    bucket = TokenBucket(1000, now_ms=0)
    assert bucket.available(0) == 1000
    bucket.take(1500, 0)                         # a whole batch may overdraw it
    assert bucket.available(0) == 0
    assert bucket.ready_at_ms(0) == 501
    assert bucket.available(600) == 100
    assert bucket.available(10_000) == 1000


@pytest.mark.parametrize("value, parsed", [
    ("", frozenset()), ("*", ALL_REPLICAS), ("0:1, 0:2,3:4", frozenset({(0, 1), (0, 2), (3, 4)})),
])
def test_throttled_replica_list_validator(value, parsed):
    assert parse_throttled_replicas(value) == parsed


@pytest.mark.parametrize("value", ["0", "a:1", "0:1,x", "0-1"])
def test_throttled_replica_list_validator_refuses(value):
    with pytest.raises(InvalidConfigError):
        parse_throttled_replicas(value)


def throttle(broker_id: int = 1) -> ReplicationThrottle:
    made = ReplicationThrottle(broker_id)
    made.set_rates({"leader.replication.throttled.rate": "1000",
                    "follower.replication.throttled.rate": "500"}, 0)
    made.set_topic("t", {"leader.replication.throttled.replicas": "0:1",
                         "follower.replication.throttled.replicas": "0:1"})
    return made


def test_should_leader_throttle_only_a_listed_replica_out_of_sync_past_its_quota():
    quota = throttle()
    assert quota.leader_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 1000
    quota.leader_sent("t", 0, False, 1200, 0)
    assert quota.leader_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 0
    assert quota.leader_budget("t", 0, in_sync=True, max_bytes=4096, now_ms=0) == 4096
    assert quota.leader_budget("t", 1, in_sync=False, max_bytes=4096, now_ms=0) == 4096
    assert quota.leader_budget("u", 0, in_sync=False, max_bytes=4096, now_ms=0) == 4096
    assert quota.leader_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=400) == 200


def test_should_follower_throttle_by_its_own_rate_and_list():
    quota = throttle()
    assert quota.follower_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 500
    quota.follower_received("t", 0, False, 500, 0)
    assert quota.follower_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 0
    assert quota.follower_ready_at_ms(0) == 2
    assert throttle(2).follower_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 4096


def test_without_a_rate_nothing_is_throttled():
    quota = throttle()
    quota.set_rates({}, 0)
    assert quota.rates == (None, None)
    assert quota.leader_budget("t", 0, in_sync=False, max_bytes=4096, now_ms=0) == 4096
    assert quota.follower_ready_at_ms(0) is None
