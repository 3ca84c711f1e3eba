"""Kafka's transactions (KIP-98) over shmlog's transaction coordinator: InitProducerId
(0-4), AddPartitionsToTxn (0-3), AddOffsetsToTxn (0-3), EndTxn (0-3) and
TxnOffsetCommit (0-3), so a Kafka client's transactional producer (librdkafka's,
the Java client's, kafka-python's) runs against shmlog.

Rules
-----
* **The same coordinator.** Every request goes to the broker's transaction service
  (``broker/transaction_service.py``; a cluster member's
  ``cluster/transactions.py``), as shmlog's own transactional producers' control
  requests do: the same transactional ids, epochs and fencing, and the markers the
  coordinator writes end a Kafka client's transaction in every partition it wrote
  to. FindCoordinator names the id's coordinator (``group_apis``): on one broker
  itself, in a cluster the leader of its ``__transaction_state`` partition; a
  request sent to another member is forwarded there. A request the service answers
  later (a cluster's replicated state, its markers) is held and answered then.
* **Versions: those before KIP-890.** AddPartitionsToTxn v4+ is Kafka's
  broker-to-broker batching, EndTxn v5 bumps the epoch every transaction and
  TxnOffsetCommit v5 adds the offsets partition implicitly (transactions V2); v4 of
  the others adds only TRANSACTION_ABORTABLE. None of them is served.
* **Errors as Kafka answers them.** The coordinator's refusals map to Kafka's codes
  (``error_codes.for_error``): PRODUCER_FENCED (90) for a fenced producer, but only
  in the versions that know it (InitProducerId v4+, AddPartitionsToTxn, AddOffsetsToTxn
  and EndTxn v2+); older versions, and every TxnOffsetCommit, get
  INVALID_PRODUCER_EPOCH (47), as Kafka's brokers answer them. Both are fatal to a
  transactional producer. CONCURRENT_TRANSACTIONS (51) is retried by the clients.
* InitProducerId v3+ may name the producer id and epoch the client holds (KIP-360):
  one that is not the id's current pair is fenced. Without a transactional id it
  hands out a new producer id at epoch 0 (an idempotent producer), from the ids
  the broker's own producers get, whatever id the request names.
* AddPartitionsToTxn checks its partitions first: if one is unknown, it gets
  UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, and nothing
  is added (Kafka's answer); otherwise every partition gets the coordinator's one
  answer.
"""

from __future__ import annotations

import logging

from ..common.errors import ShmlogError
from . import codec
from .error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    PRODUCER_FENCED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    for_error,
)
from .group_apis import ServiceArea

__all__ = ["TransactionApis"]

log = logging.getLogger("shmlog.broker.kafka")

INIT_PRODUCER_ID_KEY = 22
ADD_PARTITIONS_TO_TXN_KEY = 24
ADD_OFFSETS_TO_TXN_KEY = 25
END_TXN_KEY = 26
TXN_OFFSET_COMMIT_KEY = 28
#: The first version of each API whose clients know PRODUCER_FENCED (None: none does).
_FENCED_FROM = {INIT_PRODUCER_ID_KEY: 4, ADD_PARTITIONS_TO_TXN_KEY: 2,
                ADD_OFFSETS_TO_TXN_KEY: 2, END_TXN_KEY: 2, TXN_OFFSET_COMMIT_KEY: None}
_NO_PRODUCER = -1


def _code(result, header) -> int:
    """The Kafka error code of a refusal (NONE for a reply), for the request's API
    and version."""
    if not isinstance(result, ShmlogError):
        return NONE
    code = for_error(result)
    if code == PRODUCER_FENCED:
        fenced_from = _FENCED_FROM[header.api_key]
        if fenced_from is None or header.api_version < fenced_from:
            return INVALID_PRODUCER_EPOCH
    return code


class TransactionApis(ServiceArea):
    """The transaction APIs on broker ``core`` (its ``transactions`` service:
    None refuses transactional ids and serves idempotent InitProducerId only);
    ``metadata`` knows the topics, ``respond`` sends a held response."""

    def __init__(self, core, metadata, respond) -> None:
        transactions = core.transactions
        super().__init__(core, respond,
                         transactions.handlers() if transactions is not None else None)
        self.metadata = metadata

    def apis(self) -> dict:
        table = {INIT_PRODUCER_ID_KEY: (0, 4, self.init_producer_id)}
        if self._handlers is not None:
            table.update({ADD_PARTITIONS_TO_TXN_KEY: (0, 3, self.add_partitions_to_txn),
                          ADD_OFFSETS_TO_TXN_KEY: (0, 3, self.add_offsets_to_txn),
                          END_TXN_KEY: (0, 3, self.end_txn),
                          TXN_OFFSET_COMMIT_KEY: (0, 3, self.txn_offset_commit)})
        return table

    # -- InitProducerId ----------------------------------------------------------------
    def init_producer_id(self, request, header, body):
        cls = codec.response_class(INIT_PRODUCER_ID_KEY)

        def answer(code: int, producer_id: int = _NO_PRODUCER, epoch: int = _NO_PRODUCER):
            return cls(version=header.api_version, throttle_time_ms=0, error_code=code,
                       producer_id=producer_id, producer_epoch=epoch)

        if body.transactional_id is None:
            try:
                producer_id = self.core.producers.producer_ids.allocate()
            except ShmlogError as error:      # a cluster's next block of ids not drawn yet
                log.info("Kafka listener: no producer id for %s yet: %s", request.peer, error)
                return answer(COORDINATOR_NOT_AVAILABLE)
            return answer(NONE, producer_id, 0)
        if self._handlers is None:
            log.warning("Kafka listener: refused InitProducerId for transactional id %r "
                        "from %s: this broker does not serve Kafka clients' transactions",
                        body.transactional_id, request.peer)
            return answer(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

        def initialised(result):
            if isinstance(result, ShmlogError):
                log.info("Kafka listener: init_transactions refused: %s", result)
                return answer(_code(result, header))
            return answer(NONE, result["producer_id"], result["producer_epoch"])

        # KIP-360: the pair the client holds, checked by the coordinator.
        held = {"producer_id": getattr(body, "producer_id", _NO_PRODUCER),
                "producer_epoch": getattr(body, "producer_epoch", _NO_PRODUCER)}
        if held["producer_id"] == _NO_PRODUCER:
            held = {}
        return self._call("init_transactions", request, header, initialised,
                          transactional_id=body.transactional_id,
                          transaction_timeout_ms=body.transaction_timeout_ms, **held)

    # -- AddPartitionsToTxn ------------------------------------------------------------
    def add_partitions_to_txn(self, request, header, body):
        cls = codec.response_class(ADD_PARTITIONS_TO_TXN_KEY)
        topic_class = cls.AddPartitionsToTxnTopicResult
        asked = [(topic.name, partition) for topic in body.v3_and_below_topics
                 for partition in topic.partitions]

        def response(codes: dict):
            return cls(version=header.api_version, throttle_time_ms=0,
                       results_by_topic_v3_and_below=[
                           topic_class(name=topic.name, results_by_partition=[
                               topic_class.AddPartitionsToTxnPartitionResult(
                                   partition_index=partition,
                                   partition_error_code=codes[(topic.name, partition)])
                               for partition in topic.partitions])
                           for topic in body.v3_and_below_topics])

        unknown = {(topic, partition) for topic, partition in asked
                   if not self._exists(topic, partition)}
        if unknown:
            return response({entry: UNKNOWN_TOPIC_OR_PARTITION if entry in unknown
                             else OPERATION_NOT_ATTEMPTED for entry in asked})
        return self._call("add_partitions_to_txn", request, header,
                          lambda result: response(dict.fromkeys(asked, _code(result, header))),
                          transactional_id=body.v3_and_below_transactional_id,
                          producer_id=body.v3_and_below_producer_id,
                          producer_epoch=body.v3_and_below_producer_epoch,
                          partitions=[list(entry) for entry in asked])

    def _exists(self, topic: str, partition: int) -> bool:
        """Whether the cluster (or this broker) has the partition."""
        found = self.metadata.topic(topic)
        return found is not None and any(entry[0] == partition for entry in found[2])

    # -- AddOffsetsToTxn, EndTxn -------------------------------------------------------
    def add_offsets_to_txn(self, request, header, body):
        return self._call(
            "add_offsets_to_txn", request, header,
            lambda result: codec.response_class(ADD_OFFSETS_TO_TXN_KEY)(
                version=header.api_version, throttle_time_ms=0,
                error_code=_code(result, header)),
            transactional_id=body.transactional_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch, group_id=body.group_id)

    def end_txn(self, request, header, body):
        return self._call(
            "end_txn", request, header,
            lambda result: codec.response_class(END_TXN_KEY)(
                version=header.api_version, throttle_time_ms=0,
                error_code=_code(result, header)),
            transactional_id=body.transactional_id, producer_id=body.producer_id,
            producer_epoch=body.producer_epoch, committed=bool(body.committed))

    # -- TxnOffsetCommit ---------------------------------------------------------------
    def txn_offset_commit(self, request, header, body):
        cls = codec.response_class(TXN_OFFSET_COMMIT_KEY)
        topic_class = cls.TxnOffsetCommitResponseTopic
        offsets = [[topic.name, partition.partition_index, partition.committed_offset,
                    partition.committed_metadata or ""]
                   for topic in body.topics for partition in topic.partitions]

        def response(result):
            code = _code(result, header)
            return cls(version=header.api_version, throttle_time_ms=0, topics=[
                topic_class(name=topic.name, partitions=[
                    topic_class.TxnOffsetCommitResponsePartition(
                        partition_index=partition.partition_index, error_code=code)
                    for partition in topic.partitions])
                for topic in body.topics])
        return self._call("txn_offset_commit", request, header, response,
                          transactional_id=body.transactional_id, group_id=body.group_id,
                          producer_id=body.producer_id, producer_epoch=body.producer_epoch,
                          offsets=offsets, member_id=getattr(body, "member_id", "") or "",
                          generation=getattr(body, "generation_id", -1),
                          group_instance_id=getattr(body, "group_instance_id", None))
