r"""Cluster metadata rules that need no I/O: where a new topic's replicas go, and how
``shmlog topics describe`` prints a topic's partitions.

Rules
-----
* Sans-I/O and light: plain ids, racks and lists in, plain values out; no ZooKeeper,
  no sockets, no numpy. The caller reads the live brokers and partition states (from
  ZooKeeper or its metadata cache) and passes them in.
* Replica assignment is Kafka 2.8's ``AdminUtils.assignReplicasToBrokers``, with its
  three goals: replicas spread evenly over the brokers; the other replicas of the
  partitions led by one broker spread over the other brokers; and, when every broker
  has a rack, each partition's replicas on distinct racks as far as there are racks.
* Refusals are Kafka's, with its messages: no partitions
  (:class:`~shmlog.common.errors.InvalidPartitionsError`), a replication factor below 1 or
  above the live brokers (:class:`~shmlog.common.errors.InvalidReplicationFactorError`), and
  racks on some brokers but not others
  (:class:`~shmlog.common.errors.InvalidReplicaAssignmentError`; ``rack_aware=False`` assigns
  without racks, as ``kafka-topics --disable-rack-aware`` does).
* The describe lines are ``kafka-topics --describe``'s at 2.8 (``TopicCommand``'s
  ``TopicDescription`` and ``PartitionDescription``), tab-separated.

Theory of operation
-------------------
**Without racks** the brokers are taken in id order (Kafka's ``getBrokerMetadatas``
sorts them). Partition ``p``'s first replica is broker ``(start + p) % n``: the
leaders go round-robin from a random start. Its other replicas follow the first at
an increasing distance: replica ``j`` (1-based) sits ``1 + (shift + j - 1) % (n - 1)``
places after the first, so it is never the first, and the shift (random too) grows
by one each time ``p`` wraps round the ``n`` brokers. Without that growth every
round would repeat the same follower sets; with it a broker's followers rotate.

**With racks** the brokers are first put in rack-alternated order: racks sorted by
name, each rack's brokers sorted by id, and one broker taken from each rack in turn
(Kafka's example: 0→rack1, 1→rack3, 2→rack3, 3→rack2, 4→rack2, 5→rack1 gives
0, 3, 1, 5, 4, 2). The first replica goes round-robin over that list as above; each
further replica walks on from it (the shift scaled by the number of racks) and skips
a broker whose rack already holds a replica while some rack holds none, or that
already holds one while some broker holds none. So a partition with as many replicas
as there are racks gets one replica per rack.

**Describe** prints a header line, then one line per partition in partition order::

    Topic: T\tTopicId: 3f2a…\tPartitionCount: 3\tReplicationFactor: 3\tConfigs: segment.ms=9
    \tTopic: T\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3

The leader is ``none`` when there is none (-1) or it is not a live broker (this
goes beyond Kafka's ZooKeeper-era describe, which printed a dead leader's id);
``Configs`` lists the topic's overrides, ``TopicId`` is left out when unknown, and
the replication factor is that of the lowest partition, as in Kafka.
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Mapping, Sequence

from ..common.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
)

__all__ = ["assign_replicas", "rack_alternated_brokers", "describe_lines", "NO_LEADER"]

# A partition state's leader when it has none (Kafka's LeaderAndIsr.NoLeader).
NO_LEADER = -1


def assign_replicas(brokers: Mapping[int, str | None], partitions: int,
                    replication_factor: int, start_index: int | None = None,
                    start_shift: int | None = None, *, rack_aware: bool = True,
                    first_partition: int = 0) -> dict[int, list[int]]:
    """The replicas of each new partition, the first being its preferred leader
    (Kafka's ``AdminUtils.assignReplicasToBrokers``).

    Parameters
    ----------
    brokers : mapping of broker id to rack (None: no rack)
        The live brokers.
    partitions : int
        How many partitions to assign.
    replication_factor : int
        Replicas per partition.
    start_index, start_shift : int, optional
        Where the round-robin of first replicas starts in the (rack-alternated)
        broker list, and the followers' initial shift; random when None. A start
        index given alone sets the shift too (Kafka's ``fixedStartIndex``).
    rack_aware : bool
        False ignores racks (``kafka-topics --disable-rack-aware``).
    first_partition : int
        The number of the first partition assigned (more partitions for a topic:
        Kafka's ``startPartitionId``); the round-robin continues from it.

    Returns
    -------
    dict of partition number to broker ids, for ``first_partition ..
    first_partition + partitions - 1``.

    Raises
    ------
    InvalidPartitionsError
        ``partitions`` < 1.
    InvalidReplicationFactorError
        ``replication_factor`` < 1 or above the number of brokers.
    InvalidReplicaAssignmentError
        Racks are used and some brokers have one while others do not.
    """
    if partitions <= 0:
        raise InvalidPartitionsError("Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(f"Replication factor: {replication_factor} larger "
                                            f"than available brokers: {len(brokers)}.")
    if first_partition < 0:
        raise InvalidPartitionsError(f"first_partition must be >= 0, got {first_partition}")
    racks = {broker: rack for broker, rack in brokers.items() if rack is not None}
    if not rack_aware or not racks:
        ordered = sorted(brokers)
        racks = {}
    elif len(racks) < len(brokers):
        raise InvalidReplicaAssignmentError(
            "Not all brokers have rack information for replica rack aware assignment "
            f"(no rack: {sorted(set(brokers) - set(racks))}); assign with rack_aware=False "
            "to ignore racks.")
    else:
        ordered = rack_alternated_brokers(racks)
    if start_index is None:
        start_index = random.randrange(len(ordered))
        if start_shift is None:
            start_shift = random.randrange(len(ordered))
    elif start_shift is None:
        start_shift = start_index
    if start_index < 0 or start_shift < 0:
        raise InvalidPartitionsError(f"start_index and start_shift must be >= 0, "
                                     f"got {start_index} and {start_shift}")
    count = len(ordered)
    assignment = {}
    for partition in range(first_partition, first_partition + partitions):
        # The shift grows by one each time the round-robin of leaders wraps round
        # (at each partition number > 0 that is a multiple of the broker count),
        # counted from the first partition assigned.
        wraps = partition // count - (max(first_partition, 1) - 1) // count
        assignment[partition] = _replicas_of(partition, ordered, racks, replication_factor,
                                             start_index, start_shift + wraps)
    return assignment


def _replicas_of(partition: int, ordered: Sequence[int], racks: Mapping[int, str],
                 replication_factor: int, start_index: int, shift: int) -> list[int]:
    count = len(ordered)
    first = (partition + start_index) % count
    if not racks:
        return [ordered[first]] + [ordered[_follower_index(first, shift, j, count)]
                                   for j in range(replication_factor - 1)]
    rack_count = len(set(racks.values()))
    replicas = [ordered[first]]
    racks_used = {racks[ordered[first]]}
    step = 0
    while len(replicas) < replication_factor:
        # Every other broker comes round within count - 1 steps, and one of them is
        # acceptable while a replica is missing (replication_factor <= count).
        assert step < replication_factor * count, "no acceptable broker: a bug"
        broker = ordered[_follower_index(first, shift * rack_count, step, count)]
        rack = racks[broker]
        step += 1
        if (rack not in racks_used or len(racks_used) == rack_count) and \
                (broker not in replicas or len(replicas) == count):
            replicas.append(broker)
            racks_used.add(rack)
    return replicas


def _follower_index(first: int, shift: int, follower: int, count: int) -> int:
    """Kafka's ``replicaIndex``: 1..count-1 places after the first, never on it."""
    return (first + 1 + (shift + follower) % (count - 1)) % count


def rack_alternated_brokers(racks: Mapping[int, str]) -> list[int]:
    """The brokers ordered one per rack in turn: racks by name, each rack's brokers by
    id (Kafka's ``getRackAlternatedBrokerList``)."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    queues = [by_rack[rack] for rack in sorted(by_rack)]
    ordered: list[int] = []
    for turn in range(max(len(queue) for queue in queues)):
        ordered += [queue[turn] for queue in queues if turn < len(queue)]
    return ordered


def describe_lines(topic: str, topic_id: str | None,
                   partitions: Mapping[int, tuple[int, Sequence[int], Sequence[int]]],
                   configs: Mapping[str, Any], live_brokers: Iterable[int], *,
                   marked_for_deletion: bool = False) -> list[str]:
    """``kafka-topics --describe``'s lines for one topic (2.8's format, no newlines).

    Parameters
    ----------
    topic : str
    topic_id : str or None
        Printed as ``TopicId`` when given.
    partitions : mapping of partition number to (leader, replicas, isr)
        The leader is a broker id or -1 (:data:`NO_LEADER`).
    configs : mapping of config name to value
        The topic's overrides (Kafka prints the non-default ones), sorted by name.
    live_brokers : iterable of int
        A leader not among them is printed as ``none``.
    marked_for_deletion : bool
        Adds ``MarkedForDeletion: true``, as Kafka does for a topic being deleted.
    """
    live = set(live_brokers)
    deletion = "\tMarkedForDeletion: true" if marked_for_deletion else ""
    numbers = sorted(partitions)
    replication_factor = len(partitions[numbers[0]][1]) if numbers else 0
    header = f"Topic: {topic}"
    if topic_id:
        header += f"\tTopicId: {topic_id}"
    overrides = ",".join(f"{name}={_config_text(configs[name])}" for name in sorted(configs))
    header += (f"\tPartitionCount: {len(numbers)}\tReplicationFactor: {replication_factor}"
               f"\tConfigs: {overrides}{deletion}")
    lines = [header]
    for number in numbers:
        leader, replicas, isr = partitions[number]
        shown = leader if leader != NO_LEADER and leader in live else "none"
        lines.append(f"\tTopic: {topic}\tPartition: {number}\tLeader: {shown}"
                     f"\tReplicas: {_ids(replicas)}\tIsr: {_ids(isr)}{deletion}")
    return lines


def _ids(brokers: Sequence[int]) -> str:
    return ",".join(str(broker) for broker in brokers)


def _config_text(value: Any) -> str:
    # Kafka's configs are strings: booleans print as true/false.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
