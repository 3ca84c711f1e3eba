"""Watches: ZooKeeper's changes turned into :class:`WatchEvent` s on an owner's
:class:`EventQueue` (what Kafka's ZNodeChangeHandlers and ZNodeChildChangeHandlers
do for its controller, and UpdateMetadata requests for its brokers).

Rules
-----
* **A watch only queues.** Its callbacks run on kazoo's threads: they put events
  (and start more watches, without blocking); the owner decodes and acts.
* **Setting up never blocks its caller**: each watch is set up on a thread of
  kazoo's handler (``ZooKeeperSession.spawn``), and the first events arrive from
  there.
* A :class:`ClusterWatch` ends when cancelled (each watch stops at its next
  firing, queueing nothing more); a topic's watches end when the topic leaves the
  topic list.

Theory of operation
-------------------
Watches are kazoo's ``DataWatch``/``ChildrenWatch`` recipes (``ZooKeeperSession.
data_watch``, ``children_watch``): they re-read and re-arm after a reconnection, so
events about one key may arrive more than once; ``zk_version`` orders them (the
data version, or for a broker its czxid), and a consumer keeps the newest.
:func:`watch_cluster` cascades: the broker-id list starts a data watch per broker,
the topic list one per topic assignment and config.
**Partition states are not watched one by one** (a failover changes thousands at
once, and a watch each cost every broker a notification and a read per state):
an assignment's partitions are read once (one ``ZnodeReads``: reads pipelined,
and all read again at each reconnection), and each later write
is learned from its multi's notice (``state_changes``): one children watch on
``/state_changes``, each new notice read as it appears, queued as one
``PARTITION_STATES`` event. The children watch starts first and its first listing
is the baseline: every state written after it comes in a later notice, and every
state written before it is in the znode that the topic's read then finds. A
topic's states are read whenever its assignment is first seen (or with a new id):
a notice read before that assignment's event is dropped by the view, and the read,
sent after the event, finds what the notice named. A notice
gone before it was read (deleted after ``limits.STATE_CHANGE_RETENTION_S``) makes
every state be read again. A re-created topic restarts its state versions at 0: a
``TOPIC`` event with a new ``topic_id`` starts over.
One cluster watch serves every owner in a process (``also``: the broker's
replica service and its controller share it): each watch set in a session is
one more read of every partition state it changes, and a failover changes
thousands of them at once, on the controller's own connection.
Two single watches stand apart: the controller's on ``/admin/reassign_partitions``
(:func:`watch_reassignment`) and each broker's on its own ``/config/brokers/<id>``
(:func:`watch_broker_config`, the throttle rates).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Sequence

from ...common.errors import ShmlogError, ZnodeFormatError
from . import paths as zk_paths
from . import state_changes
from .events import EventKind, EventQueue, WatchEvent
from .session import ZooKeeperSession

__all__ = ["ClusterWatch", "watch_controller", "watch_reassignment", "watch_broker_config",
           "watch_cluster", "watch_leader_balance"]

log = logging.getLogger(__name__)


def watch_controller(session: ZooKeeperSession, events: EventQueue) -> "ClusterWatch":
    """Queue a ``CONTROLLER`` event on ``events`` now and on each change of
    ``/controller``. Does not block."""
    watch = ClusterWatch(session, events)
    watch.spawn(watch.watch_data, zk_paths.CONTROLLER_PATH, EventKind.CONTROLLER,
                zk_paths.CONTROLLER_PATH)
    return watch


def watch_reassignment(session: ZooKeeperSession, events: EventQueue) -> "ClusterWatch":
    """Queue a ``REASSIGN_PARTITIONS`` event on ``events`` now and on each change
    of ``/admin/reassign_partitions`` (the controller's). Does not block."""
    watch = ClusterWatch(session, events)
    watch.spawn(watch.watch_data, zk_paths.REASSIGN_PARTITIONS_PATH,
                EventKind.REASSIGN_PARTITIONS, zk_paths.REASSIGN_PARTITIONS_PATH)
    return watch


def watch_broker_config(session: ZooKeeperSession, broker_id: int,
                        events: EventQueue) -> "ClusterWatch":
    """Queue a ``BROKER_CONFIG`` event on ``events`` now and on each change of
    ``/config/brokers/<broker_id>``. Does not block."""
    watch = ClusterWatch(session, events)
    watch.spawn(watch.watch_data, zk_paths.broker_config_path(broker_id),
                EventKind.BROKER_CONFIG, broker_id)
    return watch


def watch_cluster(session: ZooKeeperSession, events: EventQueue,
                  also: Sequence[EventQueue] = ()) -> "ClusterWatch":
    """Queue on ``events`` (and on each of ``also``: one watch for every owner in
    the process, see the module's theory of operation) the current state and every later change
    of the live brokers, topics (assignment, config, partition states) and
    deletion marks. Does not block; the first events arrive from kazoo's threads."""
    watch = ClusterWatch(session, events, also)
    watch.spawn(watch.watch_children, zk_paths.BROKER_IDS_PATH, EventKind.BROKER_IDS,
                watch.brokers_listed)
    watch.spawn(watch.watch_notices_then_topics)
    watch.spawn(watch.watch_children, zk_paths.DELETE_TOPICS_PATH,
                EventKind.DELETE_TOPICS, None)
    return watch


def watch_leader_balance(session: ZooKeeperSession, events: EventQueue) -> "ClusterWatch":
    """Queue on ``events`` a ``CONTROLLED_SHUTDOWN`` event now and when the brokers
    asking for a controlled shutdown change, and a ``PREFERRED_REPLICA_ELECTION``
    event now and when that znode changes. Does not block."""
    watch = ClusterWatch(session, events)
    watch.spawn(watch.watch_children, zk_paths.CONTROLLED_SHUTDOWN_PATH,
                EventKind.CONTROLLED_SHUTDOWN, None)
    watch.spawn(watch.watch_data, zk_paths.PREFERRED_REPLICA_ELECTION_PATH,
                EventKind.PREFERRED_REPLICA_ELECTION, zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
    return watch


class ClusterWatch:
    """The watches one ``watch_*`` call set up, queueing on one :class:`EventQueue`;
    :meth:`cancel` ends them (each stops at its next firing, queueing nothing
    more)."""

    def __init__(self, session: ZooKeeperSession, events: EventQueue,
                 also: Sequence[EventQueue] = ()):
        self._session = session
        self._queues = (events, *also)
        self._lock = threading.Lock()
        self._cancelled = False
        self._brokers: set[int] = set()
        self._topics: dict[str, _TopicWatch] = {}
        # Every partition state read: its path -> (its key, the topic's watch).
        self._states: dict[str, tuple[tuple[str, int], _TopicWatch]] = {}
        self._state_reads = None
        # The newest notice's sequence number seen (None: not listed yet; -1: none).
        self._last_notice: int | None = None

    def cancel(self) -> None:
        """Queue nothing more."""
        self._cancelled = True
        with self._lock:
            if self._state_reads is not None:
                self._state_reads.stop()

    def _put(self, event: WatchEvent) -> None:
        for events in self._queues:
            events.put(event)

    def watch_states(self, topic_watch: "_TopicWatch", partitions: Iterable[int]) -> None:
        """Queue ``PARTITION_STATE`` events for these partitions of the topic, now and
        at each reconnection, while the topic's watch lives (their changes come in
        notices). Does not block.

        A topic's partitions are read when its assignment is first seen (or seen
        with a new topic id), even if their states do not exist yet: a notice of
        them read before the assignment's event was queued is dropped by the view
        (a topic it does not know), and this read, sent after that event, finds
        what the notice named."""
        paths = []
        with self._lock:
            if self._cancelled:
                return
            if self._state_reads is None:
                self._state_reads = self._session.znode_reads(self._state_changed)
            for partition in partitions:
                path = zk_paths.partition_state_path(topic_watch.topic, partition)
                self._states[path] = ((topic_watch.topic, partition), topic_watch)
                paths.append(path)
            reads = self._state_reads
        reads.add(paths)

    def _state_changed(self, path: str, data: bytes | None, stat: Any) -> bool | None:
        with self._lock:
            watched = self._states.get(path)
            if watched is not None and not watched[1].alive:
                del self._states[path]            # a re-created topic's watch adds it again
                watched = None
        if self._cancelled or watched is None:
            return False
        self._put(WatchEvent(EventKind.PARTITION_STATE, watched[0], data,
                                    -1 if stat is None else stat.version))
        return None

    def forget_states(self, topic_watch: "_TopicWatch") -> None:
        """Read the states of a topic gone no more."""
        with self._lock:
            gone = [path for path, (_, owner) in self._states.items() if owner is topic_watch]
            for path in gone:
                del self._states[path]
            reads = self._state_reads
        if reads is not None and gone:
            reads.remove(gone)

    def watch_notices_then_topics(self) -> None:
        """The notices' children watch, then the topic list's: the notices' first
        listing is the baseline that the topics' first reads are taken after (see
        the module's theory of operation)."""
        self._session.children_watch(state_changes.STATE_CHANGES_PATH, self._notices_listed)
        self.watch_children(zk_paths.TOPICS_PATH, EventKind.TOPICS, self.topics_listed)

    def _notices_listed(self, names: list[str]) -> bool | None:
        """On a kazoo thread: the new notices are read on another (it may block)."""
        if self._cancelled:
            return False
        sequences = sorted(sequence for sequence in map(state_changes.notice_sequence, names)
                           if sequence is not None)
        with self._lock:
            last = self._last_notice
            self._last_notice = max(sequences[-1] if sequences else -1,
                                    -1 if last is None else last)
        new = [] if last is None else [sequence for sequence in sequences if sequence > last]
        if new:
            self.spawn(self._read_notices, new)
        return None

    def _read_notices(self, sequences: list[int]) -> None:
        """Queue the notices' states; one gone before it was read (or unreadable)
        makes every state be read again."""
        paths = [f"{state_changes.STATE_CHANGE_PREFIX}{sequence:010d}" for sequence in sequences]
        try:
            found = self._session.get_many(paths)
        except ShmlogError as error:           # the reconnection reads every state again
            log.warning("state-change notices not read: %s", error)
            return
        missed = False
        for sequence, path in zip(sequences, paths):
            if self._cancelled:
                return
            try:
                if found[path] is None:
                    raise ZnodeFormatError(f"{path} was deleted before it was read")
                changes = state_changes.decode_notice(found[path][0], path)
            except ZnodeFormatError as error:
                log.warning("%s: reading every partition state again", error)
                missed = True
                continue
            self._put(WatchEvent(EventKind.PARTITION_STATES, state_changes.STATE_CHANGES_PATH,
                                 changes, sequence))
        with self._lock:
            reads = None if self._cancelled else self._state_reads
        if missed and reads is not None:
            reads.read_all()

    def spawn(self, function: Callable, *args) -> None:
        """Run ``function(*args)`` on a thread of kazoo's handler (it may block)."""
        self._session.spawn(function, *args)

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
            self._put(WatchEvent(kind, key, data, version))
            if seen is not None and data is not None:
                seen(data)
            return None
        self._session.data_watch(path, changed)

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
            self._put(WatchEvent(kind, path, body, -1))
            return None
        self._session.children_watch(path, changed)

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
            gone = [self._topics.pop(topic) for topic in set(self._topics) - set(names)]
            for topic_watch in gone:
                topic_watch.alive = False
            new = [topic for topic in names if topic not in self._topics]
            for topic in new:
                self._topics[topic] = _TopicWatch(self, topic)
        for topic_watch in gone:
            self.forget_states(topic_watch)
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
        self.topic_id: str | None = None
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
            assignment = zk_paths.decode_topic_assignment(self.topic, data)
        except ZnodeFormatError as error:
            log.warning("%s", error)                  # the owner sees it when it decodes
            return
        with self.lock:
            renewed = assignment.topic_id != self.topic_id     # first seen, or re-created
            self.topic_id = assignment.topic_id
            new = [partition for partition in assignment.partitions
                   if renewed or partition not in self.partitions]
            self.partitions.update(new)
        if new:
            self.watch.watch_states(self, new)


def _broker_ids(names: Iterable[str]) -> list[int]:
    """The broker ids among ``names`` (a stray child is logged and skipped)."""
    ids = []
    for name in names:
        try:
            ids.append(zk_paths.decode_broker_id(name))
        except ZnodeFormatError as error:
            log.warning("%s", error)
    return ids
