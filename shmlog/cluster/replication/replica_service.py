"""The replica service: a cluster member's replication, on the broker's loop thread
(Kafka's ReplicaManager with its fetcher threads and fetch purgatory), composed of
one part per job.

Rules
-----
* **The parts** (each module states its own rules):

  - ``hosted_replicas``: the partitions hosted and what this broker is to each, as
    ZooKeeper says (``becomeLeaderOrFollower``), the ZooKeeper session's fencing,
    and the high-watermark checkpoint;
  - ``fetcher``: the follower's side, fetching from leaders and truncating by
    leader epoch (``ReplicaFetcherThread``), and what stops at a controlled
    shutdown;
  - ``fetch_serving``: the leader's side, FETCH and EPOCH_END served, fetches that
    find nothing parked (``fetchMessages``, ``DelayedFetch``), the leader's high
    watermark;
  - ``isr_manager``: the leader's ISR shrinks and expands, written to ZooKeeper
    (AlterIsr);
  - ``delete_records_serving``: DeleteRecords on the partitions led;
  - ``dispatch``: which change or message goes to which part;
  - ``forwarding`` (producers whose partition is led elsewhere) and ``throttle``
    (moving replicas), shared with the rest of the cluster package.
* **A peer's message never ends the loop**, nor does a refusal of our own storage (a
  full disk, a corrupt segment): it is logged, and the loop goes on with the next.
* **Moving replicas are throttled** (``throttle``): the rates come from this
  broker's ``/config/brokers/<id>`` (watched, and read once before the first fetch),
  the throttled replicas from the topics' configs.
* :meth:`ReplicaService.partitions_led` tells a controlled shutdown when this
  broker may leave, after :meth:`ReplicaService.stop_following` (see ``fetcher``).

Theory of operation
-------------------
Three queues feed the service, each filled by a thread of its own that rings the
appender doorbell: ZooKeeper's watch events, the replication endpoint's messages
(``zmq_replication``), and the outcomes of ISR writes. :meth:`ReplicaService.poll`
empties them every loop turn, then looks at the partitions the drain appended to
(``Appender.take_appended``): a leader's high watermark may move, waiting fetches
may be answered; then the followers send their next requests, ``forwarding`` polls
(after the states: see its rules) and the group handler commits what the high
watermark now covers. :meth:`ReplicaService.tick` runs the timers: expired fetches,
the ISR shrink check (every ``replica.lag.time.max.ms / 2``), the checkpoint,
retries of failed requests.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ...broker.partition_host import PartitionHost
from ...common.errors import ShmlogError
from ...config.cluster import ClusterConfig
from ...record.records import now_ms
from ...zmq_replication import ReplicationEndpoint
from ..zk.client import ClusterZooKeeper
from ..zk.events import EventQueue
from ..zk.view import ClusterView
from .delete_records_serving import DeleteRecordsServing
from .dispatch import Dispatcher
from .fetch_serving import FetchServing
from .fetcher import ReplicaFetcher
from .forwarding import Forwarding
from .hosted_replicas import HostedReplicas
from .isr_manager import IsrManager
from .partition import Role
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["ReplicaService"]


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
    also_watching : sequence of EventQueue
        Other owners' queues given the same cluster events (this broker's
        controller): one watch per process, not one read per owner of every
        partition state changed.
    """

    def __init__(self, host: PartitionHost, config: ClusterConfig, zookeeper: ClusterZooKeeper,
                 endpoint: ReplicationEndpoint, also_watching: Sequence[EventQueue] = ()):
        self.host = host
        self.appender = host.appender
        self.config = config
        self.broker_id = config.broker_id
        self.zookeeper = zookeeper
        self.endpoint = endpoint
        self.view = ClusterView()
        self.events = EventQueue(wake=host.table.appender_doorbell.ring)
        # Fences the partitions the checkpoint names, before the loop serves a reader.
        self.hosted = HostedReplicas(host, config, self.view, zookeeper.suspended.is_set())
        self.replicas = self.hosted.replicas
        self.throttle = ReplicationThrottle(self.broker_id)
        self._load_throttle_rates()
        zookeeper.add_events(self.events)
        self._watch = zookeeper.watch_cluster(self.events, also_watching)
        self._config_watch = zookeeper.watch_broker_config(self.broker_id, self.events)
        self.isr = IsrManager(self.hosted, zookeeper, config, host.table.appender_doorbell.ring)
        #: ISR changes this broker wrote as leader and ZooKeeper took, by kind
        #: (broker_stats reports them).
        self.isr_changes = self.isr.changes
        wake_consumers = host.table.consumer_doorbell.ring
        self.fetch_serving = FetchServing(self.hosted, endpoint, self.throttle, self.isr,
                                          wake_consumers)
        self.hosted.listen(self.fetch_serving)
        self.isr.listen(self.fetch_serving.isr_changed)
        self.fetcher = ReplicaFetcher(self.hosted, endpoint, config, self.throttle,
                                      wake_consumers)
        # Producers' entries for partitions led elsewhere, and PRODUCEs from peers.
        self.forwarding = Forwarding(self.appender, endpoint, config, self.hosted.by_key,
                                     lambda broker_id: broker_id in self.view.brokers)
        self.delete_records = DeleteRecordsServing(self.hosted, endpoint,
                                                   self.fetch_serving.log_start_moved)
        self.dispatcher = Dispatcher(self.hosted, endpoint, self.throttle, self.fetch_serving,
                                     self.fetcher, self.forwarding, self.delete_records)

    def set_group_handler(self, groups) -> None:
        """Hand GROUP requests, their answers and failures to ``groups`` (the
        member's ``cluster_groups.ClusterGroupService``: ``serve(request, now)``,
        ``answered(event, now) -> bool``, ``failed(event, now) -> bool``), and call
        its ``poll(now)`` at the end of every :meth:`poll`."""
        self.dispatcher.groups = groups

    def set_transaction_handler(self, transactions) -> None:
        """Hand TRANSACTION requests to ``transactions`` (the member's
        ``cluster.transactions.ClusterTransactionService``: ``serve(request, now)``),
        and call its ``poll(now)`` at the end of every :meth:`poll`."""
        self.dispatcher.transactions = transactions

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
        deadlines = [self.isr.next_shrink_check, self.hosted.next_checkpoint]
        for part_deadline in (self.fetch_serving.next_deadline(), self.fetcher.next_deadline(),
                              self.forwarding.next_deadline()):
            if part_deadline is not None:
                deadlines.append(part_deadline)
        return min(deadlines)

    def tick(self, now: int) -> None:
        self.fetch_serving.expire(now)
        self.isr.maybe_shrink(now)
        self.hosted.checkpoint_if_due(now)
        self.fetcher.send_requests(now)
        self.forwarding.poll(now)
        self.isr.send()

    def work_pending(self) -> bool:
        """Is anything queued for :meth:`poll`?"""
        return bool(self.events.waiting or self.endpoint.waiting or self.isr.work_pending())

    # -- every loop turn ----------------------------------------------------------------------
    def poll(self, now: int) -> int:
        """Apply what ZooKeeper, the peers and the drain brought since the last turn;
        how many messages came from peers."""
        for change in self.view.apply_all(self.events.drain()):
            self._guarded(self.dispatcher.on_change, change, now)
        messages = self.endpoint.take()
        for event in messages:
            self._guarded(self.dispatcher.on_message, event, now)
        self.isr.apply_written()
        for row, log_end_offset in self.appender.take_appended():
            replica = self.hosted.by_row(row)
            if replica is not None and replica.role is Role.LEADER:
                self.fetch_serving.leader_appended(replica, log_end_offset, now)
        self.fetcher.send_requests(now)
        self.forwarding.poll(now)          # after the states: see forwarding's rules
        if self.dispatcher.groups is not None:
            self.dispatcher.groups.poll(now)   # commits the high watermark now covers
        if self.dispatcher.transactions is not None:
            self.dispatcher.transactions.poll(now)   # answers, markers, verifications
        self.isr.send()                        # the turn's ISR changes, in one write
        return len(messages)

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
        self.hosted.close()

    # -- for the member's other services --------------------------------------------------------
    def partitions_led(self) -> list[tuple[str, int]]:
        """The partitions whose state, as this broker applied it, names it leader."""
        return self.hosted.partitions_led()

    def partitions_movable(self, led: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Those of ``led`` that have another replica on a live broker (as this
        broker's view has it): the ones a controlled shutdown could move."""
        return self.hosted.partitions_movable(led)

    def stop_following(self) -> None:
        """A controlled shutdown begins: the partitions this broker follows now are
        fetched no more (``fetcher``'s rules)."""
        self.fetcher.stop_following()

    def ask(self, peer_id: int, body, timeout_ms: int, answered: Callable[[Any], None]) -> None:
        """Send a request ``body`` to broker ``peer_id`` for another service (see
        ``Dispatcher.ask``).

        Raises
        ------
        ShmlogError
            It could not be sent (no such peer, the endpoint closed).
        """
        self.dispatcher.ask(peer_id, body, timeout_ms, answered)

    def delete_records_as_leader(self, topic: str, partition: int,
                                 offset: int) -> tuple[str | None, int, int]:
        """Kafka's DeleteRecords on a partition this broker leads (see
        ``DeleteRecordsServing.delete_records_as_leader``)."""
        return self.delete_records.delete_records_as_leader(topic, partition, offset)
