"""The group coordinator's rules, driven in-process with a hand-moved clock: its
transition table, rebalances on join, leave, session expiry, rebalance timeout and
topic changes, fencing by generation and ownership, committed offsets, their records
and their expiry; static members (group.instance.id): back after a restart without a
rebalance, fenced when replaced, leaving by instance id."""

from __future__ import annotations

import itertools

import pytest

from shmlog.broker.group_coordinator import PENDING, CoordinatorConfig, GroupCoordinator
from shmlog.broker.group_metadata import GroupMetadata as _Group
from shmlog.broker.group_offsets import offset_record, parse_offset_record
from shmlog.common import limits
from shmlog.common.errors import (
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    LocalProtocolError,
    NonEmptyGroupError,
    OffsetMetadataTooLargeError,
    OffsetOutOfRangeError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    StorageError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from shmlog.common.limits import OFFSETS_EXPIRY_RETRY_MS
from shmlog.groups import MEMBER_ID_LENGTH_MAX, TRANSITIONS, GroupState

SESSION_MS = 10_000
REBALANCE_MS = 30_000


class Harness:
    """A coordinator with topics in a dict, offset records in a list, and a clock."""

    def __init__(self, delay_ms: int = 0, **topics: int):
        self.topics = dict(topics) or {"t": 6}
        self.records: list = []
        self.now = 1_000_000
        self.tickets = itertools.count()
        self.coordinator = GroupCoordinator(
            CoordinatorConfig(delay_ms, 1, 3_600_000), topics=lambda: self.topics,
            append_offsets=lambda group_id, records: self.records.extend(records),
            end_offset=lambda topic, partition: 100 if topic in self.topics else None)

    def call(self, method: str, **fields):
        return getattr(self.coordinator, method)(**fields, ticket=next(self.tickets),
                                                 now=self.now)

    def join(self, member_id="", topics=("t",), **fields) -> int:
        """Send a join; returns its ticket (the reply comes from replies())."""
        ticket = next(self.tickets)
        fields = {"session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": REBALANCE_MS,
                  **fields}
        topics = topics if isinstance(topics, str) else list(topics)    # a str: malformed
        assert self.coordinator.join_group("g", member_id, topics=topics, ticket=ticket,
                                           now=self.now, **fields) is PENDING
        return ticket

    def replies(self) -> dict:
        return dict(self.coordinator.take_replies())

    def advance(self, milliseconds: int) -> None:
        self.now += milliseconds
        self.coordinator.tick(self.now)

    def assignment(self, member_id: str, generation: int) -> list:
        return [tuple(entry) for entry in self.call(
            "sync_group", group_id="g", member_id=member_id, generation=generation)["assignment"]]

    def state(self) -> GroupState:
        return self.coordinator.groups["g"].state


def join_all(harness: Harness, members: list[str], **fields) -> dict:
    """Every member joins (again); returns member id -> join reply."""
    tickets = {harness.join(member, **fields): member for member in members}
    replies = harness.replies()
    assert set(replies) == set(tickets), "every join is answered when the last one arrives"
    return {reply["member_id"]: reply for reply in replies.values()}


def test_the_transition_table_is_walked_and_nothing_else_is_allowed():
    group = _Group("g")
    walked = set()
    for path in ([GroupState.PREPARING_REBALANCE, GroupState.STABLE,
                  GroupState.PREPARING_REBALANCE, GroupState.EMPTY, GroupState.DEAD],
                 [GroupState.PREPARING_REBALANCE, GroupState.STABLE],):
        group = _Group("g")
        for state in path:
            walked.add((group.state, state))
            group.transition(state)
    walked.add((GroupState.EMPTY, GroupState.DEAD))
    assert walked == {(source, target) for source, targets in TRANSITIONS.items()
                      for target in targets}
    for source in GroupState:
        for target in set(GroupState) - TRANSITIONS[source]:
            group = _Group("g", state=source)
            with pytest.raises(AssertionError):
                group.transition(target)


def test_a_join_waits_for_the_initial_delay_then_gets_every_partition():
    harness = Harness(delay_ms=3_000)
    ticket = harness.join(client_id="app")
    assert harness.replies() == {} and harness.state() is GroupState.PREPARING_REBALANCE
    assert harness.coordinator.next_deadline() == harness.now + 3_000
    harness.advance(2_999)
    assert harness.replies() == {}
    harness.advance(1)
    reply = harness.replies()[ticket]
    assert reply["generation"] == 1 and reply["member_id"].startswith("app-")
    assert reply["leader"] == reply["member_id"] and reply["protocol"] == "range"
    assert harness.assignment(reply["member_id"], 1) == [("t", p) for p in range(6)]
    assert harness.state() is GroupState.STABLE


def test_a_new_member_rebalances_the_group_and_partitions_never_overlap():
    harness = Harness()
    harness.join()
    first = next(iter(harness.replies().values()))["member_id"]
    second_ticket = harness.join()
    assert harness.replies() == {}, "the new member waits for the old one to rejoin"
    with pytest.raises(RebalanceInProgressError):
        harness.call("heartbeat", group_id="g", member_id=first, generation=1)
    with pytest.raises(RebalanceInProgressError):
        harness.call("sync_group", group_id="g", member_id=first, generation=1)
    first_ticket = harness.join(first)
    replies = harness.replies()
    assert set(replies) == {first_ticket, second_ticket}
    second = replies[second_ticket]["member_id"]
    assert {reply["generation"] for reply in replies.values()} == {2}
    one, two = harness.assignment(first, 2), harness.assignment(second, 2)
    assert not set(one) & set(two) and len(one) + len(two) == 6 and len(one) == len(two)
    harness.call("heartbeat", group_id="g", member_id=second, generation=2)
    with pytest.raises(IllegalGenerationError):
        harness.call("heartbeat", group_id="g", member_id=first, generation=1)


def test_a_followers_unchanged_join_gets_the_current_generation_and_no_rebalance():
    """Kafka's rule: a stable group's follower joining again with nothing changed (a
    client that gave up on its join and sent it again) is told the current generation
    at once; the leader's join, or a follower's with a change, rebalances."""
    harness = Harness(delay_ms=100)              # both join the first rebalance
    harness.join("a")
    harness.join("b")
    harness.advance(100)
    joined = {reply["member_id"]: reply for reply in harness.replies().values()}
    generation, leader = joined["a"]["generation"], joined["a"]["leader"]
    follower = "b" if leader == "a" else "a"
    ticket = harness.join(follower)
    assert harness.replies() == {ticket: {"member_id": follower, "generation": generation,
                                          "leader": leader, "protocol": "range"}}
    assert harness.state() is GroupState.STABLE
    harness.join(follower, topics=("t", "u"))                # a change: a rebalance
    assert harness.state() is GroupState.PREPARING_REBALANCE
    harness.join(leader)
    assert {reply["generation"] for reply in harness.replies().values()} == {generation + 1}
    harness.join(leader)                                     # the leader's: a rebalance
    assert harness.state() is GroupState.PREPARING_REBALANCE


def test_a_silent_member_is_expired_and_its_partitions_move():
    harness = Harness()
    harness.join()
    first = next(iter(harness.replies().values()))["member_id"]
    harness.join()
    harness.join(first)
    members = {reply["member_id"] for reply in harness.replies().values()}
    second = (members - {first}).pop()
    for _ in range(4):                    # the first heartbeats, the second is silent
        harness.advance(SESSION_MS // 4)
        harness.call("heartbeat", group_id="g", member_id=first, generation=2)
    harness.advance(1)
    assert second not in harness.coordinator.groups["g"].members
    with pytest.raises(RebalanceInProgressError):
        harness.call("heartbeat", group_id="g", member_id=first, generation=2)
    ticket = harness.join(first)
    assert harness.replies()[ticket]["generation"] == 3
    assert len(harness.assignment(first, 3)) == 6
    with pytest.raises(UnknownMemberIdError):
        harness.call("heartbeat", group_id="g", member_id=second, generation=2)


def test_a_member_that_does_not_rejoin_in_time_is_dropped():
    harness = Harness()
    harness.join()
    assert next(iter(harness.replies().values()))["member_id"], "the first member joined"
    second_ticket = harness.join()
    harness.advance(SESSION_MS // 2)
    assert harness.replies() == {}, "the first member is still expected"
    harness.now += REBALANCE_MS
    harness.coordinator.tick(harness.now)
    reply = harness.replies()[second_ticket]
    assert reply["generation"] == 2
    assert list(harness.coordinator.groups["g"].members) == [reply["member_id"]]


def test_leaving_rebalances_and_the_last_leave_empties_the_group():
    harness = Harness()
    members = list(join_all(harness, [""]))
    harness.join()
    harness.join(members[0])
    members = [reply["member_id"] for reply in harness.replies().values()]
    harness.call("leave_group", group_id="g", member_id=members[0])
    ticket = harness.join(members[1])
    assert harness.replies()[ticket]["generation"] == 3
    harness.call("leave_group", group_id="g", member_id=members[1])
    assert harness.state() is GroupState.EMPTY
    with pytest.raises(UnknownMemberIdError):
        harness.call("leave_group", group_id="g", member_id=members[1])


def test_commits_are_fenced_by_generation_and_stored_as_records():
    harness = Harness()
    member = list(join_all(harness, [""]))[0]
    offsets = [["t", 0, 42, "meta"], ["t", 1, 7, ""]]
    harness.call("commit_offsets", group_id="g", member_id=member, generation=1, offsets=offsets)
    with pytest.raises(IllegalGenerationError):
        harness.call("commit_offsets", group_id="g", member_id=member, generation=0,
                     offsets=offsets)
    with pytest.raises(UnknownMemberIdError):
        harness.call("commit_offsets", group_id="g", member_id="ghost", generation=1,
                     offsets=offsets)
    with pytest.raises(NonEmptyGroupError):
        harness.call("commit_offsets", group_id="g", offsets=offsets)
    # A member of the current generation commits while the group rebalances (an
    # eager member commits before it rejoins).
    harness.join()
    harness.call("commit_offsets", group_id="g", member_id=member, generation=1,
                 offsets=[["t", 0, 43, ""]])
    fetched = harness.call("fetch_offsets", group_id="g")["offsets"]
    assert fetched == [["t", 0, 43, ""], ["t", 1, 7, ""]]
    assert harness.call("fetch_offsets", group_id="g", partitions=[["t", 1], ["t", 5]]) == \
        {"offsets": [["t", 1, 7, ""]]}
    assert harness.call("fetch_offsets", group_id="nobody")["offsets"] == []
    # The records replay into a new coordinator (a broker restart).
    parsed = [parse_offset_record(key, value) for key, value in harness.records]
    assert [(group, topic, partition, committed.offset)
            for group, topic, partition, committed in parsed] == \
        [("g", "t", 0, 42), ("g", "t", 1, 7), ("g", "t", 0, 43)]
    restarted = Harness()
    restarted.coordinator.load(as_read_back(harness.records))
    assert restarted.call("fetch_offsets", group_id="g")["offsets"] == \
        [["t", 0, 43, ""], ["t", 1, 7, ""]]
    described = restarted.call("describe_group", group_id="g")
    assert described["state"] == "Empty"
    assert [(entry["partition"], entry["committed"], entry["lag"])
            for entry in described["partitions"]] == [(0, 43, 57), (1, 7, 93)]


def test_an_empty_group_takes_simple_commits_and_is_deleted_with_tombstones():
    harness = Harness()
    harness.call("commit_offsets", group_id="tool", offsets=[["t", 2, 5, ""]])
    assert harness.call("list_groups")["groups"] == [
        {"group_id": "tool", "state": "Empty", "protocol": None, "members": 0}]
    harness.call("delete_group", group_id="tool")
    assert harness.records[-1] == offset_record("tool", "t", 2, None)
    with pytest.raises(GroupIdNotFoundError):
        harness.call("describe_group", group_id="tool")
    restarted = Harness()
    restarted.coordinator.load(as_read_back(harness.records))
    assert restarted.call("fetch_offsets", group_id="tool")["offsets"] == []
    member = list(join_all(harness, [""]))[0]
    with pytest.raises(NonEmptyGroupError):
        harness.call("delete_group", group_id="g")
    assert member


@pytest.mark.parametrize("entry, error, message", [
    (["gone", 0, 1, ""], UnknownTopicOrPartitionError, "gone-0, which the broker does not host"),
    (["t", 6, 1, ""], UnknownTopicOrPartitionError, "t-6, which the broker does not host"),
    (["t", -1, 1, ""], UnknownTopicOrPartitionError, "t--1"),
    (["t", 1, -1, ""], OffsetOutOfRangeError, r"offset -1, outside \[0, 100\]"),
    (["t", 1, 101, ""], OffsetOutOfRangeError, r"offset 101, outside \[0, 100\]"),
    (["t", 1, 5, "x" * (limits.OFFSET_METADATA_SIZE_MAX + 1)], OffsetMetadataTooLargeError,
     "4097 bytes of metadata; at most 4096"),
    (["t", 1, 5, "\u00e9" * (limits.OFFSET_METADATA_SIZE_MAX // 2 + 1)],
     OffsetMetadataTooLargeError, "4098 bytes"),
])
@pytest.mark.parametrize("as_member", [True, False])
def test_a_commit_of_a_missing_partition_a_bad_offset_or_long_metadata_is_refused_whole(
        entry, error, message, as_member):
    harness = Harness()                       # topic t: 6 partitions, log end offset 100
    member = {"member_id": list(join_all(harness, [""]))[0], "generation": 1} if as_member \
        else {}
    group_id = "g" if as_member else "tool"
    good = ["t", 0, 100, "m" * limits.OFFSET_METADATA_SIZE_MAX]     # at every limit
    with pytest.raises(error, match=message):
        harness.call("commit_offsets", group_id=group_id, offsets=[good, entry], **member)
    assert harness.records == [], "a refused commit stores nothing, not even its good half"
    assert harness.call("fetch_offsets", group_id=group_id)["offsets"] == []
    harness.call("commit_offsets", group_id=group_id, offsets=[good], **member)
    assert harness.call("fetch_offsets", group_id=group_id)["offsets"] == [good]


def test_patterns_and_partition_changes_rebalance():
    harness = Harness(**{"logs-a": 2, "other": 2, "__internal": 1})
    member = list(join_all(harness, [""], topics=(), pattern=r"logs-.*|__.*"))[0]
    assert harness.assignment(member, 1) == [("logs-a", 0), ("logs-a", 1)]
    harness.topics["logs-b"] = 1
    harness.coordinator.topics_changed(harness.now)
    with pytest.raises(RebalanceInProgressError):
        harness.call("heartbeat", group_id="g", member_id=member, generation=1)
    join_all(harness, [member], topics=(), pattern=r"logs-.*|__.*")
    assert harness.assignment(member, 2) == [("logs-a", 0), ("logs-a", 1), ("logs-b", 0)]
    harness.topics["other"] = 5                          # not subscribed: no rebalance
    harness.coordinator.topics_changed(harness.now)
    harness.call("heartbeat", group_id="g", member_id=member, generation=2)
    harness.topics["logs-a"] = 3
    harness.coordinator.topics_changed(harness.now)
    with pytest.raises(RebalanceInProgressError):
        harness.call("heartbeat", group_id="g", member_id=member, generation=2)


def test_members_must_share_an_assignor():
    harness = Harness()
    join_all(harness, [""], assignors=["range"])
    with pytest.raises(InconsistentGroupProtocolError):
        harness.join(assignors=["roundrobin"])
    assert harness.state() is GroupState.STABLE


@pytest.mark.parametrize("fields, message", [
    ({"assignors": ["magic"]}, "assignors"),
    ({"assignors": []}, "assignors"),
    ({"session_timeout_ms": 0}, "session_timeout_ms"),
    ({"pattern": "("}, "regular expression"),
    ({"topics": "t"}, "topics"),
    ({"owned": [["t"]]}, "partition"),
])
def test_malformed_joins_are_refused(fields, message):
    harness = Harness()
    with pytest.raises(LocalProtocolError, match=message):
        harness.join(**fields)
    with pytest.raises(LocalProtocolError, match="group_id"):
        harness.coordinator.join_group("", ticket=0, now=0)
    with pytest.raises(UnknownMemberIdError, match="generation -1"):
        harness.join("removed-member", generation=4)
    with pytest.raises(UnknownMemberIdError):
        harness.join("x" * (MEMBER_ID_LENGTH_MAX + 1))


def test_a_first_join_sent_again_is_one_member_not_two():
    """A new member names itself; the same first join sent again after a timeout
    supersedes the first one instead of adding a member that would hold partitions
    until its session ran out."""
    harness = Harness(delay_ms=1_000)
    first_try = harness.join("app-1", client_id="app")
    second_try = harness.join("app-1", client_id="app")
    replies = harness.replies()
    assert isinstance(replies[first_try], RebalanceInProgressError)
    assert list(harness.coordinator.groups["g"].members) == ["app-1"]
    harness.advance(1_000)
    reply = harness.replies()[second_try]
    assert reply["member_id"] == "app-1" and reply["generation"] == 1
    assert harness.assignment("app-1", 1) == [("t", p) for p in range(6)]


def test_only_the_owner_commits_a_partition():
    harness = Harness(delay_ms=1_000, t=6, other=1)
    harness.join("a-1")
    harness.join("b-1")
    harness.advance(1_000)
    assert len(harness.replies()) == 2
    owned = {member: harness.assignment(member, 1) for member in ("a-1", "b-1")}
    assert owned == {"a-1": [("t", 0), ("t", 1), ("t", 2)],
                     "b-1": [("t", 3), ("t", 4), ("t", 5)]}
    with pytest.raises(PartitionNotAssignedError, match="t-3.*'b-1'"):
        harness.call("commit_offsets", group_id="g", member_id="a-1", generation=1,
                     offsets=[["t", 0, 5, ""], ["t", 3, 9, ""]])
    assert harness.records == [], "a refused commit stores nothing, not even its good half"
    harness.call("commit_offsets", group_id="g", member_id="a-1", generation=1,
                 offsets=[["t", 0, 5, ""], ["other", 0, 1, ""]])
    assert harness.call("fetch_offsets", group_id="g")["offsets"] == \
        [["other", 0, 1, ""], ["t", 0, 5, ""]]


def test_partitions_still_held_go_to_nobody_when_the_group_turns_eager():
    """A member offering only an eager assignor makes the group eager while
    cooperative members still hold their partitions: those stay out of the new
    generation until their holder has given them up."""
    harness = Harness()
    both = ["cooperative-sticky", "range"]
    join_all(harness, ["a-1"], assignors=both)
    held = harness.assignment("a-1", 1)
    assert len(held) == 6 and harness.coordinator.groups["g"].protocol == "cooperative-sticky"
    harness.join("b-1", assignors=["range"])
    harness.join("a-1", assignors=both, owned=[list(partition) for partition in held],
                 generation=1)
    generation = {reply["generation"] for reply in harness.replies().values()}.pop()
    assert harness.coordinator.groups["g"].protocol == "range"
    kept, taken = harness.assignment("a-1", generation), harness.assignment("b-1", generation)
    assert taken == [], "b's range share is still a's"
    assert kept == [("t", 0), ("t", 1), ("t", 2)]
    # a revokes what range moves away and joins again (now eager: owning nothing);
    # b gets its share in the next generation.
    harness.join("a-1", assignors=both, generation=generation)
    harness.join("b-1", assignors=["range"], generation=generation)
    assert harness.assignment("b-1", generation + 1) == [("t", 3), ("t", 4), ("t", 5)]


def test_cooperative_members_keep_partitions_while_others_move():
    harness = Harness(t=12)
    cooperative = {"assignors": ["cooperative-sticky"]}
    first = list(join_all(harness, [""], **cooperative))[0]
    held = harness.assignment(first, 1)
    assert len(held) == 12

    def rejoin(members: dict) -> tuple[int, dict]:
        """Every member joins with what it holds; the generation and assignments."""
        tickets = {harness.join(member, owned=[list(p) for p in owned], generation=generation,
                                **cooperative): member for member, (owned, generation)
                   in members.items()}
        replies = harness.replies()
        assert set(replies) == set(tickets)
        generation = next(iter(replies.values()))["generation"]
        return generation, {reply["member_id"]: harness.assignment(reply["member_id"],
                                                                   generation)
                            for reply in replies.values()}

    # A second member arrives: the first keeps half and gives up the other half,
    # which nobody gets in this generation.
    generation, assigned = rejoin({"": ((), -1), first: (held, 1)})
    second = (set(assigned) - {first}).pop()
    assert generation == 2 and len(assigned[first]) == 6 and assigned[second] == []
    assert set(assigned[first]) <= set(held), "sticky: nothing new for the first"
    # The first revoked some, so it joins again at once (the second with it): the
    # revoked half reaches the second member now.
    kept = assigned[first]
    generation, assigned = rejoin({first: (kept, 2), second: ((), 2)})
    assert generation == 3 and assigned[first] == kept
    assert sorted(assigned[second]) == sorted(set(held) - set(kept))


RETENTION_MS = 60_000


def test_offsets_of_a_group_without_members_expire_after_the_retention():
    """Kafka's offsets.retention (KIP-211): a group with members keeps its offsets
    however old; once empty, they last the retention from when it emptied (or
    from a later commit), then are tombstoned and the group is forgotten."""
    harness = Harness()
    harness.coordinator.config = CoordinatorConfig(0, 1, 3_600_000, RETENTION_MS)
    join_all(harness, ["a-1"])
    harness.call("commit_offsets", group_id="g", member_id="a-1", generation=1,
                 offsets=[["t", 0, 5, ""], ["t", 1, 6, ""]])
    for _ in range(3 * RETENTION_MS // (SESSION_MS // 2)):   # a live member: nothing expires
        harness.advance(SESSION_MS // 2)
        harness.call("heartbeat", group_id="g", member_id="a-1", generation=1)
    assert len(harness.call("fetch_offsets", group_id="g")["offsets"]) == 2
    harness.call("leave_group", group_id="g", member_id="a-1")
    assert harness.state() is GroupState.EMPTY
    assert harness.coordinator.next_deadline() == harness.now + RETENTION_MS
    harness.advance(RETENTION_MS - 1)
    assert len(harness.call("fetch_offsets", group_id="g")["offsets"]) == 2
    harness.advance(1)
    assert harness.call("fetch_offsets", group_id="g")["offsets"] == []
    assert "g" not in harness.coordinator.groups
    assert harness.records[-2:] == [offset_record("g", "t", 0, None),
                                    offset_record("g", "t", 1, None)]
    assert harness.coordinator.next_deadline() is None


def test_offsets_committed_without_members_expire_per_commit_and_after_a_restart():
    harness = Harness()
    harness.coordinator.config = CoordinatorConfig(0, 1, 3_600_000, RETENTION_MS)
    harness.call("commit_offsets", group_id="tool", offsets=[["t", 0, 1, ""]])
    harness.advance(RETENTION_MS // 2)
    harness.call("commit_offsets", group_id="tool", offsets=[["t", 1, 2, ""]])
    harness.advance(RETENTION_MS // 2)
    assert harness.call("fetch_offsets", group_id="tool")["offsets"] == [["t", 1, 2, ""]]
    # A broker restarted long after: the replayed commit is past its retention.
    restarted = Harness()
    restarted.coordinator.config = CoordinatorConfig(0, 1, 3_600_000, RETENTION_MS)
    restarted.now = harness.now + RETENTION_MS
    restarted.coordinator.load(as_read_back(harness.records))
    assert restarted.coordinator.next_deadline() <= restarted.now
    restarted.advance(0)
    assert restarted.call("fetch_offsets", group_id="tool")["offsets"] == []
    assert restarted.records == [offset_record("tool", "t", 1, None)]
    # A failed append keeps the offsets and tries again a minute later.
    failing = Harness()
    failing.coordinator.config = CoordinatorConfig(0, 1, 3_600_000, RETENTION_MS)
    failing.call("commit_offsets", group_id="tool", offsets=[["t", 0, 1, ""]])

    def disk_full(group_id, records):
        raise StorageError("disk full")
    failing.coordinator._append_offsets = disk_full
    failing.advance(RETENTION_MS)
    assert failing.call("fetch_offsets", group_id="tool")["offsets"] == [["t", 0, 1, ""]]
    assert failing.coordinator.next_deadline() == failing.now + OFFSETS_EXPIRY_RETRY_MS


# -- static membership (group.instance.id, KIP-345) --------------------------------------

def _static_pair(harness: Harness) -> dict:
    """Instances "a" and "b" joined in one rebalance: instance -> join reply."""
    tickets = {harness.join(group_instance_id=instance): instance for instance in "ab"}
    harness.advance(100)
    return {tickets[ticket]: reply for ticket, reply in harness.replies().items()}


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance():
    harness = Harness(delay_ms=100)
    joined = _static_pair(harness)
    old_a, b, generation = joined["a"]["member_id"], joined["b"]["member_id"], \
        joined["b"]["generation"]
    held = harness.assignment(old_a, generation)
    ticket = harness.join(group_instance_id="a")              # a restarted process
    reply = harness.replies()[ticket]
    new_a = reply["member_id"]
    assert new_a != old_a and reply["generation"] == generation
    assert harness.state() is GroupState.STABLE
    assert harness.assignment(new_a, generation) == held
    harness.call("heartbeat", group_id="g", member_id=b, generation=generation,
                 group_instance_id="b")
    # the process it replaced is fenced, whatever it sends, and does not come back
    for method, fields in [("heartbeat", {"generation": generation}),
                           ("sync_group", {"generation": generation}),
                           ("commit_offsets", {"generation": generation,
                                               "offsets": [["t", held[0][1], 5, ""]]}),
                           ("leave_group", {})]:
        with pytest.raises(FencedInstanceIdError, match="replaced"):
            harness.call(method, group_id="g", member_id=old_a, group_instance_id="a",
                         **fields)
    with pytest.raises(FencedInstanceIdError):
        harness.join(old_a, group_instance_id="a")
    with pytest.raises(UnknownMemberIdError):                 # without its instance id
        harness.call("heartbeat", group_id="g", member_id=old_a, generation=generation)
    assert harness.state() is GroupState.STABLE and harness.replies() == {}
    described = harness.call("describe_group", group_id="g")["members"]
    assert sorted((m["group_instance_id"], m["member_id"]) for m in described) == \
        [("a", new_a), ("b", b)]


def test_a_static_member_back_with_another_subscription_or_mid_rebalance_rejoins():
    harness = Harness(delay_ms=100)
    joined = _static_pair(harness)
    generation = joined["a"]["generation"]
    harness.join(group_instance_id="a", topics=("t", "u"))     # a change: a rebalance
    assert harness.state() is GroupState.PREPARING_REBALANCE
    waiting = harness.join(group_instance_id="a")             # replaced again meanwhile
    assert isinstance(harness.replies()[waiting - 1], FencedInstanceIdError)
    harness.join(joined["b"]["member_id"], group_instance_id="b")
    replies = harness.replies()
    assert replies[waiting]["generation"] == generation + 1
    assert set(harness.coordinator.groups["g"].static_members) == {"a", "b"}


def test_a_static_member_leaves_by_instance_id_and_an_expired_one_frees_its_instance():
    harness = Harness(delay_ms=100)
    joined = _static_pair(harness)
    with pytest.raises(UnknownMemberIdError):
        harness.call("leave_group", group_id="g", member_id="", group_instance_id="c")
    harness.call("leave_group", group_id="g", member_id="", group_instance_id="a")
    group = harness.coordinator.groups["g"]
    assert list(group.static_members) == ["b"] and harness.state() is \
        GroupState.PREPARING_REBALANCE
    ticket = harness.join(joined["b"]["member_id"], group_instance_id="b")
    assert harness.replies()[ticket]["generation"] == joined["b"]["generation"] + 1
    harness.advance(SESSION_MS + 1)                           # b falls silent
    assert group.static_members == {} and group.members == {}
    with pytest.raises(LocalProtocolError, match="group_instance_id"):
        harness.join(group_instance_id="")


def test_the_assignor_orders_static_members_by_instance_id_across_restarts():
    """Kafka's order: by instance id, not by member id (a restart's new id would
    otherwise move the member's place, and its partitions, at the next rebalance)."""
    harness = Harness(delay_ms=100)
    harness.join(group_instance_id="a", client_id="zzz")     # its member id sorts last
    harness.join(group_instance_id="b", client_id="aaa")
    harness.advance(100)
    by_instance = {member.instance_id: member
                   for member in harness.coordinator.groups["g"].members.values()}
    assert by_instance["a"].assignment == (("t", 0), ("t", 1), ("t", 2))
    harness.join(group_instance_id="a", client_id="zzz")     # restarted: no rebalance
    harness.replies()
    harness.join()                                            # a dynamic member: one
    for member in list(harness.coordinator.groups["g"].members.values()):
        if member.instance_id is not None:
            harness.join(member.member_id, group_instance_id=member.instance_id,
                         client_id=member.client_id)
    harness.replies()
    assignment = {member.instance_id: member.assignment
                  for member in harness.coordinator.groups["g"].members.values()}
    assert assignment == {"a": (("t", 0), ("t", 1)), "b": (("t", 2), ("t", 3)),
                          None: (("t", 4), ("t", 5))}


def as_read_back(records: list) -> list:
    """(key, value) records as the broker reads them back: outside any transaction."""
    return [(key, value, -1, None) for key, value in records]
