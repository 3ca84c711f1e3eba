"""The producer's metadata (Kafka's ``ProducerMetadata``): which partitions a topic
has, where their batches go, and how large a batch may be; read from the broker,
cached per topic, read again when old or wrong.

Rules
-----
* Every method runs under the producer's lock (``partitions_for`` and ``topic`` also
  without it: they only read and replace whole dicts).
* ``routes`` is one dict for the producer's life, emptied in place, never replaced:
  ``Producer.send`` holds it and looks a topic up there once per record.
* A route is the only way to a topic's partitions. Without one, ``read_route`` reads
  the broker's metadata; it refuses internal topics (``__consumer_offsets``), which
  only the broker writes, as Kafka's broker does.

Theory of operation
-------------------
Every batch is put into the ring addressed to its partition's row in the broker's
state table and to the partition's identity (topic key and number): a
:class:`~shmlog.ring.Destination`, one per partition, on the topic's
:class:`TopicRoute`. The broker appends a batch only to the partition its identity
names, so a batch for a topic deleted (or deleted and created again: a new topic id)
comes back ``UNKNOWN_PARTITION``, and the sender calls :meth:`ProducerMetadata.forget`:
the next send reads the topic again. So it does after ``RECORD_TOO_LARGE`` (the
topic's max.message.bytes was lowered), after a broker restart (another broker
epoch: it may have handed out other rows) and, as in Kafka, once a route is older
than ``limits.METADATA_MAX_AGE_S`` (looked at once per batch shipped, never per record).
"""

from __future__ import annotations

import time

from ..common import limits
from ..common.errors import InvalidTopicError, UnknownTopicOrPartitionError
from ..common.internal_topics import INTERNAL_TOPICS
from ..protocol.control_client import request
from ..record import batch_layout as B
from ..ring import Destination
from ..shm.state import topic_key

__all__ = ["ProducerMetadata", "TopicRoute"]


class TopicRoute:
    """What ``send`` needs of a topic: where each partition's batches go (by
    partition number), the largest batch and record, the batches gathering for it
    (a list by partition, None where none is, shared by every route to the topic:
    the record accumulator's, set by ``RecordAccumulator.gather_for``) and the
    sticky partition (-1: choose one; see ``partitioner``)."""

    __slots__ = ("destinations", "partitions", "limit", "record_size_max", "read_at",
                 "batches", "sticky")

    def __init__(self, destinations: list[Destination], limit: int):
        self.destinations = destinations
        self.partitions = len(destinations)
        self.limit = limit                     # min(max.message.bytes, segment.bytes)
        self.record_size_max = limit - B.HEADER_LENGTH
        self.read_at = time.monotonic()        # when the metadata was read
        self.batches: list | None = None
        self.sticky = -1


class ProducerMetadata:
    """The broker's topics as this producer last read them, and a route per topic
    sent to.

    Parameters
    ----------
    data_dir : str
        The broker's data directory (its control socket).
    reply : dict
        The broker's answer to ``metadata``: its epoch and its topics.
    """

    def __init__(self, data_dir: str, reply: dict):
        self.data_dir = data_dir
        self.broker_epoch = reply["broker_epoch"]
        self.topics = {topic["name"]: topic for topic in reply["topics"]}
        self.routes: dict[str, TopicRoute] = {}

    def topic(self, topic: str) -> dict:
        """The topic's metadata, read from the broker when not known.

        Raises
        ------
        UnknownTopicOrPartitionError
            The broker has no such topic.
        """
        if topic not in self.topics:
            reply = request(self.data_dir, "metadata")
            self.topics = {entry["name"]: entry for entry in reply["topics"]}
            self.routes.clear()
        if topic not in self.topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}; create it first "
                                               f"(shmlog topics create {topic})")
        return self.topics[topic]

    def partitions_for(self, topic: str) -> list[int]:
        return [entry["partition"] for entry in self.topic(topic)["partitions"]]

    def expire(self, topic: str) -> None:
        """Drop the topic's cached metadata once it is older than limits.METADATA_MAX_AGE_S,
        so the next send reads it again."""
        route = self.routes.get(topic)
        if route is not None and time.monotonic() - route.read_at > limits.METADATA_MAX_AGE_S:
            del self.routes[topic]
            self.topics.pop(topic, None)

    def cached_route(self, topic: str) -> TopicRoute | None:
        """The topic's route unless there is none or it is too old."""
        self.expire(topic)
        return self.routes.get(topic)

    def read_route(self, topic: str) -> TopicRoute:
        """A new route to the topic, from its metadata, cached (its ``batches`` are
        still to be given).

        Raises
        ------
        InvalidTopicError
            The topic is internal.
        UnknownTopicOrPartitionError
        """
        if topic in INTERNAL_TOPICS:
            raise InvalidTopicError(f"cannot append to internal topic {topic!r}: only the "
                                    f"broker writes it (commit offsets through a Consumer)")
        metadata = self.topic(topic)
        key = topic_key(metadata["topic_id"])
        destinations = [Destination(entry["row"], key, entry["partition"])
                        for entry in metadata["partitions"]]
        limit = min(metadata["config"]["max.message.bytes"],
                    metadata["config"]["segment.bytes"])
        route = self.routes[topic] = TopicRoute(destinations, limit)
        return route

    def forget(self, topic: str) -> None:
        """Drop what is known of the topic: the next send reads it again."""
        self.topics.pop(topic, None)
        self.routes.pop(topic, None)

    def broker_seen(self, broker_epoch: int) -> None:
        """A broker answered with its epoch: a new broker may have handed out other
        rows, so everything is read again (batches addressed to the old rows still
        land right, by identity, but slowly)."""
        if broker_epoch != self.broker_epoch:
            self.broker_epoch = broker_epoch
            self.topics = {}
            self.routes.clear()
