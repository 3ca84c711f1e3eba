"""librdkafka through confluent-kafka, in the test's process.

Rules
-----
* Every librdkafka wait is given the bound: ``message.timeout.ms`` (a record not
  acknowledged by then is reported failed), ``flush``/``poll`` timeouts, and the
  metadata request's timeout. Producers are flushed and consumers closed before
  returning, so librdkafka's threads end with the call.
* acks=0: librdkafka reports success without an offset, given as ``None``.
* A group's members (:func:`group`) are polled in turn on one thread (librdkafka
  joins and heartbeats on threads of its own); each commits synchronously what a
  poll gave it.
"""

from __future__ import annotations

import time

from . import (
    ClusterMetadata,
    Consumed,
    Delivery,
    check_consume_arguments,
    check_group_arguments,
    check_produce_arguments,
)
from .members import Members

NAME = "librdkafka"
CAN = frozenset({"idempotence", "timestamps", "null values", "assign", "groups",
                 "positions"})
ASSIGNORS = frozenset({"range", "roundrobin", "cooperative-sticky"})
# librdkafka's poll gives back control this often, to check the deadline.
POLL_S = 0.2


def missing() -> str | None:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "confluent-kafka is not installed (setup.cfg's test extra installs it)"
    return None


def produce(bootstrap: str, topic: str, records, *, acks: str = "all",
            idempotence: bool = False, timeout_s: float = 30.0) -> list[Delivery]:
    from confluent_kafka import Producer
    check_produce_arguments(NAME, CAN, records, acks, idempotence)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks,
                         "enable.idempotence": idempotence,
                         "message.timeout.ms": int(timeout_s * 1000)})
    reports: list[Delivery | None] = [None] * len(records)

    def reporter(index):
        def report(error, message):
            offset = message.offset()
            reports[index] = Delivery(message.partition(),
                                      offset if offset is not None and offset >= 0 else None,
                                      None if error is None else str(error))
        return report

    deadline = time.monotonic() + timeout_s
    for index, record in enumerate(records):
        options = {"key": record.key, "value": record.value, "on_delivery": reporter(index)}
        if record.headers:
            options["headers"] = list(record.headers)
        if record.partition is not None:
            options["partition"] = record.partition
        if record.timestamp_ms is not None:
            options["timestamp"] = record.timestamp_ms
        producer.produce(topic, **options)
        producer.poll(0)
    left = producer.flush(max(0.0, deadline - time.monotonic()))
    if left:
        # The bound passed with records queued: purge them (their callbacks report
        # the purge) so that nothing is sent after the call returns.
        producer.purge()
        producer.flush(POLL_S)
    return [report or Delivery(record.partition, None, "no delivery report")
            for report, record in zip(reports, records, strict=True)]


def consume(bootstrap: str, topic: str, count: int, *, offsets: dict[int, int] | None = None,
            group_id: str | None = None, timeout_s: float = 30.0) -> list[Consumed]:
    from confluent_kafka import Consumer, TopicPartition
    check_consume_arguments(offsets, group_id)
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         # librdkafka wants a group id even to assign; it commits nothing.
                         "group.id": group_id or "kafka-clients-assigned",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    found: list[Consumed] = []
    try:
        if offsets is None:
            consumer.subscribe([topic])
        else:
            consumer.assign([TopicPartition(topic, partition, offset)
                             for partition, offset in offsets.items()])
        deadline = time.monotonic() + timeout_s
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(POLL_S)
            if message is None or message.error() is not None:
                continue
            found.append(consumed(message))
    finally:
        consumer.close()
    return found


def metadata(bootstrap: str, topics=None, *, timeout_s: float = 30.0) -> ClusterMetadata:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        listing = admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise TimeoutError(f"librdkafka had no metadata from {bootstrap} within "
                           f"{timeout_s} s: {error}") from None
    return ClusterMetadata(
        {broker.id: f"{broker.host}:{broker.port}" for broker in listing.brokers.values()},
        {name: {p.id: p.leader for p in topic.partitions.values()}
         for name, topic in listing.topics.items()
         if topic.error is None and (not topics or name in topics)})


def consumed(message) -> Consumed:
    return Consumed(message.partition(), message.offset(), message.key(), message.value(),
                    tuple(message.headers() or ()), message.timestamp()[1])


def group(bootstrap: str, topic: str, *, group_id: str, members: int = 3,
          assignor: str = "range", timeout_s: float = 60.0) -> Members:
    check_group_arguments(NAME, ASSIGNORS, assignor)
    return _Group(bootstrap, topic, group_id, members, assignor, timeout_s)


class _Group(Members):
    def __init__(self, bootstrap, topic, group_id, members, assignor, timeout_s) -> None:
        from confluent_kafka import Consumer
        super().__init__(members, timeout_s)
        self.consumers = []
        for index in range(members):
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                                 "client.id": f"member-{index}",
                                 "partition.assignment.strategy": assignor,
                                 "enable.auto.commit": False, "auto.offset.reset": "earliest"})
            self.consumers.append(consumer)
            consumer.subscribe([topic])
        self.thread(self._poll)

    def _poll(self) -> None:
        from confluent_kafka import KafkaException
        try:
            while self.running():
                for index, consumer in enumerate(self.consumers):
                    message = consumer.poll(POLL_S / len(self.consumers))
                    if message is None:
                        continue
                    if message.error() is not None:
                        self.error(index, message.error())
                        continue
                    self.add(index, [consumed(message)])
                    try:
                        consumer.commit(message=message, asynchronous=False)
                    except KafkaException as error:
                        self.error(index, error)
        finally:
            for consumer in self.consumers:
                consumer.close()


def reader(bootstrap: str, topic: str, *, group_id: str, timeout_s: float = 30.0):
    """A consumer of ``topic`` given its partitions (no group membership) that commits
    to ``group_id``: :class:`.Reader`'s calls."""
    return _Reader(bootstrap, topic, group_id, timeout_s)


class _Reader:
    def __init__(self, bootstrap, topic, group_id, timeout_s) -> None:
        from confluent_kafka import Consumer
        self.topic, self.timeout_s = topic, timeout_s
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})

    def _partitions(self, offsets: dict):
        from confluent_kafka import TopicPartition
        return [TopicPartition(self.topic, partition, offset)
                for partition, offset in offsets.items()]

    def assign(self, offsets: dict[int, int]) -> None:
        self.consumer.assign(self._partitions(offsets))

    def poll(self) -> list[Consumed]:
        return [consumed(message) for message in self.consumer.consume(100, POLL_S)
                if message.error() is None]

    def seek(self, partition: int, offset: int) -> None:
        [place] = self._partitions({partition: offset})
        self.consumer.seek(place)

    def offsets_for_times(self, times: dict[int, int]) -> dict[int, int | None]:
        found = self.consumer.offsets_for_times(self._partitions(times), self.timeout_s)
        return {place.partition: place.offset if place.offset >= 0 else None for place in found}

    def pause(self, partitions) -> None:
        self.consumer.pause(self._partitions({partition: -1001 for partition in partitions}))

    def resume(self, partitions) -> None:
        self.consumer.resume(self._partitions({partition: -1001 for partition in partitions}))

    def commit(self, offsets: dict[int, int]) -> None:
        self.consumer.commit(offsets=self._partitions(offsets), asynchronous=False)

    def committed(self, partitions) -> dict[int, int | None]:
        found = self.consumer.committed(
            self._partitions({partition: -1001 for partition in partitions}), self.timeout_s)
        return {place.partition: place.offset if place.offset >= 0 else None for place in found}

    def close(self) -> None:
        self.consumer.close()
