"""``shmlog cluster status``: the brokers, the controller, and the partitions that
need an operator (under-replicated, offline), read from ZooKeeper.

Rules
-----
* ZooKeeper is read, never written: not even a missing chroot is created (a typo
  in ``zookeeper.connect`` shows an empty cluster, not a new one).
* A partition is **under-replicated** when its ISR is smaller than its replica list
  (Kafka's UnderReplicatedPartitions), and **offline** when it has no leader or its
  leader is not a live broker (OfflinePartitionsCount); an offline partition is
  counted as under-replicated as well. A partition the controller has not yet given
  a state counts as offline.
* Leaders per broker count every live broker, those leading nothing too (the
  imbalance an operator looks for).

Theory of operation
-------------------
The partition states in ZooKeeper are what every broker's metadata cache follows
(``cluster_view``), so this is the cluster as its brokers will see it, whichever of
them is up. :func:`summarize` is pure (tested with made-up states); :func:`read`
does the reads; :func:`describe` prints what ``kafka-topics --describe
--under-replicated-partitions`` and Kafka's controller metrics would tell.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .zk.paths import NO_LEADER, BrokerRegistration, PartitionState, TopicAssignment

__all__ = ["ClusterStatus", "PartitionStatus", "summarize", "read", "describe"]


@dataclasses.dataclass(frozen=True)
class PartitionStatus:
    """One partition: its replicas (preferred order), leader (``NO_LEADER``: none),
    leader epoch and ISR (``()`` before the controller gave it a state)."""
    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    offline: bool

    @property
    def under_replicated(self) -> bool:
        return self.offline or len(self.isr) < len(self.replicas)


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """The live brokers (id -> registration), the controller's id (None: none
    elected), and every partition by (topic, partition)."""
    brokers: Mapping[int, BrokerRegistration]
    controller: int | None
    partitions: tuple[PartitionStatus, ...]

    @property
    def under_replicated(self) -> list[PartitionStatus]:
        return [status for status in self.partitions if status.under_replicated]

    @property
    def offline(self) -> list[PartitionStatus]:
        return [status for status in self.partitions if status.offline]

    @property
    def leaders_per_broker(self) -> dict[int, int]:
        counts = dict.fromkeys(self.brokers, 0)
        for status in self.partitions:
            if not status.offline:
                counts[status.leader] += 1
        return counts

    def as_dict(self) -> dict:
        """JSON-ready: what ``--json`` prints."""
        def partition(status: PartitionStatus) -> dict:
            return {"topic": status.topic, "partition": status.partition,
                    "replicas": list(status.replicas), "leader": status.leader,
                    "leader_epoch": status.leader_epoch, "isr": list(status.isr)}
        return {
            "brokers": [{"id": broker_id, "host": registration.host,
                         "replication_endpoint": registration.replication_endpoint,
                         "rack": registration.rack}
                        for broker_id, registration in self.brokers.items()],
            "controller": self.controller,
            "partitions": len(self.partitions),
            "under_replicated": [partition(status) for status in self.under_replicated],
            "offline": [partition(status) for status in self.offline],
            "leaders_per_broker": {str(broker_id): count
                                   for broker_id, count in self.leaders_per_broker.items()},
        }


def summarize(brokers: Mapping[int, BrokerRegistration], controller: int | None,
              assignments: Mapping[str, TopicAssignment],
              states: Mapping[tuple[str, int], PartitionState]) -> ClusterStatus:
    """The status of a cluster whose ZooKeeper holds these (see the module's rules)."""
    partitions = []
    for topic, assignment in sorted(assignments.items()):
        for number, replicas in assignment.partitions.items():
            state = states.get((topic, number))
            leader = NO_LEADER if state is None else state.leader
            partitions.append(PartitionStatus(
                topic, number, tuple(replicas), leader,
                -1 if state is None else state.leader_epoch,
                () if state is None else tuple(state.isr),
                offline=leader == NO_LEADER or leader not in brokers))
    return ClusterStatus(dict(sorted(brokers.items())), controller, tuple(partitions))


def read(zookeeper_connect: str) -> ClusterStatus:
    """Read the status from the ZooKeeper at ``zookeeper_connect`` (Kafka's
    ``zookeeper.connect``, chroot included).

    Raises
    ------
    ZooKeeperConnectionError
        No session with it.
    ZnodeFormatError
        A znode does not decode.
    """
    from .zk.client import ClusterZooKeeper
    zookeeper = ClusterZooKeeper(zookeeper_connect).start(create_paths=False)
    try:
        brokers = {broker_id: registration
                   for broker_id, (registration, _) in zookeeper.read_brokers().items()}
        controller = zookeeper.read_controller()
        assignments = zookeeper.read_assignments()
        states = {(topic, partition): state
                  for topic in assignments
                  for partition, (state, _) in zookeeper.read_partition_states(topic).items()}
    finally:
        zookeeper.close()
    return summarize(brokers, None if controller is None else controller.broker_id,
                     assignments, states)


def describe(status: ClusterStatus) -> str:
    """The status as text, for a terminal."""
    leaders = status.leaders_per_broker
    lines = [f"brokers: {len(status.brokers)} live"
             + ("" if status.controller is not None else ", no controller elected")]
    for broker_id, registration in status.brokers.items():
        role = "  (controller)" if broker_id == status.controller else ""
        rack = f"  rack {registration.rack}" if registration.rack else ""
        lines.append(f"  {broker_id:>4}  {registration.host}  "
                     f"{registration.replication_endpoint}{rack}  "
                     f"leads {leaders[broker_id]}{role}")
    lines.append(f"partitions: {len(status.partitions)}, under-replicated "
                 f"{len(status.under_replicated)}, offline {len(status.offline)}")
    for status_of in status.under_replicated:
        state = "offline" if status_of.offline else "under-replicated"
        lines.append(f"  {status_of.topic}-{status_of.partition}  {state}  leader "
                     f"{status_of.leader}  replicas {list(status_of.replicas)}  "
                     f"isr {list(status_of.isr)}")
    return "\n".join(lines)
