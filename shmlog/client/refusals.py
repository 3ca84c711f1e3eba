"""What the producer's sender does with a batch the broker refused (Kafka's
``Sender.completeBatch`` for an error): fail it, hold what the refusal kept out and
send it again under a new epoch (KIP-360, with ``epoch_manager``), split a batch
refused as too large (KIP-126), or drop a topic the broker hosts no more.

Rules
-----
* Every method runs under the producer's lock, called by the sender's harvest
  (:class:`Refusals` is a part of the :class:`~shmlog.client.sender.Sender`, kept
  apart so each stays small; it reaches the ring only through ``sender.put``).
* A refused batch is resolved once: ``error`` set (its futures fail), or held to be
  sent again, or split into parts whose futures answer for its records.

Theory of operation
-------------------
A refusal other than an out-of-order one breaks the partition's sequence (the
refused batch used none), so every batch of the partition in flight behind it comes
back out of order; they are held (:meth:`EpochManager.hold`), and once nothing of the
partition is in flight it starts again under a new epoch from sequence 0
(:meth:`Refusals.recover`): the first held batch is sent alone, the others once the
broker appended it (``epochs.following``: a broker that holds nothing of this
producer for the partition takes a first batch at any sequence, so one sent behind a
first refused again could be appended ahead of it).

``RECORD_TOO_LARGE`` (max.message.bytes lowered under the producer) of a batch of
more than one record is no failure: the batch is split (:meth:`Refusals.split`) into
parts sized to the limit the broker has now (read once per lowering), to
batch.size and to half the batch, as Kafka's ``RecordAccumulator.splitAndReenqueue``
re-enqueues a batch split by batch.size; an idempotent producer holds the parts
first, where the batch was, so they go out again under the new epoch with fresh
sequences (the broker dedupes them as any batch: the refused batch appended
nothing). Without idempotence they are put at once, after what is in flight (Kafka
without idempotence keeps no order across a retry either). A record alone too large
fails with :class:`RecordTooLargeError`; the next send reads the lowered limit and
refuses such a record at the call.
"""

from __future__ import annotations

from ..common.errors import ShmlogError
from ..record import batch_layout as B
from ..record.records import restamp_batch
from ..shm.completion import CompletionCode, completion_error
from .producer_batch import ProducerBatch

__all__ = ["Refusals"]


class Refusals:
    """The refusals of one producer's batches (see the module's docstring).

    Parameters
    ----------
    sender : Sender
        The producer's sender: its epochs, metadata, accumulator, flow counts and
        ``put``.
    """

    def __init__(self, sender):
        self.sender = sender
        # The sender's parts, which it never replaces.
        self.epochs, self.metadata = sender.epochs, sender.metadata
        self.accumulator, self.flow = sender.accumulator, sender.flow
        self.compression, self.last_shipped = sender.compression, sender.last_shipped

    def put_following(self, key: tuple[str, int]) -> None:
        """The partition's first batch sent again is appended: the batches waiting
        behind it follow, in order (lock held)."""
        following = self.epochs.following.pop(key, None)
        if following:
            self.put_again(key, following)

    def put_again(self, key: tuple[str, int], batches: list) -> None:
        """Put held batches of a partition, each stamped with its sequence now, in
        order; those the ring refused past max.block.ms fail (lock held)."""
        for index, batch in enumerate(batches):
            restamp_batch(batch.encoded, **self.epochs.identity(*key))
            try:
                self.sender.put(batch, batch.encoded, batch.count, again=True)
            except ShmlogError as error:             # the ring stayed full past max.block.ms
                for unsent in batches[index:]:
                    unsent.encoded, unsent.error = None, error
                break

    def refused(self, batch: ProducerBatch, code: int) -> None:
        """A batch the broker did not append (lock held). A transactional producer's
        fails, and its transaction with it (``transaction_manager``): nothing of a
        transaction is sent again, its abort starts a new epoch."""
        key = (batch.topic, batch.partition)
        if self.epochs.transactions is not None:
            batch.encoded = None
            batch.error = completion_error(code, batch.topic, batch.partition)
            self.flow.record_errors(batch.topic, batch.count)
            self.epochs.transactions.failed(batch.error)
            return
        if code == CompletionCode.OUT_OF_ORDER_SEQUENCE and self.epochs.hold(key, batch):
            return                      # kept out by a refused batch before it
        if code == CompletionCode.RECORD_TOO_LARGE and batch.count > 1 and \
                batch.encoded is not None:
            self.split(batch)
            self.epochs.defer_following(key)
            return
        batch.encoded = None
        batch.error = completion_error(code, batch.topic, batch.partition)
        self.flow.record_errors(batch.topic, batch.count)
        if code == CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            # In the log, its sequence used: the batches behind it follow on.
            if self.epochs.following:
                self.put_following(key)
            return
        if code == CompletionCode.UNKNOWN_PARTITION:
            route = self.metadata.routes.get(batch.topic)
            # Only a route to the topic that is gone: one read since then is good.
            if route is None or route.destinations[0].topic_key == batch.destination.topic_key:
                self.forget_topic(batch.topic)
            return
        if code == CompletionCode.RECORD_TOO_LARGE:
            # max.message.bytes was lowered: later batches are sized to the new one.
            self.metadata.forget(batch.topic)
        self.epochs.sequence_broken(key)
        self.epochs.defer_following(key)

    def split(self, batch: ProducerBatch) -> None:
        """A batch of many records refused as too large (lock held): split into parts
        of at most batch.size and half its bytes, sent in its place (see the
        module's docstring); its futures answer from the parts."""
        key = (batch.topic, batch.partition)
        size_max = min(self.accumulator.batch_size, batch.encoded.size // 2)
        limit = self.limit_now(batch.topic, batch.encoded.size)
        if limit is not None:
            size_max = min(size_max, limit - B.HEADER_LENGTH)
        parts = batch.split(max(1, size_max))
        idempotent = self.epochs.producer_id >= 0
        identity = self.epochs.identity_to_restamp() if idempotent else \
            self.epochs.identity(*key)
        for part in parts:
            part.encoded = part.encode(self.compression, identity)
        if idempotent:
            self.epochs.sequence_broken(key)  # the parts first, then what it keeps out
            for part in parts:
                self.epochs.hold(key, part)
            return
        for index, part in enumerate(parts):
            try:
                self.sender.put(part, part.encoded, part.count)
            except ShmlogError as error:             # the ring stayed full past max.block.ms
                for unsent in parts[index:]:
                    unsent.encoded, unsent.error = None, error
                break

    def limit_now(self, topic: str, refused_size: int) -> int | None:
        """The topic's max.message.bytes as the broker has it now, which a batch of
        ``refused_size`` bytes exceeded: cached, or read again (once per lowering:
        a control request, under the lock, as a send's first to a topic); None when
        no broker answers (the split then halves)."""
        route = self.metadata.routes.get(topic)
        if route is None or route.limit >= refused_size:
            self.metadata.forget(topic)
            try:
                route = self.metadata.read_route(topic)
            except ShmlogError:
                return None
            self.accumulator.gather_for(topic, route)
        return route.limit

    def forget_topic(self, topic: str) -> None:
        """The broker hosts the topic no more (lock held): drop what we knew of it,
        so the next send reads its metadata again, and fail the batches still
        gathering or held for it; a topic created again under the name starts afresh."""
        self.metadata.forget(topic)
        for key in [key for key in self.last_shipped if key[0] == topic]:
            del self.last_shipped[key]
        for batch in self.epochs.forget(topic) + self.accumulator.forget(topic):
            batch.drop_columns()
            batch.encoded = None
            batch.error = completion_error(CompletionCode.UNKNOWN_PARTITION, batch.topic,
                                           batch.partition)

    def recover(self) -> None:
        """Start each partition whose sequence a refused batch broke, once nothing of
        it is in flight, again under a new epoch from sequence 0, and send the
        batches the refusal kept out again, in order: the first, then the others
        once it is appended (lock held)."""
        for key in self.epochs.restartable():
            held = self.epochs.restart(key)
            if held is None:
                return                  # no broker to give a new id: at the next harvest
            if not held:
                continue
            # The first alone: the others once it is appended (see epoch_manager).
            self.epochs.following[key] = held[1:]
            self.put_again(key, held[:1])
            if held[0].error is not None:            # the ring refused it: so are the rest
                for unsent in self.epochs.following.pop(key):
                    unsent.encoded, unsent.error = None, held[0].error
