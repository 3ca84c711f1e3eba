"""The replica service: a cluster member's replication, on the broker's loop thread
(Kafka's ReplicaManager with its fetcher threads and fetch purgatory).

Rules
-----
* **ZooKeeper is the one truth.** Topics, assignments, configs and partition states
  come from its watches (``cluster_view``); a topic appears on this broker when its
  assignment does (with the cluster-wide topic id, so ring entries name it the same
  everywhere), and goes when it does. Every broker hosts every partition: as
  leader, follower, or observer (a copy for this host's readers, see
  ``partition_replica``).
* **Followers pull.** One request in flight per leader: an EPOCH_END while any of
  its partitions truncates, else a FETCH of every fetching partition (Kafka's
  fetcher thread per source broker). The next goes out as soon as the answer is
  applied, so acks=all costs one round trip plus the follower's append.
* **Fetches that find nothing wait** (``replication.FetchPurgatory``) until a
  partition's log end or high watermark moves past what the follower has, its
  leadership changes, or ``max_wait_ms`` passes.
* **ISR changes are written by the leader** to its partition's state znode,
  conditionally on the zkVersion it holds, without blocking the loop (kazoo's async
  call, its outcome queued back). One change at a time per partition.
* **A suspended ZooKeeper session fences the leader** (this broker may have been
  replaced: ZooKeeper expires a session T after its last word, kazoo reports
  SUSPENDED after 2T/3): no high watermark moves, and new acks=all entries are
  refused with ``NOT_LEADER_OR_FOLLOWER`` (``Appender.set_fenced``; acks=0/1 are
  served); a LOST session resigns every leadership and fails the acks=all entries
  parked.
* A peer's message never ends the loop: what it names that is unknown is answered
  with an error code.
* **Producers whose partition is led elsewhere** are forwarded (``forwarding``): the
  appender hands their entries to :class:`~shmlog.cluster.replication.forwarding.Forwarding`, which
  sends PRODUCE to the leader and serves the PRODUCEs of peers; this service only
  dispatches to it and calls its ``poll`` after applying each turn's states.
* **Moving replicas are throttled** (``replication_throttle``): the rates come from
  this broker's ``/config/brokers/<id>`` (watched), the throttled replicas from
  the topics' configs; as leader a throttled partition's read is bounded by the
  leader bucket for a replica out of the ISR, as follower a throttled partition
  out of the ISR is asked for no more than the follower bucket holds (and left out
  of the fetch while it is empty, the service waking when it refills).
* **While this broker shuts down** (:meth:`ReplicaService.stop_following`, called
  by its controlled shutdown) the partitions it only followed when the shutdown
  began are fetched no more (Kafka's controller sends the shutting broker
  StopReplica for those), at once rather than once the controller took it out of
  their ISR: a fetch landing after that removal would make the leader count it as
  caught up again, and then wait for it through ``replica.lag.time.max.ms``. Their
  high watermarks wait for it until the controller removes it (its reaction
  time). The partitions it led go on being fetched from their new leaders, as in
  Kafka (it is their follower): the acks=all entries parked on it complete when
  its follower high watermark covers them (design §4.4).
  :meth:`ReplicaService.partitions_led` tells it when it may leave.
* **DeleteRecords** (``delete_records``' rules) is done by the leader: this service
  serves a peer's DELETE_RECORDS for the partitions it leads, and sends its own
  services' requests to other brokers (:meth:`ReplicaService.ask`, for
  ``cluster_delete_records``); followers take the leader's log start from its
  fetch responses.
* **High watermarks are checkpointed** (``high_watermark_checkpoint``) every
  ``replica.high.watermark.checkpoint.interval.ms``, when a topic is hosted, and at
  :meth:`ReplicaService.close`; a partition the checkpoint names is fenced to its
  checkpointed high watermark as soon as the service is made (before the loop
  serves a reader), and every replica starts from it when hosted.

Theory of operation
-------------------
Three queues feed the service, each filled by a thread of its own that rings the
appender doorbell: ZooKeeper's watch events, the replication endpoint's messages
(``zmq_replication``), and the outcomes of ISR writes. :meth:`ReplicaService.poll`
empties them every loop turn, then looks at the partitions the drain appended to
(``Appender.take_appended``): a leader's high watermark may move, waiting fetches
may be answered. :meth:`ReplicaService.tick` runs the timers: expired fetches, the
ISR shrink check (every ``replica.lag.time.max.ms / 2``), retries of failed requests.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
from typing import Any, Callable

from ...broker.appender import HighWatermarkPolicy
from ...broker.partition_host import PartitionHost
from ...common.errors import ShmlogError
from ...config.cluster import ClusterConfig
from ...record.records import now_ms
from ...shm.state import topic_key
from ...storage import delete_records as deletion
from ...zmq_replication import ReceivedRequest, ReceivedResponse, ReplicationEndpoint, RequestFailed
from ..zk.client import ClusterZooKeeper, EventQueue, SessionState
from ..zk.view import (
    BrokerConfigChanged,
    BrokersChanged,
    ClusterView,
    PartitionStateChanged,
    Reregistered,
    SessionChanged,
    TopicChanged,
    TopicConfigChanged,
    TopicGone,
)
from .forwarding import Forwarding
from .high_watermark_checkpoint import HighWatermarkCheckpoint
from .messages import (
    DeleteRecords,
    DeleteRecordsResponse,
    DeleteRecordsResponsePartition,
    EpochEnd,
    EpochEndPartition,
    EpochEndResponse,
    EpochEndResponsePartition,
    Error,
    ErrorCode,
    Fetch,
    FetchResponse,
    FetchResponsePartition,
    GroupRequest,
    Produce,
)
from .partition import FETCH_BACKOFF_MS, FetchPhase, PartitionReplica, Role
from .purgatory import FetchPurgatory, partition_ready
from .rules import IsrChangeKind, PendingIsrChange
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["ReplicaService"]

MIN_INSYNC_REPLICAS = "min.insync.replicas"


@dataclasses.dataclass
class _Fetcher:
    """The requests to one leader: at most one in flight."""
    leader_id: int
    in_flight: int | None = None          # its correlation id
    partitions: tuple = ()                # what it asked: (replica, leader epoch, offset)
    retry_at: int = 0


@dataclasses.dataclass
class _WaitingFetch:
    request: ReceivedRequest
    deadline: int


class ReplicaService:
    """Replication for every partition this broker hosts (see the module's rules).

    Parameters
    ----------
    host : PartitionHost
    config : ClusterConfig
    zookeeper : ClusterZooKeeper
        Started, this broker registered.
    endpoint : ReplicationEndpoint
        Bound; ``wake`` rings the appender doorbell.
    """

    def __init__(self, host: PartitionHost, config: ClusterConfig, zookeeper: ClusterZooKeeper,
                 endpoint: ReplicationEndpoint):
        self.host = host
        self.appender = host.appender
        self.config = config
        self.broker_id = config.broker_id
        self.zookeeper = zookeeper
        self.endpoint = endpoint
        self.view = ClusterView()
        self.events = EventQueue(wake=host.table.appender_doorbell.ring)
        self._written: queue.SimpleQueue = queue.SimpleQueue()     # ISR write outcomes
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._by_key: dict[tuple[int, int], PartitionReplica] = {}
        self._by_row: dict[int, PartitionReplica] = {}
        self._fetchers: dict[int, _Fetcher] = {}
        self._purgatory = FetchPurgatory()
        self._waiting: dict[Any, _WaitingFetch] = {}
        self._high_watermark_sent: dict[tuple[int, tuple[int, int]], int] = {}
        self.suspended = zookeeper.suspended.is_set()
        # The partitions followed when a controlled shutdown began (None: not shutting).
        self._stopping_to_follow: frozenset[tuple[str, int]] | None = None
        self._next_shrink_check = 0
        self.checkpoint = HighWatermarkCheckpoint(host.data_dir)
        self._next_checkpoint = 0
        self._fence_checkpointed()
        self.throttle = ReplicationThrottle(self.broker_id)
        self._throttled_until: int | None = None     # a follower's partition held back
        self._load_throttle_rates()
        zookeeper.add_events(self.events)
        self._watch = zookeeper.watch_cluster(self.events)
        self._config_watch = zookeeper.watch_broker_config(self.broker_id, self.events)
        # Producers' entries for partitions led elsewhere, and PRODUCEs from peers.
        self.forwarding = Forwarding(self.appender, endpoint, config, self._by_key.get,
                                     lambda broker_id: broker_id in self.view.brokers)
        # GROUP requests from peers and the answers to this broker's (cluster_groups).
        self._groups = None
        # Requests of this broker's services (ask): (peer, correlation id) -> callback.
        self._asked: dict[tuple[int, int], Callable[[Any], None]] = {}
        #: ISR changes this broker wrote as leader and ZooKeeper took, by kind (Kafka's
        #: IsrShrinksPerSec and IsrExpandsPerSec, as totals: broker_stats reports them).
        self.isr_changes = dict.fromkeys(IsrChangeKind, 0)

    def set_group_handler(self, groups) -> None:
        """Hand GROUP requests, their answers and failures to ``groups`` (the
        member's ``cluster_groups.ClusterGroupService``: ``serve(request, now)``,
        ``answered(event, now) -> bool``, ``failed(event, now) -> bool``), and call
        its ``poll(now)`` at the end of every :meth:`poll`."""
        self._groups = groups

    def _load_throttle_rates(self) -> None:
        """The throttle rates before the first fetch (the watch's first event may come
        after the topics' and their first fetch; Kafka too loads dynamic broker
        configs before it starts its fetchers)."""
        try:
            self.throttle.set_rates(self.zookeeper.read_broker_config(self.broker_id), now_ms())
        except ShmlogError as error:
            log.warning("cannot take this broker's throttle rates from ZooKeeper (its "
                        "watch brings them): %s", error)

    # -- the service protocol -------------------------------------------------------------
    def handlers(self) -> dict[str, Callable[..., dict | None]]:
        return {}

    def take_replies(self) -> list:
        return []

    def pending_tickets(self) -> list:
        return []

    def next_deadline(self) -> int | None:
        deadlines = [self._next_shrink_check, self._next_checkpoint]
        fetch_deadline = self._purgatory.next_deadline_ms()
        if fetch_deadline is not None:
            deadlines.append(fetch_deadline)
        deadlines.extend(fetcher.retry_at for fetcher in self._fetchers.values()
                         if fetcher.in_flight is None and fetcher.retry_at)
        forwarding_deadline = self.forwarding.next_deadline()
        if forwarding_deadline is not None:
            deadlines.append(forwarding_deadline)
        deadlines.extend(replica.retry_at for replica in self.replicas.values()
                         if replica.retry_at and replica.phase is not FetchPhase.WAITING)
        if self._throttled_until is not None:
            deadlines.append(self._throttled_until)
        return min(deadlines)

    def tick(self, now: int) -> None:
        for key in self._purgatory.expire(now):
            self._answer_waiting(key)
        if now >= self._next_shrink_check:
            self._next_shrink_check = now + max(1, self.config.replica_lag_time_max_ms // 2)
            for replica in self.replicas.values():
                self._write_isr_change(replica, replica.isr_change(now))
        if now >= self._next_checkpoint:
            self._next_checkpoint = now + self.config.replica_high_watermark_checkpoint_interval_ms
            self.checkpoint.write_soon(self.high_watermarks())
        self._send_requests(now)
        self.forwarding.poll(now)

    def work_pending(self) -> bool:
        """Is anything queued for :meth:`poll`?"""
        return bool(self.events.waiting or self.endpoint.waiting or not self._written.empty())

    # -- every loop turn ----------------------------------------------------------------------
    def poll(self, now: int) -> None:
        """Apply what ZooKeeper, the peers and the drain brought since the last turn."""
        for change in self.view.apply_all(self.events.drain()):
            self._guarded(self._on_change, change, now)
        for event in self.endpoint.take():
            self._guarded(self._on_message, event, now)
        while not self._written.empty():
            replica, change, outcome = self._written.get_nowait()
            self._isr_written(replica, change, outcome)
        for row, log_end_offset in self.appender.take_appended():
            replica = self._by_row.get(row)
            if replica is not None and replica.role is Role.LEADER:
                self._leader_appended(replica, log_end_offset, now)
        self._send_requests(now)
        self.forwarding.poll(now)          # after the states: see forwarding's rules
        if self._groups is not None:
            self._groups.poll(now)         # commits the high watermark now covers

    def _guarded(self, handle, item, now: int) -> None:
        """Handle one change or message; a refusal of our own storage (a full disk, a
        corrupt segment) is logged, and the loop goes on with the next."""
        try:
            handle(item, now)
        except ShmlogError as error:
            log.error("replication could not handle %s: %s", type(item).__name__, error)

    def close(self) -> None:
        """Stop forwarding and watching; checkpoint the high watermarks (a clean stop)."""
        self.forwarding.close()
        self._watch.cancel()
        self._config_watch.cancel()
        self.zookeeper.remove_events(self.events)
        self.checkpoint.close(self.high_watermarks())

    # -- the high-watermark checkpoint -------------------------------------------------------
    def high_watermarks(self) -> dict[tuple[str, int], int]:
        """The published high watermark of every replicated partition, and of every
        hosted one the checkpoint named (fenced, its replica not hosted yet: a
        checkpoint written before must not forget it), {(topic, partition): hw}."""
        named = self.checkpoint.checkpointed
        return {(hosted.topic, hosted.partition): self.appender.high_watermark(hosted.row)
                for hosted in self.host.partitions()
                if (hosted.topic, hosted.partition) in self.replicas
                or (hosted.topic, hosted.partition) in named}

    def _fence_checkpointed(self) -> None:
        """Hold every hosted partition the checkpoint names at its checkpointed high
        watermark, and take no producer's entry for it (it was replicated: until its
        state is read this broker does not know whether it leads it, as a Kafka
        broker leads nothing before its LeaderAndIsr, and its log end may hold
        records never committed)."""
        for hosted in self.host.partitions():
            if (hosted.topic, hosted.partition) in self.checkpoint.checkpointed:
                self.appender.set_high_watermark_policy(
                    hosted.row, HighWatermarkPolicy.EXTERNAL,
                    high_watermark=self._start_high_watermark(hosted))
                self.appender.set_is_leader(hosted.row, False)

    def _start_high_watermark(self, hosted) -> int:
        return self.checkpoint.start(hosted.topic, hosted.partition,
                                     hosted.log.log_start_offset, hosted.log.log_end_offset)

    # -- ZooKeeper's changes --------------------------------------------------------------------
    def _on_change(self, change, now: int) -> None:
        if isinstance(change, PartitionStateChanged):
            replica = self.replicas.get((change.topic, change.partition))
            if replica is not None:
                self._apply_state(replica, change.state, change.version, now)
        elif isinstance(change, TopicChanged):
            self._host_topic(change.assignment, now)
        elif isinstance(change, TopicGone):
            self.throttle.forget_topic(change.topic)
            self._drop_topic(change.topic)
        elif isinstance(change, TopicConfigChanged):
            self._configure_topic(change.topic, change.config)
            self.throttle.set_topic(change.topic, change.config)
        elif isinstance(change, BrokerConfigChanged):
            self.throttle.set_rates(change.config, now)
            log.info("replication throttle rates (leader, follower): %s bytes/s",
                     self.throttle.rates)
        elif isinstance(change, BrokersChanged):
            brokers = self.view.brokers
            self.endpoint.set_peers(
                {broker_id: broker.registration.replication_endpoint
                 for broker_id, broker in brokers.items()},
                {broker_id: broker.registration.curve_public_key
                 for broker_id, broker in brokers.items()})
        elif isinstance(change, SessionChanged):
            self._session_changed(change.state)
        elif isinstance(change, Reregistered):
            log.info("registered again with ZooKeeper: broker epoch %d", change.epoch)
            self.endpoint.broker_epoch = change.epoch

    def _apply_state(self, replica: PartitionReplica, state, version: int, now: int) -> None:
        if replica.apply_state(state, version, self.view.replicas(*self._name(replica)), now):
            replica.update_min_insync(self.suspended)
            for key in self._purgatory.leadership_changed(replica.key):
                self._answer_waiting(key)
        self._maybe_advance(replica, now)

    def _host_topic(self, assignment, now: int) -> None:
        """Host the topic's partitions as ZooKeeper assigns them (its id is the
        cluster's: a local topic of the name with another id is another topic)."""
        name = assignment.topic
        config = self.view.configs.get(name, {})
        if self.host.logs.has_topic(name) and \
                self.host.logs.describe_topic(name).topic_id != assignment.topic_id:
            self._drop_topic(name)
        count = len(assignment.partitions)
        if not self.host.logs.has_topic(name):
            self.host.create_topic(name, count, config, topic_id=assignment.topic_id)
        elif self.host.logs.describe_topic(name).partitions < count:
            self.host.add_partitions(name, count)
        key = topic_key(assignment.topic_id)
        for partition in range(count):
            if (name, partition) in self.replicas:
                continue
            hosted = self.host.partition(name, partition)
            replica = PartitionReplica(self.broker_id, hosted, self.appender, key,
                                       self.config.replica_lag_time_max_ms,
                                       high_watermark=self._start_high_watermark(hosted))
            self._next_checkpoint = now        # a crash soon after must find it there
            replica.min_insync_replicas = self._min_insync(config)
            self.replicas[(name, partition)] = replica
            self._by_key[replica.key] = replica
            self._by_row[replica.row] = replica
            held = self.view.state(name, partition)
            if held is not None:
                self._apply_state(replica, held[0], held[1], now)

    def _drop_topic(self, name: str) -> None:
        for (topic, partition), replica in list(self.replicas.items()):
            if topic == name:
                replica.resign()
                for key in self._purgatory.leadership_changed(replica.key):
                    self._answer_waiting(key)
                del self.replicas[(topic, partition)]
                del self._by_key[replica.key]
                del self._by_row[replica.row]
        if self.host.logs.has_topic(name):
            self.host.delete_topic(name)
            log.info("deleted topic %s (gone from ZooKeeper)", name)

    def _configure_topic(self, name: str, config: dict) -> None:
        if not self.host.logs.has_topic(name):
            return
        held = self.host.logs.describe_topic(name).config.overrides()
        try:
            self.host.alter_topic_config(name, dict(config),
                                         tuple(key for key in held if key not in config))
        except ShmlogError as error:
            log.warning("topic %s: cannot take its config %s from ZooKeeper: %s", name, config,
                        error)
        for (topic, _), replica in self.replicas.items():
            if topic == name:
                replica.min_insync_replicas = self._min_insync(config)
                replica.update_min_insync(self.suspended)

    def _min_insync(self, config: dict) -> int:
        try:
            return int(config.get(MIN_INSYNC_REPLICAS, self.config.min_insync_replicas))
        except ValueError:
            return self.config.min_insync_replicas

    def _session_changed(self, state: SessionState) -> None:
        self.suspended = state is SessionState.SUSPENDED
        if state is SessionState.LOST:
            log.warning("ZooKeeper session lost: resigning every leadership")
            for replica in self.replicas.values():
                if replica.role is Role.LEADER:
                    replica.resign()
            return
        for replica in self.replicas.values():
            replica.update_min_insync(self.suspended)

    def _name(self, replica: PartitionReplica) -> tuple[str, int]:
        return replica.hosted.topic, replica.hosted.partition

    # -- the leader's side: requests from peers ----------------------------------------------
    def _on_message(self, event, now: int) -> None:
        if isinstance(event, ReceivedRequest):
            body = event.message.body
            if isinstance(body, Fetch):
                self._serve_fetch(event, body, now)
            elif isinstance(body, EpochEnd):
                self._serve_epoch_end(event, body)
            elif isinstance(body, Produce):
                self.forwarding.serve(event, now)
            elif isinstance(body, GroupRequest) and self._groups is not None:
                self._groups.serve(event, now)
            elif isinstance(body, DeleteRecords):
                self._serve_delete_records(event, body)
            else:
                self.endpoint.reply(event, Error(ErrorCode.INVALID_REQUEST,
                                                 f"{type(body).__name__} is not served"))
        elif isinstance(event, ReceivedResponse):
            answered = self._asked.pop((event.peer_id, event.message.correlation_id), None)
            if answered is not None:
                answered(event.message.body)
                return
            if self.forwarding.answered(event, now):
                return
            if self._groups is None or not self._groups.answered(event, now):
                self._on_response(event, now)
        elif isinstance(event, RequestFailed):
            answered = self._asked.pop((event.peer_id, event.correlation_id), None)
            if answered is not None:
                answered(None)
                return
            if self.forwarding.failed(event, now):
                return
            if self._groups is None or not self._groups.failed(event, now):
                self._request_failed(event.peer_id, event.correlation_id, now)

    # -- DeleteRecords ------------------------------------------------------------------------
    def ask(self, peer_id: int, body, timeout_ms: int, answered: Callable[[Any], None]) -> None:
        """Send a request ``body`` to broker ``peer_id`` for another service;
        ``answered`` is called on the loop thread with its reply's body (perhaps an
        ``Error``), or with None when none came within ``timeout_ms``.

        Raises
        ------
        ShmlogError
            It could not be sent (no such peer, the endpoint closed).
        """
        correlation_id = self.endpoint.request(peer_id, body, timeout_ms)
        self._asked[(peer_id, correlation_id)] = answered

    def delete_records_as_leader(self, topic: str, partition: int,
                                 offset: int) -> tuple[str | None, int, int]:
        """Kafka's DeleteRecords on a partition this broker leads (``delete_records``'
        rules): (a Kafka error name or None, the offset resolved, the low watermark
        over this log and its live followers' reported log starts)."""
        replica = self.replicas.get((topic, partition))
        if replica is None:
            return deletion.UNKNOWN_TOPIC_OR_PARTITION, offset, deletion.UNKNOWN_OFFSET
        if replica.role is not Role.LEADER:
            return deletion.NOT_LEADER_OR_FOLLOWER, offset, deletion.UNKNOWN_OFFSET
        try:
            error, offset = self.host.delete_records(topic, partition, offset)
        except ShmlogError as refused:
            log.error("%r: delete-records to %d failed: %s", replica, offset, refused)
            return deletion.KAFKA_STORAGE_ERROR, offset, deletion.UNKNOWN_OFFSET
        followers = [state.log_start_offset
                     for broker_id, state in replica.leader.followers.items()
                     if broker_id in self.view.brokers]
        return error, offset, deletion.low_watermark(replica.log.log_start_offset, followers)

    def _serve_delete_records(self, event: ReceivedRequest, request: DeleteRecords) -> None:
        answers = []
        for entry in request.partitions:
            replica = self._by_key.get((entry.topic_key, entry.partition))
            error, offset, low = (deletion.UNKNOWN_TOPIC_OR_PARTITION, entry.offset,
                                  deletion.UNKNOWN_OFFSET) if replica is None else \
                self.delete_records_as_leader(*self._name(replica), entry.offset)
            answers.append(DeleteRecordsResponsePartition(
                entry.topic_key, entry.partition,
                ErrorCode.NONE if error is None else ErrorCode[error], offset, low))
        self.endpoint.reply(event, DeleteRecordsResponse(tuple(answers)))

    def _stale_sender(self, event: ReceivedRequest) -> bool:
        """Is the request from an incarnation of its broker older than the one
        registered (KIP-380's broker epoch)?"""
        message = event.message
        known = self.view.brokers.get(message.sender_broker_id)
        return known is not None and message.sender_broker_epoch < known.epoch

    def _serve_fetch(self, event: ReceivedRequest, fetch: Fetch, now: int) -> None:
        if self._stale_sender(event):
            self.endpoint.reply(event, Error(ErrorCode.STALE_BROKER_EPOCH,
                                             "a newer incarnation of this broker is registered"))
            return
        peer = event.message.sender_broker_id
        budget = fetch.max_bytes
        answers, found, waits_for = [], False, {}
        for request in fetch.partitions:
            replica = self._by_key.get((request.topic_key, request.partition))
            if replica is None:
                answers.append(_unknown_partition(request))
                found = True
                continue
            in_sync = peer in replica.leader.isr
            limit = self.throttle.leader_budget(replica.hosted.topic, replica.hosted.partition,
                                                in_sync, budget, now)
            answer, has_records = replica.serve_fetch(peer, fetch.observer, request, limit, now,
                                                      self.suspended)
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
                self._write_isr_change(replica, replica.isr_change(now, peer))
                self._maybe_advance(replica, now)
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
            replica = self._by_key.get((request.topic_key, request.partition))
            if replica is None:
                answers.append(_unknown_partition(request))
                continue
            in_sync = peer in replica.leader.isr
            topic, partition = self._name(replica)
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

    def _serve_epoch_end(self, event: ReceivedRequest, request: EpochEnd) -> None:
        answers = []
        for asked in request.partitions:
            replica = self._by_key.get((asked.topic_key, asked.partition))
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

    # -- the leader's high watermark and ISR ------------------------------------------------------
    def _leader_appended(self, replica: PartitionReplica, log_end_offset: int, now: int) -> None:
        self._maybe_advance(replica, now)
        for key in self._purgatory.log_end_moved(replica.key, log_end_offset):
            self._answer_waiting(key)

    def _maybe_advance(self, replica: PartitionReplica, now: int) -> None:
        high_watermark = replica.maybe_advance_high_watermark(now, self.suspended)
        if high_watermark is not None:
            self.host.table.consumer_doorbell.ring()
            for key in self._purgatory.high_watermark_moved(replica.key, high_watermark):
                self._answer_waiting(key)

    def _write_isr_change(self, replica: PartitionReplica, change: PendingIsrChange | None) -> None:
        """Write an ISR change to the partition's state znode, without waiting: its
        outcome comes back through :meth:`poll`."""
        if change is None:
            return
        if self.suspended:
            replica.isr_change_written(change, None)
            return
        topic, partition = self._name(replica)
        wake = self.host.table.appender_doorbell.ring

        def done(outcome) -> None:                   # on a kazoo thread: queue only
            self._written.put((replica, change, outcome))
            wake()
        self.zookeeper.update_partition_state_async(topic, partition, replica.state_for(change),
                                                    replica.state_version, done)

    def _isr_written(self, replica: PartitionReplica, change: PendingIsrChange, outcome) -> None:
        if isinstance(outcome, ShmlogError):
            log.info("%r: isr change %s refused (%s): a newer state is coming", replica,
                     sorted(change.proposed_isr), outcome)
            replica.isr_change_written(change, None)
            return
        replica.isr_change_written(change, outcome)
        self.isr_changes[change.kind] += 1
        replica.update_min_insync(self.suspended)

    # -- the follower's side: requests to leaders ------------------------------------------------
    def _send_requests(self, now: int) -> None:
        """Send each leader the next request, when none is in flight: EPOCH_END for
        the partitions truncating, else FETCH for those fetching."""
        by_leader: dict[int, list[PartitionReplica]] = {}
        self._throttled_until = None
        for replica in self.replicas.values():
            if replica.may_ask(now) and not self._stopped_for_shutdown(replica):
                replica.retry_at = 0
                by_leader.setdefault(replica.leader_id, []).append(replica)
        for leader_id, replicas in by_leader.items():
            fetcher = self._fetchers.setdefault(leader_id, _Fetcher(leader_id))
            if fetcher.in_flight is None and now >= fetcher.retry_at:
                self._send_next(fetcher, replicas, now)

    def stop_following(self) -> None:
        """A controlled shutdown begins: the partitions this broker follows now are
        fetched no more (see the module's rules)."""
        led = set(self.partitions_led())
        self._stopping_to_follow = frozenset(name for name in self.replicas if name not in led)

    def _stopped_for_shutdown(self, replica: PartitionReplica) -> bool:
        return self._stopping_to_follow is not None and replica.role is Role.FOLLOWER and \
            self._name(replica) in self._stopping_to_follow

    def partitions_led(self) -> list[tuple[str, int]]:
        """The partitions whose state, as this broker applied it, names it leader."""
        return sorted(name for name, replica in self.replicas.items()
                      if replica.state is not None and replica.state.leader == self.broker_id)

    def partitions_movable(self, led: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Those of ``led`` that have another replica on a live broker (as this
        broker's view has it): the ones a controlled shutdown could move."""
        return [name for name in led
                if any(broker_id != self.broker_id and broker_id in self.view.brokers
                       for broker_id in self.view.replicas(*name))]

    def _send_next(self, fetcher: _Fetcher, replicas: list[PartitionReplica], now: int) -> None:
        asking = [replica for replica in replicas if replica.phase is FetchPhase.TRUNCATING
                  and replica.take_step(replica.truncation_start())]
        if asking:
            body = EpochEnd(tuple(EpochEndPartition(replica.topic_key, replica.hosted.partition,
                                                    replica.leader_epoch,
                                                    replica.log.epochs.latest_epoch)
                                  for replica in asking))
            self._send(fetcher, tuple((replica, replica.leader_epoch, None) for replica in asking),
                       body, self.config.replica_socket_timeout_ms)
            return
        fetching, requests = self._fetch_requests(replicas, now)
        if not fetching:
            return
        body = Fetch(self.broker_id, any(replica.role is Role.OBSERVER for replica in fetching),
                     self.config.replica_fetch_wait_max_ms, 1,
                     self.config.replica_fetch_response_max_bytes, requests)
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
            topic, partition = self._name(replica)
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
            fetcher.retry_at = now_ms() + FETCH_BACKOFF_MS

    def _fetcher_for(self, peer_id: int, correlation_id: int) -> _Fetcher | None:
        fetcher = self._fetchers.get(peer_id)
        if fetcher is None or fetcher.in_flight != correlation_id:
            return None                      # late: its fetcher has moved on
        fetcher.in_flight = None
        return fetcher

    def _request_failed(self, peer_id: int, correlation_id: int, now: int) -> None:
        fetcher = self._fetcher_for(peer_id, correlation_id)
        if fetcher is not None:
            fetcher.retry_at = now + FETCH_BACKOFF_MS

    def _on_response(self, event: ReceivedResponse, now: int) -> None:
        fetcher = self._fetcher_for(event.peer_id, event.message.correlation_id)
        if fetcher is None:
            return
        body = event.message.body
        asked = {entry[0].key: entry for entry in fetcher.partitions}
        if isinstance(body, FetchResponse):
            for answer in body.partitions:
                replica = self._still_asking(asked.get((answer.topic_key, answer.partition)),
                                             fetcher, FetchPhase.FETCHING)
                if replica is not None and answer.records is not None:
                    self.throttle.follower_received(*self._name(replica), self._in_sync(replica),
                                                    answer.records.size, now)
                if replica is not None and replica.apply_fetched(answer, now):
                    self.host.table.consumer_doorbell.ring()
        elif isinstance(body, EpochEndResponse):
            for answer in body.partitions:
                replica = self._still_asking(asked.get((answer.topic_key, answer.partition)),
                                             fetcher, FetchPhase.TRUNCATING)
                if replica is not None:
                    self._truncation_answer(replica, answer, now)
        else:
            log.warning("broker %d answered %s: backing off", event.peer_id, body)
            fetcher.retry_at = now + FETCH_BACKOFF_MS
            return
        self._send_requests(now)

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


def _unknown_partition(request) -> FetchResponsePartition:
    return FetchResponsePartition(request.topic_key, request.partition,
                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1)
