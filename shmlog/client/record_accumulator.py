"""The producer's record accumulator (Kafka's ``RecordAccumulator``): records gathered
per partition into batches, until a batch is full or has lingered.

Rules
-----
* Every method runs under the producer's lock; :attr:`RecordAccumulator.wake` is a
  condition on that lock.
* ``Producer.send`` appends a record to its partition's gathering batch itself
  (``route.batches[partition]``, the list :meth:`RecordAccumulator.gather_for` gives
  the topic's route): a call into this module per record would cost more than the
  append. It calls :meth:`RecordAccumulator.start_batch` once per batch.
* A batch never grows past what the topic accepts (``route.limit``), whatever
  ``batch_size`` says; a record larger than ``batch_size`` gets a batch of its own.
* The accumulator decides when a batch is due; the sender ships it (``sender.ship``:
  it calls :meth:`RecordAccumulator.remove` first, then encodes and puts the batch).

Theory of operation
-------------------
Gathering batches are kept twice: by topic, a list by partition (what ``send`` looks
up, shared with every route to the topic), and all of them in ``pending``, a dict in
the order they started, so the first is the oldest (what the linger thread and flush
walk). A batch is due when the next record would take it past ``batch_size`` bytes
(``send`` then starts another, which ships the full one), when its oldest record has
waited ``linger_ms`` (:meth:`RecordAccumulator.lingered`), on flush or close, or when a
future of it is asked for its result. With ``linger_ms=0`` a batch is due at once
when nothing of its partition is waiting in the ring for the broker; records sent
meanwhile gather, and their batch is due the moment the batch before it (its
``behind``) is completed (:meth:`RecordAccumulator.unblocked`), as Kafka's sender does
with whatever accumulated while its previous request was out: an idle producer adds
no delay, a busy one does not pay a batch's fixed cost per record. The linger thread
(the sender's) sleeps on :attr:`RecordAccumulator.wake` while nothing gathers, and
:meth:`RecordAccumulator.start_batch` wakes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from ..common.errors import ClientClosedError, RecordTooLargeError
from ..record import batch_layout as B
from .producer_batch import ProducerBatch
from .producer_metadata import TopicRoute

__all__ = ["RecordAccumulator"]


class RecordAccumulator:
    """The batches gathering records, per partition.

    Parameters
    ----------
    lock : threading.Lock
        The producer's lock.
    batch_size : int
        Kafka's batch.size: bytes a batch may take before it ships.
    linger_ms : int
        Kafka's linger.ms: how long a batch may wait for more records (0: see the
        module's theory of operation).
    """

    def __init__(self, lock: threading.Lock, batch_size: int, linger_ms: int):
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.linger_s = linger_ms / 1000
        # linger.ms=0: a batch ships at once unless its partition's last one is still in
        # the ring (acks=0: never is).
        self.ship_at_once = linger_ms == 0
        self.gathering: dict[str, list[ProducerBatch | None]] = {}
        self.pending: dict[ProducerBatch, None] = {}
        self.idle = False                 # the linger thread waits for a first batch
        self.wake = threading.Condition(lock)

    def gather_for(self, topic: str, route: TopicRoute) -> None:
        """Give a new route the topic's gathering batches, a list by partition."""
        batches = self.gathering.setdefault(topic, [])
        batches += [None] * (route.partitions - len(batches))
        for batch in batches:
            if batch is not None:   # started under an older, maybe larger, limit
                batch.room = min(batch.room, route.record_size_max)
        route.batches = batches

    def start_batch(self, sender, route: TopicRoute, topic: str, partition: int,
                    size: int) -> ProducerBatch:
        """A new gathering batch for a record of ``size`` bytes, after shipping the
        partition's one it does not fit.

        Parameters
        ----------
        sender : Sender
            What ships the full batch, what the new batch's futures ask, and (with
            linger.ms=0) which batch of the partition is still in the ring.

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
            sender.ship(full)
        room = max(min(self.batch_size, route.limit) - B.HEADER_LENGTH, size)
        batch = route.batches[partition] = ProducerBatch(sender, topic, partition,
                                                         route.destinations[partition], room)
        if self.ship_at_once:
            batch.behind = sender.still_in_ring(topic, partition)
        if self.idle and (self.linger_ms or batch.behind is not None):
            self.idle = False
            self.wake.notify()         # the linger thread waits for a batch
        self.pending[batch] = None
        return batch

    def remove(self, batch: ProducerBatch) -> None:
        """Take a gathering batch out: it ships."""
        del self.pending[batch]
        gathering = self.gathering[batch.topic]
        if gathering[batch.partition] is batch:
            gathering[batch.partition] = None

    def forget(self, topic: str) -> list[ProducerBatch]:
        """Take out the topic's gathering batches (the broker hosts it no more): they
        will never ship."""
        dropped = []
        for batch in self.gathering.pop(topic, []):
            if batch is not None:
                del self.pending[batch]
                dropped.append(batch)
        return dropped

    def abort_batches(self) -> None:
        """The producer closes: every gathering batch fails (Kafka's
        abortIncompleteBatches)."""
        for batch in list(self.pending):
            del self.pending[batch]
            batch.drop_columns()
            batch.error = ClientClosedError("the producer was closed before this "
                                            "record was sent")
        self.gathering = {}

    # -- what is due (the linger thread asks) ------------------------------------------
    def wait_for_batch(self) -> None:
        """Sleep until a batch starts (or the producer closes). Waiting for a batch's
        linger instead, the linger thread is not woken: later batches are younger, it
        looks again in time."""
        self.idle = True
        self.wake.wait()

    def linger_left_s(self) -> float:
        """How long until the oldest gathering batch has lingered (<= 0: it has)."""
        return next(iter(self.pending)).started + self.linger_s - time.monotonic()

    def lingered(self) -> Iterator[ProducerBatch]:
        """The gathering batches whose oldest record has waited linger_ms, oldest
        first (each looked at after the one before it shipped)."""
        now = time.monotonic()
        for batch in list(self.pending):
            if now - batch.started < self.linger_s:
                break
            yield batch

    def unblocked(self) -> Iterator[ProducerBatch]:
        """linger.ms=0: the gathering batches whose batch before them is completed
        (each looked at after the one before it shipped)."""
        for batch in list(self.pending):
            if batch.behind is None or batch.behind.done:
                batch.behind = None
                yield batch
