"""ListOffsets (versions 1-7) and OffsetForLeaderEpoch (2-4): where a partition's log
starts and ends, which offset a time maps to, and where a leader epoch ended.

Rules
-----
* ListOffsets' special timestamps are Kafka's: -1 the latest offset (the high
  watermark; read_committed, isolation level 1 from v2, gets the last stable
  offset: the first offset of the oldest open transaction), -2 the earliest (the log start),
  -3 (v7) the offset of the largest timestamp. Any other timestamp gives the first
  offset whose timestamp is at or after it, or offset -1 and timestamp -1 when there
  is none.
* The leader epoch given back (v4+) is the epoch of the batch holding the offset
  answered (the partition's leader-epoch history), or the current one for the log
  end.
* A request's current leader epoch (ListOffsets v4+, OffsetForLeaderEpoch v2+) is
  checked as Kafka checks it: older than the partition's, FENCED_LEADER_EPOCH;
  newer, UNKNOWN_LEADER_EPOCH; -1, not checked.
* OffsetForLeaderEpoch answers from the partition's leader-epoch history
  (``LeaderEpochCache.end_offset_for``); the current epoch ends at the log end.
"""

from __future__ import annotations

import bisect

from ..common.errors import ShmlogError
from . import codec
from .error_codes import (
    FENCED_LEADER_EPOCH,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
    for_error,
)

__all__ = ["OffsetsApi", "Refused", "led_partition"]

LIST_OFFSETS_KEY = 2
OFFSET_FOR_LEADER_EPOCH_KEY = 23
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
_NO_EPOCH = -1
READ_COMMITTED = 1


class Refused(Exception):
    """A partition's answer is this error code (raised inside a handler only)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class OffsetsApi:
    """ListOffsets and OffsetForLeaderEpoch on broker ``core``, leadership as
    ``metadata`` says."""

    def __init__(self, core, metadata) -> None:
        self.core = core
        self.metadata = metadata

    def apis(self) -> dict:
        return {LIST_OFFSETS_KEY: (1, 7, self.list_offsets),
                OFFSET_FOR_LEADER_EPOCH_KEY: (2, 4, self.offset_for_leader_epoch)}

    def _led(self, topic: str, partition: int, current_epoch: int):
        return led_partition(self.core, self.metadata, topic, partition, current_epoch)

    # -- ListOffsets -------------------------------------------------------------------
    def list_offsets(self, request, header, body):
        cls = codec.response_class(LIST_OFFSETS_KEY)
        committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
        topics = []
        for topic in body.topics:
            answers = []
            for asked in topic.partitions:
                try:
                    error, (timestamp, offset, epoch) = NONE, self._offset(
                        topic.name, asked.partition_index,
                        getattr(asked, "current_leader_epoch", _NO_EPOCH), asked.timestamp,
                        committed)
                except Refused as refused:
                    error, (timestamp, offset, epoch) = refused.code, (-1, -1, _NO_EPOCH)
                except ShmlogError as failed:          # a damaged segment's timestamps
                    error, (timestamp, offset, epoch) = for_error(failed), (-1, -1, _NO_EPOCH)
                answers.append(cls.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                    partition_index=asked.partition_index, error_code=error,
                    timestamp=timestamp, offset=offset, leader_epoch=epoch))
            topics.append(cls.ListOffsetsTopicResponse(name=topic.name, partitions=answers))
        return cls(version=header.api_version, throttle_time_ms=0, topics=topics)

    def _offset(self, topic: str, partition: int, current_epoch: int,
                timestamp: int, committed: bool) -> tuple[int, int, int]:
        """(timestamp, offset, leader epoch) answering one partition's ask
        (``committed``: a read_committed client's)."""
        hosted, epoch = self._led(topic, partition, current_epoch)
        log = hosted.log
        if timestamp == LATEST_TIMESTAMP:
            appender = self.core.host.appender
            latest = appender.last_stable_offset(hosted.row) if committed \
                else appender.high_watermark(hosted.row)
            return -1, latest, epoch
        if timestamp == EARLIEST_TIMESTAMP:
            start = log.log_start_offset
            return -1, start, _epoch_at(log.epochs.entries(), start, epoch)
        if timestamp == MAX_TIMESTAMP:
            timestamp = max((segment.max_timestamp for segment in log.segments), default=-1)
            if timestamp < 0:
                return -1, -1, _NO_EPOCH
        found = log.offset_for_timestamp(timestamp)
        if found is None:
            return -1, -1, _NO_EPOCH
        offset, stamped = found
        return stamped, offset, _epoch_at(log.epochs.entries(), offset, epoch)

    # -- OffsetForLeaderEpoch ----------------------------------------------------------
    def offset_for_leader_epoch(self, request, header, body):
        cls = codec.response_class(OFFSET_FOR_LEADER_EPOCH_KEY)
        topics = []
        for topic in body.topics:
            answers = []
            for asked in topic.partitions:
                try:
                    hosted, epoch = self._led(topic.topic, asked.partition,
                                              asked.current_leader_epoch)
                    if asked.leader_epoch == epoch:
                        found = (epoch, hosted.log.log_end_offset)
                    else:
                        found = hosted.log.epochs.end_offset_for(asked.leader_epoch,
                                                                 hosted.log.log_end_offset)
                    error = NONE
                except Refused as refused:
                    error, found = refused.code, (_NO_EPOCH, -1)
                answers.append(cls.OffsetForLeaderTopicResult.EpochEndOffset(
                    error_code=error, partition=asked.partition, leader_epoch=found[0],
                    end_offset=found[1]))
            topics.append(cls.OffsetForLeaderTopicResult(topic=topic.topic, partitions=answers))
        return cls(version=header.api_version, throttle_time_ms=0, topics=topics)


def led_partition(core, metadata, topic: str, partition: int, current_epoch: int):
    """The hosted partition and its leader epoch, if this broker leads it at an epoch
    the client may ask about (``current_epoch``: -1 asks about any).

    Raises
    ------
    Refused
        UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH or
        UNKNOWN_LEADER_EPOCH.
    """
    try:
        hosted = core.host.partition(topic, partition)
    except ShmlogError:
        raise Refused(UNKNOWN_TOPIC_OR_PARTITION) from None
    epoch = metadata.leader_epoch(topic, partition)
    if epoch is None:
        raise Refused(NOT_LEADER_OR_FOLLOWER)
    if current_epoch >= 0 and current_epoch != epoch:
        raise Refused(FENCED_LEADER_EPOCH if current_epoch < epoch else UNKNOWN_LEADER_EPOCH)
    return hosted, epoch


def _epoch_at(entries: list[tuple[int, int]], offset: int, current: int) -> int:
    """The leader epoch of the batch holding ``offset``, from the history ``entries``
    [(epoch, start offset)] (the current epoch when the history is empty)."""
    if not entries:
        return current
    starts = [start for _, start in entries]
    index = bisect.bisect_right(starts, offset) - 1
    return entries[max(index, 0)][0]
