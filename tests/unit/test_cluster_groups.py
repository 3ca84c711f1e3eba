"""The rules of consumer groups across hosts that need no cluster: Kafka's mapping
of a commit's append error to the commit's answer, the coordinator's loading and
unloading of one offsets partition's groups (failover), and the member retrying
coordinator errors until its bound.

Method: a table of append errors, one row per Kafka rule (Kafka 2.8's
``GroupMetadataManager.storeOffsets`` response callback); a real
``GroupCoordinator`` fed real offset records for the load and unload rules
(``GroupMetadataManager.loadGroupsForPartition`` / ``removeGroupsForPartition``);
a real ``GroupMember`` whose transport refuses with coordinator errors before it
reaches a real in-process coordinator.
"""

from __future__ import annotations

import pytest

from shmlog.broker.group_coordinator import CoordinatorConfig, GroupCoordinator
from shmlog.broker.group_metadata import CommittedOffset
from shmlog.broker.group_offsets import offset_record
from shmlog.client.group_member import GroupMember, MemberConfig
from shmlog.cluster.groups import commit_error
from shmlog.cluster.replication.messages import ErrorCode
from shmlog.common.errors import (
    CoordinatorError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    RecordTooLargeError,
    RequestTimedOutError,
    ShmlogError,
    UnknownMemberIdError,
)
from shmlog.groups import offsets_partition


@pytest.mark.parametrize("error, expected", [
    # GroupMetadataManager.storeOffsets: the partition or its replicas missing is a
    # coordinator not available (the client retries; nothing was committed).
    (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, CoordinatorNotAvailableError),
    (ErrorCode.NOT_ENOUGH_REPLICAS, CoordinatorNotAvailableError),
    (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, CoordinatorNotAvailableError),
    # ... leadership lost, or the log's disk failed: not the coordinator any more.
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, NotCoordinatorError),
    (ErrorCode.KAFKA_STORAGE_ERROR, NotCoordinatorError),
    # ... records too large: INVALID_COMMIT_OFFSET_SIZE (not retriable).
    (ErrorCode.MESSAGE_TOO_LARGE, RecordTooLargeError),
    # ... anything else as it is: offsets.commit.timeout.ms passing is REQUEST_TIMED_OUT.
    (ErrorCode.REQUEST_TIMED_OUT, RequestTimedOutError),
])
def test_a_commit_append_error_maps_as_kafkas_store_offsets(error, expected):
    answer = commit_error(error, "a commit")
    assert type(answer) is expected
    assert isinstance(answer, CoordinatorError) == (expected in (CoordinatorNotAvailableError,
                                                                 NotCoordinatorError))


def test_a_committed_append_is_no_error():
    assert commit_error(ErrorCode.NONE, "a commit") is None
    assert type(commit_error(ErrorCode.INVALID_RECORD, "a commit")) is ShmlogError


def coordinator() -> GroupCoordinator:
    return GroupCoordinator(CoordinatorConfig(group_initial_rebalance_delay_ms=0),
                            topics=lambda: {"t": 2}, append_offsets=lambda group, records: None,
                            end_offset=lambda topic, partition: 100)


def records(group_id: str, offset: int) -> list:
    """A commit's record as the broker reads it back (outside any transaction)."""
    return [(*offset_record(group_id, "t", 0, CommittedOffset(offset, "", 1)), -1, None)]


def test_loading_a_partition_keeps_the_groups_of_others():
    """loadGroupsForPartition adds one partition's groups; a group of another
    partition (with members and no commit yet) is not forgotten."""
    groups = coordinator()
    groups.join_group("member-group", ticket="join", now=0)
    groups.tick(1)
    groups.load(records("a", 5) + records("b", 7)
                + [(*offset_record("b", "t", 0, None), -1, None)])
    assert groups.fetch_offsets("a", ticket=None, now=2)["offsets"] == [["t", 0, 5, ""]]
    assert "b" not in groups.groups, "every commit of b tombstoned: forgotten"
    assert "member-group" in groups.groups


def test_unloading_answers_held_joins_and_forgets_the_groups():
    """removeGroupsForPartition: the partition's groups go, and a join they hold is
    answered NOT_COORDINATOR (the member finds the new coordinator)."""
    groups = CoordinatorConfig(group_initial_rebalance_delay_ms=10_000)
    groups = GroupCoordinator(groups, topics=lambda: {"t": 2},
                              append_offsets=lambda group, records: None,
                              end_offset=lambda topic, partition: 100)
    groups.load(records("kept", 3))
    groups.join_group("moved", ticket="held join", now=0)
    error = NotCoordinatorError("moved away")
    assert groups.unload(lambda group_id: group_id == "moved", error) == ["moved"]
    assert groups.take_replies() == [("held join", error)]
    assert set(groups.groups) == {"kept"}
    with pytest.raises(UnknownMemberIdError):
        groups.heartbeat("moved", "anyone", 0, ticket=None, now=1)


def test_offsets_partitions_spread_groups():
    assert {offsets_partition(f"group-{n}", 3) for n in range(30)} == {0, 1, 2}


# --- the member's side: finding the coordinator again -------------------------------------

class FailingThenServing:
    """A member's transport to a real in-process coordinator that first refuses with
    the queued coordinator errors (a failover under way), as the local broker does."""

    def __init__(self):
        self.coordinator = coordinator()
        self.failures: list[ShmlogError] = []
        self.now = 0

    def __call__(self, request_type, timeout_ms=None, **fields):
        if self.failures:
            raise self.failures.pop(0)
        self.now += 1
        result = getattr(self.coordinator, request_type)(**fields, ticket=request_type,
                                                          now=self.now)
        if result is None:                   # a join: complete and take its reply
            self.coordinator.tick(self.now)
            (_, result), = self.coordinator.take_replies()
        if isinstance(result, ShmlogError):
            raise result
        return result


def test_a_member_retries_coordinator_errors_then_joins_and_commits():
    """Kafka's consumer treats NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and
    COORDINATOR_LOAD_IN_PROGRESS as retriable (AbstractCoordinator: mark the
    coordinator unknown, back off, ask again); its commitSync retries them and a
    timed-out request until its timeout."""
    transport = FailingThenServing()
    transport.failures = [NotCoordinatorError("moved"), CoordinatorLoadInProgressError("load"),
                          CoordinatorNotAvailableError("none")]
    member = GroupMember(transport, "g", "client", MemberConfig(6_000, 1_000, 10_000))
    try:
        assert sorted(member.join(["t"], None, ())) == [("t", 0), ("t", 1)]
        transport.failures = [CoordinatorNotAvailableError("none"), RequestTimedOutError("?")]
        member.commit({("t", 0): (3, "")})
        assert transport.coordinator.fetch_offsets("g", ticket=None, now=99)["offsets"] == \
            [["t", 0, 3, ""]]
    finally:
        member.close()


def test_a_member_gives_up_on_a_missing_coordinator_after_the_rebalance_timeout():
    transport = FailingThenServing()
    transport.failures = [CoordinatorNotAvailableError("none")] * 10_000
    member = GroupMember(transport, "g", "client", MemberConfig(6_000, 1_000, 300))
    try:
        with pytest.raises(CoordinatorNotAvailableError):
            member.join(["t"], None, ())
    finally:
        member.close()
