"""Forwarding: a producer whose partition another broker leads (the design note's §5).

A producer writes into its local ring as always; the local broker sends the batch to
the partition's leader over ZeroMQ (PRODUCE) and completes the ring entry with the
leader's answer. The client API does not change.

Rules
-----
* **The follower's side** (Kafka's producer ``Sender``, run by the broker for its
  local producers). The appender hands over each entry bound for a partition this
  broker does not lead (``Appender.set_forwarder``): a checked private copy, its
  ring space released at once, its completion parked as external until
  ``Appender.resolve_forwarded`` (ring order kept by the appender).
* **One batch in flight per (ring, partition)**, so per (producer id, partition): the
  leader remembers one batch per producer (the design note's §4.5 item 2), so only
  the last batch sent may be re-sent and found a duplicate. Later batches wait
  behind it, in ring order.
* **Re-sent, never re-made.** A batch goes out again, the same bytes (the same
  producer id, epoch and sequence: the new leader dedupes it), when its request
  fails (no answer, the peer reset), when the leader answers with a retriable error
  (``NOT_LEADER_OR_FOLLOWER``, ``UNKNOWN_TOPIC_OR_PARTITION``, ``REQUEST_TIMED_OUT``,
  an epoch error: Kafka's producer retries these), after ``FORWARD_RETRY_BACKOFF_MS``;
  and at once when the partition's leader or leader epoch changes while it is in
  flight (the old request's answer is then dropped). A partition with no leader
  (OFFLINE) waits for one.
* **Bounded** (Kafka's ``delivery.timeout.ms``): an entry not answered within
  ``forward.delivery.timeout.ms`` of being taken completes with
  ``REQUEST_TIMED_OUT`` (its outcome unknown); each PRODUCE asks the leader to wait
  at most ``forward.request.timeout.ms`` (Kafka's ``request.timeout.ms``), never
  past that bound.
* **This broker becomes the leader** with entries still queued: they are appended
  here, in order, before the next drain can append a later entry of their ring
  (the replica service applies the new state and calls :meth:`Forwarding.poll` in
  one loop turn), so a producer's sequence stays in order.
* **acks.** An acks=all ring's batches are sent with ``acks=-1``, others with
  ``acks=1``: the appender does not know an acks=0 producer from an acks=1 one, and
  an acks=0 producer ignores what its ring says, so its batches are forwarded (and
  answered) as acks=1.
* **The leader's side** (Kafka's ``ReplicaManager.appendRecords`` and
  ``DelayedProduce``). A PRODUCE is served only for a partition this broker leads
  (else ``NOT_LEADER_OR_FOLLOWER``; unknown: ``UNKNOWN_TOPIC_OR_PARTITION``); an
  acks=-1 batch is refused before the append while the partition is under
  ``min.insync.replicas`` (``NOT_ENOUGH_REPLICAS``), as the ring path refuses it;
  the batch is appended with ``Appender.append`` (the producer's sequence checked,
  the leader epoch stamped). acks=1 is answered at once; acks=-1 waits in the
  :class:`ProducePurgatory` until the high watermark covers the batch
  (``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` if the ISR is then under
  ``min.insync.replicas``), the leadership or epoch changes
  (``NOT_LEADER_OR_FOLLOWER``), or the request's ``timeout_ms`` passes
  (``REQUEST_TIMED_OUT``). acks=0 gets no answer, as in Kafka.

Theory of operation
-------------------
Everything runs on the broker's loop thread. The appender calls :meth:`Forwarding.take`
while it drains; the replica service hands PRODUCE requests to :meth:`Forwarding.serve`,
PRODUCE answers and failed requests to :meth:`Forwarding.answered` and
:meth:`Forwarding.failed`, and calls :meth:`Forwarding.poll` at the end of each of its
polls and ticks: that expires what is overdue, sends what may go, re-sends what a
leader change stranded, and answers the waiting acks=-1 produces the high watermark
now covers. Completion results are the ring's (a base offset, or ``-CompletionCode``);
on the wire they travel as :class:`~shmlog.cluster.replication.messages.ErrorCode`
(:func:`wire_error`,
:func:`completion_result`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Callable

import numpy as np

from ...broker.appender import Appender, ForwardedEntry
from ...common import limits
from ...common.errors import ShmlogError
from ...common.internal_topics import INTERNAL_TOPICS
from ...config.cluster import ClusterConfig
from ...record import batch_layout as B
from ...record.records import BatchStatus, check_batch, now_ms, offset_span
from ...shm.completion import CompletionCode
from ...zmq_replication import ReceivedRequest, ReceivedResponse, ReplicationEndpoint, RequestFailed
from ..zk.paths import NO_LEADER
from .messages import (
    ErrorCode,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceResponsePartition,
)
from .partition import PartitionReplica, Role

log = logging.getLogger("shmlog.broker")

__all__ = ["Forwarding", "ProducePurgatory", "HeldBatch", "TransactionalIds", "append_as_leader",
           "wire_error", "completion_result", "transactional_producer", "RETRIABLE_ERRORS"]

# What a ring's refusal is called on the wire (Kafka's Errors for the same refusal).
_WIRE_ERRORS = {
    CompletionCode.UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    CompletionCode.RECORD_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    CompletionCode.STORAGE_ERROR: ErrorCode.KAFKA_STORAGE_ERROR,
    CompletionCode.RESOURCE_LIMIT: ErrorCode.KAFKA_STORAGE_ERROR,
    CompletionCode.OUT_OF_ORDER_SEQUENCE: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    # Kafka's INVALID_TOPIC_EXCEPTION is not among the replication codes: a PRODUCE to
    # an internal topic is an invalid request (a follower never forwards one).
    CompletionCode.INTERNAL_TOPIC: ErrorCode.INVALID_REQUEST,
    CompletionCode.INVALID_PRODUCER_EPOCH: ErrorCode.INVALID_PRODUCER_EPOCH,
    CompletionCode.NOT_ENOUGH_REPLICAS: ErrorCode.NOT_ENOUGH_REPLICAS,
    CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    CompletionCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_LEADER_OR_FOLLOWER,
    CompletionCode.REQUEST_TIMED_OUT: ErrorCode.REQUEST_TIMED_OUT,
    CompletionCode.INVALID_TXN_STATE: ErrorCode.INVALID_TXN_STATE,
    CompletionCode.CONTROL_FROM_PRODUCER: ErrorCode.INVALID_RECORD,
}
_COMPLETION_CODES = {error: code for code, error in _WIRE_ERRORS.items()}
# A limit of the leader's process is a storage error on the wire, as in Kafka.
_COMPLETION_CODES[ErrorCode.KAFKA_STORAGE_ERROR] = CompletionCode.STORAGE_ERROR
# A batch the leader found invalid (this broker checked it, so only what needs the
# leader's partition, such as a zstd batch's records, gets here): Kafka's two codes.
_COMPLETION_CODES[ErrorCode.CORRUPT_MESSAGE] = BatchStatus.BAD_CRC
_COMPLETION_CODES[ErrorCode.INVALID_RECORD] = BatchStatus.BAD_RECORD

# Answers after which the same batch is sent again (Kafka's RetriableException
# subclasses among them): the leader moved, does not host the partition yet, or did
# not see the batch committed in time (a re-send is deduped).
RETRIABLE_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_SERVER_ERROR})

# An answer to a produce: (error, base offset or -1, LogAppendTime stamp or -1).
Answer = Callable[[ErrorCode, int, int], None]


def transactional_producer(batch: np.ndarray) -> tuple[int, int] | None:
    """(producer id, epoch) of a transactional batch, None for any other."""
    if batch.size < B.HEADER_LENGTH:
        return None
    header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0]
    if not header["attributes"] & B.TRANSACTIONAL_BIT:
        return None
    return int(header["producer_id"]), int(header["producer_epoch"])


class TransactionalIds:
    """The transactional ids of producer ids this broker learned (see
    ``cluster.transactions``), the oldest forgotten beyond
    ``limits.TRANSACTIONAL_IDS_REMEMBERED_MAX``."""

    def __init__(self):
        self._ids: dict[int, str] = {}

    def learn(self, producer_id: int, transactional_id: str) -> None:
        self._ids.pop(producer_id, None)
        self._ids[producer_id] = transactional_id
        if len(self._ids) > limits.TRANSACTIONAL_IDS_REMEMBERED_MAX:
            del self._ids[next(iter(self._ids))]

    def get(self, producer_id: int) -> str:
        """The producer's transactional id, "" when not known."""
        return self._ids.get(producer_id, "")


@dataclasses.dataclass
class HeldBatch:
    """A transactional batch for a partition this broker leads, held while the
    coordinator verifies its partition (``Appender.set_transaction_verifier``):
    :meth:`Forwarding.append_held` appends it as it would have been, or
    :meth:`Forwarding.refuse_held` answers it."""
    replica: PartitionReplica
    batch: np.ndarray = dataclasses.field(repr=False)
    acks: int
    deadline: int
    answer: Answer
    split: bool = False                     # a Kafka client's batch stored in pieces


def wire_error(result: int) -> ErrorCode:
    """The wire's name of a refused entry's completion ``result`` (< 0)."""
    assert result < 0, result
    code = -result
    if code < min(CompletionCode):
        return ErrorCode.CORRUPT_MESSAGE if code == BatchStatus.BAD_CRC \
            else ErrorCode.INVALID_RECORD
    if code == CompletionCode.NOT_ONE_BATCH:
        return ErrorCode.INVALID_RECORD
    return _WIRE_ERRORS.get(CompletionCode(code), ErrorCode.UNKNOWN_SERVER_ERROR)


def completion_result(error: ErrorCode, base_offset: int) -> int:
    """The ring's completion result for a leader's answer: the base offset, or
    ``-code`` (an error this broker has no refusal for: ``REQUEST_TIMED_OUT``, the
    outcome unknown)."""
    if error is ErrorCode.NONE:
        return base_offset
    return -int(_COMPLETION_CODES.get(error, CompletionCode.REQUEST_TIMED_OUT))


# --- the leader's side ---------------------------------------------------------------

@dataclasses.dataclass
class _DelayedProduce:
    replica: PartitionReplica
    leader_epoch: int                 # the epoch it was appended under
    last_offset: int
    base_offset: int
    append_time: int
    deadline: int
    answer: Answer


class ProducePurgatory:
    """acks=-1 produces appended and waiting for the high watermark to cover them
    (Kafka's ``DelayedProduce``): see the module's rules."""

    def __init__(self, appender: Appender):
        self.appender = appender
        self._waiting: list[_DelayedProduce] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def park(self, waiting: _DelayedProduce) -> None:
        self._waiting.append(waiting)

    def release(self, now: int) -> None:
        """Answer every waiting produce whose fate is known now."""
        if not self._waiting:
            return
        still = []
        for waiting in self._waiting:
            outcome = self._outcome(waiting, now)
            if outcome is None:
                still.append(waiting)
            else:
                waiting.answer(*outcome)
        self._waiting = still

    def _outcome(self, waiting: _DelayedProduce, now: int) -> tuple | None:
        replica = waiting.replica
        if replica.role is not Role.LEADER or replica.leader_epoch != waiting.leader_epoch:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1
        if self.appender.high_watermark(replica.row) > waiting.last_offset:
            # Kafka's Partition.checkEnoughReplicasReachOffset, as the ring path.
            if self.appender.under_min_isr(replica.row):
                return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, -1, -1
            return ErrorCode.NONE, waiting.base_offset, waiting.append_time
        if now >= waiting.deadline:
            return ErrorCode.REQUEST_TIMED_OUT, -1, -1
        return None

    def next_deadline(self) -> int | None:
        return min((waiting.deadline for waiting in self._waiting), default=None)

    def fail_all(self, error: ErrorCode) -> None:
        waiting, self._waiting = self._waiting, []
        for entry in waiting:
            entry.answer(error, -1, -1)


def append_as_leader(appender: Appender, purgatory: ProducePurgatory,
                     replica: PartitionReplica | None, batch: np.ndarray, acks: int,
                     deadline: int, answer: Answer, *, split: bool = False,
                     hold: Callable[[HeldBatch], None] | None = None) -> None:
    """Append one produced batch to a partition this broker leads and answer it now,
    or once the high watermark covers it (acks=-1); see the module's rules.
    ``split``: ``batch`` may be several batches back to back, one Kafka client's
    batch stored in pieces (``record.kafka_batches``: one producer, sequences running
    on), appended together. A transactional batch the appender holds for its
    coordinator's verification goes to ``hold``."""
    if replica is None:
        answer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
        return
    if replica.role is not Role.LEADER:
        answer(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1)
        return
    if replica.hosted.topic in INTERNAL_TOPICS:
        answer(wire_error(-CompletionCode.INTERNAL_TOPIC), -1, -1)
        return
    row = replica.row
    if acks == -1 and appender.under_min_isr(row):
        answer(ErrorCode.NOT_ENOUGH_REPLICAS, -1, -1)       # nothing appended, no sequence used
        return
    # One batch, as a ring entry must be; a Kafka client's batch stored in pieces is
    # checked whole (its first sequence, its last piece's last: LogAppends.append_batch).
    status, batch_length = check_batch(batch, 0, batch.size, False, False)
    if status != 0 or (batch_length != batch.size and not split):
        answer(wire_error(-(status or CompletionCode.NOT_ONE_BATCH)), -1, -1)
        return
    result, append_time = appender.append(row, batch)
    if result == -CompletionCode.TRANSACTION_VERIFYING and hold is not None:
        hold(HeldBatch(replica, batch, acks, deadline, answer, split))
        return
    if result < 0:
        answer(wire_error(result), -1, -1)
        return
    last_offset = result + offset_span(batch) - 1
    if acks == -1 and appender.high_watermark(row) <= last_offset:
        purgatory.park(_DelayedProduce(replica, replica.leader_epoch, last_offset, result,
                                       append_time, deadline, answer))
        return
    answer(ErrorCode.NONE, result, append_time)


class _ProduceReply:
    """The answer to one PRODUCE request: sent once every partition is answered."""

    def __init__(self, endpoint: ReplicationEndpoint, request: ReceivedRequest):
        self.endpoint = endpoint
        self.request = request
        self.answers: list[ProduceResponsePartition | None] = \
            [None] * len(request.message.body.partitions)

    def answer_for(self, index: int, replica: PartitionReplica | None) -> Answer:
        asked = self.request.message.body.partitions[index]

        def answer(error: ErrorCode, base_offset: int, append_time: int) -> None:
            log_start = replica.log.log_start_offset \
                if replica is not None and error is ErrorCode.NONE else -1
            self.answers[index] = ProduceResponsePartition(
                asked.topic_key, asked.partition, error, base_offset, append_time, log_start)
            if all(entry is not None for entry in self.answers):
                self._send()
        return answer

    def _send(self) -> None:
        try:
            self.endpoint.reply(self.request, ProduceResponse(tuple(self.answers)))
        except ShmlogError as error:
            log.warning("cannot answer a forwarded produce: %s", error)


# --- the follower's side -------------------------------------------------------------

@dataclasses.dataclass
class _Forward:
    entry: ForwardedEntry
    deadline: int
    correlation_id: int | None = None        # in flight
    sent_to: tuple[int, int] = (NO_LEADER, -1)   # (leader, leader epoch) it went to


def _ignore_answer(error: ErrorCode, base_offset: int, append_time: int) -> None:
    """acks=0: Kafka sends no answer."""


class Forwarding:
    """Both sides of forwarding for one broker (see the module's rules).

    Parameters
    ----------
    appender : Appender
        Its forwarder is this object's :meth:`take` until :meth:`close`.
    endpoint : ReplicationEndpoint
    config : ClusterConfig
        ``forward_delivery_timeout_ms``, ``forward_request_timeout_ms``,
        ``replica_socket_timeout_ms``.
    replica_of : callable
        ``(topic_key, partition) -> PartitionReplica | None``: the replicas hosted.
    broker_live : callable
        ``broker_id -> bool``: is that broker registered (a leader to send to)?
    """

    def __init__(self, appender: Appender, endpoint: ReplicationEndpoint, config: ClusterConfig,
                 replica_of: Callable[[tuple[int, int]], PartitionReplica | None],
                 broker_live: Callable[[int], bool]):
        self.appender = appender
        self.endpoint = endpoint
        self.config = config
        self.replica_of = replica_of
        self.broker_live = broker_live
        self.purgatory = ProducePurgatory(appender)
        # (ring, topic key, partition) -> its entries in ring order; the first may be in flight.
        self._queues: dict[tuple[int, int, int], collections.deque[_Forward]] = {}
        self._in_flight: dict[int, tuple[int, int, int]] = {}     # correlation id -> queue
        self._retry_at: dict[tuple[int, int, int], int] = {}
        self.transactional_ids = TransactionalIds()
        # Who holds a transactional batch for its coordinator's verification (set by
        # ``cluster.transactions``; None: the appender's verifier never holds one).
        self.hold: Callable[[HeldBatch], None] | None = None
        appender.set_forwarder(self.take)

    @property
    def pending(self) -> int:
        """Forwarded entries not yet resolved."""
        return sum(len(queue) for queue in self._queues.values())

    def take(self, entry: ForwardedEntry) -> None:
        """The appender's forwarder: queue the entry behind its ring's entries for
        the same partition (sent by :meth:`poll`)."""
        key = (entry.ring, entry.topic_key, entry.partition)
        deadline = now_ms() + self.config.forward_delivery_timeout_ms
        self._queues.setdefault(key, collections.deque()).append(_Forward(entry, deadline))

    # -- the loop's calls ----------------------------------------------------------------
    def poll(self, now: int) -> None:
        """Expire, send, re-send, and answer waiting produces (see the theory)."""
        self.purgatory.release(now)
        for key in list(self._queues):
            self._expire(key, now)
            queue = self._queues.get(key)
            if queue:
                self._advance(key, queue, now)
            else:
                self._queues.pop(key, None)
                self._retry_at.pop(key, None)

    def next_deadline(self) -> int | None:
        deadlines = [queue[0].deadline for queue in self._queues.values() if queue]
        deadlines += [at for key, at in self._retry_at.items()
                      if self._queues.get(key) and self._queues[key][0].correlation_id is None]
        purgatory = self.purgatory.next_deadline()
        if purgatory is not None:
            deadlines.append(purgatory)
        return min(deadlines, default=None)

    def serve(self, request: ReceivedRequest, now: int) -> None:
        """Serve a PRODUCE from a peer (this broker leads its partitions, or says not)."""
        body: Produce = request.message.body
        reply = _ProduceReply(self.endpoint, request)
        for index, asked in enumerate(body.partitions):
            replica = self.replica_of((asked.topic_key, asked.partition))
            answer = reply.answer_for(index, replica) if body.acks != 0 else _ignore_answer
            producer = transactional_producer(asked.records) if asked.transactional_id else None
            if producer is not None:
                self.transactional_ids.learn(producer[0], asked.transactional_id)
            append_as_leader(self.appender, self.purgatory, replica, asked.records, body.acks,
                             now + body.timeout_ms, answer, hold=self.hold)

    def held(self, entry: ForwardedEntry) -> HeldBatch | None:
        """A ring's entry the appender held for verification, as a held batch whose
        answer completes it (as a forwarded entry's); None when its partition went."""
        replica = self.replica_of((entry.topic_key, entry.partition))
        if replica is None:
            self._resolve(entry, -CompletionCode.UNKNOWN_PARTITION, -1)
            return None

        def answer(error: ErrorCode, base_offset: int, append_time: int) -> None:
            self._resolve(entry, completion_result(error, base_offset), append_time)
        return HeldBatch(replica, entry.batch, -1 if entry.awaits_high_watermark else 1,
                         now_ms() + self.config.forward_delivery_timeout_ms, answer)

    def append_held(self, held: HeldBatch) -> None:
        """Append a held batch whose verification ended (it may be held again)."""
        append_as_leader(self.appender, self.purgatory, held.replica, held.batch, held.acks,
                         held.deadline, held.answer, split=held.split, hold=self.hold)

    @staticmethod
    def refuse_held(held: HeldBatch, code: CompletionCode) -> None:
        held.answer(wire_error(-code), -1, -1)

    def answered(self, event: ReceivedResponse, now: int) -> bool:
        """Take the answer to a forwarded PRODUCE; False when it is not one (a
        fetcher's), True when it was (even one come too late to matter)."""
        key = self._in_flight.pop(event.message.correlation_id, None)
        body = event.message.body
        if key is None:
            return isinstance(body, ProduceResponse)
        queue = self._queues.get(key)
        if not queue or queue[0].correlation_id != event.message.correlation_id:
            return True
        head = queue[0]
        head.correlation_id = None
        answer = next((entry for entry in getattr(body, "partitions", ())
                       if (entry.topic_key, entry.partition) == key[1:]), None)
        if answer is None or answer.error in RETRIABLE_ERRORS:
            error = answer.error if answer is not None else getattr(body, "error", None)
            log.debug("forwarded batch for %s: broker %d answered %s; sending it again", key[1:],
                      event.peer_id, error)
            self._retry_at[key] = now + limits.FORWARD_RETRY_BACKOFF_MS
            return True
        queue.popleft()
        self._resolve(head.entry, completion_result(answer.error, answer.base_offset),
                      answer.log_append_time_ms)
        return True

    def failed(self, event: RequestFailed, now: int) -> bool:
        """A forwarded PRODUCE got no answer: send it again after the backoff. False
        when the request was not a forwarded PRODUCE."""
        key = self._in_flight.pop(event.correlation_id, None)
        if key is None:
            return False
        queue = self._queues.get(key)
        if queue and queue[0].correlation_id == event.correlation_id:
            queue[0].correlation_id = None
            self._retry_at[key] = now + limits.FORWARD_RETRY_BACKOFF_MS
        return True

    def close(self) -> None:
        """Stop forwarding: what is unanswered completes with ``REQUEST_TIMED_OUT``
        (it may or may not be in the leader's log), waiting produces with
        ``NOT_LEADER_OR_FOLLOWER``; the appender refuses from now on."""
        self.appender.set_forwarder(None)
        self.purgatory.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        for queue in self._queues.values():
            for forward in queue:
                self._resolve(forward.entry, -CompletionCode.REQUEST_TIMED_OUT, -1)
        self._queues.clear()
        self._in_flight.clear()

    # -- the follower's steps ---------------------------------------------------------------
    def _expire(self, key: tuple[int, int, int], now: int) -> None:
        queue = self._queues[key]
        while queue and queue[0].deadline <= now:     # taken in order: deadlines in order
            forward = queue.popleft()
            if forward.correlation_id is not None:
                self._in_flight.pop(forward.correlation_id, None)
            log.warning("a forwarded batch for %s got no answer within %d ms", key[1:],
                        self.config.forward_delivery_timeout_ms)
            self._resolve(forward.entry, -CompletionCode.REQUEST_TIMED_OUT, -1)

    def _advance(self, key: tuple[int, int, int], queue: collections.deque, now: int) -> None:
        """Send the queue's first batch if it may go now, or append the queue here."""
        head = queue[0]
        replica = self.replica_of(key[1:])
        if replica is None:                       # the topic went
            self._resolve_all(key, -CompletionCode.UNKNOWN_PARTITION)
            return
        if replica.role is Role.LEADER:
            self._append_here(key, replica)
            return
        target = (replica.leader_id, replica.leader_epoch)
        if head.correlation_id is not None:
            if target == head.sent_to:
                return                            # in flight to the current leader
            log.info("%r: leader now %d (epoch %d): sending the forwarded batch again", replica,
                     *target)
            self._in_flight.pop(head.correlation_id, None)
            head.correlation_id = None
        elif now < self._retry_at.get(key, 0) and target == head.sent_to:
            return                                # backing off (a new leader is tried at once)
        if target[0] == NO_LEADER or target[0] == self.config.broker_id \
                or not self.broker_live(target[0]):
            return                                # no leader yet: wait within the bound
        self._send(key, head, target, now)

    def _send(self, key: tuple[int, int, int], head: _Forward, target: tuple[int, int],
              now: int) -> None:
        entry = head.entry
        timeout_ms = max(1, min(self.config.forward_request_timeout_ms, head.deadline - now))
        producer = transactional_producer(entry.batch)
        transactional_id = self.transactional_ids.get(producer[0]) if producer else ""
        body = Produce(-1 if entry.awaits_high_watermark else 1, timeout_ms,
                       (ProducePartition(entry.topic_key, entry.partition, entry.batch,
                                         transactional_id),))
        try:
            correlation_id = self.endpoint.request(target[0], body, min(
                timeout_ms + self.config.replica_socket_timeout_ms, limits.CLIENT_WAIT_MS_MAX))
        except ShmlogError as error:
            log.warning("cannot forward a batch to broker %d: %s", target[0], error)
            self._retry_at[key] = now + limits.FORWARD_RETRY_BACKOFF_MS
            return
        head.correlation_id, head.sent_to = correlation_id, target
        self._in_flight[correlation_id] = key

    def _append_here(self, key: tuple[int, int, int], replica: PartitionReplica) -> None:
        """This broker leads the partition now: append the queue in order."""
        queue = self._queues.pop(key)
        self._retry_at.pop(key, None)
        for forward in queue:
            if forward.correlation_id is not None:
                self._in_flight.pop(forward.correlation_id, None)
            entry = forward.entry

            def answer(error: ErrorCode, base_offset: int, append_time: int,
                       entry: ForwardedEntry = entry) -> None:
                self._resolve(entry, completion_result(error, base_offset), append_time)
            append_as_leader(self.appender, self.purgatory, replica, entry.batch,
                             -1 if entry.awaits_high_watermark else 1, forward.deadline, answer,
                             hold=self.hold)

    def _resolve_all(self, key: tuple[int, int, int], result: int) -> None:
        for forward in self._queues.pop(key):
            if forward.correlation_id is not None:
                self._in_flight.pop(forward.correlation_id, None)
            self._resolve(forward.entry, result, -1)
        self._retry_at.pop(key, None)

    def _resolve(self, entry: ForwardedEntry, result: int, append_time: int) -> None:
        """Complete the entry in its ring, unless its ring is gone (the slot reused)."""
        if self.appender.ring_at(entry.ring) is entry.source:
            self.appender.resolve_forwarded(entry.ring, entry.number, result, append_time)
