"""What the controller's jobs share (Kafka's ``ControllerContext``): the election won,
the fresh reads each job starts from, and the partition states as last seen.

Rules
-----
* **The epoch won fences every write**: a job writes only through
  ``ClusterZooKeeper.checked_multi`` with :attr:`ControllerEpoch.zk_version`, and
  stamps :attr:`ControllerEpoch.epoch` on every partition state it writes.
* **Brokers and assignments are read fresh** by each job: the live brokers, those
  shutting down, and a topic's assignment (which no write of a state checks).
* **Partition states may come from** :class:`StateCache` (Kafka's
  ``partitionLeadershipInfo``): what the controller last read, wrote, or was told
  by its watch, each with its zkVersion. A cached state may be behind ZooKeeper (a
  leader's ISR write whose event has not come yet), never ahead of it, so every
  write decided from it names the version it was decided on; a refused one is
  decided again from a fresh read. After an election, and after the session
  reconnected, states are read fresh (the watch may have missed changes).

Theory of operation
-------------------
:class:`ControllerEpoch` is what ``ClusterZooKeeper.try_become_controller`` returns;
the controller holds one while elected and passes it to each job. A broker's epoch
is its registration's czxid, so a live broker whose epoch changed bounced; a
controlled shutdown asked for in an earlier incarnation (another broker epoch) is
not one now.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable

from ...common import limits
from ...common.errors import ZnodeFormatError, ZooKeeperConflictError
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.events import EventKind, WatchEvent
from ..zk.paths import NO_LEADER, PartitionState, TopicAssignment

__all__ = ["ControllerEpoch", "StateCache", "read_live_brokers", "read_brokers_shutting_down"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ControllerEpoch:
    """The election this controller won."""
    epoch: int              # the controller epoch, stamped on the states it writes
    zk_version: int         # the zkVersion of /controller_epoch it left: the write fence


def read_live_brokers(zookeeper: ClusterZooKeeper) -> dict[int, int]:
    """The live brokers: id → broker epoch (their registration's czxid)."""
    return {broker_id: epoch for broker_id, (_, epoch) in zookeeper.read_brokers().items()}


def read_brokers_shutting_down(zookeeper: ClusterZooKeeper, live: dict[int, int],
                               controller_id: int) -> frozenset[int]:
    """The live brokers that asked for a controlled shutdown in their current
    incarnation (Kafka checks the request's broker epoch the same way); logged as
    controller ``controller_id``'s finding."""
    asking = zookeeper.read_controlled_shutdowns()
    shutting = frozenset(broker_id for broker_id, epoch in asking.items()
                         if live.get(broker_id) == epoch)
    if shutting:
        log.info("controller %d: brokers shutting down %s", controller_id, sorted(shutting))
    return shutting


class StateCache:
    """Partition states as the controller last read, wrote or was told by its watch:
    (topic, partition) → (state, zkVersion), newest version wins (see the module's
    rules).

    A topic's states are trusted only under the topic id they were cached for: a
    topic deleted and created again starts its versions over, so a state cached
    under the old id would hide the new ones. A state seen before its topic's
    assignment has no id, and is not trusted until a fresh read gives it one.
    """

    def __init__(self) -> None:
        self._states: dict[str, dict[int, tuple[PartitionState, int]]] = {}
        self._topic_ids: dict[str, str | None] = {}

    def clear(self) -> None:
        """Forget everything (an election, a resignation)."""
        self._states.clear()
        self._topic_ids.clear()

    def forget(self, topic: str) -> None:
        """Forget one topic's states (it was deleted)."""
        self._states.pop(topic, None)
        self._topic_ids.pop(topic, None)

    def states(self, assignment: TopicAssignment) -> dict[int, tuple[PartitionState, int]] | None:
        """The cached state of every partition ``assignment`` names, or None when
        one is missing or the states were cached under another topic id."""
        topic = assignment.topic
        if self._topic_ids.get(topic) != assignment.topic_id:
            return None
        cached = self._states.get(topic, {})
        if any(partition not in cached for partition in assignment.partitions):
            return None
        return {partition: cached[partition] for partition in assignment.partitions}

    def remember(self, assignment: TopicAssignment,
                 states: dict[int, tuple[PartitionState, int]]) -> None:
        """Take in states read fresh (or written) for the topic of ``assignment``."""
        topic = assignment.topic
        if self._topic_ids.get(topic) != assignment.topic_id:
            self._states.pop(topic, None)
            self._topic_ids[topic] = assignment.topic_id
        cached = self._states.setdefault(topic, {})
        for partition, (state, version) in states.items():
            held = cached.get(partition)
            if held is None or held[1] < version:
                cached[partition] = (state, version)

    def watched(self, events: Iterable[WatchEvent]) -> set[int]:
        """Take in the watch's events; the brokers named as leader or in the ISR by
        the states that were news (so the controller can see one that is gone)."""
        named: set[int] = set()
        for event in events:
            if event.kind is EventKind.PARTITION_STATE:
                named |= self._state_watched(event)
            elif event.kind is EventKind.PARTITION_STATES:
                for change in event.body:
                    named |= self._change_noticed(change)
            elif event.kind is EventKind.TOPIC:
                self._topic_watched(event)
            elif event.kind is EventKind.TOPICS:
                for topic in set(self._topic_ids) - set(event.body):
                    self.forget(topic)
        return named

    def _state_watched(self, event: WatchEvent) -> set[int]:
        topic, partition = event.key
        if event.body is None:
            self._states.get(topic, {}).pop(partition, None)
            return set()
        cached = self._states.setdefault(topic, {})
        held = cached.get(partition)
        if held is not None and held[1] >= event.zk_version:
            return set()
        try:
            state = zk_paths.decode_partition_state(event.body, f"{topic}-{partition} state")
        except ZnodeFormatError:
            cached.pop(partition, None)          # read fresh, and reported, by the next job
            return set()
        self._topic_ids.setdefault(topic, None)
        cached[partition] = (state, event.zk_version)
        return {state.leader, *state.isr} - {NO_LEADER}

    def _change_noticed(self, change) -> set[int]:
        """A state from a notice (``state_changes.StateChange``): one naming another
        topic id than the one held is an old incarnation's; under no id held yet it
        is kept untrusted, as a watched state is."""
        topic = change.topic
        if self._topic_ids.setdefault(topic, None) not in (None, change.topic_id):
            return set()
        cached = self._states.setdefault(topic, {})
        held = cached.get(change.partition)
        if held is not None and held[1] >= change.zk_version:
            return set()
        cached[change.partition] = (change.state, change.zk_version)
        return {change.state.leader, *change.state.isr} - {NO_LEADER}

    def _topic_watched(self, event: WatchEvent) -> None:
        topic = event.key
        if event.body is None:
            self.forget(topic)
            return
        try:
            topic_id = zk_paths.decode_topic_assignment(topic, event.body).topic_id
        except ZnodeFormatError:
            return
        if self._topic_ids.get(topic) != topic_id:
            self.forget(topic)         # created again (versions start over), or first seen
            self._topic_ids[topic] = topic_id


class NoticeCollector:
    """Deletes the state-change notices (``zk.state_changes``) once they are
    ``limits.STATE_CHANGE_RETENTION_S`` old, counted from when this controller
    first listed them: no clock but its own, and a new controller waits the whole
    time again before deleting anything."""

    def __init__(self, zookeeper: ClusterZooKeeper):
        self.zookeeper = zookeeper
        self._first_listed: dict[str, float] = {}
        self._next_at = 0.0

    def clear(self) -> None:
        """Forget the notices listed (a resignation)."""
        self._first_listed = {}
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def collect(self, now: float) -> None:
        """List the notices; delete those listed a retention ago."""
        self._next_at = now + limits.STATE_CHANGE_COLLECT_INTERVAL_S
        names = self.zookeeper.read_state_change_notices()
        self._first_listed = {name: self._first_listed.get(name, now) for name in names}
        old = sorted(name for name, listed in self._first_listed.items()
                     if now - listed >= limits.STATE_CHANGE_RETENTION_S)
        if not old:
            return
        try:
            self.zookeeper.delete_state_change_notices(old)
        except ZooKeeperConflictError as error:     # one deleted already: list again next time
            log.info("state-change notices: %s; listing them again later", error)
            return
        for name in old:
            del self._first_listed[name]
