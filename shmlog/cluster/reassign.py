"""``shmlog cluster reassign``'s work (Kafka 2.8's ``ReassignPartitionsCommand`` over
ZooKeeper): propose a move, start it with its throttles, verify it and clear the
throttles, cancel it.

Rules
-----
* **generate** (``--generate``): each listed topic's partitions spread over the
  listed brokers by topic creation's assignment (``cluster_metadata.assign_replicas``,
  rack-aware like it), at the topic's replication factor; the current and the
  proposed assignment in the reassignment file's JSON. Nothing is written.
* **execute** (``--execute``): the request is checked whole first (the partitions
  and brokers exist, no replica list repeats: ``reassignment.check_request``) and
  refused while any of its partitions is moving already (named in the request
  znode, or with adding/removing replicas in its topic znode). With a throttle,
  the throttles are written *before* the request (so the move never runs
  unthrottled): the rate as ``leader.replication.throttled.rate`` and
  ``follower.replication.throttled.rate`` of every broker of the moving partitions
  (origin and target: ``modifyBrokerThrottles``), and on each topic the origin
  replicas as ``leader.replication.throttled.replicas`` and the new ones as
  ``follower.replication.throttled.replicas`` (``calculateLeaderThrottles``,
  ``calculateFollowerThrottles``). A request under way for other partitions is
  extended (a conditional rewrite of its znode), as KIP-455 lets moves overlap.
* **verify** (``--verify``): each partition complete, in progress or failed
  (``reassignment.status``); once all are complete the throttles are removed: the
  rates of every live broker and the throttled-replicas configs of the file's
  topics (``clearAllThrottles``).
* **cancel** (``--cancel``): each partition of the file that is moving gets its
  origin replicas as the target (the controller reverts it at once), and the
  throttles are removed (Kafka's ``--cancel`` without ``--preserve-throttles``).

Theory of operation
-------------------
The functions take a started :class:`~shmlog.cluster.zk.client.ClusterZooKeeper`; they write
only the request znode and configs. The controller carries the move out
(``controller``'s PartitionReassignment job), and the brokers take the throttles
from their watches.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

from ..common.errors import (
    InvalidReassignmentError,
    ReassignmentInProgressError,
    ShmlogError,
    UnknownTopicOrPartitionError,
    ZooKeeperConflictError,
)
from . import metadata as cluster_metadata
from .controller import reassignment
from .controller.reassignment import ReassignmentStatus
from .replication.throttle import (
    FOLLOWER_RATE_CONFIG,
    FOLLOWER_REPLICAS_CONFIG,
    LEADER_RATE_CONFIG,
    LEADER_REPLICAS_CONFIG,
)
from .zk import paths as zk_paths
from .zk.client import ClusterZooKeeper

__all__ = ["Request", "encode_request", "decode_topics", "generate", "execute", "verify",
           "cancel", "clear_throttles"]

# What a reassignment file holds: target replicas by (topic, partition).
Request = Mapping[tuple[str, int], Sequence[int]]
TOPICS_VERSION = 1


def encode_request(request: Request) -> str:
    """A request as the reassignment file's JSON (Kafka's format)."""
    return zk_paths.encode_reassignment({key: tuple(replicas)
                                         for key, replicas in request.items()}).decode()


def decode_topics(text: str, what: str) -> list[str]:
    """The topics of a ``--topics-to-move-json-file`` (``{"topics":[{"topic":"t"}],
    "version":1}``).

    Raises
    ------
    ShmlogError
        It is not that form.
    """
    try:
        body = json.loads(text)
        topics = [entry["topic"] for entry in body["topics"]]
    except (ValueError, KeyError, TypeError):
        raise ShmlogError(f"{what}: expected {{\"topics\":[{{\"topic\":\"name\"}}],"
                          f"\"version\":{TOPICS_VERSION}}}") from None
    if not topics or not all(isinstance(topic, str) and topic for topic in topics):
        raise ShmlogError(f"{what}: no topics, or a topic that is not a name: {topics}")
    return topics


def _current(zookeeper: ClusterZooKeeper, topics: Iterable[str]) -> dict:
    """{(topic, partition): (replicas, moving, its topic's assignment)} of every
    partition of ``topics`` that exists."""
    found = {}
    for topic in sorted(set(topics)):
        assignment = zookeeper.read_assignment(topic)
        if assignment is None:
            continue
        for partition, replicas in assignment.partitions.items():
            moving = bool(assignment.adding_replicas.get(partition)
                          or assignment.removing_replicas.get(partition))
            found[(topic, partition)] = (replicas, moving, assignment)
    return found


def generate(zookeeper: ClusterZooKeeper, topics: Sequence[str], broker_ids: Sequence[int],
             rack_aware: bool = True) -> tuple[dict, dict]:
    """(current, proposed) assignments of ``topics`` over ``broker_ids`` (see the
    module's rules).

    Raises
    ------
    UnknownTopicOrPartitionError, InvalidReassignmentError, InvalidReplicationFactorError
    """
    registered = {broker_id: registration.rack
                  for broker_id, (registration, _) in zookeeper.read_brokers().items()}
    unknown = sorted(set(broker_ids) - set(registered))
    if unknown:
        raise InvalidReassignmentError(f"--broker-list names brokers not registered: {unknown}")
    racks = {broker_id: registered[broker_id] for broker_id in broker_ids}
    current, proposed = {}, {}
    for topic in topics:
        assignment = zookeeper.read_assignment(topic)
        if assignment is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        replication_factor = len(assignment.partitions[0])
        spread = cluster_metadata.assign_replicas(racks, len(assignment.partitions),
                                                  replication_factor, rack_aware=rack_aware)
        for partition, replicas in assignment.partitions.items():
            current[(topic, partition)] = replicas
            proposed[(topic, partition)] = tuple(spread[partition])
    return current, proposed


def _check(zookeeper: ClusterZooKeeper, request: Request) -> dict:
    """Refuse a request whole, or one moving a partition that moves already; the
    current assignment of its partitions."""
    topics = {topic for topic, _ in request}
    current = _current(zookeeper, topics)
    counts = {}
    for (topic, _), (_, _, assignment) in current.items():
        counts[topic] = len(assignment.partitions)
    reassignment.check_request(request, counts, zookeeper.read_brokers())
    found = zookeeper.read_reassignment()
    requested = set(found[0]) if found is not None else set()
    busy = sorted(key for key in request if key in requested or current[key][1])
    if busy:
        raise ReassignmentInProgressError(
            f"a reassignment is in progress for {', '.join(f'{t}-{p}' for t, p in busy)}: "
            f"verify it until it completes, or cancel it, first")
    return current


def execute(zookeeper: ClusterZooKeeper, request: Request,
            throttle_bytes_per_s: int | None = None) -> dict:
    """Start moving ``request``'s partitions (see the module's rules); the current
    assignment of its partitions, {(topic, partition): replicas} (the rollback).

    Raises
    ------
    InvalidReassignmentError
        The request is refused whole; nothing was written.
    ReassignmentInProgressError
        One of its partitions moves already; nothing was written.
    """
    current = _check(zookeeper, request)
    moves = {key: (current[key][0], tuple(replicas)) for key, replicas in request.items()}
    if throttle_bytes_per_s is not None:
        _write_throttles(zookeeper, moves, throttle_bytes_per_s)
    targets = {key: tuple(replicas) for key, replicas in request.items()}
    for _ in range(2):
        found = zookeeper.read_reassignment()
        try:
            if found is None:
                zookeeper.create_reassignment(targets)
            else:
                zookeeper.replace_reassignment({**found[0], **targets}, found[1])
            break
        except (ReassignmentInProgressError, ZooKeeperConflictError):
            continue                  # the request came or went meanwhile: read it again
    else:
        raise ReassignmentInProgressError("the reassignment request kept changing under "
                                          "this one: try again")
    return {key: current[key][0] for key in request}


def _write_throttles(zookeeper: ClusterZooKeeper, moves: dict, rate: int) -> None:
    by_topic: dict[str, dict[int, tuple]] = {}
    brokers = set()
    for (topic, partition), (origin, target) in moves.items():
        by_topic.setdefault(topic, {})[partition] = (origin, target)
        if set(origin) != set(target):
            brokers |= set(origin) | set(target)
    for broker_id in sorted(brokers):
        config = zookeeper.read_broker_config(broker_id)
        zookeeper.set_broker_config(broker_id, {**config, LEADER_RATE_CONFIG: str(rate),
                                                FOLLOWER_RATE_CONFIG: str(rate)})
    for topic, topic_moves in sorted(by_topic.items()):
        config = zookeeper.read_topic_config(topic)
        zookeeper.set_topic_config(topic, {
            **config,
            LEADER_REPLICAS_CONFIG: reassignment.leader_throttled_replicas(topic_moves),
            FOLLOWER_REPLICAS_CONFIG: reassignment.follower_throttled_replicas(topic_moves)})


def verify(zookeeper: ClusterZooKeeper, request: Request) -> tuple[dict, bool]:
    """Each partition's :class:`ReassignmentStatus`, and whether the throttles were
    cleared (all complete)."""
    current = _current(zookeeper, {topic for topic, _ in request})
    found = zookeeper.read_reassignment()
    requested = set(found[0]) if found is not None else set()
    statuses = {}
    for key, target in sorted(request.items()):
        replicas, moving, _ = current.get(key, ((), False, None))
        statuses[key] = reassignment.status(tuple(target), replicas, moving, key in requested)
    complete = all(verdict is ReassignmentStatus.COMPLETE for verdict in statuses.values())
    if complete:
        clear_throttles(zookeeper, {topic for topic, _ in request})
    return statuses, complete


def cancel(zookeeper: ClusterZooKeeper, request: Request) -> list[tuple[str, int]]:
    """Revert every partition of ``request`` that is moving to its origin replicas,
    and clear the throttles; the partitions cancelled."""
    current = _current(zookeeper, {topic for topic, _ in request})
    origins = {}
    for key in request:
        if key in current and current[key][1]:
            _, _, assignment = current[key]
            origins[key] = reassignment.origin_replicas(
                assignment.partitions[key[1]], assignment.adding_replicas.get(key[1], ()))
    if origins:
        found = zookeeper.read_reassignment()
        if found is None:
            zookeeper.create_reassignment(origins)
        else:
            zookeeper.replace_reassignment({**found[0], **origins}, found[1])
    clear_throttles(zookeeper, {topic for topic, _ in request})
    return sorted(origins)


def clear_throttles(zookeeper: ClusterZooKeeper, topics: Iterable[str]) -> None:
    """Remove the throttle rates of every live broker and the throttled replicas of
    ``topics`` (Kafka's ``clearAllThrottles``); configs without them are not written."""
    for broker_id in zookeeper.read_brokers():
        config = zookeeper.read_broker_config(broker_id)
        kept = {name: value for name, value in config.items()
                if name not in (LEADER_RATE_CONFIG, FOLLOWER_RATE_CONFIG)}
        if kept != config:
            zookeeper.set_broker_config(broker_id, kept)
    for topic in sorted(set(topics)):
        if zookeeper.read_assignment(topic) is None:
            continue
        config = zookeeper.read_topic_config(topic)
        kept = {name: value for name, value in config.items()
                if name not in (LEADER_REPLICAS_CONFIG, FOLLOWER_REPLICAS_CONFIG)}
        if kept != config:
            zookeeper.set_topic_config(topic, kept)
