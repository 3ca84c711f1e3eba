"""The follower's side of replication: fetching from each leader, appending what it
sends, and truncating by leader epoch first (Kafka's ``ReplicaFetcherManager`` and
its ``ReplicaFetcherThread`` per source broker).

Rules
-----
* **Followers pull.** One request in flight per leader: an EPOCH_END while any of
  its partitions truncates, else a FETCH of every fetching partition (Kafka's
  fetcher thread per source broker). The next goes out as soon as the answer is
  applied, so acks=all costs one round trip plus the follower's append.
* **Fetch sessions** (KIP-227): the first FETCH to a leader opens a session and
  names every partition; the next ones name only the partitions added or whose
  request changed, and list those dropped (``forgotten``). A session error
  (``FETCH_SESSION_ID_NOT_FOUND``, ``INVALID_FETCH_SESSION_EPOCH``), a failed
  request or a partition answered with an error makes the next fetch name it (all
  of them after a session error or failure) again. While a session is quiet (its
  last answer empty, every partition fetching, none throttled) the next fetch is
  sent without looking through the partitions, but for a look every
  ``limits.FETCH_SESSION_RESCAN_MS`` and after any change of the replicas hosted,
  their roles or leaders (``HostedReplicas.generation``), one made while its fetch
  was in flight included: a partition followed from then is named by its next fetch,
  else its leader would learn no position for it and drop it from the ISR.
* **An answer is applied only if it is still wanted**: the replica follows the same
  leader at the same epoch, in the phase it asked in, from the log end it asked
  from (Kafka's fetcher applies a partition's data only at the epoch and fetch
  offset it asked with); otherwise it is dropped, and the next request asks again.
* **A failed request** (no answer in time, the peer unknown, an ERROR) backs its
  leader off for ``limits.FETCH_BACKOFF_MS``.
* **Moving replicas are throttled** (``throttle``): a throttled partition out of the
  ISR is asked for no more than the follower bucket holds, and left out of the
  fetch while it is empty (the service waking when it refills).
* **While this broker shuts down** (:meth:`ReplicaFetcher.stop_following`, called
  by its controlled shutdown) the partitions it only followed when the shutdown
  began are fetched no more (Kafka's controller sends the shutting broker
  StopReplica for those), at once rather than once the controller took it out of
  their ISR: a fetch landing after that removal would make the leader count it as
  caught up again, and then wait for it through ``replica.lag.time.max.ms``. Their
  high watermarks wait for it until the controller removes it (its reaction
  time). The partitions it led go on being fetched from their new leaders, as in
  Kafka (it is their follower): the acks=all entries parked on it complete when
  its follower high watermark covers them (design §4.4).

Theory of operation
-------------------
:meth:`ReplicaFetcher.send_requests` runs every loop turn and tick: it sends each
leader without a request in flight the next one, for its replicas that may ask.
The replicas followed are grouped by leader once per change of roles
(``HostedReplicas.generation``), not every turn, and only a leader's group with
no request in flight is looked through: with thousands of partitions a turn
costs per leader, not per partition. The dispatch hands back each answer
(:meth:`ReplicaFetcher.answered`) or failure (:meth:`ReplicaFetcher.failed`) that
names a request in flight; the replicas apply it (``PartitionReplica.apply_fetched``,
``take_step``), and the next requests go out at once.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from ...common import limits
from ...common.errors import ShmlogError
from ...config.cluster import ClusterConfig
from ...record.records import now_ms
from ...zmq_replication import ReceivedResponse, ReplicationEndpoint
from .hosted_replicas import HostedReplicas, partition_name
from .messages import (
    INITIAL_SESSION_EPOCH,
    NO_SESSION,
    EpochEnd,
    EpochEndPartition,
    EpochEndResponse,
    ErrorCode,
    Fetch,
    FetchResponse,
)
from .partition import FetchPhase, PartitionReplica, Role
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["ReplicaFetcher"]


@dataclasses.dataclass
class _Fetcher:
    """The requests to one leader: at most one in flight."""
    leader_id: int
    in_flight: int | None = None          # its correlation id
    partitions: tuple = ()                # what it asked: (replica, leader epoch, offset)
    retry_at: int = 0
    # Its fetch session (KIP-227): the id, the epoch of the next fetch, and each
    # partition's request as the leader holds it; the requests of the fetch in flight.
    session_id: int = NO_SESSION
    session_epoch: int = INITIAL_SESSION_EPOCH
    sent: dict = dataclasses.field(default_factory=dict)
    pending: dict | None = None
    # Quiet: its last full look found every partition fetching unthrottled and its
    # last answer was empty, so the next fetch names nothing (until ``rescan_at``).
    quiet: bool = False
    rescan_at: int = 0
    observer: bool = False
    # The hosted generation its last full look saw: a quiet fetch is sent only while
    # it is current (the replicas followed, their roles and leaders unchanged since).
    generation: int = -1

    def reset_session(self) -> None:
        """The next fetch opens a new session, in full (the leader forgot this one,
        or an answer was lost so its epoch is unknown)."""
        self.session_id, self.session_epoch, self.sent, self.pending = \
            NO_SESSION, INITIAL_SESSION_EPOCH, {}, None
        self.quiet = False

    def session_fetch(self, requests: tuple) -> tuple[tuple, int, int, tuple]:
        """The next fetch's (partitions named, session id, epoch, forgotten): in a
        session only the requests that changed or were added, and those dropped."""
        current = {(request.topic_key, request.partition): request for request in requests}
        self.pending = current
        if self.session_id == NO_SESSION:
            return requests, NO_SESSION, INITIAL_SESSION_EPOCH, ()
        sent = self.sent
        named = tuple(request for key, request in current.items() if sent.get(key) != request)
        forgotten = tuple(key for key in sent if key not in current)
        return named, self.session_id, self.session_epoch, forgotten

    def session_answered(self, session_id: int) -> None:
        """The leader took the fetch in flight: the session holds its requests."""
        if self.pending is None:
            return
        if session_id == NO_SESSION:
            self.reset_session()
            return
        epoch = INITIAL_SESSION_EPOCH if self.session_id != session_id else self.session_epoch
        self.session_id, self.session_epoch = session_id, epoch + 1
        self.sent, self.pending = self.pending, None


class ReplicaFetcher:
    """Fetching for every partition this broker follows or observes (see the
    module's rules).

    Parameters
    ----------
    hosted : HostedReplicas
    endpoint : ReplicationEndpoint
    config : ClusterConfig
    throttle : ReplicationThrottle
    wake_consumers : callable
        Rings the consumer doorbell: a follower's high watermark moved.
    """

    def __init__(self, hosted: HostedReplicas, endpoint: ReplicationEndpoint,
                 config: ClusterConfig, throttle: ReplicationThrottle,
                 wake_consumers: Callable[[], None]):
        self.hosted = hosted
        self.endpoint = endpoint
        self.config = config
        self.broker_id = config.broker_id
        self.throttle = throttle
        self._wake_consumers = wake_consumers
        self._fetchers: dict[int, _Fetcher] = {}
        # The followed replicas by leader, and the hosted generation it was made at.
        self._by_leader: dict[int, list[PartitionReplica]] = {}
        self._generation = -1
        # The first backed-off replica's retry among the leaders free to be asked.
        self._replica_retry_at: int | None = None
        self._throttled_until: int | None = None     # a follower's partition held back
        # The partitions followed when a controlled shutdown began (None: not shutting).
        self._stopping_to_follow: frozenset[tuple[str, int]] | None = None

    def next_deadline(self) -> int | None:
        """When a leader or a replica backed off may ask again, or the follower
        bucket refills; None if nothing waits."""
        deadlines = [fetcher.retry_at for fetcher in self._fetchers.values()
                     if fetcher.in_flight is None and fetcher.retry_at]
        # A replica whose leader has a request in flight needs no deadline: that
        # request's answer or failure runs send_requests again.
        for deadline in (self._replica_retry_at, self._throttled_until):
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines, default=None)

    def stop_following(self) -> None:
        """A controlled shutdown begins: the partitions this broker follows now are
        fetched no more (see the module's rules)."""
        led = set(self.hosted.partitions_led())
        self._stopping_to_follow = frozenset(name for name in self.hosted.replicas
                                             if name not in led)

    def _stopped_for_shutdown(self, replica: PartitionReplica) -> bool:
        return self._stopping_to_follow is not None and replica.role is Role.FOLLOWER and \
            partition_name(replica) in self._stopping_to_follow

    # -- requests to leaders ------------------------------------------------------------------
    def send_requests(self, now: int) -> None:
        """Send each leader the next request, when none is in flight: EPOCH_END for
        the partitions truncating, else FETCH for those fetching."""
        self._throttled_until = self._replica_retry_at = None
        followed_by_leader = self._followed_by_leader()
        self._forget_unfollowed(followed_by_leader)
        for leader_id, followed in followed_by_leader.items():
            fetcher = self._fetchers.setdefault(leader_id, _Fetcher(leader_id))
            if fetcher.in_flight is not None or now < fetcher.retry_at:
                continue
            # Each fetcher compares the generation its own last look saw: a regroup
            # while its fetch was in flight must still make its next fetch look (a
            # partition it now follows is named, not left out until the rescan).
            if fetcher.quiet and fetcher.generation == self._generation and \
                    now < fetcher.rescan_at and self._stopping_to_follow is None:
                self._send_quiet(fetcher)
                continue
            fetcher.generation = self._generation
            asking = []
            for replica in followed:
                if replica.leader_id != leader_id or self._stopped_for_shutdown(replica):
                    continue
                if replica.may_ask(now):
                    replica.retry_at = 0
                    asking.append(replica)
                elif replica.retry_at and replica.phase is not FetchPhase.WAITING:
                    self._replica_retry_at = replica.retry_at if self._replica_retry_at is None \
                        else min(replica.retry_at, self._replica_retry_at)
            fetcher.quiet = False
            if asking:
                self._send_next(fetcher, asking, now)
                fetcher.quiet = fetcher.session_id != NO_SESSION and \
                    len(asking) == len(followed) and \
                    len(fetcher.partitions) == len(followed) and \
                    fetcher.pending is not None and all(
                        request.partition_max_bytes == self.config.replica_fetch_max_bytes
                        for request in fetcher.pending.values())
                if fetcher.quiet and fetcher.rescan_at <= now:
                    fetcher.rescan_at = now + limits.FETCH_SESSION_RESCAN_MS

    def _forget_unfollowed(self, followed_by_leader: dict) -> None:
        """Drop the fetchers of leaders no longer followed once nothing is in flight:
        a dead leader's fetcher, backed off, would otherwise hold a retry deadline
        long past that nothing sends on, and the broker's loop would spin on it."""
        for leader_id in [leader_id for leader_id, fetcher in self._fetchers.items()
                          if leader_id not in followed_by_leader and fetcher.in_flight is None]:
            del self._fetchers[leader_id]

    def _send_quiet(self, fetcher: _Fetcher) -> None:
        """A quiet session's next fetch: it names nothing, and its partitions are the
        ones the last full look found."""
        fetcher.pending = fetcher.sent
        body = Fetch(self.broker_id, fetcher.observer, self.config.replica_fetch_wait_max_ms, 1,
                     self.config.replica_fetch_response_max_bytes, (), fetcher.session_id,
                     fetcher.session_epoch, ())
        self._send(fetcher, fetcher.partitions, body,
                   self.config.replica_fetch_wait_max_ms + self.config.replica_socket_timeout_ms)

    def _followed_by_leader(self) -> dict[int, list[PartitionReplica]]:
        """The replicas this broker follows or observes, by leader (regrouped when
        the hosted replicas' generation moved)."""
        if self._generation != self.hosted.generation:
            self._generation = self.hosted.generation
            self._by_leader = {}
            for replica in self.hosted.replicas.values():
                if replica.role in (Role.FOLLOWER, Role.OBSERVER):
                    self._by_leader.setdefault(replica.leader_id, []).append(replica)
        return self._by_leader

    def _send_next(self, fetcher: _Fetcher, replicas: list[PartitionReplica], now: int) -> None:
        asking = [replica for replica in replicas if replica.phase is FetchPhase.TRUNCATING
                  and replica.take_step(replica.truncation_start())]
        if asking:
            fetcher.pending = None
            body = EpochEnd(tuple(EpochEndPartition(replica.topic_key, replica.hosted.partition,
                                                    replica.leader_epoch,
                                                    replica.log.epochs.latest_epoch)
                                  for replica in asking))
            self._send(fetcher, tuple((replica, replica.leader_epoch, None) for replica in asking),
                       body, self.config.replica_socket_timeout_ms)
            return
        fetching, requests = self._fetch_requests(replicas, now)
        if not fetching:
            fetcher.reset_session()        # the leader evicts it once idle
            return
        named, session_id, epoch, forgotten = fetcher.session_fetch(requests)
        fetcher.observer = any(replica.role is Role.OBSERVER for replica in fetching)
        body = Fetch(self.broker_id, fetcher.observer,
                     self.config.replica_fetch_wait_max_ms, 1,
                     self.config.replica_fetch_response_max_bytes, named, session_id, epoch,
                     forgotten)
        self._send(fetcher, tuple((replica, replica.leader_epoch, replica.log.log_end_offset)
                                  for replica in fetching), body,
                   self.config.replica_fetch_wait_max_ms + self.config.replica_socket_timeout_ms)

    def _fetch_requests(self, replicas: list[PartitionReplica], now: int) -> tuple[list, tuple]:
        """The fetching replicas to ask for and their requests: a throttled one out of
        the ISR asks for what the follower bucket holds, and none while it is empty
        (then the service wakes when it refills)."""
        fetching, requests = [], []
        for replica in replicas:
            if replica.phase is not FetchPhase.FETCHING:
                continue
            topic, partition = partition_name(replica)
            limit = self.throttle.follower_budget(topic, partition, self._in_sync(replica),
                                                  self.config.replica_fetch_max_bytes, now)
            if limit <= 0:
                ready = self.throttle.follower_ready_at_ms(now)
                self._throttled_until = ready if self._throttled_until is None \
                    else min(ready, self._throttled_until)
                continue
            fetching.append(replica)
            requests.append(replica.fetch_request(limit))
        return fetching, tuple(requests)

    def _in_sync(self, replica: PartitionReplica) -> bool:
        return replica.state is not None and self.broker_id in replica.state.isr

    def _send(self, fetcher: _Fetcher, replicas: tuple, body, timeout_ms: int) -> None:
        try:
            fetcher.in_flight = self.endpoint.request(fetcher.leader_id, body, timeout_ms)
            fetcher.partitions = replicas
        except ShmlogError as error:
            log.warning("cannot send to broker %d: %s", fetcher.leader_id, error)
            fetcher.retry_at = now_ms() + limits.FETCH_BACKOFF_MS
            fetcher.pending = None

    # -- the leaders' answers -------------------------------------------------------------------
    def _fetcher_for(self, peer_id: int, correlation_id: int) -> _Fetcher | None:
        fetcher = self._fetchers.get(peer_id)
        if fetcher is None or fetcher.in_flight != correlation_id:
            return None                      # late: its fetcher has moved on
        fetcher.in_flight = None
        return fetcher

    def failed(self, peer_id: int, correlation_id: int, now: int) -> None:
        """A request to ``peer_id`` got no answer: back its fetcher off."""
        fetcher = self._fetcher_for(peer_id, correlation_id)
        if fetcher is not None:
            fetcher.retry_at = now + limits.FETCH_BACKOFF_MS
            fetcher.reset_session()

    def answered(self, event: ReceivedResponse, now: int) -> None:
        """Apply a leader's answer to the request in flight, and send the next."""
        fetcher = self._fetcher_for(event.peer_id, event.message.correlation_id)
        if fetcher is None:
            return
        body = event.message.body
        asked = {entry[0].key: entry for entry in fetcher.partitions} \
            if getattr(body, "partitions", None) else {}
        if isinstance(body, FetchResponse):
            if body.error is not ErrorCode.NONE:
                log.info("broker %d refused fetch session %d (%s): fetching in full",
                         event.peer_id, fetcher.session_id, body.error.name)
                fetcher.reset_session()
                self.send_requests(now)
                return
            fetcher.session_answered(body.session_id)
            if body.partitions:
                fetcher.quiet = False      # positions moved: the next fetch looks
            for answer in body.partitions:
                if answer.error is not ErrorCode.NONE:     # the leader dropped it: name it again
                    fetcher.sent.pop((answer.topic_key, answer.partition), None)
                replica = self._still_asking(asked.get((answer.topic_key, answer.partition)),
                                             fetcher, FetchPhase.FETCHING)
                if replica is not None and answer.records is not None:
                    self.throttle.follower_received(*partition_name(replica),
                                                    self._in_sync(replica),
                                                    answer.records.size, now)
                if replica is not None and replica.apply_fetched(answer, now):
                    self._wake_consumers()
        elif isinstance(body, EpochEndResponse):
            for answer in body.partitions:
                replica = self._still_asking(asked.get((answer.topic_key, answer.partition)),
                                             fetcher, FetchPhase.TRUNCATING)
                if replica is not None:
                    self._truncation_answer(replica, answer, now)
        else:
            log.warning("broker %d answered %s: backing off", event.peer_id, body)
            fetcher.retry_at = now + limits.FETCH_BACKOFF_MS
            fetcher.reset_session()
            return
        self.send_requests(now)

    @staticmethod
    def _still_asking(entry, fetcher: _Fetcher, phase: FetchPhase) -> PartitionReplica | None:
        """The replica an answer is for, if it still wants it: it follows the same
        leader at the same epoch, in ``phase``, from the log end it asked from (a new
        state, even one naming the same leader again, or a truncation may have come
        while the request was out; Kafka's fetcher likewise applies a partition's
        data only at the epoch and fetch offset it asked with)."""
        if entry is None:
            return None
        replica, leader_epoch, fetch_offset = entry
        if replica.role not in (Role.FOLLOWER, Role.OBSERVER) or \
                replica.leader_id != fetcher.leader_id or \
                replica.leader_epoch != leader_epoch or replica.phase is not phase:
            return None
        if fetch_offset is not None and replica.log.log_end_offset != fetch_offset:
            return None
        return replica

    def _truncation_answer(self, replica: PartitionReplica, answer, now: int) -> None:
        if answer.error is not ErrorCode.NONE:
            replica.refused(answer.error, now)
            return
        replica.take_step(replica.truncation_answer(answer.leader_epoch, answer.end_offset))
