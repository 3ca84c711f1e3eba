"""The controller's preferred replica elections: on demand and for leader balance
(Kafka 2.8's ``KafkaController.onReplicaElection`` and
``checkAndTriggerAutoLeaderRebalance``); the rules are ``leader_balance``'s.

Rules
-----
* **On demand**: the partitions ``/admin/preferred_replica_election`` lists get
  their preferred leader where it can lead, and the znode is deleted in the same
  checked multi as the elections. A request that does not decode is deleted too
  (Kafka logs and drops it: one left would block every later one).
* **Automatic**: every ``leader.imbalance.check.interval.seconds`` while
  ``auto.leader.rebalance.enable``, the partitions of the brokers above the
  imbalance threshold (``leader_balance.rebalance_candidates``), leaving alone the
  topics marked for deletion and the partitions being reassigned, as Kafka does.
  The first check is one interval after the election. It finds the imbalance from
  the controller's cached states (``controller_context.StateCache``): a check
  every few seconds must not read thousands of states.
* A preferred replica is elected only when it is live, in the ISR and not shutting
  down (``leader_balance.preferred_election``), decided from fresh reads of the
  partitions to elect; a multi refused
  for a stale version is read and decided again (bounded).

Theory of operation
-------------------
The elector holds the time of the next automatic check, and shares the
controller's state cache; the controller asks
:meth:`PreferredLeaderElector.rebalance_due` on each turn of its loop while
elected, and runs :meth:`PreferredLeaderElector.elect_on_demand` when the znode
changes, when the session comes back, and right after an election (a request made
before it).
"""

from __future__ import annotations

import logging
import time

from ...common import limits
from ...common.errors import StaleStateVersionError, ZnodeFormatError, ZooKeeperConflictError
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.session import DeleteOp
from ..zk.state_changes import state_set_op
from . import leader_balance
from .controller_context import (
    ControllerEpoch,
    StateCache,
    read_brokers_shutting_down,
    read_live_brokers,
)

__all__ = ["PreferredLeaderElector"]

log = logging.getLogger(__name__)


class PreferredLeaderElector:
    """Controller ``broker_id``'s preferred replica elections (see the module's rules).

    Parameters
    ----------
    zookeeper : ClusterZooKeeper
        The broker's started session.
    broker_id : int
        This broker's id (for the log).
    rebalance : leader_balance.RebalancePolicy
        The automatic preferred leader election's settings.
    cache : StateCache
        The controller's partition states (the automatic check's leaders).
    """

    def __init__(self, zookeeper: ClusterZooKeeper, broker_id: int,
                 rebalance: leader_balance.RebalancePolicy, cache: StateCache):
        self.zookeeper = zookeeper
        self.broker_id = broker_id
        self.rebalance = rebalance
        self.cache = cache
        self._next_rebalance: float | None = None

    def schedule_rebalance(self, elected_at: float) -> None:
        """Check the balance first one interval after ``elected_at`` (monotonic)."""
        self._next_rebalance = elected_at + self.rebalance.check_interval_s

    def rebalance_due(self) -> bool:
        """Whether an automatic check is due now (it then schedules the next one).
        Never while the session is suspended, nor before :meth:`schedule_rebalance`."""
        if not self.rebalance.enable or self._next_rebalance is None:
            return False
        if self.zookeeper.suspended.is_set() or time.monotonic() < self._next_rebalance:
            return False
        self._next_rebalance = time.monotonic() + self.rebalance.check_interval_s
        return True

    def elect_on_demand(self, elected: ControllerEpoch) -> None:
        """The partitions ``/admin/preferred_replica_election`` lists get their
        preferred leader where it can lead; the znode goes in the same multi."""
        try:
            pending = self.zookeeper.read_preferred_replica_election()
        except ZnodeFormatError as error:
            # Kafka logs and drops a request it cannot read: one left would block
            # every later one.
            log.error("controller %d: %s; deleting it", self.broker_id, error)
            self.zookeeper.checked_multi([DeleteOp(zk_paths.PREFERRED_REPLICA_ELECTION_PATH)],
                                         elected.zk_version)
            return
        if pending is not None:
            partitions, version = pending
            self._elect_preferred(
                partitions, [DeleteOp(zk_paths.PREFERRED_REPLICA_ELECTION_PATH, version)],
                elected)

    def auto_rebalance(self, elected: ControllerEpoch) -> None:
        """Kafka's ``checkAndTriggerAutoLeaderRebalance``: the partitions of brokers
        above the imbalance threshold get their preferred leader where it can lead
        (topics marked for deletion and partitions being reassigned are left alone,
        as Kafka leaves them)."""
        marked = set(self.zookeeper.read_topics_to_delete())
        assignments, leaders = {}, {}
        for topic, assignment in self.zookeeper.read_assignments().items():
            if topic in marked:
                continue
            states = self.cache.states(assignment)
            if states is None:
                states = self.zookeeper.read_partition_states(topic)
                self.cache.remember(assignment, states)
            for partition, replicas in assignment.partitions.items():
                if partition in assignment.adding_replicas or \
                        partition in assignment.removing_replicas:
                    continue
                assignments[(topic, partition)] = replicas
                if partition in states:
                    leaders[(topic, partition)] = states[partition][0].leader
        live = read_live_brokers(self.zookeeper)
        shutting = read_brokers_shutting_down(self.zookeeper, live, self.broker_id)
        candidates = leader_balance.rebalance_candidates(
            assignments, leaders, self.rebalance.imbalance_percentage, set(live) - shutting)
        if candidates:
            log.info("controller %d: leader imbalance above %d %%: electing the preferred "
                     "replicas of %d partitions, e.g. %s", self.broker_id,
                     self.rebalance.imbalance_percentage, len(candidates),
                     candidates[:limits.LOGGED_CHANGES_MAX])
            self._elect_preferred(candidates, [], elected)

    def _elect_preferred(self, partitions, extra_ops: list, elected: ControllerEpoch) -> None:
        """Elect the preferred replica of each (topic, partition) that can take it,
        from fresh reads, in one checked multi with ``extra_ops``; retried when a
        state changed between the read and the write."""
        partitions = list(partitions)
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            live = read_live_brokers(self.zookeeper)
            shutting = read_brokers_shutting_down(self.zookeeper, live, self.broker_id)
            # One read per topic and one pipeline for the states, not two round
            # trips per partition.
            assignments = {topic: self.zookeeper.read_assignment(topic)
                           for topic in sorted({topic for topic, _ in partitions})}
            states = self.zookeeper.read_partition_states_of(partitions)
            ops = []
            written: dict[str, dict[int, tuple]] = {}
            outcomes: dict[str, list] = {}
            for topic, partition in partitions:
                assignment = assignments[topic]
                found = states.get((topic, partition))
                if assignment is None or partition not in assignment.partitions:
                    log.warning("controller %d: preferred election of %s-%d: no such "
                                "partition", self.broker_id, topic, partition)
                    continue
                outcome, after = leader_balance.preferred_election(
                    None if found is None else found[0], assignment.partitions[partition],
                    live, shutting, elected.epoch)
                outcomes.setdefault(outcome.value, []).append(f"{topic}-{partition}")
                if after is not None:
                    ops.append(state_set_op(topic, assignment.topic_id, partition, after,
                                            found[1]))
                    written.setdefault(topic, {})[partition] = (after, found[1] + 1)
            try:
                if ops or extra_ops:
                    # The request's deletion (extra_ops) goes last, in the last multi.
                    self.zookeeper.checked_multi_chunked(ops + extra_ops, elected.zk_version)
                for topic, states in written.items():
                    self.cache.remember(assignments[topic], states)
                for outcome, names in outcomes.items():   # a line per outcome, not per partition
                    log.info("controller %d: preferred election of %d partitions: %s (e.g. %s)",
                             self.broker_id, len(names), outcome,
                             ", ".join(names[:limits.LOGGED_CHANGES_MAX]))
                return
            except ZooKeeperConflictError as error:
                log.info("controller %d: %s; electing again", self.broker_id, error)
        raise StaleStateVersionError(f"controller {self.broker_id}: preferred election of "
                                     f"{list(partitions)[:10]} kept conflicting",
                                     path=zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
