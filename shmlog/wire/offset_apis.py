"""Committed offsets over Kafka's wire: OffsetCommit 2-8 and OffsetFetch 1-7, in the
same store shmlog's own consumers commit to (``__consumer_offsets`` through the
group coordinator), so ``shmlog groups describe`` shows a Kafka client's group, its
offsets and its lag.

Rules
-----
* A commit is the coordinator's (``GroupCoordinator.commit_offsets``): fenced by
  generation and member, whole or not at all; a refusal gives every partition of the
  request the same error code. A commit without a member (generation -1) to a group
  that has members gets UNKNOWN_MEMBER_ID, Kafka's answer to it.
* The coordinator keeps no leader epoch with a committed offset: OffsetCommit's
  ``committed_leader_epoch`` (v6+) is not stored and OffsetFetch answers -1 (v5+),
  which Kafka's clients read as "no epoch" (they skip the truncation check).
  OffsetCommit's ``retention_time_ms`` (v2-4) is not used: the broker's
  ``offsets_retention_minutes`` applies to every group.
* A partition asked for without a commit is answered offset -1 and no error, as
  Kafka does; OffsetFetch v2+ without topics gives every partition committed.
  ``require_stable`` (v7) changes nothing: there are no transactional commits.
* Static members (``group.instance.id``, v7+) are refused as the membership APIs
  refuse them (``group_apis.static_member``).

Theory of operation
-------------------
Both run on the broker's loop thread and call the coordinator directly; a commit is
appended to ``__consumer_offsets`` before it is answered (the coordinator's offsets
manager does the append).
"""

from __future__ import annotations

import logging

from ..common.errors import NonEmptyGroupError, ShmlogError
from ..record.records import now_ms
from . import codec
from .error_codes import NONE, UNKNOWN_MEMBER_ID, for_error
from .group_apis import static_member

__all__ = ["OffsetApis"]

log = logging.getLogger("shmlog.broker.kafka")

OFFSET_COMMIT_KEY, OFFSET_FETCH_KEY = 8, 9
_NO_OFFSET = _NO_EPOCH = -1


class OffsetApis:
    """OffsetCommit and OffsetFetch of the groups of ``core`` (a BrokerCore)."""

    def __init__(self, core) -> None:
        self.coordinator = core.groups.coordinator

    def apis(self) -> dict:
        return {OFFSET_COMMIT_KEY: (2, 8, self.offset_commit),
                OFFSET_FETCH_KEY: (1, 7, self.offset_fetch)}

    def offset_commit(self, request, header, body):
        cls = codec.response_class(OFFSET_COMMIT_KEY)
        error = static_member(request, header, body)
        if error is None:
            entries = [[topic.name, partition.partition_index, partition.committed_offset,
                        partition.committed_metadata or ""]
                       for topic in body.topics for partition in topic.partitions]
            try:
                self.coordinator.commit_offsets(body.group_id, entries, body.member_id,
                                                body.generation_id_or_member_epoch,
                                                ticket=None, now=now_ms())
                error = NONE
            except NonEmptyGroupError:
                error = UNKNOWN_MEMBER_ID
            except ShmlogError as refused:
                error = for_error(refused)
            if error != NONE:
                log.info("Kafka listener: OffsetCommit of group %r from %s refused: %s",
                         body.group_id, request.peer, error)
        partition = cls.OffsetCommitResponseTopic.OffsetCommitResponsePartition
        return cls(version=header.api_version, throttle_time_ms=0, topics=[
            cls.OffsetCommitResponseTopic(name=topic.name, partitions=[
                partition(partition_index=entry.partition_index, error_code=error)
                for entry in topic.partitions])
            for topic in body.topics])

    def offset_fetch(self, request, header, body):
        cls = codec.response_class(OFFSET_FETCH_KEY)
        asked = None if body.topics is None else \
            [(topic.name, index) for topic in body.topics for index in topic.partition_indexes]
        try:
            found = {(topic, partition): (offset, metadata)
                     for topic, partition, offset, metadata in self.coordinator.fetch_offsets(
                         body.group_id, None if asked is None else [list(key) for key in asked],
                         ticket=None, now=now_ms())["offsets"]}
            error = NONE
        except ShmlogError as refused:
            found, error = {}, for_error(refused)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in (sorted(found) if asked is None else asked):
            by_topic.setdefault(topic, []).append(partition)
        entry = cls.OffsetFetchResponseTopic.OffsetFetchResponsePartition
        topics = [cls.OffsetFetchResponseTopic(name=topic, partitions=[
            entry(partition_index=partition,
                  committed_offset=found.get((topic, partition), (_NO_OFFSET, ""))[0],
                  committed_leader_epoch=_NO_EPOCH,
                  metadata=found.get((topic, partition), (_NO_OFFSET, ""))[1],
                  # v1 has no top-level error: a refusal is every partition's.
                  error_code=error if header.api_version < 2 else NONE)
            for partition in partitions]) for topic, partitions in by_topic.items()]
        return cls(version=header.api_version, throttle_time_ms=0, topics=topics,
                   error_code=error)
