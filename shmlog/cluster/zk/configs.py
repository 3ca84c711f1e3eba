"""Dynamic configs in ZooKeeper: a topic's overrides in ``/config/topics/<topic>`` and
a broker's in ``/config/brokers/<id>`` (Kafka's ``AdminZkClient.changeTopicConfig``,
``changeBrokerConfig`` and ``fetchEntityConfig``).

Rules
-----
* **A write replaces the whole config** (the body is every override); a reader that
  finds no znode has no overrides ({}).
* **No change notifications**: every broker watches the config znodes it uses
  (``watches``), which makes Kafka's ``/config/changes`` sequence unneeded.
* A topic's config znode is created with the topic (``topics.TopicZnodes.create_topic``)
  and only set here; a broker's is created at its first set.

Theory of operation
-------------------
Configs are last-writer-wins: they are set without a version, as Kafka's admin
client sets them, since an operator's newer value is the one meant.
"""

from __future__ import annotations

from ...common.errors import UnknownTopicOrPartitionError, ZnodeExistsError, ZnodeMissingError
from . import paths as zk_paths
from .session import ZooKeeperSession

__all__ = ["ConfigZnodes"]


class ConfigZnodes:
    """Topic and broker configs, read and written in ``session``."""

    def __init__(self, session: ZooKeeperSession):
        self._session = session

    def read_topic_config(self, topic: str) -> dict[str, str]:
        """Topic ``topic``'s overrides ({} when it has no config znode)."""
        found = self._session.get(zk_paths.topic_config_path(topic))
        return {} if found is None else zk_paths.decode_topic_config(topic, found[0])

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
            self._session.set(zk_paths.topic_config_path(topic),
                              zk_paths.encode_topic_config(config))
        except ZnodeMissingError:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None

    def read_broker_config(self, broker_id: int) -> dict[str, str]:
        """Broker ``broker_id``'s dynamic configs ({} when it has none)."""
        found = self._session.get(zk_paths.broker_config_path(broker_id))
        return {} if found is None else zk_paths.decode_broker_config(broker_id, found[0])

    def set_broker_config(self, broker_id: int, config: dict[str, str]) -> None:
        """Replace broker ``broker_id``'s dynamic configs (``/config/brokers/<id>``,
        created when missing); the broker takes them from its watch (Kafka's
        ``AdminZkClient.changeBrokerConfig``)."""
        path = zk_paths.broker_config_path(broker_id)
        body = zk_paths.encode_broker_config(config)
        self._session.ensure_path(zk_paths.BROKER_CONFIGS_PATH)
        try:
            self._session.set(path, body)
        except ZnodeMissingError:
            try:
                self._session.create(path, body)
            except ZnodeExistsError:                 # created meanwhile: ours is newer
                self._session.set(path, body)
