"""The cluster controller: elected among the brokers, it decides every partition's
leader and ISR (Kafka 2.8's ``KafkaController`` in its ZooKeeper era).

Every broker runs a :class:`Controller`; the one elected acts, the others watch
``/controller`` to take over when it goes. Its decisions are written to the
partition state znodes, and the brokers learn them from their own watches (no
controller-to-broker requests: the state znode is the one truth).

Rules
-----
* **Its own thread** (Kafka's ControllerEventManager): it may block on ZooKeeper;
  it never touches logs or the broker loop's state. kazoo's threads only queue
  events for it (``zk.events.EventQueue``).
* **Election** (:meth:`ClusterZooKeeper.try_become_controller`): the ephemeral
  ``/controller`` and ``/controller_epoch`` + 1 in one transaction; the epoch's
  zkVersion is then the fence of every write (``checked_multi``).
* **It resigns** when a write is refused with ``ControllerMovedError``, when a
  partition state carries a newer controller epoch than its own, when
  ``/controller`` names another broker (read fresh), and when the session is
  LOST. While the session is SUSPENDED it writes nothing (it may be deposed
  already); it goes on when CONNECTED again, its writes still fenced.
* **Decisions are pure functions** of fresh reads (Kafka reads states fresh at
  election time, ``doElectLeaderForPartitions``): :func:`elect_leader`,
  :func:`initial_partition_state`, :func:`partition_state_after`. Every event
  that can change a decision (brokers, topics, deletion marks, reconnection,
  election) makes it reconcile the whole cluster, in jobs Kafka names:

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
  - *PartitionReassignment* (``onPartitionReassignment``, KIP-455): each partition
    of ``/admin/reassign_partitions`` is moved by the rules of ``reassignment``, one
    checked multi per round (the topic znodes' moving assignments, the partition
    states, and the request without the partitions done, deleted when empty). Run
    after the reconciliation on the request's changes, on any partition state's
    (an ISR that grew may complete a move: Kafka's
    ``PartitionReassignmentIsrChangeHandler``), on broker changes, and right after
    an election, which resumes a move from the znodes
    (``initializePartitionReassignments``). A request refused whole (a partition or
    broker that does not exist, repeating replicas) or that does not decode is
    deleted, as Kafka's controller deletes what it cannot carry out.
  - *ControlledShutdown* (``doControlledShutdown``): a live broker that asked
    (``/admin/controlled_shutdown/<id>`` at its current broker epoch) loses its
    leaderships and ISR memberships (``leader_balance.state_during_shutdown``),
    and is given no new partition (Kafka's live brokers exclude those shutting
    down). An offline election may still pick it when it is the only eligible
    replica (Kafka would leave the partition offline); the next pass moves it on
    when someone else becomes eligible.
  - *PreferredReplicaElection* (``onReplicaElection``): on demand
    (``/admin/preferred_replica_election``, deleted in the same multi as the
    elections) and, every ``leader.imbalance.check.interval.seconds`` while
    ``auto.leader.rebalance.enable``, for the brokers above the imbalance
    threshold (``checkAndTriggerAutoLeaderRebalance``); rules in
    ``leader_balance``.
  - *TopicDeletion*: a marked topic's znodes (states, partitions, assignment,
    config) and its mark go in one checked multi. Kafka first waited for every
    replica to be stopped (StopReplica); here brokers drop their replicas when
    their watches see the assignment go.
* A state write races the leader's ISR writes: a multi refused for a stale
  version is re-read and decided again (bounded).

Theory of operation
-------------------
The controller keeps no cache across events but the live brokers' czxids (to see
a bounce) and its epoch and fence version. A burst of events is handled as one:
the queue is drained, and one reconciliation answers all of them. A controller
elected late (after a bounce it did not see) treats the bounced broker as alive,
as Kafka's failover does.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Sequence

from ...common import limits
from ...common.errors import (
    ControllerMovedError,
    InvalidReassignmentError,
    ShmlogError,
    StaleStateVersionError,
    ZnodeFormatError,
    ZooKeeperConflictError,
    ZooKeeperConnectionError,
)
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.events import EventKind, EventQueue, SessionState, WatchEvent
from ..zk.paths import NO_LEADER, PartitionState, TopicAssignment
from ..zk.session import DeleteOp, SetDataOp
from . import leader_balance, reassignment
from .reassignment import MovingAssignment, StepKind

__all__ = ["Controller", "elect_leader", "initial_partition_state", "partition_state_after",
           "UNCLEAN_LEADER_ELECTION_CONFIG"]

log = logging.getLogger(__name__)

# The topic config naming unclean election (Kafka's; "false" by default).
UNCLEAN_LEADER_ELECTION_CONFIG = "unclean.leader.election.enable"

# The events that can change a decision.
_RECONCILING = {EventKind.BROKER_IDS, EventKind.BROKER, EventKind.TOPICS, EventKind.TOPIC,
                EventKind.DELETE_TOPICS, EventKind.TOPIC_CONFIG, EventKind.CONTROLLED_SHUTDOWN}
# The events that can move a partition reassignment on.
_REASSIGNING = {EventKind.REASSIGN_PARTITIONS, EventKind.PARTITION_STATE, EventKind.BROKER_IDS,
                EventKind.BROKER, EventKind.TOPIC, EventKind.SESSION}


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


class Controller:
    """The controller's thread in one broker: it runs for election, and acts while
    elected (see the module's rules).

    Parameters
    ----------
    zookeeper : ClusterZooKeeper
        The broker's started session (shared with the broker; the controller does
        not close it).
    broker_id : int
        This broker's id.
    rebalance : leader_balance.RebalancePolicy
        The automatic preferred leader election's settings (Kafka's defaults).

    Use ``Controller(zookeeper, broker_id).start()`` and, at shutdown, ``stop()``
    before closing the session.
    """

    def __init__(self, zookeeper: ClusterZooKeeper, broker_id: int,
                 rebalance: leader_balance.RebalancePolicy = leader_balance.RebalancePolicy()):
        self.zookeeper = zookeeper
        self.broker_id = broker_id
        self.rebalance = rebalance
        self._next_rebalance: float | None = None
        self._events = EventQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._watches = []
        self._epoch = -1
        self._epoch_version = -1
        self._live: dict[int, int] = {}
        self._dirty = False
        self._reassignment_pending = False       # a reassignment round failed: try again
        #: monotonic time of the last election won (None before), for measurements.
        self.elected_at: float | None = None

    @property
    def is_active(self) -> bool:
        """Whether this broker is the elected controller (and not suspended)."""
        return self._epoch >= 0 and not self.zookeeper.suspended.is_set()

    @property
    def epoch(self) -> int:
        """The controller epoch this broker was elected at, -1 when not controller."""
        return self._epoch

    def start(self) -> "Controller":
        """Set up the watches and start the thread (which runs for election at once)."""
        assert self._thread is None, "this Controller was started already"
        self.zookeeper.add_events(self._events)
        self._watches = [self.zookeeper.watch_controller(self._events),
                         self.zookeeper.watch_cluster(self._events),
                         self.zookeeper.watch_reassignment(self._events),
                         self.zookeeper.watch_leader_balance(self._events)]
        self._thread = threading.Thread(target=self._run, name=f"controller-{self.broker_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = limits.CONTROLLER_STOP_TIMEOUT_S) -> None:
        """Stop the thread and, if elected, resign (delete ``/controller``, so another
        broker is elected at once rather than after the session timeout)."""
        if self._thread is None:
            return
        self._stopping.set()
        self._events.put(WatchEvent(EventKind.SESSION, None, None, -1))    # wake it
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("controller %d: its thread did not stop within %s s", self.broker_id,
                      timeout_s)
        for watch in self._watches:
            watch.cancel()
        self.zookeeper.remove_events(self._events)
        if self._epoch >= 0:
            self._resign("stopping")
            try:
                self.zookeeper.resign_controller(self.broker_id)
            except ShmlogError as error:
                log.warning("controller %d: could not delete /controller: %s",
                            self.broker_id, error)
        self._thread = None

    # --- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        self._guarded(self._try_elect)
        while not self._stopping.is_set():
            event = self._events.get(limits.CONTROLLER_IDLE_WAIT_S)
            events = ([] if event is None else [event]) + self._events.drain()
            if self._stopping.is_set():
                return
            if events or self._dirty:                 # a failed step is tried again
                self._guarded(self._handle, events)
            if self._rebalance_due():
                self._guarded(self._auto_rebalance)

    def _guarded(self, function, *args) -> None:
        """Run one step; what ZooKeeper refuses or loses is handled, never fatal."""
        try:
            function(*args)
        except ControllerMovedError as error:
            self._resign(str(error))
        except ZooKeeperConnectionError as error:
            log.warning("controller %d: %s; tried again when connected", self.broker_id, error)
            self._dirty = True
        except ZooKeeperConflictError as error:            # conflicts ran out: try again
            log.error("controller %d: %s", self.broker_id, error)
            self._dirty = True
        except ZnodeFormatError as error:                  # looked at again on the next event
            log.error("controller %d: %s", self.broker_id, error)

    def _handle(self, events: list[WatchEvent]) -> None:
        kinds = {event.kind for event in events}
        for event in events:
            if event.kind is EventKind.SESSION and event.key is SessionState.LOST:
                self._resign("the ZooKeeper session was lost")
        if self.zookeeper.suspended.is_set():
            self._dirty = self._dirty or bool(kinds & _RECONCILING)
            return                                         # write nothing: maybe deposed
        if self._epoch >= 0:
            self._check_deposed(events)
        if self._epoch < 0:
            if self._dirty or EventKind.CONTROLLER in kinds or EventKind.SESSION in kinds:
                self._dirty = False
                self._try_elect()
            return
        if self._dirty or kinds & _RECONCILING or EventKind.SESSION in kinds:
            self._reconcile()
        if self._reassignment_pending or kinds & _REASSIGNING:
            self._reassign_partitions()
        if kinds & {EventKind.PREFERRED_REPLICA_ELECTION, EventKind.SESSION}:
            self._elect_preferred_on_demand()

    def _check_deposed(self, events: list[WatchEvent]) -> None:
        """Resign when the events say another controller exists (checked fresh)."""
        for event in events:
            if event.kind is EventKind.PARTITION_STATE and event.body is not None:
                try:
                    state = zk_paths.decode_partition_state(event.body)
                except ZnodeFormatError:
                    continue
                if state.controller_epoch > self._epoch:
                    raise ControllerMovedError(f"{event.key} was written by controller epoch "
                                               f"{state.controller_epoch} > {self._epoch}")
        if any(event.kind is EventKind.CONTROLLER for event in events):
            current = self.zookeeper.read_controller()
            if current is None or current.broker_id != self.broker_id:
                self._resign(f"/controller names {current}")
                self._try_elect()

    def _try_elect(self) -> None:
        if self._epoch >= 0 or self._stopping.is_set() or self.zookeeper.suspended.is_set():
            return
        elected = self.zookeeper.try_become_controller(self.broker_id)
        if elected is None:
            return
        self._epoch, self._epoch_version = elected
        self.elected_at = time.monotonic()
        self._live = {}
        log.info("broker %d is the controller at epoch %d", self.broker_id, self._epoch)
        self._reconcile()                                   # Kafka's onControllerFailover
        self._reassign_partitions()                         # initializePartitionReassignments
        self._next_rebalance = self.elected_at + self.rebalance.check_interval_s
        self._elect_preferred_on_demand()                   # one asked for before

    def _resign(self, why: str) -> None:
        if self._epoch >= 0:
            log.info("controller %d resigns (epoch %d): %s", self.broker_id, self._epoch, why)
        self._epoch = self._epoch_version = -1
        self._live = {}
        self._dirty = False
        self._reassignment_pending = False

    # --- the jobs ----------------------------------------------------------------------

    def _reconcile(self) -> None:
        """Every job, from fresh reads (see the module's rules)."""
        self._dirty = True                        # until every write went through
        brokers = self.zookeeper.read_brokers()
        live = {broker_id: epoch for broker_id, (_, epoch) in brokers.items()}
        bounced = {broker_id for broker_id, epoch in live.items()
                   if self._live.get(broker_id, epoch) != epoch}
        gone = set(self._live) - set(live)
        if gone or bounced:
            log.info("controller %d: brokers gone %s, bounced %s, live %s", self.broker_id,
                     sorted(gone), sorted(bounced), sorted(live))
        shutting = self._shutting_down(live)
        marked = set(self.zookeeper.read_topics_to_delete())
        for topic in sorted(marked):
            self._delete_topic(topic)
        for topic in self.zookeeper.read_topics():
            if topic in marked:
                continue
            try:
                assignment = self.zookeeper.read_assignment(topic)
                if assignment is not None:
                    self._reconcile_topic(assignment, set(live), bounced, shutting)
            except ZnodeFormatError as error:
                # One malformed znode must not stop the others' elections; it is
                # looked at again on the next event.
                log.error("controller %d: topic %s skipped: %s", self.broker_id, topic, error)
        self._live = live
        self._dirty = False

    def _reconcile_topic(self, assignment: TopicAssignment, live: set[int],
                         bounced: set[int], shutting: frozenset[int] = frozenset()) -> None:
        """TopicChange, BrokerChange and ControlledShutdown for one topic, retried
        when a leader's ISR write got in between the read and the write."""
        topic = assignment.topic
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            states = self.zookeeper.read_partition_states(topic)
            for partition, (state, _) in states.items():
                if state.controller_epoch > self._epoch:
                    raise ControllerMovedError(
                        f"{zk_paths.partition_state_path(topic, partition)} was written by "
                        f"controller epoch {state.controller_epoch} > {self._epoch}")
            unclean = self.zookeeper.read_topic_config(topic).get(
                UNCLEAN_LEADER_ELECTION_CONFIG, "false").lower() == "true"
            new = {}
            updates = []
            for partition, replicas in assignment.partitions.items():
                if partition not in states:
                    initial = initial_partition_state(replicas, live - shutting, self._epoch)
                    if initial is not None:
                        new[partition] = initial
                    continue
                state, version = states[partition]
                after = leader_balance.state_during_shutdown(
                    partition_state_after(state, replicas, live, bounced, unclean, self._epoch),
                    replicas, live, shutting, self._epoch)
                if after != state:
                    updates.append(SetDataOp(zk_paths.partition_state_path(topic, partition),
                                             zk_paths.encode_partition_state(after), version))
                    log.info("controller %d: %s-%d %s -> %s", self.broker_id, topic, partition,
                             state, after)
            try:
                ops = updates + (self.zookeeper.partition_state_creation_ops(topic, new)
                                 if new else [])
                if ops:
                    self.zookeeper.checked_multi(ops, self._epoch_version)
                return
            except ZooKeeperConflictError as error:          # a stale version, mostly
                log.info("controller %d: %s; reading %s again", self.broker_id, error, topic)
        raise StaleStateVersionError(f"controller {self.broker_id}: topic {topic}'s states kept "
                                     f"changing under {limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX} "
                                     f"writes", path=zk_paths.topic_path(topic))

    def _delete_topic(self, topic: str) -> None:
        """TopicDeletion: every znode of the topic and its mark, in one checked multi."""
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            try:
                self.zookeeper.checked_multi(self.zookeeper.topic_deletion_ops(topic),
                                             self._epoch_version)
                log.info("controller %d: deleted topic %s", self.broker_id, topic)
                return
            except ZooKeeperConflictError as error:        # a znode came or went: list again
                log.info("controller %d: %s; listing %s again", self.broker_id, error, topic)
        raise ZooKeeperConflictError(f"topic {topic}'s znodes kept changing under its deletion",
                                     path=zk_paths.topic_path(topic))

    # --- partition reassignment (KafkaController.onPartitionReassignment) -----------------

    def _reassign_partitions(self) -> None:
        """One round of every partition the request names (see the module's rules),
        retried when a leader's ISR write or an operator got in between."""
        self._reassignment_pending = True               # until a round went through
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            try:
                self._reassignment_round()
                self._reassignment_pending = False
                return
            except ZooKeeperConflictError as error:
                log.info("controller %d: %s; reading the reassignment again", self.broker_id,
                         error)
        raise StaleStateVersionError(f"controller {self.broker_id}: the reassignment's znodes "
                                     f"kept changing under {limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX}"
                                     f" writes", path=zk_paths.REASSIGN_PARTITIONS_PATH)

    def _reassignment_round(self) -> None:
        try:
            found = self.zookeeper.read_reassignment()
        except ZnodeFormatError as error:
            self._refuse_reassignment(error, -1)
            return
        if found is None:
            return
        request, version = found
        live = set(self.zookeeper.read_brokers())
        assignments = {}
        for topic in sorted({topic for topic, _ in request}):
            assignments[topic] = self.zookeeper.read_assignment_versioned(topic)
        try:
            reassignment.check_request(request, {topic: len(held[0].partitions) for topic, held
                                                 in assignments.items() if held is not None},
                                       live)
        except InvalidReassignmentError as error:
            self._refuse_reassignment(error, version)
            return
        ops, done = [], set()
        for topic, (assignment, topic_version) in assignments.items():
            targets = {partition: replicas for (name, partition), replicas in request.items()
                       if name == topic}
            topic_ops, topic_done = self._reassign_topic(assignment, topic_version, targets, live)
            ops += topic_ops
            done |= {(topic, partition) for partition in topic_done}
        if done:
            left = {key: replicas for key, replicas in request.items() if key not in done}
            ops.append(SetDataOp(zk_paths.REASSIGN_PARTITIONS_PATH,
                                 zk_paths.encode_reassignment(left), version) if left
                       else DeleteOp(zk_paths.REASSIGN_PARTITIONS_PATH, version))
        if ops:
            self.zookeeper.checked_multi(ops, self._epoch_version)
            log.info("controller %d: reassignment: %d writes, done %s", self.broker_id,
                     len(ops), sorted(done))

    def _reassign_topic(self, assignment: TopicAssignment, topic_version: int,
                        targets: dict[int, tuple[int, ...]], live: set[int]
                        ) -> tuple[list, set[int]]:
        """The ops that move one topic's partitions a step on, and the partitions
        whose move is complete."""
        topic = assignment.topic
        states = self.zookeeper.read_partition_states(topic)
        replicas = dict(assignment.partitions)
        adding, removing = dict(assignment.adding_replicas), dict(assignment.removing_replicas)
        ops, done = [], set()
        for partition, target in sorted(targets.items()):
            if partition not in states:
                continue                                    # not created yet: wait
            state, state_version = states[partition]
            current = MovingAssignment(replicas[partition], adding.get(partition, ()),
                                       removing.get(partition, ()))
            found = reassignment.step(current, target, state, live, self._epoch)
            if found.kind is StepKind.WAIT:
                continue
            replicas[partition] = found.assignment.replicas
            adding[partition], removing[partition] = found.assignment.adding, \
                found.assignment.removing
            if found.state is not None:
                ops.append(SetDataOp(zk_paths.partition_state_path(topic, partition),
                                     zk_paths.encode_partition_state(found.state), state_version))
            if found.kind is StepKind.COMPLETE:
                done.add(partition)
            log.info("controller %d: reassigning %s-%d to %s: %s %s", self.broker_id, topic,
                     partition, list(target), found.kind.value, found.assignment)
        moved = TopicAssignment(topic, assignment.topic_id, replicas, adding, removing)
        if moved != assignment:
            ops.insert(0, SetDataOp(zk_paths.topic_path(topic),
                                    zk_paths.encode_topic_assignment(moved), topic_version))
        return ops, done

    def _refuse_reassignment(self, error: ShmlogError, version: int) -> None:
        log.error("controller %d: %s: deleting %s", self.broker_id, error,
                  zk_paths.REASSIGN_PARTITIONS_PATH)
        self.zookeeper.checked_multi([DeleteOp(zk_paths.REASSIGN_PARTITIONS_PATH, version)],
                                     self._epoch_version)
    # --- controlled shutdown and preferred election (leader_balance) -------------------

    def _shutting_down(self, live: dict[int, int]) -> frozenset[int]:
        """The live brokers that asked for a controlled shutdown in their current
        incarnation (Kafka checks the request's broker epoch the same way)."""
        asking = self.zookeeper.read_controlled_shutdowns()
        shutting = frozenset(broker_id for broker_id, epoch in asking.items()
                             if live.get(broker_id) == epoch)
        if shutting:
            log.info("controller %d: brokers shutting down %s", self.broker_id, sorted(shutting))
        return shutting

    def _rebalance_due(self) -> bool:
        if not self.rebalance.enable or self._epoch < 0 or self._next_rebalance is None:
            return False
        if self.zookeeper.suspended.is_set() or time.monotonic() < self._next_rebalance:
            return False
        self._next_rebalance = time.monotonic() + self.rebalance.check_interval_s
        return True

    def _elect_preferred_on_demand(self) -> None:
        """The partitions ``/admin/preferred_replica_election`` lists get their
        preferred leader where it can lead; the znode goes in the same multi."""
        if self._epoch < 0:
            return
        try:
            pending = self.zookeeper.read_preferred_replica_election()
        except ZnodeFormatError as error:
            # Kafka logs and drops a request it cannot read: one left would block
            # every later one.
            log.error("controller %d: %s; deleting it", self.broker_id, error)
            self.zookeeper.checked_multi([DeleteOp(zk_paths.PREFERRED_REPLICA_ELECTION_PATH)],
                                         self._epoch_version)
            return
        if pending is not None:
            partitions, version = pending
            self._elect_preferred(
                partitions, [DeleteOp(zk_paths.PREFERRED_REPLICA_ELECTION_PATH, version)])

    def _auto_rebalance(self) -> None:
        """Kafka's ``checkAndTriggerAutoLeaderRebalance``: the partitions of brokers
        above the imbalance threshold get their preferred leader where it can lead
        (topics marked for deletion and partitions being reassigned are left alone,
        as Kafka leaves them)."""
        marked = set(self.zookeeper.read_topics_to_delete())
        assignments, leaders = {}, {}
        for topic, assignment in self.zookeeper.read_assignments().items():
            if topic in marked:
                continue
            states = self.zookeeper.read_partition_states(topic)
            for partition, replicas in assignment.partitions.items():
                if partition in assignment.adding_replicas or \
                        partition in assignment.removing_replicas:
                    continue
                assignments[(topic, partition)] = replicas
                if partition in states:
                    leaders[(topic, partition)] = states[partition][0].leader
        candidates = leader_balance.rebalance_candidates(
            assignments, leaders, self.rebalance.imbalance_percentage)
        if candidates:
            log.info("controller %d: leader imbalance above %d %%: electing the preferred "
                     "replicas of %s", self.broker_id, self.rebalance.imbalance_percentage,
                     candidates)
            self._elect_preferred(candidates, [])

    def _elect_preferred(self, partitions, extra_ops: list) -> None:
        """Elect the preferred replica of each (topic, partition) that can take it,
        from fresh reads, in one checked multi with ``extra_ops``; retried when a
        state changed between the read and the write."""
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            live = {broker_id: epoch for broker_id, (_, epoch) in
                    self.zookeeper.read_brokers().items()}
            shutting = self._shutting_down(live)
            ops = []
            for topic, partition in partitions:
                assignment = self.zookeeper.read_assignment(topic)
                found = self.zookeeper.read_partition_state(topic, partition)
                if assignment is None or partition not in assignment.partitions:
                    log.warning("controller %d: preferred election of %s-%d: no such "
                                "partition", self.broker_id, topic, partition)
                    continue
                outcome, after = leader_balance.preferred_election(
                    None if found is None else found[0], assignment.partitions[partition],
                    live, shutting, self._epoch)
                log.info("controller %d: preferred election of %s-%d: %s", self.broker_id,
                         topic, partition, outcome.value)
                if after is not None:
                    ops.append(SetDataOp(zk_paths.partition_state_path(topic, partition),
                                         zk_paths.encode_partition_state(after), found[1]))
            try:
                if ops or extra_ops:
                    self.zookeeper.checked_multi(ops + extra_ops, self._epoch_version)
                return
            except ZooKeeperConflictError as error:
                log.info("controller %d: %s; electing again", self.broker_id, error)
        raise StaleStateVersionError(f"controller {self.broker_id}: preferred election of "
                                     f"{list(partitions)[:10]} kept conflicting",
                                     path=zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
