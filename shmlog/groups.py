"""Consumer groups: the coordinator's state machine (in the broker) and the
member's side of the protocol (in the consumer).

Rules
-----
* A partition of a subscribed topic belongs to at most one member of a generation.
  Eager assignors (``range``, ``roundrobin``) get there by every member giving up all
  of its partitions before it joins again; ``cooperative-sticky`` by keeping a
  partition from its new owner until the old one has given it up (one more round).
* Every request from a member carries its member id and generation; a request of a
  generation that is over is refused (:class:`IllegalGenerationError`): a member that
  was fenced cannot commit offsets for partitions that moved on.
* A commit is stored whole or refused whole: every partition it names must exist,
  every offset lie in [0, log end offset], every metadata string fit
  ``limits.OFFSET_METADATA_SIZE_MAX``.
* Committed offsets are records of the compacted topic ``__consumer_offsets`` (key:
  group, topic, partition; value: offset, metadata, commit time), appended before the
  commit is answered, and read back when the broker starts.
* The committed offsets of a group without members expire ``offsets_retention_ms``
  (Kafka's ``offsets.retention.minutes``, 7 days) after its last member left, or
  after the commit if that came later; a group with nothing left is forgotten.
  A group with members keeps its offsets.
* The coordinator does no I/O: requests and the clock come in, replies come out
  (some later: a join is answered when its rebalance completes). The broker moves
  the frames (``broker.py``); its group service (``group_service.py``) appends the
  offset records.

Theory of operation
-------------------
**The coordinator computes assignments** (as Kafka's KIP-848 protocol does), rather
than a leader member: one place holds the partition counts and every member's
subscription, there is no round trip through a leader, and a pattern subscription is
resolved where topics are created, so a new matching topic rebalances at once.

A group moves through the states of :class:`GroupState` along :data:`TRANSITIONS`:

* ``EMPTY``: no members (perhaps committed offsets). A join starts a rebalance,
  delayed by ``group_initial_rebalance_delay_ms`` so that members starting together
  join one generation.
* ``PREPARING_REBALANCE``: every member must join again (heartbeats answer
  :class:`RebalanceInProgressError`). The joins wait, unanswered. When all known
  members have joined, or the rebalance timeout (the members' largest
  ``max.poll.interval.ms``) has passed, members that did not join are dropped, the
  generation advances, the assignor runs, and every join is answered.
* ``STABLE``: members sync (fetch their assignment of the generation) and heartbeat.
  A join, a leave, a missed ``session.timeout.ms``, or a change in the partitions of
  a subscribed topic starts a rebalance.
* ``DEAD``: deleted.

The member side (:class:`GroupMember`) joins and syncs when the consumer polls,
heartbeats on a thread of its own, and leaves when the consumer is not polled for
``max.poll.interval.ms`` (Kafka's rule: its partitions then go to members that are
making progress). In a cluster its broker forwards to the group's coordinator
(``cluster_groups``); a coordinator error (:class:`~shmlog.common.errors.CoordinatorError`:
a failover under way) is retried after ``limits.COORDINATOR_RETRY_BACKOFF_MS``, a
join's until the rebalance timeout, a commit's or offset fetch's (and a commit's
unknown outcome, ``RequestTimedOutError``) until the session timeout, as Kafka's
consumer retries them; then the error is raised. A new coordinator does not know
the member: it joins again as a new one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import json
import logging
import re
import socket
import threading
import time
import uuid
import zlib
from typing import Any, Callable, Iterable, Mapping

from .client.assignors import ASSIGNORS, Subscription, assign
from .common import limits
from .common.errors import (
    BrokerAccessDeniedError,
    BrokerNotAvailableError,
    BrokerNotRunningError,
    CommitFailedError,
    CoordinatorError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    JoinCancelledError,
    LocalProtocolError,
    NonEmptyGroupError,
    OffsetMetadataTooLargeError,
    OffsetOutOfRangeError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    RequestTimedOutError,
    ShmlogError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from .common.internal_topics import INTERNAL_TOPICS, OFFSETS_TOPIC
from .protocol.control import require

log = logging.getLogger(__name__)

__all__ = ["GroupState", "TRANSITIONS", "GroupCoordinator", "CoordinatorConfig", "PENDING",
           "OFFSETS_TOPIC", "INTERNAL_TOPICS", "offsets_partition", "offset_record", "GroupMember",
           "MemberConfig"]

# What Kafka gives its offsets topic: compacted, 100 MiB segments.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 100 << 20}
# The reply to a request answered later (see GroupCoordinator.take_replies).
PENDING = None
# A member's client id goes into its member id; keep ids short.
CLIENT_ID_LENGTH_MAX = 255
# A member id: a client id, a dash and 32 hex digits (new_member_id).
MEMBER_ID_LENGTH_MAX = CLIENT_ID_LENGTH_MAX + 33
# Refusals a join recovers from by joining again (a superseded join, a generation
# that moved on, a coordinator that forgot us, no answer) before it gives up.
_JOIN_ATTEMPTS_MAX = 30
# The pause before a join tries again when no broker runs: 30 attempts then span a
# minute, time enough for a broker to restart (it compiles its kernels from a cache).
_BROKER_RETRY_BACKOFF_S = 2.0
# How long expiring committed offsets waits after a failed append before it tries
# again (a full disk is not fixed in a moment; Kafka checks every 10 minutes).
OFFSETS_EXPIRY_RETRY_MS = 60_000
# How long one join request waits before it is sent again (Kafka's clients wait the
# rebalance timeout; asking again every 10 s also finds a restarted broker).
_JOIN_REQUEST_TIMEOUT_MS = 10_000


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.STABLE, GroupState.EMPTY}),
    GroupState.STABLE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.DEAD: frozenset(),
}


def new_member_id(client_id: str) -> str:
    """A member id no other member has: the client id and a random UUID."""
    return f"{client_id[:CLIENT_ID_LENGTH_MAX] or 'consumer'}-{uuid.uuid4().hex}"


def offsets_partition(group_id: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` that holds a group's commits."""
    return zlib.crc32(group_id.encode()) % partitions


def offset_record(group_id: str, topic: str, partition: int,
                  committed: "CommittedOffset | None") -> tuple[bytes, bytes | None]:
    """The key and value of a commit in ``__consumer_offsets`` (None: a tombstone).
    The key is canonical JSON, so compaction keeps one record per partition."""
    key = json.dumps(["offset", group_id, topic, partition], separators=(",", ":")).encode()
    if committed is None:
        return key, None
    return key, json.dumps({"offset": committed.offset, "metadata": committed.metadata,
                            "timestamp": committed.timestamp}, separators=(",", ":")).encode()


def parse_offset_record(key: bytes | None, value: bytes | None):
    """(group, topic, partition, CommittedOffset or None), or None for a record that
    is not a commit (or is unreadable: logged, skipped)."""
    try:
        kind, group_id, topic, partition = json.loads(key)
        if kind != "offset":
            return None
        if value is None:
            return group_id, topic, int(partition), None
        body = json.loads(value)
        return group_id, topic, int(partition), CommittedOffset(
            int(body["offset"]), str(body.get("metadata", "")), int(body.get("timestamp", -1)))
    except (TypeError, ValueError, KeyError) as error:
        log.warning("skipping an unreadable %s record (%s)", OFFSETS_TOPIC, error)
        return None


@dataclasses.dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    timestamp: int = -1


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """Kafka's group settings (broker side), same names with underscores."""
    group_initial_rebalance_delay_ms: int = 3_000
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # Kafka's offsets.retention.minutes (7 days), in ms: how long the committed
    # offsets of a group without members outlive its last member or last commit.
    offsets_retention_ms: int = 7 * 24 * 3_600_000


@dataclasses.dataclass
class _Member:
    member_id: str
    client_id: str
    topics: tuple[str, ...]
    pattern: str | None
    assignors: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    owned: tuple[tuple[str, int], ...]
    heard_ms: int                          # last join, sync or heartbeat
    owned_generation: int = -1
    join_ticket: Any = None                # a join waiting for the rebalance
    joined: bool = False                   # joined the rebalance in progress
    client_host: str = ""                  # the member's host name, as it said (describe)
    assignment: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = dataclasses.field(default_factory=dict)
    rebalance_deadline_ms: int = 0         # joins are answered by then at the latest
    start_not_before_ms: int = 0           # the initial rebalance delay
    offsets: dict[tuple[str, int], CommittedOffset] = dataclasses.field(default_factory=dict)
    partition_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    empty_since_ms: int = 0                # when its last member went (offsets expiry)

    def transition(self, state: GroupState) -> None:
        assert state in TRANSITIONS[self.state], f"{self.state} -> {state}"
        self.state = state


class GroupCoordinator:
    """Every group of one broker. Request methods return a reply dict, or
    :data:`PENDING` when the reply comes later from :meth:`take_replies`; they raise
    a :class:`ShmlogError` to refuse.

    Parameters
    ----------
    topics : callable
        Returns {topic: partition count} for every topic now.
    append_offsets : callable
        ``append_offsets(group_id, [(key, value), ...])`` stores commit records
        durably before the commit is answered (raises to refuse it).
    end_offset : callable
        ``end_offset(topic, partition)``: the high watermark (for lag), or None.
    """

    def __init__(self, config: CoordinatorConfig, *, topics: Callable[[], Mapping[str, int]],
                 append_offsets: Callable[[str, list], None],
                 end_offset: Callable[[str, int], int | None]):
        self.config = config
        self._topics = topics
        self._append_offsets = append_offsets
        self._end_offset = end_offset
        self.groups: dict[str, _Group] = {}
        self._replies: list[tuple[Any, dict | ShmlogError]] = []
        self._expiry_not_before_ms = 0         # after a failed expiry, when to try again

    # -- recovery -------------------------------------------------------------------------
    def load(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Replay ``__consumer_offsets`` records, oldest first (all of them at a
        start, or one partition's when a cluster member becomes its leader: the
        groups of other partitions are left as they are)."""
        loaded = set()
        for key, value in records:
            parsed = parse_offset_record(key, value)
            if parsed is None:
                continue
            group_id, topic, partition, committed = parsed
            group = self.groups.setdefault(group_id, _Group(group_id))
            loaded.add(group_id)
            if committed is None:
                group.offsets.pop((topic, partition), None)
            else:
                group.offsets[(topic, partition)] = committed
        for group_id in loaded:
            group = self.groups[group_id]
            if not group.offsets and not group.members:
                del self.groups[group_id]       # every commit was tombstoned

    def unload(self, belongs: Callable[[str], bool], error: ShmlogError) -> list[str]:
        """Forget every group whose id ``belongs`` (a cluster member stopped leading
        their offsets partition: Kafka's ``removeGroupsForPartition``); a join they
        hold is answered with ``error``. Returns the ids forgotten."""
        gone = [group_id for group_id in self.groups if belongs(group_id)]
        for group_id in gone:
            for member in self.groups.pop(group_id).members.values():
                if member.join_ticket is not None:
                    self._reply(member.join_ticket, error)
        return gone

    # -- the protocol ------------------------------------------------------------------
    def join_group(self, group_id, member_id="", client_id="", topics=(), pattern=None,
                   assignors=("range",), session_timeout_ms=45_000,
                   rebalance_timeout_ms=300_000, owned=(), generation=-1, client_host="", *,
                   ticket, now):
        """Join (or rejoin) a group; answered when the rebalance completes with
        {member_id, generation, leader, protocol}. ``owned`` lists the partitions the
        member still holds (cooperative), from its ``generation``; ``client_host``
        is the member's host name (shown by describe, as Kafka's HOST column)."""
        group_id = _group_id(group_id)
        member_id = require(member_id, str, "member_id")
        wanted = self._subscription(client_id, topics, pattern, assignors, session_timeout_ms,
                                    rebalance_timeout_ms, owned, generation, now)
        wanted.client_host = require(client_host, str, "client_host")[:CLIENT_ID_LENGTH_MAX]
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            group = self.groups[group_id] = _Group(group_id)
        others = [member for member in group.members.values() if member.member_id != member_id]
        if others and not set(wanted.assignors) & set.intersection(*(set(other.assignors)
                                                                     for other in others)):
            raise InconsistentGroupProtocolError(
                f"group {group_id!r} uses assignors {sorted(set(others[0].assignors))}; "
                f"this member offers {list(wanted.assignors)}")
        member = group.members.get(member_id) if member_id else None
        if member is not None:
            if member.join_ticket is not None:     # a join it gave up on (timed out)
                self._reply(member.join_ticket, RebalanceInProgressError(
                    "superseded by a newer join of the same member"))
            wanted.member_id, wanted.assignment = member_id, member.assignment
        elif member_id:
            # A new member names itself (KIP-848's rule), so a first join that it
            # sends again after a timeout is the same member, not one more that
            # would hold partitions until its session ran out. An id of a
            # generation, though, is a member this group removed: it starts over.
            if wanted.owned_generation != -1 or len(member_id) > MEMBER_ID_LENGTH_MAX:
                raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r}; "
                                           f"join as a new member (generation -1)")
            wanted.member_id = member_id
        else:
            wanted.member_id = new_member_id(wanted.client_id)
        member = group.members[wanted.member_id] = wanted
        member.join_ticket, member.joined = ticket, True
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now)
        self._maybe_complete(group, now)
        return PENDING

    def _subscription(self, client_id, topics, pattern, assignors, session_timeout_ms,
                      rebalance_timeout_ms, owned, generation, now) -> _Member:
        """A join's fields, checked, as a member without an id yet."""
        topics = tuple(sorted(set(require(topic, str, "topics[]")
                                  for topic in require(topics, (list, tuple), "topics"))))
        if pattern is not None:
            try:
                re.compile(require(pattern, str, "pattern"))
            except re.error as error:
                raise LocalProtocolError(f"pattern {pattern!r} is not a regular "
                                         f"expression: {error}") from None
        offered = tuple(require(name, str, "assignors[]")
                        for name in require(assignors, (list, tuple), "assignors"))
        if not offered or any(name not in ASSIGNORS for name in offered):
            raise LocalProtocolError(f"assignors must be some of {', '.join(ASSIGNORS)}, "
                                     f"got {offered}")
        session = require(session_timeout_ms, int, "session_timeout_ms")
        if not (self.config.group_min_session_timeout_ms <= session
                <= self.config.group_max_session_timeout_ms):
            raise LocalProtocolError(
                f"session_timeout_ms {session} is outside the broker's "
                f"[{self.config.group_min_session_timeout_ms}, "
                f"{self.config.group_max_session_timeout_ms}] (group_min/max_session_timeout_ms)")
        return _Member(
            "", require(client_id, str, "client_id")[:CLIENT_ID_LENGTH_MAX], topics, pattern,
            offered, session, max(require(rebalance_timeout_ms, int, "rebalance_timeout_ms"), 1),
            tuple(_partition(entry) for entry in require(owned, (list, tuple), "owned")),
            heard_ms=now, owned_generation=require(generation, int, "generation"))

    def sync_group(self, group_id, member_id, generation, *, ticket, now):
        """The member's assignment in ``generation`` (which must be the group's)."""
        group, member = self._member(group_id, member_id, generation, now)
        if group.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing; join again")
        return {"assignment": [list(entry) for entry in member.assignment],
                "protocol": group.protocol}

    def heartbeat(self, group_id, member_id, generation, *, ticket, now):
        group, _ = self._member(group_id, member_id, generation, now)
        if group.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing; join again")
        return {}

    def leave_group(self, group_id, member_id, *, ticket, now):
        group = self._group(group_id)
        member = group.members.get(require(member_id, str, "member_id"))
        if member is None:
            raise UnknownMemberIdError(f"group {group.group_id!r} has no member {member_id!r}")
        self._remove(group, member, "left the group", now)
        return {}

    def commit_offsets(self, group_id, offsets, member_id="", generation=-1, *, ticket, now):
        """Store offsets: ``offsets`` is [[topic, partition, offset, metadata], ...].
        With no member id and generation -1 (a consumer without a subscription, a
        tool), only while the group has no members."""
        group_id = _group_id(group_id)
        entries = []
        for entry in require(offsets, list, "offsets"):
            topic, partition, offset, metadata = (list(require(entry, list, "offsets[]"))
                                                  + [""])[:4]
            entries.append(((require(topic, str, "topic"), require(partition, int, "partition")),
                            CommittedOffset(require(offset, int, "offset"),
                                            require(metadata, str, "metadata"), now)))
        group = self.groups.get(group_id)
        if member_id == "" and generation == -1:
            if group is not None and group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has active members: only they commit its offsets")
        else:
            group, member = self._member(group_id, member_id, generation, now)
            # The generation alone does not fence a commit of a partition that this
            # generation gave to another member (a stale position, an application
            # committing what it never held): only the owner commits it. A partition
            # nobody holds (one being revoked, cooperatively) stays committable.
            owners = {partition: other.member_id for other in group.members.values()
                      if other is not member for partition in other.assignment}
            taken = [(partition, owners[partition]) for partition, _ in entries
                     if partition in owners]
            if taken:
                (topic, partition), owner = taken[0]
                raise PartitionNotAssignedError(
                    f"member {member_id!r} of group {group_id!r} committed {topic}-{partition}, "
                    f"which generation {group.generation} assigns to {owner!r} "
                    f"({len(taken)} such partitions); commit only what this member owns")
        self._check_commit(group_id, entries)
        if group is None or group.state is GroupState.DEAD:
            group = self.groups[group_id] = _Group(group_id)
        self._append_offsets(group_id, [offset_record(group_id, *partition, committed)
                                        for partition, committed in entries])
        group.offsets.update(entries)
        return {}

    def _check_commit(self, group_id: str, entries: list) -> None:
        """Refuse a whole commit (nothing of it is stored) that names a partition the
        broker does not host, an offset outside [0, log end offset] (no consumer can
        have read past the end; a later fetch from there would fail), or metadata
        longer than Kafka's ``offset.metadata.max.bytes``."""
        counts = self._topics()
        for (topic, partition), committed in entries:
            where = f"group {group_id!r} committed {topic}-{partition}"
            end = self._end_offset(topic, partition) \
                if 0 <= partition < counts.get(topic, 0) else None
            if end is None:
                raise UnknownTopicOrPartitionError(
                    f"{where}, which the broker does not host (deleted, or never created); "
                    f"commit only partitions of existing topics")
            if not 0 <= committed.offset <= end:
                raise OffsetOutOfRangeError(
                    f"{where} at offset {committed.offset}, outside [0, {end}] (its log end "
                    f"offset); commit the offset of the next record to read",
                    offset=committed.offset, log_start_offset=0, log_end_offset=end)
            size = len(committed.metadata.encode(errors="surrogatepass"))
            if size > limits.OFFSET_METADATA_SIZE_MAX:
                raise OffsetMetadataTooLargeError(
                    f"{where} with {size} bytes of metadata; at most "
                    f"{limits.OFFSET_METADATA_SIZE_MAX} are kept (offset.metadata.max.bytes)")

    def fetch_offsets(self, group_id, partitions=None, *, ticket, now):
        """[[topic, partition, offset, metadata], ...] of the partitions asked (all
        by default); partitions without a commit are left out."""
        group = self.groups.get(_group_id(group_id))
        offsets = group.offsets if group is not None else {}
        wanted = offsets.keys() if partitions is None else \
            [_partition(entry) for entry in require(partitions, list, "partitions")]
        found = [key for key in sorted(wanted) if key in offsets]
        return {"offsets": [[topic, partition, offsets[(topic, partition)].offset,
                             offsets[(topic, partition)].metadata]
                            for topic, partition in found]}

    def list_groups(self, *, ticket, now):
        return {"groups": [{"group_id": group.group_id, "state": group.state.value,
                            "protocol": group.protocol, "members": len(group.members)}
                           for group in sorted(self.groups.values(), key=lambda g: g.group_id)
                           if group.state is not GroupState.DEAD]}

    def describe_group(self, group_id, *, ticket, now):
        """State, members with their assignments, and per partition the committed
        offset, the log end offset and the lag (end - committed)."""
        group = self._group(group_id)
        owners = {partition: member.member_id for member in group.members.values()
                  for partition in member.assignment}
        partitions = []
        for topic, partition in sorted(set(group.offsets) | set(owners)):
            committed = group.offsets.get((topic, partition))
            end = self._end_offset(topic, partition)
            partitions.append({
                "topic": topic, "partition": partition,
                "committed": committed.offset if committed else None,
                "metadata": committed.metadata if committed else None,
                "log_end_offset": end,
                "lag": end - committed.offset if committed is not None and end is not None
                else None,
                "member_id": owners.get((topic, partition))})
        return {"group_id": group.group_id, "state": group.state.value,
                "generation": group.generation, "protocol": group.protocol,
                "leader": group.leader,
                "members": [{"member_id": member.member_id, "client_id": member.client_id,
                             "client_host": member.client_host,
                             "topics": list(member.topics), "pattern": member.pattern,
                             "assignment": [list(entry) for entry in member.assignment]}
                            for member in group.members.values()],
                "partitions": partitions}

    def delete_group(self, group_id, *, ticket, now):
        """Forget a group without members and tombstone its committed offsets."""
        group = self._group(group_id)
        if group.members:
            raise NonEmptyGroupError(f"group {group.group_id!r} has {len(group.members)} "
                                     f"active members; stop them first")
        if group.state is GroupState.PREPARING_REBALANCE:
            group.transition(GroupState.EMPTY)    # its last member left during the delay
        self._append_offsets(group.group_id, [offset_record(group.group_id, *partition, None)
                                              for partition in sorted(group.offsets)])
        group.transition(GroupState.DEAD)
        del self.groups[group.group_id]
        return {}

    # -- the clock and the topics -----------------------------------------------------------
    def tick(self, now: int) -> None:
        """Expire members whose session ran out; complete rebalances that are due;
        expire the offsets of groups without members past their retention."""
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if member.join_ticket is None and \
                        now - member.heard_ms > member.session_timeout_ms:
                    self._remove(group, member, "missed its session timeout", now)
            self._maybe_complete(group, now)
        if now >= self._expiry_not_before_ms:
            self._expire_offsets(now)

    def _offset_expiry_ms(self, group: _Group, committed: CommittedOffset) -> int:
        """When a committed offset of an empty group expires (Kafka's KIP-211):
        the retention after the group lost its last member, or after the commit
        when that came later (a consumer without a subscription commits so)."""
        return max(group.empty_since_ms, committed.timestamp) + self.config.offsets_retention_ms

    def _expire_offsets(self, now: int) -> None:
        for group in list(self.groups.values()):
            if group.state is not GroupState.EMPTY or not group.offsets:
                continue
            expired = sorted(partition for partition, committed in group.offsets.items()
                             if self._offset_expiry_ms(group, committed) <= now)
            if not expired:
                continue
            try:
                self._append_offsets(group.group_id, [offset_record(group.group_id, *partition,
                                                                    None)
                                                      for partition in expired])
            except ShmlogError as error:
                log.warning("group %s: expiring %d committed offsets failed (%s); trying again "
                            "in %d ms", group.group_id, len(expired), error,
                            OFFSETS_EXPIRY_RETRY_MS)
                self._expiry_not_before_ms = now + OFFSETS_EXPIRY_RETRY_MS
                return
            log.info("group %s: %d committed offsets expired (offsets_retention_ms %d)",
                     group.group_id, len(expired), self.config.offsets_retention_ms)
            for partition in expired:
                del group.offsets[partition]
            if not group.offsets:
                group.transition(GroupState.DEAD)   # nothing left of it: forgotten
                del self.groups[group.group_id]

    def next_deadline(self) -> int | None:
        """When :meth:`tick` next has something to do (ms), or None."""
        deadlines = []
        for group in self.groups.values():
            if group.state is GroupState.PREPARING_REBALANCE:
                everyone = all(member.joined for member in group.members.values())
                deadlines.append(group.start_not_before_ms if everyone else
                                 max(group.start_not_before_ms, group.rebalance_deadline_ms))
            deadlines += [member.heard_ms + member.session_timeout_ms + 1
                          for member in group.members.values() if member.join_ticket is None]
            if group.state is GroupState.EMPTY:
                deadlines += [max(self._offset_expiry_ms(group, committed),
                                  self._expiry_not_before_ms)
                              for committed in group.offsets.values()]
        return min(deadlines) if deadlines else None

    def topics_changed(self, now: int) -> None:
        """Topics were created, deleted or grew: rebalance every stable group whose
        subscribed partitions changed."""
        topics = self._topics()
        for group in self.groups.values():
            if group.state is GroupState.STABLE and \
                    self._partition_counts(group, topics) != group.partition_counts:
                self._prepare_rebalance(group, now)

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        """Replies to earlier requests that are due now: (ticket, reply or error)."""
        replies, self._replies = self._replies, []
        return replies

    def pending_tickets(self) -> list:
        return [member.join_ticket for group in self.groups.values()
                for member in group.members.values() if member.join_ticket is not None]

    # -- rebalancing ----------------------------------------------------------------------
    def _prepare_rebalance(self, group: _Group, now: int) -> None:
        if group.state is GroupState.EMPTY:
            group.start_not_before_ms = now + self.config.group_initial_rebalance_delay_ms
        else:
            group.start_not_before_ms = now
        group.transition(GroupState.PREPARING_REBALANCE)
        group.rebalance_deadline_ms = now + max(
            [member.rebalance_timeout_ms for member in group.members.values()] or [0])
        log.info("group %s: rebalancing (generation %d)", group.group_id, group.generation)

    def _maybe_complete(self, group: _Group, now: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or now < group.start_not_before_ms:
            return
        everyone = all(member.joined for member in group.members.values())
        if not everyone and now < group.rebalance_deadline_ms:
            return
        for member in [member for member in group.members.values() if not member.joined]:
            log.info("group %s: member %s did not join within the rebalance timeout",
                     group.group_id, member.member_id)
            del group.members[member.member_id]
        group.generation += 1
        if not group.members:
            group.transition(GroupState.EMPTY)
            group.protocol = group.leader = None
            group.empty_since_ms = now
            return
        topics = self._topics()
        members = sorted(group.members.values(), key=lambda member: member.member_id)
        if group.leader not in group.members:
            group.leader = members[0].member_id
        common = set.intersection(*(set(member.assignors) for member in members))
        group.protocol = next(name for name in group.members[group.leader].assignors
                              if name in common)
        group.partition_counts = self._partition_counts(group, topics)
        subscriptions = {member.member_id: Subscription(
            member.member_id, self._subscribed(member, topics), member.owned,
            member.owned_generation) for member in members}
        result = assign(group.protocol, group.partition_counts, subscriptions)
        # Whatever the assignor: a partition a member still holds (it says so, and
        # this coordinator gave it to it) goes to no other member until it is given
        # up. An eager assignor chosen while cooperative members keep partitions
        # would otherwise hand them on within the generation. The holder revokes
        # it and joins again; then it moves.
        held = {partition: member.member_id for member in members
                for partition in set(member.owned) & set(member.assignment)}
        held_back = False
        group.transition(GroupState.STABLE)
        for member in members:
            offered = result.assignment.get(member.member_id, ())
            member.assignment = tuple(partition for partition in offered
                                      if held.get(partition, member.member_id)
                                      == member.member_id)
            held_back |= len(member.assignment) != len(offered)
            member.joined, member.heard_ms = False, now
            self._reply(member.join_ticket, {
                "member_id": member.member_id, "generation": group.generation,
                "leader": group.leader, "protocol": group.protocol})
            member.join_ticket = None
        log.info("group %s: generation %d with %d members (%s)%s", group.group_id,
                 group.generation, len(members), group.protocol,
                 "; partitions held back until revoked" if result.revoking or held_back
                 else "")

    def _remove(self, group: _Group, member: _Member, why: str, now: int) -> None:
        log.info("group %s: member %s %s", group.group_id, member.member_id, why)
        del group.members[member.member_id]
        if member.join_ticket is not None:
            self._reply(member.join_ticket,
                        UnknownMemberIdError(f"member {member.member_id} {why}"))
        if group.state is GroupState.STABLE:
            self._prepare_rebalance(group, now)
        self._maybe_complete(group, now)

    def _subscribed(self, member: _Member, topics: Mapping[str, int]) -> tuple[str, ...]:
        if member.pattern is None:
            return member.topics
        pattern = re.compile(member.pattern)
        # Like Kafka's clients, a pattern never matches internal topics.
        return tuple(sorted(set(member.topics) | {topic for topic in topics
                                                  if not topic.startswith("__")
                                                  and pattern.fullmatch(topic)}))

    def _partition_counts(self, group: _Group, topics: Mapping[str, int]) -> dict[str, int]:
        subscribed = {topic for member in group.members.values()
                      for topic in self._subscribed(member, topics)}
        return {topic: topics[topic] for topic in sorted(subscribed) if topic in topics}

    # -- helpers ------------------------------------------------------------------------
    def _reply(self, ticket, reply) -> None:
        self._replies.append((ticket, reply))

    def _group(self, group_id) -> _Group:
        group = self.groups.get(_group_id(group_id))
        if group is None or group.state is GroupState.DEAD:
            raise GroupIdNotFoundError(f"no group {group_id!r}")
        return group

    def _member(self, group_id, member_id, generation, now) -> tuple[_Group, _Member]:
        """The group and member a request speaks for, fenced by generation."""
        group = self.groups.get(_group_id(group_id))
        member = group.members.get(require(member_id, str, "member_id")) if group else None
        if member is None:
            raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r}; "
                                       f"join again")
        if require(generation, int, "generation") != group.generation:
            raise IllegalGenerationError(
                f"member {member_id!r} speaks for generation {generation} of group "
                f"{group_id!r}, which is at generation {group.generation}; join again")
        member.heard_ms = now
        return group, member


def _group_id(value) -> str:
    value = require(value, str, "group_id")
    if not value:
        raise LocalProtocolError("group_id must be a non-empty string")
    return value


def _partition(entry) -> tuple[str, int]:
    pair = require(entry, list, "partition")
    if len(pair) != 2:
        raise LocalProtocolError(f"a partition is [topic, partition], got {pair!r:.100}")
    return require(pair[0], str, "topic"), require(pair[1], int, "partition")


# --- the member's side ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MemberConfig:
    """Kafka's consumer settings for groups (same names, underscores)."""
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    # Kafka 3's default list: eager range, with cooperative-sticky on offer to upgrade.
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    # Extra time a join request may wait beyond the rebalance timeout (Kafka: 5 s).
    join_slack_ms: int = 5_000

    def __post_init__(self):
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise LocalProtocolError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be positive and "
                f"below session_timeout_ms ({self.session_timeout_ms})")
        if self.max_poll_interval_ms < 1:
            raise LocalProtocolError("max_poll_interval_ms must be positive")
        unknown = [name for name in self.partition_assignment_strategy if name not in ASSIGNORS]
        if unknown or not self.partition_assignment_strategy:
            raise LocalProtocolError(f"partition_assignment_strategy must name some of "
                                     f"{', '.join(ASSIGNORS)}, got "
                                     f"{self.partition_assignment_strategy!r}")


class GroupMember:
    """One member of a group, seen from the consumer: joins and syncs when asked
    (on the consumer's thread), heartbeats on a thread of its own, commits and
    fetches offsets.

    ``send(request_type, timeout_ms=..., **fields)`` is the transport: one request
    to the coordinator, its reply's fields, or the coordinator's typed error.

    The heartbeat thread only raises flags the consumer acts on at its next poll:
    ``rejoin_needed`` (the group is rebalancing), ``lost`` (this member was fenced:
    its partitions may belong to others already) and ``poll_timed_out`` (it left the
    group because the consumer was not polled within ``max_poll_interval_ms``).
    """

    def __init__(self, send: Callable[..., dict], group_id: str, client_id: str,
                 config: MemberConfig):
        self._send = send
        self.group_id = _group_id(group_id)
        self.client_id = client_id
        self.config = config
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.rejoin_needed = True
        self.lost = False
        self.poll_timed_out = False
        self.last_poll = time.monotonic()
        self._joining = False
        # The id a join as a new member sends: chosen once, kept until that join
        # succeeds, so sending it again after a timeout is no second member.
        self._new_member_id = new_member_id(client_id)
        # Bumped by leave(): a join started before it must not make this a member again.
        self._membership = 0
        self._lock = threading.Lock()         # member id and generation vs the heartbeats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                        name=f"shmlog-heartbeat-{group_id}")
        self._thread.start()
        # Joins run here, so a poll waits for one only as long as its timeout.
        self._joiner = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"shmlog-join-{group_id}")

    @property
    def cooperative(self) -> bool:
        """Does the current generation use an incremental (cooperative) assignor?"""
        return self.protocol == "cooperative-sticky"

    def start_join(self, topics: Iterable[str], pattern: str | None,
                   owned: Iterable[tuple[str, int]]) -> concurrent.futures.Future:
        """:meth:`join` on the member's join thread; the future's result is the
        assignment."""
        self._joining = True
        # Cleared now, not when the join succeeds: a subscribe() or a rebalance
        # noticed while it runs must lead to another join.
        self.rejoin_needed = False
        return self._joiner.submit(self._join_or_flag, tuple(topics), pattern, tuple(owned),
                                   self._membership)

    def _join_or_flag(self, topics, pattern, owned, membership) -> list[tuple[str, int]]:
        try:
            return self.join(topics, pattern, owned, membership)
        except JoinCancelledError:
            raise                              # left on purpose: nothing to retry
        except BaseException:
            self.rejoin_needed = True          # the next poll tries again
            raise

    def join(self, topics: Iterable[str], pattern: str | None,
             owned: Iterable[tuple[str, int]], membership: int | None = None
             ) -> list[tuple[str, int]]:
        """Join the group (again) and sync: the partitions of the new generation.
        Blocks until the rebalance completes (at most the group's rebalance timeout,
        and one retry per refusal it can recover from).

        Raises
        ------
        JoinCancelledError
            :meth:`leave` or :meth:`close` was called since ``membership`` (the
            value of ``_membership`` when the join was asked for): the group heard
            the leave, and this join made the consumer no member again.
        """
        membership = self._membership if membership is None else membership
        self._joining = True
        member_id = None                       # the id of the last join sent
        # Coordinator errors (a failover under way) do not use up the attempts: they
        # are retried until the rebalance timeout, Kafka's bound on a join.
        coordinator_deadline = time.monotonic() + self.config.max_poll_interval_ms / 1000
        attempts = 0
        try:
            while attempts < _JOIN_ATTEMPTS_MAX:
                attempts += 1
                self._check_not_cancelled(membership, member_id)
                with self._lock:
                    member_id = self.member_id or self._new_member_id
                    generation = self.generation
                try:
                    # A join waits for its rebalance; asked again now and then, it
                    # finds a broker that restarted meanwhile (the coordinator keeps
                    # only the newest join of a member).
                    reply = self._send(
                        "join_group",
                        timeout_ms=min(self.config.max_poll_interval_ms
                                       + self.config.join_slack_ms, _JOIN_REQUEST_TIMEOUT_MS),
                        group_id=self.group_id, member_id=member_id,
                        client_id=self.client_id, topics=sorted(topics), pattern=pattern,
                        assignors=list(self.config.partition_assignment_strategy),
                        session_timeout_ms=self.config.session_timeout_ms,
                        rebalance_timeout_ms=self.config.max_poll_interval_ms,
                        owned=[list(partition) for partition in sorted(owned)],
                        generation=generation, client_host=socket.gethostname())
                    with self._lock:
                        current = membership == self._membership
                        if current:
                            self.member_id, self.generation = (reply["member_id"],
                                                               reply["generation"])
                            self.protocol = reply["protocol"]
                            self._new_member_id = new_member_id(self.client_id)
                    if not current:
                        # leave() ran while the join waited: what it joined, leave too.
                        self._check_not_cancelled(membership, reply["member_id"])
                    assignment = self._send("sync_group", group_id=self.group_id,
                                            member_id=reply["member_id"],
                                            generation=reply["generation"])["assignment"]
                except UnknownMemberIdError:
                    with self._lock:
                        if membership == self._membership:
                            self.member_id, self.generation = "", -1
                    owned = ()
                    continue
                except BrokerAccessDeniedError:
                    raise                      # no retry gives this user permission
                except CoordinatorError:
                    if time.monotonic() >= coordinator_deadline:
                        raise
                    attempts -= 1
                    self._stop.wait(limits.COORDINATOR_RETRY_BACKOFF_MS / 1000)
                    continue
                except BrokerNotRunningError:
                    # Fails at once (no control socket while a broker restarts): pause,
                    # as Kafka's retry.backoff, or the attempts run out in a moment.
                    self._stop.wait(_BROKER_RETRY_BACKOFF_S)
                    continue
                except (RebalanceInProgressError, IllegalGenerationError,
                        BrokerNotAvailableError):
                    continue
                self._check_not_cancelled(membership, member_id)
                self.lost = self.poll_timed_out = False
                return [(topic, partition) for topic, partition in assignment]
            raise RebalanceInProgressError(
                f"group {self.group_id!r} kept rebalancing through {_JOIN_ATTEMPTS_MAX} joins")
        finally:
            self._joining = False

    def _check_not_cancelled(self, membership: int, joined_as: str | None) -> None:
        """Raise JoinCancelledError when the consumer closed or left since the join
        began, after leaving as ``joined_as`` (an id the join may have made a member
        of the group after leave() had run)."""
        if membership == self._membership and not self._stop.is_set():
            return
        if joined_as:
            self._leave(joined_as)
        raise JoinCancelledError(f"the consumer of group {self.group_id!r} left it (closed "
                                 f"or unsubscribed) during a join")

    def commit(self, offsets: Mapping[tuple[str, int], tuple[int, str]], *,
               as_member: bool = True) -> None:
        """Commit ``{(topic, partition): (offset, metadata)}`` for this generation
        (``as_member=False``: as a consumer without a subscription).

        Raises
        ------
        CommitFailedError
            This member was fenced: the partitions may belong to another now.
        """
        entries = [[topic, partition, offset, metadata]
                   for (topic, partition), (offset, metadata) in sorted(offsets.items())]
        with self._lock:
            member_id, generation = (self.member_id, self.generation) if as_member else ("", -1)
        if as_member and not member_id:
            raise CommitFailedError(f"not a member of group {self.group_id!r} now (it left or "
                                    f"was removed); poll to rejoin, then commit")
        try:
            self._send_retrying("commit_offsets", group_id=self.group_id, member_id=member_id,
                                generation=generation, offsets=entries)
        except (UnknownMemberIdError, IllegalGenerationError) as error:
            self._fenced(member_id, generation, error)
            raise CommitFailedError(
                f"commit refused: group {self.group_id!r} rebalanced and these partitions may "
                f"belong to another member now ({error}); poll to rejoin") from None

    def _send_retrying(self, request_type: str, **fields) -> dict:
        """One request, asked again after a coordinator error or an unknown outcome
        (``RequestTimedOutError``: a commit not replicated in time, which a re-send
        stores again) until ``session_timeout_ms`` has passed: Kafka's commitSync
        retries its retriable errors until its timeout. The last error is raised
        when the time runs out."""
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000
        while True:
            try:
                return self._send(request_type, **fields)
            except (CoordinatorError, RequestTimedOutError):
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise
                time.sleep(limits.COORDINATOR_RETRY_BACKOFF_MS / 1000)

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict:
        """{(topic, partition): (offset, metadata)} of those with a commit."""
        reply = self._send_retrying("fetch_offsets", group_id=self.group_id,
                           partitions=[list(partition) for partition in partitions])
        return {(topic, partition): (offset, metadata)
                for topic, partition, offset, metadata in reply["offsets"]}

    def leave(self) -> None:
        """Leave the group (best effort: a broker that is gone expires us anyway),
        and cancel a join under way: it ends in :class:`JoinCancelledError` and
        leaves whatever it joined."""
        with self._lock:
            self._membership += 1
            member_id, self.member_id, self.generation = self.member_id, "", -1
            # A first join under way is waiting as this id: leave as it too.
            pending, self._new_member_id = self._new_member_id, new_member_id(self.client_id)
        if member_id:
            self._leave(member_id)
        elif self._joining:
            self._leave(pending)

    def _leave(self, member_id: str) -> None:
        try:
            self._send("leave_group", group_id=self.group_id, member_id=member_id)
        except UnknownMemberIdError:
            pass                                # gone already
        except ShmlogError as error:
            log.info("group %s: leaving: %s", self.group_id, error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._joiner.shutdown(wait=False, cancel_futures=True)
        self.leave()

    # -- the heartbeat thread ------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            if self._joining:
                continue                        # a waiting join keeps the session alive
            with self._lock:
                member_id, generation = self.member_id, self.generation
            if not member_id:
                continue
            if time.monotonic() - self.last_poll > self.config.max_poll_interval_ms / 1000:
                log.warning("group %s: not polled within max_poll_interval_ms (%d ms); leaving "
                            "the group so its partitions move on", self.group_id,
                            self.config.max_poll_interval_ms)
                self.poll_timed_out = self.rejoin_needed = True
                self.leave()
                continue
            try:
                self._send("heartbeat", timeout_ms=self.config.session_timeout_ms,
                           group_id=self.group_id, member_id=member_id, generation=generation)
            except RebalanceInProgressError:
                with self._lock:
                    # Only news for the member as it still is: a join that began
                    # meanwhile takes part in this very rebalance, and one more join
                    # after it would start another.
                    if not self._joining and (member_id, generation) == (self.member_id,
                                                                         self.generation):
                        self.rejoin_needed = True
            except (UnknownMemberIdError, IllegalGenerationError) as error:
                self._fenced(member_id, generation, error)
            except ShmlogError as error:       # no broker: the session decides
                log.info("group %s: heartbeat failed: %s", self.group_id, error)

    def _fenced(self, member_id: str, generation: int, error: Exception) -> None:
        """Act on a fencing error only if it concerns the member as it still is."""
        with self._lock:
            if (member_id, generation) != (self.member_id, self.generation):
                return                          # a join moved on meanwhile
            if isinstance(error, UnknownMemberIdError):
                self.member_id, self.generation = "", -1
            self.lost = self.rejoin_needed = True
