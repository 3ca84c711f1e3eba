"""The transaction requests (Kafka's InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, and the operators'
DescribeTransactions and ListTransactions): the transaction coordinator
(``transaction_coordinator``) put into the broker.

Rules
-----
* The coordinator's states are records of the compacted internal topic
  ``__transaction_state`` (``transaction_state_log_num_partitions`` partitions,
  made on the first ``init_transactions``, as Kafka does), a transactional id's in
  partition ``groups.offsets_partition(id)``, appended through the partition host
  before a request is answered and read back when the broker starts.
* Adding a partition to a transaction tells its host to admit the producer's first
  transactional batch there (``PartitionHost.expect_transaction``); the markers go
  through ``PartitionHost.write_marker``. A marker in a partition of
  ``__consumer_offsets`` also ends the pending commits it covers
  (``GroupService.transaction_ended``).
* A commit inside a transaction (``txn_offset_commit``) is taken only from the
  producer that holds the transactional id, at its epoch, once ``add_offsets_to_txn``
  added the group's offsets partition to its transaction.

Theory of operation
-------------------
A :class:`~shmlog.broker.service.Service` whose only clock is the coordinator's: the
transactions' timeouts and the retry of markers not written.
"""

from __future__ import annotations

from typing import Any

from ..common.errors import (
    ConcurrentTransactionsError,
    InvalidTxnStateError,
    ShmlogError,
)
from ..common.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from ..config.broker import BrokerConfig
from ..groups import offsets_partition
from ..protocol.control import require
from ..record.control import EndTransactionMarker
from ..record.records import encode_batch, now_ms
from .group_service import GroupService, with_request_signature
from .partition_host import PartitionHost
from .producer_registry import ProducerRegistry
from .transaction_coordinator import (
    TransactionCoordinator,
    TransactionMetadata,
    transaction_key,
    transaction_record,
)

__all__ = ["TransactionService", "TRANSACTION_STATE_TOPIC_CONFIG", "TRANSACTION_REQUESTS"]

# What Kafka gives its transaction log: compacted, 100 MiB segments.
TRANSACTION_STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 100 << 20}

# The coordinator's request methods, each served under its own name.
_COORDINATOR_REQUESTS = ("init_transactions", "add_partitions_to_txn", "end_txn",
                         "describe_transactions", "list_transactions")
# Every request type this service answers (a cluster member's too: cluster.transactions).
TRANSACTION_REQUESTS = _COORDINATOR_REQUESTS + ("add_offsets_to_txn", "txn_offset_commit")


class TransactionService:
    """The transaction coordinator over a :class:`PartitionHost`.

    Parameters
    ----------
    config : BrokerConfig
        ``transaction_state_log_num_partitions`` and ``transaction_max_timeout_ms``.
    host : PartitionHost
    producers : ProducerRegistry
        Whose producer ids transactional ids are given.
    groups : GroupService
        The group coordinator, for commits made inside transactions.

    Raises
    ------
    StorageError, CorruptSegmentError
        ``__transaction_state`` cannot be read back.
    """

    def __init__(self, config: BrokerConfig, host: PartitionHost, producers: ProducerRegistry,
                 groups: GroupService):
        self.host = host
        self.groups = groups
        self.state_partitions = config.transaction_state_log_num_partitions
        self.coordinator = TransactionCoordinator(
            allocate_producer_id=lambda: producers.producer_ids.allocate(), store=self._store,
            add_partition=self._add_partition, write_marker=self.write_marker,
            max_timeout_ms=config.transaction_max_timeout_ms, forget=self._forget,
            expiration_ms=config.transactional_id_expiration_ms)
        self.coordinator.load(
            ((record.key, record.value) for record in host.internal_records(
                TRANSACTION_STATE_TOPIC) if record.marker is None), now_ms())
        host.appender.set_transaction_verifier(
            lambda topic, partition, producer_id, producer_epoch:
            self.coordinator.verify_partition(topic, partition, producer_id, producer_epoch,
                                              now=now_ms()))

    # -- the service -----------------------------------------------------------------
    def handlers(self) -> dict:
        handlers = {name: self._handler(getattr(self.coordinator, name))
                    for name in _COORDINATOR_REQUESTS}
        handlers["add_offsets_to_txn"] = self.add_offsets_to_txn
        handlers["txn_offset_commit"] = self.txn_offset_commit
        return handlers

    def _handler(self, method):
        def handler(**fields):
            return method(**fields, now=now_ms())
        return with_request_signature(handler, method)

    def tick(self, now: int) -> None:
        self.coordinator.tick(now)

    def next_deadline(self) -> int | None:
        return self.coordinator.next_deadline()

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        return []

    def pending_tickets(self) -> list:
        return []

    # -- the requests that involve groups ---------------------------------------------
    def add_offsets_to_txn(self, transactional_id, producer_id, producer_epoch,
                           group_id) -> dict:
        """Kafka's AddOffsetsToTxn: the group's offsets partition joins the
        transaction, so that commits inside it can be written there."""
        partition = self.groups.offsets_partition(require(group_id, str, "group_id"))
        return self.coordinator.add_partitions_to_txn(
            transactional_id, producer_id, producer_epoch, [[OFFSETS_TOPIC, partition]],
            now=now_ms())

    def txn_offset_commit(self, transactional_id, group_id, producer_id, producer_epoch,
                          offsets, member_id="", generation=-1, group_instance_id=None) -> dict:
        """Kafka's TxnOffsetCommit: ``offsets`` ([[topic, partition, offset, metadata],
        ...]) committed for the group when the producer's transaction commits."""
        metadata = self.coordinator.producer_of(transactional_id, producer_id, producer_epoch)
        partition = (OFFSETS_TOPIC, self.groups.offsets_partition(require(group_id, str,
                                                                          "group_id")))
        if partition not in metadata.partitions:
            raise InvalidTxnStateError(
                f"transaction {transactional_id!r} has not added group {group_id!r}'s offsets: "
                f"send_offsets_to_transaction adds them (AddOffsetsToTxn) before committing")
        return self.groups.txn_offset_commit(group_id, offsets, producer_id, producer_epoch,
                                             member_id, generation, group_instance_id)

    # -- what the coordinator does through the broker ------------------------------------
    def _store(self, metadata: TransactionMetadata) -> None:
        """Append the id's state to its partition of __transaction_state."""
        if TRANSACTION_STATE_TOPIC not in self.host.logs.list_topics():
            self.host.create_topic(TRANSACTION_STATE_TOPIC, self.state_partitions,
                                   TRANSACTION_STATE_TOPIC_CONFIG)
        partitions = self.host.logs.describe_topic(TRANSACTION_STATE_TOPIC).partitions
        key, value = transaction_record(metadata)
        self.host.append(TRANSACTION_STATE_TOPIC,
                         offsets_partition(metadata.transactional_id, partitions),
                         encode_batch([value], keys=[key]))

    def _forget(self, transactional_id: str) -> None:
        """Append the id's tombstone to its partition of __transaction_state."""
        partitions = self.host.logs.describe_topic(TRANSACTION_STATE_TOPIC).partitions
        self.host.append(TRANSACTION_STATE_TOPIC, offsets_partition(transactional_id, partitions),
                         encode_batch([None], keys=[transaction_key(transactional_id)]))

    def _add_partition(self, topic: str, partition: int, producer_id: int,
                       producer_epoch: int) -> None:
        if not self.host.expect_transaction(topic, partition, producer_id, producer_epoch):
            raise ConcurrentTransactionsError(
                f"{topic}-{partition} still holds a transaction of producer {producer_id} "
                f"under another epoch: retry once its marker is written")

    def write_marker(self, topic: str, partition: int, marker: EndTransactionMarker) -> int:
        """Write ``marker`` to the partition (the coordinator's, and an operator's abort
        of a hanging transaction: ``transaction_operations``); its offset."""
        offset = self.host.write_marker(topic, partition, marker)
        if topic == OFFSETS_TOPIC:
            self.groups.transaction_ended(partition, marker.producer_id, marker.committed)
        return offset

