"""Produce (versions 3-12) and InitProducerId (0-4): a Kafka client's record batches,
converted to shmlog's layout (``record.kafka_batches``) and appended through the
appender's checks.

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
* Transactions do not exist yet: a transactional producer is refused at its
  InitProducerId with TRANSACTIONAL_ID_AUTHORIZATION_FAILED (a fatal error the
  clients report), and so is a Produce carrying a transactional id.
* InitProducerId without a transactional id hands out a new producer id, epoch 0,
  from the ids the broker's own producers get (cluster-wide in a cluster), as Kafka
  does for an idempotent producer, whatever id the request names (KIP-360: the
  producer then starts its sequences again).
"""

from __future__ import annotations

import logging

from ..common.errors import CorruptRecordError, ShmlogError, UnsupportedCodecError
from ..record.kafka_batches import KafkaBatchStatus, from_kafka
from ..record.records import now_ms
from . import codec
from .apis import NO_RESPONSE
from .error_codes import (
    COORDINATOR_NOT_AVAILABLE,
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
INIT_PRODUCER_ID_KEY = 22
# A batch Kafka's checks refuse: its CRC or its bytes are damaged (CORRUPT_MESSAGE),
# or it is not one well-formed batch of records (INVALID_RECORD).
_REFUSALS = {KafkaBatchStatus.BAD_CRC: CORRUPT_MESSAGE,
             KafkaBatchStatus.TRUNCATED: CORRUPT_MESSAGE,
             KafkaBatchStatus.BAD_COMPRESSION: CORRUPT_MESSAGE}


class ProduceApi:
    """Produce and InitProducerId on broker ``core``; ``metadata`` appends as leader
    (``LocalMetadata.append``, ``ClusterMetadata.append``); ``respond`` sends a held
    response (``KafkaApis.respond``)."""

    def __init__(self, core, metadata, respond) -> None:
        self.core = core
        self.metadata = metadata
        self._respond = respond

    def apis(self) -> dict:
        return {PRODUCE_KEY: (3, 12, self.produce),
                INIT_PRODUCER_ID_KEY: (0, 4, self.init_producer_id)}

    # -- Produce -----------------------------------------------------------------------
    def produce(self, request, header, body):
        items = [(topic.name, data) for topic in body.topic_data for data in topic.partition_data]
        gather = Gather(len(items), lambda answers: self._response(header, body, answers),
                        lambda response: self._respond(request, header, response))
        if body.transactional_id is not None:
            log.warning("Kafka listener: refused a transactional produce from %s "
                        "(transactions do not exist yet)", request.peer)
        deadline = now_ms() + max(body.timeout_ms, 0)
        appended = False
        for index, (topic, data) in enumerate(items):
            hosted = self._hosted_log(topic, data.index)
            log_start = hosted.log_start_offset if hosted is not None else -1

            def answer(error: int, base_offset: int, append_time: int, index=index,
                       log_start=log_start) -> None:
                gather.put(index, (int(error), base_offset, append_time,
                                   log_start if error == NONE else -1))

            if body.transactional_id is not None:
                answer(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
                continue
            limit = hosted.config.batch_size_max if hosted is not None else None
            appended |= self._append(topic, data.index, data.records, limit, body.acks,
                                     deadline, answer)
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
                deadline: int, answer) -> bool:
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
        self.metadata.append(topic, partition, batch, acks, deadline, answer)
        return True

    # -- InitProducerId ----------------------------------------------------------------
    def init_producer_id(self, request, header, body):
        cls = codec.response_class(INIT_PRODUCER_ID_KEY)
        if body.transactional_id is not None:
            log.warning("Kafka listener: refused InitProducerId for transactional id %r "
                        "from %s: transactions do not exist yet", body.transactional_id,
                        request.peer)
            return cls(version=header.api_version, throttle_time_ms=0,
                       error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1,
                       producer_epoch=-1)
        try:
            producer_id = self.core.producers.producer_ids.allocate()
        except ShmlogError as error:          # a cluster's next block of ids not drawn yet
            log.info("Kafka listener: no producer id for %s yet: %s", request.peer, error)
            return cls(version=header.api_version, throttle_time_ms=0,
                       error_code=COORDINATOR_NOT_AVAILABLE, producer_id=-1, producer_epoch=-1)
        return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                   producer_id=producer_id, producer_epoch=0)
