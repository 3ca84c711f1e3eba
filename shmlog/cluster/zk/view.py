"""A broker's picture of the cluster, built from ZooKeeper's watch events (sans-I/O).

Every broker keeps one :class:`ClusterView`: the live brokers and their epochs, the
topics with their assignments and configs, and every partition's state (leader,
leader epoch, ISR). It is Kafka's metadata cache, fed not by the controller's
UpdateMetadata requests but by ZooKeeper's watches and the state-change notices
(``watches.ClusterWatch``, ``state_changes``), so it is as current as ZooKeeper
and a restarted broker needs nothing replayed.

Rules
-----
* Newest wins, per znode: a partition state is applied only when its zkVersion is
  above the one held (kazoo's watches may fire twice, and a re-read after a
  reconnection may deliver an old body after a new one). A topic re-created under
  its name has a new topic id; its states start again from version 0, and a
  notice naming the old id is ignored.
* A body that does not decode (an operator's hand edit, a newer broker's format) is
  logged and ignored: the view keeps what it had.
* Each applied event returns the :class:`Change` s it made, so the replica service
  acts only on what changed (an election, an ISR change, a topic created or gone).
* No I/O and no threads: the broker's loop thread feeds it and reads it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Union

from ...common.errors import ZnodeFormatError
from . import paths as zk_paths
from .events import EventKind, SessionState, WatchEvent
from .paths import BrokerRegistration, PartitionState, TopicAssignment

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterView", "LiveBroker", "Change", "BrokersChanged", "TopicChanged", "TopicGone",
           "TopicConfigChanged", "PartitionStateChanged", "SessionChanged", "Reregistered",
           "TopicsToDelete", "BrokerConfigChanged"]


@dataclasses.dataclass(frozen=True)
class LiveBroker:
    """A registered broker: where it is, and its epoch (its registration's czxid)."""
    registration: BrokerRegistration
    epoch: int


@dataclasses.dataclass(frozen=True)
class BrokersChanged:
    """The set of live brokers, or one's registration, changed."""
    live: frozenset[int]


@dataclasses.dataclass(frozen=True)
class TopicChanged:
    """A topic appeared, was re-created (a new id), or its assignment changed."""
    assignment: TopicAssignment


@dataclasses.dataclass(frozen=True)
class TopicGone:
    topic: str


@dataclasses.dataclass(frozen=True)
class TopicConfigChanged:
    topic: str
    config: dict


@dataclasses.dataclass(frozen=True)
class PartitionStateChanged:
    """A partition's state znode has a newer version."""
    topic: str
    partition: int
    state: PartitionState
    version: int


@dataclasses.dataclass(frozen=True)
class SessionChanged:
    state: SessionState


@dataclasses.dataclass(frozen=True)
class Reregistered:
    """The broker registered again after a lost session: its new epoch."""
    epoch: int


@dataclasses.dataclass(frozen=True)
class TopicsToDelete:
    topics: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class BrokerConfigChanged:
    """A broker's dynamic configs (``/config/brokers/<id>``: the throttle rates)."""
    broker_id: int
    config: dict


Change = Union[BrokersChanged, TopicChanged, TopicGone, TopicConfigChanged,
               PartitionStateChanged, SessionChanged, Reregistered, TopicsToDelete,
               BrokerConfigChanged]


class ClusterView:
    """The cluster as ZooKeeper's watches have shown it so far."""

    def __init__(self) -> None:
        self.brokers: dict[int, LiveBroker] = {}
        self.topics: dict[str, TopicAssignment] = {}
        self.configs: dict[str, dict] = {}
        self.states: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        self.session = SessionState.CONNECTED
        self._listed_brokers: frozenset[int] = frozenset()

    # -- reading ---------------------------------------------------------------------------
    @property
    def live_brokers(self) -> frozenset[int]:
        return frozenset(self.brokers)

    def state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        """A partition's state and its zkVersion, or None when not seen yet."""
        return self.states.get((topic, partition))

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        assignment = self.topics.get(topic)
        return () if assignment is None else tuple(assignment.partitions.get(partition, ()))

    # -- applying ---------------------------------------------------------------------------
    def apply_all(self, events: Iterable[WatchEvent]) -> list[Change]:
        changes: list[Change] = []
        for event in events:
            changes.extend(self.apply(event))
        return changes

    def apply(self, event: WatchEvent) -> list[Change]:
        """Take in one event; the changes it made (none for a stale or bad one)."""
        handler = _HANDLERS.get(event.kind)
        if handler is None:
            return []
        try:
            return handler(self, event)
        except ZnodeFormatError as error:
            log.warning("ignoring a znode that does not decode: %s", error)
            return []

    def _session(self, event: WatchEvent) -> list[Change]:
        self.session = event.key
        return [SessionChanged(event.key)]

    def _registered(self, event: WatchEvent) -> list[Change]:
        return [Reregistered(event.zk_version)]

    def _broker_ids(self, event: WatchEvent) -> list[Change]:
        self._listed_brokers = frozenset(event.body)
        gone = set(self.brokers) - self._listed_brokers
        for broker_id in gone:
            del self.brokers[broker_id]
        return [BrokersChanged(self.live_brokers)] if gone else []

    def _broker(self, event: WatchEvent) -> list[Change]:
        broker_id = event.key
        held = self.brokers.get(broker_id)
        if event.body is None:
            if held is None:
                return []
            del self.brokers[broker_id]
        else:
            if held is not None and held.epoch >= event.zk_version:
                return []
            registration = zk_paths.decode_broker_registration(broker_id, event.body)
            self.brokers[broker_id] = LiveBroker(registration, event.zk_version)
        return [BrokersChanged(self.live_brokers)]

    def _topics(self, event: WatchEvent) -> list[Change]:
        listed = set(event.body)
        return [change for topic in list(self.topics) if topic not in listed
                for change in self._forget_topic(topic)]

    def _topic(self, event: WatchEvent) -> list[Change]:
        topic = event.key
        if event.body is None:
            return self._forget_topic(topic)
        assignment = zk_paths.decode_topic_assignment(topic, event.body)
        held = self.topics.get(topic)
        if held == assignment:
            return []
        changes: list[Change] = []
        if held is not None and held.topic_id != assignment.topic_id:
            changes.extend(self._forget_topic(topic))       # re-created: states start over
        self.topics[topic] = assignment
        changes.append(TopicChanged(assignment))
        return changes

    def _forget_topic(self, topic: str) -> list[Change]:
        if self.topics.pop(topic, None) is None:
            return []
        self.configs.pop(topic, None)
        for key in [key for key in self.states if key[0] == topic]:
            del self.states[key]
        return [TopicGone(topic)]

    def _topic_config(self, event: WatchEvent) -> list[Change]:
        config = {} if event.body is None else zk_paths.decode_topic_config(event.key, event.body)
        if self.configs.get(event.key) == config:
            return []
        self.configs[event.key] = config
        return [TopicConfigChanged(event.key, dict(config))]

    def _partition_state(self, event: WatchEvent) -> list[Change]:
        topic, partition = event.key
        if event.body is None or topic not in self.topics:
            return []                      # deleted with its topic (TopicGone says so)
        held = self.states.get(event.key)
        if held is not None and held[1] >= event.zk_version:
            return []
        state = zk_paths.decode_partition_state(event.body, f"{topic}-{partition} state")
        self.states[event.key] = (state, event.zk_version)
        return [PartitionStateChanged(topic, partition, state, event.zk_version)]

    def _partition_states(self, event: WatchEvent) -> list[Change]:
        """A notice's states: each taken as its znode's event would be, if it names
        the topic incarnation held (an old one's notice, read late, is not news)."""
        changes: list[Change] = []
        for change in event.body:
            assignment = self.topics.get(change.topic)
            if assignment is None or assignment.topic_id != change.topic_id:
                continue
            key = (change.topic, change.partition)
            held = self.states.get(key)
            if held is not None and held[1] >= change.zk_version:
                continue
            self.states[key] = (change.state, change.zk_version)
            changes.append(PartitionStateChanged(change.topic, change.partition, change.state,
                                                 change.zk_version))
        return changes

    def _broker_config(self, event: WatchEvent) -> list[Change]:
        config = {} if event.body is None else \
            zk_paths.decode_broker_config(event.key, event.body)
        return [BrokerConfigChanged(event.key, config)]

    def _delete_topics(self, event: WatchEvent) -> list[Change]:
        return [TopicsToDelete(tuple(event.body))] if event.body else []


_HANDLERS = {
    EventKind.SESSION: ClusterView._session,
    EventKind.REGISTERED: ClusterView._registered,
    EventKind.BROKER_IDS: ClusterView._broker_ids,
    EventKind.BROKER: ClusterView._broker,
    EventKind.TOPICS: ClusterView._topics,
    EventKind.TOPIC: ClusterView._topic,
    EventKind.TOPIC_CONFIG: ClusterView._topic_config,
    EventKind.PARTITION_STATE: ClusterView._partition_state,
    EventKind.PARTITION_STATES: ClusterView._partition_states,
    EventKind.DELETE_TOPICS: ClusterView._delete_topics,
    EventKind.BROKER_CONFIG: ClusterView._broker_config,
}
