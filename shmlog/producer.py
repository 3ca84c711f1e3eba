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
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from typing import Any, NamedTuple

import numpy as np

from . import batch_layout as B
from . import limits
from .appender import SEQUENCE_MODULUS, CompletionCode
from .broker import default_data_dir, request
from .errors import (CorruptRecordError, LocalProtocolError, OutOfOrderSequenceError,
                     RecordTooLargeError,
                     ShmlogError, StorageError, UnknownTopicOrPartitionError)
from .jit import kernel
from .records import Compression, append_record, encode_batch, encode_headers, seal_batch
from .ring import Ring
from .state import PartitionStateTable

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
    if code == CompletionCode.OUT_OF_ORDER_SEQUENCE:
        return OutOfOrderSequenceError(f"the broker expected another sequence number for "
                                       f"{where}: batches were lost or reordered")
    return CorruptRecordError(f"the broker refused a batch for {where}: code {code}",
                              status=int(code))


class _Batch:
    """One partition's batch: ``send`` encodes records into ``buffer`` as they come
    (compiled, one call per record), so shipping only seals the header."""

    __slots__ = ("topic", "partition", "row", "buffer", "position", "count",
                 "first_timestamp", "max_timestamp", "started", "entry", "result", "error",
                 "log_append_time")

    def __init__(self, topic: str, partition: int, row: int, capacity: int = 0):
        self.topic, self.partition, self.row = topic, partition, row
        self.buffer = np.empty(capacity, np.uint8) if capacity else None
        self.position = B.HEADER_LENGTH
        self.count = 0
        self.first_timestamp = self.max_timestamp = B.NO_TIMESTAMP
        self.started = time.monotonic()
        self.entry = -1
        self.log_append_time = -1             # the broker's, for LogAppendTime topics
        self.result: BatchMetadata | None = None
        self.error: ShmlogError | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class _Route(NamedTuple):
    """What ``send`` needs of a topic: its partitions' rows and the largest batch."""
    rows: list
    limit: int                 # min(max.message.bytes, segment.bytes)


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

    Raises
    ------
    ShmlogError
        No broker answers (the message names the command that starts one).
    """

    def __init__(self, bootstrap: str | None = None, *, acks: Any = 1, compression=None,
                 linger_ms: int = LINGER_MS_DEFAULT, batch_size: int = BATCH_SIZE_DEFAULT,
                 max_block_ms: int = MAX_BLOCK_MS_DEFAULT, ring_size: int = RING_SIZE_DEFAULT,
                 enable_idempotence: bool = True):
        if acks not in (0, 1, -1, "all"):
            raise LocalProtocolError(f"acks must be 0, 1 or 'all', got {acks!r}")
        self.data_dir = bootstrap or default_data_dir()
        self.acks = 0 if acks == 0 else 1
        self.compression = Compression.parse(compression)
        self.linger_ms, self.batch_size, self.max_block_ms = linger_ms, batch_size, max_block_ms
        metadata = request(self.data_dir, "metadata")
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
        self.producer_id = registration["producer_id"] if enable_idempotence else -1
        self.producer_epoch = registration["producer_epoch"] if enable_idempotence else -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._pending: dict[tuple[str, int], _Batch] = {}
        self._in_flight: dict[int, _Batch] = {}
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

    def _route(self, topic: str) -> _Route:
        route = self._routes.get(topic)
        if route is None:
            metadata = self._topic(topic)
            route = self._routes[topic] = _Route(
                [entry["row"] for entry in metadata["partitions"]],
                min(metadata["config"]["max.message.bytes"], metadata["config"]["segment.bytes"]))
        return route

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
        elif isinstance(timestamp_ms, (int, np.integer)) and timestamp_ms >= B.NO_TIMESTAMP:
            timestamp = int(timestamp_ms)
        else:
            raise LocalProtocolError(f"timestamp_ms must be an integer >= {B.NO_TIMESTAMP}, "
                                     f"got {timestamp_ms!r}")
        with self._lock:
            self._check_open()
            if type(partition) is not int or not 0 <= partition < len(route.rows):
                partition = self._choose(topic, len(route.rows),
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
                    topic, partition, route.rows[partition], capacity)
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
        LocalProtocolError, RecordTooLargeError, UnknownTopicOrPartitionError
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
            partition = self._choose(topic, len(route.rows), first_key, partition)
            count = values.shape[0] if isinstance(values, np.ndarray) else len(values)
            encoded = encode_batch(values, keys, headers, timestamp_ms=timestamp_ms,
                                   compression=self.compression,
                                   **self._identity(topic, partition))
            if encoded.size > route.limit:
                raise RecordTooLargeError(f"a batch of {encoded.size} bytes exceeds {topic}'s "
                                          f"max.message.bytes ({route.limit}); send fewer "
                                          f"records")
            batch = _Batch(topic, partition, route.rows[partition])
            batch.first_timestamp = int(
                encoded[B.FIRST_TIMESTAMP_OFFSET:B.FIRST_TIMESTAMP_OFFSET + 8].view("<i8")[0])
            self._put(batch, encoded, count)
            if sticky:
                self._sticky.pop(topic, None)        # the next unkeyed batch moves on
            return FutureBatchMetadata(self, batch, 0, batch.first_timestamp)

    def _ship(self, batch: _Batch) -> None:
        """Encode a gathered batch and put it into the ring (lock held)."""
        del self._pending[(batch.topic, batch.partition)]
        if self._sticky.get(batch.topic) == batch.partition:
            del self._sticky[batch.topic]             # the next unkeyed batch moves on
        encoded = seal_batch(batch.buffer[:batch.position], batch.count, batch.first_timestamp,
                             batch.max_timestamp, compression=self.compression,
                             **self._identity(batch.topic, batch.partition))
        batch.buffer = None
        try:
            self._put(batch, encoded, batch.count)
        except ShmlogError as error:                  # the ring stayed full: its futures fail
            batch.error = error
            raise

    def _identity(self, topic: str, partition: int) -> dict:
        """Producer id, epoch and the next batch's first sequence (lock held). The
        sequence moves on only once the batch is in the ring (``_put``): a batch
        refused before that leaves no gap the broker would take for a lost one."""
        if self.producer_id < 0:
            return {}
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "base_sequence": self._sequences.get((topic, partition), 0)}

    def _put(self, batch: _Batch, encoded: np.ndarray, count: int) -> None:
        batch.count = count
        batch.entry = self.ring.put(batch.row, encoded, timeout_ms=self.max_block_ms)
        self._table.appender_doorbell.ring()
        key = (batch.topic, batch.partition)
        self._sequences[key] = (self._sequences.get(key, 0) + count) % SEQUENCE_MODULUS
        if self.acks == 0:
            batch.result = BatchMetadata(batch.topic, batch.partition, -1, count,
                                         batch.first_timestamp)
        else:
            self._in_flight[batch.entry] = batch

    # -- completions -----------------------------------------------------------------
    def _harvest(self) -> None:
        """Resolve every in-flight batch the broker has finished (lock held)."""
        for entry in list(self._in_flight):
            outcome = self.ring.result(entry)
            if outcome is None:
                continue
            batch = self._in_flight.pop(entry)
            result, batch.log_append_time = outcome
            if result >= 0:
                batch.result = BatchMetadata(
                    batch.topic, batch.partition, result, batch.count,
                    batch.log_append_time if batch.log_append_time >= 0 else batch.first_timestamp)
            else:
                batch.error = _completion_error(-result, batch.topic, batch.partition)

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
            table = PartitionStateTable.attach(
                request(self.data_dir, "metadata", topics=[],
                        timeout_ms=RESUME_REQUEST_MS)["state_table"])
        except ShmlogError:
            return                      # no broker yet: keep waiting
        with self._lock:
            if self.producer_id >= 0:
                self.producer_id = registration["producer_id"]
            self._table, old = table, self._table     # a new broker has a new table
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
            waiting = list(self._in_flight.values())
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
            raise LocalProtocolError("the producer is closed")

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
