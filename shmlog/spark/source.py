"""Reading: ``format("shmlog")`` in batch and streaming queries.

Rules
-----
* A task reads only below its broker's high watermark, through a
  :class:`~shmlog.client.consumer.Consumer` of *its own host's* broker: the one whose data
  directory is ``SHMLOG_SPARK_BOOTSTRAP`` in the task's environment, else
  ``bootstrap`` (``locality.task_bootstrap``; the Python Data Source API cannot pin
  a task to a host). In a cluster every broker hosts every partition: a task reads
  its broker's copy - leader, follower or observer - once that copy's high
  watermark covers the range's end (a bounded wait: it may trail the driver's
  broker's, which the plan used), and records whether the read was local
  (``locality.read_locality``). A task on a host without a broker, or whose broker
  does not hold the partition, fails with an error naming its host and never reads
  anything else.
* With ``includeReadLocality`` every row carries ``readLocality``: ``local`` or
  ``remote``, how its task read it (the counts the pipeline tool prints).
* In a cluster the plan names every range's preferred hosts (the in-sync replicas',
  ``locality.partition_hosts``): the JVM bulk reader hands them to Spark.
* Records lost to retention before a task read them fail the query when
  ``failOnDataLoss`` is true (the default, as in Kafka) and are skipped otherwise.
* With ``kafka.isolation.level`` ``read_committed`` every plan ends at the last
  stable offsets (not the high watermarks: a batch read, and every micro-batch,
  stops before the oldest open transaction), and a task's consumer reads
  read_committed: aborted transactions' records are left out, as markers always
  are.
* Streaming offsets are Kafka's JSON (``{"topic": {"partition": next offset}}``);
  Spark checkpoints them, so a restarted query goes on without a gap or a duplicate.

Theory of operation
-------------------
Planning (on the driver) asks the broker for metadata and reads offsets from its
partition state table, then cuts every partition's offset range into Spark
partitions (:func:`plan`: one per log partition, more when a range is large or
``minPartitions`` asks). A task seeks to its range's start and turns each fetched
chunk into one Arrow record batch (:func:`~shmlog.spark.schema.to_arrow`).
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ..client.consumer import Consumer, TopicPartition
from ..common import limits
from ..common.errors import (
    LocalProtocolError,
    OffsetOutOfRangeError,
    ReplicaNotCoveringError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..protocol.control_client import request
from .locality import (
    TASK_BOOTSTRAP_ENVIRONMENT,
    ReadLocality,
    partition_hosts,
    read_locality,
    task_bootstrap,
)
from .options import ReadOptions
from .schema import to_arrow, with_read_locality

__all__ = ["OffsetRange", "plan", "plan_batch", "read_range", "BatchReader", "StreamReader",
           "FETCH_BYTES", "STALL_TIMEOUT_MS", "replica_hosts", "replica_locality",
           "wait_until_covered"]

# The package's public names for two limits (tools and tests read them here).
FETCH_BYTES = limits.SPARK_FETCH_BYTES
STALL_TIMEOUT_MS = limits.SPARK_STALL_TIMEOUT_MS


class OffsetRange(InputPartition):
    """One Spark partition: offsets [start, end) of one log partition, and the hosts
    holding its in-sync replicas (empty outside a cluster)."""

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 hosts: tuple[str, ...] = ()):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.hosts = tuple(hosts)


def plan(starts: dict, ends: dict, options: ReadOptions,
         hosts: dict | None = None) -> list[OffsetRange]:
    """Cut every partition's range into Spark partitions: none for an empty range,
    pieces of at most ``maxRecordsPerPartition`` records, and more pieces (in
    proportion to size) until there are ``minPartitions``; each piece names its
    partition's preferred hosts (``hosts``, by (topic, partition))."""
    hosts = hosts or {}
    ranges = [(partition, starts[partition], ends[partition]) for partition in starts
              if ends[partition] > starts[partition]]
    total = sum(end - start for _, start, end in ranges)
    planned = []
    for (topic, number), start, end in ranges:
        pieces = -(-(end - start) // options.max_records_per_partition)
        if options.min_partitions:
            pieces = max(pieces, round(options.min_partitions * (end - start) / total))
        pieces = max(1, min(pieces, end - start))
        bounds = np.linspace(start, end, pieces + 1).round().astype(np.int64)
        planned += [OffsetRange(topic, number, int(low), int(high),
                                tuple(hosts.get((topic, number), ())))
                    for low, high in zip(bounds[:-1], bounds[1:]) if high > low]
    return planned


def replica_hosts(bootstrap: str, topics) -> dict[tuple[str, int], list[str]]:
    """The preferred hosts (the in-sync replicas') of every partition of ``topics``,
    as the broker at ``bootstrap`` sees the cluster; empty outside a cluster."""
    metadata = request(bootstrap, "metadata", topics=[])
    if "brokers" not in metadata:
        return {}
    return partition_hosts(metadata, {topic: request(bootstrap, "describe_topic", name=topic)
                                      for topic in set(topics)})


def replica_locality(bootstrap: str, topic: str, partition: int,
                     timeout_ms: int = limits.SPARK_REPLICA_WAIT_MS) -> ReadLocality:
    """How a read through the broker at ``bootstrap`` counts: local for the leader or
    an in-sync follower (or outside a cluster), remote for any other copy. A broker
    that has not seen the partition yet (a topic just made) is waited for.

    Raises
    ------
    ReplicaNotCoveringError
        The broker held no copy of the partition within ``timeout_ms``.
    """
    broker_id = request(bootstrap, "metadata", topics=[]).get("broker_id")
    if broker_id is None:
        return ReadLocality.LOCAL
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            described = request(bootstrap, "describe_topic", name=topic)["partitions"]
        except UnknownTopicOrPartitionError:
            described = []
        if partition < len(described) and described[partition]["role"] != "none":
            return read_locality(broker_id, described[partition]["role"],
                                 described[partition]["isr"])
        if time.monotonic() > deadline:
            raise ReplicaNotCoveringError(
                f"Spark task on host {socket.gethostname()}: the broker at {bootstrap} "
                f"holds no copy of {topic}-{partition} after {timeout_ms} ms")
        time.sleep(limits.SPARK_REPLICA_POLL_MS / 1000)


def wait_until_covered(consumer: Consumer, partition: TopicPartition, end: int,
                       timeout_ms: int = limits.SPARK_REPLICA_WAIT_MS) -> None:
    """Return once the consumer's broker's high watermark of ``partition`` is at
    least ``end`` (it may trail the driver's broker's, which the plan used).

    Raises
    ------
    ReplicaNotCoveringError
        It did not within ``timeout_ms``; the message names the host and partition.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        high_watermark = consumer.end_offsets([partition])[partition]
        if high_watermark >= end:
            return
        if time.monotonic() > deadline:
            raise ReplicaNotCoveringError(
                f"Spark task on host {socket.gethostname()}: the copy of "
                f"{partition.topic}-{partition.partition} at {consumer.data_dir} has high "
                f"watermark {high_watermark}, below the planned end {end}, after "
                f"{timeout_ms} ms (is its broker fetching from the leader?)")
        time.sleep(limits.SPARK_REPLICA_POLL_MS / 1000)


def read_range(piece: OffsetRange, options: ReadOptions):
    """Arrow batches of one offset range, read from this host's broker's copy."""
    if not isinstance(piece, OffsetRange):
        return                          # Spark's stand-in partition for an empty plan
    bootstrap = task_bootstrap(options.bootstrap, os.environ)
    try:
        consumer = options.consumer(bootstrap, auto_offset_reset="none",
                                    fetch_max_bytes=limits.SPARK_FETCH_BYTES)
    except ShmlogError as error:
        raise ShmlogError(f"Spark task on host {socket.gethostname()}: no shmlog broker at "
                          f"{bootstrap} here ({error}). Run the executors on the "
                          f"broker hosts, each with {TASK_BOOTSTRAP_ENVIRONMENT} naming its "
                          f"host's broker.") from None
    partition = TopicPartition(piece.topic, piece.partition)
    with consumer:
        locality = replica_locality(bootstrap, piece.topic, piece.partition)
        wait_until_covered(consumer, partition, piece.end)
        for batch in _read_records(consumer, partition, piece, options):
            yield with_read_locality(batch, locality.value) \
                if options.include_read_locality else batch


def _read_records(consumer: Consumer, partition: TopicPartition, piece: OffsetRange,
                  options: ReadOptions):
    consumer.assign([partition])
    consumer.seek(partition, piece.start)
    position = piece.start
    while position < piece.end:
        if consumer.position(partition) >= piece.end:
            break                       # the rest was aborted records, markers, or compacted
        try:
            columns = consumer.poll_batch(timeout_ms=limits.SPARK_STALL_TIMEOUT_MS).get(partition)
        except OffsetOutOfRangeError:
            start = consumer.beginning_offsets([partition])[partition]
            if options.fail_on_data_loss or start <= position:
                raise ShmlogError(
                    f"{piece.topic}-{piece.partition}: offsets {position}..{start - 1} "
                    f"were deleted (retention) before they were read; set "
                    f"failOnDataLoss to false to skip them") from None
            consumer.seek(partition, start)
            position = start
            continue
        if columns is None and consumer.position(partition) >= piece.end:
            break                       # the rest of the range was compacted away
        if columns is None:
            raise ShmlogError(f"{piece.topic}-{piece.partition}: nothing at offset "
                              f"{position} within {limits.SPARK_STALL_TIMEOUT_MS} ms, below the "
                              f"planned end {piece.end}")
        columns = columns.before_offset(piece.end)
        if len(columns):
            # Past the last record, and past any compacted gap after it.
            position = max(int(columns.offsets[-1]) + 1, consumer.position(partition))
            yield to_arrow(columns, piece.topic, piece.partition, options.include_headers)
        else:
            position = piece.end


def plan_batch(options: ReadOptions) -> list[OffsetRange]:
    """The offset ranges of a batch read (from startingOffsets to endingOffsets)."""
    with options.consumer() as consumer:
        partitions = options.partitions()
        starts = options.resolve(consumer, partitions, "starting", "earliest")
        ends = options.resolve(consumer, partitions, "ending", "latest")
        latest = consumer.end_offsets(partitions)     # the LSOs in read_committed
    for partition in partitions:
        if ends[partition] > latest[partition]:
            bound = "last stable offset" if options.read_committed else "high watermark"
            raise LocalProtocolError(f"endingOffsets for {partition.topic}-"
                                     f"{partition.partition} is {ends[partition]}, past "
                                     f"its {bound} {latest[partition]}")
    return plan(starts, ends, options,
                replica_hosts(options.bootstrap, {p.topic for p in partitions}))


class BatchReader(DataSourceReader):
    """A batch read: planned from ``startingOffsets`` to ``endingOffsets`` when the
    query starts (:func:`plan_batch`), each range read by :func:`read_range`."""

    def __init__(self, options: ReadOptions):
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        return plan_batch(self.options)

    def read(self, partition: OffsetRange):
        return read_range(partition, self.options)


def _to_json(offsets: dict[TopicPartition, int]) -> dict:
    result: dict[str, dict[str, int]] = {}
    for (topic, number), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(number)] = int(offset)
    return result


def _from_json(offsets: dict) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, int(number)): int(offset)
            for topic, numbers in offsets.items() for number, offset in numbers.items()}


class StreamReader(DataSourceStreamReader):
    """A streaming read: each micro-batch reads from the offsets the last one ended
    at to the high watermarks, or the last stable offsets in read_committed (at most
    ``maxOffsetsPerTrigger`` records in all)."""

    def __init__(self, options: ReadOptions):
        self.options = options

    def _consumer(self) -> Consumer:
        return self.options.consumer()

    def initialOffset(self) -> dict:
        with self._consumer() as consumer:
            partitions = self.options.partitions()
            return _to_json(self.options.resolve(consumer, partitions, "starting", "latest"))

    def getDefaultReadLimit(self):
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        """The high watermarks (the last stable offsets in read_committed), limited
        to ``max_rows`` more records in all (shared in proportion to each partition's
        backlog, as Kafka does). Partitions that appeared since ``start`` are read
        from their beginning."""
        begun = _from_json(start)
        with self._consumer() as consumer:
            partitions = self.options.partitions()
            latest = consumer.end_offsets(partitions)
            new = [p for p in partitions if p not in begun]
            begun.update(consumer.beginning_offsets(new) if new else {})
        end = {p: max(latest[p], begun[p]) for p in partitions}
        if isinstance(limit, ReadMaxRows):
            backlog = {p: end[p] - begun[p] for p in partitions}
            total = sum(backlog.values())
            if total > limit.max_rows:
                shares = {p: backlog[p] * limit.max_rows // total for p in partitions}
                left = limit.max_rows - sum(shares.values())
                for p in sorted(partitions, key=lambda p: -backlog[p])[:left]:
                    shares[p] += 1
                end = {p: begun[p] + min(shares[p], backlog[p]) for p in partitions}
        return _to_json(end)

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        starts, ends = _from_json(start), _from_json(end)
        if set(ends) - set(starts):             # a partition new in this micro-batch
            with self._consumer() as consumer:
                starts.update(consumer.beginning_offsets(set(ends) - set(starts)))
        return plan({p: starts[p] for p in ends}, ends, self.options,
                    replica_hosts(self.options.bootstrap, {p.topic for p in ends}))

    def read(self, partition: OffsetRange):
        return read_range(partition, self.options)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log keeps records by retention, not by readers."""
