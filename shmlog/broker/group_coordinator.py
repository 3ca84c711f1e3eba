"""The group coordinator (Kafka's GroupCoordinator): the membership protocol of every
consumer group of one broker. Joins, syncs, heartbeats and leaves come in; the
coordinator keeps each group's members and generation, runs the assignor when a
rebalance completes, and answers; commits and offset fetches it fences by generation
and ownership, then hands to its offsets manager (``group_offsets.py``).

Rules
-----
* The states and transitions are those of ``groups.TRANSITIONS``; a request of a
  generation that is over is refused (:class:`IllegalGenerationError`), and a
  member commits only the partitions its generation gives it, or that nobody holds.
* A commit without a member id and with generation -1 (a consumer without a
  subscription, a tool) is taken only while the group has no members.
* The coordinator does no I/O: requests and the clock come in, replies come out
  (some later: a join is answered when its rebalance completes; the request
  methods then return :data:`PENDING`). The broker moves the frames
  (``server/broker.py``); its group service (``group_service.py``) appends the
  offset records through the ``append_offsets`` callable the coordinator is made with.

Theory of operation
-------------------
**The coordinator computes assignments** (as Kafka's KIP-848 protocol does), rather
than a leader member: one place holds the partition counts and every member's
subscription, there is no round trip through a leader, and a pattern subscription is
resolved where topics are created, so a new matching topic rebalances at once.

A join moves the group to ``PREPARING_REBALANCE`` (from ``EMPTY`` after
``group_initial_rebalance_delay_ms``), except, as in Kafka, a stable group's
follower joining again with nothing changed, which is told the current generation
at once; the joins wait, holding their tickets, until
every known member has joined or the rebalance timeout (the members' largest
``max.poll.interval.ms``) has passed. Then members that did not join are dropped,
the generation advances, the assignor chosen from those every member offers runs
over the subscribed partitions, partitions a member still holds are kept from the
others until it gives them up, and every join is answered (:meth:`take_replies`).
:meth:`tick`, run at :meth:`next_deadline`, expires members whose session ran out,
completes due rebalances and expires committed offsets.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable, Iterable, Mapping

from ..client.assignors import ASSIGNORS, Subscription, assign
from ..common import limits
from ..common.errors import (
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    LocalProtocolError,
    NonEmptyGroupError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    ShmlogError,
    UnknownMemberIdError,
)
from ..groups import (
    MEMBER_ID_LENGTH_MAX,
    GroupState,
    new_member_id,
    require_group_id,
    require_partition,
)
from ..protocol.control import require
from . import static_members
from .group_metadata import GroupMetadata, MemberMetadata
from .group_offsets import GroupMetadataManager, commit_entries

# The logger consumer groups have always logged to (log settings name it).
log = logging.getLogger("shmlog.groups")

__all__ = ["GroupCoordinator", "CoordinatorConfig", "PENDING"]

# The reply to a request answered later (see GroupCoordinator.take_replies).
PENDING = None


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """Kafka's group settings (broker side), same names with underscores."""
    group_initial_rebalance_delay_ms: int = 3_000
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # Kafka's offsets.retention.minutes (7 days), in ms: how long the committed
    # offsets of a group without members outlive its last member or last commit.
    offsets_retention_ms: int = 7 * 24 * 3_600_000


def _same_join(member: MemberMetadata, wanted: MemberMetadata) -> bool:
    """Whether a join asks for nothing ``member`` does not have already."""
    return (member.topics, member.pattern, member.assignors, member.session_timeout_ms,
            member.rebalance_timeout_ms, member.owned) == \
        (wanted.topics, wanted.pattern, wanted.assignors, wanted.session_timeout_ms,
         wanted.rebalance_timeout_ms, wanted.owned)


def _join_fields(config: CoordinatorConfig, client_id, topics, pattern, assignors,
                 session_timeout_ms, rebalance_timeout_ms, owned, generation,
                 now) -> MemberMetadata:
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
    if not (config.group_min_session_timeout_ms <= session
            <= config.group_max_session_timeout_ms):
        raise LocalProtocolError(
            f"session_timeout_ms {session} is outside the broker's "
            f"[{config.group_min_session_timeout_ms}, "
            f"{config.group_max_session_timeout_ms}] (group_min/max_session_timeout_ms)")
    return MemberMetadata(
        "", require(client_id, str, "client_id")[:limits.CLIENT_ID_LENGTH_MAX], topics, pattern,
        offered, session, max(require(rebalance_timeout_ms, int, "rebalance_timeout_ms"), 1),
        tuple(require_partition(entry) for entry in require(owned, (list, tuple), "owned")),
        heard_ms=now, owned_generation=require(generation, int, "generation"))


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
        self.offsets = GroupMetadataManager(topics=topics, end_offset=end_offset)
        self.groups: dict[str, GroupMetadata] = self.offsets.groups
        self._replies: list[tuple[Any, dict | ShmlogError]] = []

    # -- recovery -------------------------------------------------------------------------
    def load(self, records: Iterable[tuple],
             belongs: Callable[[str], bool] = lambda group_id: True) -> None:
        """Replay one partition of ``__consumer_offsets``, oldest first (at a start, or
        when a cluster member becomes its leader: the groups of other partitions are
        left as they are), ``belongs`` saying which groups it holds:
        ``GroupMetadataManager.load``."""
        self.offsets.load(records, belongs)

    def unload(self, belongs: Callable[[str], bool], error: ShmlogError) -> list[str]:
        """Forget every group whose id ``belongs`` (a cluster member stopped leading
        their offsets partition: Kafka's ``removeGroupsForPartition``); a join they
        hold is answered with ``error``. Returns the ids forgotten."""
        gone = self.offsets.unload(belongs)
        for group in gone:
            for member in group.members.values():
                if member.join_ticket is not None:
                    self._reply(member.join_ticket, error)
        return [group.group_id for group in gone]

    # -- the protocol ------------------------------------------------------------------
    def join_group(self, group_id, member_id="", client_id="", topics=(), pattern=None,
                   assignors=("range",), session_timeout_ms=45_000,
                   rebalance_timeout_ms=300_000, owned=(), generation=-1, client_host="",
                   group_instance_id=None, *, ticket, now):
        """Join (or rejoin) a group; answered when the rebalance completes with
        {member_id, generation, leader, protocol}. ``owned`` lists the partitions the
        member still holds (cooperative), from its ``generation``; ``client_host``
        is the member's host name (shown by describe, as Kafka's HOST column);
        ``group_instance_id`` makes it a static member (``static_members.py``)."""
        group_id = require_group_id(group_id)
        member_id = require(member_id, str, "member_id")
        wanted = _join_fields(self.config, client_id, topics, pattern, assignors,
                              session_timeout_ms, rebalance_timeout_ms, owned, generation, now)
        wanted.client_host = require(client_host, str, "client_host")[:limits.CLIENT_ID_LENGTH_MAX]
        wanted.instance_id = static_members.instance_id(group_instance_id)
        group = self.offsets.group_or_new(group_id)
        if wanted.instance_id is not None:
            if member_id:
                static_members.fence(group, member_id, wanted.instance_id)
            elif (member := static_members.take_over(group, wanted.instance_id, self._reply)):
                member_id = member.member_id
                if group.state is GroupState.STABLE and \
                        static_members.same_subscription(member, wanted):
                    return self._restarted(group, member, wanted, ticket, now)
        others = [member for member in group.members.values() if member.member_id != member_id]
        if others and not set(wanted.assignors) & set.intersection(*(set(other.assignors)
                                                                     for other in others)):
            raise InconsistentGroupProtocolError(
                f"group {group_id!r} uses assignors {sorted(set(others[0].assignors))}; "
                f"this member offers {list(wanted.assignors)}")
        member = group.members.get(member_id) if member_id else None
        if member is not None and group.state is GroupState.STABLE and \
                member_id != group.leader and _same_join(member, wanted):
            # Kafka's rule: a follower that joins again with nothing changed is told
            # the current generation; it starts no rebalance (a client that gave up
            # waiting on its join and sent it again would otherwise start one more).
            member.heard_ms = now
            self._reply(ticket, {"member_id": member_id, "generation": group.generation,
                                 "leader": group.leader, "protocol": group.protocol})
            return PENDING
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
        static_members.remember(group, member)
        member.join_ticket, member.joined = ticket, True
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now)
        self._maybe_complete(group, now)
        return PENDING

    def _restarted(self, group: GroupMetadata, member: MemberMetadata,
                   wanted: MemberMetadata, ticket, now: int):
        """A static member back (restarted) in a stable group, asking what its instance
        had: it keeps its assignment under its new id, and nobody rebalances."""
        member.client_id, member.client_host = wanted.client_id, wanted.client_host
        member.session_timeout_ms = wanted.session_timeout_ms
        member.rebalance_timeout_ms = wanted.rebalance_timeout_ms
        member.owned, member.heard_ms = wanted.owned, now
        log.info("group %s: static member %s is back as %s, with its assignment",
                 group.group_id, member.instance_id, member.member_id)
        self._reply(ticket, {"member_id": member.member_id, "generation": group.generation,
                             "leader": group.leader, "protocol": group.protocol})
        return PENDING

    def sync_group(self, group_id, member_id, generation, group_instance_id=None, *,
                   ticket, now):
        """The member's assignment in ``generation`` (which must be the group's)."""
        group, member = self._member(group_id, member_id, generation, now, group_instance_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing; join again")
        return {"assignment": [list(entry) for entry in member.assignment],
                "protocol": group.protocol}

    def heartbeat(self, group_id, member_id, generation, group_instance_id=None, *,
                  ticket, now):
        group, _ = self._member(group_id, member_id, generation, now, group_instance_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing; join again")
        return {}

    def leave_group(self, group_id, member_id, group_instance_id=None, *, ticket, now):
        """Leave; a static member may name its instance instead of its member id."""
        group = self.offsets.group(group_id)
        member_id = require(member_id, str, "member_id")
        instance = static_members.instance_id(group_instance_id)
        if instance is not None and member_id:
            static_members.fence(group, member_id, instance)
        elif instance is not None:
            member_id = group.static_members.get(instance, "")
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {group.group_id!r} has no member {member_id!r}")
        self._remove(group, member, "left the group", now)
        return {}

    def commit_offsets(self, group_id, offsets, member_id="", generation=-1,
                       group_instance_id=None, *, ticket, now):
        """Store offsets: ``offsets`` is [[topic, partition, offset, metadata], ...].
        With no member id and generation -1 (a consumer without a subscription, a
        tool), only while the group has no members."""
        group_id = require_group_id(group_id)
        entries = commit_entries(offsets, now)
        self._check_committer(group_id, entries, member_id, generation, group_instance_id, now)
        self.offsets.check_commit(group_id, entries)
        self.offsets.store(group_id, entries, self._append_offsets)
        return {}

    def txn_offset_commit(self, group_id, offsets, producer_id, member_id="", generation=-1,
                          group_instance_id=None, *, append_offsets, now):
        """Kafka's TxnOffsetCommit: store offsets inside the producer's transaction
        (``append_offsets`` writes them as its batch); fetches see them once the
        transaction commits. The member and generation, when given, are checked as a
        commit's are (KIP-447: a zombie of an older generation is fenced); without
        them (a producer that names the group alone) the transaction's fencing is
        the only check, as Kafka's."""
        group_id = require_group_id(group_id)
        entries = commit_entries(offsets, now)
        if member_id != "" or generation != -1:
            self._check_committer(group_id, entries, member_id, generation, group_instance_id,
                                  now)
        self.offsets.check_commit(group_id, entries)
        self.offsets.store_pending(group_id, producer_id, entries, append_offsets)
        return {}

    def _check_committer(self, group_id: str, entries: list, member_id, generation,
                         group_instance_id, now: int) -> None:
        """Refuse a commit its committer may not make: with no member id and
        generation -1 only while the group has no members; else only a member of the
        current generation, of the partitions it owns or nobody holds."""
        if member_id == "" and generation == -1:
            group = self.groups.get(group_id)
            if group is not None and group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has active members: only they commit its offsets")
        else:
            group, member = self._member(group_id, member_id, generation, now,
                                         group_instance_id)
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

    def fetch_offsets(self, group_id, partitions=None, *, ticket, now):
        """[[topic, partition, offset, metadata], ...] of the partitions asked (all
        by default); partitions without a commit are left out."""
        return self.offsets.fetch_offsets(group_id, partitions)

    def list_groups(self, *, ticket, now):
        return {"groups": [{"group_id": group.group_id, "state": group.state.value,
                            "protocol": group.protocol, "members": len(group.members)}
                           for group in sorted(self.groups.values(), key=lambda g: g.group_id)
                           if group.state is not GroupState.DEAD]}

    def describe_group(self, group_id, *, ticket, now):
        """State, members with their assignments, and per partition the committed
        offset, the log end offset and the lag (end - committed)."""
        group = self.offsets.group(group_id)
        return {"group_id": group.group_id, "state": group.state.value,
                "generation": group.generation, "protocol": group.protocol,
                "leader": group.leader,
                "members": [{"member_id": member.member_id, "client_id": member.client_id,
                             "group_instance_id": member.instance_id,
                             "client_host": member.client_host,
                             "topics": list(member.topics), "pattern": member.pattern,
                             "assignment": [list(entry) for entry in member.assignment]}
                            for member in group.members.values()],
                "partitions": self.offsets.describe_offsets(group)}

    def delete_group(self, group_id, *, ticket, now):
        """Forget a group without members and tombstone its committed offsets."""
        group = self.offsets.group(group_id)
        if group.members:
            raise NonEmptyGroupError(f"group {group.group_id!r} has {len(group.members)} "
                                     f"active members; stop them first")
        if group.state is GroupState.PREPARING_REBALANCE:
            group.transition(GroupState.EMPTY)    # its last member left during the delay
        self.offsets.delete(group, self._append_offsets)
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
        self.offsets.expire(now, self.config.offsets_retention_ms, self._append_offsets)

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
        deadlines += self.offsets.expiry_deadlines(self.config.offsets_retention_ms)
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
    def _prepare_rebalance(self, group: GroupMetadata, now: int) -> None:
        if group.state is GroupState.EMPTY:
            group.start_not_before_ms = now + self.config.group_initial_rebalance_delay_ms
        else:
            group.start_not_before_ms = now
        group.transition(GroupState.PREPARING_REBALANCE)
        group.rebalance_deadline_ms = now + max(
            [member.rebalance_timeout_ms for member in group.members.values()] or [0])
        log.info("group %s: rebalancing (generation %d)", group.group_id, group.generation)

    def _maybe_complete(self, group: GroupMetadata, now: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or now < group.start_not_before_ms:
            return
        everyone = all(member.joined for member in group.members.values())
        if not everyone and now < group.rebalance_deadline_ms:
            return
        for member in [member for member in group.members.values() if not member.joined]:
            log.info("group %s: member %s did not join within the rebalance timeout",
                     group.group_id, member.member_id)
            del group.members[member.member_id]
            static_members.forget(group, member)
        group.generation += 1
        if not group.members:
            group.transition(GroupState.EMPTY)
            group.protocol = group.leader = None
            group.empty_since_ms = now
            return
        topics = self._topics()
        members = sorted(group.members.values(), key=lambda member: member.member_id)
        key = static_members.assignor_key     # a static member's place is its instance's
        if group.leader not in group.members:
            group.leader = members[0].member_id
        common = set.intersection(*(set(member.assignors) for member in members))
        group.protocol = next(name for name in group.members[group.leader].assignors
                              if name in common)
        group.partition_counts = self._partition_counts(group, topics)
        subscriptions = {key(member): Subscription(
            key(member), self._subscribed(member, topics), member.owned,
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
            offered = result.assignment.get(key(member), ())
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

    def _remove(self, group: GroupMetadata, member: MemberMetadata, why: str, now: int) -> None:
        log.info("group %s: member %s %s", group.group_id, member.member_id, why)
        del group.members[member.member_id]
        static_members.forget(group, member)
        if member.join_ticket is not None:
            self._reply(member.join_ticket,
                        UnknownMemberIdError(f"member {member.member_id} {why}"))
        if group.state is GroupState.STABLE:
            self._prepare_rebalance(group, now)
        self._maybe_complete(group, now)

    def _subscribed(self, member: MemberMetadata,
                    topics: Mapping[str, int]) -> tuple[str, ...]:
        if member.pattern is None:
            return member.topics
        pattern = re.compile(member.pattern)
        # Like Kafka's clients, a pattern never matches internal topics.
        return tuple(sorted(set(member.topics) | {topic for topic in topics
                                                  if not topic.startswith("__")
                                                  and pattern.fullmatch(topic)}))

    def _partition_counts(self, group: GroupMetadata,
                          topics: Mapping[str, int]) -> dict[str, int]:
        subscribed = {topic for member in group.members.values()
                      for topic in self._subscribed(member, topics)}
        return {topic: topics[topic] for topic in sorted(subscribed) if topic in topics}

    # -- helpers ------------------------------------------------------------------------
    def _reply(self, ticket, reply) -> None:
        self._replies.append((ticket, reply))

    def _member(self, group_id, member_id, generation, now,
                instance=None) -> tuple[GroupMetadata, MemberMetadata]:
        """The group and member a request speaks for, fenced by instance (a replaced
        static member) and by generation."""
        group = self.groups.get(require_group_id(group_id))
        if group is not None:
            static_members.fence(group, member_id, static_members.instance_id(instance))
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
