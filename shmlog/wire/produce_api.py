"""Produce (versions 3-12): a Kafka client's record batches, converted to shmlog's
layout (``record.kafka_batches``) and appended through the appender's checks.
InitProducerId is in ``transaction_apis``.

Rules
-----
* Each partition's batch is checked as Kafka checks it (CRC, magic, structure, one
  batch) and converted, every field kept; then ``Appender.append`` checks it as a
  ring entry: its size, its offsets assigned, its producer's sequence (a re-sent
  batch is acknowledged with its first offset and not appended again; a gap is
  OUT_OF_ORDER_SEQUENCE_NUMBER), its leader epoch stamped. What is refused gets that
  partition's Kafka error code; the request's other partitions are appended.
* Compression: gzip and zstd batches are stored as zstd; snappy and lz4 are refused
  with UNSUPPORTED_COMPRESSION_TYPE (the producer can set ``compression.type``).
* A partition this broker does not lead gets NOT_LEADER_OR_FOLLOWER; one that does
  not exist, UNKNOWN_TOPIC_OR_PARTITION (Produce creates no topic: Metadata does).
* acks=0 gets no response; acks=1 is answered once appended; acks=all in a cluster
  once the high watermark covers the batch (the replication's produce purgatory,
  which also refuses under ``min.insync.replicas``), or with REQUEST_TIMED_OUT after
  the request's ``timeout_ms``; on a single broker at once (it is every in-sync
  replica).
* Transactions: a transactional batch (Kafka's transactional bit, kept in the
  stored batch) is admitted by the appender only in a partition the producer's
  transaction added at its epoch (AddPartitionsToTxn, ``transaction_apis``):
  elsewhere INVALID_TXN_STATE, from an older epoch INVALID_PRODUCER_EPOCH (fenced).
  A cluster member serves no transactions yet: a Produce carrying a transactional
  id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED there.
"""

from __future__ import annotations

import logging

from ..common.errors import CorruptRecordError, ShmlogError, UnsupportedCodecError
from ..record.kafka_batches import KafkaBatchStatus, from_kafka
from ..record.records import now_ms
from . import codec
from .apis import NO_RESPONSE
from .error_codes import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNSUPPORTED_COMPRESSION_TYPE,
)
from .tickets import Gather

__all__ = ["ProduceApi"]

log = logging.getLogger("shmlog.broker.kafka")

PRODUCE_KEY = 0
# A batch Kafka's checks refuse: its CRC or its bytes are damaged (CORRUPT_MESSAGE),
# or it is not one well-formed batch of records (INVALID_RECORD).
_REFUSALS = {KafkaBatchStatus.BAD_CRC: CORRUPT_MESSAGE,
             KafkaBatchStatus.TRUNCATED: CORRUPT_MESSAGE,
             KafkaBatchStatus.BAD_COMPRESSION: CORRUPT_MESSAGE}


class ProduceApi:
    """Produce on broker ``core``; ``metadata`` appends as leader
    (``LocalMetadata.append``, ``ClusterMetadata.append``); ``respond`` sends a held
    response (``KafkaApis.respond``)."""

    def __init__(self, core, metadata, respond) -> None:
        self.core = core
        self.metadata = metadata
        self._respond = respond

    def apis(self) -> dict:
        return {PRODUCE_KEY: (3, 12, self.produce)}

    # -- Produce -----------------------------------------------------------------------
    def produce(self, request, header, body):
        items = [(topic.name, data) for topic in body.topic_data for data in topic.partition_data]
        gather = Gather(len(items), lambda answers: self._response(header, body, answers),
                        lambda response: self._respond(request, header, response))
        untransacted = body.transactional_id is not None \
            and self.core.transactions is None
        if untransacted:
            log.warning("Kafka listener: refused a transactional produce from %s "
                        "(this broker does not serve Kafka clients' transactions)", request.peer)
        deadline = now_ms() + max(body.timeout_ms, 0)
        appended = False
        for index, (topic, data) in enumerate(items):
            hosted = self._hosted_log(topic, data.index)
            log_start = hosted.log_start_offset if hosted is not None else -1

            def answer(error: int, base_offset: int, append_time: int, index=index,
                       log_start=log_start) -> None:
                gather.put(index, (int(error), base_offset, append_time,
                                   log_start if error == NONE else -1))

            if untransacted:
                answer(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
                continue
            limit = hosted.config.batch_size_max if hosted is not None else None
            appended |= self._append(topic, data.index, data.records, limit, body.acks,
                                     deadline, answer, body.transactional_id)
        if appended:
            self.core.host.table.consumer_doorbell.ring()
        if body.acks == 0:
            return NO_RESPONSE                  # Kafka's acks=0: no response at all
        return gather.outcome()                 # acks=all: the purgatory answers the rest

    def _hosted_log(self, topic: str, partition: int):
        """The partition's log on this broker; None when it has none (the append then
        says why: unknown, or led elsewhere)."""
        try:
            return self.core.host.partition(topic, partition).log
        except ShmlogError:
            return None

    @staticmethod
    def _response(header, body, answers: dict):
        cls = codec.response_class(PRODUCE_KEY)
        partition_class = cls.TopicProduceResponse.PartitionProduceResponse
        index = 0
        topics = []
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                error, base_offset, append_time, log_start = answers[index]
                index += 1
                partitions.append(partition_class(
                    index=data.index, error_code=error, base_offset=base_offset,
                    log_append_time_ms=append_time, log_start_offset=log_start,
                    record_errors=[], error_message=None))
            topics.append(cls.TopicProduceResponse(name=topic.name,
                                                   partition_responses=partitions))
        return cls(version=header.api_version, responses=topics, throttle_time_ms=0)

    def _append(self, topic: str, partition: int, records, limit: int | None, acks: int,
                deadline: int, answer, transactional_id: str | None) -> bool:
        """Convert and append one partition's batch (stored batches at most ``limit``
        bytes; None: the partition is not here, and the append says so); whether it
        was handed to the appender (``answer`` is called now, or later for acks=all)."""
        try:
            batch = from_kafka(records if records is not None else b"", limit)
        except UnsupportedCodecError as refused:
            log.info("Kafka listener: %s-%d: %s", topic, partition, refused)
            answer(UNSUPPORTED_COMPRESSION_TYPE, -1, -1)
            return False
        except CorruptRecordError as refused:
            answer(_REFUSALS.get(refused.status, INVALID_RECORD), -1, -1)
            return False
        self.metadata.append(topic, partition, batch, acks, deadline, answer, transactional_id)
        return True
