"""Which incoming change or message goes where: the cluster view's changes to the
hosted replicas, the throttle and the endpoint; the peers' requests to the part that
serves them; the answers and failures to the part that asked (Kafka's
``KafkaApis.handle`` and the network client's completion handlers, in one place).

Rules
-----
* **Requests** go by body: FETCH and EPOCH_END to the leader's fetch serving,
  PRODUCE to ``forwarding``, GROUP to the group handler (when the member has one),
  TRANSACTION to the transaction handler (likewise), DELETE_RECORDS to the leader's
  DeleteRecords; anything else is answered
  ``INVALID_REQUEST``.
* **Answers and failures** go, in this order, to the callback of a request sent by
  :meth:`Dispatcher.ask`, then to ``forwarding``, then to the group handler, and
  what none of those claims to the follower fetcher (which drops what it did not
  ask).
* **A peer's message never ends the loop**: what it names that is unknown is
  answered with an error code, or dropped if it is an answer.

Theory of operation
-------------------
The replica service drains ZooKeeper's events and the endpoint's messages every
loop turn and hands each to :meth:`Dispatcher.on_change` or
:meth:`Dispatcher.on_message`. Every correlation id is the endpoint's (one counter
for all peers), so the first part that recognises an answer's ``(peer, correlation
id)`` owns it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ...zmq_replication import ReceivedRequest, ReceivedResponse, ReplicationEndpoint, RequestFailed
from ..zk.view import (
    BrokerConfigChanged,
    BrokersChanged,
    PartitionStateChanged,
    Reregistered,
    SessionChanged,
    TopicChanged,
    TopicConfigChanged,
    TopicGone,
)
from .delete_records_serving import DeleteRecordsServing
from .fetch_serving import FetchServing
from .fetcher import ReplicaFetcher
from .forwarding import Forwarding
from .hosted_replicas import HostedReplicas
from .messages import (
    DeleteRecords,
    EpochEnd,
    Error,
    ErrorCode,
    Fetch,
    GroupRequest,
    Produce,
    TransactionRequest,
)
from .throttle import ReplicationThrottle

log = logging.getLogger("shmlog.broker")

__all__ = ["Dispatcher"]


class Dispatcher:
    """Hands each change and message to its part (see the module's rules).

    Parameters
    ----------
    hosted : HostedReplicas
    endpoint : ReplicationEndpoint
    throttle : ReplicationThrottle
    fetch_serving : FetchServing
    fetcher : ReplicaFetcher
    forwarding : Forwarding
    delete_records : DeleteRecordsServing
    """

    def __init__(self, hosted: HostedReplicas, endpoint: ReplicationEndpoint,
                 throttle: ReplicationThrottle, fetch_serving: FetchServing,
                 fetcher: ReplicaFetcher, forwarding: Forwarding,
                 delete_records: DeleteRecordsServing):
        self.hosted = hosted
        self.endpoint = endpoint
        self.throttle = throttle
        self.fetch_serving = fetch_serving
        self.fetcher = fetcher
        self.forwarding = forwarding
        self.delete_records = delete_records
        # GROUP requests from peers and the answers to this broker's (cluster_groups).
        self.groups = None
        # TRANSACTION requests from peers (cluster.transactions; its own go by ask).
        self.transactions = None
        # Requests of this broker's services (ask): (peer, correlation id) -> callback.
        self._asked: dict[tuple[int, int], Callable[[Any], None]] = {}

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

    # -- ZooKeeper's changes --------------------------------------------------------------------
    def on_change(self, change, now: int) -> None:
        """Apply one change of the cluster view."""
        if isinstance(change, PartitionStateChanged):
            self.hosted.apply_partition_state(change, now)
        elif isinstance(change, TopicChanged):
            self.hosted.host_topic(change.assignment, now)
        elif isinstance(change, TopicGone):
            self.throttle.forget_topic(change.topic)
            self.hosted.drop_topic(change.topic)
        elif isinstance(change, TopicConfigChanged):
            self.hosted.configure_topic(change.topic, change.config)
            self.throttle.set_topic(change.topic, change.config)
        elif isinstance(change, BrokerConfigChanged):
            self.throttle.set_rates(change.config, now)
            log.info("replication throttle rates (leader, follower): %s bytes/s",
                     self.throttle.rates)
        elif isinstance(change, BrokersChanged):
            brokers = self.hosted.view.brokers
            self.endpoint.set_peers(
                {broker_id: broker.registration.replication_endpoint
                 for broker_id, broker in brokers.items()},
                {broker_id: broker.registration.curve_public_key
                 for broker_id, broker in brokers.items()})
        elif isinstance(change, SessionChanged):
            self.hosted.session_changed(change.state)
        elif isinstance(change, Reregistered):
            log.info("registered again with ZooKeeper: broker epoch %d", change.epoch)
            self.endpoint.broker_epoch = change.epoch

    # -- the peers' messages --------------------------------------------------------------------
    def on_message(self, event, now: int) -> None:
        """Hand one message from a peer (or a request's failure) to its part."""
        if isinstance(event, ReceivedRequest):
            self._on_request(event, now)
        elif isinstance(event, ReceivedResponse):
            self._on_response(event, now)
        elif isinstance(event, RequestFailed):
            self._on_failure(event, now)

    def _on_request(self, event: ReceivedRequest, now: int) -> None:
        body = event.message.body
        if isinstance(body, Fetch):
            self.fetch_serving.serve_fetch(event, body, now)
        elif isinstance(body, EpochEnd):
            self.fetch_serving.serve_epoch_end(event, body)
        elif isinstance(body, Produce):
            self.forwarding.serve(event, now)
        elif isinstance(body, GroupRequest) and self.groups is not None:
            self.groups.serve(event, now)
        elif isinstance(body, TransactionRequest) and self.transactions is not None:
            self.transactions.serve(event, now)
        elif isinstance(body, DeleteRecords):
            self.delete_records.serve(event, body)
        else:
            self.endpoint.reply(event, Error(ErrorCode.INVALID_REQUEST,
                                             f"{type(body).__name__} is not served"))

    def _on_response(self, event: ReceivedResponse, now: int) -> None:
        answered = self._asked.pop((event.peer_id, event.message.correlation_id), None)
        if answered is not None:
            answered(event.message.body)
            return
        if self.forwarding.answered(event, now):
            return
        if self.groups is None or not self.groups.answered(event, now):
            self.fetcher.answered(event, now)

    def _on_failure(self, event: RequestFailed, now: int) -> None:
        answered = self._asked.pop((event.peer_id, event.correlation_id), None)
        if answered is not None:
            answered(None)
            return
        if self.forwarding.failed(event, now):
            return
        if self.groups is None or not self.groups.failed(event, now):
            self.fetcher.failed(event.peer_id, event.correlation_id, now)
