"""The leader's side of replication: serving its followers' FETCH and EPOCH_END, with
the fetches that wait for data (Kafka's ``ReplicaManager.fetchMessages`` and
``lastOffsetForLeaderEpoch``, and the ``DelayedFetch`` purgatory).

Rules
-----
* **A fetch from an older incarnation** of its broker than the one registered
  (KIP-380's broker epoch) is answered ``STALE_BROKER_EPOCH``, whole.
* **Each partition of a fetch** is served by its replica
  (``PartitionReplica.serve_fetch``: the checks, the follower's fetch state, the
  read); a partition not hosted is ``UNKNOWN_TOPIC_OR_PARTITION``. A follower whose
  fetch was served may join the ISR (``isr_manager``), and the high watermark may
  move.
* **The response's bytes** are bounded by the fetch's ``max_bytes``, across its
  partitions in their order; a throttled partition's read is bounded by the leader
  bucket for a replica out of the ISR (``throttle``).
* **Fetches that find nothing wait** (``purgatory``) until a partition's log end or
  high watermark moves past what the follower has, its leadership changes, or
  ``max_wait_ms`` passes; they are answered then, from the log as it is then.
* **A suspended ZooKeeper session** moves no high watermark (this broker may have
  been replaced).

Theory of operation
-------------------
The dispatch hands this each FETCH and EPOCH_END; the replica service tells it of
the partitions the drain appended to (:meth:`FetchServing.leader_appended`) and of
the time (:meth:`FetchServing.expire`), and the hosted replicas of the states
applied (it is their ``LeadershipListener``). Each of those may fire parked fetches,
which are answered at once. The high watermark each follower was last sent is kept,
so a fetch is answered as soon as it has a newer one to carry.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from ...record.records import now_ms
from ...zmq_replication import ReceivedRequest, ReplicationEndpoint
from .hosted_replicas import HostedReplicas, partition_name
from .isr_manager import IsrManager
from .messages import (
    EpochEnd,
    EpochEndResponse,
    EpochEndResponsePartition,
    Error,
    ErrorCode,
    Fetch,
    FetchResponse,
    FetchResponsePartition,
)
from .partition import PartitionReplica
from .purgatory import FetchPurgatory, partition_ready
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["FetchServing"]


@dataclasses.dataclass
class _WaitingFetch:
    request: ReceivedRequest
    deadline: int


class FetchServing:
    """The leader's serving of fetches (see the module's rules).

    Parameters
    ----------
    hosted : HostedReplicas
    endpoint : ReplicationEndpoint
    throttle : ReplicationThrottle
    isr : IsrManager
        Told of each follower's fetch served, so it may join the ISR.
    wake_consumers : callable
        Rings the consumer doorbell: a high watermark moved.
    """

    def __init__(self, hosted: HostedReplicas, endpoint: ReplicationEndpoint,
                 throttle: ReplicationThrottle, isr: IsrManager,
                 wake_consumers: Callable[[], None]):
        self.hosted = hosted
        self.endpoint = endpoint
        self.throttle = throttle
        self.isr = isr
        self._wake_consumers = wake_consumers
        self._purgatory = FetchPurgatory()
        self._waiting: dict[Any, _WaitingFetch] = {}
        self._high_watermark_sent: dict[tuple[int, tuple[int, int]], int] = {}

    def next_deadline(self) -> int | None:
        """When the first parked fetch's wait ends, or None."""
        return self._purgatory.next_deadline_ms()

    def expire(self, now: int) -> None:
        """Answer the parked fetches whose wait ended."""
        for key in self._purgatory.expire(now):
            self._answer_waiting(key)

    # -- what moves a parked fetch ------------------------------------------------------------
    def leader_appended(self, replica: PartitionReplica, log_end_offset: int, now: int) -> None:
        """The drain appended to a partition this broker leads."""
        self.maybe_advance_high_watermark(replica, now)
        for key in self._purgatory.log_end_moved(replica.key, log_end_offset):
            self._answer_waiting(key)

    def maybe_advance_high_watermark(self, replica: PartitionReplica, now: int) -> None:
        """Move the leader's high watermark if it may; wake readers and fetches then."""
        high_watermark = replica.maybe_advance_high_watermark(now, self.hosted.suspended)
        if high_watermark is not None:
            self._wake_consumers()
            for key in self._purgatory.high_watermark_moved(replica.key, high_watermark):
                self._answer_waiting(key)

    def leadership_changed(self, replica: PartitionReplica) -> None:
        """Answer every fetch parked on the replica: its answer now carries an error."""
        for key in self._purgatory.leadership_changed(replica.key):
            self._answer_waiting(key)

    # -- requests from followers ----------------------------------------------------------------
    def _stale_sender(self, event: ReceivedRequest) -> bool:
        """Is the request from an incarnation of its broker older than the one
        registered (KIP-380's broker epoch)?"""
        message = event.message
        known = self.hosted.view.brokers.get(message.sender_broker_id)
        return known is not None and message.sender_broker_epoch < known.epoch

    def serve_fetch(self, event: ReceivedRequest, fetch: Fetch, now: int) -> None:
        """Answer a FETCH, at once or when it has something to return."""
        if self._stale_sender(event):
            self.endpoint.reply(event, Error(ErrorCode.STALE_BROKER_EPOCH,
                                             "a newer incarnation of this broker is registered"))
            return
        peer = event.message.sender_broker_id
        budget = fetch.max_bytes
        answers, found, waits_for = [], False, {}
        for request in fetch.partitions:
            replica = self.hosted.by_key((request.topic_key, request.partition))
            if replica is None:
                answers.append(_unknown_partition(request))
                found = True
                continue
            in_sync = peer in replica.leader.isr
            limit = self.throttle.leader_budget(replica.hosted.topic, replica.hosted.partition,
                                                in_sync, budget, now)
            answer, has_records = replica.serve_fetch(peer, fetch.observer, request, limit, now,
                                                      self.hosted.suspended)
            if has_records:
                budget -= answer.records.size
                self.throttle.leader_sent(replica.hosted.topic, replica.hosted.partition,
                                          in_sync, answer.records.size, now)
            sent = self._high_watermark_sent.get((peer, replica.key), -1)
            found |= partition_ready(error=answer.error, fetch_offset=request.fetch_offset,
                                     log_end_offset=answer.log_end_offset,
                                     high_watermark=answer.high_watermark,
                                     high_watermark_last_sent=sent)
            waits_for[replica.key] = (request.fetch_offset, sent)
            answers.append(answer)
            if answer.error is ErrorCode.NONE:
                self.isr.maybe_expand(replica, peer, now)
                self.maybe_advance_high_watermark(replica, now)
        if found or fetch.max_wait_ms == 0:
            self._reply_fetch(event, answers)
            return
        key = (event.route, event.message.correlation_id)
        self._waiting[key] = _WaitingFetch(event, now + fetch.max_wait_ms)
        self._purgatory.park(key, now + fetch.max_wait_ms, waits_for)

    def _answer_waiting(self, key) -> None:
        waiting = self._waiting.pop(key, None)
        if waiting is None:
            return
        fetch = waiting.request.message.body
        budget, answers = fetch.max_bytes, []
        peer, now = waiting.request.message.sender_broker_id, now_ms()
        for request in fetch.partitions:
            replica = self.hosted.by_key((request.topic_key, request.partition))
            if replica is None:
                answers.append(_unknown_partition(request))
                continue
            in_sync = peer in replica.leader.isr
            topic, partition = partition_name(replica)
            answer = replica.answer_parked_fetch(
                request, self.throttle.leader_budget(topic, partition, in_sync, budget, now))
            if answer.records is not None:
                budget -= answer.records.size
                self.throttle.leader_sent(topic, partition, in_sync, answer.records.size, now)
            answers.append(answer)
        self._reply_fetch(waiting.request, answers)

    def _reply_fetch(self, event: ReceivedRequest, answers: list) -> None:
        peer = event.message.sender_broker_id
        for answer in answers:
            if answer.error is ErrorCode.NONE:
                self._high_watermark_sent[(peer, (answer.topic_key, answer.partition))] = \
                    answer.high_watermark
        self.endpoint.reply(event, FetchResponse(tuple(answers)))

    def serve_epoch_end(self, event: ReceivedRequest, request: EpochEnd) -> None:
        """Answer an EPOCH_END: where each asked epoch ends in this leader's log."""
        answers = []
        for asked in request.partitions:
            replica = self.hosted.by_key((asked.topic_key, asked.partition))
            if replica is None:
                answers.append(EpochEndResponsePartition(
                    asked.topic_key, asked.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1))
                continue
            error, epoch, end = replica.end_offset_for(event.message.sender_broker_id,
                                                       asked.current_leader_epoch,
                                                       asked.leader_epoch)
            answers.append(EpochEndResponsePartition(asked.topic_key, asked.partition, error,
                                                     epoch, end))
        self.endpoint.reply(event, EpochEndResponse(tuple(answers)))


def _unknown_partition(request) -> FetchResponsePartition:
    return FetchResponsePartition(request.topic_key, request.partition,
                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1)
