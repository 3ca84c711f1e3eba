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
* **Fetch sessions** (KIP-227, ``fetch_sessions``): a follower's fetch opens a
  session (epoch 0) or continues one; it is served its named partitions and the
  session's news only (appended, high watermark or log start moved past what was
  sent, leadership changed), and answered only those that carry something. A
  caught-up follower's idle partitions keep their caught-up time through its last
  session fetch (marked as the partition is next appended to: ``rules``'
  ``FollowerState.session_fetched``), so the ISR holds as when every fetch named
  them. A session fetch with nothing to return waits until the session has news
  or ``max_wait_ms`` passes: an idle long poll costs nothing per partition.
  A fetch outside a session (epoch -1) is served as below.
* **Fetches that find nothing wait** (``purgatory``) until a partition's log end or
  high watermark moves past what the follower has, its leadership changes, or
  ``max_wait_ms`` passes; they are answered then, from the log as it is then.
* **A suspended ZooKeeper session** changes nothing here: the high watermark moves
  with the ISR held (``partition``'s rules say why that is safe), so acks=all is
  acknowledged and followers' readers see new records through a ZooKeeper outage.

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
from .fetch_sessions import FetchSession, FetchSessionCache
from .hosted_replicas import HostedReplicas, partition_name
from .isr_manager import IsrManager
from .messages import (
    INITIAL_SESSION_EPOCH,
    NO_SESSION,
    SESSIONLESS_EPOCH,
    EpochEnd,
    EpochEndResponse,
    EpochEndResponsePartition,
    Error,
    ErrorCode,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchResponsePartition,
)
from .partition import PartitionReplica, Role
from .purgatory import FetchPurgatory, partition_ready
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["FetchServing"]


@dataclasses.dataclass
class _WaitingFetch:
    request: ReceivedRequest
    deadline: int
    session: FetchSession | None = None


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
        self.sessions = FetchSessionCache()

    def next_deadline(self) -> int | None:
        """When the first parked fetch's wait ends, or None."""
        return self._purgatory.next_deadline_ms()

    def expire(self, now: int) -> None:
        """Answer the parked fetches whose wait ended; evict the sessions idle too long."""
        for key in self._purgatory.expire(now):
            self._answer_waiting(key)
        for session in self.sessions.evict_idle(now):
            self._drop_parked(session)

    # -- what moves a parked fetch ------------------------------------------------------------
    def leader_appended(self, replica: PartitionReplica, log_end_offset: int, now: int) -> None:
        """The drain appended to a partition this broker leads."""
        for session in self.sessions.holding(replica.key):
            entry = session.partitions[replica.key]
            if not entry.appended:        # the first append since its follower was served
                entry.appended = True
                state = replica.leader.followers.get(session.peer) or \
                    replica.leader.observers.get(session.peer)
                if state is not None:
                    state.session_fetched(entry.request.fetch_offset, session.last_used_ms)
            self._news(session, replica.key)
        self.maybe_advance_high_watermark(replica, now)
        for key in self._purgatory.log_end_moved(replica.key, log_end_offset):
            self._answer_waiting(key)

    def maybe_advance_high_watermark(self, replica: PartitionReplica, now: int) -> None:
        """Move the leader's high watermark if it may; wake readers and fetches then."""
        high_watermark = replica.maybe_advance_high_watermark(now)
        if high_watermark is not None:
            self._high_watermark_moved(replica, high_watermark)

    def _high_watermark_moved(self, replica: PartitionReplica, high_watermark: int) -> None:
        self._wake_consumers()
        for session in self.sessions.holding(replica.key):
            if high_watermark > session.partitions[replica.key].high_watermark_sent:
                self._news(session, replica.key)
        for key in self._purgatory.high_watermark_moved(replica.key, high_watermark):
            self._answer_waiting(key)

    def log_start_moved(self, replica: PartitionReplica) -> None:
        """The leader's log start moved (DeleteRecords): its followers follow it."""
        for session in self.sessions.holding(replica.key):
            if replica.log.log_start_offset != session.partitions[replica.key].log_start_sent:
                self._news(session, replica.key)

    def isr_changed(self, replica: PartitionReplica) -> None:
        """The partition's ISR changed: the sessions of its assigned replicas now
        outside it serve it again, so they may join again when caught up (an idle
        partition's session would otherwise never look at it)."""
        if replica.role is not Role.LEADER:
            return
        for session in self.sessions.holding(replica.key):
            if session.peer in replica.replicas and session.peer not in replica.leader.isr:
                self._news(session, replica.key)

    def leadership_changed(self, replica: PartitionReplica) -> None:
        """Answer every fetch parked on the replica: its answer now carries an error."""
        for session in self.sessions.holding(replica.key):
            self._news(session, replica.key)
        for key in self._purgatory.leadership_changed(replica.key):
            self._answer_waiting(key)

    def _news(self, session: FetchSession, key) -> None:
        if self.sessions.mark(session, key):
            parked = session.parked
            self._purgatory.remove(parked)
            self._answer_waiting(parked)

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
        if fetch.session_epoch == SESSIONLESS_EPOCH:
            self._serve_sessionless(event, fetch, now)
            return
        session = self._session_for(event, fetch, now)
        if session is None:
            return
        self._drop_parked(session)        # a peer's earlier fetch it no longer waits for
        for key in fetch.forgotten:
            self.sessions.remove_partition(session, key)
        named = {}
        for request in fetch.partitions:
            self.sessions.set_partition(session, request)
            named[(request.topic_key, request.partition)] = None
        answers = self._serve_session(session, fetch, named, now)
        if answers or fetch.max_wait_ms == 0:
            self.endpoint.reply(event, FetchResponse(tuple(answers), ErrorCode.NONE,
                                                     session.session_id))
            return
        key = (event.route, event.message.correlation_id)
        self._waiting[key] = _WaitingFetch(event, now + fetch.max_wait_ms, session)
        self._purgatory.park(key, now + fetch.max_wait_ms, {})
        session.parked = key

    def _session_for(self, event: ReceivedRequest, fetch: Fetch, now: int
                     ) -> FetchSession | None:
        """The session a fetch opens or continues; None when its session error was
        answered."""
        peer = event.message.sender_broker_id
        if fetch.session_epoch == INITIAL_SESSION_EPOCH:
            session, closed = self.sessions.open(peer, now)
            for old in closed:
                self._drop_parked(old)
            return session
        session, error = self.sessions.lookup(fetch.session_id, fetch.session_epoch, peer, now)
        if session is None:
            self.endpoint.reply(event, FetchResponse((), error, NO_SESSION))
        return session

    def _drop_parked(self, session: FetchSession) -> None:
        """A closed session's parked fetch: its follower gave up on it (it opened
        another session), so it is dropped unanswered."""
        if session.parked is not None:
            self._purgatory.remove(session.parked)
            self._waiting.pop(session.parked, None)
            session.parked = None

    def _serve_session(self, session: FetchSession, fetch: Fetch, named: dict, now: int
                       ) -> list[FetchResponsePartition]:
        """Serve a session's named partitions, then its news: the answers that carry
        something (records, an error, a moved high watermark or log start). A
        partition with records it could not send (the bytes ran out) keeps its news;
        one answered with an error leaves the session (its follower names it again
        when it asks again)."""
        peer, budget, answers = session.peer, fetch.max_bytes, []
        for key in list(named) + [key for key in session.news if key not in named]:
            entry = session.partitions.get(key)
            if entry is None:
                session.news.pop(key, None)
                continue
            # Its news is taken before it is served: what serving it moves (the high
            # watermark, after its answer was built) is news again.
            session.news.pop(key, None)
            answer, has_records = self._serve_partition(peer, fetch.observer, entry.request,
                                                        budget, now)
            entry.appended = False
            if has_records:
                budget -= answer.records.size
            if answer.error is ErrorCode.NONE and (
                    not has_records and entry.request.fetch_offset < answer.log_end_offset
                    or self._joining(key, peer)):
                session.news[key] = None
            if answer.error is not ErrorCode.NONE:
                self.sessions.remove_partition(session, key)
            elif not has_records and answer.high_watermark == entry.high_watermark_sent and \
                    answer.log_start_offset == entry.log_start_sent:
                continue
            entry.high_watermark_sent = answer.high_watermark
            entry.log_start_sent = answer.log_start_offset
            answers.append(answer)
        return answers

    def _joining(self, key, peer: int) -> bool:
        """Is ``peer`` an assigned replica outside the partition's ISR? Its session
        serves the partition every fetch until it joins (an expansion refused while
        another ISR change was in flight is asked again)."""
        replica = self.hosted.by_key(key)
        return replica is not None and peer in replica.replicas and \
            peer not in replica.leader.isr

    def _serve_partition(self, peer: int, observer: bool, request: FetchPartition, budget: int,
                         now: int) -> tuple[FetchResponsePartition, bool]:
        """One partition of a fetch: its answer, and whether it carries records."""
        replica = self.hosted.by_key((request.topic_key, request.partition))
        if replica is None:
            return _unknown_partition(request), False
        in_sync = peer in replica.leader.isr
        limit = self.throttle.leader_budget(replica.hosted.topic, replica.hosted.partition,
                                            in_sync, budget, now)
        high_watermark = replica.appender.high_watermark(replica.row)
        answer, has_records = replica.serve_fetch(peer, observer, request, limit, now)
        if has_records:
            self.throttle.leader_sent(replica.hosted.topic, replica.hosted.partition,
                                      in_sync, answer.records.size, now)
        if answer.error is ErrorCode.NONE:
            if answer.high_watermark > high_watermark:     # the fetch itself moved it
                self._high_watermark_moved(replica, answer.high_watermark)
            self.isr.maybe_expand(replica, peer, now)
            self.maybe_advance_high_watermark(replica, now)
        return answer, has_records

    def _serve_sessionless(self, event: ReceivedRequest, fetch: Fetch, now: int) -> None:
        """A full fetch outside any session: every partition served, parked on each."""
        peer = event.message.sender_broker_id
        budget = fetch.max_bytes
        answers, found, waits_for = [], False, {}
        for request in fetch.partitions:
            answer, has_records = self._serve_partition(peer, fetch.observer, request, budget,
                                                        now)
            if has_records:
                budget -= answer.records.size
            key = (request.topic_key, request.partition)
            sent = self._high_watermark_sent.get((peer, key), -1)
            found |= partition_ready(error=answer.error, fetch_offset=request.fetch_offset,
                                     log_end_offset=answer.log_end_offset,
                                     high_watermark=answer.high_watermark,
                                     high_watermark_last_sent=sent)
            waits_for[key] = (request.fetch_offset, sent)
            answers.append(answer)
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
        session = waiting.session
        if session is not None:               # its news, served now
            session.parked = None
            answers = self._serve_session(session, fetch, {}, now_ms())
            self.endpoint.reply(waiting.request, FetchResponse(tuple(answers), ErrorCode.NONE,
                                                               session.session_id))
            return
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
