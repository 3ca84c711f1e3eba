"""What ZooKeeper tells a broker: :class:`WatchEvent` s, put on an :class:`EventQueue`
by kazoo's threads and drained by the queue's owner (the broker's loop, the
controller's thread).

Rules
-----
* **A writer never blocks and never touches its reader's state.** kazoo's watch
  callbacks and its session listener only :meth:`EventQueue.put`; the owner's
  ``wake`` (the appender doorbell, say) runs on the kazoo thread, so it must be
  quick and must not call ZooKeeper.
* **States are enum members.** :class:`SessionState` holds kazoo's session states by
  their names (``KazooState``'s values), so this module needs no kazoo.

Theory of operation
-------------------
One event says that a key changed and what it holds now (``body``: the znode's
bytes, None when it does not exist, or a sorted tuple of children). kazoo's watches
re-read after a reconnection, so events about one key may arrive more than once
and out of date: ``zk_version`` orders them (the data version, or for a broker its
registration's czxid), and a reader keeps the newest (``view.ClusterView``). A
burst of events is drained at once (:meth:`EventQueue.drain`) and answered as one.
"""

from __future__ import annotations

import enum
import queue
from typing import Any, Callable, NamedTuple

__all__ = ["SessionState", "EventKind", "WatchEvent", "EventQueue"]


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
    # A state-change notice (state_changes): key STATE_CHANGES_PATH; body
    # tuple[StateChange, ...] (decoded); version the notice's sequence number.
    PARTITION_STATES = "partition_states"
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
