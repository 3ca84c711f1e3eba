"""Preferred leader election on demand, the operator's side (``shmlog cluster
elect-leaders``): Kafka 2.8's ``kafka-leader-election.sh --election-type preferred``,
carried over ZooKeeper as ``kafka-preferred-replica-election.sh --zookeeper`` did.

Rules
-----
* The request is Kafka's znode and body, ``/admin/preferred_replica_election``
  (``zk_paths``); one election at a time (Kafka's rule: a pending one refuses the
  next with :class:`PreferredElectionInProgressError`).
* Only partitions that exist are asked for: an unknown topic or partition is
  refused before anything is written (:class:`UnknownTopicOrPartitionError`).
* The controller deletes the znode once it has elected; the command waits for that
  (bounded: :class:`LeaderElectionTimeoutError`, the request then left for the next
  controller), then reads every partition's state back and says per partition
  what happened (``leader_balance.preferred_election_result``): elected, already
  the preferred leader, or why not (not alive, not in sync, shutting down).

Theory of operation
-------------------
Kafka's AdminClient gets the outcome per partition in the ElectLeadersResponse; the
ZooKeeper request has no answer, so the states before and after are compared, with
the live brokers read after the election.
"""

from __future__ import annotations

import dataclasses
import time

from ...common import limits
from ...common.errors import LeaderElectionTimeoutError, UnknownTopicOrPartitionError
from ..zk.client import ClusterZooKeeper
from ..zk.paths import NO_LEADER
from .leader_balance import PreferredOutcome, preferred_election_result, preferred_replica

__all__ = ["PartitionElection", "elect_preferred_leaders", "describe"]


@dataclasses.dataclass(frozen=True)
class PartitionElection:
    """One partition's outcome: its leader (``NO_LEADER``: none) and leader epoch
    (-1: no state) afterwards."""
    topic: str
    partition: int
    preferred: int
    outcome: PreferredOutcome
    leader: int
    leader_epoch: int

    def as_dict(self) -> dict:
        """For ``--json``."""
        return {"topic": self.topic, "partition": self.partition, "preferred": self.preferred,
                "outcome": self.outcome.name.lower(), "ok": self.outcome.ok,
                "leader": self.leader, "leader_epoch": self.leader_epoch}


def elect_preferred_leaders(zookeeper_connect: str, topic: str | None = None,
                            partition: int | None = None,
                            timeout_ms: int = limits.ELECT_LEADERS_TIMEOUT_MS_DEFAULT
                            ) -> list[PartitionElection]:
    """Ask the controller to elect the preferred leader of every partition (no
    ``topic``), of ``topic``'s partitions, or of one, and say what it did.

    Raises
    ------
    UnknownTopicOrPartitionError
        ``topic`` or ``partition`` does not exist.
    PreferredElectionInProgressError
        An election asked for earlier is still pending.
    LeaderElectionTimeoutError
        The controller did not act within ``timeout_ms``.
    ZooKeeperConnectionError
        ZooKeeper cannot be reached.
    """
    zookeeper = ClusterZooKeeper(zookeeper_connect).start(create_paths=False)
    try:
        assignments = _chosen(zookeeper, topic, partition)
        before = {key: _state(zookeeper, *key) for key in assignments}
        zookeeper.request_preferred_replica_election(sorted(assignments))
        deadline = time.monotonic() + timeout_ms / 1000
        while zookeeper.read_preferred_replica_election() is not None:
            if time.monotonic() > deadline:
                raise LeaderElectionTimeoutError(
                    f"no controller carried out the preferred replica election within "
                    f"{timeout_ms} ms: is a broker running? The request stays in ZooKeeper "
                    f"for the next controller")
            time.sleep(limits.ELECT_LEADERS_POLL_S)
        live = {broker_id: epoch for broker_id, (_, epoch) in zookeeper.read_brokers().items()}
        shutting = {broker_id for broker_id, epoch in zookeeper.read_controlled_shutdowns().items()
                    if live.get(broker_id) == epoch}
        elections = []
        for (name, number), replicas in sorted(assignments.items()):
            after = _state(zookeeper, name, number)
            outcome = preferred_election_result(before[(name, number)], after, replicas, live,
                                                shutting)
            leader, epoch = (NO_LEADER, -1) if after is None else (after.leader,
                                                                   after.leader_epoch)
            elections.append(PartitionElection(name, number, preferred_replica(replicas),
                                               outcome, leader, epoch))
        return elections
    finally:
        zookeeper.close()


def _chosen(zookeeper: ClusterZooKeeper, topic: str | None,
            partition: int | None) -> dict[tuple[str, int], tuple[int, ...]]:
    """(topic, partition) → replicas of the partitions asked for."""
    assignments = zookeeper.read_assignments()
    if topic is not None and topic not in assignments:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    chosen = {(name, number): replicas for name, assignment in assignments.items()
              if topic is None or name == topic
              for number, replicas in assignment.partitions.items()
              if partition is None or number == partition}
    if not chosen:
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} has no partition {partition}" if topic is not None
            else "the cluster has no topics")
    return chosen


def _state(zookeeper: ClusterZooKeeper, topic: str, partition: int):
    found = zookeeper.read_partition_state(topic, partition)
    return None if found is None else found[0]


def describe(elections: list[PartitionElection]) -> str:
    """One line per partition, the failed ones saying why."""
    lines = []
    for election in elections:
        line = f"{election.topic}-{election.partition}: {election.outcome.value}"
        if election.outcome.ok:
            line += f" (leader {election.preferred}, epoch {election.leader_epoch})"
        else:
            line += (f" (preferred {election.preferred}, leader "
                     f"{election.leader if election.leader != NO_LEADER else 'none'})")
        lines.append(line)
    failed = sum(not election.outcome.ok for election in elections)
    lines.append(f"{len(elections) - failed} of {len(elections)} partitions led by their "
                 f"preferred replica" + (f"; {failed} failed" if failed else ""))
    return "\n".join(lines)
