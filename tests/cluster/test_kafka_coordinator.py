"""A cluster's group coordinators as Kafka clients see them: FindCoordinator asked of
any broker names the leader of the group's ``__consumer_offsets`` partition, at its
listener; a group request sent to another broker anyway is forwarded to the
coordinator and answered with its outcome: a LeaveGroup says, member by member,
whether the coordinator knew it (a forward is answered when it returns, not at once).

Method: the shared fault cluster (each broker has a listener); requests encoded and
responses decoded with kafka-python's message classes on raw connections, one per
broker; one member joined through broker 1; every wait bounded.
"""

from __future__ import annotations

import time
import uuid

from kafka.protocol.consumer.group import (
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
)
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)

from cluster.workload import WAIT_S
from kafka_clients.raw import RawConnection
from shmlog import Admin
from shmlog.groups import OFFSETS_TOPIC, offsets_partition

COORDINATOR_NOT_AVAILABLE = 15
UNKNOWN_MEMBER_ID = 25
GROUP_ID_NOT_FOUND = 69
LEAVE_VERSION = 3                  # the first with a list of members
FIND_VERSION = 3


def leave(raw: RawConnection, group: str, *member_ids: str) -> list[tuple[str, int]]:
    request = LeaveGroupRequest(
        version=LEAVE_VERSION, group_id=group,
        members=[LeaveGroupRequest.MemberIdentity(member_id=member_id, group_instance_id=None)
                 for member_id in member_ids])
    answer = raw.ask(request, LeaveGroupResponse, LEAVE_VERSION)
    assert answer.error_code == 0
    return [(member.member_id, member.error_code) for member in answer.members]


def join(raw: RawConnection, group: str) -> str:
    subscription = bytes(ConsumerProtocolSubscription(version=0, topics=["absent"],
                                                      user_data=None).encode(version=0))
    request = JoinGroupRequest(
        version=5, group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
        member_id="", group_instance_id=None, protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                             metadata=subscription)])
    deadline = time.monotonic() + WAIT_S
    joined = raw.ask(request, JoinGroupResponse, 5)
    while joined.error_code == COORDINATOR_NOT_AVAILABLE and time.monotonic() < deadline:
        time.sleep(0.2)                  # the offsets topic is being made: clients retry
        joined = raw.ask(request, JoinGroupResponse, 5)
    assert joined.error_code == 0 and joined.member_id
    return joined.member_id


def test_a_leave_through_any_broker_gets_the_coordinators_answer(fault_cluster):
    group = f"forwarded-{uuid.uuid4().hex[:8]}"
    connections = {broker_id: RawConnection(fault_cluster.kafka_address(broker_id), WAIT_S)
                   for broker_id in range(1, fault_cluster.count + 1)}
    try:
        member = join(connections[1], group)       # (the coordinator exists from here)
        for raw in connections.values():
            assert leave(raw, f"{group}-none", "nobody") == [("nobody", GROUP_ID_NOT_FOUND)]
        for raw in connections.values():          # two of the three forward
            assert leave(raw, group, "nobody") == [("nobody", UNKNOWN_MEMBER_ID)]
        assert leave(connections[2], group, member, "nobody") == \
            [(member, 0), ("nobody", UNKNOWN_MEMBER_ID)]
        assert Admin(fault_cluster.data_dir(1)).describe_consumer_group(group)["members"] == []
    finally:
        for raw in connections.values():
            raw.close()


def find_coordinator(raw: RawConnection, group: str):
    """FindCoordinator's answer, asked again while the coordinator is not available
    (the offsets topic being made, its leaders being elected), as clients do."""
    request = FindCoordinatorRequest(version=FIND_VERSION, key=group, key_type=0)
    deadline = time.monotonic() + WAIT_S
    found = raw.ask(request, FindCoordinatorResponse, FIND_VERSION)
    while found.error_code == COORDINATOR_NOT_AVAILABLE and time.monotonic() < deadline:
        time.sleep(0.2)
        found = raw.ask(request, FindCoordinatorResponse, FIND_VERSION)
    assert found.error_code == 0, found
    return found.node_id, f"{found.host}:{found.port}"


def test_every_broker_names_the_leader_of_the_groups_offsets_partition(fault_cluster):
    groups = [f"coordinated-{index}-{uuid.uuid4().hex[:6]}" for index in range(6)]
    connections = {broker_id: RawConnection(fault_cluster.kafka_address(broker_id), WAIT_S)
                   for broker_id in range(1, fault_cluster.count + 1)}
    try:
        named = {group: {find_coordinator(raw, group) for raw in connections.values()}
                 for group in groups}
        described = Admin(fault_cluster.data_dir(1)).describe_topic(OFFSETS_TOPIC)
        leaders = {entry["partition"]: entry["leader"] for entry in described["partitions"]}
        for group, answers in named.items():
            assert len(answers) == 1, f"brokers disagree on {group}'s coordinator: {answers}"
            ((node_id, address),) = answers
            assert node_id == leaders[offsets_partition(group, len(leaders))]
            assert address == fault_cluster.kafka_address(node_id)
    finally:
        for raw in connections.values():
            raw.close()
