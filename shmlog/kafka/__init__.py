"""kafka-python's names over shmlog's clients: a program written for kafka-python
runs with its imports changed (``from kafka import KafkaProducer`` becomes ``from
shmlog.kafka import KafkaProducer``; ``kafka.admin``, ``kafka.errors``,
``kafka.structs`` and ``kafka.serializer`` have their ``shmlog.kafka`` twins).

Rules
-----
* These are shmlog's clients, not copies: :class:`KafkaProducer`,
  :class:`KafkaConsumer` and :class:`KafkaAdminClient` subclass ``Producer``,
  ``Consumer`` and ``Admin`` and change only what kafka-python returns in another
  shape (``partitions_for`` a set, committed offsets as kafka-python's three-field
  ``OffsetAndMetadata``, groups listed as ``(group_id, protocol_type)``). Every
  setting, option check and error is the base client's.
* ``bootstrap_servers`` is the broker's data directory on this host (a
  ``host:port`` is refused with a message saying so); options with nothing to act
  on here are taken, the ones shmlog cannot honour raise
  ``UnsupportedKafkaOptionError`` (``shmlog.client.options``).
* kafka-python's error classes are shmlog's under their Kafka names
  (``shmlog.kafka.errors``), so ``except KafkaError`` catches every shmlog error.

docs/MIGRATING_FROM_KAFKA_PYTHON.md lists what maps one to one and what differs.
"""

from __future__ import annotations

from ..client.consumer import Consumer, ConsumerRebalanceListener
from ..client.producer import Producer
from ..common.errors import UnsupportedKafkaOptionError
from .admin import KafkaAdminClient
from .serializer import Deserializer, Serializer
from .structs import OffsetAndMetadata, TopicPartition, committed_offset

__all__ = ["KafkaProducer", "KafkaConsumer", "KafkaAdminClient", "TopicPartition",
           "OffsetAndMetadata", "ConsumerRebalanceListener", "Serializer", "Deserializer"]


class KafkaProducer(Producer):
    """kafka-python's ``KafkaProducer``: :class:`shmlog.Producer` with kafka-python's
    return shapes (see the module's rules)."""

    def partitions_for(self, topic: str) -> set[int]:
        """The topic's partition numbers, as a set (kafka-python's)."""
        return set(super().partitions_for(topic))


class KafkaConsumer(Consumer):
    """kafka-python's ``KafkaConsumer``: :class:`shmlog.Consumer` with kafka-python's
    return shapes (see the module's rules)."""

    def poll(self, timeout_ms: int = 0, max_records: int | None = None,
             update_offsets: bool = True) -> dict:
        """:meth:`Consumer.poll`; kafka-python's ``update_offsets=False`` (a poll
        that does not move the positions) is not supported."""
        if update_offsets is not True:
            raise UnsupportedKafkaOptionError(
                "poll(update_offsets=False) is not supported: a poll moves the positions; "
                "seek back to read records again")
        return super().poll(timeout_ms, max_records)

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """:meth:`Consumer.close` (``timeout_ms`` is taken: closing waits for nothing
        remote but the group's leave and the last commits)."""
        super().close(autocommit)

    def committed(self, partition: TopicPartition, metadata: bool = False):
        """The group's committed offset (None when there is none); with
        ``metadata``, kafka-python's :class:`OffsetAndMetadata`."""
        found = super().committed(partition, metadata=True)
        if found is None or not metadata:
            return None if found is None else found.offset
        return committed_offset(found)
