"""Static membership (``group.instance.id``) across a cluster's brokers: a Kafka
member's requests go to whichever broker it asked (each forwards to the group's
coordinator), so the instance id must travel with the forwarded join, sync,
heartbeat and leave. A member joined through one broker and restarted through
another is back in the same generation with the same partitions; the process it
replaced is fenced (FENCED_INSTANCE_ID) through the first broker; the member leaves
by instance id through the third.

Method: the shared cluster (three brokers, each with a Kafka listener); raw
connections to each broker speaking kafka-python's message classes; every wait
bounded.
"""

from __future__ import annotations

import time
import uuid

from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from cluster.workload import WAIT_S
from kafka_clients.raw import RawConnection
from shmlog import Admin

SESSION_MS = 30_000
FENCED_INSTANCE_ID = 82
COORDINATOR_ERRORS = (14, 15, 16)   # load in progress, not available, not coordinator


def _join(raw: RawConnection, group: str, topic: str):
    """A static join of instance "i" (retried while the coordinator is not ready)."""
    subscription = bytes(ConsumerProtocolSubscription(version=0, topics=[topic],
                                                      user_data=None).encode(version=0))
    deadline = time.monotonic() + WAIT_S
    while True:
        joined = raw.ask(JoinGroupRequest(
            version=5, group_id=group, session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=SESSION_MS, member_id="", group_instance_id="i",
            protocol_type="consumer", protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                name="range", metadata=subscription)]), JoinGroupResponse, 5)
        if joined.error_code not in COORDINATOR_ERRORS:
            assert joined.error_code == 0
            return joined
        assert time.monotonic() < deadline, f"no coordinator in {WAIT_S} s"
        time.sleep(0.2)


def _assigned(raw: RawConnection, group: str, joined) -> set[int]:
    synced = raw.ask(SyncGroupRequest(version=3, group_id=group,
                                      generation_id=joined.generation_id,
                                      member_id=joined.member_id, group_instance_id="i",
                                      assignments=[]), SyncGroupResponse, 3)
    assert synced.error_code == 0
    assigned = ConsumerProtocolAssignment.decode(synced.assignment).assigned_partitions
    return {partition for entry in assigned for partition in entry.partitions}


def test_a_static_member_restarts_through_another_broker_and_the_old_one_is_fenced(
        fault_cluster):
    cluster = fault_cluster
    topic, group = f"static-{uuid.uuid4().hex[:8]}", f"static-{uuid.uuid4().hex[:8]}"
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(topic, 2)
    one, two, three = (RawConnection(cluster.kafka_address(broker_id), WAIT_S)
                       for broker_id in (1, 2, 3))
    try:
        first = _join(one, group, topic)
        assert _assigned(one, group, first) == {0, 1}
        again = _join(two, group, topic)                 # restarted, through broker 2
        assert again.generation_id == first.generation_id
        assert again.member_id != first.member_id
        assert _assigned(two, group, again) == {0, 1}
        fenced = one.ask(HeartbeatRequest(version=3, group_id=group,
                                          generation_id=first.generation_id,
                                          member_id=first.member_id, group_instance_id="i"),
                         HeartbeatResponse, 3)
        assert fenced.error_code == FENCED_INSTANCE_ID
        left = three.ask(LeaveGroupRequest(version=3, group_id=group, members=[
            LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="i")]),
            LeaveGroupResponse, 3)
        assert [(member.group_instance_id, member.error_code) for member in left.members] == \
            [("i", 0)]
    finally:
        for raw in (one, two, three):
            raw.close()
