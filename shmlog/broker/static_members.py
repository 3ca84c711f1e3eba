"""Static membership (Kafka's KIP-345, ``group.instance.id``): the rules the group
coordinator (``group_coordinator.py``) applies to a member that names its instance.

Rules
-----
* A group maps each instance id to the one member id that speaks for it now
  (:attr:`GroupMetadata.static_members`); a member leaving, or removed (its session
  ran out, it missed a rebalance), takes its mapping with it.
* **A restart is no rebalance.** A join without a member id, of an instance the group
  knows, takes that member's place under a new member id (so the old process, if it
  still runs, is fenced), keeps its assignment, and, when the group is stable and the
  subscription unchanged, is told the current generation at once: the other members
  notice nothing. Otherwise it rejoins like any member, in a rebalance.
* **The newer instance wins.** A request naming an instance with another member id
  than the instance's now (the process that was replaced) is refused with
  :class:`FencedInstanceIdError`, before any other check: the client must stop, not
  join again as a new member (which would take the instance back, and so on).
* LeaveGroup may name the instance instead of the member id (Kafka's v3+).
* **The assignor sees instances.** The assignors order members by the key they are
  given; a static member's is its instance id (:func:`assignor_key`), as Kafka
  orders them, so a restart's new member id does not move the member's place, and
  a later rebalance gives it what it had where it can.

Theory of operation
-------------------
A static member is an ordinary :class:`MemberMetadata` with ``instance_id`` set;
only its id can change. Nothing here is stored: like every membership, the mapping
lives in memory, and a coordinator that restarts or moves learns it from the joins.
"""

from __future__ import annotations

from typing import Callable

from ..common import limits
from ..common.errors import FencedInstanceIdError, LocalProtocolError
from ..groups import new_member_id
from .group_metadata import GroupMetadata, MemberMetadata

__all__ = ["instance_id", "fence", "take_over", "same_subscription", "remember", "forget",
           "assignor_key"]


def instance_id(value) -> str | None:
    """A request's ``group_instance_id`` checked: None (a dynamic member) or a
    non-empty string of at most ``limits.CLIENT_ID_LENGTH_MAX`` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limits.CLIENT_ID_LENGTH_MAX:
        raise LocalProtocolError(f"group_instance_id must be a non-empty string of at most "
                                 f"{limits.CLIENT_ID_LENGTH_MAX} characters, got {value!r:.100}")
    return value


def fence(group: GroupMetadata, member_id: str, instance: str | None) -> None:
    """Refuse ``member_id`` speaking for ``instance`` if another member id holds it."""
    if instance is None:
        return
    holder = group.static_members.get(instance)
    if holder is not None and holder != member_id:
        raise FencedInstanceIdError(
            f"member {member_id!r} of group {group.group_id!r} speaks for group.instance.id "
            f"{instance!r}, which member {holder!r} joined with since: this consumer was "
            f"replaced and must stop (give each consumer its own group.instance.id)")


def take_over(group: GroupMetadata, instance: str,
              fenced: Callable[[object, FencedInstanceIdError], None]) -> MemberMetadata | None:
    """The member of ``instance`` renamed with a new member id (the old one fenced: a
    join it holds is answered with ``fenced(ticket, error)``), or None when the group
    has no member of that instance."""
    old_id = group.static_members.get(instance)
    member = group.members.pop(old_id, None) if old_id is not None else None
    if member is None:
        return None
    member.member_id = new_member_id(instance)
    group.members[member.member_id] = member
    group.static_members[instance] = member.member_id
    if group.leader == old_id:
        group.leader = member.member_id
    if member.join_ticket is not None:
        fenced(member.join_ticket, FencedInstanceIdError(
            f"group {group.group_id!r}: a newer member joined with group.instance.id "
            f"{instance!r}; member {old_id!r} is fenced"))
        member.join_ticket = None
    return member


def same_subscription(member: MemberMetadata, wanted: MemberMetadata) -> bool:
    """Whether a restarted static member asks for what its instance had (partitions it
    says it owns do not count: a new process owns none yet)."""
    return (member.topics, member.pattern, member.assignors) == \
        (wanted.topics, wanted.pattern, wanted.assignors)


def remember(group: GroupMetadata, member: MemberMetadata) -> None:
    """``member`` speaks for its instance from now on (if it names one)."""
    if member.instance_id is not None:
        group.static_members[member.instance_id] = member.member_id


def forget(group: GroupMetadata, member: MemberMetadata) -> None:
    """``member`` left its group: its instance is free."""
    if member.instance_id is not None and \
            group.static_members.get(member.instance_id) == member.member_id:
        del group.static_members[member.instance_id]


def assignor_key(member: MemberMetadata) -> str:
    """The name the assignor knows ``member`` by: "0 " and its instance id if it is
    static, else "1 " and its member id. Static members come first, in instance order
    (dynamic ones coming and going do not shift them), and no instance id can be
    taken for a member id."""
    return f"0 {member.instance_id}" if member.instance_id is not None else \
        f"1 {member.member_id}"
