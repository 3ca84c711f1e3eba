"""The cluster controller: elected among the brokers, it decides every partition's
leader and ISR (Kafka 2.8's ``KafkaController`` in its ZooKeeper era).

Every broker runs a :class:`Controller`; the one elected acts, the others watch
``/controller`` to take over when it goes. Its decisions are written to the
partition state znodes, and the brokers learn them from their own watches (no
controller-to-broker requests: the state znode is the one truth).

This module is the controller's event handling (Kafka's ``ControllerEventManager``
and the event processing of ``KafkaController``); its jobs are one module each:

* ``partition_state_machine``: *TopicChange*, *BrokerChange*, *failover*,
  *ControlledShutdown* and *TopicDeletion*, the reconciliation of every
  partition's state (Kafka's ``PartitionStateMachine``, ``TopicDeletionManager``);
* ``partition_reassigner``: *PartitionReassignment* (``onPartitionReassignment``);
* ``preferred_leader_elector``: *PreferredReplicaElection*, on demand and
  automatic (``onReplicaElection``, ``checkAndTriggerAutoLeaderRebalance``);
* ``controller_context``: what they share (the epoch won, fresh reads of the live
  brokers and of those shutting down, the partition states as last seen).

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
* **Every event that can change a decision** (brokers, topics, deletion marks,
  reconnection, election, a state naming a broker that is gone) makes it
  reconcile the whole cluster: brokers and assignments read fresh, the partition
  states from its cache (read fresh after an election or a reconnection: see
  ``controller_context``); a reassignment round follows on the events that can
  move one (the request, a partition state, brokers, a topic, the session), and
  right after an election.
* **What ZooKeeper refuses or loses is never fatal**: a step that failed
  (connection lost, conflicts ran out) is tried again at the next event or idle
  wake-up; a malformed znode is looked at again on the next event.
* **It deletes the old state-change notices** (``NoticeCollector``), every
  ``limits.STATE_CHANGE_COLLECT_INTERVAL_S``, while elected and connected.

Theory of operation
-------------------
The controller keeps across events the epoch it won, the live brokers' czxids (in
the partition state machine, to see a bounce) and the partition states
(``StateCache``: filled by the fresh reads after its election, then fed by every
event it drains and every write it makes; emptied when it resigns). A fresh read
asked for (an election, a reconnection) stays asked for until a reconciliation
goes through. A burst of events is handled as one: the queue is drained, and one
reconciliation answers all of them.
"""

from __future__ import annotations

import logging
import threading
import time

from ...common import limits
from ...common.errors import (
    ControllerMovedError,
    ShmlogError,
    ZnodeFormatError,
    ZooKeeperConflictError,
    ZooKeeperConnectionError,
)
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.events import EventKind, EventQueue, SessionState, WatchEvent
from . import leader_balance
from .controller_context import ControllerEpoch, NoticeCollector, StateCache
from .partition_reassigner import PartitionReassigner
from .partition_state_machine import PartitionStateMachine
from .preferred_leader_elector import PreferredLeaderElector

__all__ = ["Controller"]

log = logging.getLogger(__name__)

# The events that can change a decision.
_RECONCILING = {EventKind.BROKER_IDS, EventKind.BROKER, EventKind.TOPICS, EventKind.TOPIC,
                EventKind.DELETE_TOPICS, EventKind.TOPIC_CONFIG, EventKind.CONTROLLED_SHUTDOWN}
# The events that can move a partition reassignment on.
_REASSIGNING = {EventKind.REASSIGN_PARTITIONS, EventKind.PARTITION_STATE,
                EventKind.PARTITION_STATES, EventKind.BROKER_IDS, EventKind.BROKER,
                EventKind.TOPIC, EventKind.SESSION}


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
    watched_elsewhere : bool
        The cluster's events (brokers, topics, partition states) come to
        :attr:`events` from a watch set up by another owner in this process (the
        broker's replica service, given :attr:`events` before it starts): the
        controller sets up no watch of its own for them. Two watches in one session
        read every changed partition state twice, on the connection the
        controller's own writes wait on.

    Use ``Controller(zookeeper, broker_id).start()`` and, at shutdown, ``stop()``
    before closing the session.
    """

    def __init__(self, zookeeper: ClusterZooKeeper, broker_id: int,
                 rebalance: leader_balance.RebalancePolicy = leader_balance.RebalancePolicy(),
                 watched_elsewhere: bool = False):
        self.zookeeper = zookeeper
        self.broker_id = broker_id
        self.rebalance = rebalance
        self._watched_elsewhere = watched_elsewhere
        self._events = EventQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._watches = []
        self._elected: ControllerEpoch | None = None
        self._dirty = False
        self._fresh_needed = False
        self._states = StateCache()
        self._notices = NoticeCollector(zookeeper)
        self._partitions = PartitionStateMachine(zookeeper, broker_id, self._states)
        self._reassigner = PartitionReassigner(zookeeper, broker_id)
        self._elector = PreferredLeaderElector(zookeeper, broker_id, rebalance, self._states)
        #: monotonic time of the last election won (None before), for measurements.
        self.elected_at: float | None = None

    @property
    def events(self) -> EventQueue:
        """The queue the controller's thread reads (for ``watched_elsewhere``)."""
        return self._events

    @property
    def is_active(self) -> bool:
        """Whether this broker is the elected controller (and not suspended)."""
        return self._elected is not None and not self.zookeeper.suspended.is_set()

    @property
    def epoch(self) -> int:
        """The controller epoch this broker was elected at, -1 when not controller."""
        return -1 if self._elected is None else self._elected.epoch

    def start(self) -> "Controller":
        """Set up the watches and start the thread (which runs for election at once)."""
        assert self._thread is None, "this Controller was started already"
        self.zookeeper.add_events(self._events)
        self._watches = [self.zookeeper.watch_controller(self._events),
                         self.zookeeper.watch_reassignment(self._events),
                         self.zookeeper.watch_leader_balance(self._events)]
        if not self._watched_elsewhere:
            self._watches.append(self.zookeeper.watch_cluster(self._events))
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
        if self._elected is not None:
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
            if self._elected is not None and self._elector.rebalance_due():
                self._guarded(self._elector.auto_rebalance, self._elected)
            if self._elected is not None and self._notices.due(time.monotonic()) and \
                    not self.zookeeper.suspended.is_set():
                self._guarded(self._notices.collect, time.monotonic())

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
        named = self._states.watched(events) if self._elected is not None else set()
        for event in events:
            if event.kind is EventKind.SESSION and event.key is SessionState.LOST:
                self._resign("the ZooKeeper session was lost")
        if self.zookeeper.suspended.is_set():
            self._dirty = self._dirty or bool(kinds & _RECONCILING)
            return                                         # write nothing: maybe deposed
        if self._elected is not None:
            self._check_deposed(events)
        if self._elected is None:
            if self._dirty or EventKind.CONTROLLER in kinds or EventKind.SESSION in kinds:
                self._dirty = False
                self._try_elect()
            return
        if self._dirty or kinds & _RECONCILING or EventKind.SESSION in kinds or \
                not named <= self._partitions.live:
            self._reconcile(fresh=EventKind.SESSION in kinds)
        if self._reassigner.pending or kinds & _REASSIGNING:
            self._reassigner.reassign_partitions(self._elected)
        if kinds & {EventKind.PREFERRED_REPLICA_ELECTION, EventKind.SESSION}:
            self._elector.elect_on_demand(self._elected)

    def _check_deposed(self, events: list[WatchEvent]) -> None:
        """Resign when the events say another controller exists (checked fresh)."""
        epoch = self._elected.epoch
        for event in events:
            if event.kind is EventKind.PARTITION_STATE and event.body is not None:
                try:
                    state = zk_paths.decode_partition_state(event.body)
                except ZnodeFormatError:
                    continue
                if state.controller_epoch > epoch:
                    raise ControllerMovedError(f"{event.key} was written by controller epoch "
                                               f"{state.controller_epoch} > {epoch}")
            elif event.kind is EventKind.PARTITION_STATES:
                for change in event.body:
                    if change.state.controller_epoch > epoch:
                        raise ControllerMovedError(
                            f"{change.topic}-{change.partition} was written by controller "
                            f"epoch {change.state.controller_epoch} > {epoch}")
        if any(event.kind is EventKind.CONTROLLER for event in events):
            current = self.zookeeper.read_controller()
            if current is None or current.broker_id != self.broker_id:
                self._resign(f"/controller names {current}")
                self._try_elect()

    def _try_elect(self) -> None:
        if self._elected is not None or self._stopping.is_set() or \
                self.zookeeper.suspended.is_set():
            return
        elected = self.zookeeper.try_become_controller(self.broker_id)
        if elected is None:
            return
        self._elected = ControllerEpoch(*elected)
        self.elected_at = time.monotonic()
        self._partitions.forget_brokers()
        self._states.clear()
        log.info("broker %d is the controller at epoch %d", self.broker_id, self._elected.epoch)
        self._reconcile(fresh=True)                         # Kafka's onControllerFailover
        self._reassigner.reassign_partitions(self._elected)  # initializePartitionReassignments
        self._elector.schedule_rebalance(self.elected_at)
        self._elector.elect_on_demand(self._elected)        # one asked for before

    def _resign(self, why: str) -> None:
        if self._elected is not None:
            log.info("controller %d resigns (epoch %d): %s", self.broker_id,
                     self._elected.epoch, why)
        self._elected = None
        self._partitions.forget_brokers()
        self._states.clear()
        self._notices.clear()
        self._dirty = False
        self._fresh_needed = False
        self._reassigner.pending = False

    def _reconcile(self, fresh: bool = False) -> None:
        """Every partition's state (``partition_state_machine``); its states read
        fresh when ``fresh`` or when a fresh reconciliation asked for did not go
        through."""
        self._dirty = True                        # until every write went through
        self._fresh_needed = self._fresh_needed or fresh
        self._partitions.reconcile(self._elected, self._fresh_needed)
        self._dirty = False
        self._fresh_needed = False
