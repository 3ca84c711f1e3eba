"""What the broker knows of one consumer group and its members (Kafka's GroupMetadata
and MemberMetadata): plain records the coordinator (``group_coordinator.py``) and
its offsets manager (``group_offsets.py``) read and change.

Rules
-----
* A group changes state only through :meth:`GroupMetadata.transition`, which checks
  the step against ``groups.TRANSITIONS`` (a programmer error otherwise: it asserts).
* Times are the broker's milliseconds, passed in by the coordinator; nothing here
  reads a clock or does I/O.
* A member's ``assignment`` is what the current generation gave it; ``owned`` is
  what it says it still holds (from ``owned_generation``), which a cooperative
  rebalance keeps from other members until it is given up.

Theory of operation
-------------------
One :class:`GroupMetadata` per group the broker coordinates, kept in the offsets
manager's ``groups``: its state, generation, chosen assignor (``protocol``) and
leader, its members by id, the rebalance's deadlines, its committed offsets by
partition (:class:`CommittedOffset`), its static members' instance ids and,
while it has no members, since when (for their expiry). Membership lives only
here (it is not stored): a broker that restarts, or a new coordinator after a
failover, knows the committed offsets and no members; they join again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..groups import GroupState, check_transition

__all__ = ["CommittedOffset", "GroupMetadata", "MemberMetadata"]


@dataclasses.dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    timestamp: int = -1


@dataclasses.dataclass
class MemberMetadata:
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
    instance_id: str | None = None         # group.instance.id: a static member (KIP-345)
    assignment: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, MemberMetadata] = dataclasses.field(default_factory=dict)
    rebalance_deadline_ms: int = 0         # joins are answered by then at the latest
    start_not_before_ms: int = 0           # the initial rebalance delay
    offsets: dict[tuple[str, int], CommittedOffset] = dataclasses.field(default_factory=dict)
    partition_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    empty_since_ms: int = 0                # when its last member went (offsets expiry)
    # {group.instance.id: the member id speaking for it} (``static_members.py``)
    static_members: dict[str, str] = dataclasses.field(default_factory=dict)

    def transition(self, state: GroupState) -> None:
        check_transition(self.state, state)
        self.state = state
