"""aiokafka, in the test's process: each call runs its own event loop
(``asyncio.run``) with the whole call under one bound (``asyncio.wait_for``).

Rules
-----
* Every client is stopped in a ``finally`` inside the bounded coroutine, so a call
  that times out still closes its sockets before :class:`TimeoutError` is raised.
* acks=0: aiokafka's send resolves to nothing: no offset (``None``), and the
  partition asked for.
* A group's members (:func:`group`) run on one thread of their own, in one event
  loop that runs for as long as they do (aiokafka heartbeats and rebalances in
  tasks of that loop).
"""

from __future__ import annotations

import asyncio
import threading
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

NAME = "aiokafka"
CAN = frozenset({"idempotence", "timestamps", "null values", "assign", "groups",
                 "positions"})
# aiokafka's own assignors (its "sticky" is the eager one shmlog does not run).
ASSIGNORS = frozenset({"range", "roundrobin"})
POLL_MS = 200
# What a stop takes at most, on top of the call's bound (closing sockets, leaving a group).
STOP_S = 10.0


def missing() -> str | None:
    try:
        import aiokafka  # noqa: F401
    except ImportError:
        return "aiokafka is not installed (setup.cfg's test extra installs it)"
    return None


def bounded(what: str, coroutine, timeout_s: float):
    async def run():
        try:
            return await asyncio.wait_for(coroutine, timeout_s + STOP_S)
        except asyncio.TimeoutError:
            raise TimeoutError(f"aiokafka: {what} still running after {timeout_s} s") from None
    return asyncio.run(run())


def produce(bootstrap: str, topic: str, records, *, acks: str = "all",
            idempotence: bool = False, timeout_s: float = 30.0) -> list[Delivery]:
    check_produce_arguments(NAME, CAN, records, acks, idempotence)
    return bounded(f"producing to {topic} at {bootstrap}",
                   produce_async(bootstrap, topic, records, acks, idempotence, timeout_s),
                   timeout_s)


async def produce_async(bootstrap, topic, records, acks, idempotence, timeout_s):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap,
                                acks=acks if acks == "all" else int(acks),
                                enable_idempotence=idempotence,
                                request_timeout_ms=int(timeout_s * 1000))
    await producer.start()
    try:
        futures = [await producer.send(topic, value=record.value, key=record.key,
                                       partition=record.partition,
                                       timestamp_ms=record.timestamp_ms,
                                       headers=list(record.headers) or None)
                   for record in records]
        deliveries = []
        for future, record in zip(futures, records, strict=True):
            try:
                sent = await future
            except KafkaError as error:
                deliveries.append(Delivery(record.partition, None, repr(error)))
                continue
            if sent is None:        # acks=0: aiokafka reports nothing
                deliveries.append(Delivery(record.partition, None, None))
                continue
            deliveries.append(Delivery(sent.partition, sent.offset if sent.offset >= 0 else None,
                                       None))
        return deliveries
    finally:
        await producer.stop()


def consume(bootstrap: str, topic: str, count: int, *, offsets: dict[int, int] | None = None,
            group_id: str | None = None, timeout_s: float = 30.0) -> list[Consumed]:
    check_consume_arguments(offsets, group_id)
    return bounded(f"consuming {topic} at {bootstrap}",
                   consume_async(bootstrap, topic, count, offsets, group_id, timeout_s),
                   timeout_s)


async def consume_async(bootstrap, topic, count, offsets, group_id, timeout_s):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    deadline = time.monotonic() + timeout_s
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                request_timeout_ms=int(timeout_s * 1000))
    await consumer.start()
    found: list[Consumed] = []
    try:
        if offsets is None:
            consumer.subscribe([topic])
        else:
            consumer.assign([TopicPartition(topic, partition) for partition in offsets])
            for partition, offset in offsets.items():
                consumer.seek(TopicPartition(topic, partition), offset)
        while len(found) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=POLL_MS)).values():
                found += [consumed(record) for record in batch]
    finally:
        await consumer.stop()
    return found


def metadata(bootstrap: str, topics=None, *, timeout_s: float = 30.0) -> ClusterMetadata:
    return bounded(f"asking {bootstrap} for metadata", metadata_async(bootstrap, topics, timeout_s),
                   timeout_s)


async def metadata_async(bootstrap, topics, timeout_s):
    from aiokafka import TopicPartition
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import KafkaError
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await client.bootstrap()
        cluster = await client.fetch_all_metadata()
        if not cluster.brokers():
            raise KafkaError("no brokers in the metadata")
    except KafkaError as error:
        raise TimeoutError(f"aiokafka had no metadata from {bootstrap} within "
                           f"{timeout_s} s: {error!r}") from None
    finally:
        await client.close()
    names = [name for name in cluster.topics() if not topics or name in topics]
    return ClusterMetadata(
        {broker.nodeId: f"{broker.host}:{broker.port}" for broker in cluster.brokers()},
        {name: {partition: cluster.leader_for_partition(TopicPartition(name, partition))
                for partition in cluster.partitions_for_topic(name)} for name in names})


def consumed(record) -> Consumed:
    return Consumed(record.partition, record.offset, record.key, record.value,
                    tuple(record.headers or ()), record.timestamp)


def group(bootstrap: str, topic: str, *, group_id: str, members: int = 3,
          assignor: str = "range", timeout_s: float = 60.0) -> Members:
    check_group_arguments(NAME, ASSIGNORS, assignor)
    running = Members(members, timeout_s)
    running.thread(lambda: asyncio.run(_group(running, bootstrap, topic, group_id, assignor)))
    return running


async def _group(running: Members, bootstrap, topic, group_id, assignor) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    strategy = {"range": RangePartitionAssignor,
                "roundrobin": RoundRobinPartitionAssignor}[assignor]
    consumers = [AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                                  client_id=f"member-{index}", enable_auto_commit=False,
                                  auto_offset_reset="earliest",
                                  partition_assignment_strategy=(strategy,))
                 for index in range(running.count)]
    try:
        for consumer in consumers:
            await consumer.start()
            consumer.subscribe([topic])
        await asyncio.gather(*(_member(running, index, consumer)
                               for index, consumer in enumerate(consumers)))
    finally:
        for consumer in consumers:
            await asyncio.wait_for(consumer.stop(), STOP_S)


async def _member(running: Members, index: int, consumer) -> None:
    from aiokafka.errors import KafkaError
    while running.running():
        try:
            read = [consumed(record)
                    for batch in (await consumer.getmany(timeout_ms=POLL_MS)).values()
                    for record in batch]
            running.add(index, read)
            if read:
                await consumer.commit()
        except KafkaError as error:
            running.error(index, error)


def reader(bootstrap: str, topic: str, *, group_id: str, timeout_s: float = 30.0):
    """A consumer of ``topic`` given its partitions (no group membership) that commits
    to ``group_id``: :class:`.Reader`'s calls, each run in the reader's own event
    loop (on a thread of its own, running for as long as the reader is open)."""
    return _Reader(bootstrap, topic, group_id, timeout_s)


class _Reader:
    def __init__(self, bootstrap, topic, group_id, timeout_s) -> None:
        from aiokafka import AIOKafkaConsumer
        self.topic, self.timeout_s = topic, timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start():
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                                        enable_auto_commit=False, auto_offset_reset="earliest",
                                        request_timeout_ms=int(timeout_s * 1000))
            await consumer.start()
            return consumer
        try:
            self.consumer = self._run(start)
        except BaseException:
            self._end_loop()
            raise

    def _run(self, function):
        """``function()`` in the loop, awaited when it gives a coroutine; its result."""
        async def call():
            result = function()
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(
            self.timeout_s + STOP_S)

    def _place(self, partition: int):
        from aiokafka import TopicPartition
        return TopicPartition(self.topic, partition)

    def assign(self, offsets: dict[int, int]) -> None:
        def assign():
            self.consumer.assign([self._place(partition) for partition in offsets])
            for partition, offset in offsets.items():
                self.consumer.seek(self._place(partition), offset)
        self._run(assign)

    def poll(self) -> list[Consumed]:
        batches = self._run(lambda: self.consumer.getmany(timeout_ms=POLL_MS))
        return [consumed(record) for batch in batches.values() for record in batch]

    def seek(self, partition: int, offset: int) -> None:
        self._run(lambda: self.consumer.seek(self._place(partition), offset))

    def offsets_for_times(self, times: dict[int, int]) -> dict[int, int | None]:
        found = self._run(lambda: self.consumer.offsets_for_times(
            {self._place(partition): stamp for partition, stamp in times.items()}))
        return {place.partition: None if answer is None else answer.offset
                for place, answer in found.items()}

    def pause(self, partitions) -> None:
        self._run(lambda: self.consumer.pause(*(self._place(p) for p in partitions)))

    def resume(self, partitions) -> None:
        self._run(lambda: self.consumer.resume(*(self._place(p) for p in partitions)))

    def commit(self, offsets: dict[int, int]) -> None:
        self._run(lambda: self.consumer.commit(
            {self._place(partition): offset for partition, offset in offsets.items()}))

    def committed(self, partitions) -> dict[int, int | None]:
        return {partition: self._run(lambda p=partition: self.consumer.committed(self._place(p)))
                for partition in partitions}

    def close(self) -> None:
        try:
            self._run(self.consumer.stop)
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_S)
        self.loop.close()
