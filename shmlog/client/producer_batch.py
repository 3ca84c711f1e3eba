"""A producer's batch (Kafka's ``ProducerBatch``) and what ``send`` returns: the
record's future (``FutureRecordMetadata``) and, once appended, its metadata.

Rules
-----
* A batch and its futures are read and written under the producer's lock, except a
  done batch's results, which never change again.
* A future is only its batch and the record's index there (``send`` makes one per
  record, with ``object.__new__`` and two stores: no call). Everything it knows comes
  from the batch, which the sender resolves.
* A future reaches the rest of the producer only through its batch's ``sender``:
  ``settle(batch, wait_s)`` (ship the batch if it still gathers, then wait for its
  completion; True once done), ``look_for_completions()`` (resolve what the broker
  completed) and ``add_callback(future, function, errback)``.
* Callbacks run once each, through :func:`run_callback`, which logs what they raise
  (kafka-python's rule).
* A batch the broker refused as too large is split (:meth:`ProducerBatch.split`,
  Kafka's KIP-126): its records go to new batches, its ``parts``, and the batch is
  done once every part is; a record's future answers from the part that holds it
  (:meth:`FutureRecordMetadata.located`), so one record too large for the topic
  fails alone and its neighbours are appended.

Theory of operation
-------------------
While a batch gathers, ``send`` appends each record's fields to its columns: a list
of values, one clock reading per record in ``stamps`` (a ``time.time_ns()``, >= 0, or
``-2 - timestamp_ms``, <= -1, for a timestamp the caller gave: ``[-1,
TIMESTAMP_MS_MAX]`` maps onto the negative int64s), and keys and headers by record
index, only for the records that have them. :meth:`ProducerBatch.encode` turns the
columns into one batch in one compiled call (the stamps into milliseconds in
another, once per batch rather than a Python division per send), keeps the records'
timestamps for their futures, and drops the columns. The batch then waits in the ring
until the broker completes it: ``result`` (its :class:`BatchMetadata`) or ``error``
(the broker's typed error) is set, and its futures are done.

A batch refused as too large (max.message.bytes lowered under a running producer,
or a ``send_batch`` sized to a limit since lowered) holding more than one record is
decoded and its records gathered again into parts of at most ``size_max`` bytes
each, Kafka's batch.size, which the sender caps at half the refused batch, so every
split at least halves the bytes sent as one batch; a part refused again is split
again, down to single records. The parts keep the records' order and timestamps;
the sender sends them where the refused batch was in the partition's order
(``sender``: the idempotent producer holds them with the batches behind it and sends
them again under a new epoch from sequence 0, as after any refusal).
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from typing import NamedTuple

import numpy as np

from ..common.errors import ClientTimeoutError, LocalProtocolError, ShmlogError
from ..native.jit import kernel
from ..record import batch_layout as B
from ..record.records import Compression, decode_columns, encode_gathered
from ..ring import Destination

log = logging.getLogger(__name__)

__all__ = ["ProducerBatch", "RecordMetadata", "BatchMetadata", "FutureRecordMetadata",
           "FutureBatchMetadata", "run_callback"]


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


@kernel
def _stamps_to_ms(stamps):
    """In place, each send's clock reading as its timestamp in milliseconds (see the
    module's theory of operation)."""
    for index in range(stamps.size):
        stamp = stamps[index]
        stamps[index] = stamp // 1_000_000 if stamp >= 0 else -2 - stamp


class ProducerBatch:
    """One partition's batch. While it gathers, ``send`` appends each record's fields
    to its columns; :meth:`encode` encodes them in one call and keeps the records'
    timestamps (milliseconds) in ``timestamps`` for their futures."""

    __slots__ = ("sender", "topic", "partition", "destination", "values", "keys",
                 "headers", "stamps", "room", "started", "count", "timestamps",
                 "first_timestamp", "entry", "encoded", "log_append_time", "result", "error",
                 "behind", "callbacks", "parts")

    def __init__(self, sender, topic: str, partition: int, destination: Destination,
                 room: int = 0):
        self.sender = sender                   # what its futures ask (see the module's rules)
        self.topic, self.partition, self.destination = topic, partition, destination
        self.values: list | None = []          # bytes or None, one per record
        self.keys: dict | None = {}            # record index -> key, for keyed records
        self.headers: dict | None = {}         # record index -> checked headers
        self.stamps: list | None = []          # one clock reading per record
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
        self.behind: ProducerBatch | None = None
        # (future, function, is_errback) added to its futures while not done; None
        # when there are none (the producer's callback thread watches the batch).
        self.callbacks: list | None = None
        # Once split: (index of its first record here, part), in record order.
        self.parts: list | None = None

    @property
    def done(self) -> bool:
        if self.parts is not None:
            return all(part.done for _, part in self.parts)
        return self.result is not None or self.error is not None

    def part_of(self, index: int) -> tuple["ProducerBatch", int]:
        """The part of a split batch holding its record ``index``, and the record's
        index there."""
        found = bisect.bisect_right(self.parts, index, key=lambda part: part[0]) - 1
        first, part = self.parts[found]
        return part, index - first

    def leaves(self) -> list["ProducerBatch"]:
        """The batches that went to the broker for this one's records, in order:
        itself, or its parts' (split again, perhaps)."""
        if self.parts is None:
            return [self]
        return [leaf for _, part in self.parts for leaf in part.leaves()]

    def split(self, size_max: int) -> list["ProducerBatch"]:
        """Gather the records of this refused batch (``encoded``, more than one
        record) again into parts of at most ``size_max`` bytes of records each (a
        record larger gets a part of its own; two parts at least), which become its
        ``parts``; returns them, to be encoded and sent. Off the hot path: the
        broker refused the batch, and the records are decoded one by one."""
        records = decode_columns(self.encoded, verified=True).records()
        sizes = [B.RECORD_HEADER_LENGTH + len(record.key or b"") + len(record.value or b"")
                 + sum(B.HEADER_ENTRY_LENGTH + len(name.encode()) + len(value or b"")
                       for name, value in record.headers)
                 for record in records]
        firsts, size = [0], 0
        for index, record_size in enumerate(sizes):
            if size and size + record_size > size_max:
                firsts.append(index)
                size = 0
            size += record_size
        if len(firsts) < 2:                   # the records are small: halve their count
            firsts = [0, len(records) // 2]
        self.parts = []
        for first, end in zip(firsts, firsts[1:] + [len(records)]):
            part = ProducerBatch(self.sender, self.topic, self.partition, self.destination)
            for index, record in enumerate(records[first:end]):
                part.values.append(record.value)
                part.stamps.append(-2 - record.timestamp)    # a given timestamp: kept
                if record.key is not None:
                    part.keys[index] = record.key
                if record.headers:
                    part.headers[index] = tuple((name.encode(), value)
                                                for name, value in record.headers)
            part.started = self.started
            self.parts.append((first, part))
        self.encoded = None
        return [part for _, part in self.parts]

    def drop_columns(self) -> None:
        self.values = self.keys = self.headers = self.stamps = None

    def encode(self, compression: Compression, identity: dict) -> np.ndarray:
        """The gathered records as one batch, in one compiled call; ``identity``: the
        producer id, epoch and first sequence it carries."""
        self.count = len(self.values)
        timestamps = np.fromiter(self.stamps, np.int64, self.count)
        _stamps_to_ms(timestamps)
        self.timestamps = timestamps
        self.first_timestamp = int(timestamps[0])
        encoded = encode_gathered(self.values, self.keys, self.headers, timestamps,
                                  compression=compression, **identity)
        self.drop_columns()
        return encoded


class FutureRecordMetadata:
    """What ``send`` returns: ``get()`` gives the record's :class:`RecordMetadata`
    once the broker has appended it, or raises the error it reported. It is only its
    ``batch`` and its ``index`` there (``send`` makes one per record).

    kafka-python's Future shape as well: ``add_callback(fn, *args, **kwargs)``
    (``fn(*args, metadata, **kwargs)`` once appended), ``add_errback`` (with the
    error), ``add_both``, ``is_done``, ``value``, ``exception``, ``succeeded()`` and
    ``failed()``. Each callback runs once: on the producer's callback thread when
    the batch completes (or in ``flush``/``close``, whichever comes first), or at
    once on the caller's thread when added to a future already done. A callback
    that raises is logged, not propagated (kafka-python's rule). Status checks
    read the completions the broker has published; they never ship a batch.
    """

    __slots__ = ("batch", "index")

    def done(self) -> bool:
        """Whether the result is known (a gathering batch is shipped, as ``get`` does)."""
        batch = self.batch
        return batch.done or batch.sender.settle(batch, wait_s=0)

    def located(self) -> tuple[ProducerBatch, int]:
        """The batch that went to the broker with this record, and the record's index
        there: its own batch, or, once that was split, the part holding it."""
        batch, index = self.batch, self.index
        while batch.parts is not None:
            batch, index = batch.part_of(index)
        return batch, index

    def _wait(self, timeout: float | None) -> tuple[ProducerBatch, int]:
        batch = self.batch
        if batch.result is None:
            if not batch.sender.settle(batch, wait_s=timeout):
                raise ClientTimeoutError(f"no acknowledgement for {batch.topic}-"
                                         f"{batch.partition} within {timeout} s")
            batch, index = self.located()
            if batch.error is not None:
                raise batch.error
            return batch, index
        return batch, self.index

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (forever when None).

        Raises
        ------
        ClientTimeoutError
            The timeout passed (the batch is still in flight).
        ShmlogError
            The broker refused the batch (its typed error); of a batch split after
            the broker refused it as too large, the part that holds the record.
        """
        return self._value(*self._wait(timeout))

    def _value(self, batch: ProducerBatch, index: int) -> RecordMetadata:
        """The record's metadata, from its appended batch (the part, if split)."""
        result = batch.result
        offset = result.base_offset + index if result.base_offset >= 0 else -1
        timestamp = batch.log_append_time
        if timestamp < 0:
            timestamp = int(batch.timestamps[index])    # the record's own (CreateTime)
        return RecordMetadata(result.topic, result.partition, offset, timestamp)

    # -- kafka-python's Future -------------------------------------------------------
    def _known(self) -> tuple[ProducerBatch, int]:
        if not self.batch.done:
            self.batch.sender.look_for_completions()
        return self.located()

    @property
    def is_done(self) -> bool:
        return self._known()[0].done

    @property
    def value(self):
        """The metadata once appended, else None."""
        batch, index = self._known()
        return self._value(batch, index) if batch.done and batch.error is None else None

    @property
    def exception(self) -> ShmlogError | None:
        """The error the batch failed with, else None."""
        return self._known()[0].error

    def succeeded(self) -> bool:
        batch = self._known()[0]
        return batch.done and batch.error is None

    def failed(self) -> bool:
        return self._known()[0].error is not None

    def add_callback(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """Call ``function(*args, metadata, **kwargs)`` once the record is appended."""
        self.batch.sender.add_callback(self, _bound(function, args, kwargs), False)
        return self

    def add_errback(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """Call ``function(*args, error, **kwargs)`` if the record's batch fails."""
        self.batch.sender.add_callback(self, _bound(function, args, kwargs), True)
        return self

    def add_both(self, function, *args, **kwargs) -> "FutureRecordMetadata":
        """``function`` as both callback and errback."""
        return self.add_callback(function, *args, **kwargs).add_errback(
            function, *args, **kwargs)


def _bound(function, args: tuple, kwargs: dict):
    if not callable(function):
        raise LocalProtocolError(f"a callback must be callable, got {function!r:.100}")
    return functools.partial(function, *args, **kwargs) if args or kwargs else function


def run_callback(future: FutureRecordMetadata, function, errback: bool) -> None:
    """Call one callback of a completed future; what it raises is logged."""
    batch, index = future.located()
    try:
        if batch.error is not None:
            if errback:
                function(batch.error)
        elif not errback:
            function(future._value(batch, index))
    except Exception:
        log.exception("a producer %s for %s-%d raised", "errback" if errback else "callback",
                      batch.topic, batch.partition)


class FutureBatchMetadata(FutureRecordMetadata):
    """What ``send_batch`` returns: ``get()`` gives the :class:`BatchMetadata`
    (and callbacks get it too). A batch the broker refused as too large and the
    sender split answers for all its parts: the first error of one, else the
    metadata of its records, from the first part's base offset (the parts' records
    follow in order, though another producer's may come between them)."""

    __slots__ = ()

    def __init__(self, batch: ProducerBatch):
        self.batch, self.index = batch, 0

    def located(self) -> tuple[ProducerBatch, int]:
        # The whole batch: its first failed part, or (all appended) itself.
        failed = [leaf for leaf in self.batch.leaves() if leaf.error is not None]
        return (failed[0] if failed else self.batch), 0

    def _value(self, batch: ProducerBatch, index: int) -> BatchMetadata:
        if batch.parts is None:
            return batch.result
        first = batch.leaves()[0].result
        return BatchMetadata(batch.topic, batch.partition, first.base_offset, batch.count,
                             first.timestamp)
