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
from .apis import LATER, NO_RESPONSE
from .error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNSUPPORTED_COMPRESSION_TYPE,
)

__all__ = ["ProduceApi"]

log = logging.getLogger("shmlog.broker.kafka")

PRODUCE_KEY = 0
INIT_PRODUCER_ID_KEY = 22
# A batch Kafka's checks refuse: its CRC or its bytes are damaged (CORRUPT_MESSAGE),
# or it is not one well-formed batch of records (INVALID_RECORD).
_REFUSALS = {KafkaBatchStatus.BAD_CRC: CORRUPT_MESSAGE,
             KafkaBatchStatus.TRUNCATED: CORRUPT_MESSAGE,
             KafkaBatchStatus.BAD_COMPRESSION: CORRUPT_MESSAGE}


class _ProduceAnswers:
    """One Produce request's answers, partition by partition; the response goes once
    every partition is answered (some may wait for acks=all)."""

    def __init__(self, api: "ProduceApi", request, header, body) -> None:
        self.api = api
        self.request, self.header, self.body = request, header, body
        self.answers: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        self.expected = sum(len(topic.partition_data) for topic in body.topic_data)
        self.held = False

    def answer_for(self, topic_index: int, partition_index: int, log_start: int):
        def answer(error: int, base_offset: int, append_time: int) -> None:
            self.answers[(topic_index, partition_index)] = \
                (int(error), base_offset, append_time, log_start if error == NONE else -1)
            if self.held and len(self.answers) == self.expected:
                self.api.respond(self)
        return answer

    def response(self):
        cls = codec.response_class(PRODUCE_KEY)
        partition_class = cls.TopicProduceResponse.PartitionProduceResponse
        topics = []
        for topic_index, topic in enumerate(self.body.topic_data):
            partitions = []
            for partition_index, data in enumerate(topic.partition_data):
                error, base_offset, append_time, log_start = \
                    self.answers[(topic_index, partition_index)]
                partitions.append(partition_class(
                    index=data.index, error_code=error, base_offset=base_offset,
                    log_append_time_ms=append_time, log_start_offset=log_start,
                    record_errors=[], error_message=None))
            topics.append(cls.TopicProduceResponse(name=topic.name,
                                                   partition_responses=partitions))
        return cls(version=self.header.api_version, responses=topics, throttle_time_ms=0)


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
        answers = _ProduceAnswers(self, request, header, body)
        if body.transactional_id is not None:
            log.warning("Kafka listener: refused a transactional produce from %s "
                        "(transactions do not exist yet)", request.peer)
        deadline = now_ms() + max(body.timeout_ms, 0)
        appended = False
        for topic_index, topic in enumerate(body.topic_data):
            for partition_index, data in enumerate(topic.partition_data):
                answer = answers.answer_for(topic_index, partition_index,
                                            self._log_start(topic.name, data.index))
                if body.transactional_id is not None:
                    answer(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
                    continue
                appended |= self._append(topic.name, data.index, data.records, body.acks,
                                         deadline, answer)
        if appended:
            self.core.host.table.consumer_doorbell.ring()
        if body.acks == 0:
            return NO_RESPONSE
        if len(answers.answers) < answers.expected:
            answers.held = True                 # acks=all: the purgatory answers the rest
            return LATER
        return answers.response()

    def respond(self, answers: _ProduceAnswers) -> None:
        if answers.body.acks != 0:
            self._respond(answers.request, answers.header, answers.response())

    def _log_start(self, topic: str, partition: int) -> int:
        try:
            return self.core.host.partition(topic, partition).log.log_start_offset
        except ShmlogError:
            return -1

    def _append(self, topic: str, partition: int, records, acks: int, deadline: int,
                answer) -> bool:
        """Convert and append one partition's batch; whether it was handed to the
        appender (``answer`` is called now, or later for acks=all)."""
        try:
            limit = self.core.host.partition(topic, partition).log.config.batch_size_max
        except ShmlogError:
            limit = None                        # no such partition: the append says so
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
