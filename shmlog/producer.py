"""``Producer``: sends records to the local broker through a shared-memory ring.

Theory of operation
-------------------
Records are gathered per partition into batches (Kafka's record accumulator):
``send`` encodes each record straight into its partition's batch buffer, in
compiled code. A batch ships - its header and CRC are sealed and it is put into
this producer's ring, and the broker's doorbell is rung - when it reaches
``batch_size`` bytes, when its oldest record has waited ``linger_ms`` (a
background thread watches), or on :meth:`Producer.flush` / :meth:`Producer.close`.
The broker's appender completes each ring entry with the batch's base offset (or
an error code), which the producer reads from the ring's completion slots: no
round trip, no syscall. A future's ``get()`` harvests them.

Keyed records go to ``murmur2(key) % partitions``, Kafka's default, so a key lands
on the same partition number as with Kafka; unkeyed records stick to one partition
until its batch ships, then move on (Kafka's sticky partitioner).

Routes: every batch is put into the ring addressed to its partition's row in the
broker's state table and to the partition's identity (topic key and number), both
from the broker's metadata, cached per topic. The broker appends a batch only to
the partition its identity names; a batch for a topic that was deleted (or deleted
and created again: a new topic id) comes back ``UNKNOWN_PARTITION``, which fails
its futures with :class:`UnknownTopicOrPartitionError` and drops the topic's cached
metadata, so the next send reads it again (as does ``RECORD_TOO_LARGE``: the
topic's max.message.bytes was lowered; and, as in Kafka, metadata older than
``METADATA_MAX_AGE_S``). Internal topics (``__consumer_offsets``)
are the broker's own: sending to one is refused here, as Kafka's broker does.

Idempotence and refusals (KIP-360): batches carry the producer id, the producer's
epoch and the partition's next sequence. A batch the broker refuses (too large,
storage error, corrupt) uses up no sequence there, so every batch of that partition
already in flight behind it comes back out of order, never appended. The refused
batch fails with the broker's error; the batches it kept out wait, with their
bytes, until nothing of that partition is in flight, then the producer bumps its
epoch (a new producer id once the epochs are used up), starts the partition again
at sequence 0 and sends them again, in order. Other partitions move to the new
epoch, from sequence 0, the next time they have nothing in flight. The broker
takes a higher epoch only at sequence 0 and fences a lower one, so nothing is
appended twice.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
import uuid
from typing import Any, NamedTuple

import numpy as np

from . import batch_layout as B
from . import limits, settings
from .appender import SEQUENCE_MODULUS, CompletionCode
from .control_client import request
from .paths import default_data_dir
from .errors import (ClientClosedError, CorruptRecordError, InvalidProducerEpochError,
                     InvalidTopicError, LocalProtocolError,
                     OutOfOrderSequenceError, RecordTooLargeError,
                     ShmlogError, StorageError, UnknownTopicOrPartitionError)
from .groups import INTERNAL_TOPICS
from .jit import kernel
from .records import (Compression, append_record, check_timestamp, encode_batch,
                      encode_headers, restamp_batch, seal_batch)
from .ring import Destination, Ring
from .ring_layout import check_capacity
from .state import PartitionStateTable, topic_key

__all__ = ["Producer", "RecordMetadata", "BatchMetadata", "FutureRecordMetadata", "murmur2"]

# Kafka's defaults: batch.size 16 KiB, linger.ms 5 (since Kafka 4.0), max.block.ms 60 s.
BATCH_SIZE_DEFAULT = 16384
LINGER_MS_DEFAULT = 5
MAX_BLOCK_MS_DEFAULT = 60_000
# The ring holds batches until the appender drains them: 16 MiB is ~100 ms of
# producing at memory speed, so a busy appender never stalls a producer.
RING_SIZE_DEFAULT = 16 << 20
# How long a future's get() sleeps between looks at the completion slots.
RESULT_POLL_S = 50e-6
# After this long without an acknowledgement, ask the broker to take the ring again
# (it may have restarted); a request waits at most RESUME_REQUEST_MS for an answer.
RESUME_AFTER_S = 0.5
RESUME_REQUEST_MS = 200
# Kafka's metadata.max.age.ms default: a topic's cached metadata (its rows, its
# max.message.bytes) is read again at the first batch after this long.
METADATA_MAX_AGE_S = 300.0


@kernel
def _murmur2(data):
    mask = 0xFFFFFFFF
    multiplier = 0x5BD1E995
    length = len(data)
    hash_value = (0x9747B28C ^ length) & mask
    tail = length - length % 4
    for index in range(0, tail, 4):
        word = (np.int64(data[index]) | (np.int64(data[index + 1]) << 8)
                | (np.int64(data[index + 2]) << 16) | (np.int64(data[index + 3]) << 24))
        word = (word * multiplier) & mask
        word ^= word >> 24
        word = (word * multiplier) & mask
        hash_value = ((hash_value * multiplier) & mask) ^ word
    extra = length % 4
    if extra >= 3:
        hash_value ^= np.int64(data[tail + 2]) << 16
    if extra >= 2:
        hash_value ^= np.int64(data[tail + 1]) << 8
    if extra >= 1:
        hash_value ^= np.int64(data[tail])
        hash_value = (hash_value * multiplier) & mask
    hash_value ^= hash_value >> 13
    hash_value = (hash_value * multiplier) & mask
    hash_value ^= hash_value >> 15
    return hash_value


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit result), so keys map to the same
    partitions as in Kafka."""
    hash_value = int(_murmur2(data if type(data) is bytes else memoryview(data).tobytes()))
    return hash_value - (1 << 32) if hash_value & 0x80000000 else hash_value


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int                # -1 with acks=0
    timestamp: int


class BatchMetadata(NamedTuple):
    topic: str
    partition: int
    base_offset: int           # -1 with acks=0
    record_count: int
    timestamp: int


def _completion_error(code: int, topic: str, partition: int) -> ShmlogError:
    where = f"{topic}-{partition}"
    if code == CompletionCode.UNKNOWN_PARTITION:
        return UnknownTopicOrPartitionError(f"{where} is not hosted by the broker any more")
    if code == CompletionCode.RECORD_TOO_LARGE:
        return RecordTooLargeError(f"the broker refused a batch for {where}: too large")
    if code == CompletionCode.STORAGE_ERROR:
        return StorageError(f"the broker could not write {where} (see its log)")
    if code == CompletionCode.INTERNAL_TOPIC:
        return InvalidTopicError(f"cannot append to internal topic {topic!r}")
    if code == CompletionCode.INVALID_PRODUCER_EPOCH:
        return InvalidProducerEpochError(f"the broker fenced a batch for {where}: it has "
                                         f"appended a later epoch of this producer id")
    if code == CompletionCode.OUT_OF_ORDER_SEQUENCE:
        return OutOfOrderSequenceError(f"the broker expected another sequence number for "
                                       f"{where}: batches were lost or reordered")
    return CorruptRecordError(f"the broker refused a batch for {where}: code {code}",
                              status=int(code))


class _Batch:
    """One partition's batch: ``send`` encodes records into ``buffer`` as they come
    (compiled, one call per record), so shipping only seals the header."""

    __slots__ = ("topic", "partition", "destination", "buffer", "position", "count",
                 "first_timestamp", "max_timestamp", "started", "entry", "result", "error",
                 "log_append_time", "encoded")

    def __init__(self, topic: str, partition: int, destination: Destination,
                 capacity: int = 0):
        self.topic, self.partition, self.destination = topic, partition, destination
        self.buffer = np.empty(capacity, np.uint8) if capacity else None
        self.position = B.HEADER_LENGTH
        self.count = 0
        self.first_timestamp = self.max_timestamp = B.NO_TIMESTAMP
        self.started = time.monotonic()
        self.entry = -1
        self.log_append_time = -1             # the broker's, for LogAppendTime topics
        self.encoded: np.ndarray | None = None  # while in flight, to send it again
        self.result: BatchMetadata | None = None
        self.error: ShmlogError | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class _Route(NamedTuple):
    """What ``send`` needs of a topic: where each partition's batches go (by
    partition number) and the largest batch."""
    destinations: list
    limit: int                 # min(max.message.bytes, segment.bytes)
    read_at: float             # time.monotonic() when the metadata was read


def _field(field, what: str) -> tuple[bytes, int]:
    """A key or value as (bytes, length), length -1 for None."""
    if type(field) is bytes:
        return field, len(field)
    if field is None:
        return b"", B.NULL_LENGTH
    if isinstance(field, (bytearray, memoryview)):
        data = memoryview(field).tobytes()
        return data, len(data)
    raise LocalProtocolError(f"{what} must be bytes (or None), got {type(field).__name__}; "
                             f"encode it first")


class FutureRecordMetadata:
    """What ``send`` returns: ``get()`` gives the record's :class:`RecordMetadata`
    once the broker has appended it, or raises the error it reported."""

    __slots__ = ("_producer", "_batch", "_index", "_timestamp")

    def __init__(self, producer: "Producer", batch: _Batch, index: int, timestamp: int):
        self._producer, self._batch, self._index = producer, batch, index
        self._timestamp = timestamp            # the record's own (CreateTime)

    def done(self) -> bool:
        return self._producer._settle(self._batch, wait_s=0)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (forever when None).

        Raises
        ------
        ShmlogError
            The timeout passed (the batch is still in flight), or the broker refused it.
        """
        if not self._producer._settle(self._batch, wait_s=timeout):
            raise ShmlogError(f"no acknowledgement for {self._batch.topic}-"
                              f"{self._batch.partition} within {timeout} s")
        if self._batch.error is not None:
            raise self._batch.error
        result = self._batch.result
        offset = result.base_offset + self._index if result.base_offset >= 0 else -1
        timestamp = self._batch.log_append_time
        return RecordMetadata(result.topic, result.partition, offset,
                              timestamp if timestamp >= 0 else self._timestamp)


class FutureBatchMetadata(FutureRecordMetadata):
    """What ``send_batch`` returns: ``get()`` gives the :class:`BatchMetadata`."""

    __slots__ = ()

    def get(self, timeout: float | None = None) -> BatchMetadata:
        super().get(timeout)
        return self._batch.result


class Producer:
    """Sends records to the broker of a data directory (kafka-python's shape).

    Parameters
    ----------
    bootstrap : str, optional
        The broker's data directory (default: ``$SHMLOG_DATA_DIR`` or the default).
    acks : 0, 1 or "all"
        0: a send is done once its batch is in the ring; 1 and "all" (the same on a
        single broker): once the broker appended it.
    compression : None or "zstd"
    linger_ms, batch_size, max_block_ms : int
        As in Kafka: how long a batch may wait for more records, how large it may
        grow (bytes), how long ``send`` may block on a full ring.
    enable_idempotence : bool
        Batches carry a broker-given producer id and per-partition sequence numbers,
        so the broker appends a batch once even if it re-reads it after a crash.
        Off with acks=0, as in Kafka (idempotence needs the broker's answers).

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range.
    ShmlogError
        No broker answers (the message names the command that starts one).
    """

    def __init__(self, bootstrap: str | None = None, *, acks: Any = 1, compression=None,
                 linger_ms: int = LINGER_MS_DEFAULT, batch_size: int = BATCH_SIZE_DEFAULT,
                 max_block_ms: int = MAX_BLOCK_MS_DEFAULT, ring_size: int = RING_SIZE_DEFAULT,
                 enable_idempotence: bool = True):
        # Every setting is checked before the broker is asked anything (settings.py).
        self.data_dir = settings.data_directory(bootstrap) or default_data_dir()
        self.acks = 0 if settings.choice("acks", acks, (0, 1, -1, "all")) == 0 else 1
        self.compression = Compression.parse(compression)
        self.linger_ms = settings.integer("linger_ms", linger_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        self.batch_size = settings.integer("batch_size", batch_size, 0, limits.BATCH_SIZE_MAX)
        self.max_block_ms = settings.integer("max_block_ms", max_block_ms, 0,
                                             limits.CLIENT_WAIT_MS_MAX)
        check_capacity(ring_size)
        settings.flag("enable_idempotence", enable_idempotence)
        metadata = request(self.data_dir, "metadata")
        self._broker_epoch = metadata["broker_epoch"]
        self._topics = {topic["name"]: topic for topic in metadata["topics"]}
        self._routes: dict[str, _Route] = {}
        # Rung after every put: the broker may be asleep on it.
        self._table = PartitionStateTable.attach(metadata["state_table"])
        self.ring = Ring.create(f"{metadata['ring_prefix']}-producer-{os.getpid()}-"
                                f"{uuid.uuid4().hex[:8]}", ring_size,
                                group_id=metadata.get("ring_group_id"))
        try:
            registration = request(self.data_dir, "register_producer", ring=self.ring.name)
        except ShmlogError:
            self.ring.unlink()
            self._table.close()
            raise
        # Idempotence: batches carry the broker-given id and per-partition sequences,
        # so a batch re-read from the ring after a broker crash is appended once.
        idempotent = enable_idempotence and self.acks != 0
        self.producer_id = registration["producer_id"] if idempotent else -1
        self.producer_epoch = registration["producer_epoch"] if idempotent else -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._epochs: dict[tuple[str, int], int] = {}     # the epoch the sequences run under
        self._pending: dict[tuple[str, int], _Batch] = {}
        # By entry number, oldest first (entries complete in order).
        self._in_flight: collections.OrderedDict[int, _Batch] = collections.OrderedDict()
        self._in_flight_counts: dict[tuple[str, int], int] = {}   # idempotent batches
        self._retained_bytes = 0          # the bytes of in-flight idempotent batches
        # Partitions whose sequence a refused batch broke: the batches it kept out,
        # to send again under a new epoch once nothing of the partition is in flight.
        self._resend: dict[tuple[str, int], list[_Batch]] = {}
        self._sticky: dict[str, int] = {}
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._linger = threading.Thread(target=self._linger_loop, name="shmlog-linger",
                                        daemon=True)
        self._linger.start()

    # -- metadata ----------------------------------------------------------------
    def _topic(self, topic: str) -> dict:
        if topic not in self._topics:
            reply = request(self.data_dir, "metadata")
            self._topics = {entry["name"]: entry for entry in reply["topics"]}
            self._routes = {}
        if topic not in self._topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}; create it first "
                                               f"(shmlog topics create {topic})")
        return self._topics[topic]

    def _expire_route(self, topic: str) -> None:
        """Drop the topic's cached metadata once it is older than METADATA_MAX_AGE_S,
        so the next send reads it again."""
        route = self._routes.get(topic)
        if route is not None and time.monotonic() - route.read_at > METADATA_MAX_AGE_S:
            del self._routes[topic]
            self._topics.pop(topic, None)

    def _route(self, topic: str) -> _Route:
        self._expire_route(topic)
        route = self._routes.get(topic)
        if route is None:
            if topic in INTERNAL_TOPICS:
                raise InvalidTopicError(f"cannot append to internal topic {topic!r}: only the "
                                        f"broker writes it (commit offsets through a Consumer)")
            metadata = self._topic(topic)
            key = topic_key(metadata["topic_id"])
            route = self._routes[topic] = _Route(
                [Destination(entry["row"], key, entry["partition"])
                 for entry in metadata["partitions"]],
                min(metadata["config"]["max.message.bytes"], metadata["config"]["segment.bytes"]),
                time.monotonic())
        return route

    def _forget_topic(self, topic: str) -> None:
        """The broker hosts the topic no more (lock held): drop what we knew of it,
        so the next send reads its metadata again, and fail the batches still
        gathering for it; a topic created again under the name starts afresh."""
        self._topics.pop(topic, None)
        self._routes.pop(topic, None)
        self._sticky.pop(topic, None)
        for known in (self._sequences, self._epochs):
            for key in [key for key in known if key[0] == topic]:
                del known[key]
        failed = [batch for key in [key for key in self._resend if key[0] == topic]
                  for batch in self._resend.pop(key)]
        for key, batch in [item for item in self._pending.items() if item[0][0] == topic]:
            del self._pending[key]
            failed.append(batch)
        for batch in failed:
            batch.buffer = batch.encoded = None
            batch.error = _completion_error(CompletionCode.UNKNOWN_PARTITION, batch.topic,
                                            batch.partition)

    def partitions_for(self, topic: str) -> list[int]:
        return [entry["partition"] for entry in self._topic(topic)["partitions"]]

    def _choose(self, topic: str, partitions: int, key, partition) -> int:
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or \
                    not 0 <= partition < partitions:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has partitions 0..{partitions - 1}, not {partition!r}")
            return partition
        if key is not None:
            return partition_for_key(key, partitions)
        partition = self._sticky.get(topic)
        if partition is None or partition >= partitions:
            partition = self._sticky[topic] = random.randrange(partitions)
        return partition

    # -- sending -----------------------------------------------------------------
    def send(self, topic: str, value, key=None, headers=None, partition: int | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; its future resolves once the broker appended it.

        Raises
        ------
        LocalProtocolError
            ``value``/``key`` are not bytes-like (or None), headers malformed.
        RecordTooLargeError
            The record alone exceeds the topic's max.message.bytes.
        UnknownTopicOrPartitionError
        InvalidTopicError
            ``topic`` is internal (``__consumer_offsets``).
        """
        # The common cases first: this runs once per record.
        route = self._routes.get(topic) or self._route(topic)
        if type(value) is bytes:
            value_length = len(value)
        else:
            value, value_length = _field(value, "value")
        if key is None:
            key, key_length = b"", B.NULL_LENGTH
        else:
            key, key_length = _field(key, "key")
        header_count, header_bytes = encode_headers(headers) if headers else (0, b"")
        size = B.RECORD_HEADER_LENGTH + len(value) + len(key) + len(header_bytes)
        if size + B.HEADER_LENGTH > route.limit:
            raise RecordTooLargeError(f"a record of {size} bytes exceeds {topic}'s "
                                      f"max.message.bytes ({route.limit})")
        if timestamp_ms is None:
            timestamp = time.time_ns() // 1_000_000
        else:
            timestamp = check_timestamp(timestamp_ms)
        with self._lock:
            self._check_open()
            if type(partition) is not int or not 0 <= partition < len(route.destinations):
                partition = self._choose(topic, len(route.destinations),
                                         key if key_length >= 0 else None, partition)
            batch = self._pending.get((topic, partition))
            if batch is not None and (batch.position + size > len(batch.buffer)
                                      or batch.count == limits.BATCH_RECORD_COUNT_MAX):
                self._ship(batch)
                batch = None
            if batch is None:
                # A batch never grows past what the topic accepts, whatever batch_size
                # says; a record larger than batch_size gets a batch of its own.
                capacity = max(min(self.batch_size, route.limit), B.HEADER_LENGTH + size)
                batch = self._pending[(topic, partition)] = _Batch(
                    topic, partition, route.destinations[partition], capacity)
                if self.linger_ms and len(self._pending) == 1:
                    self._wake.notify()                # the linger thread waits for one
                batch.first_timestamp = batch.max_timestamp = timestamp
            elif timestamp > batch.max_timestamp:
                batch.max_timestamp = timestamp
            batch.position = append_record(batch.buffer, batch.position, batch.count,
                                           timestamp - batch.first_timestamp, key, key_length,
                                           value, value_length, header_count, header_bytes)
            future = FutureRecordMetadata(self, batch, batch.count, timestamp)
            batch.count += 1
            if self.linger_ms == 0 or batch.position + B.RECORD_HEADER_LENGTH > len(batch.buffer):
                self._ship(batch)        # linger.ms=0: send as soon as possible, as Kafka
            return future

    def batch_bytes_max(self, topic: str) -> int:
        """The largest batch the topic takes (its max.message.bytes, and no more than
        a segment): what one ``send_batch`` may encode to."""
        return self._route(topic).limit

    def send_batch(self, topic: str, values, keys=None, partition: int | None = None,
                   timestamp_ms: int | None = None, headers=None) -> FutureBatchMetadata:
        """Send many records as one batch, encoded in one compiled pass: a list of
        bytes, or a numpy array of fixed-width records (one per row); ``headers``, a
        list of (str, bytes | None) lists, one per record. Without ``partition``, the
        first key chooses it, or the sticky partitioner, which moves on afterwards.

        Raises
        ------
        LocalProtocolError, RecordTooLargeError, UnknownTopicOrPartitionError, InvalidTopicError
        """
        first_key = None
        if isinstance(keys, np.ndarray) and len(keys):
            first_key = keys[0].tobytes()
        elif keys is not None and len(keys) and keys[0] is not None:
            first_key = bytes(keys[0])
        with self._lock:
            self._check_open()
            route = self._route(topic)
            sticky = partition is None and first_key is None
            partition = self._choose(topic, len(route.destinations), first_key, partition)
            count = values.shape[0] if isinstance(values, np.ndarray) else len(values)
            encoded = encode_batch(values, keys, headers, timestamp_ms=timestamp_ms,
                                   compression=self.compression,
                                   **self._identity(topic, partition))
            if encoded.size > route.limit:
                raise RecordTooLargeError(f"a batch of {encoded.size} bytes exceeds {topic}'s "
                                          f"max.message.bytes ({route.limit}); send fewer "
                                          f"records")
            batch = _Batch(topic, partition, route.destinations[partition])
            batch.first_timestamp = int(
                encoded[B.FIRST_TIMESTAMP_OFFSET:B.FIRST_TIMESTAMP_OFFSET + 8].view("<i8")[0])
            self._put(batch, encoded, count)
            if sticky:
                self._sticky.pop(topic, None)        # the next unkeyed batch moves on
            if self._retained_bytes > self.ring.capacity:
                self._harvest()                      # results unread keep batches' bytes
            return FutureBatchMetadata(self, batch, 0, batch.first_timestamp)

    def _ship(self, batch: _Batch) -> None:
        """Encode a gathered batch and put it into the ring (lock held)."""
        del self._pending[(batch.topic, batch.partition)]
        if self._sticky.get(batch.topic) == batch.partition:
            del self._sticky[batch.topic]             # the next unkeyed batch moves on
        self._expire_route(batch.topic)               # once per batch, not per send
        encoded = seal_batch(batch.buffer[:batch.position], batch.count, batch.first_timestamp,
                             batch.max_timestamp, compression=self.compression,
                             **self._identity(batch.topic, batch.partition))
        batch.buffer = None
        try:
            self._put(batch, encoded, batch.count)
        except ShmlogError as error:                  # the ring stayed full: its futures fail
            batch.error = error
            raise
        if self._retained_bytes > self.ring.capacity:
            self._harvest()                           # results unread keep batches' bytes

    def _identity(self, topic: str, partition: int) -> dict:
        """Producer id, epoch and the next batch's first sequence (lock held). The
        sequence moves on only once the batch is in the ring (``_put``): a batch
        refused before that leaves no gap the broker would take for a lost one."""
        if self.producer_id < 0:
            return {}
        key = (topic, partition)
        epoch = self._epochs.setdefault(key, self.producer_epoch)
        if epoch != self.producer_epoch and not self._in_flight_counts.get(key):
            # The epoch was bumped (for another partition): this one follows once
            # nothing of it is in flight, from sequence 0 as the broker requires.
            epoch = self._epochs[key] = self.producer_epoch
            self._sequences[key] = 0
        return {"producer_id": self.producer_id, "producer_epoch": epoch,
                "base_sequence": self._sequences.get(key, 0)}

    def _put(self, batch: _Batch, encoded: np.ndarray, count: int) -> None:
        batch.count = count
        batch.entry = self.ring.put(batch.destination, encoded, timeout_ms=self.max_block_ms)
        self._table.appender_doorbell.ring()
        key = (batch.topic, batch.partition)
        self._sequences[key] = (self._sequences.get(key, 0) + count) % SEQUENCE_MODULUS
        if self.acks == 0:
            batch.result = BatchMetadata(batch.topic, batch.partition, -1, count,
                                         batch.first_timestamp)
            return
        self._in_flight[batch.entry] = batch
        if self.producer_id >= 0:
            # Kept until the batch's result: a refused batch before it sends it back.
            batch.encoded = encoded
            self._in_flight_counts[key] = self._in_flight_counts.get(key, 0) + 1
            self._retained_bytes += encoded.size

    # -- completions -----------------------------------------------------------------
    def _harvest(self) -> None:
        """Resolve every in-flight batch the broker has finished (lock held)."""
        while self._in_flight:
            entry = next(iter(self._in_flight))
            outcome = self.ring.result(entry)
            if outcome is None:
                break                   # entries complete in order: no later one either
            batch = self._in_flight.pop(entry)
            result, batch.log_append_time = outcome
            if batch.encoded is not None:
                self._in_flight_counts[(batch.topic, batch.partition)] -= 1
                self._retained_bytes -= batch.encoded.size
            if result >= 0:
                batch.encoded = None
                batch.result = BatchMetadata(
                    batch.topic, batch.partition, result, batch.count,
                    batch.log_append_time if batch.log_append_time >= 0 else batch.first_timestamp)
            else:
                self._refused(batch, -result)
        if self._resend:
            self._recover()

    def _refused(self, batch: _Batch, code: int) -> None:
        """A batch the broker did not append (lock held)."""
        key = (batch.topic, batch.partition)
        if code == CompletionCode.OUT_OF_ORDER_SEQUENCE and key in self._resend:
            self._resend[key].append(batch)      # kept out by a refused batch before it
            return
        batch.encoded = None
        batch.error = _completion_error(code, batch.topic, batch.partition)
        if code == CompletionCode.UNKNOWN_PARTITION:
            route = self._routes.get(batch.topic)
            # Only a route to the topic that is gone: one read since then is good.
            if route is None or route.destinations[0].topic_key == batch.destination.topic_key:
                self._forget_topic(batch.topic)
            return
        if code == CompletionCode.RECORD_TOO_LARGE:
            # max.message.bytes was lowered: later batches are sized to the new one.
            self._topics.pop(batch.topic, None)
            self._routes.pop(batch.topic, None)
        if self.producer_id >= 0:
            # The broker took none of its sequences: every batch of the partition in
            # flight behind it comes back out of order (see _recover).
            self._resend.setdefault(key, [])

    def _recover(self) -> None:
        """Start each partition whose sequence a refused batch broke, once nothing of
        it is in flight, again under a new epoch from sequence 0, and send the
        batches the refusal kept out again, in order (lock held)."""
        for key in [key for key in self._resend if not self._in_flight_counts.get(key)]:
            if self._epochs.get(key, self.producer_epoch) == self.producer_epoch \
                    and not self._bump_epoch():
                return                  # no broker to give a new id: at the next harvest
            queued = self._resend.pop(key)
            self._epochs[key] = self.producer_epoch
            self._sequences[key] = 0
            for index, batch in enumerate(queued):
                restamp_batch(batch.encoded, **self._identity(*key))
                try:
                    self._put(batch, batch.encoded, batch.count)
                except ShmlogError as error:         # the ring stayed full past max.block.ms
                    for unsent in queued[index:]:
                        unsent.encoded, unsent.error = None, error
                    break

    def _bump_epoch(self) -> bool:
        """The next epoch, or a new producer id once this one's are used up (Kafka's
        InitProducerId), under which every partition starts again (lock held).
        False when no broker answered."""
        if self.producer_epoch < B.PRODUCER_EPOCH_MAX:
            self.producer_epoch += 1
            return True
        try:
            reply = request(self.data_dir, "init_producer_id", ring=self.ring.name)
        except ShmlogError:
            return False
        self.producer_id, self.producer_epoch = reply["producer_id"], reply["producer_epoch"]
        self._epochs = dict.fromkeys(self._epochs, self.producer_epoch)
        self._sequences = {}
        return True

    def _settle(self, batch: _Batch, wait_s: float | None) -> bool:
        """Ship the batch if still gathering, then wait for its completion. While
        none comes, the broker is asked now and then to take the ring again: a broker
        restarted after a crash learns of this producer that way, and drains what
        the ring still holds (its sequences keep that from appending anything twice)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._lock:
            if batch.entry < 0 and self._pending.get((batch.topic, batch.partition)) is batch:
                self._ship(batch)
        next_resume = time.monotonic() + RESUME_AFTER_S
        while True:
            with self._lock:
                if not batch.done:
                    self._harvest()
                if batch.done:
                    return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if now >= next_resume:
                self._resume()
                next_resume = now + RESUME_AFTER_S
            time.sleep(RESULT_POLL_S)

    def _resume(self) -> None:
        """Register the ring again (a no-op with the broker that has it)."""
        try:
            registration = request(self.data_dir, "register_producer", ring=self.ring.name,
                                   timeout_ms=RESUME_REQUEST_MS)
            metadata = request(self.data_dir, "metadata", topics=[],
                               timeout_ms=RESUME_REQUEST_MS)
            table = PartitionStateTable.attach(metadata["state_table"])
        except ShmlogError:
            return                      # no broker yet: keep waiting
        with self._lock:
            if self.producer_id >= 0:
                self.producer_id = registration["producer_id"]
            self._table, old = table, self._table     # a new broker has a new table
            if metadata["broker_epoch"] != self._broker_epoch:
                # A new broker may have handed out other rows: batches addressed to
                # the old ones still land right (by identity), but slowly.
                self._broker_epoch = metadata["broker_epoch"]
                self._topics, self._routes = {}, {}
        old.close()

    def flush(self, timeout: float | None = None) -> None:
        """Ship every gathered batch and wait until the broker has appended all
        (with acks=0: until they are in the ring).

        Raises
        ------
        ShmlogError
            ``timeout`` seconds passed with batches still in flight.
        """
        with self._lock:
            for batch in list(self._pending.values()):
                self._ship(batch)
            # Batches waiting to be sent again go back in flight before they are done.
            waiting = list(self._in_flight.values()) + [
                batch for queued in self._resend.values() for batch in queued]
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._settle(batch, left):
                raise ShmlogError(f"flush: batches still in flight after {timeout} s")

    def _linger_loop(self) -> None:
        """Ship batches whose oldest record has waited linger_ms."""
        with self._lock:
            while not self._closed:
                if not self._pending:
                    self._wake.wait()
                    continue
                oldest = min(batch.started for batch in self._pending.values())
                wait = oldest + self.linger_ms / 1000 - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                for batch in list(self._pending.values()):
                    if time.monotonic() - batch.started >= self.linger_ms / 1000:
                        try:
                            self._ship(batch)
                        except ShmlogError as error:      # a full ring past max.block.ms
                            batch.error = error

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the producer is closed; create a new one")

    def close(self, timeout: float | None = None) -> None:
        """Flush, then leave the broker and remove the ring."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._wake.notify_all()
            self._linger.join(timeout=5)
            try:
                request(self.data_dir, "unregister_producer", ring=self.ring.name)
            except ShmlogError:
                pass                    # the broker is gone; it reclaims nothing then
            self.ring.unlink()
            self.ring.close()
            self._table.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
