"""``Producer``: sends records to the local broker through a shared-memory ring.

Kafka's producer parts, each a module of this package, composed here:

* ``partitioner``: which partition a record goes to (Kafka's default: murmur2 of the
  key, else a sticky partition);
* ``producer_metadata``: the topics' partitions and where their batches go, cached
  per topic and read again when old or wrong (``ProducerMetadata``);
* ``record_accumulator``: the batches gathering records per partition, until full or
  lingered (``RecordAccumulator``);
* ``sender``: batches encoded into the ring, the broker's completions harvested, the
  futures resolved, the linger thread (``Sender``);
* ``epoch_manager``: the idempotent producer's id, epoch and sequences, and the epoch
  bump after a refusal (KIP-360, ``EpochManager``);
* ``producer_batch`` (a batch and the futures ``send`` returns) and
  ``producer_callbacks`` (the futures' callbacks and their thread).

Rules
-----
One lock (a plain ``threading.Lock``: nothing takes it twice), made here and shared
by every part, guards the gathering batches, the ring's producer side and the
bookkeeping, so ``send`` may be called from many threads; the linger and callback
threads take it too. The parts' public names are for this package: users see
``Producer``, the futures and the metadata tuples.

Theory of operation
-------------------
``send`` runs once per record, so it is a handful of CPython operations on its
common path, with no Python function of another part called and nothing compiled: it
checks the value's and key's types (``bytes`` as they are, other bytes-likes copied,
None a null), checks headers when there are any, adds up the record's size (for
max.message.bytes and ``batch_size``), reads the clock, and, under the lock, finds
the topic's route in the metadata's dict, the partition by the partitioner's rules
(inline for a sticky partition already chosen and for a short key, whose hash the
partitioner's LRU cache gives), appends the fields to the partition's gathering batch
(the accumulator's, on the route), and returns a future that is the batch and the
record's index in it. Per-record limits need no per-record
check: ``BATCH_RECORD_COUNT_MAX`` cannot be reached within ``BATCH_SIZE_MAX`` bytes.
Once per batch it calls out: the accumulator to start a batch (shipping the full one
through the sender), the sender to ship it (full, or with ``linger_ms=0`` nothing of
its partition in the ring).

``send_batch`` encodes many records in one compiled pass and hands the batch to the
sender at once. Serializers, when given, make ``send`` an instance attribute that
serializes and calls the class's ``send``: without them, nothing is added per record.

Every kernel the producer runs is loaded (from numba's disk cache, or compiled) when
a Producer is made, for the argument types a send, flush and get pass
(:func:`warm_kernels`), so no record waits for a compiler.
"""

from __future__ import annotations

import inspect
import mmap
import os
import threading
import time
import uuid
from typing import Any

import numpy as np

from ..common import limits, settings
from ..common.errors import (
    ClientClosedError,
    IllegalStateError,
    InvalidConfigError,
    LocalProtocolError,
    RecordTooLargeError,
    ShmlogError,
)
from ..common.paths import default_data_dir
from ..protocol.control_client import request
from ..record import batch_layout as B
from ..record.records import (
    Compression,
    check_headers,
    check_timestamp,
    encode_batch,
    restamp_batch,
)
from ..ring import Destination, Ring
from ..shm.ring_layout import CAPACITY_MIN, DATA_OFFSET, check_capacity
from ..shm.state import PartitionStateTable
from . import options as client_options
from .epoch_manager import EpochManager
from .partitioner import cached_positive_hash, choose_partition, murmur2
from .producer_batch import FutureBatchMetadata, FutureRecordMetadata, ProducerBatch
from .producer_metadata import ProducerMetadata, TopicRoute
from .record_accumulator import RecordAccumulator
from .sender import Sender
from .transaction_manager import TransactionManager

__all__ = ["Producer", "warm_kernels"]

# A batch never grows past BATCH_SIZE_MAX bytes and a record takes at least its
# header, so no batch can hold more records than a batch may count: send needs no
# per-record count check.
assert limits.BATCH_SIZE_MAX // B.RECORD_HEADER_LENGTH <= limits.BATCH_RECORD_COUNT_MAX

# Looked up once: send runs per record, and a global name is cheaper than an attribute.
_time_ns = time.time_ns
_new = object.__new__
_RECORD_HEADER_LENGTH = B.RECORD_HEADER_LENGTH
_CACHED_KEY_SIZE_MAX = limits.PARTITIONER_CACHE_KEY_SIZE_MAX


def warm_kernels() -> None:
    """Compile, or load from numba's disk cache, every kernel that ``send``,
    ``send_batch``, ``flush`` and a future's ``get`` run, for the argument types they
    run with (batches are encoded from read-only byte buffers into fresh arrays; the
    ring and the state table are mappings), so that no send compiles. Idempotent; a
    few ms once they are loaded."""
    murmur2(b"")
    cached_positive_hash(b"")
    identity = {"producer_id": 0, "producer_epoch": 0, "base_sequence": 0}
    for compression in Compression:
        batch = ProducerBatch(None, "warm-up", 0, Destination(0, 1, 0))
        batch.values += [b"v", None]
        batch.stamps += [0, -2 - 1_000]         # a clock reading and a given timestamp
        batch.keys[0] = b"k"
        batch.headers[1] = ((b"h", None),)
        encoded = batch.encode(compression, identity)
        restamp_batch(encoded, **identity)
    encode_batch([b"v"], **identity)
    memory = mmap.mmap(-1, DATA_OFFSET + CAPACITY_MIN)
    ring = Ring("warm-up", memory, owner=True)
    ring.result(ring.put(Destination(0, 1, 0), encoded, timeout_ms=0))
    _ = ring.consumer_error                     # a put checks it (a poisoned ring)
    ring.await_completions(0.0)                 # a get() sleeps on the completions
    ring.close()
    table = PartitionStateTable.scratch("warm-up", 1, writable=False)
    table.appender_doorbell.ring()               # no sleepers: no syscall
    table.close()


def _as_bytes(field, what: str) -> bytes:
    """A key or value given as another bytes-like object, copied (the caller may reuse
    its buffer before the batch ships)."""
    if isinstance(field, (bytes, bytearray, memoryview)):
        return memoryview(field).tobytes()
    raise LocalProtocolError(f"{what} must be bytes (or None), got {type(field).__name__}; "
                             f"encode it first")


def _ring_size(ring_size, buffer_memory) -> int:
    """``ring_size``, or kafka-python's ``buffer_memory`` (the two must agree; the ring
    is the producer's buffer), or the default."""
    if ring_size is not None and buffer_memory is not None and ring_size != buffer_memory:
        raise InvalidConfigError(f"ring_size={ring_size!r} and buffer_memory="
                                 f"{buffer_memory!r} disagree; give one of them")
    name, size = ("ring_size", ring_size) if ring_size is not None else \
        ("buffer_memory", buffer_memory if buffer_memory is not None
         else limits.RING_SIZE_DEFAULT)
    try:
        return check_capacity(size)
    except LocalProtocolError as error:
        raise InvalidConfigError(f"{name}: {error}") from None


def _compression(compression, compression_type):
    """``compression``, or kafka-python's ``compression_type`` (the two must agree)."""
    if compression_type is None:
        return compression
    if compression is not None and \
            Compression.parse(compression) is not Compression.parse(compression_type):
        raise InvalidConfigError(f"compression={compression!r} and compression_type="
                                 f"{compression_type!r} disagree; give one of them")
    return compression_type


class Producer:
    """Sends records to the broker of a data directory (kafka-python's shape).

    Parameters
    ----------
    bootstrap : str, optional
        The broker's data directory (default: ``$SHMLOG_DATA_DIR`` or the default).
    acks : 0, 1, -1 or "all"
        0: a send is done once its batch is in the ring; 1: once the broker appended
        it; "all" (-1, kept as -1 in :attr:`acks`): once the partition's in-sync
        replicas have it (its high watermark covers it: on a single broker, once
        appended, as 1). With "all", a partition under ``min.insync.replicas``
        fails sends with :class:`NotEnoughReplicasError` (nothing appended) or
        :class:`NotEnoughReplicasAfterAppendError` (appended, not committed).
    compression : None or "zstd"
    linger_ms, batch_size, max_block_ms : int
        As in Kafka: how long a batch may wait for more records, how large it may
        grow (bytes), how long ``send`` may block on a full ring.
    ring_size, buffer_memory : int
        The producer's ring in /dev/shm, its buffer of batches the broker has not
        drained yet (bytes, a power of two from 4 KiB; default
        ``limits.RING_SIZE_DEFAULT``, 2 MiB): allocated whole when the producer is
        made, so a host of many producers pays it per producer. ``buffer_memory`` is
        kafka-python's name for it (a batch larger than the ring cannot be sent: keep
        ``batch_size`` and ``max.message.bytes`` below it).
    enable_idempotence : bool
        Batches carry a broker-given producer id and per-partition sequence numbers,
        so the broker appends a batch once even if it re-reads it after a crash.
        Off with acks=0, as in Kafka (idempotence needs the broker's answers).
    bootstrap_servers : str or [str], optional
        kafka-python's name for ``bootstrap`` (the data directory, or a list of one).
    client_id : str, optional
        A name for this producer (kafka-python's; kept in :attr:`client_id`).
    key_serializer, value_serializer : callable, optional
        Applied to every key and value ``send`` is given (kafka-python's rule: see
        ``client_options.serializer``); without them ``send`` takes bytes as before,
        at no extra cost.
    transactional_id : str, optional
        Make this a transactional producer (Kafka's ``transactional.id``): call
        :meth:`init_transactions` once, then send only inside
        :meth:`begin_transaction` ... :meth:`commit_transaction` (or
        :meth:`abort_transaction`); read_committed consumers see a transaction's
        records, and the offsets it commits (:meth:`send_offsets_to_transaction`),
        all at once or never. A newer producer of the same id fences this one.
        Needs idempotence and acks other than 0.
    transaction_timeout_ms : int
        How long the broker lets a transaction stay open before it aborts it (and
        fences this producer); at most the broker's ``transaction_max_timeout_ms``.
    **kafka_options
        kafka-python's other options: those with nothing to act on here are taken
        and ignored, the ones shmlog cannot honour are refused
        (``client_options``); ``compression_type`` is ``compression``.

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range, or is no option at all.
    UnsupportedKafkaOptionError
        A Kafka option shmlog does not support (``partitioner``, TLS, ...).
    ShmlogError
        No broker answers (the message names the command that starts one).
    """

    def __init__(self, bootstrap: str | None = None, *, acks: Any = 1, compression=None,
                 linger_ms: int = limits.LINGER_MS_DEFAULT,
                 batch_size: int = limits.BATCH_SIZE_DEFAULT,
                 max_block_ms: int = limits.MAX_BLOCK_MS_DEFAULT,
                 ring_size: int | None = None, buffer_memory: int | None = None,
                 enable_idempotence: bool = True, bootstrap_servers=None,
                 client_id: str | None = None, key_serializer=None, value_serializer=None,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS_DEFAULT,
                 **kafka_options):
        # Every setting is checked before the broker is asked anything (settings.py).
        self.data_dir = settings.bootstrap(bootstrap, bootstrap_servers) or default_data_dir()
        client_options.check_kafka_options(client_options.PRODUCER, kafka_options,
                                           _PRODUCER_SETTINGS)
        compression = _compression(compression, kafka_options.get("compression_type"))
        self.client_id = settings.optional_text("client_id", client_id)
        self._key_serializer = client_options.serializer(key_serializer, "key_serializer")
        self._value_serializer = client_options.serializer(value_serializer,
                                                           "value_serializer")
        if self._key_serializer is not None or self._value_serializer is not None:
            # Only then: send itself stays the bytes-only path (no per-record check).
            self.send = self._send_serialized
        # Kafka's names: "all" is -1, which the broker is told (register_producer).
        acks = settings.choice("acks", acks, (0, 1, -1, "all"))
        self.acks = -1 if acks == "all" else acks
        self.compression = Compression.parse(compression)
        self.linger_ms = settings.integer("linger_ms", linger_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        self.batch_size = settings.integer("batch_size", batch_size, 0, limits.BATCH_SIZE_MAX)
        self.max_block_ms = settings.integer("max_block_ms", max_block_ms, 0,
                                             limits.CLIENT_WAIT_MS_MAX)
        self.ring_size = _ring_size(ring_size, buffer_memory)
        settings.flag("enable_idempotence", enable_idempotence)
        self.transactional_id = settings.optional_text("transactional_id", transactional_id)
        transaction_timeout_ms = settings.integer("transaction_timeout_ms",
                                                  transaction_timeout_ms, 1,
                                                  limits.CLIENT_WAIT_MS_MAX)
        if self.transactional_id is not None and (not enable_idempotence or self.acks == 0):
            raise InvalidConfigError(
                f"transactional_id needs idempotence and acks 1 or all (got "
                f"enable_idempotence={enable_idempotence!r}, acks={acks!r})")
        metadata = request(self.data_dir, "metadata")
        self._metadata = ProducerMetadata(self.data_dir, metadata)
        # Rung after every put: the broker may be asleep on it.
        table = PartitionStateTable.attach(metadata["state_table"])
        self.ring = Ring.create(f"{metadata['ring_prefix']}-producer-{os.getpid()}-"
                                f"{uuid.uuid4().hex[:8]}", self.ring_size,
                                group_id=metadata.get("ring_group_id"))
        self.ring.keeps_results = self.acks != 0     # acks=0 never reads a result
        try:
            registration = request(self.data_dir, "register_producer", ring=self.ring.name,
                                   acks=self.acks)
        except ShmlogError:
            self.ring.unlink()
            table.close()
            raise
        # Idempotence: batches carry the broker-given id and per-partition sequences,
        # so a batch re-read from the ring after a broker crash is appended once.
        self._epochs = EpochManager(self.data_dir, self.ring.name, registration,
                                    idempotent=enable_idempotence and self.acks != 0)
        self._transactions = None
        if self.transactional_id is not None:
            self._transactions = TransactionManager(
                self.data_dir, self.transactional_id, transaction_timeout_ms,
                self._adopt_identity)
            # Outside a transaction send refuses; inside it is the plain path, with no
            # check per record (_sync_send swaps it as the transaction's state moves).
            self._send_in_transaction = self.send
            self.send = self._send_outside_transaction
        self._lock = threading.Lock()
        self._accumulator = RecordAccumulator(self._lock, self.batch_size, self.linger_ms)
        self._sender = Sender(self._lock, self.ring, table, data_dir=self.data_dir,
                              acks=self.acks, max_block_ms=self.max_block_ms,
                              compression=self.compression, metadata=self._metadata,
                              accumulator=self._accumulator, epochs=self._epochs)
        # What send reads per record, looked up once: the parts never replace them.
        self._routes = self._metadata.routes
        self._ship_at_once = self._accumulator.ship_at_once
        self._ship = self._sender.ship
        self._pending = self._accumulator.pending     # what gathers (tests watch it)
        warm_kernels()
        self._sender.start()

    @property
    def producer_id(self) -> int:
        """The broker-given producer id (-1 without idempotence)."""
        return self._epochs.producer_id

    @property
    def producer_epoch(self) -> int:
        """The epoch batches are sent under (-1 without idempotence)."""
        return self._epochs.producer_epoch

    @producer_epoch.setter
    def producer_epoch(self, epoch: int) -> None:
        # Settable as the attribute it was (a test uses up the epochs this way).
        self._epochs.producer_epoch = epoch

    # -- metadata ----------------------------------------------------------------
    def partitions_for(self, topic: str) -> list[int]:
        return self._metadata.partitions_for(topic)

    def _route(self, topic: str) -> TopicRoute:
        """The topic's route, read from the broker's metadata when not cached (lock
        held). The only way into the routes: once closed, nothing is sent."""
        if self._sender.closed:
            raise ClientClosedError("the producer is closed; create a new one")
        route = self._metadata.cached_route(topic)
        if route is None:
            route = self._metadata.read_route(topic)
            self._accumulator.gather_for(topic, route)
        return route

    # -- sending -----------------------------------------------------------------
    def send(self, topic: str, value=None, key=None, headers=None, partition: int | None = None,
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
        ClientClosedError
        """
        # Once per record: the common cases first, nothing compiled (see the module's
        # theory of operation); the record is encoded with its batch when it ships.
        if type(value) is bytes:
            size = _RECORD_HEADER_LENGTH + len(value)
        elif value is None:
            size = _RECORD_HEADER_LENGTH
        else:
            value = _as_bytes(value, "value")
            size = _RECORD_HEADER_LENGTH + len(value)
        if key is not None:
            if type(key) is not bytes:
                key = _as_bytes(key, "key")
            size += len(key)
        if headers:
            headers, headers_size = check_headers(headers)
            size += headers_size
        # The clock reading producer_batch's stamps column holds.
        stamp = _time_ns() if timestamp_ms is None else -2 - check_timestamp(timestamp_ms)
        self._lock.acquire()
        try:
            route = self._routes.get(topic) or self._route(topic)
            if type(partition) is not int or not 0 <= partition < route.partitions:
                # The partitioner's rules; its common cases inline.
                if partition is None and key is None and route.sticky >= 0:
                    partition = route.sticky
                elif partition is None and key is not None and len(key) <= _CACHED_KEY_SIZE_MAX:
                    partition = cached_positive_hash(key) % route.partitions   # Kafka's rule
                else:
                    partition = choose_partition(route, topic, key, partition)
            batch = route.batches[partition]
            if batch is None or batch.room < size:     # a batch's room is within the limit
                batch = self._accumulator.start_batch(self._sender, route, topic, partition,
                                                      size)
            batch.room -= size
            index = len(batch.values)
            batch.values.append(value)
            batch.stamps.append(stamp)
            if key is not None:
                batch.keys[index] = key
            if headers:
                batch.headers[index] = headers
            future = _new(FutureRecordMetadata)
            future.batch = batch
            future.index = index
            if batch.room < _RECORD_HEADER_LENGTH or (self._ship_at_once and batch.behind is None):
                self._ship(batch)                 # full, or linger.ms=0 with nothing before it
            return future
        finally:
            self._lock.release()

    def _send_serialized(self, topic: str, value=None, key=None, headers=None,
                         partition: int | None = None,
                         timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """``send`` after the serializers (this producer's ``send`` when it has any)."""
        if self._key_serializer is not None:
            key = self._key_serializer(topic, key)
        if self._value_serializer is not None:
            value = self._value_serializer(topic, value)
        return Producer.send(self, topic, value, key, headers, partition, timestamp_ms)

    def _send_outside_transaction(self, *args, **kwargs) -> FutureRecordMetadata:
        """``send`` of a transactional producer outside a transaction: refused."""
        self._transactions.check_sendable()
        return self._send_in_transaction(*args, **kwargs)     # a transaction began meanwhile

    def _sync_send(self) -> None:
        """Point ``send`` at the plain path inside a transaction, at the refusal
        outside one (after every call that moves the transaction's state)."""
        self.send = self._send_in_transaction if self._transactions.sendable() \
            else self._send_outside_transaction

    # -- transactions ---------------------------------------------------------------
    def init_transactions(self) -> None:
        """Register the ``transactional_id`` with its coordinator: this producer's id
        and a new epoch, which fences every older producer of the id (a transaction
        it left open is aborted). Call once, before the first transaction.

        Raises
        ------
        IllegalStateError
            Not a transactional producer, or initialised already with a transaction
            under way.
        InvalidTransactionTimeoutError
            ``transaction_timeout_ms`` exceeds the broker's maximum.
        ConcurrentTransactionsError
            The id's previous transaction is still ending: retry.
        """
        try:
            self._transactional().init()
        finally:
            self._sync_send()

    def begin_transaction(self) -> None:
        """Start a transaction: every send from now until its commit or abort is part
        of it.

        Raises
        ------
        IllegalStateError
            Not initialised, or a transaction is under way.
        ProducerFencedError
            A newer producer of the id fenced this one: close it.
        """
        try:
            self._transactional().begin()
        finally:
            self._sync_send()

    def send_offsets_to_transaction(self, offsets, group_metadata,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's offsets inside the transaction (Kafka's
        ``sendOffsetsToTransaction``): they count, for the group's consumers, only
        once the transaction commits, together with its records.

        Parameters
        ----------
        offsets : dict
            TopicPartition (or (topic, partition)) to OffsetAndMetadata or an offset:
            the next offset to read, as a commit gives it.
        group_metadata : str or GroupMetadata
            The group id, or the consuming ``Consumer.group_metadata()``, whose member
            and generation fence a consumer that lost its partitions (KIP-447).
        timeout : float, optional
            Kept for kafka-python's signature; the request waits for the broker.
        """
        self._transactional().send_offsets(offsets, group_metadata)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush every send of the transaction, then commit it: its records and
        offsets become visible to read_committed consumers, on every partition at
        once.

        Raises
        ------
        TransactionAbortedError
            A send of the transaction failed: call :meth:`abort_transaction`.
        ProducerFencedError
            A newer producer of the id fenced this one (or the transaction timed
            out): close it.
        ClientTimeoutError
            The flush ran out of ``timeout`` seconds; commit again.
        """
        transactions = self._transactional()
        transactions.commit_ready()
        self._sync_send()                     # no send joins it from here
        try:
            try:
                self.flush(timeout)
            except ShmlogError:
                transactions.commit_unflushed()
                raise
            transactions.commit()
        finally:
            self._sync_send()

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Wait for the transaction's sends, then abort it: read_committed consumers
        never see its records or offsets.

        Raises
        ------
        ProducerFencedError
            A newer producer of the id fenced this one: close it.
        """
        transactions = self._transactional()
        transactions.abort_ready()
        self._sync_send()                     # no send joins it from here
        try:
            self.flush(timeout)
        except ShmlogError:
            transactions.abort_unflushed()    # fenced by a new epoch instead
        try:
            transactions.abort()
        finally:
            self._sync_send()

    def _transactional(self) -> TransactionManager:
        if self._transactions is None:
            raise IllegalStateError("this producer has no transactional_id: make it with "
                                    "Producer(..., transactional_id=...)")
        return self._transactions

    def _adopt_identity(self, producer_id: int, producer_epoch: int) -> None:
        with self._lock:
            self._epochs.adopt(producer_id, producer_epoch)
            self._epochs.transactions = self._transactions

    def batch_bytes_max(self, topic: str) -> int:
        """The largest batch the topic takes (its max.message.bytes, and no more than
        a segment): what one ``send_batch`` may encode to."""
        with self._lock:
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
        if self._transactions is not None:
            self._transactions.check_sendable()
        with self._lock:
            route = self._route(topic)
            sticky = partition is None and first_key is None
            partition = choose_partition(route, topic, first_key, partition)
            count = values.shape[0] if isinstance(values, np.ndarray) else len(values)
            encoded = encode_batch(values, keys, headers, timestamp_ms=timestamp_ms,
                                   compression=self.compression,
                                   **self._epochs.identity(topic, partition))
            if encoded.size > route.limit:
                raise RecordTooLargeError(f"a batch of {encoded.size} bytes exceeds {topic}'s "
                                          f"max.message.bytes ({route.limit}); send fewer "
                                          f"records")
            batch = ProducerBatch(self._sender, topic, partition, route.destinations[partition])
            batch.drop_columns()
            batch.first_timestamp = int(
                encoded[B.FIRST_TIMESTAMP_OFFSET:B.FIRST_TIMESTAMP_OFFSET + 8].view("<i8")[0])
            self._sender.put(batch, encoded, count)
            if sticky:
                route.sticky = -1                    # the next unkeyed batch moves on
            self._sender.release_retained()
            return FutureBatchMetadata(batch)

    def flush(self, timeout: float | None = None) -> None:
        """Ship every gathered batch and wait until the broker has appended all
        (with acks=0: until they are in the ring); the callbacks of their futures
        have run when it returns.

        Raises
        ------
        ClientTimeoutError
            ``timeout`` seconds passed with batches still in flight.
        """
        self._sender.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then leave the broker and remove the ring.

        Without a timeout it still returns: batches the broker will never complete
        fail (a ring the broker stopped reading, :class:`CorruptRingError`; no broker
        answering for ``limits.CLOSE_BROKER_WAIT_S``, :class:`BrokerNotAvailableError`)
        on their futures, and close goes on.

        Raises
        ------
        ClientTimeoutError
            ``timeout`` seconds passed with batches still in flight (the producer is
            closed all the same).
        """
        if self._sender.closed:
            return
        try:
            self._sender.flush(timeout, limits.CLOSE_BROKER_WAIT_S if timeout is None
                               else None)
        finally:
            self._sender.close()

    def metrics(self) -> dict:
        """This producer's metrics as kafka-python's ``metrics()`` gives them:
        ``{group: {name: value}}``. ``producer-metrics``: records and bytes put into
        the ring (``record-send-total``, ``byte-total``) and their rates per second
        over the last ``limits.METRICS_RATE_WINDOW_S`` s (``-rate``), records whose
        batch failed (``record-error-total``, ``-rate``), batches put
        (``request-total``; Kafka's requests are batches here), their average size
        and record count, entries awaiting the broker's completion
        (``requests-in-flight``), and the ring's bytes (``buffer-total-bytes``,
        ``buffer-available-bytes``); ``producer-topic-metrics.<topic>`` the same
        counts per topic. Counted once per batch, never per record."""
        return self._sender.metrics()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# Named in the error for a keyword that is neither a setting nor a Kafka option.
_PRODUCER_SETTINGS = tuple(name for name, parameter in
                           inspect.signature(Producer.__init__).parameters.items()
                           if parameter.kind is parameter.KEYWORD_ONLY or name == "bootstrap")
