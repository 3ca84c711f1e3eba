"""The controller's partition states: who leads each partition and which replicas are
in sync, decided from fresh reads and written to the state znodes (Kafka 2.8's
``PartitionStateMachine`` and ``TopicDeletionManager``, in its ZooKeeper era).

Rules
-----
* **Decisions are pure functions** of fresh reads (Kafka reads states fresh at
  election time, ``doElectLeaderForPartitions``): :func:`elect_leader`,
  :func:`initial_partition_state`, :func:`partition_state_after`, and
  ``leader_balance.state_during_shutdown``. :meth:`PartitionStateMachine.reconcile`
  answers the whole cluster at once, in jobs Kafka names:

  - *TopicChange* (``onNewPartitionCreation``): a partition without a state gets
    one: leader = the first live replica in assignment order, ISR = the live
    replicas, leader epoch 0. A partition with no live replica gets none yet
    (Kafka leaves it NewPartition); a later broker change creates it.
  - *BrokerChange* (``onBrokerFailure``, ``onBrokerStartup``): a broker gone, or
    bounced (same id, new czxid: it lost its state), leaves every ISR, and the
    partitions it led get a new leader (:func:`elect_leader`) with epoch + 1. A
    partition without an eligible replica gets ``NO_LEADER`` (epoch + 1) and is
    elected when one of its last in-sync replicas comes back.
  - *failover* (``onControllerFailover``): the same, right after an election.
  - *ControlledShutdown* (``doControlledShutdown``): a live broker that asked
    (``/admin/controlled_shutdown/<id>`` at its current broker epoch) loses its
    leaderships and ISR memberships (``leader_balance.state_during_shutdown``),
    and is given no new partition (Kafka's live brokers exclude those shutting
    down). An offline election may still pick it when it is the only eligible
    replica (Kafka would leave the partition offline); the next pass moves it on
    when someone else becomes eligible.
  - *TopicDeletion*: a marked topic's znodes (states, partitions, assignment,
    config) and its mark go in one checked multi. Kafka first waited for every
    replica to be stopped (StopReplica); here brokers drop their replicas when
    their watches see the assignment go.
* **A newer controller's state deposes this one**: a state stamped with a higher
  controller epoch raises :class:`ControllerMovedError`.
* A state write races the leader's ISR writes: a multi refused for a stale
  version is re-read and decided again (bounded).

Theory of operation
-------------------
The machine keeps, across events, the live brokers' czxids (to see a bounce) and
the partition states (``controller_context.StateCache``), both forgotten at each
election and resignation. A controller elected late (after a bounce it did not
see) treats the bounced broker as alive, as Kafka's failover does.

A broker's failure changes thousands of states at once; the states cached from
the watch let the controller decide them all without reading one (the topic's
assignment is the only read per topic), so the time from the broker's session
expiring to its partitions' new states being written is the decisions and the
writes. A first attempt refused for a stale version reads the topic fresh. A
topic's writes go in the order its partitions need them: new states and new
leaders before ISRs that only shrink, since each broker learns each state from
its watch, one notification and one read per state, in the order written.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from ...common import limits
from ...common.errors import (
    ControllerMovedError,
    StaleStateVersionError,
    ZnodeFormatError,
    ZooKeeperConflictError,
)
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.paths import NO_LEADER, PartitionState, TopicAssignment
from ..zk.state_changes import state_set_op
from . import leader_balance
from .controller_context import (
    ControllerEpoch,
    StateCache,
    read_brokers_shutting_down,
    read_live_brokers,
)

__all__ = ["PartitionStateMachine", "elect_leader", "initial_partition_state",
           "partition_state_after", "UNCLEAN_LEADER_ELECTION_CONFIG"]

log = logging.getLogger(__name__)

# The topic config naming unclean election (Kafka's; "false" by default).
UNCLEAN_LEADER_ELECTION_CONFIG = "unclean.leader.election.enable"


def elect_leader(assignment: Sequence[int], isr: Iterable[int], live: Iterable[int],
                 unclean: bool = False) -> int | None:
    """The new leader of an offline partition (Kafka's ``offlinePartitionLeaderElection``).

    Parameters
    ----------
    assignment : sequence of int
        The partition's replicas in preferred order.
    isr : iterable of int
        Its in-sync replicas.
    live : iterable of int
        The live brokers.
    unclean : bool
        Whether a live replica outside the ISR may be elected (it may lack
        acknowledged records: ``unclean.leader.election.enable``).

    Returns
    -------
    int | None
        The first live in-sync replica in assignment order; else, when unclean, the
        first live replica; else None.
    """
    live = set(live)
    isr = set(isr)
    for replica in assignment:
        if replica in live and replica in isr:
            return replica
    if unclean:
        for replica in assignment:
            if replica in live:
                return replica
    return None


def initial_partition_state(assignment: Sequence[int], live: Iterable[int],
                            controller_epoch: int) -> PartitionState | None:
    """A new partition's state (Kafka's ``initializeLeaderAndIsrForPartitions``): the
    first live replica in assignment order leads, the live replicas are the ISR,
    leader epoch 0; None when no replica is live (the partition waits)."""
    live = set(live)
    replicas = [replica for replica in assignment if replica in live]
    if not replicas:
        return None
    return PartitionState(replicas[0], 0, tuple(replicas), controller_epoch)


def partition_state_after(state: PartitionState, assignment: Sequence[int],
                          live: Iterable[int], bounced: Iterable[int], unclean: bool,
                          controller_epoch: int) -> PartitionState:
    """A partition's state once brokers went (``live`` no longer has them) or bounced
    (``bounced``: live again, but with a new broker epoch): ``state`` itself when
    nothing changes.

    * The leader is usable (live, not bounced): only the ISR loses the brokers gone
      or bounced, **keeping the leader epoch**. Kafka 2.8 bumps the epoch for this
      too (``removeReplicasFromIsr`` writes ``newLeaderAndIsr`` with epoch + 1); the
      design keeps it, since the leader and what it acknowledged do not change,
      and the leader's own ISR writes keep it too.
    * Otherwise the partition is elected (:func:`elect_leader`) among the usable
      ISR; when that is empty, among the last in-sync replicas (Kafka keeps the
      last one in the ISR for this), so a bounced broker that was the last in sync
      may lead again. The epoch goes + 1; the ISR is the live candidates (just the
      leader after an unclean election).
    * No eligible replica: ``NO_LEADER`` with epoch + 1, the ISR kept, so the
      brokers see that the old leader is deposed and a returning replica of it
      can be elected. Kafka 2.8 writes nothing then (the partition stays
      OfflinePartition in the controller's memory only, the dead leader named in
      ZooKeeper).
    """
    live = set(live)
    usable = live - set(bounced)
    kept = tuple(replica for replica in state.isr if replica in usable)
    if state.leader != NO_LEADER and state.leader in usable:
        if kept == state.isr:
            return state
        return PartitionState(state.leader, state.leader_epoch, kept, controller_epoch)
    candidates = kept or state.isr
    leader = elect_leader(assignment, candidates, live, unclean)
    if leader is None:
        if state.leader == NO_LEADER and candidates == state.isr:
            return state                                   # offline already
        return PartitionState(NO_LEADER, state.leader_epoch + 1, candidates, controller_epoch)
    isr = tuple(replica for replica in candidates if replica in live) \
        if leader in candidates else (leader,)
    return PartitionState(leader, state.leader_epoch + 1, isr, controller_epoch)


class PartitionStateMachine:
    """Controller ``broker_id``'s partition states (see the module's rules).

    Parameters
    ----------
    zookeeper : ClusterZooKeeper
        The broker's started session.
    broker_id : int
        This broker's id (for the log).
    cache : StateCache
        The controller's partition states (fed by its watch; this machine adds
        what it reads and writes).
    """

    def __init__(self, zookeeper: ClusterZooKeeper, broker_id: int, cache: StateCache):
        self.zookeeper = zookeeper
        self.broker_id = broker_id
        self.cache = cache
        self._live: dict[int, int] = {}

    @property
    def live(self) -> frozenset[int]:
        """The live brokers the last :meth:`reconcile` saw."""
        return frozenset(self._live)

    def forget_brokers(self) -> None:
        """Forget the live brokers seen (at an election, or a resignation): the next
        :meth:`reconcile` sees no broker gone or bounced."""
        self._live = {}

    def reconcile(self, elected: ControllerEpoch, fresh: bool = False) -> None:
        """Every job, from fresh reads of the brokers and assignments, and of the
        states too when ``fresh`` or when the cache lacks some (see the module's
        rules).

        Raises
        ------
        ControllerMovedError
            A state was written by a newer controller, or a write was refused by
            the fence.
        StaleStateVersionError, ZooKeeperConflictError
            A topic's znodes kept changing: the caller tries again later.
        """
        live = read_live_brokers(self.zookeeper)
        bounced = {broker_id for broker_id, epoch in live.items()
                   if self._live.get(broker_id, epoch) != epoch}
        gone = set(self._live) - set(live)
        if gone or bounced:
            log.info("controller %d: brokers gone %s, bounced %s, live %s", self.broker_id,
                     sorted(gone), sorted(bounced), sorted(live))
        shutting = read_brokers_shutting_down(self.zookeeper, live, self.broker_id)
        marked = set(self.zookeeper.read_topics_to_delete())
        for topic in sorted(marked):
            self._delete_topic(topic, elected)
        for topic in self.zookeeper.read_topics():
            if topic in marked:
                continue
            try:
                assignment = self.zookeeper.read_assignment(topic)
                if assignment is not None:
                    self._reconcile_topic(assignment, set(live), bounced, shutting, elected,
                                          fresh)
            except ZnodeFormatError as error:
                # One malformed znode must not stop the others' elections; it is
                # looked at again on the next event.
                log.error("controller %d: topic %s skipped: %s", self.broker_id, topic, error)
        self._live = live

    def _reconcile_topic(self, assignment: TopicAssignment, live: set[int],
                         bounced: set[int], shutting: frozenset[int],
                         elected: ControllerEpoch, fresh: bool) -> None:
        """TopicChange, BrokerChange and ControlledShutdown for one topic, retried
        from a fresh read when a leader's ISR write got in between."""
        topic = assignment.topic
        epoch = elected.epoch
        for attempt in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            states = None if fresh or attempt else self.cache.states(assignment)
            if states is None:
                states = self.zookeeper.read_partition_states(topic)
                self.cache.remember(assignment, states)
            for partition, (state, _) in states.items():
                if state.controller_epoch > epoch:
                    raise ControllerMovedError(
                        f"{zk_paths.partition_state_path(topic, partition)} was written by "
                        f"controller epoch {state.controller_epoch} > {epoch}")
            unclean = self.zookeeper.read_topic_config(topic).get(
                UNCLEAN_LEADER_ELECTION_CONFIG, "false").lower() == "true"
            new = {}
            updates = []
            written: dict[int, tuple[PartitionState, int]] = {}
            changed: list[tuple[int, PartitionState, PartitionState]] = []
            for partition, replicas in assignment.partitions.items():
                if partition not in states:
                    initial = initial_partition_state(replicas, live - shutting, epoch)
                    if initial is not None:
                        new[partition] = initial
                        written[partition] = (initial, 0)
                    continue
                state, version = states[partition]
                after = leader_balance.state_during_shutdown(
                    partition_state_after(state, replicas, live, bounced, unclean, epoch),
                    replicas, live, shutting, epoch)
                if after != state:
                    updates.append(state_set_op(topic, assignment.topic_id, partition, after,
                                                version))
                    written[partition] = (after, version + 1)
                    changed.append((partition, state, after))
            # New states and new leaders first: a partition without a leader waits for
            # its state's write and for each broker's watch to read it, and these are
            # thousands at a broker's failure; an ISR that only shrinks can wait.
            leading = [update for update, (_, before, after) in zip(updates, changed)
                       if after.leader != before.leader]
            shrinking = [update for update, (_, before, after) in zip(updates, changed)
                         if after.leader == before.leader]
            try:
                ops = (self.zookeeper.partition_state_creation_ops(topic, assignment.topic_id,
                                                                   new) if new else []) \
                    + leading + shrinking
                if ops:
                    self.zookeeper.checked_multi_chunked(ops, elected.zk_version,
                                                         pipelined=True)
                    self.cache.remember(assignment, written)
                    self._log_changes(topic, changed, len(new))
                return
            except ZooKeeperConflictError as error:          # a stale version, mostly
                log.info("controller %d: %s; reading %s again", self.broker_id, error, topic)
        raise StaleStateVersionError(f"controller {self.broker_id}: topic {topic}'s states kept "
                                     f"changing under {limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX} "
                                     f"writes", path=zk_paths.topic_path(topic))

    def _log_changes(self, topic: str, changed: list, created: int) -> None:
        """One line per topic written (a line per partition, thousands at a broker's
        failure, cost a loaded controller seconds), each partition's at DEBUG."""
        leaders = sum(before.leader != after.leader for _, before, after in changed)
        shown = "; ".join(f"{topic}-{partition} {before} -> {after}"
                          for partition, before, after in changed[:limits.LOGGED_CHANGES_MAX])
        more = f" and {len(changed) - limits.LOGGED_CHANGES_MAX} more" \
            if len(changed) > limits.LOGGED_CHANGES_MAX else ""
        log.info("controller %d: %s: %d states created, %d changed (%d new leaders)%s",
                 self.broker_id, topic, created, len(changed), leaders,
                 f": {shown}{more}" if changed else "")
        for partition, before, after in changed:
            log.debug("controller %d: %s-%d %s -> %s", self.broker_id, topic, partition,
                      before, after)

    def _delete_topic(self, topic: str, elected: ControllerEpoch) -> None:
        """TopicDeletion: every znode of the topic and its mark, in one checked multi."""
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            try:
                self.zookeeper.checked_multi_chunked(self.zookeeper.topic_deletion_ops(topic),
                                                     elected.zk_version)
                self.cache.forget(topic)
                log.info("controller %d: deleted topic %s", self.broker_id, topic)
                return
            except ZooKeeperConflictError as error:        # a znode came or went: list again
                log.info("controller %d: %s; listing %s again", self.broker_id, error, topic)
        raise ZooKeeperConflictError(f"topic {topic}'s znodes kept changing under its deletion",
                                     path=zk_paths.topic_path(topic))
