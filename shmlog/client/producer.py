"""``Producer``: sends records to the local broker through a shared-memory ring.

Theory of operation
-------------------
Records are gathered per partition into batches (Kafka's record accumulator).
``send`` runs once per record, so it is a handful of CPython operations and no
compiled call: it checks the value's and key's types (``bytes`` as they are,
other bytes-likes copied, None a null), checks headers when there are any, adds
up the record's size (for max.message.bytes and ``batch_size``), reads the clock,
and, under the producer's lock, appends the fields to the partition's gathering
batch (a list of values and one of clock readings; keys and headers by record
index, only for the records that have them) and returns a future that is the
batch and the record's index in it. Per-record limits need no per-record check:
``BATCH_RECORD_COUNT_MAX`` cannot be reached within ``BATCH_SIZE_MAX`` bytes.

A batch ships - it is encoded in one compiled call from its columns (the values
joined, their lengths taken in C), gets its header and CRC, is put into this
producer's ring, and the broker's doorbell is rung - when the next record would
take it past ``batch_size`` bytes, when its oldest record has waited ``linger_ms``
(a background thread watches the gathering batches, oldest first), on
:meth:`Producer.flush` / :meth:`Producer.close`, or when a future of it is asked
for its result. With ``linger_ms=0`` a record ships at once when nothing of its
partition is waiting in the ring for the broker; records sent meanwhile gather
and ship together the moment the batch before them is appended (the linger thread
watches its completion), as Kafka's sender does with whatever accumulated while
its previous request was out: an idle producer adds no delay, a busy one does not
pay a batch's fixed cost (~30 us here) per record.

The broker's appender completes each ring entry with the batch's base offset (or
an error code), which the producer reads from the ring's completion slots: no
round trip, no syscall. A future's ``get()`` harvests them.

One lock (a plain ``threading.Lock``: nothing takes it twice) guards the gathering
batches, the ring's producer side and the bookkeeping below, so ``send`` may be
called from many threads; the linger thread takes it too.

Callbacks (kafka-python's Future shape: ``add_callback``, ``add_errback``) cost
``send`` nothing: they hang on the batch, which joins a list the producer's
callback thread watches, started with the first callback. While any wait, the
thread harvests the completions every ``PRODUCER_CALLBACK_POLL_MS`` and runs the
callbacks of completed batches outside the lock (a callback may send); ``flush``
and ``close`` run those due too, so when ``flush`` returns its batches' callbacks
have run. A callback added to a future already done runs at once on the caller's
thread. Serializers, when given, make ``send`` an instance attribute that
serializes and calls the class's ``send``: without them, nothing is added per
record.

Every kernel this module runs is loaded (from numba's disk cache, or compiled) when
a Producer is made, for the argument types a send, flush and get pass
(:func:`warm_kernels`), so no record waits for a compiler.

Keyed records go to ``murmur2(key) % partitions``, Kafka's default, so a key lands
on the same partition number as with Kafka (recent short keys' hashes are kept, in
a cache bounded by ``limits.PARTITIONER_CACHE_KEYS_MAX``); unkeyed records stick
to one partition until its batch ships, then move on (Kafka's sticky partitioner).

Routes: every batch is put into the ring addressed to its partition's row in the
broker's state table and to the partition's identity (topic key and number), both
from the broker's metadata, cached per topic. The broker appends a batch only to
the partition its identity names; a batch for a topic that was deleted (or deleted
and created again: a new topic id) comes back ``UNKNOWN_PARTITION``, which fails
its futures with :class:`UnknownTopicOrPartitionError`, fails the batches still
gathering for the topic, and drops the topic's cached metadata, so the next send
reads it again (as does ``RECORD_TOO_LARGE``: the topic's max.message.bytes was
lowered; and, as in Kafka, metadata older than ``METADATA_MAX_AGE_S``). Internal
topics (``__consumer_offsets``) are the broker's own: sending to one is refused
here, as Kafka's broker does.

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
appended twice. The same path serves acks=all's refusals (``NOT_ENOUGH_REPLICAS``,
``NOT_LEADER_OR_FOLLOWER``; ``REQUEST_TIMED_OUT``, whose batch may or may not be in
the log, is safe too: the new epoch starts at 0 either way), except one:
``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` fails its batch's futures, but the batch is
in the log and its sequence used, so nothing is sent again and the epoch stays.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import mmap
import os
import random
import threading
import time
import uuid
from typing import Any, NamedTuple

import numpy as np

from ..common import limits, settings
from ..common.errors import (
    ClientClosedError,
    ClientTimeoutError,
    InvalidConfigError,
    InvalidTopicError,
    LocalProtocolError,
    RecordTooLargeError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.metrics import FlowCounts
from ..common.paths import default_data_dir
from ..native.jit import kernel
from ..protocol.control_client import request
from ..record import batch_layout as B
from ..record.records import (
    Compression,
    check_headers,
    check_timestamp,
    encode_batch,
    encode_gathered,
    restamp_batch,
)
from ..ring import Destination, Ring
from ..shm import state_layout as S
from ..shm.completion import SEQUENCE_MODULUS, CompletionCode, completion_error
from ..shm.ring_layout import CAPACITY_MIN, DATA_OFFSET, check_capacity
from ..shm.state import PartitionStateTable, topic_key
from . import options as client_options

log = logging.getLogger(__name__)

__all__ = ["Producer", "RecordMetadata", "BatchMetadata", "FutureRecordMetadata",
           "FutureBatchMetadata", "murmur2", "warm_kernels"]

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

# A batch never grows past BATCH_SIZE_MAX bytes and a record takes at least its
# header, so no batch can hold more records than a batch may count: send needs no
# per-record count check.
assert limits.BATCH_SIZE_MAX // B.RECORD_HEADER_LENGTH <= limits.BATCH_RECORD_COUNT_MAX

# Looked up once: send runs per record, and a global name is cheaper than an attribute.
_time_ns = time.time_ns
_new = object.__new__
_RECORD_HEADER_LENGTH = B.RECORD_HEADER_LENGTH
_CACHED_KEY_SIZE_MAX = limits.PARTITIONER_CACHE_KEY_SIZE_MAX


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


@functools.lru_cache(maxsize=limits.PARTITIONER_CACHE_KEYS_MAX)
def _cached_positive_hash(key: bytes) -> int:
    return int(_murmur2(key)) & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default: ``toPositive(murmur2(key)) % partitions``. A short key's hash
    is cached (a compiled call costs more than the hash); a long one's is computed."""
    if type(key) is bytes and len(key) <= _CACHED_KEY_SIZE_MAX:
        return _cached_positive_hash(key) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@kernel
def _stamps_to_ms(stamps):
    """In place, each send's clock reading as its timestamp in milliseconds: a
    ``time.time_ns()`` (>= 0), or ``-2 - timestamp_ms`` (<= -1) for a timestamp the
    caller gave (``[-1, TIMESTAMP_MS_MAX]`` maps onto the negative int64s). Dividing
    here, once per batch, saves a Python division per send."""
    for index in range(stamps.size):
        stamp = stamps[index]
        stamps[index] = stamp // 1_000_000 if stamp >= 0 else -2 - stamp


def warm_kernels() -> None:
    """Compile, or load from numba's disk cache, every kernel that ``send``,
    ``send_batch``, ``flush`` and a future's ``get`` run, for the argument types they
    run with (batches are encoded from read-only byte buffers into fresh arrays; the
    ring and the state table are mappings), so that no send compiles. Idempotent; a
    few ms once they are loaded."""
    stamps = np.array([0, -2 - 1_000], np.int64)
    _stamps_to_ms(stamps)
    murmur2(b"")
    _cached_positive_hash(b"")
    identity = {"producer_id": 0, "producer_epoch": 0, "base_sequence": 0}
    for compression in Compression:
        encoded = encode_gathered([b"v", None], {0: b"k"}, {1: ((b"h", None),)}, stamps,
                                  compression=compression, **identity)
        restamp_batch(encoded, **identity)
    encode_batch([b"v"], **identity)
    memory = mmap.mmap(-1, DATA_OFFSET + CAPACITY_MIN)
    ring = Ring("warm-up", memory, owner=True)
    ring.result(ring.put(Destination(0, 1, 0), encoded, timeout_ms=0))
    ring.close()
    table = PartitionStateTable("warm-up", mmap.mmap(-1, S.ROWS_OFFSET + S.ROW_SIZE),
                                owner=False)
    table.appender_doorbell.ring()               # no sleepers: no syscall
    table.close()


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


class _Batch:
    """One partition's batch. While it gathers, ``send`` appends each record's fields
    to its columns; shipping encodes them in one call and keeps the records'
    timestamps (milliseconds) in ``timestamps`` for their futures."""

    __slots__ = ("producer", "topic", "partition", "destination", "values", "keys",
                 "headers", "stamps", "room", "started", "count", "timestamps",
                 "first_timestamp", "entry", "encoded", "log_append_time", "result", "error",
                 "behind", "callbacks")

    def __init__(self, producer: "Producer", topic: str, partition: int,
                 destination: Destination, room: int = 0):
        self.producer = producer
        self.topic, self.partition, self.destination = topic, partition, destination
        self.values: list | None = []          # bytes or None, one per record
        self.keys: dict | None = {}            # record index -> key, for keyed records
        self.headers: dict | None = {}         # record index -> checked headers
        self.stamps: list | None = []          # one clock reading per record (_stamps_to_ms)
        self.room = room                       # bytes the records may still take
        self.started = time.monotonic()
        self.count = 0
        self.timestamps: np.ndarray | None = None
        self.first_timestamp = B.NO_TIMESTAMP
        self.entry = -1
        self.encoded: np.ndarray | None = None  # while in flight, to send it again
        self.log_append_time = -1             # the broker's, for LogAppendTime topics
        self.result: BatchMetadata | None = None
        self.error: ShmlogError | None = None
        # With linger.ms=0: the partition's batch still in the ring when this one
        # started, which this one waits for (None: it ships at once).
        self.behind: _Batch | None = None
        # (future, function, is_errback) added to its futures while not done; None
        # when there are none (the producer's callback thread watches the batch).
        self.callbacks: list | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def drop_columns(self) -> None:
        self.values = self.keys = self.headers = self.stamps = None


class _Route:
    """What ``send`` needs of a topic: where each partition's batches go (by
    partition number), the largest batch and record, the batches gathering for it
    (a list by partition, None where none is, shared by every route to the topic) and
    the sticky partition (-1: choose one)."""

    __slots__ = ("destinations", "partitions", "limit", "record_size_max", "read_at",
                 "batches", "sticky")

    def __init__(self, destinations: list, limit: int, batches: list):
        self.destinations = destinations
        self.partitions = len(destinations)
        self.limit = limit                     # min(max.message.bytes, segment.bytes)
        self.record_size_max = limit - B.HEADER_LENGTH
        self.read_at = time.monotonic()        # when the metadata was read
        self.batches = batches
        self.sticky = -1


def _as_bytes(field, what: str) -> bytes:
    """A key or value given as another bytes-like object, copied (the caller may reuse
    its buffer before the batch ships)."""
    if isinstance(field, (bytes, bytearray, memoryview)):
        return memoryview(field).tobytes()
    raise LocalProtocolError(f"{what} must be bytes (or None), got {type(field).__name__}; "
                             f"encode it first")


class FutureRecordMetadata:
    """What ``send`` returns: ``get()`` gives the record's :class:`RecordMetadata`
    once the broker has appended it, or raises the error it reported. It is only its
    batch and its index there (``send`` makes one per record).

    kafka-python's Future shape as well: ``add_callback(fn, *args, **kwargs)``
    (``fn(*args, metadata, **kwargs)`` once appended), ``add_errback`` (with the
    error), ``add_both``, ``is_done``, ``value``, ``exception``, ``succeeded()`` and
    ``failed()``. Each callback runs once: on the producer's callback thread when
    the batch completes (or in ``flush``/``close``, whichever comes first), or at
    once on the caller's thread when added to a future already done. A callback
    that raises is logged, not propagated (kafka-python's rule). Status checks
    read the completions the broker has published; they never ship a batch.
    """

    __slots__ = ("_batch", "_index")

    def done(self) -> bool:
        """Whether the result is known (a gathering batch is shipped, as ``get`` does)."""
        batch = self._batch
        return batch.done or batch.producer._settle(batch, wait_s=0)

    def _wait(self, timeout: float | None) -> _Batch:
        batch = self._batch
        if batch.result is None:
            if not batch.producer._settle(batch, wait_s=timeout):
                raise ClientTimeoutError(f"no acknowledgement for {batch.topic}-"
                                         f"{batch.partition} within {timeout} s")
            if batch.error is not None:
                raise batch.error
        return batch

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (forever when None).

        Raises
        ------
        ClientTimeoutError
            The timeout passed (the batch is still in flight).
        ShmlogError
            The broker refused the batch (its typed error).
        """
        return self._value(self._wait(timeout))

    def _value(self, batch: _Batch) -> RecordMetadata:
        """The record's metadata, from its appended batch."""
        result = batch.result
        offset = result.base_offset + self._index if result.base_offset >= 0 else -1
        timestamp = batch.log_append_time
        if timestamp < 0:
            timestamp = int(batch.timestamps[self._index])    # the record's own (CreateTime)
        return RecordMetadata(result.topic, result.partition, offset, timestamp)

    # -- kafka-python's Future -------------------------------------------------------
    def _known(self) -> _Batch:
        batch = self._batch
        if not batch.done:
            batch.producer._look_for_completions()
        return batch

    @property
    def is_done(self) -> bool:
        return self._known().done

    @property
    def value(self):
        """The metadata once appended, else None."""
        batch = self._known()
        return self._value(batch) if batch.result is not None else None

    @property
    def exception(self) -> ShmlogError | None:
        """The error the batch failed with, else None."""
        return self._known().error

    def succeeded(self) -> bool:
        return self._known().result is not None

    def failed(self) -> bool:
        return self._known().error is not None

    def add_callback(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """Call ``function(*args, metadata, **kwargs)`` once the record is appended."""
        self._batch.producer._add_callback(self, _bound(function, args, kwargs), False)
        return self

    def add_errback(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """Call ``function(*args, error, **kwargs)`` if the record's batch fails."""
        self._batch.producer._add_callback(self, _bound(function, args, kwargs), True)
        return self

    def add_both(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """``function`` as both callback and errback."""
        return self.add_callback(function, *args, **kwargs).add_errback(
            function, *args, **kwargs)


def _bound(function, args: tuple, kwargs: dict):
    if not callable(function):
        raise LocalProtocolError(f"a callback must be callable, got {function!r:.100}")
    return functools.partial(function, *args, **kwargs) if args or kwargs else function


def _run_callback(future: FutureRecordMetadata, function, errback: bool) -> None:
    """Call one callback of a completed future; what it raises is logged."""
    batch = future._batch
    try:
        if batch.error is not None:
            if errback:
                function(batch.error)
        elif not errback:
            function(future._value(batch))
    except Exception:
        log.exception("a producer %s for %s-%d raised", "errback" if errback else "callback",
                      batch.topic, batch.partition)


class FutureBatchMetadata(FutureRecordMetadata):
    """What ``send_batch`` returns: ``get()`` gives the :class:`BatchMetadata`
    (and callbacks get it too)."""

    __slots__ = ()

    def __init__(self, batch: _Batch):
        self._batch, self._index = batch, 0

    def _value(self, batch: _Batch) -> BatchMetadata:
        return batch.result


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
    **kafka_options
        kafka-python's other options: those with nothing to act on here are taken
        and ignored, the ones shmlog cannot honour are refused
        (``client_options``); ``compression_type`` is ``compression``.

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range, or is no option at all.
    UnsupportedKafkaOptionError
        A Kafka option shmlog does not support (``transactional_id``, TLS, ...).
    ShmlogError
        No broker answers (the message names the command that starts one).
    """

    def __init__(self, bootstrap: str | None = None, *, acks: Any = 1, compression=None,
                 linger_ms: int = LINGER_MS_DEFAULT, batch_size: int = BATCH_SIZE_DEFAULT,
                 max_block_ms: int = MAX_BLOCK_MS_DEFAULT, ring_size: int = RING_SIZE_DEFAULT,
                 enable_idempotence: bool = True, bootstrap_servers=None,
                 client_id: str | None = None, key_serializer=None, value_serializer=None,
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
        self.ring.keeps_results = self.acks != 0     # acks=0 never reads a result
        try:
            registration = request(self.data_dir, "register_producer", ring=self.ring.name,
                                   acks=self.acks)
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
        # Gathering batches: by topic, a list by partition (what send looks up), and
        # all of them oldest first (what the linger thread and flush walk).
        self._gathering: dict[str, list[_Batch | None]] = {}
        self._pending: dict[_Batch, None] = {}
        # By entry number, oldest first (entries complete in order).
        self._in_flight: collections.OrderedDict[int, _Batch] = collections.OrderedDict()
        self._in_flight_counts: dict[tuple[str, int], int] = {}   # idempotent batches
        self._retained_bytes = 0          # the bytes of in-flight idempotent batches
        # Partitions whose sequence a refused batch broke: the batches it kept out,
        # to send again under a new epoch once nothing of the partition is in flight.
        self._resend: dict[tuple[str, int], list[_Batch]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._linger_idle = False         # the linger thread waits for a first batch
        # linger.ms=0: a batch ships at once unless its partition's last one, by
        # (topic, partition), is still in the ring (acks=0: never is).
        self._ship_at_once = self.linger_ms == 0
        self._last_shipped: dict[tuple[str, int], _Batch] = {}
        # Futures' callbacks: the batches whose callbacks wait (in the order they were
        # added), the thread that runs them (started with the first), and a lock held
        # while callbacks run, so flush returns after those under way have run.
        self._watched: list[_Batch] = []
        self._callbacks_waiting = threading.Condition(self._lock)
        self._callback_thread: threading.Thread | None = None
        self._callbacks_running = threading.RLock()
        self._flow = FlowCounts()         # metrics(): counted per batch put, never per record
        warm_kernels()
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
        """The topic's route, read from the broker's metadata when not cached (lock
        held). The only way into ``_routes``: once closed, nothing is sent."""
        if self._closed:
            raise ClientClosedError("the producer is closed; create a new one")
        self._expire_route(topic)
        route = self._routes.get(topic)
        if route is None:
            if topic in INTERNAL_TOPICS:
                raise InvalidTopicError(f"cannot append to internal topic {topic!r}: only the "
                                        f"broker writes it (commit offsets through a Consumer)")
            metadata = self._topic(topic)
            key = topic_key(metadata["topic_id"])
            destinations = [Destination(entry["row"], key, entry["partition"])
                            for entry in metadata["partitions"]]
            batches = self._gathering.setdefault(topic, [])
            batches += [None] * (len(destinations) - len(batches))
            limit = min(metadata["config"]["max.message.bytes"],
                        metadata["config"]["segment.bytes"])
            for batch in batches:
                if batch is not None:   # started under an older, maybe larger, limit
                    batch.room = min(batch.room, limit - B.HEADER_LENGTH)
            route = self._routes[topic] = _Route(destinations, limit, batches)
        return route

    def _forget_topic(self, topic: str) -> None:
        """The broker hosts the topic no more (lock held): drop what we knew of it,
        so the next send reads its metadata again, and fail the batches still
        gathering for it; a topic created again under the name starts afresh."""
        self._topics.pop(topic, None)
        self._routes.pop(topic, None)
        for known in (self._sequences, self._epochs, self._last_shipped):
            for key in [key for key in known if key[0] == topic]:
                del known[key]
        failed = [batch for key in [key for key in self._resend if key[0] == topic]
                  for batch in self._resend.pop(key)]
        for batch in self._gathering.pop(topic, []):
            if batch is not None:
                del self._pending[batch]
                failed.append(batch)
        for batch in failed:
            batch.drop_columns()
            batch.encoded = None
            batch.error = completion_error(CompletionCode.UNKNOWN_PARTITION, batch.topic,
                                            batch.partition)

    def partitions_for(self, topic: str) -> list[int]:
        return [entry["partition"] for entry in self._topic(topic)["partitions"]]

    def _choose(self, route: _Route, topic: str, key, partition) -> int:
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or \
                    not 0 <= partition < route.partitions:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has partitions 0..{route.partitions - 1}, "
                    f"not {partition!r}")
            return int(partition)
        if key is not None:
            return partition_for_key(key, route.partitions)
        if route.sticky < 0:
            route.sticky = random.randrange(route.partitions)
        return route.sticky

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
        # theory of operation); the record is encoded with its batch in _ship.
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
        stamp = _time_ns() if timestamp_ms is None else -2 - check_timestamp(timestamp_ms)
        self._lock.acquire()
        try:
            route = self._routes.get(topic) or self._route(topic)
            if type(partition) is not int or not 0 <= partition < route.partitions:
                if partition is None and key is None and route.sticky >= 0:
                    partition = route.sticky
                elif partition is None and key is not None and len(key) <= _CACHED_KEY_SIZE_MAX:
                    partition = _cached_positive_hash(key) % route.partitions   # Kafka's rule
                else:
                    partition = self._choose(route, topic, key, partition)
            batch = route.batches[partition]
            if batch is None or batch.room < size:     # a batch's room is within the limit
                batch = self._start_batch(route, topic, partition, size)
            batch.room -= size
            index = len(batch.values)
            batch.values.append(value)
            batch.stamps.append(stamp)
            if key is not None:
                batch.keys[index] = key
            if headers:
                batch.headers[index] = headers
            future = _new(FutureRecordMetadata)
            future._batch = batch
            future._index = index
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

    def _start_batch(self, route: _Route, topic: str, partition: int, size: int) -> _Batch:
        """A new gathering batch for a record of ``size`` bytes, after shipping the
        partition's one it does not fit (lock held).

        Raises
        ------
        RecordTooLargeError
            The record alone exceeds the topic's max.message.bytes.
        """
        if size > route.record_size_max:
            raise RecordTooLargeError(f"a record of {size} bytes exceeds {topic}'s "
                                      f"max.message.bytes ({route.limit})")
        full = route.batches[partition]
        if full is not None:
            self._ship(full)
        # A batch never grows past what the topic accepts, whatever batch_size says;
        # a record larger than batch_size gets a batch of its own.
        room = max(min(self.batch_size, route.limit) - B.HEADER_LENGTH, size)
        batch = route.batches[partition] = _Batch(self, topic, partition,
                                                  route.destinations[partition], room)
        if self._ship_at_once:
            batch.behind = self._still_in_ring(topic, partition)
        if self._linger_idle and (self.linger_ms or batch.behind is not None):
            self._linger_idle = False
            self._wake.notify()         # the linger thread waits for a batch
        self._pending[batch] = None
        return batch

    def _still_in_ring(self, topic: str, partition: int) -> _Batch | None:
        """The partition's last batch if the broker has not completed it yet (lock
        held; linger.ms=0)."""
        last = self._last_shipped.get((topic, partition))
        if last is not None and not last.done:
            self._harvest()
        if last is None or last.done:
            return None
        return last

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
        with self._lock:
            route = self._route(topic)
            sticky = partition is None and first_key is None
            partition = self._choose(route, topic, first_key, partition)
            count = values.shape[0] if isinstance(values, np.ndarray) else len(values)
            encoded = encode_batch(values, keys, headers, timestamp_ms=timestamp_ms,
                                   compression=self.compression,
                                   **self._identity(topic, partition))
            if encoded.size > route.limit:
                raise RecordTooLargeError(f"a batch of {encoded.size} bytes exceeds {topic}'s "
                                          f"max.message.bytes ({route.limit}); send fewer "
                                          f"records")
            batch = _Batch(self, topic, partition, route.destinations[partition])
            batch.drop_columns()
            batch.first_timestamp = int(
                encoded[B.FIRST_TIMESTAMP_OFFSET:B.FIRST_TIMESTAMP_OFFSET + 8].view("<i8")[0])
            self._put(batch, encoded, count)
            if sticky:
                route.sticky = -1                    # the next unkeyed batch moves on
            if self._retained_bytes > self.ring.capacity:
                self._harvest()                      # results unread keep batches' bytes
            return FutureBatchMetadata(batch)

    def _ship(self, batch: _Batch) -> None:
        """Encode a gathering batch and put it into the ring (lock held)."""
        del self._pending[batch]
        gathering = self._gathering[batch.topic]
        if gathering[batch.partition] is batch:
            gathering[batch.partition] = None
        route = self._routes.get(batch.topic)
        if route is not None and route.sticky == batch.partition:
            route.sticky = -1                         # the next unkeyed batch moves on
        self._expire_route(batch.topic)               # once per batch, not per send
        try:
            encoded = self._encode(batch)
            self._put(batch, encoded, batch.count)
        except ShmlogError as error:                  # the ring stayed full: its futures fail
            batch.error = error
            self._flow.record_errors(batch.topic, batch.count)
            raise
        if self._ship_at_once and not batch.done:
            self._last_shipped[(batch.topic, batch.partition)] = batch
        if self._retained_bytes > self.ring.capacity:
            self._harvest()                           # results unread keep batches' bytes

    def _encode(self, batch: _Batch) -> np.ndarray:
        """The gathered records as one batch, in one compiled call (lock held)."""
        batch.count = len(batch.values)
        timestamps = np.fromiter(batch.stamps, np.int64, batch.count)
        _stamps_to_ms(timestamps)
        batch.timestamps = timestamps
        batch.first_timestamp = int(timestamps[0])
        encoded = encode_gathered(batch.values, batch.keys, batch.headers, timestamps,
                                  compression=self.compression,
                                  **self._identity(batch.topic, batch.partition))
        batch.drop_columns()
        return encoded

    def _identity(self, topic: str, partition: int) -> dict:
        """Producer id, epoch and the next batch's first sequence (lock held). The
        sequence moves on only once the batch is in the ring (``_put``): a batch
        refused before that leaves no gap the broker would take for a lost one."""
        if self.producer_id < 0:
            return {"producer_id": B.NO_PRODUCER_ID, "producer_epoch": B.NO_PRODUCER_EPOCH,
                    "base_sequence": B.NO_SEQUENCE}
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
        self._flow.record(batch.topic, count, encoded.size)
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
        batch.error = completion_error(code, batch.topic, batch.partition)
        self._flow.record_errors(batch.topic, batch.count)
        if code == CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            return      # in the log, its sequence used: the batches behind it follow on
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
            if batch in self._pending:
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
                                   acks=self.acks, timeout_ms=RESUME_REQUEST_MS)
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

    # -- futures' callbacks ------------------------------------------------------------
    def _look_for_completions(self) -> None:
        """Resolve what the broker has completed (a future's status check)."""
        with self._lock:
            if not self._closed:
                self._harvest()

    def _add_callback(self, future: FutureRecordMetadata, function, errback: bool) -> None:
        """Run ``function`` once ``future`` is done: now, on this thread, when it is;
        else on the callback thread (started with the first callback)."""
        batch = future._batch
        with self._lock:
            if not batch.done and not self._closed:
                self._harvest()
            if not batch.done:
                if batch.callbacks is None:
                    batch.callbacks = []
                    self._watched.append(batch)
                batch.callbacks.append((future, function, errback))
                if self._callback_thread is None:
                    self._callback_thread = threading.Thread(
                        target=self._callback_loop, name="shmlog-callbacks", daemon=True)
                    self._callback_thread.start()
                self._callbacks_waiting.notify()
                return
        _run_callback(future, function, errback)

    def _fire_callbacks(self) -> None:
        """Run the callbacks of every watched batch that is done, each once, outside
        the producer's lock (a callback may send)."""
        with self._callbacks_running:
            with self._lock:
                done = [batch for batch in self._watched if batch.done]
                if not done:
                    return
                self._watched = [batch for batch in self._watched if not batch.done]
                due = [callback for batch in done for callback in batch.callbacks]
                for batch in done:
                    batch.callbacks = None
            for future, function, errback in due:
                _run_callback(future, function, errback)

    def _callback_loop(self) -> None:
        """While callbacks wait: look for completions every PRODUCER_CALLBACK_POLL_MS
        and run the callbacks of what completed; asleep while none wait."""
        poll_s = limits.PRODUCER_CALLBACK_POLL_MS / 1000
        while True:
            with self._lock:
                while not self._watched and not self._closed:
                    self._callbacks_waiting.wait()
                closed = self._closed
                if not closed:
                    self._harvest()
            self._fire_callbacks()
            if closed:
                return          # close ran what completed; the rest never will
            time.sleep(poll_s)

    def flush(self, timeout: float | None = None) -> None:
        """Ship every gathered batch and wait until the broker has appended all
        (with acks=0: until they are in the ring); the callbacks of their futures
        have run when it returns.

        Raises
        ------
        ClientTimeoutError
            ``timeout`` seconds passed with batches still in flight.
        """
        with self._lock:
            for batch in list(self._pending):
                self._ship(batch)
            # Batches waiting to be sent again go back in flight before they are done.
            waiting = list(self._in_flight.values()) + [
                batch for queued in self._resend.values() for batch in queued]
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._settle(batch, left):
                raise ClientTimeoutError(f"flush: batches still in flight after {timeout} s")
        if self._callback_thread is not None:
            # Also waits for callbacks the callback thread is running now.
            self._fire_callbacks()

    def _linger_loop(self) -> None:
        """Ship batches whose oldest record has waited linger_ms (with linger.ms=0:
        batches once the batch before them is appended)."""
        linger_s = self.linger_ms / 1000
        with self._lock:
            while not self._closed:
                if not self._pending:
                    # Woken by the next batch. Waiting for a batch's linger instead, it
                    # is not woken: later batches are younger, it looks again in time.
                    self._linger_idle = True
                    self._wake.wait()
                    continue
                if self._ship_at_once:
                    self._ship_unblocked()
                    continue
                # Gathering batches are in the order they started: the first is the oldest.
                wait = next(iter(self._pending)).started + linger_s - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                now = time.monotonic()
                for batch in list(self._pending):
                    if now - batch.started < linger_s:
                        break
                    try:
                        self._ship(batch)
                    except ShmlogError as error:      # a full ring past max.block.ms
                        batch.error = error

    def _ship_unblocked(self) -> None:
        """linger.ms=0: ship the gathering batches whose batch before them the broker
        has completed, then look again shortly (lock held; released while waiting)."""
        self._harvest()
        for batch in list(self._pending):
            if batch.behind is None or batch.behind.done:
                batch.behind = None
                try:
                    self._ship(batch)
                except ShmlogError as error:      # a full ring past max.block.ms
                    batch.error = error
        if self._pending:
            self._wake.wait(RESULT_POLL_S)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then leave the broker and remove the ring."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._routes = {}       # send finds no route, and _route refuses
                for batch in list(self._pending):    # flush timed out, or a send raced it
                    del self._pending[batch]
                    batch.drop_columns()
                    batch.error = ClientClosedError("the producer was closed before this "
                                                    "record was sent")
                self._gathering = {}
                self._wake.notify_all()
                self._callbacks_waiting.notify_all()
            self._linger.join(timeout=5)
            self._fire_callbacks()          # the errbacks of batches the close failed
            if self._callback_thread is not None and \
                    self._callback_thread is not threading.current_thread():
                self._callback_thread.join(timeout=5)
            try:
                request(self.data_dir, "unregister_producer", ring=self.ring.name)
            except ShmlogError:
                pass                    # the broker is gone; it reclaims nothing then
            self.ring.unlink()
            self.ring.close()
            self._table.close()

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
        with self._lock:
            flow = self._flow
            batches = flow.batches
            found = {"producer-metrics": {
                "record-send-total": flow.records.total, "record-send-rate": flow.records.rate(),
                "byte-total": flow.bytes.total, "byte-rate": flow.bytes.rate(),
                "record-error-total": flow.errors.total, "record-error-rate": flow.errors.rate(),
                "request-total": batches,
                "batch-size-avg": flow.bytes.total / batches if batches else 0.0,
                "records-per-request-avg": flow.records.total / batches if batches else 0.0,
                "requests-in-flight": len(self._in_flight),
                "buffer-total-bytes": self.ring.capacity,
                "buffer-available-bytes": self.ring.capacity - self.ring.used}}
            for topic, (records, size, errors) in sorted(flow.topics.items()):
                found[f"producer-topic-metrics.{topic}"] = {
                    "record-send-total": records.total, "record-send-rate": records.rate(),
                    "byte-total": size.total, "byte-rate": size.rate(),
                    "record-error-total": errors.total, "record-error-rate": errors.rate()}
            return found

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# Named in the error for a keyword that is neither a setting nor a Kafka option.
_PRODUCER_SETTINGS = tuple(name for name, parameter in
                           inspect.signature(Producer.__init__).parameters.items()
                           if parameter.kind is parameter.KEYWORD_ONLY or name == "bootstrap")
