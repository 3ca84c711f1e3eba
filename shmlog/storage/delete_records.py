"""DeleteRecords (Kafka's KIP-107 and KIP-204): moving a partition's log start
offset forward on request. The rules, without I/O, shared by the broker (single or
cluster member) and the admin client.

Rules
-----
* **The offset** (Kafka 2.8's ``Partition.deleteRecordsOnLeader`` and
  ``Log.maybeIncrementLogStartOffset``): ``-1`` (:data:`HIGH_WATERMARK`) means the
  partition's high watermark; any other negative offset, and an offset past the
  high watermark, is ``OFFSET_OUT_OF_RANGE`` (records not yet committed cannot be
  deleted). An offset at or below the log start changes nothing: the log start
  never moves back.
* **Only the leader deletes** (``NOT_LEADER_OR_FOLLOWER`` elsewhere); followers and
  observers learn the new log start from the leader's fetch responses (Kafka's
  ``maybeIncrementLogStartOffset`` on the follower), never past their own high
  watermark.
* **The low watermark** (Kafka's ``Partition.lowWatermarkIfLeader``) is the lowest
  log start over the leader and its live assigned followers, as they reported it in
  their last fetch (unknown, -1, until they fetch). A single broker's is its own log
  start. The answer carries it per partition; Kafka's broker holds the answer
  (``DelayedDeleteRecords``) until every low watermark reached its offset or the
  request's timeout passed, and the admin client here does that waiting by asking
  again (the request is idempotent: the start never moves back), so no broker
  keeps a purgatory for it.
* **Internal topics are refused** (Kafka's ``ReplicaManager.deleteRecordsOnLocalLog``):
  a partition of ``internal_topics.INTERNAL_TOPICS`` is answered
  ``INVALID_TOPIC_EXCEPTION`` and nothing moves. ``__consumer_offsets`` holds the
  groups' committed offsets: moving its log start drops every commit below it, and
  a restarted coordinator reads back only what is above it.
* Whole segments below the new log start are deleted at once (Kafka leaves them to
  its next retention check); records below it in the segment holding the start stay
  on disk but are unreadable: a reader asking for them gets ``OffsetOutOfRangeError``,
  as after retention. The start is checkpointed, so it survives a restart.

Theory of operation
-------------------
A request names ``[topic, partition, offset]`` triples; the broker answers, per
partition, ``{"topic", "partition", "offset", "low_watermark", "error",
"message"}`` with ``error`` a Kafka error name (None when it succeeded) and
``offset`` the log start it asked for (``-1`` resolved to the high watermark).
:func:`partition_error` turns a refused partition back into the client's typed
error. :func:`parse_offset_json` reads kafka-delete-records' ``--offset-json-file``.
"""

from __future__ import annotations

import json
from typing import Iterable

from ..common.errors import (
    InternalTopicError,
    LocalProtocolError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    ShmlogError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import INTERNAL_TOPICS

__all__ = ["HIGH_WATERMARK", "OFFSET_OUT_OF_RANGE", "NOT_LEADER_OR_FOLLOWER",
           "UNKNOWN_TOPIC_OR_PARTITION", "REQUEST_TIMED_OUT", "KAFKA_STORAGE_ERROR",
           "UNKNOWN_OFFSET", "INVALID_TOPIC_EXCEPTION",
           "delete_target", "refuse_internal", "low_watermark", "partition_error",
           "parse_offset_json", "answer"]

# Kafka's DeleteRecordsRequest.HIGH_WATERMARK: delete everything committed.
HIGH_WATERMARK = -1
# A follower's log start the leader has not heard yet (Kafka's UnknownOffset).
UNKNOWN_OFFSET = -1

# The Kafka error names a partition's answer may carry.
OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
KAFKA_STORAGE_ERROR = "KAFKA_STORAGE_ERROR"
INVALID_TOPIC_EXCEPTION = "INVALID_TOPIC_EXCEPTION"

_ERROR_CLASSES = {OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
                  NOT_LEADER_OR_FOLLOWER: NotLeaderOrFollowerError,
                  UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicOrPartitionError,
                  REQUEST_TIMED_OUT: RequestTimedOutError,
                  KAFKA_STORAGE_ERROR: StorageError,
                  INVALID_TOPIC_EXCEPTION: InternalTopicError}


def refuse_internal(topic: str, partition: int, offset: int) -> dict | None:
    """The answer refusing ``topic``'s partition when the topic is internal (see the
    module's rules), else None: the broker asks before it routes or deletes."""
    if topic not in INTERNAL_TOPICS:
        return None
    return answer(topic, partition, offset, UNKNOWN_OFFSET, INVALID_TOPIC_EXCEPTION,
                  f"{topic} is an internal topic (the consumer groups' committed offsets): "
                  f"deleting its records would drop commits; the broker compacts it itself")


def delete_target(requested: int, *, log_start_offset: int,
                  high_watermark: int) -> tuple[str | None, int]:
    """(error name or None, the log start to move to) for a request of
    ``requested`` on a leader whose log starts at ``log_start_offset`` and whose
    high watermark is ``high_watermark`` (see the module's rules).

    The offset returned is never below ``log_start_offset``; with an error it is
    the resolved offset that was refused.
    """
    offset = high_watermark if requested == HIGH_WATERMARK else requested
    if offset < 0 or offset > high_watermark:
        return OFFSET_OUT_OF_RANGE, offset
    return None, max(offset, log_start_offset)


def low_watermark(leader_log_start_offset: int, follower_log_start_offsets: Iterable[int]) -> int:
    """Kafka's ``lowWatermarkIfLeader``: the lowest log start over the leader and its
    live followers (an offset of a follower not heard from yet is
    :data:`UNKNOWN_OFFSET`, and then so is the low watermark)."""
    return min([leader_log_start_offset, *follower_log_start_offsets])


def answer(topic: str, partition: int, offset: int, low: int,
           error: str | None = None, message: str = "") -> dict:
    """One partition's entry of the broker's answer (see the module's theory)."""
    return {"topic": topic, "partition": partition, "offset": offset, "low_watermark": low,
            "error": error, "message": message}


def partition_error(entry: dict) -> ShmlogError | None:
    """The typed error of one partition's answer, None when it succeeded."""
    name = entry.get("error")
    if name is None:
        return None
    where = f"{entry.get('topic')}-{entry.get('partition')}"
    message = f"delete-records of {where}: {name}" + \
        (f" ({entry['message']})" if entry.get("message") else "")
    return _ERROR_CLASSES.get(name, ShmlogError)(message)


def parse_offset_json(text: str) -> list[tuple[str, int, int]]:
    """The (topic, partition, offset) triples of kafka-delete-records'
    ``--offset-json-file``: ``{"partitions": [{"topic": "t", "partition": 0,
    "offset": 10}, ...], "version": 1}``.

    Raises
    ------
    LocalProtocolError
        Not that format: the message says what is wrong.
    """
    try:
        document = json.loads(text)
    except ValueError as error:
        raise LocalProtocolError(f"the offsets file is not JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise LocalProtocolError('the offsets file needs {"partitions": [{"topic": ..., '
                                 '"partition": ..., "offset": ...}], "version": 1}')
    if document.get("version", 1) != 1:
        raise LocalProtocolError(f"unknown offsets file version {document.get('version')!r} "
                                 f"(1 is known)")
    triples = []
    for entry in document["partitions"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) or \
                not all(isinstance(entry.get(key), int) and not isinstance(entry.get(key), bool)
                        for key in ("partition", "offset")):
            raise LocalProtocolError(f"an offsets file entry needs a topic (string), a "
                                     f"partition and an offset (integers): {entry!r}")
        triples.append((entry["topic"], entry["partition"], entry["offset"]))
    if len({(topic, partition) for topic, partition, _ in triples}) != len(triples):
        raise LocalProtocolError("the offsets file names a partition twice (Kafka's tool "
                                 "refuses that too)")
    return triples
