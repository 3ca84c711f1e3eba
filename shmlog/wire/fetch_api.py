"""Fetch (versions 4-12) for consumers: whole batches from the one holding the
offset asked, converted to Kafka's format, and long polls woken by appends.

Rules
-----
* Consumers read below the high watermark; read_committed ones (isolation level 1,
  every version served) below the last stable offset (Kafka's LSO: the first
  offset of the oldest open transaction, ``Appender.last_stable_offset``). Every
  answer gives the LSO in its ``last_stable_offset``. An offset below the log start
  or above the log end is OFFSET_OUT_OF_RANGE; one at or above the bound (within
  the log) gets no records.
* **Aborted transactions.** A read_committed answer with records lists the aborted
  transactions the read meets (``PartitionLog.aborted_transactions`` from the
  offset asked to the end of the read, Kafka's ``collectAbortedTxns``) as
  (producer id, first offset): the client drops those producers' batches from
  there to their abort markers. Batches keep their transactional bit and markers
  go out as Kafka's control batches, which clients never return as records (nor
  does a read_uncommitted client, which gets a null list).
* Whole batches only, from the batch holding the offset (so a batch may start
  before it, as in Kafka). Budgets are Kafka's (KIP-74): each partition's
  ``partition_max_bytes`` and the request's ``max_bytes``, except that the first
  partition with data always returns at least one batch, however large; a later
  partition whose first batch does not fit returns nothing this time.
* **Long poll.** A fetch that finds fewer than ``min_bytes`` bytes, and asked to
  wait, is held until an append reaches one of its partitions (the consumers'
  doorbell the appender rings, looked at each loop turn: no timer), or
  ``max_wait_ms`` passes; then it is answered with what there is.
* No fetch sessions (KIP-227): every response says session 0, so clients send full
  fetches. A follower's fetch (a Kafka broker as replica) is not served.
* A partition this broker does not lead gets NOT_LEADER_OR_FOLLOWER; a current
  leader epoch (v9+) other than the partition's, FENCED_LEADER_EPOCH or
  UNKNOWN_LEADER_EPOCH as Kafka answers.

Theory of operation
-------------------
Each partition is read with ``PartitionLog.read`` (a view of the mapped segment,
bounded by the budgets and the high watermark) and converted by
``kafka_batches.to_kafka`` (one compiled pass for a run of uncompressed batches; as
many as fit the budget in Kafka's form, which for a stored zstd batch is inflated);
``fetch_response`` writes the response around the converted buffers.
"""

from __future__ import annotations

import dataclasses

from ..common.errors import CorruptSegmentError, OffsetOutOfRangeError, ShmlogError
from ..record.kafka_batches import to_kafka
from ..record.records import now_ms
from .apis import LATER
from .error_codes import KAFKA_STORAGE_ERROR, OFFSET_OUT_OF_RANGE, for_error
from .fetch_response import FetchedPartition, encode_fetch_response
from .offsets_api import READ_COMMITTED, Refused, led_partition

__all__ = ["FetchApi"]

FETCH_KEY = 1


@dataclasses.dataclass
class _Held:
    request: object
    header: object
    body: object
    deadline: int


class FetchApi:
    """Fetch on broker ``core``, leadership as ``metadata`` says; ``respond`` sends a
    held fetch's response (``KafkaApis.respond``)."""

    def __init__(self, core, metadata, respond) -> None:
        self.core = core
        self.metadata = metadata
        self._respond = respond
        self._held: list[_Held] = []
        self._doorbell = core.host.table.consumer_doorbell
        self._rung = self._doorbell.sequence

    def apis(self) -> dict:
        return {FETCH_KEY: (4, 12, self.fetch)}

    def fetch(self, request, header, body):
        answer, size, failed = self._read(header.api_version, body)
        if size >= max(body.min_bytes, 1) or failed or body.max_wait_ms <= 0 or \
                not body.topics:
            return self._encode(header, answer)
        self._held.append(_Held(request, header, body, now_ms() + body.max_wait_ms))
        return LATER

    def poll(self, now: int) -> None:
        """Answer the held fetches that have data now or whose wait is over."""
        if not self._held:
            return
        rung = self._doorbell.sequence
        appended, self._rung = rung != self._rung, rung
        if not appended and now < min(held.deadline for held in self._held):
            return
        waiting = []
        for held in self._held:
            answer, size, failed = self._read(held.header.api_version, held.body)
            if size >= max(held.body.min_bytes, 1) or failed or now >= held.deadline:
                self._respond(held.request, held.header, self._encode(held.header, answer))
            else:
                waiting.append(held)
        self._held = waiting

    def next_deadline(self) -> int | None:
        return min((held.deadline for held in self._held), default=None)

    # -- reading -----------------------------------------------------------------------
    def _read(self, version: int, body) -> tuple[list, int, bool]:
        """(the response's topics, record bytes, whether a partition failed)."""
        budget = body.max_bytes if version >= 3 else 1 << 31
        topics, size, failed = [], 0, False
        for topic in body.topics:
            answers = []
            for asked in topic.partitions:
                answer = self._partition(topic.topic, asked, budget - size, size == 0,
                                         getattr(asked, "current_leader_epoch", -1),
                                         body.isolation_level == READ_COMMITTED)
                failed |= answer.error_code != 0
                size += answer.records_size
                answers.append(answer)
            topics.append((topic.topic, answers))
        return topics, size, failed

    def _partition(self, topic: str, asked, budget: int, first: bool,
                   current_epoch: int, committed: bool) -> FetchedPartition:
        try:
            hosted, _ = led_partition(self.core, self.metadata, topic, asked.partition,
                                      current_epoch)
        except Refused as refused:
            return FetchedPartition(asked.partition, refused.code)
        log = hosted.log
        appender = self.core.host.appender
        high_watermark = appender.high_watermark(hosted.row)
        stable = appender.last_stable_offset(hosted.row)
        answer = FetchedPartition(asked.partition, 0, high_watermark, stable,
                                  log.log_start_offset,
                                  aborted=[] if committed else None)
        offset = asked.fetch_offset
        if offset < log.log_start_offset or offset > log.log_end_offset:
            answer.error_code = OFFSET_OUT_OF_RANGE
            return answer
        bound = stable if committed else high_watermark
        if offset >= bound:
            return answer
        limit = max(min(asked.partition_max_bytes, budget), 0)
        try:
            read = log.read(offset, max(limit, 1), bound)
        except OffsetOutOfRangeError:
            answer.error_code = OFFSET_OUT_OF_RANGE
            return answer
        except CorruptSegmentError:
            answer.error_code = KAFKA_STORAGE_ERROR
            return answer
        except ShmlogError as error:
            answer.error_code = for_error(error)
            return answer
        if read.data.size and (first or read.data.size <= limit):
            # The budgets count the bytes sent: a stored zstd batch goes out inflated.
            converted = to_kafka(read.data, limit)
            if first or converted.size <= limit:
                answer.records = [converted]
                if committed:
                    try:
                        answer.aborted = [
                            (entry.producer_id, entry.first_offset)
                            for entry in log.aborted_transactions(offset, read.next_offset)]
                    except ShmlogError as error:       # a .txnindex that cannot be read
                        answer.error_code, answer.records = for_error(error), ()
        return answer

    def _encode(self, header, topics: list) -> list:
        return encode_fetch_response(header.api_version, header.correlation_id, topics)
