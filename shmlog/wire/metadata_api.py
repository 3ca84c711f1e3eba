"""Metadata (versions 0-12): the brokers, where each topic's partitions are led, and
topics created on first use (``auto.create.topics.enable``).

Rules
-----
* A topic's id is its shmlog topic id (32 hex digits) as a UUID: stable, non-zero,
  the same in every response and across restarts.
* Every partition's leader epoch is the one its stored batches carry (a single
  broker's: 0; a cluster's: the partition state's).
* A topic asked for that does not exist is created with the broker's
  ``num_partitions`` when the broker allows it and the request does (v4+ says so;
  earlier versions always allow), as Kafka does, and answered at once where it is
  made at once (one broker), else LEADER_NOT_AVAILABLE until it is led (a client
  asks again); otherwise UNKNOWN_TOPIC_OR_PARTITION. A name that is not a valid topic name gets
  INVALID_TOPIC_EXCEPTION.
* Versions 0-9 name topics; 10-12 name them and give their ids (a request naming
  a topic only by id is answered by name as well).

Theory of operation
-------------------
:class:`MetadataApi` asks a :class:`~shmlog.wire.local_metadata.LocalMetadata`
(one broker) or its cluster counterpart what there is: the brokers with their
advertised listener, the controller, the cluster id, and per topic its id and its
partitions' leaders, epochs, replicas and in-sync replicas.
"""

from __future__ import annotations

import logging
import uuid

from ..common.errors import ShmlogError
from ..common.topic_names import validate_topic_name
from . import codec
from .error_codes import (
    INVALID_TOPIC_EXCEPTION,
    LEADER_NOT_AVAILABLE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
    for_error,
)

__all__ = ["MetadataApi"]

log = logging.getLogger("shmlog.broker.kafka")

METADATA_KEY = 3


def _valid_name(name: str) -> bool:
    try:
        validate_topic_name(name)
    except ShmlogError:
        return False
    return True


class MetadataApi:
    """Metadata over ``metadata`` (a LocalMetadata, or a cluster's)."""

    def __init__(self, metadata) -> None:
        self.metadata = metadata

    def apis(self) -> dict:
        return {METADATA_KEY: (0, 12, self.handle)}

    def handle(self, request, header, body):
        version = header.api_version
        cls = codec.response_class(METADATA_KEY)
        everything = body.topics is None or (version == 0 and not body.topics)
        if everything:
            names = self.metadata.topic_names()
        else:
            names = [self._name_of(topic) for topic in body.topics]
        allow_create = version < 4 or body.allow_auto_topic_creation
        topics = [self._topic(cls, name, allow_create and not everything) for name in names]
        return cls(version=version, throttle_time_ms=0,
                   brokers=[cls.MetadataResponseBroker(node_id=node, host=host, port=port,
                                                       rack=rack)
                            for node, host, port, rack in
                            self.metadata.brokers(request.listener)],
                   cluster_id=self.metadata.cluster_id, controller_id=self.metadata.controller_id(),
                   topics=topics)

    def _name_of(self, topic) -> str:
        """A requested topic's name (v10+ may give only its id)."""
        name = getattr(topic, "name", None)
        if name is None:
            topic_id = getattr(topic, "topic_id", None)
            name = self.metadata.topic_name_of(topic_id.hex if topic_id is not None else "")
        return name if name is not None else ""

    def _topic(self, cls, name: str, allow_create: bool):
        described = self.metadata.topic(name) if name else None
        if described is None:
            return self._missing(cls, name, allow_create)
        topic_id, internal, partitions = described
        return cls.MetadataResponseTopic(
            error_code=NONE, name=name, topic_id=uuid.UUID(hex=topic_id), is_internal=internal,
            partitions=[cls.MetadataResponseTopic.MetadataResponsePartition(
                error_code=error, partition_index=index, leader_id=leader,
                leader_epoch=epoch, replica_nodes=replicas, isr_nodes=isr, offline_replicas=[])
                for index, error, leader, epoch, replicas, isr in partitions])

    def _missing(self, cls, name: str, allow_create: bool):
        error = UNKNOWN_TOPIC_OR_PARTITION
        if name and not _valid_name(name):
            error = INVALID_TOPIC_EXCEPTION
        elif allow_create and self.metadata.auto_create:
            try:
                self.metadata.create_topic(name)
                log.info("Kafka listener: created topic %r on first use "
                         "(auto.create.topics.enable)", name)
                if self.metadata.topic(name) is not None:      # made here and now
                    return self._topic(cls, name, False)
                error = LEADER_NOT_AVAILABLE
            except ShmlogError as refused:
                error = for_error(refused)
        return cls.MetadataResponseTopic(error_code=error, name=name, topic_id=uuid.UUID(int=0),
                                          is_internal=False, partitions=[])
