"""Every version of the group APIs the Kafka listener advertises, on raw sockets
(JoinGroup 0-9 with SyncGroup, Heartbeat and LeaveGroup, DescribeGroups 0-5 and
ListGroups 0-4, OffsetCommit 2-8 with OffsetFetch 1-7); a member removed once it stops
heartbeating; joins the coordinator cannot honour refused with Kafka's codes; and a
kafka-python group of two members splitting a topic and committing.

Method: one broker process per module with a Kafka listener on a free loopback port,
no initial rebalance delay and a low minimum session timeout (so a silent member
goes within seconds); requests encoded, and responses decoded, with kafka-python's
message classes; data put with shmlog's own Producer. Every wait is bounded; each
test uses its own topic and group.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest
from kafka import KafkaConsumer as PythonConsumer
from kafka import TopicPartition as PythonPartition
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.protocol.admin.groups import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)
from kafka.structs import OffsetAndMetadata

from helpers import kafka_broker_process
from kafka_clients.raw import RawConnection
from shmlog import Admin, Producer
from shmlog.wire.group_apis import COORDINATOR_LEADER

WAIT_S = 20.0
# A session short enough that a silent member goes quickly (the broker's minimum is
# lowered to allow it).
SHORT_SESSION_MS = 1_500


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """(data directory, "host:port"): a broker serving Kafka, groups without delay."""
    with kafka_broker_process(str(tmp_path_factory.mktemp("kafka-group-versions") / "data"),
                              group_initial_rebalance_delay_ms=0,
                              group_min_session_timeout_ms=1_000) as broker:
        yield broker


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic_with_data(data_dir: str, partitions: int = 4, records: int = 3) -> str:
    """A new topic of ``partitions``, each with ``records`` records (shmlog's Producer)."""
    topic = _name("groups")
    Admin(data_dir).create_topic(topic, partitions)
    with Producer(data_dir) as producer:
        for partition in range(partitions):
            for index in range(records):
                producer.send(topic, f"{partition}-{index}".encode(), partition=partition)
        producer.flush(timeout=WAIT_S)
    return topic


def _wait_for(condition, poll=lambda: None, what="the condition"):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        poll()
        time.sleep(0.02)


def _split(assignments: list[set]) -> bool:
    """Whether every member holds something and together they hold 4 partitions once."""
    union = set().union(*assignments)
    return all(assignments) and len(union) == 4 == sum(len(held) for held in assignments)


# -- kafka-python --------------------------------------------------------------------

class _PythonMember(threading.Thread):
    """A kafka-python consumer polled on a thread of its own (its methods are not
    for two threads at once): :meth:`call` runs a function on that thread."""

    def __init__(self, address: str, group: str, topic: str, name: str):
        super().__init__(daemon=True)
        self.consumer = PythonConsumer(topic, bootstrap_servers=address, group_id=group,
                                       client_id=name, enable_auto_commit=False,
                                       session_timeout_ms=30_000, heartbeat_interval_ms=500)
        self.calls: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.assigned: set[int] = set()
        self.poll_errors: list = []
        self.start()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    call, answer = self.calls.get_nowait()
                    try:
                        answer.put((True, call(self.consumer)))
                    except Exception as error:      # noqa: BLE001 - handed to the caller
                        answer.put((False, error))
                except queue.Empty:
                    pass
                try:
                    self.consumer.poll(timeout_ms=100)
                except KafkaError as error:
                    # What a poll raises for the APIs not served yet (Fetch, ListOffsets)
                    # must not end the member: its group membership is what is tested.
                    self.poll_errors.append(error)
                self.assigned = {partition.partition
                                 for partition in self.consumer.assignment()}
        finally:
            self.consumer.close()

    def call(self, function):
        answer: queue.Queue = queue.Queue()
        self.calls.put((function, answer))
        done, value = answer.get(timeout=WAIT_S)
        if not done:
            raise value
        return value

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=WAIT_S)


def _commit_until_stable(member: _PythonMember, offsets: dict) -> None:
    """Commit through ``member`` (kafka-python refuses while its group rebalances:
    a leader rejoins once its metadata catches up with what it assigned)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            member.call(lambda consumer: consumer.commit(offsets))
            return
        except (RebalanceInProgressError, CommitFailedError):
            assert time.monotonic() < deadline, "the group never settled for a commit"
            time.sleep(0.1)


def test_a_kafka_python_group_splits_the_partitions_and_commits(broker):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir), _name("kafka-python")
    # Committed positions first, so the members start from them (ListOffsets is not
    # served yet): a commit of a consumer with no group membership (generation -1).
    simple = PythonConsumer(bootstrap_servers=address, group_id=group,
                            enable_auto_commit=False, request_timeout_ms=10_000)
    try:
        simple.assign([PythonPartition(topic, partition) for partition in range(4)])
        simple.commit({PythonPartition(topic, partition): OffsetAndMetadata(0, "", -1)
                       for partition in range(4)})
    finally:
        simple.close()
    members = [_PythonMember(address, group, topic, name) for name in ("one", "two")]
    try:
        _wait_for(lambda: _split([member.assigned for member in members]),
                  what="two kafka-python members holding 4 partitions")
        owned = PythonPartition(topic, min(members[0].assigned))
        _commit_until_stable(members[0], {owned: OffsetAndMetadata(3, "done", -1)})
        committed = members[0].call(lambda consumer: consumer.committed(owned, metadata=True))
        assert (committed.offset, committed.metadata, committed.leader_epoch) == \
            (3, "done", -1)
        assert Admin(data_dir).list_consumer_group_offsets(group)[(topic, owned.partition)] \
            == (3, "done")
    finally:
        for member in members:
            member.stop()
    _wait_for(lambda: not Admin(data_dir).describe_consumer_group(group)["members"],
              what="both kafka-python members to leave at close")


# -- raw requests: every version served ------------------------------------------------

def _subscription(topic: str) -> bytes:
    return bytes(ConsumerProtocolSubscription(version=0, topics=[topic], user_data=None)
                 .encode(version=0))


def _join(raw: RawConnection, group: str, topic: str, version: int, member_id: str = "",
          session_ms: int = 10_000, **fields):
    request = JoinGroupRequest(
        version=version, group_id=group, session_timeout_ms=session_ms,
        rebalance_timeout_ms=session_ms, member_id=member_id,
        group_instance_id=fields.pop("group_instance_id", None),
        protocol_type=fields.pop("protocol_type", "consumer"), reason=None,
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                             metadata=_subscription(topic))])
    return raw.ask(request, JoinGroupResponse, version)


def _join_as_new_member(raw: RawConnection, group: str, topic: str, version: int, **fields):
    """Join as a new member (the coordinator names it); the JoinGroup response."""
    joined = _join(raw, group, topic, version, **fields)
    assert joined.error_code == 0 and joined.member_id
    return joined


@pytest.mark.parametrize("version", range(10))
def test_a_member_joins_syncs_heartbeats_and_leaves_at_every_version(broker, version):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir, partitions=2, records=1), _name("raw")
    raw = RawConnection(address)
    try:
        find_version = min(version, 3)
        found = raw.ask(FindCoordinatorRequest(version=find_version, key=group, key_type=0),
                        FindCoordinatorResponse, find_version)
        assert found.error_code == 0 and found.node_id == 0
        joined = _join_as_new_member(raw, group, topic, version)
        # The coordinator assigns: the leader named is no member, so no client assigns.
        assert joined.leader == COORDINATOR_LEADER and joined.members == []
        assert joined.protocol_name == "range" and joined.generation_id >= 1
        sync_version = min(version, 5)
        synced = raw.ask(SyncGroupRequest(
            version=sync_version, group_id=group, generation_id=joined.generation_id,
            member_id=joined.member_id, group_instance_id=None, protocol_type="consumer",
            protocol_name="range", assignments=[]), SyncGroupResponse, sync_version)
        assert synced.error_code == 0
        assert ConsumerProtocolAssignment.decode(synced.assignment).assigned_partitions[0] \
            .partitions == [0, 1]
        beat_version = min(version, 4)
        beat = raw.ask(HeartbeatRequest(version=beat_version, group_id=group,
                                        generation_id=joined.generation_id,
                                        member_id=joined.member_id, group_instance_id=None),
                       HeartbeatResponse, beat_version)
        assert beat.error_code == 0
        leave_version = min(version, 5)
        left = raw.ask(LeaveGroupRequest(
            version=leave_version, group_id=group, member_id=joined.member_id,
            members=[LeaveGroupRequest.MemberIdentity(member_id=joined.member_id,
                                                      group_instance_id=None, reason="done")]),
            LeaveGroupResponse, leave_version)
        assert left.error_code == 0
        if leave_version >= 3:
            assert [(m.member_id, m.error_code) for m in left.members] == \
                [(joined.member_id, 0)]
        assert Admin(data_dir).describe_consumer_group(group)["members"] == []
    finally:
        raw.close()


@pytest.mark.parametrize("version", range(6))
def test_describe_and_list_groups_at_every_version(broker, version):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir, partitions=2, records=1), _name("listed")
    raw = RawConnection(address)
    try:
        joined = _join_as_new_member(raw, group, topic, 5)
        described = raw.ask(DescribeGroupsRequest(version=version, groups=[group, "no-such"],
                                                  include_authorized_operations=False),
                            DescribeGroupsResponse, version)
        mine, missing = described.groups
        assert (mine.error_code, mine.group_state, mine.protocol_type, mine.protocol_data) == \
            (0, "Stable", "consumer", "range")
        [member] = mine.members
        assert (member.member_id, member.client_id, member.client_host) == \
            (joined.member_id, "test", "127.0.0.1")
        assert ConsumerProtocolSubscription.decode(member.member_metadata).topics == [topic]
        assert ConsumerProtocolAssignment.decode(member.member_assignment) \
            .assigned_partitions[0].partitions == [0, 1]
        assert (missing.error_code, missing.group_state, missing.members) == (0, "Dead", [])
        list_version = min(version, 4)
        listed = raw.ask(ListGroupsRequest(version=list_version, states_filter=["Stable"]),
                         ListGroupsResponse, list_version)
        assert listed.error_code == 0
        entry = {g.group_id: g for g in listed.groups}[group]
        assert entry.protocol_type == "consumer"
        if list_version >= 4:
            assert entry.group_state == "Stable"
            empty = raw.ask(ListGroupsRequest(version=4, states_filter=["Empty"]),
                            ListGroupsResponse, 4)
            assert group not in {g.group_id for g in empty.groups}
    finally:
        raw.close()


@pytest.mark.parametrize("version", range(2, 9))
def test_offset_commit_then_offset_fetch_at_every_version(broker, version):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir, partitions=2, records=5), _name("offsets")
    raw = RawConnection(address)
    commit_partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    try:
        committed = raw.ask(OffsetCommitRequest(
            version=version, group_id=group, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, retention_time_ms=-1,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
                commit_partition(partition_index=1, committed_offset=4,
                                 committed_leader_epoch=7, committed_metadata=f"v{version}")
            ])]), OffsetCommitResponse, version)
        assert [(p.partition_index, p.error_code) for t in committed.topics
                for p in t.partitions] == [(1, 0)]
        fetch_version = version - 1                       # 1 to 7
        fetched = raw.ask(OffsetFetchRequest(
            version=fetch_version, group_id=group, require_stable=False,
            topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic,
                                                               partition_indexes=[0, 1])]),
            OffsetFetchResponse, fetch_version)
        answers = {p.partition_index: p for t in fetched.topics for p in t.partitions}
        assert (answers[0].committed_offset, answers[0].error_code) == (-1, 0)
        assert (answers[1].committed_offset, answers[1].metadata) == (4, f"v{version}")
        if fetch_version >= 5:                            # no epoch is kept
            assert answers[1].committed_leader_epoch == -1
        if fetch_version >= 2:                            # every committed partition
            everything = raw.ask(OffsetFetchRequest(version=fetch_version, group_id=group,
                                                    topics=None, require_stable=True),
                                 OffsetFetchResponse, fetch_version)
            assert everything.error_code == 0
            assert [(t.name, p.partition_index, p.committed_offset)
                    for t in everything.topics for p in t.partitions] == [(topic, 1, 4)]
    finally:
        raw.close()


def test_a_commit_without_membership_to_a_group_with_members_is_refused(broker):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir, partitions=1, records=2), _name("guarded")
    raw, other = RawConnection(address), RawConnection(address)
    try:
        _join_as_new_member(raw, group, topic, 5)
        refused = other.ask(OffsetCommitRequest(
            version=8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic, partitions=[OffsetCommitRequest.OffsetCommitRequestTopic
                                        .OffsetCommitRequestPartition(
                                            partition_index=0, committed_offset=1,
                                            committed_leader_epoch=-1,
                                            committed_metadata=None)])]),
            OffsetCommitResponse, 8)
        assert refused.topics[0].partitions[0].error_code != 0
        assert Admin(data_dir).list_consumer_group_offsets(group) == {}
    finally:
        raw.close()
        other.close()


def test_a_member_that_stops_heartbeating_is_removed(broker):
    data_dir, address = broker
    topic, group = _topic_with_data(data_dir, partitions=2, records=1), _name("silent")
    raw = RawConnection(address)
    try:
        joined = _join_as_new_member(raw, group, topic, 5, session_ms=SHORT_SESSION_MS)
        assert joined.error_code == 0
        # Silent from here on: the coordinator drops it once its session runs out.
        _wait_for(lambda: not Admin(data_dir).describe_consumer_group(group)["members"],
                  what="the silent member to be removed")
        beat = raw.ask(HeartbeatRequest(version=4, group_id=group,
                                        generation_id=joined.generation_id,
                                        member_id=joined.member_id, group_instance_id=None),
                       HeartbeatResponse, 4)
        assert beat.error_code == 25                                   # UNKNOWN_MEMBER_ID
    finally:
        raw.close()


@pytest.mark.parametrize("fields, code", [
    pytest.param({"protocol_type": "connect"}, 23, id="not-a-consumer-group"),
    pytest.param({"session_ms": 500}, 26, id="session-below-the-broker-minimum"),
])
def test_joins_the_coordinator_cannot_honour_are_refused(broker, fields, code):
    data_dir, address = broker
    topic = _topic_with_data(data_dir, partitions=1, records=1)
    group = fields.pop("group", _name("refused"))
    raw = RawConnection(address)
    try:
        assert _join(raw, group, topic, 5, member_id="member-1", **fields).error_code == code
        assert group not in {g["group_id"] for g in Admin(data_dir).list_consumer_groups()}
    finally:
        raw.close()
