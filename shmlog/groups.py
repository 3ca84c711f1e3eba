"""Consumer groups: the protocol the broker's coordinator and the consumer's member
share, and the face of the subsystem. This module holds only what both sides need:
the group states and their transition table, the shapes of the requests' fields
(group ids, member ids, partitions) and their limits, and where a group's commits
live. It loads neither side.

The sides
---------
* The coordinator (``broker/group_coordinator.py``, Kafka's GroupCoordinator):
  memberships, generations and assignments of every group of a broker, and the
  requests; it keeps the groups and their committed offsets in an offsets manager
  (``broker/group_offsets.py``, Kafka's GroupMetadataManager) over the state of a
  group and its members (``broker/group_metadata.py``).
* The member (``client/group_member.py``, the consumer's side of Kafka's
  AbstractCoordinator): joins, syncs, heartbeats, commits and fetches offsets for
  one consumer.

Rules
-----
* A partition of a subscribed topic belongs to at most one member of a generation.
  Eager assignors (``range``, ``roundrobin``) get there by every member giving up all
  of its partitions before it joins again; ``cooperative-sticky`` by keeping a
  partition from its new owner until the old one has given it up (one more round).
* Every request from a member carries its member id and generation; a request of a
  generation that is over is refused (:class:`IllegalGenerationError`): a member that
  was fenced cannot commit offsets for partitions that moved on.
* A member names itself (:func:`new_member_id`: its client id, cut to
  :data:`limits.CLIENT_ID_LENGTH_MAX`, and a random UUID), so a first join sent again after a
  timeout is the same member; an id longer than :data:`MEMBER_ID_LENGTH_MAX` is none.
* A group's committed offsets are records of the compacted topic
  ``__consumer_offsets``, in its partition :func:`offsets_partition` (whose leader
  coordinates the group in a cluster).
* A request's fields are checked where they come in (:func:`require_group_id`,
  :func:`require_partition`): a malformed one is a :class:`LocalProtocolError`.

Theory of operation
-------------------
A group moves through the states of :class:`GroupState` along :data:`TRANSITIONS`
(:func:`check_transition` asserts each step, so a test can walk every edge):

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
"""

from __future__ import annotations

import enum
import uuid
import zlib

from .common import limits
from .common.errors import LocalProtocolError
from .common.internal_topics import INTERNAL_TOPICS, OFFSETS_TOPIC
from .protocol.control import require

__all__ = ["GroupState", "TRANSITIONS", "check_transition", "OFFSETS_TOPIC", "INTERNAL_TOPICS",
           "offsets_partition", "new_member_id", "require_group_id", "require_partition",
           "MEMBER_ID_LENGTH_MAX"]

# A member id: a client id, a dash and 32 hex digits (new_member_id).
MEMBER_ID_LENGTH_MAX = limits.CLIENT_ID_LENGTH_MAX + 33


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


def check_transition(source: GroupState, target: GroupState) -> None:
    """Assert that a group may move from ``source`` to ``target`` (a coordinator that
    tries another step has a bug: it crashes)."""
    assert target in TRANSITIONS[source], f"{source} -> {target}"


def new_member_id(client_id: str) -> str:
    """A member id no other member has: the client id and a random UUID."""
    return f"{client_id[:limits.CLIENT_ID_LENGTH_MAX] or 'consumer'}-{uuid.uuid4().hex}"


def offsets_partition(group_id: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` that holds a group's commits."""
    return zlib.crc32(group_id.encode()) % partitions


def require_group_id(value) -> str:
    """A request's group id: a non-empty string."""
    value = require(value, str, "group_id")
    if not value:
        raise LocalProtocolError("group_id must be a non-empty string")
    return value


def require_partition(entry) -> tuple[str, int]:
    """A request's partition: ``[topic, partition]``."""
    pair = require(entry, list, "partition")
    if len(pair) != 2:
        raise LocalProtocolError(f"a partition is [topic, partition], got {pair!r:.100}")
    return require(pair[0], str, "topic"), require(pair[1], int, "partition")
