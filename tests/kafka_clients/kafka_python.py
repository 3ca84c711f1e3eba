"""kafka-python (the release the broker's codec pins), in the test's process.

Rules
-----
* The bound is given to kafka-python's own waits: ``max_block_ms`` and
  ``request_timeout_ms`` for a producer (``delivery_timeout_ms`` reports a record
  not acknowledged in time), each future's ``get``, the consumer's poll loop and
  its close, the admin client's bootstrap. Every client is closed before return.
* acks=0: kafka-python reports offsets it counted itself (no broker answer backs
  them); a negative one would be given as ``None``.
* A group's members (:func:`group`) each run on a thread of their own: kafka-python
  joins inside ``poll``, which may block until the rebalance ends, so members
  polled in turn from one thread would wait for each other.
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

NAME = "kafka-python"
CAN = frozenset({"idempotence", "timestamps", "null values", "assign", "groups",
                 "positions"})
ASSIGNORS = frozenset({"range", "roundrobin", "cooperative-sticky"})
POLL_MS = 200
CLOSE_S = 5.0


def missing() -> str | None:
    try:
        import kafka  # noqa: F401
    except ImportError:
        return "kafka-python is not installed (setup.cfg's install_requires has it)"
    return None


def produce(bootstrap: str, topic: str, records, *, acks: str = "all",
            idempotence: bool = False, timeout_s: float = 30.0) -> list[Delivery]:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError
    check_produce_arguments(NAME, CAN, records, acks, idempotence)
    milliseconds = int(timeout_s * 1000)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks if acks == "all" else int(acks),
                             enable_idempotence=idempotence, max_block_ms=milliseconds,
                             delivery_timeout_ms=milliseconds + 1000,
                             request_timeout_ms=milliseconds)
    deadline = time.monotonic() + timeout_s
    try:
        futures = [producer.send(topic, value=record.value, key=record.key,
                                 headers=list(record.headers) or None,
                                 partition=record.partition, timestamp_ms=record.timestamp_ms)
                   for record in records]
        producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        deliveries = []
        for future, record in zip(futures, records, strict=True):
            try:
                sent = future.get(timeout=max(0.0, deadline - time.monotonic()))
            except KafkaError as error:
                deliveries.append(Delivery(record.partition, None, repr(error)))
                continue
            deliveries.append(Delivery(sent.partition, sent.offset if sent.offset >= 0 else None,
                                       None))
        return deliveries
    finally:
        producer.close(timeout=CLOSE_S)


def consume(bootstrap: str, topic: str, count: int, *, offsets: dict[int, int] | None = None,
            group_id: str | None = None, timeout_s: float = 30.0) -> list[Consumed]:
    from kafka import KafkaConsumer, TopicPartition
    check_consume_arguments(offsets, group_id)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             request_timeout_ms=int(timeout_s * 1000))
    found: list[Consumed] = []
    try:
        if offsets is None:
            consumer.subscribe([topic])
        else:
            consumer.assign([TopicPartition(topic, partition) for partition in offsets])
            for partition, offset in offsets.items():
                consumer.seek(TopicPartition(topic, partition), offset)
        deadline = time.monotonic() + timeout_s
        while len(found) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=POLL_MS).values():
                found += [consumed(record) for record in batch]
    finally:
        consumer.close(autocommit=False, timeout_ms=int(CLOSE_S * 1000))
    return found


def metadata(bootstrap: str, topics=None, *, timeout_s: float = 30.0) -> ClusterMetadata:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap,
                                 request_timeout_ms=int(timeout_s * 1000))
    except KafkaError as error:
        raise TimeoutError(f"kafka-python had no metadata from {bootstrap} within "
                           f"{timeout_s} s: {error!r}") from None
    try:
        cluster = admin.describe_cluster()
        described = admin.describe_topics()
    finally:
        admin.close()
    return ClusterMetadata(
        {broker["broker_id"]: f"{broker['host']}:{broker['port']}"
         for broker in cluster["brokers"]},
        {topic["name"]: {p["partition_index"]: p["leader_id"] for p in topic["partitions"]}
         for topic in described
         if topic["error_code"] == 0 and (not topics or topic["name"] in topics)})


def consumed(record) -> Consumed:
    return Consumed(record.partition, record.offset, record.key, record.value,
                    tuple(record.headers or ()), record.timestamp)


def assignor_class(assignor: str):
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    return {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor}[assignor]


def group(bootstrap: str, topic: str, *, group_id: str, members: int = 3,
          assignor: str = "range", timeout_s: float = 60.0) -> Members:
    check_group_arguments(NAME, ASSIGNORS, assignor)
    running = Members(members, timeout_s)
    for index in range(members):
        running.thread(_member, running, index, bootstrap, topic, group_id, assignor)
    return running


def _member(running: Members, index: int, bootstrap, topic, group_id, assignor) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                             client_id=f"member-{index}", enable_auto_commit=False,
                             auto_offset_reset="earliest",
                             partition_assignment_strategy=[assignor_class(assignor)])
    try:
        consumer.subscribe([topic])
        while running.running():
            try:
                read = [consumed(record)
                        for batch in consumer.poll(timeout_ms=POLL_MS).values()
                        for record in batch]
                running.add(index, read)
                if read:
                    consumer.commit()
            except KafkaError as error:
                running.error(index, error)
    finally:
        consumer.close(autocommit=False, timeout_ms=int(CLOSE_S * 1000))


def reader(bootstrap: str, topic: str, *, group_id: str, timeout_s: float = 30.0):
    """A consumer of ``topic`` given its partitions (no group membership) that commits
    to ``group_id``: :class:`.Reader`'s calls."""
    return _Reader(bootstrap, topic, group_id, timeout_s)


class _Reader:
    def __init__(self, bootstrap, topic, group_id, timeout_s) -> None:
        from kafka import KafkaConsumer
        self.topic, self.timeout_ms = topic, int(timeout_s * 1000)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                                      enable_auto_commit=False, auto_offset_reset="earliest",
                                      request_timeout_ms=self.timeout_ms)

    def _place(self, partition: int):
        from kafka import TopicPartition
        return TopicPartition(self.topic, partition)

    def assign(self, offsets: dict[int, int]) -> None:
        self.consumer.assign([self._place(partition) for partition in offsets])
        for partition, offset in offsets.items():
            self.consumer.seek(self._place(partition), offset)

    def poll(self) -> list[Consumed]:
        return [consumed(record) for batch in self.consumer.poll(timeout_ms=POLL_MS).values()
                for record in batch]

    def seek(self, partition: int, offset: int) -> None:
        self.consumer.seek(self._place(partition), offset)

    def offsets_for_times(self, times: dict[int, int]) -> dict[int, int | None]:
        found = self.consumer.offsets_for_times(
            {self._place(partition): stamp for partition, stamp in times.items()},
            timeout_ms=self.timeout_ms)
        return {place.partition: None if answer is None else answer.offset
                for place, answer in found.items()}

    def pause(self, partitions) -> None:
        self.consumer.pause(*(self._place(partition) for partition in partitions))

    def resume(self, partitions) -> None:
        self.consumer.resume(*(self._place(partition) for partition in partitions))

    def commit(self, offsets: dict[int, int]) -> None:
        from kafka.structs import OffsetAndMetadata
        self.consumer.commit({self._place(partition): OffsetAndMetadata(offset, "", -1)
                              for partition, offset in offsets.items()})

    def committed(self, partitions) -> dict[int, int | None]:
        return {partition: self.consumer.committed(self._place(partition))
                for partition in partitions}

    def close(self) -> None:
        self.consumer.close(autocommit=False, timeout_ms=int(CLOSE_S * 1000))
