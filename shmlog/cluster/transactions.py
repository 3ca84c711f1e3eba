"""Transactions across hosts: a cluster member's transaction coordinator (Kafka's
``TransactionCoordinator`` over a replicated ``__transaction_state``), the markers it
sends to the partitions' leaders, and the verification of a transaction's first batch
in a partition this broker leads (KIP-890).

Rules
-----
* **The coordinator of a transactional id is the leader of its partition of
  ``__transaction_state``** (``groups.offsets_partition(id, count)``), as in Kafka.
  The topic is made through ZooKeeper on the first request that needs it
  (``internal_topic``: ``transaction_state_log_num_partitions`` partitions,
  ``transaction_state_log_replication_factor`` replicas, compacted, with
  ``transaction_state_log_min_isr``). A client asks its local broker, which forwards
  the request (TRANSACTION, its control frame's text) to the coordinator's broker
  and hands back the reply, as group requests go (``cluster.groups``). No coordinator
  reachable, a coordinator loading or moving: ``CoordinatorNotAvailableError``,
  ``CoordinatorLoadInProgressError``, ``NotCoordinatorError``, which the producer
  retries.
* **Every state change is replicated before it is answered** (acks=all, Kafka's
  ``appendTransactionToLog``): appended to the partition as its leader, refused while
  it is under its min ISR, and the request answered once the high watermark covers
  it: ``RequestTimedOutError`` after ``offsets_commit_timeout_ms``,
  ``NotCoordinatorError`` if the leadership is lost meanwhile.
* **Markers follow a replicated decision.** A transaction's markers go out only once
  its Prepare* state is under the high watermark, so a coordinator that takes over
  finds every decision a marker was written for. Each partition's leader gets them
  (TRANSACTION ``write_txn_markers``, Kafka's WriteTxnMarkers), appends them and
  answers once its high watermark covers them; a marker not written is sent again
  after ``limits.TRANSACTION_MARKER_RETRY_MS``. Every marker carries the coordinator's
  leader epoch. EndTxn is answered once every marker is written (a committing
  producer hears of it when read_committed consumers can see its records), retried
  as long as it takes; after ``offsets_commit_timeout_ms`` it is
  ``RequestTimedOutError`` (the decision stands) and the producer asks again. Never
  sooner: the producer's next transaction, at the same epoch, would otherwise find a
  partition whose leader has not heard of the end yet, and its first batch there
  would join the decided transaction without a verification.
* **A transaction's first batch in a partition is verified by the partition's
  leader** (KIP-890's implicit AddPartitionsToTxn, which shmlog's producer relies on).
  The appender holds that batch, and the producer's later ones for the partition
  (``Appender.set_transaction_verifier``), while ``verify_partition`` goes to the
  coordinator; the coordinator adds the partition to the transaction (replicated)
  and answers; the leader then admits the producer at that epoch and appends the
  held batches in order, or refuses them. The coordinator is found by the producer's
  transactional id: learned from the ``init_transactions`` replies this broker
  passes on, and carried by the batches other brokers forward
  (``ProducePartition.transactional_id``). A verification that cannot get an answer
  is asked again every ``limits.TRANSACTION_VERIFY_RETRY_MS``, and its batches
  refused with ``REQUEST_TIMED_OUT`` after ``forward_request_timeout_ms``.
* **AddPartitionsToTxn and AddOffsetsToTxn** (a partition added before its first
  batch) have each partition's leader admit the producer (``expect_transaction``)
  before they are answered.
* **Commits inside a transaction** (``txn_offset_commit``) go to the group's
  coordinator (``ClusterGroupService.txn_offset_commit``), which appends them as the
  producer's transactional batch: the offsets partition takes it once
  AddOffsetsToTxn added it. The marker in that partition ends them there.
* **Failover.** On becoming the leader of a partition of ``__transaction_state`` (or
  being elected again at a new epoch) this broker reads it back before it serves its
  ids, and finishes what it says: a stored decision's markers go out again once the
  partition's log end is under the high watermark. On losing it, it forgets those
  ids and answers their waiting requests ``NotCoordinatorError``.
* ``list_transactions`` and ``describe_transactions`` asked by a client gather every
  live broker's coordinator (a broker that does not answer is named in
  ``unreachable_brokers``).

Theory of operation
-------------------
Everything runs on the broker's loop thread. The coordinator
(``broker.transaction_coordinator``) is the single broker's, given a ``store`` that
appends as leader, ``add_partition`` that sends expectations and ``send_markers``.
What a request stored or sent is gathered while it runs (:class:`_Answer`); its
reply waits in ``_answers`` until all of it is done, checked by :meth:`poll` every
turn. Requests to peers go through ``ReplicaService.ask``; a request this broker
would send to itself is served in place, its reply handed to a
:class:`CallbackTicket`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..broker.group_service import with_request_signature
from ..broker.partition_host import PartitionHost
from ..broker.producer_registry import ProducerRegistry
from ..broker.service import RequestContext
from ..broker.transaction_coordinator import (
    TransactionCoordinator,
    TransactionMetadata,
    transaction_key,
    transaction_record,
)
from ..broker.transaction_operations import HELD_STATES
from ..broker.transaction_service import TRANSACTION_REQUESTS, TRANSACTION_STATE_TOPIC_CONFIG
from ..common import limits
from ..common.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    LocalProtocolError,
    NotCoordinatorError,
    RequestTimedOutError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from ..config.broker import BrokerConfig
from ..groups import offsets_partition
from ..protocol.control import require
from ..record.control import EndTransactionMarker
from ..record.records import encode_batch, now_ms
from ..shm.completion import CompletionCode
from ..zmq_replication import ReceivedRequest
from .groups import ClusterGroupService, commit_error
from .internal_topic import InternalTopic
from .replication.forwarding import wire_error
from .replication.messages import ErrorCode
from .replication.partition import PartitionReplica, Role
from .replication.replica_service import ReplicaService
from .transaction_channel import CallbackTicket, PeerTicket, TransactionChannel
from .transaction_markers import MarkerSender
from .transaction_verification import RETRIABLE, TransactionVerifier
from .zk.paths import NO_LEADER

log = logging.getLogger("shmlog.transactions")

__all__ = ["ClusterTransactionService", "CallbackTicket", "PeerTicket"]

# The requests a peer may send besides a client's: a leader's verification, and a
# coordinator's expectations and markers.
_BROKER_REQUESTS = ("verify_partition", "expect_transaction", "write_txn_markers",
                    "transaction_holders")
# The requests this service serves itself (the rest are the coordinator's).
_OWN_REQUESTS = ("add_offsets_to_txn",) + _BROKER_REQUESTS


@dataclasses.dataclass
class _Answer:
    """A request served here whose reply waits: for its stores to be replicated, the
    expectations it sent to be answered, and (an EndTxn) its markers."""
    ticket: Any
    deadline: int
    result: dict | ShmlogError | None = None
    stores: list = dataclasses.field(default_factory=list)   # (replica, epoch, last offset)
    expecting: int = 0
    failure: ShmlogError | None = None        # an expectation's refusal
    ending: str | None = None


class ClusterTransactionService:
    """The transaction requests of a cluster member (see the module's rules).

    Parameters
    ----------
    config : BrokerConfig
        ``transaction_state_log_num_partitions``, ``transaction_max_timeout_ms``,
        ``transactional_id_expiration_ms`` and the ``cluster`` table.
    host : PartitionHost
    context : RequestContext
    replication : ReplicaService
    producers : ProducerRegistry
        Its cluster-wide producer ids are given to transactional ids.
    groups : ClusterGroupService
        The group coordinator, for commits made inside transactions.
    """

    def __init__(self, config: BrokerConfig, host: PartitionHost, context: RequestContext,
                 replication: ReplicaService, producers: ProducerRegistry,
                 groups: ClusterGroupService):
        assert config.cluster is not None, "a cluster member's service"
        self.host = host
        self.appender = host.appender
        self.context = context
        self.replication = replication
        self.cluster = config.cluster
        self.groups = groups
        self.state_topic = InternalTopic(
            replication, TRANSACTION_STATE_TOPIC, config.transaction_state_log_num_partitions,
            self.cluster.transaction_state_log_replication_factor,
            {**TRANSACTION_STATE_TOPIC_CONFIG, "min.insync.replicas": min(
                self.cluster.transaction_state_log_min_isr,
                self.cluster.transaction_state_log_replication_factor)})
        self.coordinator = TransactionCoordinator(
            allocate_producer_id=lambda: producers.producer_ids.allocate(), store=self._store,
            add_partition=self._add_partition, send_markers=self._send_markers,
            max_timeout_ms=config.transaction_max_timeout_ms, forget=self._forget,
            expiration_ms=config.transactional_id_expiration_ms)
        self.transactional_ids = replication.forwarding.transactional_ids
        self._loaded: dict[int, int] = {}            # state partition -> leader epoch loaded
        self._barriers: dict[int, tuple] = {}        # state partition -> its load's log end
        self._decisions: dict[str, tuple] = {}       # id -> (replica, epoch, offset) stored
        self._answers: list[_Answer] = []
        self._current: _Answer | None = None         # the request being served
        self._adding: tuple[str, int] | None = None  # the partition a verification adds
        self.channel = TransactionChannel(replication, self.cluster.broker_id,
                                          self.cluster.forward_request_timeout_ms,
                                          self._peer_handlers)
        self.markers = MarkerSender(self.channel.ask, self._leadership,
                                    lambda: self.replication.view.topics, self._replicated,
                                    self.coordinator.markers_written)
        self.verifier = TransactionVerifier(host, replication.forwarding, self.cluster,
                                            self.channel.ask, self._coordinator_of)
        self._replies: list[tuple[Any, dict | ShmlogError]] = []
        # Clients' tickets whose requests went to peers (forwarded, gathered), by id.
        self._relayed: dict[int, Any] = {}
        self._next_check = 0
        replication.set_transaction_handler(self)

    # -- the service (a client's control requests) ----------------------------------------------
    def handlers(self) -> dict:
        handlers = {name: self._handler(name, remote=None)
                    for name in TRANSACTION_REQUESTS if name != "txn_offset_commit"}
        handlers["txn_offset_commit"] = self.groups.txn_offset_commit_handler()
        return handlers

    def _method(self, name: str):
        """The service's own request method of that name, else the coordinator's."""
        return getattr(self, name, None) if name in _OWN_REQUESTS \
            else getattr(self.coordinator, name)

    def _handler(self, name: str, remote):
        """A request as a handler: ``remote`` is the ticket of a peer's (or of this
        broker's own request of itself), None for a client's."""
        method = self._method(name)

        def handler(**fields):
            ticket = remote if remote is not None else self.context.ticket
            return self._route(name, fields, ticket, now_ms(), remote is not None)
        return with_request_signature(handler, method)

    def tick(self, now: int) -> None:
        self._sync_leadership()          # no timeout acts on ids of a partition lost
        self.coordinator.tick(now)

    def next_deadline(self) -> int | None:
        deadlines = [answer.deadline for answer in self._answers]
        for part in (self.coordinator.next_deadline(), self.verifier.next_deadline()):
            if part is not None:
                deadlines.append(part)
        return min(deadlines, default=None)

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        replies, self._replies = self._replies, []
        return replies

    def pending_tickets(self) -> list:
        """The clients' requests held here: waiting for what they stored and sent,
        or for the peers they went to (refused at a stop, not left to time out)."""
        return [answer.ticket for answer in self._answers
                if not isinstance(answer.ticket, (PeerTicket, CallbackTicket))] \
            + list(self._relayed.values())

    # -- routing --------------------------------------------------------------------------------
    def _route(self, name: str, fields: dict, ticket, now: int, remote: bool) -> dict | None:
        """Serve a request here if this broker coordinates its transactional id, else
        forward it (a peer's is refused instead)."""
        if name in ("list_transactions", "describe_transactions") and not remote:
            self.relaying(ticket)
            self.channel.gather(name, fields, lambda result: self.reply(ticket, {
                key: value for key, value in result.items() if key != "loaded"}))
            return None
        transactional_id = fields.get("transactional_id")
        if name in ("list_transactions", "describe_transactions") \
                or not isinstance(transactional_id, str) or not transactional_id:
            return self._call(name, fields, ticket, now)     # the coordinator checks it
        partition = self._state_partition(transactional_id)
        leader = self._coordinator_of(transactional_id)
        if leader == self.cluster.broker_id:
            replica = self.replication.replicas.get((TRANSACTION_STATE_TOPIC, partition))
            self._sync_leadership()
            if replica is None or replica.role is not Role.LEADER \
                    or self._loaded.get(partition) != replica.leader_epoch:
                raise CoordinatorLoadInProgressError(
                    f"broker {leader} is becoming the coordinator of "
                    f"{TRANSACTION_STATE_TOPIC}-{partition}")
            return self._call(name, fields, ticket, now)
        if remote:
            raise NotCoordinatorError(f"broker {self.cluster.broker_id} does not lead "
                                      f"{TRANSACTION_STATE_TOPIC}-{partition}")
        self.relaying(ticket)
        self.channel.ask(leader, name, fields,
                         lambda result: self._forwarded(name, fields, ticket, result))
        return None

    def _forwarded(self, name: str, fields: dict, ticket, result: dict | ShmlogError) -> None:
        """The coordinator's reply to a client's forwarded request; an
        init_transactions reply teaches this broker the producer's transactional id."""
        if name == "init_transactions" and isinstance(result, dict) \
                and isinstance(result.get("producer_id"), int):
            self.transactional_ids.learn(result["producer_id"], fields["transactional_id"])
        self.reply(ticket, result)

    def _call(self, name: str, fields: dict, ticket, now: int) -> dict | None:
        """Run the request here; its reply waits for what it stored and sent, and
        for the id's last store before it (a retry must not be answered on a state
        not replicated yet)."""
        answer = _Answer(ticket, now + self.cluster.offsets_commit_timeout_ms)
        transactional_id = fields.get("transactional_id")
        if isinstance(transactional_id, str):
            last = self._last_store(transactional_id)
            if last is not None:
                answer.stores.append(last)
        outer, self._current = self._current, answer      # a request to itself nests
        try:
            answer.result = self._method(name)(**fields, now=now)
        except ShmlogError as error:
            answer.result = error
        finally:
            self._current = outer
        if isinstance(answer.result, ShmlogError):
            raise answer.result
        if name == "end_txn":
            answer.ending = fields["transactional_id"]
        if name == "init_transactions":
            self.transactional_ids.learn(answer.result["producer_id"], fields["transactional_id"])
        if not answer.stores and not answer.expecting and answer.ending is None \
                and answer.failure is None:
            return answer.result
        self._answers.append(answer)
        return None

    def relaying(self, ticket) -> None:
        """A client's request goes to peers: its ticket is held until :meth:`reply`."""
        self._relayed[id(ticket)] = ticket

    def reply(self, ticket, result: dict | ShmlogError) -> None:
        """Answer a request held here, or by a part of this service (its operators'
        scans): over the channel for a peer's, else through :meth:`take_replies`."""
        if isinstance(ticket, (PeerTicket, CallbackTicket)):
            self.channel.reply(ticket, result)
        else:
            self._relayed.pop(id(ticket), None)
            self._replies.append((ticket, result))

    def _state_partition(self, transactional_id: str) -> int:
        count = self.state_topic.partition_count()
        if count is None:
            raise CoordinatorNotAvailableError(f"{TRANSACTION_STATE_TOPIC} is being created")
        return offsets_partition(transactional_id, count)

    def _coordinator_of(self, transactional_id: str) -> int:
        """The broker that coordinates the id now; raises when none does."""
        return self._leader_of(TRANSACTION_STATE_TOPIC, self._state_partition(transactional_id))

    def _leader_of(self, topic: str, partition: int) -> int:
        """The partition's live leader; CoordinatorNotAvailableError when none."""
        return self._leadership(topic, partition)[0]

    def _leadership(self, topic: str, partition: int) -> tuple[int, int]:
        """(live leader, leader epoch) of the partition as this broker sees it;
        CoordinatorNotAvailableError when it has none."""
        state = self.replication.view.state(topic, partition)
        leader = state[0].leader if state is not None else NO_LEADER
        if leader == NO_LEADER or leader not in self.replication.view.brokers:
            raise CoordinatorNotAvailableError(f"{topic}-{partition} has no live leader now")
        return leader, state[0].leader_epoch

    # -- a peer's requests ----------------------------------------------------------------------
    def serve(self, request: ReceivedRequest, now: int) -> None:
        """Serve a TRANSACTION request from a peer (``TransactionChannel.serve``)."""
        self.channel.serve(request, now)

    def _peer_handlers(self, ticket) -> dict:
        return {name: self._handler(name, remote=ticket)
                for name in TRANSACTION_REQUESTS + _BROKER_REQUESTS if name != "txn_offset_commit"}

    def add_offsets_to_txn(self, transactional_id, producer_id, producer_epoch, group_id, *,
                           now) -> dict:
        """Kafka's AddOffsetsToTxn: the group's offsets partition joins the
        transaction, its leader told to take the commits made in it."""
        partition = self.groups.offsets_partition(require(group_id, str, "group_id"))
        return self.coordinator.add_partitions_to_txn(
            transactional_id, producer_id, producer_epoch, [[OFFSETS_TOPIC, partition]], now=now)

    def verify_partition(self, transactional_id, topic, partition, producer_id,
                         producer_epoch, *, now) -> dict:
        """A leader's verification of a held batch (KIP-890): ``{"code": None}`` when
        the partition is in the producer's transaction now (added and stored if it
        was not), else the completion code that refuses the batch."""
        self.transactional_ids.learn(require(producer_id, int, "producer_id"),
                                     transactional_id)
        self._adding = (topic, partition)
        try:
            code = self.coordinator.verify_partition(topic, partition, producer_id,
                                                     require(producer_epoch, int,
                                                             "producer_epoch"), now=now)
        finally:
            self._adding = None
        metadata = self.coordinator.transactions.get(transactional_id)
        if code is CompletionCode.INVALID_TXN_STATE and metadata is not None \
                and metadata.state.value.startswith("Prepare"):
            raise ConcurrentTransactionsError(
                f"transaction {transactional_id!r} is still ending: retry")
        return {"code": None if code is None else int(code)}

    def transaction_holders(self, *, now) -> dict:
        """What this broker's coordinator holds (Kafka's DescribeTransactions of its
        ids with a transaction under way) and the partitions of
        ``__transaction_state`` it has loaded: what the operators' scans of a
        partition set its open transactions against."""
        return {"transactions": [metadata.describe(now)
                                 for metadata in self.coordinator.transactions.values()
                                 if metadata.state in HELD_STATES],
                "loaded": sorted(self._loaded)}

    def write_marker(self, topic: str, partition: int, marker: EndTransactionMarker) -> int:
        """Write ``marker`` to a partition this broker leads (an operator's abort of a
        hanging transaction): its offset."""
        self._led_replica(topic, partition)
        offset = self.host.write_marker(topic, partition, marker)
        if topic == OFFSETS_TOPIC:
            self.groups.transaction_ended(partition, marker.producer_id, marker.committed)
        return offset

    def expect_transaction(self, topic, partition, producer_id, producer_epoch, *, now) -> dict:
        """A coordinator added this partition to a transaction: admit the producer's
        first transactional batch at that epoch (this broker must lead it)."""
        replica = self._led_replica(require(topic, str, "topic"),
                                    require(partition, int, "partition"))
        if not self.appender.expect_transaction(replica.row, require(producer_id, int,
                                                                     "producer_id"),
                                                require(producer_epoch, int, "producer_epoch")):
            raise ConcurrentTransactionsError(
                f"{topic}-{partition} still holds a transaction of producer {producer_id} "
                f"under another epoch: retry once its marker is written")
        return {}

    def write_txn_markers(self, producer_id, producer_epoch, committed, coordinator_epoch,
                          partitions, *, now) -> dict:
        """Kafka's WriteTxnMarkers for the partitions this broker leads
        (``partitions``: [[topic, partition, leader epoch the coordinator saw]]):
        each marker appended, the reply (``errors``: [[topic, partition, error name,
        message]] for those not written) once the high watermark covers them. A
        partition led at another epoch than the one named takes no marker: a
        request sent to an earlier leadership never ends a later transaction."""
        marker = EndTransactionMarker(require(producer_id, int, "producer_id"),
                                      require(producer_epoch, int, "producer_epoch"),
                                      require(committed, bool, "committed"),
                                      require(coordinator_epoch, int, "coordinator_epoch"))
        errors = []
        entries = require(partitions, list, "partitions")
        if not all(isinstance(entry, list) and len(entry) == 3 for entry in entries):
            raise LocalProtocolError("write_txn_markers partitions are "
                                     "[topic, partition, leader epoch] each")
        for topic, partition, leader_epoch in entries:
            try:
                replica = self._led_replica(topic, partition)
                if replica.leader_epoch != leader_epoch:
                    # Sent for another leadership of this broker's (a late request):
                    # the coordinator asks again with the one it sees now.
                    raise NotCoordinatorError(
                        f"{topic}-{partition} is led at epoch {replica.leader_epoch}, not "
                        f"{leader_epoch}")
                offset = self.host.write_marker(topic, partition, marker)
            except ShmlogError as error:
                errors.append([topic, partition, type(error).__name__, str(error)])
                continue
            if topic == OFFSETS_TOPIC:
                self.groups.transaction_ended(partition, marker.producer_id, marker.committed)
            if self._current is not None:
                self._current.stores.append((replica, replica.leader_epoch, offset))
        return {"errors": errors}

    def _led_replica(self, topic: str, partition: int) -> PartitionReplica:
        replica = self.replication.replicas.get((topic, partition))
        if replica is None:
            if topic not in self.replication.view.topics:
                raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
            raise NotCoordinatorError(f"broker {self.cluster.broker_id} does not host "
                                      f"{topic}-{partition}")
        if replica.role is not Role.LEADER:
            raise NotCoordinatorError(f"broker {self.cluster.broker_id} does not lead "
                                      f"{topic}-{partition}")
        return replica

    # -- what the coordinator does through the cluster ------------------------------------------
    def _store(self, metadata: TransactionMetadata) -> None:
        """Append the id's state to its partition of __transaction_state as leader."""
        key, value = transaction_record(metadata)
        self._append_state(metadata.transactional_id, key, value)

    def _forget(self, transactional_id: str) -> None:
        self._append_state(transactional_id, transaction_key(transactional_id), None)
        self._decisions.pop(transactional_id, None)     # the id goes

    def _append_state(self, transactional_id: str, key: bytes, value: bytes | None) -> None:
        partition = self._state_partition(transactional_id)
        where = f"transaction {transactional_id!r}: {TRANSACTION_STATE_TOPIC}-{partition}"
        replica = self.replication.replicas.get((TRANSACTION_STATE_TOPIC, partition))
        if replica is None or replica.role is not Role.LEADER \
                or self._loaded.get(partition) != replica.leader_epoch:
            # Not leading it, or not at the epoch its ids were loaded at.
            raise commit_error(ErrorCode.NOT_LEADER_OR_FOLLOWER, where)
        if self.appender.under_min_isr(replica.row):       # nothing appended
            raise commit_error(ErrorCode.NOT_ENOUGH_REPLICAS, where)
        result, _ = self.appender.append(replica.row, encode_batch([value], keys=[key]))
        if result < 0:
            raise commit_error(wire_error(result), where)
        stored = (replica, replica.leader_epoch, result)
        self._decisions[transactional_id] = stored
        if self._current is not None:
            self._current.stores.append(stored)

    def _add_partition(self, topic: str, partition: int, producer_id: int,
                       producer_epoch: int) -> None:
        """Have the partition's leader admit the producer's first transactional batch
        (the request's answer waits for it); nothing for the partition a leader's
        verification adds (that leader admits it on the answer), nor at a load (the
        leaders keep their open transactions)."""
        if self._current is None or (topic, partition) == self._adding:
            return
        leader = self._leader_of(topic, partition)
        answer = self._current
        answer.expecting += 1

        def answered(result: dict | ShmlogError) -> None:
            answer.expecting -= 1
            if isinstance(result, ShmlogError) and answer.failure is None:
                answer.failure = result if isinstance(result, RETRIABLE) \
                    else ConcurrentTransactionsError(f"{topic}-{partition}: {result}")
        self.channel.ask(leader, "expect_transaction",
                         {"topic": topic, "partition": partition, "producer_id": producer_id,
                          "producer_epoch": producer_epoch}, answered)

    def _send_markers(self, transactional_id: str, marker: EndTransactionMarker,
                      partitions: list, round_: int) -> None:
        """Queue the markers: they go once the decision is replicated (:meth:`poll`)."""
        decision = self._last_store(transactional_id)
        epoch = decision[1] if decision is not None else 0
        self.markers.queue(transactional_id, dataclasses.replace(marker, coordinator_epoch=epoch),
                           partitions, round_, decision)

    def _last_store(self, transactional_id: str) -> tuple | None:
        """(replica, leader epoch, offset) of the id's last state stored here, or of
        the last record its partition's load read (its state may be one of those)."""
        decision = self._decisions.get(transactional_id)
        partition = self._state_partition(transactional_id)
        barrier = self._barriers.get(partition)
        if barrier is not None and (decision is None or decision[1] != barrier[1]
                                    or decision[2] < barrier[2]):
            return barrier
        return decision

    # -- every loop turn ------------------------------------------------------------------------
    def poll(self, now: int) -> None:
        """Answer what is done, send the markers whose decision is replicated and the
        verifications due; now and then follow the leadership of
        ``__transaction_state``."""
        self.markers.poll(now)
        self.verifier.poll(now)
        if self._answers:
            self._release_answers(now)
        if now >= self._next_check:
            self._next_check = now + limits.COORDINATOR_CHECK_INTERVAL_MS
            self._sync_leadership()

    def _replicated(self, stored: tuple | None) -> bool | None:
        """Whether a store is under its high watermark (None: it never will be, the
        leadership lost)."""
        if stored is None:
            return True
        replica, epoch, offset = stored
        if replica.role is not Role.LEADER or replica.leader_epoch != epoch:
            return None
        return self.appender.high_watermark(replica.row) > offset

    def _release_answers(self, now: int) -> None:
        waiting = []
        for answer in self._answers:
            outcome = self._outcome(answer, now)
            if outcome is None:
                waiting.append(answer)
            else:
                self.reply(answer.ticket, outcome)
        self._answers = waiting

    def _outcome(self, answer: _Answer, now: int) -> dict | ShmlogError | None:
        for stored in answer.stores:
            replicated = self._replicated(stored)
            if replicated is None:
                return NotCoordinatorError(f"broker {self.cluster.broker_id} lost the "
                                           f"leadership of {stored[0].hosted.topic}-"
                                           f"{stored[0].hosted.partition} before its "
                                           f"write was replicated: ask again")
            if not replicated:
                return RequestTimedOutError("a write was not replicated in time (its outcome "
                                            "is unknown): ask again") \
                    if now >= answer.deadline else None
        # An end waits for every marker: a producer told of it begins its next
        # transaction at the same epoch, whose first batch in a partition still
        # lacking a marker would join the decided one there unverified.
        unfinished = answer.expecting or (answer.ending is not None
                                          and self.coordinator.markers_unwritten(answer.ending))
        if unfinished:
            return None if now < answer.deadline else RequestTimedOutError(
                "the partitions' leaders did not answer in time (a decision stands): "
                "ask again")
        return answer.failure or answer.result

    # -- loading and unloading (failover) -------------------------------------------------------
    def _sync_leadership(self) -> None:
        """Load the ids of state partitions this broker now leads (again at a new
        epoch); forget those of partitions it stopped leading."""
        assignment = self.replication.view.topics.get(TRANSACTION_STATE_TOPIC)
        count = len(assignment.partitions) if assignment is not None else 0
        for partition in range(count):
            replica = self.replication.replicas.get((TRANSACTION_STATE_TOPIC, partition))
            leading = replica is not None and replica.role is Role.LEADER
            loaded = self._loaded.get(partition)
            if loaded is not None and (not leading or loaded != replica.leader_epoch):
                self._unload(partition, count)
            if leading and partition not in self._loaded:
                self._load(partition, replica, count)
        for partition in [partition for partition in self._loaded if partition >= count]:
            self._unload(partition, count)

    def _load(self, partition: int, replica: PartitionReplica, count: int) -> None:
        # What it reads is the truth from now on, once replicated: a decision read
        # here has its markers sent only when the log end read is under the HW.
        self._barriers[partition] = (replica, replica.leader_epoch,
                                     replica.log.log_end_offset - 1)
        try:
            self.coordinator.load(
                ((record.key, record.value) for record in self.host.internal_records(
                    TRANSACTION_STATE_TOPIC, partition) if record.marker is None), now_ms())
        except ShmlogError as error:
            log.error("cannot load %s-%d: %s (its transactions wait)", TRANSACTION_STATE_TOPIC,
                      partition, error)
            self.coordinator.unload(lambda name: offsets_partition(name, count) == partition)
            return
        self._loaded[partition] = replica.leader_epoch
        ids = [name for name in self.coordinator.transactions
               if offsets_partition(name, count) == partition]
        for name in ids:
            metadata = self.coordinator.transactions[name]
            self.transactional_ids.learn(metadata.producer_id, name)
        log.info("coordinator of %s-%d (epoch %d): %d transactional ids loaded",
                 TRANSACTION_STATE_TOPIC, partition, replica.leader_epoch, len(ids))

    def _unload(self, partition: int, count: int) -> None:
        del self._loaded[partition]
        self._barriers.pop(partition, None)
        gone = set(self.coordinator.unload(
            lambda name: count == 0 or offsets_partition(name, count) == partition))
        for name in gone:
            self._decisions.pop(name, None)
        self.markers.forget(gone)
        log.info("no longer coordinator of %s-%d: %d transactional ids unloaded",
                 TRANSACTION_STATE_TOPIC, partition, len(gone))

