"""What a single broker tells Kafka clients about itself: one broker (node 0) at its
advertised listener, leading every partition it hosts at leader epoch 0.

Rules
-----
* The cluster id is derived from the data directory's real path (22 characters of
  URL-safe base64, Kafka's format): the same across restarts of the broker.
* Topics are created through the broker's topic service, with its checks, as
  ``shmlog topics create`` creates them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import uuid

from ..common.errors import ShmlogError
from ..common.internal_topics import INTERNAL_TOPICS
from .error_codes import INVALID_TOPIC_EXCEPTION, NONE, UNKNOWN_TOPIC_OR_PARTITION, for_completion

__all__ = ["LocalMetadata", "SINGLE_BROKER_ID", "cluster_id_of"]

SINGLE_BROKER_ID = 0


def cluster_id_of(data_dir: str) -> str:
    """A single broker's cluster id: a UUID-sized digest of its data directory."""
    digest = hashlib.sha256(os.path.realpath(data_dir).encode()).digest()
    digest = digest[:len(uuid.UUID(int=0).bytes)]          # a UUID's 16 bytes
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class LocalMetadata:
    """The metadata of the broker ``core`` (a BrokerCore without a cluster), which
    clients reach at ``advertised`` (host, port), or a listener's clients at
    ``by_listener[name]`` (each listener's clients are told their own listener)."""

    def __init__(self, core, advertised: tuple[str, int],
                 by_listener: dict[str, tuple[str, int]] | None = None) -> None:
        self.core = core
        self.advertised = advertised
        self.by_listener = by_listener or {}
        self.broker_id = SINGLE_BROKER_ID
        self.cluster_id = cluster_id_of(core.data_dir)
        self.auto_create = core.config.auto_create_topics_enable
        self._ids: dict[str, str] = {}              # topic id -> name, as last seen

    # -- brokers -----------------------------------------------------------------------
    def brokers(self, listener: str | None = None) -> list[tuple[int, str, int, str | None]]:
        """(node id, host, port, rack) of every broker, for a client of ``listener``."""
        host, port = self.by_listener.get(listener, self.advertised)
        return [(SINGLE_BROKER_ID, host, port, None)]

    def coordinator(self, group_id: str, listener: str | None = None) -> tuple[int, str, int]:
        """(node id, host, port) of the broker coordinating ``group_id``: this one, at
        ``listener``."""
        return (self.broker_id, *self.by_listener.get(listener, self.advertised))

    def transaction_coordinator(self, transactional_id: str,
                                listener: str | None = None) -> tuple[int, str, int]:
        """(node id, host, port) of the transactional id's coordinator: this broker."""
        return self.coordinator(transactional_id, listener)

    def controller_id(self) -> int:
        return SINGLE_BROKER_ID

    # -- topics ------------------------------------------------------------------------
    def topic_names(self) -> list[str]:
        return self.core.host.logs.list_topics()

    def topic_name_of(self, topic_id: str) -> str | None:
        if topic_id not in self._ids:
            self._ids = {self.core.host.logs.describe_topic(name).topic_id: name
                         for name in self.topic_names()}
        return self._ids.get(topic_id)

    def topic(self, name: str):
        """(topic id, internal, [(partition, error code, leader, leader epoch, replicas,
        in-sync replicas)]) of topic ``name``, or None if there is none."""
        try:
            described = self.core.host.logs.describe_topic(name)
        except ShmlogError:
            return None
        me = [SINGLE_BROKER_ID]
        return (described.topic_id, name in INTERNAL_TOPICS,
                [(partition, 0, SINGLE_BROKER_ID, 0, me, me)
                 for partition in range(described.partitions)])

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The partition's leader epoch if this broker leads it, else None (a single
        broker leads every partition it hosts, at epoch 0)."""
        return 0

    def append(self, topic: str, partition: int, batch, acks: int, deadline: int,
               answer, transactional_id: str | None = None) -> None:
        """Append a client's converted batch as leader: ``answer(error code, base
        offset, append time)`` at once (on one broker acks=all is acks=1; its
        coordinator verifies a transactional batch in place)."""
        try:
            hosted = self.core.host.partition(topic, partition)
        except ShmlogError:
            answer(UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
            return
        if topic in INTERNAL_TOPICS:             # the broker's own appends only
            answer(INVALID_TOPIC_EXCEPTION, -1, -1)
            return
        result, append_time = self.core.host.appender.append(hosted.row, batch)
        if result < 0:
            answer(for_completion(-result), -1, -1)
        else:
            answer(NONE, result, append_time)

    def create_topic(self, name: str) -> None:
        """Create ``name`` with the broker's ``num_partitions`` (auto-creation)."""
        self.core.topics.create_topic(name, self.core.config.num_partitions)
