"""A broker's ZooKeeper session: the only module that imports kazoo.

:class:`ClusterZooKeeper` wraps one ``KazooClient`` (one session per broker, shared by
the broker's loop and its controller) and speaks in ``zk_paths``' terms: broker
registration, versioned partition-state writes, the controller's fenced multi-ops
and its election, topic creation and deletion marks, producer-id blocks, and
watches that turn znode changes into :class:`WatchEvent` s on an
:class:`EventQueue` the owner drains.

Rules
-----
* **kazoo's threads never touch broker state.** Watch callbacks and the session
  listener only put events on queues (and call the queue's ``wake``, e.g. the
  appender doorbell). The session listener never blocks and never calls
  ZooKeeper (kazoo runs it on its connection thread; kazoo issue #355): it sets or
  clears :attr:`ClusterZooKeeper.suspended`, counts losses, and queues.
* **SUSPENDED means "I may no longer be controller or leader".** kazoo reports it
  when nothing was read for 2/3 of the negotiated session timeout T; ZooKeeper
  expires the session (and its ephemerals) only after T, so an owner that stops
  acting on ``suspended`` is fenced before anyone else can be elected.
* **Every controller write is fenced** (Kafka's ``wrapRequestWithControllerEpochCheck``):
  :meth:`ClusterZooKeeper.checked_multi` puts ``check(/controller_epoch, version)``
  first. kazoo's ``commit()`` does not raise when a multi fails; it returns one
  result per op (the failing op's exception, ``RolledBackError`` before it,
  ``RuntimeInconsistency`` after it): a failed check becomes
  :class:`ControllerMovedError`, another failure a :class:`ZooKeeperConflictError`
  (a stale version: :class:`StaleStateVersionError`). Nothing of a refused multi is
  applied.
* **Partition states are written conditionally only** (Kafka's ZkIsrManager before
  KIP-497): a zombie leader holding an old zkVersion is refused.
* Reads are retried across a connection loss (bounded); writes are not (a retried
  write may have gone through): a lost connection during a write is
  :class:`ZooKeeperConnectionError`, its outcome unknown.

Theory of operation
-------------------
Watches are kazoo's ``DataWatch``/``ChildrenWatch`` recipes, not one-shot watches:
those re-read and re-arm after a reconnection (a one-shot watch is fired with a
NONE event and forgotten on SUSPENDED; kazoo issue #151). :meth:`watch_cluster`
cascades: the broker-id list starts a data watch per broker, the topic list one
per topic assignment and config, an assignment one per partition state. A watch
is set up on a thread kazoo's handler spawns, so :meth:`watch_cluster` never blocks
its caller. Events about one key may arrive more than once; ``zk_version`` orders
them (the data version, or for a broker its czxid), and a consumer keeps the
newest. A re-created topic restarts its state versions at 0: a ``TOPIC`` event with
a new ``topic_id`` starts over.
Two single watches stand apart: the controller's on ``/admin/reassign_partitions``
(:meth:`watch_reassignment`) and each broker's on its own ``/config/brokers/<id>``
(:meth:`watch_broker_config`, the throttle rates).

The controller's election (:meth:`try_become_controller`, Kafka's
``registerControllerAndIncrementControllerEpoch``) creates the ephemeral
``/controller`` and sets ``/controller_epoch`` to epoch+1 at the version read, in one
transaction. When it fails, or its outcome is unknown after a connection loss, it
reads ``/controller`` back: if that is this session's and the epoch is epoch+1, a
commit retried after the loss had gone through (Kafka's ``checkControllerAndEpoch``).

After a LOST session the broker's registration went with it: on the next
CONNECTED, :class:`ClusterZooKeeper` registers again (from a spawned thread) and
queues a ``REGISTERED`` event with the new broker epoch (Kafka's
``processRegisterBrokerAndReelect``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from ...common import limits
from ...common.errors import (
    BrokerIdInUseError,
    ControllerMovedError,
    InconsistentClusterIdError,
    PreferredElectionInProgressError,
    ReassignmentInProgressError,
    ShmlogError,
    StaleStateVersionError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    ZnodeFormatError,
    ZooKeeperConflictError,
    ZooKeeperConnectionError,
)
from . import paths as zk_paths
from .paths import (
    BrokerRegistration,
    ControllerRegistration,
    PartitionState,
    ProducerIdBlock,
    TopicAssignment,
)

__all__ = ["ClusterZooKeeper", "EventQueue", "WatchEvent", "EventKind", "SessionState",
           "ClusterWatch", "CreateOp", "SetDataOp", "DeleteOp", "CheckOp"]

log = logging.getLogger(__name__)

# What a lost connection looks like from a request.
_CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError,
                      KazooTimeoutError, RetryFailedError)


class SessionState(enum.Enum):
    """kazoo's session states (``KazooState``), in our names."""
    CONNECTED = "CONNECTED"      # connected; after SUSPENDED the same session, ephemerals intact
    SUSPENDED = "SUSPENDED"      # nothing heard for 2/3 T: may be expired elsewhere; stop acting
    LOST = "LOST"                # the session expired (or the client closed): ephemerals gone


class EventKind(enum.Enum):
    """What a :class:`WatchEvent` is about, and so what its fields hold."""
    SESSION = "session"                  # key SessionState; body None
    CONTROLLER = "controller"            # key CONTROLLER_PATH; body bytes | None
    BROKER_IDS = "broker_ids"            # key BROKER_IDS_PATH; body tuple[int, ...] (sorted)
    BROKER = "broker"                    # key broker id; body bytes | None; version = czxid
    TOPICS = "topics"                    # key TOPICS_PATH; body tuple[str, ...] (sorted)
    TOPIC = "topic"                      # key topic; body the assignment's bytes | None
    TOPIC_CONFIG = "topic_config"        # key topic; body bytes | None
    PARTITION_STATE = "partition_state"  # key (topic, partition); body bytes | None
    DELETE_TOPICS = "delete_topics"      # key DELETE_TOPICS_PATH; body tuple[str, ...]
    REGISTERED = "registered"            # key broker id; version the new broker epoch
    REASSIGN_PARTITIONS = "reassign_partitions"   # key REASSIGN_PARTITIONS_PATH; body bytes | None
    BROKER_CONFIG = "broker_config"      # key broker id; body bytes | None
    # Controlled shutdown and preferred election (leader_balance; the controller's).
    CONTROLLED_SHUTDOWN = "controlled_shutdown"    # key its path; body tuple[str, ...]
    PREFERRED_REPLICA_ELECTION = "preferred_replica_election"   # key its path; body bytes|None


class WatchEvent(NamedTuple):
    """One change seen in ZooKeeper (or of the session).

    ``body`` is the znode's bytes (None: the znode does not exist) or, for a list of
    children, a sorted tuple of them; decode bytes with ``zk_paths.decode_*``.
    ``zk_version`` orders events about one key: the znode's data version, a
    broker registration's czxid (its broker epoch), -1 when absent or not
    applicable.
    """
    kind: EventKind
    key: Any
    body: Any
    zk_version: int


class EventQueue:
    """Where kazoo's threads put :class:`WatchEvent` s for one owner: a thread-safe
    queue that never blocks its writer, plus an optional ``wake`` callback (the
    owner's doorbell) called after each put. ``wake`` runs on a kazoo thread: it
    must be quick and must not call ZooKeeper."""

    def __init__(self, wake: Callable[[], None] | None = None):
        self._events: queue.SimpleQueue[WatchEvent] = queue.SimpleQueue()
        self._wake = wake

    def put(self, event: WatchEvent) -> None:
        """Queue ``event`` and ring the owner's doorbell."""
        self._events.put(event)
        if self._wake is not None:
            self._wake()

    @property
    def waiting(self) -> bool:
        """Is an event queued?"""
        return not self._events.empty()

    def get(self, timeout_s: float) -> WatchEvent | None:
        """The next event, waiting at most ``timeout_s``; None if none came."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def drain(self) -> list[WatchEvent]:
        """Every event queued now, oldest first, without waiting."""
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events


# --- operations of a multi-op --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CreateOp:
    """Create ``path`` with ``body`` (its parent must exist)."""
    path: str
    body: bytes = b""
    ephemeral: bool = False


@dataclasses.dataclass(frozen=True)
class SetDataOp:
    """Set ``path``'s body if its version is ``version`` (-1: any)."""
    path: str
    body: bytes
    version: int


@dataclasses.dataclass(frozen=True)
class DeleteOp:
    """Delete ``path`` (it must have no children) if its version is ``version``."""
    path: str
    version: int = -1


@dataclasses.dataclass(frozen=True)
class CheckOp:
    """Fail the multi unless ``path``'s version is ``version``."""
    path: str
    version: int


Op = CreateOp | SetDataOp | DeleteOp | CheckOp


class ClusterZooKeeper:
    """A broker's ZooKeeper session and what cluster mode asks of it.

    Parameters
    ----------
    hosts : str
        ``zookeeper.connect``: ``"h1:2181,h2:2181/chroot"``; every path is under the
        chroot.
    session_timeout_ms : int
        The session timeout asked for (ZooKeeper clamps it to 2..20 ticks).
    connect_timeout_s : float
        How long :meth:`start` waits for the first session.

    Attributes
    ----------
    suspended : threading.Event
        Set while the session may be gone (SUSPENDED, LOST, not yet connected),
        cleared on CONNECTED: a leader advances no high watermark and a controller
        writes nothing while it is set.
    sessions_lost : int
        How many times the session was LOST.
    broker_epoch : int
        The czxid of this broker's registration (-1 before :meth:`register_broker`).
    """

    def __init__(self, hosts: str, *,
                 session_timeout_ms: int = limits.ZOOKEEPER_SESSION_TIMEOUT_MS_DEFAULT,
                 connect_timeout_s: float = limits.ZOOKEEPER_CONNECT_TIMEOUT_S):
        self.hosts = hosts
        self.session_timeout_s = session_timeout_ms / 1000
        self.connect_timeout_s = connect_timeout_s
        self._client = KazooClient(
            hosts=hosts, timeout=self.session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0})
        self._read_retry = KazooRetry(max_tries=limits.ZOOKEEPER_READ_ATTEMPTS_MAX, delay=0.1,
                                      max_delay=1.0, ignore_expire=True)
        self.suspended = threading.Event()
        self.suspended.set()
        self.sessions_lost = 0
        self.broker_epoch = -1
        self._queues: list[EventQueue] = []
        self._queues_lock = threading.Lock()
        self._registration: BrokerRegistration | None = None
        self._register_again = False

    # --- the session -------------------------------------------------------------------

    def start(self, *, create_paths: bool = True) -> "ClusterZooKeeper":
        """Connect, and make sure the chroot and the base paths exist (Kafka's
        createChrootIfNecessary and createTopLevelPaths) unless ``create_paths`` is
        false (a reader that must change nothing: ``cluster_status``).

        Raises
        ------
        ZooKeeperConnectionError
            No session within ``connect_timeout_s``.
        """
        servers, slash, chroot = self.hosts.partition("/")
        if create_paths and slash and chroot.strip("/"):
            # Kafka's createChrootIfNecessary: a client under a chroot that does not
            # exist can create nothing, so a short session without it makes it.
            chroot_maker = KazooClient(hosts=servers, timeout=self.session_timeout_s)
            self._connect(chroot_maker)
            try:
                self._read(chroot_maker.ensure_path, "/" + chroot.strip("/"))
            finally:
                chroot_maker.stop()
                chroot_maker.close()
        self._client.add_listener(self._on_session_state)
        self._connect(self._client)
        self.suspended.clear()
        for path in zk_paths.BASE_PATHS if create_paths else ():
            self._read(self._client.ensure_path, path)
        return self

    def _connect(self, client: KazooClient) -> None:
        try:
            client.start(timeout=self.connect_timeout_s)
        except KazooTimeoutError:
            client.stop()
            client.close()
            raise ZooKeeperConnectionError(
                f"no ZooKeeper session with {self.hosts} within {self.connect_timeout_s} s: "
                f"is zookeeper.connect right, and is ZooKeeper up?") from None

    def close(self) -> None:
        """End the session (its ephemerals go at once) and kazoo's threads."""
        self._client.stop()
        self._client.close()

    def __enter__(self) -> "ClusterZooKeeper":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def session_id(self) -> int | None:
        """This session's id (the owner of the ephemerals it creates), None when
        not connected."""
        client_id = self._client.client_id
        return None if client_id is None else client_id[0]

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password): what another client needs to take over (or, in
        tests, to expire) this session; None when not connected."""
        return self._client.client_id

    def add_events(self, events: EventQueue) -> None:
        """Have session changes (``SESSION`` events) and re-registrations queued on
        ``events`` too."""
        with self._queues_lock:
            self._queues.append(events)

    def remove_events(self, events: EventQueue) -> None:
        """Stop queueing session events on ``events``."""
        with self._queues_lock:
            if events in self._queues:
                self._queues.remove(events)

    def _broadcast(self, event: WatchEvent) -> None:
        with self._queues_lock:
            targets = list(self._queues)
        for events in targets:
            events.put(event)

    def _on_session_state(self, state: str) -> None:
        """kazoo's session listener, on its connection thread: flags and queues only."""
        if state == KazooState.CONNECTED:
            if self._register_again and self._registration is not None:
                self._register_again = False
                self._client.handler.spawn(self._reregister)
            self.suspended.clear()
        else:
            self.suspended.set()
            if state == KazooState.LOST:
                self.sessions_lost += 1
                self._register_again = True
        self._broadcast(WatchEvent(EventKind.SESSION, SessionState(state), None, -1))

    # --- requests ----------------------------------------------------------------------

    def _read(self, function: Callable, *args, **kwargs) -> Any:
        """An idempotent request, retried across connection losses (bounded)."""
        try:
            return self._read_retry(function, *args, **kwargs)
        except _CONNECTION_ERRORS as error:
            raise ZooKeeperConnectionError(
                f"ZooKeeper ({self.hosts}) did not answer {getattr(function, '__name__', '')}"
                f"{args[:1]}: {type(error).__name__}") from None

    def _write(self, function: Callable, *args, **kwargs) -> Any:
        """A request tried once: a lost connection leaves its outcome unknown."""
        try:
            return function(*args, **kwargs)
        except _CONNECTION_ERRORS as error:
            raise ZooKeeperConnectionError(
                f"the connection to ZooKeeper ({self.hosts}) was lost during a write to "
                f"{args[:1]}: its outcome is unknown ({type(error).__name__})") from None

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        """(body, ZnodeStat) of ``path``, None if it does not exist."""
        try:
            return self._read(self._client.get, path)
        except NoNodeError:
            return None

    def _children(self, path: str) -> list[str]:
        try:
            return self._read(self._client.get_children, path)
        except NoNodeError:
            return []

    # --- registration ------------------------------------------------------------------

    def register_broker(self, registration: BrokerRegistration, cluster_id: str) -> int:
        """Join cluster ``cluster_id`` as ``registration``: claim or check
        ``/cluster/id``, then create the ephemeral ``/brokers/ids/<id>`` (stamped with
        the time, and this process's pid unless the registration names one). After
        a LOST session it is created again by itself (a ``REGISTERED`` event says so).

        Returns
        -------
        int
            The broker epoch: the registration's czxid (KIP-380).

        Raises
        ------
        InconsistentClusterIdError
            ``/cluster/id`` names another cluster.
        BrokerIdInUseError
            Another session holds this broker id past the session timeout (a
            restarted broker waits that long for its previous session's to go).
        """
        self._claim_cluster_id(cluster_id)
        self._registration = registration
        self.broker_epoch = self._register(registration)
        return self.broker_epoch

    def _claim_cluster_id(self, cluster_id: str) -> None:
        try:
            self._write(self._client.create, zk_paths.CLUSTER_ID_PATH,
                        zk_paths.encode_cluster_id(cluster_id))
        except NodeExistsError:
            existing = zk_paths.decode_cluster_id(self._get(zk_paths.CLUSTER_ID_PATH)[0])
            if existing != cluster_id:
                raise InconsistentClusterIdError(
                    f"{self.hosts} holds cluster {existing!r}, and this broker's cluster.id is "
                    f"{cluster_id!r}: point zookeeper.connect at this cluster's chroot, or fix "
                    f"cluster.id") from None

    def _register(self, registration: BrokerRegistration) -> int:
        path = zk_paths.broker_path(registration.broker_id)
        # Stamped at each registration, as Kafka's timestamp is.
        body = zk_paths.encode_broker_registration(dataclasses.replace(
            registration, timestamp_ms=_now_ms(), pid=registration.pid or os.getpid()))
        deadline = time.monotonic() + self.session_timeout_s * \
            limits.BROKER_REGISTRATION_WAIT_SESSIONS
        while True:
            try:
                self._write(self._client.create, path, body, ephemeral=True)
            except NodeExistsError:
                found = self._get(path)
                if found is None:
                    continue                          # it went between our two calls
                if found[1].ephemeralOwner != self.session_id:
                    self._wait_for_deletion(path, deadline, registration.broker_id)
                    continue
            found = self._get(path)
            if found is not None and found[1].ephemeralOwner == self.session_id:
                return found[1].czxid
            # Ours was gone already (the session was lost meanwhile): try again.

    def _wait_for_deletion(self, path: str, deadline: float, broker_id: int) -> None:
        gone = threading.Event()
        if self._read(self._client.exists, path, watch=lambda event: gone.set()) is None:
            return
        if not gone.wait(max(0.0, deadline - time.monotonic())):
            raise BrokerIdInUseError(
                f"broker id {broker_id} is registered by another ZooKeeper session at "
                f"{path}, and it did not go within "
                f"{limits.BROKER_REGISTRATION_WAIT_SESSIONS} session timeouts: is another "
                f"broker running with broker.id {broker_id}?")

    def _reregister(self) -> None:
        """After a LOST session, on a thread of kazoo's handler."""
        registration = self._registration
        try:
            self.broker_epoch = self._register(registration)
        except ShmlogError as error:
            log.error("broker %d could not register again after its ZooKeeper session was "
                      "lost (tried again at the next reconnection): %s",
                      registration.broker_id, error)
            self.broker_epoch = -1
            self._register_again = True
        self._broadcast(WatchEvent(EventKind.REGISTERED, registration.broker_id, None,
                                   self.broker_epoch))

    # --- reads -------------------------------------------------------------------------

    def read_brokers(self) -> dict[int, tuple[BrokerRegistration, int]]:
        """The live brokers: id → (registration, broker epoch = czxid)."""
        brokers = {}
        for name in self._children(zk_paths.BROKER_IDS_PATH):
            broker_id = zk_paths.decode_broker_id(name)
            found = self._get(zk_paths.broker_path(broker_id))
            if found is not None:                         # else it went meanwhile
                brokers[broker_id] = (zk_paths.decode_broker_registration(broker_id, found[0]),
                                      found[1].czxid)
        return dict(sorted(brokers.items()))

    def read_controller(self) -> ControllerRegistration | None:
        """Who ``/controller`` names, None if no controller is elected."""
        found = self._get(zk_paths.CONTROLLER_PATH)
        return None if found is None else zk_paths.decode_controller(found[0])

    def read_controller_epoch(self) -> tuple[int, int]:
        """(controller epoch, zkVersion of ``/controller_epoch``), creating it as 0 when
        missing (Kafka's ``getControllerEpoch`` + ``createControllerEpochRaw``)."""
        while True:
            found = self._get(zk_paths.CONTROLLER_EPOCH_PATH)
            if found is not None:
                return zk_paths.decode_controller_epoch(found[0]), found[1].version
            try:
                self._write(self._client.create, zk_paths.CONTROLLER_EPOCH_PATH,
                            zk_paths.encode_controller_epoch(0))
            except NodeExistsError:
                pass                                       # another broker's: read it

    def read_topics(self) -> list[str]:
        """The topics (children of ``/brokers/topics``), sorted."""
        return sorted(self._children(zk_paths.TOPICS_PATH))

    def read_assignment(self, topic: str) -> TopicAssignment | None:
        """Topic ``topic``'s assignment, None if it does not exist."""
        found = self._get(zk_paths.topic_path(topic))
        return None if found is None else zk_paths.decode_topic_assignment(topic, found[0])

    def read_assignment_versioned(self, topic: str) -> tuple[TopicAssignment, int] | None:
        """(assignment, zkVersion) of ``topic``, None if it does not exist: what a
        conditional rewrite of the assignment (a reassignment's) is checked against."""
        found = self._get(zk_paths.topic_path(topic))
        return None if found is None else (zk_paths.decode_topic_assignment(topic, found[0]),
                                           found[1].version)

    def read_assignments(self) -> dict[str, TopicAssignment]:
        """Every topic's assignment, by name."""
        assignments = {}
        for topic in self.read_topics():
            assignment = self.read_assignment(topic)
            if assignment is not None:
                assignments[topic] = assignment
        return assignments

    def read_topic_config(self, topic: str) -> dict[str, str]:
        """Topic ``topic``'s overrides ({} when it has no config znode)."""
        found = self._get(zk_paths.topic_config_path(topic))
        return {} if found is None else zk_paths.decode_topic_config(topic, found[0])

    def read_partition_state(self, topic: str,
                             partition: int) -> tuple[PartitionState, int] | None:
        """(state, zkVersion) of one partition, None if it has no state yet."""
        path = zk_paths.partition_state_path(topic, partition)
        found = self._get(path)
        return None if found is None else (zk_paths.decode_partition_state(found[0], path),
                                           found[1].version)

    def read_partition_states(self, topic: str) -> dict[int, tuple[PartitionState, int]]:
        """Every partition state of ``topic`` that exists: partition → (state, zkVersion)."""
        states = {}
        for name in self._children(zk_paths.partitions_path(topic)):
            partition = zk_paths.decode_partition_number(name, zk_paths.partitions_path(topic))
            found = self.read_partition_state(topic, partition)
            if found is not None:
                states[partition] = found
        return dict(sorted(states.items()))

    def read_reassignment(self) -> tuple[dict[tuple[str, int], tuple[int, ...]], int] | None:
        """(target replicas by (topic, partition), zkVersion) of the reassignment
        request in ``/admin/reassign_partitions``, None when there is none."""
        found = self._get(zk_paths.REASSIGN_PARTITIONS_PATH)
        return None if found is None else (zk_paths.decode_reassignment(found[0]),
                                           found[1].version)

    def read_broker_config(self, broker_id: int) -> dict[str, str]:
        """Broker ``broker_id``'s dynamic configs ({} when it has none)."""
        found = self._get(zk_paths.broker_config_path(broker_id))
        return {} if found is None else zk_paths.decode_broker_config(broker_id, found[0])

    def read_topics_to_delete(self) -> list[str]:
        """The topics marked for deletion, sorted."""
        return sorted(self._children(zk_paths.DELETE_TOPICS_PATH))

    # --- writes ------------------------------------------------------------------------

    def create_topic(self, assignment: TopicAssignment, config: dict[str, str]) -> None:
        """Write the topic's config and assignment in one transaction (the
        controller then creates its partition states).

        Raises
        ------
        TopicExistsError
            The topic (or a leftover config of it) exists.
        """
        transaction = self._client.transaction()
        transaction.create(zk_paths.topic_config_path(assignment.topic),
                           zk_paths.encode_topic_config(config))
        transaction.create(zk_paths.topic_path(assignment.topic),
                           zk_paths.encode_topic_assignment(assignment))
        try:
            self._check_results(self._write(transaction.commit),
                                [CreateOp(zk_paths.topic_config_path(assignment.topic)),
                                 CreateOp(zk_paths.topic_path(assignment.topic))])
        except ZooKeeperConflictError:
            raise TopicExistsError(f"topic {assignment.topic!r} already exists") from None

    def mark_topic_deleted(self, topic: str) -> None:
        """Ask the controller to delete ``topic`` (``/admin/delete_topics/<t>``); a
        topic marked already stays marked.

        Raises
        ------
        UnknownTopicOrPartitionError
            No such topic.
        """
        if self._read(self._client.exists, zk_paths.topic_path(topic)) is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        try:
            self._write(self._client.create, zk_paths.delete_topic_path(topic))
        except NodeExistsError:
            pass

    def set_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """Replace ``topic``'s config overrides (``/config/topics/<t>``); every broker
        takes them from its watch (Kafka's ``AdminZkClient.changeTopicConfig``, whose
        change notification our watches make unneeded).

        Raises
        ------
        UnknownTopicOrPartitionError
            No such topic.
        """
        try:
            self._write(self._client.set, zk_paths.topic_config_path(topic),
                        zk_paths.encode_topic_config(config))
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None

    def create_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]]) -> None:
        """Ask the controller to move ``partitions`` to their target replicas (create
        ``/admin/reassign_partitions``).

        Raises
        ------
        ReassignmentInProgressError
            A reassignment request exists already (Kafka's tool refuses then too).
        """
        self._read(self._client.ensure_path, zk_paths.ADMIN_PATH)
        try:
            self._write(self._client.create, zk_paths.REASSIGN_PARTITIONS_PATH,
                        zk_paths.encode_reassignment(partitions))
        except NodeExistsError:
            raise ReassignmentInProgressError(
                f"{zk_paths.REASSIGN_PARTITIONS_PATH} exists: a reassignment is in progress "
                f"(verify it, or cancel it)") from None

    def replace_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]],
                             version: int) -> None:
        """Rewrite the reassignment request if its zkVersion is still ``version``
        (``--cancel`` puts the origin replicas as targets).

        Raises
        ------
        StaleStateVersionError, ZooKeeperConflictError
            The request changed or went since it was read: read it again.
        """
        path = zk_paths.REASSIGN_PARTITIONS_PATH
        try:
            self._write(self._client.set, path, zk_paths.encode_reassignment(partitions),
                        version=version)
        except (BadVersionError, NoNodeError) as error:
            raise _conflict(error, path) from None

    def set_broker_config(self, broker_id: int, config: dict[str, str]) -> None:
        """Replace broker ``broker_id``'s dynamic configs (``/config/brokers/<id>``,
        created when missing); the broker takes them from its watch (Kafka's
        ``AdminZkClient.changeBrokerConfig``)."""
        path = zk_paths.broker_config_path(broker_id)
        body = zk_paths.encode_broker_config(config)
        self._read(self._client.ensure_path, zk_paths.BROKER_CONFIGS_PATH)
        try:
            self._write(self._client.set, path, body)
        except NoNodeError:
            try:
                self._write(self._client.create, path, body)
            except NodeExistsError:                  # created meanwhile: ours is newer
                self._write(self._client.set, path, body)

    def update_partition_state(self, topic: str, partition: int, state: PartitionState,
                               version: int) -> int:
        """Write a partition's state if its zkVersion is still ``version`` (a
        leader's ISR change: it keeps the leader, the leader epoch and the
        ``controller_epoch`` of the state it read). Blocks: call from a thread that
        may, or use :meth:`update_partition_state_async`.

        Returns
        -------
        int
            The new zkVersion.

        Raises
        ------
        StaleStateVersionError
            The state was written since ``version`` (a new election, say): re-read.
        ZooKeeperConflictError
            The state does not exist (the topic was deleted).
        ZooKeeperConnectionError
            The outcome is unknown: re-read.
        """
        path = zk_paths.partition_state_path(topic, partition)
        try:
            return self._write(self._client.set, path, zk_paths.encode_partition_state(state),
                               version=version).version
        except (BadVersionError, NoNodeError) as error:
            raise _conflict(error, path) from None

    def update_partition_state_async(self, topic: str, partition: int, state: PartitionState,
                                     version: int,
                                     done: Callable[[int | ShmlogError], None]) -> None:
        """:meth:`update_partition_state` without blocking: ``done`` gets the new
        zkVersion or the error, on a kazoo thread (so it must only queue)."""
        path = zk_paths.partition_state_path(topic, partition)

        def finished(result) -> None:
            try:
                done(result.get().version)
            except (BadVersionError, NoNodeError) as error:
                done(_conflict(error, path))
            except _CONNECTION_ERRORS as error:
                done(ZooKeeperConnectionError(
                    f"the connection to ZooKeeper was lost while writing {path}: its outcome "
                    f"is unknown ({type(error).__name__})"))

        self._client.set_async(path, zk_paths.encode_partition_state(state),
                               version=version).rawlink(finished)

    def checked_multi(self, ops: Sequence[Op], controller_version: int) -> list:
        """Apply ``ops`` atomically, only if ``/controller_epoch`` still has zkVersion
        ``controller_version`` (the caller is still the controller).

        Returns
        -------
        list
            One result per op: the created path, True (delete), a stat with
            ``.version`` (set).

        Raises
        ------
        ControllerMovedError
            A newer controller was elected; nothing was applied.
        StaleStateVersionError, ZooKeeperConflictError
            An op found its znode otherwise; nothing was applied.
        ZooKeeperConnectionError
            The outcome is unknown.
        """
        fenced = [CheckOp(zk_paths.CONTROLLER_EPOCH_PATH, controller_version), *ops]
        transaction = self._client.transaction()
        for op in fenced:
            _add(transaction, op)
        return self._check_results(self._write(transaction.commit), fenced)[1:]

    @staticmethod
    def _check_results(results: list, ops: Sequence[Op]) -> list:
        """Raise the typed error for a failed multi (see the module's rules)."""
        assert len(results) == len(ops), (results, ops)
        for index, (result, op) in enumerate(zip(results, ops)):
            if isinstance(result, (RolledBackError, RuntimeInconsistency)) or \
                    not isinstance(result, Exception):
                continue
            if index == 0 and op.path == zk_paths.CONTROLLER_EPOCH_PATH:
                raise ControllerMovedError(
                    f"{op.path} is no longer at version {op.version} "
                    f"({type(result).__name__}): a newer controller was elected")
            raise _conflict(result, op.path)
        return results

    def partition_state_creation_ops(self, topic: str,
                                     states: dict[int, PartitionState]) -> list[Op]:
        """The ops that create ``states`` (and the ``partitions`` znodes above them that
        do not exist yet), for :meth:`checked_multi`."""
        ops: list[Op] = []
        if self._read(self._client.exists, zk_paths.partitions_path(topic)) is None:
            ops.append(CreateOp(zk_paths.partitions_path(topic)))
        existing = set(self._children(zk_paths.partitions_path(topic)))
        for partition, state in sorted(states.items()):
            if str(partition) not in existing:
                ops.append(CreateOp(zk_paths.partition_path(topic, partition)))
            ops.append(CreateOp(zk_paths.partition_state_path(topic, partition),
                                zk_paths.encode_partition_state(state)))
        return ops

    def topic_deletion_ops(self, topic: str) -> list[Op]:
        """The ops that delete every znode of ``topic`` that exists (children first:
        states, partitions, assignment, config) and its deletion mark."""
        ops: list[Op] = []
        partitions = zk_paths.partitions_path(topic)
        for name in sorted(self._children(partitions)):
            for child in sorted(self._children(f"{partitions}/{name}")):
                ops.append(DeleteOp(f"{partitions}/{name}/{child}"))
            ops.append(DeleteOp(f"{partitions}/{name}"))
        for path in (partitions, zk_paths.topic_path(topic), zk_paths.topic_config_path(topic),
                     zk_paths.delete_topic_path(topic)):
            listed = path == partitions and ops         # it has children, so it exists
            if listed or self._read(self._client.exists, path) is not None:
                ops.append(DeleteOp(path))
        return ops

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """Run for controller (§1.2 of the design, Kafka's
        ``registerControllerAndIncrementControllerEpoch``).

        Returns
        -------
        tuple[int, int] | None
            (epoch, zkVersion of ``/controller_epoch``) when elected, None when
            another broker is controller.
        """
        epoch, version = self.read_controller_epoch()
        body = zk_paths.encode_controller(ControllerRegistration(broker_id, _now_ms()))
        transaction = self._client.transaction()
        transaction.create(zk_paths.CONTROLLER_PATH, body, ephemeral=True)
        transaction.set_data(zk_paths.CONTROLLER_EPOCH_PATH,
                             zk_paths.encode_controller_epoch(epoch + 1), version=version)
        try:
            results = transaction.commit()
        except _CONNECTION_ERRORS:
            results = None                          # unknown: read back below
        if results is not None and not any(isinstance(result, Exception) for result in results):
            return epoch + 1, results[1].version
        found = self._get(zk_paths.CONTROLLER_PATH)
        if found is None or found[1].ephemeralOwner != self.session_id:
            return None
        current, current_version = self.read_controller_epoch()
        return (current, current_version) if current == epoch + 1 else None

    def resign_controller(self, broker_id: int) -> None:
        """Delete ``/controller`` if this session holds it (a clean stop), so the
        others elect at once instead of after the session timeout."""
        found = self._get(zk_paths.CONTROLLER_PATH)
        if found is None or found[1].ephemeralOwner != self.session_id:
            return
        try:
            self._write(self._client.delete, zk_paths.CONTROLLER_PATH,
                        version=found[1].version)
        except (NoNodeError, BadVersionError):
            pass

    def next_producer_id_block(self, broker_id: int) -> ProducerIdBlock:
        """Take the next block of ``PRODUCER_ID_BLOCK_SIZE`` producer ids, cluster-wide
        (Kafka's ``ProducerIdManager.getNewProducerIdBlock``): read the last block
        and its version, write the next one conditionally, retry when another
        broker took one meanwhile.

        Raises
        ------
        StaleStateVersionError
            Lost the race ``ZOOKEEPER_CONFLICT_ATTEMPTS_MAX`` times.
        ZnodeFormatError
            The znode is malformed, or its last block leaves no ids.
        """
        path = zk_paths.PRODUCER_ID_BLOCK_PATH
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            body, stat = self._get(path) or (b"", None)
            last = zk_paths.decode_producer_id_block(body)
            start = 0 if last is None else last.block_end + 1
            block = ProducerIdBlock(broker_id, start, start + zk_paths.PRODUCER_ID_BLOCK_SIZE - 1)
            if block.block_end > zk_paths.PRODUCER_ID_MAX:
                raise ZnodeFormatError(f"{path}: the last block ends at {start - 1}: no "
                                       f"producer ids are left")
            try:
                if stat is None:
                    self._write(self._client.create, path,
                                zk_paths.encode_producer_id_block(block))
                else:
                    self._write(self._client.set, path, zk_paths.encode_producer_id_block(block),
                                version=stat.version)
                return block
            except (BadVersionError, NodeExistsError):
                continue
        raise StaleStateVersionError(f"{path}: another broker took a block each of "
                                     f"{limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX} times",
                                     path=path)

    # --- watches -----------------------------------------------------------------------

    def watch_controller(self, events: EventQueue) -> "ClusterWatch":
        """Queue a ``CONTROLLER`` event on ``events`` now and on each change of
        ``/controller``. Does not block."""
        watch = ClusterWatch(self._client, events)
        watch.spawn(watch.watch_data, zk_paths.CONTROLLER_PATH, EventKind.CONTROLLER,
                    zk_paths.CONTROLLER_PATH)
        return watch

    def watch_reassignment(self, events: EventQueue) -> "ClusterWatch":
        """Queue a ``REASSIGN_PARTITIONS`` event on ``events`` now and on each change
        of ``/admin/reassign_partitions`` (the controller's). Does not block."""
        watch = ClusterWatch(self._client, events)
        watch.spawn(watch.watch_data, zk_paths.REASSIGN_PARTITIONS_PATH,
                    EventKind.REASSIGN_PARTITIONS, zk_paths.REASSIGN_PARTITIONS_PATH)
        return watch

    def watch_broker_config(self, broker_id: int, events: EventQueue) -> "ClusterWatch":
        """Queue a ``BROKER_CONFIG`` event on ``events`` now and on each change of
        ``/config/brokers/<broker_id>``. Does not block."""
        watch = ClusterWatch(self._client, events)
        watch.spawn(watch.watch_data, zk_paths.broker_config_path(broker_id),
                    EventKind.BROKER_CONFIG, broker_id)
        return watch

    def watch_cluster(self, events: EventQueue) -> "ClusterWatch":
        """Queue on ``events`` the current state and every later change of the live
        brokers, topics (assignment, config, partition states) and deletion marks.
        Does not block; the first events arrive from kazoo's threads."""
        watch = ClusterWatch(self._client, events)
        watch.spawn(watch.watch_children, zk_paths.BROKER_IDS_PATH, EventKind.BROKER_IDS,
                    watch.brokers_listed)
        watch.spawn(watch.watch_children, zk_paths.TOPICS_PATH, EventKind.TOPICS,
                    watch.topics_listed)
        watch.spawn(watch.watch_children, zk_paths.DELETE_TOPICS_PATH,
                    EventKind.DELETE_TOPICS, None)
        return watch

    # --- controlled shutdown and preferred election (leader_balance) ------------------

    def request_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> None:
        """Ask the controller to move ``broker_id``'s leaderships away: (re)create the
        ephemeral ``/admin/controlled_shutdown/<id>`` in this session. Asking again
        deletes and creates it, so the controller's children watch fires and it
        elects again (Kafka's broker sends its request again)."""
        path = zk_paths.controlled_shutdown_path(broker_id)
        try:
            self._write(self._client.delete, path)
        except NoNodeError:
            pass
        self._write(self._client.create, path, zk_paths.encode_controlled_shutdown(broker_epoch),
                    ephemeral=True)

    def read_controlled_shutdowns(self) -> dict[int, int]:
        """The brokers that asked for a controlled shutdown: id → the broker epoch
        they asked with (a malformed znode is logged and skipped)."""
        asking = {}
        for name in self._children(zk_paths.CONTROLLED_SHUTDOWN_PATH):
            try:
                broker_id = zk_paths.decode_broker_id(name)
                found = self._get(zk_paths.controlled_shutdown_path(broker_id))
                if found is not None:
                    asking[broker_id] = zk_paths.decode_controlled_shutdown(broker_id, found[0])
            except ZnodeFormatError as error:
                log.warning("%s", error)
        return dict(sorted(asking.items()))

    def request_preferred_replica_election(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Write ``/admin/preferred_replica_election`` (Kafka's znode and body) for
        ``partitions``; the controller elects them and deletes it.

        Raises
        ------
        PreferredElectionInProgressError
            The znode exists: an election asked for earlier is not done.
        """
        try:
            self._write(self._client.create, zk_paths.PREFERRED_REPLICA_ELECTION_PATH,
                        zk_paths.encode_preferred_replica_election(partitions))
        except NodeExistsError:
            raise PreferredElectionInProgressError(
                f"{zk_paths.PREFERRED_REPLICA_ELECTION_PATH} exists: a preferred replica "
                f"election asked for earlier is still in progress") from None

    def read_preferred_replica_election(self) -> tuple[tuple[tuple[str, int], ...], int] | None:
        """(the partitions asked for, zkVersion) of a pending preferred replica
        election, None when none is pending."""
        found = self._get(zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
        if found is None:
            return None
        return zk_paths.decode_preferred_replica_election(found[0]), found[1].version

    def watch_leader_balance(self, events: EventQueue) -> "ClusterWatch":
        """Queue on ``events`` a ``CONTROLLED_SHUTDOWN`` event now and when the brokers
        asking for a controlled shutdown change, and a ``PREFERRED_REPLICA_ELECTION``
        event now and when that znode changes. Does not block."""
        watch = ClusterWatch(self._client, events)
        watch.spawn(watch.watch_children, zk_paths.CONTROLLED_SHUTDOWN_PATH,
                    EventKind.CONTROLLED_SHUTDOWN, None)
        watch.spawn(watch.watch_data, zk_paths.PREFERRED_REPLICA_ELECTION_PATH,
                    EventKind.PREFERRED_REPLICA_ELECTION, zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
        return watch


class ClusterWatch:
    """The watches one :meth:`ClusterZooKeeper.watch_cluster` (or ``watch_controller``)
    call set up, queueing on one :class:`EventQueue`; :meth:`cancel` ends them
    (each stops at its next firing, queueing nothing more)."""

    def __init__(self, client: KazooClient, events: EventQueue):
        self._client = client
        self._events = events
        self._lock = threading.Lock()
        self._cancelled = False
        self._brokers: set[int] = set()
        self._topics: dict[str, _TopicWatch] = {}

    def cancel(self) -> None:
        """Queue nothing more."""
        self._cancelled = True

    def spawn(self, function: Callable, *args) -> None:
        """Run ``function(*args)`` on a thread of kazoo's handler (it may block)."""
        self._client.handler.spawn(function, *args)

    def watch_data(self, path: str, kind: EventKind, key: Any,
                   alive: Callable[[], bool] | None = None,
                   seen: Callable[[bytes], None] | None = None) -> None:
        """A DataWatch on ``path`` queueing ``kind`` events; it ends when cancelled or
        when ``alive()`` turns false. ``seen(body)`` may start more watches (without
        blocking) when the znode exists."""
        def changed(data, stat):
            if self._cancelled or (alive is not None and not alive()):
                return False
            version = -1 if stat is None else (stat.czxid if kind is EventKind.BROKER
                                               else stat.version)
            self._events.put(WatchEvent(kind, key, data, version))
            if seen is not None and data is not None:
                seen(data)
            return None
        self._client.DataWatch(path, changed)

    def watch_children(self, path: str, kind: EventKind,
                       listed: Callable[[list[str]], None] | None) -> None:
        """A ChildrenWatch on ``path`` queueing ``kind`` events; ``listed`` may start
        more watches (without blocking)."""
        def changed(children):
            if self._cancelled:
                return False
            names = sorted(children)
            if listed is not None:
                listed(names)
            body = tuple(sorted(_broker_ids(names))) if kind is EventKind.BROKER_IDS \
                else tuple(names)
            self._events.put(WatchEvent(kind, path, body, -1))
            return None
        self._client.ChildrenWatch(path, changed)

    def brokers_listed(self, names: list[str]) -> None:
        """A data watch per broker id ever seen: it follows the broker through its
        bounces (a new czxid each time it registers)."""
        with self._lock:
            new = [broker_id for broker_id in _broker_ids(names) if broker_id not in self._brokers]
            self._brokers.update(new)
        for broker_id in new:
            self.spawn(self.watch_data, zk_paths.broker_path(broker_id), EventKind.BROKER,
                       broker_id)

    def topics_listed(self, names: list[str]) -> None:
        """Watches for the topics that appeared; those of the topics gone end."""
        with self._lock:
            for topic in set(self._topics) - set(names):
                self._topics.pop(topic).alive = False
            new = [topic for topic in names if topic not in self._topics]
            for topic in new:
                self._topics[topic] = _TopicWatch(self, topic)
        for topic in new:
            topic_watch = self._topics.get(topic)
            if topic_watch is not None:
                topic_watch.start()


class _TopicWatch:
    """One topic's watches: its assignment, its config, and a state per partition
    its assignment names; all end when the topic leaves the topic list."""

    def __init__(self, watch: ClusterWatch, topic: str):
        self.watch = watch
        self.topic = topic
        self.alive = True
        self.partitions: set[int] = set()
        self.lock = threading.Lock()

    def is_alive(self) -> bool:
        return self.alive

    def start(self) -> None:
        self.watch.spawn(self._watch_config_then_assignment)

    def _watch_config_then_assignment(self) -> None:
        """The config's first event is queued before the assignment's (a DataWatch
        reads its znode as it is set up), so a broker creates the topic's logs with
        its config: a segment.bytes learned later sizes only the next segment."""
        self.watch.watch_data(zk_paths.topic_config_path(self.topic), EventKind.TOPIC_CONFIG,
                              self.topic, self.is_alive)
        self.watch.watch_data(zk_paths.topic_path(self.topic), EventKind.TOPIC, self.topic,
                              self.is_alive, self._assignment_seen)

    def _assignment_seen(self, data: bytes) -> None:
        try:
            partitions = zk_paths.decode_topic_assignment(self.topic, data).partitions
        except ZnodeFormatError as error:
            log.warning("%s", error)                  # the owner sees it when it decodes
            return
        with self.lock:
            new = [partition for partition in partitions if partition not in self.partitions]
            self.partitions.update(new)
        for partition in new:
            self.watch.spawn(self.watch.watch_data,
                             zk_paths.partition_state_path(self.topic, partition),
                             EventKind.PARTITION_STATE, (self.topic, partition), self.is_alive)


def _broker_ids(names: Iterable[str]) -> list[int]:
    """The broker ids among ``names`` (a stray child is logged and skipped)."""
    ids = []
    for name in names:
        try:
            ids.append(zk_paths.decode_broker_id(name))
        except ZnodeFormatError as error:
            log.warning("%s", error)
    return ids


def _add(transaction, op: Op) -> None:
    if isinstance(op, CreateOp):
        transaction.create(op.path, op.body, ephemeral=op.ephemeral)
    elif isinstance(op, SetDataOp):
        transaction.set_data(op.path, op.body, version=op.version)
    elif isinstance(op, DeleteOp):
        transaction.delete(op.path, version=op.version)
    else:
        assert isinstance(op, CheckOp), op
        transaction.check(op.path, op.version)


def _conflict(error: KazooException, path: str) -> ZooKeeperConflictError:
    """The typed error for a refused conditional write."""
    if isinstance(error, BadVersionError):
        return StaleStateVersionError(f"{path} has another zkVersion than the one written "
                                      f"against: someone wrote it since it was read", path=path)
    return ZooKeeperConflictError(f"{path}: {type(error).__name__} (the znode is not as "
                                  f"the writer believed)", path=path)


def _now_ms() -> int:
    return int(time.time() * 1000)
