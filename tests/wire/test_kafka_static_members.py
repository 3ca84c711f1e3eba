"""Static membership over Kafka's protocol (``group.instance.id``, KIP-345): a
librdkafka member closed and started again with its instance id gets its partitions
back while the other member is not rebalanced (same generation, no revocation); a
second process with the same instance id fences the first (a fatal error in
librdkafka); a kafka-python static member restarts the same way; and on raw sockets,
FENCED_INSTANCE_ID for every request of a replaced member, DescribeGroups naming the
instance ids, LeaveGroup v3 by instance id.

Method: one broker process with a Kafka listener, no initial rebalance delay; records
put with shmlog's Producer; clients polled in turn from this thread (a static member
sends no LeaveGroup on close, so a restart is only a join); the group's generation
read with the ``describe_group`` control request; every wait bounded.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import KafkaError as ClientError
from kafka import KafkaConsumer
from kafka.protocol.admin.groups import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from helpers import kafka_broker_process
from kafka_clients.raw import RawConnection
from shmlog import Admin, Producer
from shmlog.protocol.control_client import request

WAIT_S = 30.0
SESSION_MS = 30_000           # a restart comes back well within it
FENCED_INSTANCE_ID = 82
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27


@pytest.fixture(scope="module")
def static_broker(tmp_path_factory):
    """(data directory, "host:port"): groups rebalance at once (no initial delay)."""
    with kafka_broker_process(str(tmp_path_factory.mktemp("kafka-static") / "data"),
                              group_initial_rebalance_delay_ms=0) as served:
        yield served


def _topic(data_dir: str, partitions: int = 4) -> str:
    topic = f"static-{uuid.uuid4().hex[:8]}"
    Admin(data_dir).create_topic(topic, partitions)
    with Producer(data_dir) as producer:
        for partition in range(partitions):
            producer.send(topic, b"%d" % partition, partition=partition)
        producer.flush(timeout=WAIT_S)
    return topic


def _described(data_dir: str, group: str) -> tuple[int, dict]:
    """The group's generation and {instance id: assigned partitions}."""
    described = request(data_dir, "describe_group", group_id=group)
    return described["generation"], {
        member["group_instance_id"]: {partition for _, partition in member["assignment"]}
        for member in described["members"]}


# -- librdkafka ----------------------------------------------------------------------

class _Member:
    """A librdkafka consumer with a group.instance.id, and what it was told."""

    def __init__(self, address: str, group: str, topic: str, instance: str):
        self.consumer = KafkaClientConsumer({
            "bootstrap.servers": address, "group.id": group, "group.instance.id": instance,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300,
            "error_cb": lambda error: self.errors.append(error)})
        self.revoked: list[set[int]] = []
        self.errors: list = []              # from poll and from error_cb
        self.consumer.subscribe([topic], on_revoke=lambda consumer, partitions:
                                self.revoked.append({p.partition for p in partitions}))

    def poll(self) -> None:
        message = self.consumer.poll(0.05)
        if message is not None and message.error() is not None:
            self.errors.append(message.error())

    def held(self) -> set[int]:
        return {partition.partition for partition in self.consumer.assignment()}

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:            # noqa: BLE001 - a fenced consumer may refuse
            pass


def _poll_until(members, condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        for member in members:
            member.poll()


def _split(members) -> bool:
    held = [member.held() for member in members]
    return all(held) and set().union(*held) == {0, 1, 2, 3} and sum(map(len, held)) == 4


def test_a_restarted_librdkafka_member_gets_its_partitions_back_and_nobody_rebalances(
        static_broker):
    data_dir, address = static_broker
    topic, group = _topic(data_dir), f"static-{uuid.uuid4().hex[:8]}"
    a, b = (_Member(address, group, topic, instance) for instance in "ab")
    replacement = None
    try:
        _poll_until([a, b], lambda: _split([a, b]) and
                    _described(data_dir, group)[1].keys() == {"a", "b"}, "a split")
        generation, before = _described(data_dir, group)
        held_a, held_b, revoked_b = a.held(), b.held(), len(b.revoked)
        assert before == {"a": held_a, "b": held_b}
        a.close()                           # a static member sends no LeaveGroup
        replacement = _Member(address, group, topic, "a")
        _poll_until([replacement, b], lambda: replacement.held() == held_a, "a back")
        for _ in range(20):                 # b goes on heartbeating, untouched
            b.poll()
        assert _described(data_dir, group) == (generation, before)
        assert b.held() == held_b and len(b.revoked) == revoked_b
    finally:
        for member in (a, b, replacement):
            if member is not None:
                member.close()


def test_a_second_librdkafka_process_with_the_same_instance_id_fences_the_first(
        static_broker):
    data_dir, address = static_broker
    topic, group = _topic(data_dir), f"fenced-{uuid.uuid4().hex[:8]}"
    a, b = (_Member(address, group, topic, instance) for instance in "ab")
    second = None
    try:
        _poll_until([a, b], lambda: _split([a, b]), "a split")
        generation, before = _described(data_dir, group)
        second = _Member(address, group, topic, "a")
        # librdkafka raises FENCED_INSTANCE_ID as a fatal error (code _FATAL; the
        # text names the cause): the process must stop
        _poll_until([second, a, b], lambda: any(
            error.code() == ClientError._FATAL and "fenced" in error.str()
            for error in a.errors), "the first process fenced")
        _poll_until([second, b], lambda: second.held() == before["a"], "the second serving")
        assert _described(data_dir, group) == (generation, before)
    finally:
        for member in (a, b, second):
            if member is not None:
                member.close()


# -- kafka-python --------------------------------------------------------------------

def test_a_restarted_kafka_python_member_gets_its_partitions_back(static_broker):
    data_dir, address = static_broker
    topic, group = _topic(data_dir), f"python-{uuid.uuid4().hex[:8]}"

    def python_member() -> KafkaConsumer:
        consumer = KafkaConsumer(bootstrap_servers=address, group_id=group,
                                 group_instance_id="python", enable_auto_commit=False,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300,
                                 auto_offset_reset="earliest")
        consumer.subscribe([topic])
        return consumer

    def held(consumer: KafkaConsumer) -> set[int]:
        return {partition.partition for partition in consumer.assignment()}

    other = _Member(address, group, topic, "other")
    first = python_member()
    second = None
    try:
        _poll_until([other], lambda: first.poll(timeout_ms=50) is not None and
                    held(first) and other.held() and
                    len(held(first) | other.held()) == 4, "a split")
        generation, before = _described(data_dir, group)
        assert before == {"python": held(first), "other": other.held()}
        first.close()                        # a static member sends no LeaveGroup
        second = python_member()
        _poll_until([other], lambda: second.poll(timeout_ms=50) is not None and
                    held(second) == before["python"], "the member back")
        assert _described(data_dir, group) == (generation, before)
    finally:
        other.close()
        for consumer in (first, second):
            if consumer is not None:
                consumer.close()


# -- raw sockets ---------------------------------------------------------------------

def _join(raw: RawConnection, group: str, topic: str, instance: str, member_id: str = ""):
    subscription = bytes(ConsumerProtocolSubscription(version=0, topics=[topic],
                                                      user_data=None).encode(version=0))
    joined = raw.ask(JoinGroupRequest(
        version=5, group_id=group, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=SESSION_MS, member_id=member_id, group_instance_id=instance,
        protocol_type="consumer", protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
            name="range", metadata=subscription)]), JoinGroupResponse, 5)
    return joined


def _sync(raw: RawConnection, group: str, joined, instance: str):
    synced = raw.ask(SyncGroupRequest(version=3, group_id=group,
                                      generation_id=joined.generation_id,
                                      member_id=joined.member_id, group_instance_id=instance,
                                      assignments=[]), SyncGroupResponse, 3)
    if synced.error_code:
        return synced.error_code, None
    assigned = ConsumerProtocolAssignment.decode(synced.assignment).assigned_partitions
    return 0, {partition for entry in assigned for partition in entry.partitions}


def test_a_replaced_member_is_fenced_on_every_request_and_a_static_member_leaves_by_instance(
        static_broker):
    data_dir, address = static_broker
    topic, group = _topic(data_dir, partitions=2), f"raw-{uuid.uuid4().hex[:8]}"
    raw = RawConnection(address, WAIT_S)
    try:
        first = _join(raw, group, topic, "i")
        assert first.error_code == 0
        assert _sync(raw, group, first, "i") == (0, {0, 1})
        again = _join(raw, group, topic, "i")          # a restart: the same generation
        assert (again.error_code, again.generation_id) == (0, first.generation_id)
        assert again.member_id != first.member_id
        assert _sync(raw, group, again, "i") == (0, {0, 1})
        # the member it replaced, whatever it sends
        assert _sync(raw, group, first, "i")[0] == FENCED_INSTANCE_ID
        assert raw.ask(HeartbeatRequest(version=3, group_id=group,
                                        generation_id=first.generation_id,
                                        member_id=first.member_id, group_instance_id="i"),
                       HeartbeatResponse, 3).error_code == FENCED_INSTANCE_ID
        committed = raw.ask(OffsetCommitRequest(
            version=7, group_id=group, generation_id_or_member_epoch=first.generation_id,
            member_id=first.member_id, group_instance_id="i", topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
                    OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                        committed_metadata="")])]), OffsetCommitResponse, 7)
        assert committed.topics[0].partitions[0].error_code == FENCED_INSTANCE_ID
        assert _join(raw, group, topic, "i", first.member_id).error_code == FENCED_INSTANCE_ID
        described = raw.ask(DescribeGroupsRequest(version=4, groups=[group],
                                                  include_authorized_operations=False),
                            DescribeGroupsResponse, 4)
        assert [(member.member_id, member.group_instance_id)
                for member in described.groups[0].members] == [(again.member_id, "i")]
        left = raw.ask(LeaveGroupRequest(version=3, group_id=group, members=[
            LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="i"),
            LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="nobody")]),
            LeaveGroupResponse, 3)
        assert [(member.group_instance_id, member.error_code) for member in left.members] == \
            [("i", 0), ("nobody", UNKNOWN_MEMBER_ID)]
        assert request(data_dir, "describe_group", group_id=group)["members"] == []
    finally:
        raw.close()
