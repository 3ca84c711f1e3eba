"""Consumer groups across hosts: the group requests of a cluster member (Kafka 2.8's
GroupCoordinator and GroupMetadataManager over a replicated ``__consumer_offsets``).

Rules
-----
* **The coordinator of a group is the leader of its offsets partition**
  (``groups.offsets_partition``), as in Kafka. ``__consumer_offsets`` is a cluster
  topic made through ZooKeeper like any other, by the broker itself on the first
  group request that needs it (Kafka creates it on the first FindCoordinator):
  ``offsets_topic_num_partitions`` partitions, ``offsets_topic_replication_factor``
  replicas (Kafka's default 3), ``group_offsets.OFFSETS_TOPIC_CONFIG`` (compacted) and the
  broker default ``min.insync.replicas``. While fewer brokers are live than the
  factor it is not created and members hear ``CoordinatorNotAvailableError``
  (Kafka 2.8 does the same; nothing is capped). Clients still cannot create,
  delete or produce to it (``internal_topics``).
* **Members talk to their local broker.** A group request for a group this broker
  does not coordinate is forwarded, as its control frame's text, to the
  coordinator's broker over the replication endpoint (GROUP / GROUP_RESPONSE in
  ``replication``), and the coordinator's reply goes back to the member as this
  broker's. A join waits for its rebalance: it is given the member's rebalance
  timeout plus ``limits.GROUP_JOIN_FORWARD_MARGIN_MS``; any other request
  ``forward.request.timeout.ms``. A forward that gets no answer, or whose
  coordinator is no longer the partition's leader at the epoch it was sent to, is
  answered ``CoordinatorNotAvailableError`` / ``NotCoordinatorError`` at once. A
  broker never forwards a forwarded request again: not leading, it answers
  ``NotCoordinatorError``.
* **Commits go through the replicated log with acks=all**
  (``GroupMetadataManager.storeOffsets`` with requiredAcks -1): the coordinator
  appends the offset records as leader (stamped with its leader epoch) and answers
  only when the high watermark covers them, or with Kafka's mapping of the append's
  error (:func:`commit_error`): NOT_ENOUGH_REPLICAS(_AFTER_APPEND) and
  UNKNOWN_TOPIC_OR_PARTITION give COORDINATOR_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
  and KAFKA_STORAGE_ERROR give NOT_COORDINATOR, MESSAGE_TOO_LARGE a too-large
  commit, and ``offsets.commit.timeout.ms`` passing REQUEST_TIMED_OUT. A commit
  acknowledged is in the log of every ISR member, so a failover keeps it.
  (Kafka keeps a commit out of its cache until it is replicated; here the cache
  takes it at the append, so a fetch on the same coordinator may see a commit whose
  answer is still to come. An unacknowledged commit can be lost at a failover;
  an acknowledged one cannot.)
* **Failover** (``loadGroupsForPartition`` / ``removeGroupsForPartition``). On
  becoming the leader of an offsets partition (or being elected again at a new
  epoch) this broker reads that partition's records back, up to its log end (as
  Kafka does: the leader's log is the truth), before it serves its groups
  (``CoordinatorLoadInProgressError`` until then, and again while a read fails).
  Kafka loads on a thread of its own; here the loop reads it at once: a compacted
  offsets partition is small (one record per group and partition); on losing it,
  it forgets the
  partition's groups and answers their held joins and commits
  ``NotCoordinatorError``. Group *membership* is not stored (Kafka also writes
  members and generation): after a failover members find the new coordinator by
  themselves (``group_member.GroupMember`` retries coordinator errors), are unknown to it,
  and join again as new members; their committed offsets are there.
* ``list_groups`` asked by a client lists the groups of the whole cluster: this
  broker's, and every other live broker's, asked with a GROUP each (Kafka's
  ListGroups is per broker, and its admin client asks every broker: here the
  local broker does it for the client). A broker that does not answer within
  ``forward.request.timeout.ms`` is named in the reply's ``unreachable_brokers``.
  Asked by a peer, it lists this broker's groups only.

Theory of operation
-------------------
Everything runs on the broker's loop thread. The broker's control endpoint hands
group requests to :meth:`ClusterGroupService.handlers`; the replica service hands
GROUP requests from peers to :meth:`ClusterGroupService.serve`, their answers and
failures to :meth:`~ClusterGroupService.answered` and
:meth:`~ClusterGroupService.failed`, and calls :meth:`~ClusterGroupService.poll` at
the end of every turn: that answers the commits the high watermark now covers, and
every ``limits.COORDINATOR_CHECK_INTERVAL_MS`` loads or unloads offsets partitions
whose leadership changed and refuses forwards whose coordinator moved. A request
served for a peer carries a :class:`RemoteTicket`: its reply goes back over the
replication endpoint instead of the control socket.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..broker.group_coordinator import GroupCoordinator
from ..broker.group_offsets import OFFSETS_TOPIC_CONFIG
from ..broker.group_service import GROUP_REQUESTS, coordinator_config, with_request_signature
from ..broker.partition_host import PartitionHost
from ..broker.service import RequestContext
from ..common import limits
from ..common.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    LocalProtocolError,
    NotCoordinatorError,
    RecordTooLargeError,
    RequestTimedOutError,
    ShmlogError,
)
from ..config.broker import BrokerConfig
from ..groups import OFFSETS_TOPIC, offsets_partition
from ..protocol.control import (
    decode_reply,
    encode_request,
    encode_result,
    handle_frame,
    require,
)
from ..record.records import encode_batch, now_ms
from ..shm.completion import CompletionCode, completion_error
from ..zmq_replication import ReceivedRequest, ReceivedResponse, RequestFailed
from .internal_topic import InternalTopic
from .replication.forwarding import wire_error
from .replication.messages import Error, ErrorCode, GroupRequest, GroupResponse
from .replication.partition import PartitionReplica, Role
from .replication.replica_service import ReplicaService
from .zk.paths import NO_LEADER

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterGroupService", "RemoteTicket", "commit_error"]


def commit_error(error: ErrorCode, where: str) -> ShmlogError | None:
    """The error a commit is answered with when its append ended in ``error``
    (Kafka 2.8's ``GroupMetadataManager.storeOffsets`` mapping), None for NONE."""
    if error is ErrorCode.NONE:
        return None
    if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return CoordinatorNotAvailableError(f"{where}: {error.name} (retriable)")
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return NotCoordinatorError(f"{where}: {error.name}; find the coordinator again")
    if error is ErrorCode.MESSAGE_TOO_LARGE:
        return RecordTooLargeError(f"{where}: the commit's records are too large "
                                   f"(Kafka's INVALID_COMMIT_OFFSET_SIZE)")
    if error is ErrorCode.REQUEST_TIMED_OUT:
        return RequestTimedOutError(f"{where}: not replicated within offsets.commit.timeout.ms; "
                                    f"its outcome is unknown, commit again")
    return ShmlogError(f"{where}: {error.name}")


@dataclasses.dataclass(frozen=True, eq=False)
class RemoteTicket:
    """The ticket of a group request a peer forwarded: answered over the replication
    endpoint (each ticket is its own: compared and hashed by identity)."""
    request: ReceivedRequest


@dataclasses.dataclass
class _Forward:
    """A request forwarded to the coordinator's broker, waiting for its answer."""
    ticket: Any
    partition: int
    sent_to: tuple[int, int]              # (leader, leader epoch)


@dataclasses.dataclass
class _Gathering:
    """A client's list_groups: this broker's groups and the peers still to answer."""
    ticket: Any
    groups: list
    waiting: set                          # correlation ids of the peers' list_groups
    unreachable: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _PendingCommit:
    """A commit appended, waiting for the high watermark (Kafka's DelayedProduce)."""
    ticket: Any
    replica: PartitionReplica
    leader_epoch: int
    last_offset: int
    deadline: int


class ClusterGroupService:
    """The group requests of a cluster member (see the module's rules).

    Parameters
    ----------
    config : BrokerConfig
        The group settings, ``offsets_topic_num_partitions`` and the ``cluster``
        table (``offsets_topic_replication_factor``, ``offsets_commit_timeout_ms``,
        ``forward_request_timeout_ms``).
    host : PartitionHost
    context : RequestContext
        Who sent the control request being handled.
    replication : ReplicaService
        This broker's replicas, cluster view, endpoint and ZooKeeper session; it
        hands this service GROUP messages and calls :meth:`poll`.
    """

    def __init__(self, config: BrokerConfig, host: PartitionHost, context: RequestContext,
                 replication: ReplicaService):
        assert config.cluster is not None, "a cluster member's service"
        self.host = host
        self.context = context
        self.replication = replication
        self.cluster = config.cluster
        self.offsets_topic_partitions = config.offsets_topic_num_partitions
        self.coordinator = GroupCoordinator(
            coordinator_config(config),
            topics=host.partition_counts, append_offsets=self._append_offsets,
            end_offset=self._log_end_offset)
        self._loaded: dict[int, int] = {}       # offsets partition -> leader epoch loaded
        self._forwards: dict[int, _Forward] = {}    # correlation id -> forward
        self._gatherings: dict[int, _Gathering] = {}   # correlation id -> its list_groups
        self._commits: list[_PendingCommit] = []
        self._replies: list[tuple[Any, dict | ShmlogError]] = []
        self._appended: tuple[PartitionReplica, int, int] | None = None
        self.offsets_topic = InternalTopic(
            replication, OFFSETS_TOPIC, config.offsets_topic_num_partitions,
            config.cluster.offsets_topic_replication_factor, OFFSETS_TOPIC_CONFIG)
        self._next_check = 0
        host.when_topics_change(self.coordinator.topics_changed)
        replication.set_group_handler(self)

    # -- the service (control requests) -----------------------------------------------------
    def handlers(self) -> dict:
        return {name: self._handler(name, remote=None) for name in GROUP_REQUESTS}

    def txn_offset_commit_handler(self):
        """The handler of a client's commit inside a transaction (the transaction
        service serves it under its name)."""
        return self._handler("txn_offset_commit", remote=None)

    def _method(self, name: str):
        return self.txn_offset_commit if name == "txn_offset_commit" \
            else getattr(self.coordinator, name)

    def _handler(self, name: str, remote: RemoteTicket | None):
        """A group request as a handler: served here, forwarded, or refused."""
        method = self._method(name)

        def handler(**fields):
            ticket = remote if remote is not None else self.context.ticket
            return self._route(name, fields, ticket, now_ms(), remote is not None)
        return with_request_signature(handler, method)

    def tick(self, now: int) -> None:
        self.coordinator.tick(now)
        self._release_commits(now)

    def next_deadline(self) -> int | None:
        deadlines = [pending.deadline for pending in self._commits]
        coordinator = self.coordinator.next_deadline()
        if coordinator is not None:
            deadlines.append(coordinator)
        return min(deadlines, default=None)

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        for ticket, result in self.coordinator.take_replies():
            self._reply(ticket, result)
        replies, self._replies = self._replies, []
        return replies

    def pending_tickets(self) -> list:
        tickets = self.coordinator.pending_tickets()
        tickets += [forward.ticket for forward in self._forwards.values()]
        tickets += [pending.ticket for pending in self._commits]
        tickets += list({id(gathering): gathering.ticket
                         for gathering in self._gatherings.values()}.values())
        return [ticket for ticket in tickets if not isinstance(ticket, RemoteTicket)]

    # -- routing --------------------------------------------------------------------------
    def _route(self, name: str, fields: dict, ticket, now: int, remote: bool) -> dict | None:
        """Serve a request here if this broker coordinates its group, else forward it
        (or, for a peer's request, refuse it)."""
        group_id = fields.get("group_id")
        if name == "list_groups" and not remote:
            return self._gather(ticket, now)
        if name == "list_groups" or not isinstance(group_id, str) or not group_id:
            return self._call(name, fields, ticket, now)     # the coordinator checks it
        partition = self.offsets_partition(group_id)
        replica = self.replication.replicas.get((OFFSETS_TOPIC, partition))
        if replica is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition} (group {group_id!r}) is not hosted here yet")
        if replica.role is Role.LEADER:
            self._sync_leadership()
            if self._loaded.get(partition) != replica.leader_epoch:
                raise CoordinatorLoadInProgressError(
                    f"broker {self.cluster.broker_id} is loading {OFFSETS_TOPIC}-{partition}")
            return self._call(name, fields, ticket, now)
        if remote:
            raise NotCoordinatorError(f"broker {self.cluster.broker_id} does not lead "
                                      f"{OFFSETS_TOPIC}-{partition} (group {group_id!r})")
        return self._forward(name, fields, ticket, partition, replica)

    def _call(self, name: str, fields: dict, ticket, now: int) -> dict | None:
        """Run the coordinator's request; a commit that appended waits for its HW."""
        self._appended = None
        result = self._method(name)(**fields, ticket=ticket, now=now)
        if name in ("commit_offsets", "txn_offset_commit") and self._appended is not None:
            replica, leader_epoch, last_offset = self._appended
            self._commits.append(_PendingCommit(ticket, replica, leader_epoch, last_offset,
                                                now + self.cluster.offsets_commit_timeout_ms))
            return None
        return result

    def ensure_offsets_topic(self) -> bool:
        """Whether ``__consumer_offsets`` exists in this broker's view; if not, have it
        made (as a group request does, and Kafka's first FindCoordinator)."""
        return self.offsets_topic.partition_count() is not None

    def offsets_partition(self, group_id: str) -> int:
        """The group's partition of ``__consumer_offsets``; creates the offsets topic
        if there is none (``CoordinatorNotAvailableError`` until it exists), as the
        single broker's ``GroupService.offsets_partition`` does."""
        count = self.offsets_topic.partition_count()
        if count is None:
            raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} is being created")
        return offsets_partition(group_id, count)

    def _reply(self, ticket, result: dict | ShmlogError) -> None:
        if isinstance(ticket, RemoteTicket):
            self._answer_remote(ticket, encode_result(result))
        else:
            self._replies.append((ticket, result))

    def _answer_remote(self, ticket: RemoteTicket, frame: bytes) -> None:
        text = frame.decode()
        if len(text) > limits.GROUP_FORWARD_TEXT_LENGTH_MAX:
            text = encode_result(LocalProtocolError(
                f"the coordinator's reply is {len(text)} characters, more than a forwarded "
                f"reply carries ({limits.GROUP_FORWARD_TEXT_LENGTH_MAX}); ask the "
                f"coordinator's broker")).decode()
        try:
            self.replication.endpoint.reply(ticket.request, GroupResponse(text))
        except ShmlogError as error:
            log.warning("cannot answer a forwarded group request: %s", error)

    # -- the member's broker: forwarding ------------------------------------------------------
    def _forward(self, name: str, fields: dict, ticket, partition: int,
                 replica: PartitionReplica) -> None:
        leader, leader_epoch = replica.leader_id, replica.leader_epoch
        if leader == NO_LEADER or leader not in self.replication.view.brokers:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition} has no live leader now")
        if leader == self.cluster.broker_id:          # elected, its state not applied yet
            raise CoordinatorLoadInProgressError(
                f"broker {leader} is becoming the leader of {OFFSETS_TOPIC}-{partition}")
        text = encode_request(name, **fields).decode()
        if len(text) > limits.GROUP_FORWARD_TEXT_LENGTH_MAX:
            raise LocalProtocolError(f"a {name} of {len(text)} characters is longer than a "
                                     f"forwarded request carries "
                                     f"({limits.GROUP_FORWARD_TEXT_LENGTH_MAX})")
        if name == "join_group":
            rebalance_timeout_ms = fields.get("rebalance_timeout_ms", 300_000)
            timeout_ms = (rebalance_timeout_ms if isinstance(rebalance_timeout_ms, int)
                          else 300_000) + limits.GROUP_JOIN_FORWARD_MARGIN_MS
        else:
            timeout_ms = self.cluster.forward_request_timeout_ms
        correlation_id = self.replication.endpoint.request(
            leader, GroupRequest(text), max(1, min(timeout_ms, limits.CLIENT_WAIT_MS_MAX)))
        self._forwards[correlation_id] = _Forward(ticket, partition, (leader, leader_epoch))
        return None

    def _gather(self, ticket, now: int) -> dict | None:
        """A client's list_groups: this broker's groups, and every live peer's."""
        groups = self.coordinator.list_groups(ticket=ticket, now=now)["groups"]
        peers = sorted(set(self.replication.view.brokers) - {self.cluster.broker_id})
        if not peers:
            return {"groups": groups, "unreachable_brokers": []}
        gathering = _Gathering(ticket, groups, set())
        for peer in peers:
            correlation_id = self.replication.endpoint.request(
                peer, GroupRequest(encode_request("list_groups").decode()),
                self.cluster.forward_request_timeout_ms)
            gathering.waiting.add(correlation_id)
            self._gatherings[correlation_id] = gathering
        return None

    def _gathered(self, correlation_id: int, peer_id: int, groups: list | None) -> None:
        """One peer's groups (None: it did not answer); the reply once all have."""
        gathering = self._gatherings.pop(correlation_id)
        gathering.waiting.discard(correlation_id)
        if groups is None:
            gathering.unreachable.append(peer_id)
        else:
            gathering.groups += groups
        if not gathering.waiting:
            self._replies.append((gathering.ticket, {
                "groups": sorted(gathering.groups, key=lambda group: group["group_id"]),
                "unreachable_brokers": sorted(gathering.unreachable)}))

    def answered(self, event: ReceivedResponse, now: int) -> bool:
        """Take the coordinator's answer to a forward; False when it is not one."""
        body = event.message.body
        if event.message.correlation_id in self._gatherings:
            try:
                groups = decode_reply(body.reply.encode())["groups"] \
                    if isinstance(body, GroupResponse) else None
            except (ShmlogError, KeyError):
                groups = None
            self._gathered(event.message.correlation_id, event.peer_id,
                           groups if isinstance(groups, list) else None)
            return True
        forward = self._forwards.pop(event.message.correlation_id, None)
        if forward is None:
            return isinstance(body, GroupResponse)       # late: already answered
        if isinstance(body, GroupResponse):
            try:
                result = decode_reply(body.reply.encode())
            except ShmlogError as error:
                result = error
        else:
            detail = body.message if isinstance(body, Error) else type(body).__name__
            result = CoordinatorNotAvailableError(
                f"broker {event.peer_id} refused a forwarded group request: {detail}")
        self._replies.append((forward.ticket, result))
        return True

    def failed(self, event: RequestFailed, now: int) -> bool:
        """A forward got no answer: the member asks again (Kafka's client marks the
        coordinator unknown). False when the request was not a forward."""
        if event.correlation_id in self._gatherings:
            self._gathered(event.correlation_id, event.peer_id, None)
            return True
        forward = self._forwards.pop(event.correlation_id, None)
        if forward is None:
            return False
        self._replies.append((forward.ticket, CoordinatorNotAvailableError(
            f"the coordinator's broker {event.peer_id} did not answer ({event.reason.value})")))
        return True

    # -- the coordinator's broker ---------------------------------------------------------------
    def serve(self, request: ReceivedRequest, now: int) -> None:
        """Serve a GROUP request from a peer: answered now, or later (a join, a
        commit) through its :class:`RemoteTicket`."""
        ticket = RemoteTicket(request)
        handlers = {name: self._handler(name, remote=ticket)
                    for name in GROUP_REQUESTS + ("txn_offset_commit",)}
        reply = handle_frame(request.message.body.request.encode(), handlers)
        if reply is not None:
            self._answer_remote(ticket, reply)

    def txn_offset_commit(self, transactional_id, group_id, producer_id, producer_epoch,
                          offsets, member_id="", generation=-1, group_instance_id=None, *,
                          ticket, now) -> dict:
        """Kafka's TxnOffsetCommit: ``offsets`` committed for the group when the
        producer's transaction commits, appended as its transactional batch (the
        offsets partition takes it once AddOffsetsToTxn added it there)."""
        producer_id = require(producer_id, int, "producer_id")
        producer_epoch = require(producer_epoch, int, "producer_epoch")
        if isinstance(transactional_id, str) and transactional_id:
            # For a verification, should the partition's leader have changed since.
            self.replication.forwarding.transactional_ids.learn(producer_id, transactional_id)
        return self.coordinator.txn_offset_commit(
            group_id, offsets, producer_id, member_id, generation, group_instance_id,
            append_offsets=lambda group, records: self._append_offsets(
                group, records, producer_id, producer_epoch),
            now=now)

    def transaction_ended(self, partition: int, producer_id: int, committed: bool) -> None:
        """A marker of the producer's transaction went into ``partition`` of
        __consumer_offsets, which this broker leads: its groups' pending commits
        are kept or dropped (a partition not loaded yet reads the marker back)."""
        count = self.offsets_topic.partition_count()
        if count is None:
            return
        self.coordinator.offsets.complete_transaction(
            producer_id, committed,
            lambda group_id: offsets_partition(group_id, count) == partition)

    def _append_offsets(self, group_id: str, records: list, producer_id: int = -1,
                        producer_epoch: int = -1) -> None:
        """Append commit records to the group's offsets partition as its leader (with a
        producer id, as a batch of its transaction); the caller waits for the high
        watermark (``_call``)."""
        if not records:
            return
        partition = self.offsets_partition(group_id)
        where = f"group {group_id!r}: {OFFSETS_TOPIC}-{partition}"
        replica = self.replication.replicas.get((OFFSETS_TOPIC, partition))
        if replica is None or replica.role is not Role.LEADER:
            raise commit_error(ErrorCode.NOT_LEADER_OR_FOLLOWER, where)
        appender = self.host.appender
        if appender.under_min_isr(replica.row):       # nothing appended (Kafka's order)
            raise commit_error(ErrorCode.NOT_ENOUGH_REPLICAS, where)
        transactional = producer_id >= 0
        result, _ = appender.append(replica.row, encode_batch(
            [value for _, value in records], keys=[key for key, _ in records],
            producer_id=producer_id, producer_epoch=producer_epoch,
            transactional=transactional), sequenced=not transactional)
        if result == -CompletionCode.TRANSACTION_VERIFYING:
            raise ConcurrentTransactionsError(
                f"{where}: the transaction's coordinator is asked whether it added the "
                f"offsets partition (it has a new leader): retry")
        if transactional and -result in (CompletionCode.INVALID_TXN_STATE,
                                         CompletionCode.INVALID_PRODUCER_EPOCH):
            raise completion_error(-result, OFFSETS_TOPIC, partition)
        if result < 0:
            raise commit_error(wire_error(result), where)
        self._appended = (replica, replica.leader_epoch, result + len(records) - 1)

    def _log_end_offset(self, topic: str, partition: int) -> int | None:
        try:
            return self.host.partition(topic, partition).log.log_end_offset
        except ShmlogError:
            return None

    # -- every loop turn ------------------------------------------------------------------------
    def poll(self, now: int) -> None:
        """Answer commits the high watermark covers; now and then, follow the offsets
        partitions' leadership and refuse forwards whose coordinator moved."""
        self._release_commits(now)
        if now < self._next_check:
            return
        self._next_check = now + limits.COORDINATOR_CHECK_INTERVAL_MS
        self._sync_leadership()
        for correlation_id, forward in list(self._forwards.items()):
            replica = self.replication.replicas.get((OFFSETS_TOPIC, forward.partition))
            if replica is None or (replica.leader_id, replica.leader_epoch) != forward.sent_to:
                del self._forwards[correlation_id]       # its late answer is dropped
                self._replies.append((forward.ticket, NotCoordinatorError(
                    f"the coordinator of {OFFSETS_TOPIC}-{forward.partition} moved")))

    def _release_commits(self, now: int) -> None:
        if not self._commits:
            return
        waiting = []
        for pending in self._commits:
            outcome = self._commit_outcome(pending, now)
            if outcome is None:
                waiting.append(pending)
            else:
                self._reply(pending.ticket, outcome)
        self._commits = waiting

    def _commit_outcome(self, pending: _PendingCommit, now: int) -> dict | ShmlogError | None:
        """Kafka's DelayedProduce for one commit, its error mapped by commit_error."""
        replica, appender = pending.replica, self.host.appender
        where = f"a commit to {OFFSETS_TOPIC}-{replica.hosted.partition}"
        if replica.role is not Role.LEADER or replica.leader_epoch != pending.leader_epoch:
            return commit_error(ErrorCode.NOT_LEADER_OR_FOLLOWER, where)
        if appender.high_watermark(replica.row) > pending.last_offset:
            if appender.under_min_isr(replica.row):
                return commit_error(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, where)
            return {}
        if now >= pending.deadline:
            return commit_error(ErrorCode.REQUEST_TIMED_OUT, where)
        return None

    # -- loading and unloading (failover) ---------------------------------------------------------
    def _sync_leadership(self) -> None:
        """Load the groups of offsets partitions this broker now leads (again at a
        new epoch: another leader may have taken commits meanwhile); forget those of
        partitions it stopped leading."""
        assignment = self.replication.view.topics.get(OFFSETS_TOPIC)
        count = len(assignment.partitions) if assignment is not None else 0
        for partition in range(count):
            replica = self.replication.replicas.get((OFFSETS_TOPIC, partition))
            leading = replica is not None and replica.role is Role.LEADER
            loaded = self._loaded.get(partition)
            if loaded is not None and (not leading or loaded != replica.leader_epoch):
                self._unload(partition, count)
            if leading and partition not in self._loaded:
                self._load(partition, replica, count)
        for partition in [partition for partition in self._loaded if partition >= count]:
            self._unload(partition, count)        # the topic went

    def _load(self, partition: int, replica: PartitionReplica, count: int) -> None:
        try:
            self.coordinator.load(self.host.internal_records(OFFSETS_TOPIC, partition),
                                  lambda group_id: offsets_partition(group_id, count) == partition)
        except ShmlogError as error:
            log.error("cannot load %s-%d: %s (its groups wait)", OFFSETS_TOPIC, partition, error)
            return
        self._loaded[partition] = replica.leader_epoch
        groups = sum(1 for group_id in self.coordinator.groups
                     if offsets_partition(group_id, count) == partition)
        log.info("coordinator of %s-%d (epoch %d): %d groups loaded", OFFSETS_TOPIC, partition,
                 replica.leader_epoch, groups)

    def _unload(self, partition: int, count: int) -> None:
        del self._loaded[partition]
        error = NotCoordinatorError(f"broker {self.cluster.broker_id} no longer leads "
                                    f"{OFFSETS_TOPIC}-{partition}")
        gone = self.coordinator.unload(
            lambda group_id: count == 0 or offsets_partition(group_id, count) == partition,
            error)
        stranded = [pending for pending in self._commits
                    if pending.replica.hosted.partition == partition]
        self._commits = [pending for pending in self._commits if pending not in stranded]
        for pending in stranded:
            self._reply(pending.ticket, error)
        log.info("no longer coordinator of %s-%d: %d groups unloaded", OFFSETS_TOPIC, partition,
                 len(gone))
