"""Partition assignors for consumer groups: which member of a group reads which partition.

The group coordinator computes assignments itself (as in Kafka's KIP-848), calling
``assign`` with the topics' partition counts and every member's subscription.

Rules
-----
- Pure functions: no I/O, no clock, no randomness. The same input gives the same output,
  because members, topics and partitions are always visited in sorted order.
- Only partitions of topics in ``partitions_per_topic`` are assigned, and only to members
  subscribed to their topic. A subscription to an unknown topic yields nothing.
- Every member appears in the result, with a sorted (perhaps empty) list.
- The eager assignors (``range``, ``roundrobin``) assign every eligible partition exactly
  once and never set ``revoking``: their members give up everything before rejoining.
- ``cooperative-sticky`` never gives a partition to a member while another member may
  still be consuming it. Such a partition is left out for one round and ``revoking`` is
  set; the coordinator rebalances again once the owners have released it.

Theory of operation
-------------------
``range`` splits each topic into contiguous runs over its subscribers sorted by id; the
first ``partitions % members`` get one extra. ``roundrobin`` deals all partitions, sorted,
to members sorted by id, skipping members not subscribed to the topic (Kafka's circular
iterator); a bisect over each topic's subscribers does the skipping in O(log M).

``cooperative-sticky`` works in four steps:

1. *Holders.* For each partition that exists, the members that claim it in their
   ``owned`` with the newest generation any claim on it carries. Older claims are stale:
   that member lost the partition in a later generation. A sole holder still subscribed
   to the topic keeps the partition; a tie, or an unsubscribed holder, leaves it unowned.
2. *Fill.* Unowned partitions go to the least-loaded member able to take them. Topics
   with the same subscribers form a *group*; each group keeps a heap of its members by
   load, and partitions of smaller groups go first, since fewer members can take them.
3. *Balance.* While some member holds a partition that a member with at least two fewer
   partitions could take, the most-loaded such member gives one away: first only newly
   placed partitions, then kept ones if that is not enough, so the result stays sticky.
   Each move lowers the sum of squared loads, so this ends: with loads within one when
   subscriptions are equal, otherwise when no single move helps. Such a local optimum is
   not always the best, and a later round may find a better one and revoke again, so
   unequal subscriptions can take more than two rounds to settle.
4. *Cooperative rule.* A partition goes to its target now only if no other member holds
   it. Otherwise the holders lose it this round and nobody gets it yet (Kafka's
   ``partitionsTransferringOwnership``).

Cost: O((P + M)·G·log M) for P partitions, M members and G groups (usually one).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections import defaultdict

from ..common.errors import InvalidPartitionsError, LocalProtocolError

__all__ = ["TopicPartition", "Subscription", "AssignmentResult", "ASSIGNORS", "assign"]

TopicPartition = tuple[str, int]

ASSIGNORS: tuple[str, ...] = ("range", "roundrobin", "cooperative-sticky")


@dataclasses.dataclass(frozen=True)
class Subscription:
    """One member's view: the topics it reads and, for cooperative assignors, what it owns.

    ``topics`` are already resolved from patterns. ``owned`` may be stale or name
    partitions that no longer exist; ``generation`` is the one in which the member owned
    them (-1: none).
    """

    member_id: str
    topics: tuple[str, ...]
    owned: tuple[TopicPartition, ...] = ()
    generation: int = -1


@dataclasses.dataclass(frozen=True)
class AssignmentResult:
    """Member id -> sorted partitions, for every member; ``revoking`` is True when some
    partitions were withheld until their holders release them (run another rebalance)."""

    assignment: dict[str, list[TopicPartition]]
    revoking: bool


def assign(name: str, partitions_per_topic: dict[str, int],
           subscriptions: dict[str, Subscription]) -> AssignmentResult:
    """Assign the partitions of the subscribed topics to the members of one group.

    Parameters
    ----------
    name
        One of ``ASSIGNORS``.
    partitions_per_topic
        Topic -> partition count, for the topics that exist.
    subscriptions
        Member id -> that member's subscription.

    Returns
    -------
    AssignmentResult
        A sorted partition list for every member, and whether partitions were withheld.

    Raises
    ------
    LocalProtocolError
        Unknown assignor, or a subscription filed under another member's id.
    InvalidPartitionsError
        A negative partition count.
    """
    _check_name(name)
    for topic, count in partitions_per_topic.items():
        if count < 0:
            raise InvalidPartitionsError(f"topic {topic!r}: partition count {count} < 0")
    for member_id, subscription in subscriptions.items():
        if subscription.member_id != member_id:
            raise LocalProtocolError(f"subscription under key {member_id!r} names member "
                                     f"{subscription.member_id!r}")
    members = sorted(subscriptions)
    subscribers: dict[str, list[str]] = defaultdict(list)   # topic -> sorted member ids
    for member in members:
        for topic in sorted(set(subscriptions[member].topics)):
            if topic in partitions_per_topic:
                subscribers[topic].append(member)
    if name == "range":
        assignment, revoking = _range(partitions_per_topic, subscribers), False
    elif name == "roundrobin":
        assignment, revoking = _roundrobin(partitions_per_topic, subscribers, members), False
    else:
        assignment, revoking = _cooperative_sticky(partitions_per_topic, subscribers,
                                                   subscriptions)
    return AssignmentResult({member: sorted(assignment.get(member, ())) for member in members},
                            revoking)


def _check_name(name: str) -> None:
    if name not in ASSIGNORS:
        raise LocalProtocolError(f"unknown assignor {name!r}; expected one of {ASSIGNORS}")


def _range(partitions_per_topic, subscribers):
    assignment = defaultdict(list)
    for topic, members in subscribers.items():
        quotient, remainder = divmod(partitions_per_topic[topic], len(members))
        start = 0
        for index, member in enumerate(members):
            length = quotient + (1 if index < remainder else 0)
            assignment[member].extend((topic, partition)
                                      for partition in range(start, start + length))
            start += length
    return assignment


def _roundrobin(partitions_per_topic, subscribers, members):
    assignment = defaultdict(list)
    position = {member: index for index, member in enumerate(members)}
    cursor = 0   # the circular iterator: index of the member dealt to next
    for topic in sorted(subscribers):
        candidates = [position[member] for member in subscribers[topic]]   # ascending
        for partition in range(partitions_per_topic[topic]):
            # The first subscriber at or after the cursor, wrapping around: what Kafka's
            # iterator reaches by skipping unsubscribed members one at a time.
            slot = bisect.bisect_left(candidates, cursor)
            chosen = candidates[slot % len(candidates)]
            assignment[members[chosen]].append((topic, partition))
            cursor = (chosen + 1) % len(members)
    return assignment


def _holders(partitions_per_topic, subscriptions):
    """Partition -> the members claiming it in the newest generation claimed for it."""
    newest: dict[TopicPartition, tuple[int, list[str]]] = {}
    for member in sorted(subscriptions):
        subscription = subscriptions[member]
        for topic, partition in sorted(set(map(tuple, subscription.owned))):
            if not 0 <= partition < partitions_per_topic.get(topic, 0):
                continue   # the topic or partition is gone: nobody can be reading it
            generation, claimants = newest.get((topic, partition),
                                               (subscription.generation, []))
            if subscription.generation > generation:
                generation, claimants = subscription.generation, []
            if subscription.generation == generation:
                claimants.append(member)
            newest[(topic, partition)] = (generation, claimants)
    return {partition: claimants for partition, (_, claimants) in newest.items()}


class _Loads:
    """Partition count per member, with heaps that find the least-loaded member of a group
    and the most-loaded member overall in O(log M).

    A change pushes fresh heap entries and leaves the old ones in place: an entry counts
    only while its load equals the member's load now, and stale ones are dropped when
    they reach the top. This avoids searching a heap to update an entry in place.
    """

    def __init__(self, members, groups_of_member, group_count):
        self.load = {member: 0 for member in members}
        self._groups_of_member = groups_of_member
        self._least: list[list[tuple[int, str]]] = [[] for _ in range(group_count)]
        self._most: list[tuple[int, str]] = []
        for member in members:
            self._push(member)

    def _push(self, member):
        load = self.load[member]
        for group in self._groups_of_member[member]:
            heapq.heappush(self._least[group], (load, member))
        heapq.heappush(self._most, (-load, member))

    def change(self, member, delta):
        self.load[member] += delta
        self._push(member)

    def least_loaded(self, group):
        """(load, member) of the group's least-loaded member, ties to the smallest id."""
        heap = self._least[group]
        while heap[0][0] != self.load[heap[0][1]]:
            heapq.heappop(heap)   # never empties: each member's newest entry is current
        return heap[0]

    def pop_most_loaded(self):
        """The most-loaded member not yet popped since its last change, or None."""
        while self._most:
            negative_load, member = heapq.heappop(self._most)
            if -negative_load == self.load[member]:
                return member
        return None

    def restart(self):
        """Make every member poppable again, for another balancing pass."""
        self._most = [(-load, member) for member, load in self.load.items()]
        heapq.heapify(self._most)


def _cooperative_sticky(partitions_per_topic, subscribers, subscriptions):
    members = sorted(subscriptions)
    holders = _holders(partitions_per_topic, subscriptions)
    subscribed = {member: set(subscriptions[member].topics) for member in members}
    # Topics with the same subscribers are interchangeable for balancing: one heap each.
    group_of_topic: dict[str, int] = {}
    group_of_subscribers: dict[tuple[str, ...], int] = {}
    groups_of_member: dict[str, list[int]] = {member: [] for member in members}
    for topic in sorted(subscribers):
        key = tuple(subscribers[topic])
        if key not in group_of_subscribers:
            group_of_subscribers[key] = len(group_of_subscribers)
            for member in key:
                groups_of_member[member].append(group_of_subscribers[key])
        group_of_topic[topic] = group_of_subscribers[key]
    loads = _Loads(members, groups_of_member, len(group_of_subscribers))
    # member -> group -> partitions; kept ones first, so later pops give away new ones.
    holding = {member: defaultdict(list) for member in members}
    unowned = []
    for topic in sorted(subscribers):
        group = group_of_topic[topic]
        for partition in range(partitions_per_topic[topic]):
            claimants = holders.get((topic, partition), ())
            if len(claimants) == 1 and topic in subscribed[claimants[0]]:
                holding[claimants[0]][group].append((topic, partition))
                loads.change(claimants[0], +1)
            else:
                unowned.append((len(subscribers[topic]), topic, partition))
    # Counted before the fill: each list's first kept_count entries are partitions it kept.
    kept_count = {member: {group: len(partitions) for group, partitions in by_group.items()}
                  for member, by_group in holding.items()}
    for _, topic, partition in sorted(unowned):
        group = group_of_topic[topic]
        _, member = loads.least_loaded(group)
        holding[member][group].append((topic, partition))
        loads.change(member, +1)
    # Moving only newly placed partitions first often reaches balance with nothing revoked;
    # kept partitions move only if that is not enough.
    _balance(holding, loads, kept_count)
    _balance(holding, loads, {})
    # The cooperative rule: nobody gets a partition that another member may still consume.
    assignment: dict[str, list[TopicPartition]] = {}
    revoking = False
    for member in members:
        assignment[member] = []
        for partitions in holding[member].values():
            for partition in partitions:
                if all(holder == member for holder in holders.get(partition, ())):
                    assignment[member].append(partition)
                else:
                    revoking = True
    return assignment, revoking


def _balance(holding, loads, fixed_count):
    """Move partitions from heavy to light members until no move lowers the spread.

    ``fixed_count[member][group]`` partitions at the front of that list must stay.
    """
    moved = True
    while moved:
        # A member that found no receiver may find one after others gave partitions away;
        # a pass that moves nothing proves no improving move is left.
        moved = False
        loads.restart()
        while (donor := loads.pop_most_loaded()) is not None:
            best = None   # (receiver load, group, receiver)
            for group, partitions in holding[donor].items():
                if len(partitions) > fixed_count.get(donor, {}).get(group, 0):
                    receiver_load, receiver = loads.least_loaded(group)
                    candidate = (receiver_load, group, receiver)
                    improves = receiver_load <= loads.load[donor] - 2
                    if improves and (best is None or candidate < best):
                        best = candidate
            if best is None:
                continue
            _, group, receiver = best
            holding[receiver][group].append(holding[donor][group].pop())
            loads.change(donor, -1)
            loads.change(receiver, +1)
            moved = True
