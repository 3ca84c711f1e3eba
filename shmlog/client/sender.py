"""The producer's sender (Kafka's ``Sender``): ships batches into this producer's
shared-memory ring, harvests the broker's completions, and resolves the futures.

Rules
-----
* One lock, the producer's (a plain ``threading.Lock``: nothing takes it twice),
  guards the ring's producer side, the batches in flight and everything the sender
  asks of the accumulator, the metadata and the epoch manager. Every method takes it
  or says "lock held"; ``settle`` and ``flush`` wait without it.
* A batch is encoded and put only by :meth:`Sender.ship` (or, already encoded, by
  ``send_batch`` and a resend through :meth:`Sender.put`), and resolved only by
  :meth:`Sender.harvest`: ``result`` once appended, ``error`` once refused.
* Entries complete in the ring in the order they were put, so ``in_flight`` is
  ordered by entry and a harvest stops at the first entry not completed.
* Counted per batch, never per record (``metrics``).

Theory of operation
-------------------
A batch ships - it is taken out of the accumulator, encoded in one compiled call from
its columns (the values joined, their lengths taken in C) with the epoch manager's
producer id, epoch and sequence, gets its header and CRC, is put into the ring, and
the broker's doorbell is rung - when the accumulator says it is due: full (``send``),
lingered or unblocked (the linger thread here, which sleeps on the accumulator's
condition while nothing gathers), on :meth:`Sender.flush`, or when a future of it is
asked for its result (:meth:`Sender.settle`).

The broker's appender completes each ring entry with the batch's base offset (or an
error code), which the sender reads from the ring's completion slots: no round trip,
no syscall. A future's ``get()`` harvests them; so does the callback thread, and a
put once the bytes of batches kept for a resend exceed the ring's capacity (every
batch's bytes are kept until it completes). What a refusal means - a failure, the
batches it kept out held and sent again under a new epoch (KIP-360), a batch refused
as too large split and its parts sent in its place (KIP-126), a topic gone - is
``refusals``' (:class:`~shmlog.client.refusals.Refusals`), called from
:meth:`Sender.harvest`.

A ring the broker stopped reading (it found bytes in it that are no entry, written
over it by this process: the ring is poisoned, and the broker reclaims it) says so
in its ``consumer_error`` word, which the appender stores after the completions of
the entries before the damage: a harvest that finds batches in flight and the word
set resolves what was completed, then fails every other batch in flight with
:class:`CorruptRingError`, and a put into such a ring fails at once. No wait (a
``get()``, a flush, a close) is left waiting for completions that cannot come.

While no completion comes, :meth:`Sender.settle` asks the broker now and then
(``limits.RESUME_AFTER_S``) to take the ring again: a broker restarted after a crash learns
of this producer that way and drains what the ring still holds (the sequences keep
that from appending anything twice). A flush or ``get()`` waits for that as long as
it is told to; a close without a timeout waits ``limits.CLOSE_BROKER_WAIT_S`` of no
broker answering, then fails what is in flight with :class:`BrokerNotAvailableError`.
"""

from __future__ import annotations

import collections
import functools
import threading
import time

import numpy as np

from ..common import limits
from ..common.errors import (
    BrokerNotAvailableError,
    ClientTimeoutError,
    CorruptRingError,
    ShmlogError,
)
from ..common.metrics import FlowCounts
from ..protocol.control_client import request
from ..record.records import Compression
from ..ring import Ring
from ..shm.state import PartitionStateTable
from .epoch_manager import EpochManager
from .producer_batch import BatchMetadata, FutureRecordMetadata, ProducerBatch
from .producer_callbacks import CallbackRunner
from .producer_metadata import ProducerMetadata
from .record_accumulator import RecordAccumulator
from .refusals import Refusals

__all__ = ["Sender"]


def _broker_gone(data_dir: str, waited_s: float, batch: ProducerBatch) -> BrokerNotAvailableError:
    return BrokerNotAvailableError(
        f"no broker of {data_dir} answered for {waited_s:.0f} s while the producer closed: "
        f"the batch of {batch.count} records for {batch.topic}-{batch.partition} was not "
        f"acknowledged and may or may not be in the log (a broker started later drains "
        f"no closed producer's ring); send it again once a broker runs")


class Sender:
    """Puts one producer's batches into its ring and resolves them.

    Parameters
    ----------
    lock : threading.Lock
        The producer's lock.
    ring : Ring
        The producer's ring, registered with the broker; the sender closes it.
    table : PartitionStateTable
        The broker's state table (its appender's doorbell); the sender closes it.
    data_dir : str
        The broker's data directory (its control socket).
    acks : int
        0, 1 or -1.
    max_block_ms : int
        How long a put may wait for room in the ring.
    compression : Compression
    metadata, accumulator, epochs
        The producer's metadata, record accumulator and epoch manager.
    """

    def __init__(self, lock: threading.Lock, ring: Ring, table: PartitionStateTable, *,
                 data_dir: str, acks: int, max_block_ms: int, compression: Compression,
                 metadata: ProducerMetadata, accumulator: RecordAccumulator,
                 epochs: EpochManager):
        self.lock = lock
        self.ring, self.table = ring, table          # a new broker has a new table
        self.data_dir, self.acks, self.max_block_ms = data_dir, acks, max_block_ms
        self.compression = compression
        self.metadata, self.accumulator, self.epochs = metadata, accumulator, epochs
        # By entry number, oldest first (entries complete in order).
        self.in_flight: collections.OrderedDict[int, ProducerBatch] = \
            collections.OrderedDict()
        self.retained_bytes = 0           # the bytes of the batches in flight
        # linger.ms=0: each partition's last batch shipped, by (topic, partition).
        self.last_shipped: dict[tuple[str, int], ProducerBatch] = {}
        self.flow = FlowCounts()          # counted per batch put, never per record
        self.closed = False
        # When a resume request first found no broker since one last answered.
        self.broker_missing_since: float | None = None
        self.callbacks = CallbackRunner(lock, self.harvest)
        self.refusals = Refusals(self)       # what becomes of a refused batch
        self.linger_thread = threading.Thread(target=self._linger_loop,
                                              name="shmlog-linger", daemon=True)

    def start(self) -> None:
        """Start the linger thread."""
        self.linger_thread.start()

    # -- shipping ----------------------------------------------------------------------
    def ship(self, batch: ProducerBatch) -> None:
        """Encode a gathering batch and put it into the ring (lock held).

        Raises
        ------
        ShmlogError
            The ring stayed full past max.block.ms: the batch's futures fail.
        """
        self.accumulator.remove(batch)
        route = self.metadata.routes.get(batch.topic)
        if route is not None and route.sticky == batch.partition:
            route.sticky = -1                         # the next unkeyed batch moves on
        self.metadata.expire(batch.topic)             # once per batch, not per send
        try:
            encoded = batch.encode(self.compression,
                                   self.epochs.identity(batch.topic, batch.partition))
            self.put(batch, encoded, batch.count)
        except ShmlogError as error:                  # the ring stayed full: its futures fail
            batch.error = error
            self.flow.record_errors(batch.topic, batch.count)
            raise
        if self.accumulator.ship_at_once and not batch.done:
            self.last_shipped[(batch.topic, batch.partition)] = batch
        self.release_retained()

    def put(self, batch: ProducerBatch, encoded: np.ndarray, count: int,
            again: bool = False) -> None:
        """Put an encoded batch into the ring and ring the broker's doorbell (lock
        held); with acks=0 it is done, else in flight until harvested. A batch of a
        partition whose first batch sent ``again`` after a restart is in flight
        waits behind it (``epochs.following``).

        Raises
        ------
        CorruptRingError
            The broker stopped reading the ring (it was poisoned)."""
        if self.ring.consumer_error:
            raise self._ring_lost(batch, count)
        batch.count = count
        if not again and self.epochs.following:
            waiting = self.epochs.following.get((batch.topic, batch.partition))
            if waiting is not None:
                batch.encoded = encoded       # stamped with its sequence when put
                waiting.append(batch)
                return
        batch.entry = self.ring.put(batch.destination, encoded, timeout_ms=self.max_block_ms)
        self.table.appender_doorbell.ring()
        self.flow.record(batch.topic, count, encoded.size)
        self.epochs.sent((batch.topic, batch.partition), count)
        if self.acks == 0:
            batch.result = BatchMetadata(batch.topic, batch.partition, -1, count,
                                         batch.first_timestamp)
            return
        self.in_flight[batch.entry] = batch
        # Kept until the batch's result: a refused batch before it sends it back, and
        # one refused as too large is split.
        batch.encoded = encoded
        self.retained_bytes += encoded.size

    def release_retained(self) -> None:
        """Harvest once the bytes kept for a resend exceed the ring's capacity
        (lock held): results unread keep batches' bytes."""
        if self.retained_bytes > self.ring.capacity:
            self.harvest()

    def still_in_ring(self, topic: str, partition: int) -> ProducerBatch | None:
        """The partition's last batch if the broker has not completed it yet (lock
        held; linger.ms=0)."""
        last = self.last_shipped.get((topic, partition))
        if last is not None and not last.done:
            self.harvest()
        if last is None or last.done:
            return None
        return last

    # -- completions -------------------------------------------------------------------
    def harvest(self) -> None:
        """Resolve every in-flight batch the broker has finished, and fail those it
        never will: its ring poisoned (lock held)."""
        self._resolve_completed()
        if self.in_flight and self.ring.consumer_error:
            self._resolve_completed()   # those completed before the broker gave up
            self._fail_in_flight(lambda batch: self._ring_lost(batch, batch.count))
        if self.epochs.resend:
            self.refusals.recover()

    def _fail_in_flight(self, error_for) -> None:
        """Fail every batch in flight, and those held to be sent again, with
        ``error_for(batch)``: the broker will complete none of them (lock held)."""
        for batch in self.in_flight.values():
            if batch.encoded is not None:
                self.epochs.completed((batch.topic, batch.partition))
                self.retained_bytes -= batch.encoded.size
            batch.encoded = None
            batch.error = error_for(batch)
            self.flow.record_errors(batch.topic, batch.count)
        self.in_flight.clear()
        for batch in self.epochs.held():
            if not batch.done:
                batch.encoded, batch.error = None, error_for(batch)

    def _ring_lost(self, batch: ProducerBatch, count: int) -> CorruptRingError:
        """The error of a batch the broker will never complete: it stopped reading
        the ring (poisoned; see the module's docstring)."""
        return CorruptRingError(
            f"ring {self.ring.name!r}: the broker stopped reading it (completion code "
            f"{self.ring.consumer_error}: bytes in it were no entry, so something in this "
            f"process wrote over the ring) and reclaims it; the batch of {count} records "
            f"for {batch.topic}-{batch.partition} was not acknowledged and may not be in "
            f"the log: close this producer and send it again through a new one",
            name=self.ring.name)

    def _resolve_completed(self) -> None:
        """Resolve the in-flight batches the broker has completed, in order (lock
        held)."""
        while self.in_flight:
            entry = next(iter(self.in_flight))
            outcome = self.ring.result(entry)
            if outcome is None:
                break                   # entries complete in order: no later one either
            batch = self.in_flight.pop(entry)
            result, batch.log_append_time = outcome
            if batch.encoded is not None:
                self.epochs.completed((batch.topic, batch.partition))
                self.retained_bytes -= batch.encoded.size
            if result >= 0:
                batch.encoded = None
                batch.result = BatchMetadata(
                    batch.topic, batch.partition, result, batch.count,
                    batch.log_append_time if batch.log_append_time >= 0 else batch.first_timestamp)
                if self.epochs.following:
                    self.refusals.put_following((batch.topic, batch.partition))
            else:
                self.refusals.refused(batch, -result)

    # -- what futures ask --------------------------------------------------------------
    def settle(self, batch: ProducerBatch, wait_s: float | None,
               broker_wait_s: float | None = None) -> bool:
        """Ship the batch if still gathering, then wait for its completion; whether it
        came within ``wait_s`` seconds (None: forever). While none comes, the broker
        is asked now and then to take the ring again (see the module's docstring);
        with ``broker_wait_s``, after that long with no broker answering, every batch
        in flight fails with :class:`BrokerNotAvailableError` (and this returns True)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self.lock:
            if batch in self.accumulator.pending:
                self.ship(batch)
        next_resume = time.monotonic() + limits.RESUME_AFTER_S
        while True:
            with self.lock:
                if not batch.done:
                    self.harvest()
                if batch.done:
                    return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if now >= next_resume:
                self._resume()
                next_resume = now + limits.RESUME_AFTER_S
                missing = self.broker_missing_since
                if broker_wait_s is not None and missing is not None and \
                        now - missing >= broker_wait_s:
                    with self.lock:
                        self._fail_in_flight(functools.partial(
                            _broker_gone, self.data_dir, now - missing))
                    return True
            # Asleep on the ring's acknowledged count, which the broker wakes when it
            # moves (ring_layout).
            self.ring.await_completions(limits.RESULT_WAIT_S)

    def _resume(self) -> None:
        """Register the ring again (a no-op with the broker that has it). A
        transactional producer names its transactional id and producer id: a cluster
        member that restarted learns whose coordinator verifies its batches."""
        with self.lock:
            transactional = {} if self.epochs.transactions is None else {
                "transactional_id": self.epochs.transactions.transactional_id,
                "producer_id": self.epochs.producer_id}
        try:
            registration = request(self.data_dir, "register_producer", ring=self.ring.name,
                                   acks=self.acks, timeout_ms=limits.RESUME_REQUEST_MS,
                                   **transactional)
            reply = request(self.data_dir, "metadata", topics=[],
                            timeout_ms=limits.RESUME_REQUEST_MS)
            table = PartitionStateTable.attach(reply["state_table"])
        except ShmlogError:
            if self.broker_missing_since is None:
                self.broker_missing_since = time.monotonic()
            return                      # no broker yet: keep waiting
        self.broker_missing_since = None
        with self.lock:
            self.epochs.registered_again(registration)
            self.table, old = table, self.table     # a new broker has a new table
            self.metadata.broker_seen(reply["broker_epoch"])
        old.close()

    def look_for_completions(self) -> None:
        """Resolve what the broker has completed (a future's status check)."""
        with self.lock:
            if not self.closed:
                self.harvest()

    def add_callback(self, future: FutureRecordMetadata, function, errback: bool) -> None:
        """Run ``function`` once ``future`` is done (see ``producer_callbacks``)."""
        self.callbacks.add(future, function, errback)

    # -- flush, linger, close ----------------------------------------------------------
    def flush(self, timeout: float | None, broker_wait_s: float | None = None) -> None:
        """Ship every gathering batch, wait until every batch is done (or, with
        ``broker_wait_s``, failed after that long without a broker: :meth:`settle`),
        then run the callbacks due.

        Raises
        ------
        ClientTimeoutError
            ``timeout`` seconds passed with batches still in flight.
        """
        with self.lock:
            for batch in list(self.accumulator.pending):
                try:
                    self.ship(batch)
                except CorruptRingError:
                    pass                    # poisoned: its futures say so, like the rest
            # Batches waiting to be sent again go back in flight before they are done.
            waiting = list(self.in_flight.values()) + self.epochs.held()
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.settle(batch, left, broker_wait_s):
                raise ClientTimeoutError(f"flush: batches still in flight after {timeout} s")
        if self.callbacks.thread is not None:
            # Also waits for callbacks the callback thread is running now.
            self.callbacks.fire()

    def _linger_loop(self) -> None:
        """Ship batches whose oldest record has waited linger_ms (with linger.ms=0:
        batches once the batch before them is appended)."""
        accumulator = self.accumulator
        with self.lock:
            while not self.closed:
                if not accumulator.pending:
                    accumulator.wait_for_batch()      # woken by the next batch
                    continue
                if accumulator.ship_at_once:
                    self._ship_unblocked()
                    continue
                wait = accumulator.linger_left_s()
                if wait > 0:
                    accumulator.wake.wait(wait)
                    continue
                self._ship_each(accumulator.lingered())

    def _ship_unblocked(self) -> None:
        """linger.ms=0: ship the gathering batches whose batch before them the broker
        has completed, then sleep until it completes another (lock held; released
        while asleep). What still gathers waits behind a batch in the ring: a
        completion is what unblocks it (a send to a partition with nothing in the
        ring ships at once, from ``send``)."""
        self.harvest()
        self._ship_each(self.accumulator.unblocked())
        if self.accumulator.pending:
            self.lock.release()
            try:
                self.ring.await_completions(limits.RESULT_WAIT_S)
            finally:
                self.lock.acquire()

    def _ship_each(self, batches) -> None:
        """Ship each batch; one the ring refused past max.block.ms fails (lock held)."""
        for batch in batches:
            try:
                self.ship(batch)
            except ShmlogError as error:      # a full ring past max.block.ms
                batch.error = error

    def close(self) -> None:
        """After the last flush: fail what still gathers, stop the threads, leave the
        broker and remove the ring."""
        with self.lock:
            self.closed = True
            self.metadata.routes.clear()      # send finds no route and may read none
            self.accumulator.abort_batches()   # flush timed out, or a send raced it
            self.accumulator.wake.notify_all()
            self.callbacks.close()
        self.linger_thread.join(timeout=5)
        self.callbacks.join()               # the errbacks of batches the close failed
        try:
            # No broker answered lately: a short wait, not the usual ten seconds.
            request(self.data_dir, "unregister_producer", ring=self.ring.name,
                    **({} if self.broker_missing_since is None
                       else {"timeout_ms": limits.RESUME_REQUEST_MS}))
        except ShmlogError:
            pass                    # the broker is gone; it reclaims nothing then
        self.ring.unlink()
        self.ring.close()
        self.table.close()

    def metrics(self) -> dict:
        """The producer's metrics (``Producer.metrics`` says which)."""
        with self.lock:
            flow = self.flow
            batches = flow.batches
            found = {"producer-metrics": {
                "record-send-total": flow.records.total, "record-send-rate": flow.records.rate(),
                "byte-total": flow.bytes.total, "byte-rate": flow.bytes.rate(),
                "record-error-total": flow.errors.total, "record-error-rate": flow.errors.rate(),
                "request-total": batches,
                "batch-size-avg": flow.bytes.total / batches if batches else 0.0,
                "records-per-request-avg": flow.records.total / batches if batches else 0.0,
                "requests-in-flight": len(self.in_flight),
                "buffer-total-bytes": self.ring.capacity,
                "buffer-available-bytes": self.ring.capacity - self.ring.used}}
            for topic, (records, size, errors) in sorted(flow.topics.items()):
                found[f"producer-topic-metrics.{topic}"] = {
                    "record-send-total": records.total, "record-send-rate": records.rate(),
                    "byte-total": size.total, "byte-rate": size.rate(),
                    "record-error-total": errors.total, "record-error-rate": errors.rate()}
            return found
