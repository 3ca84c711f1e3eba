"""kafka-python's ``kafka.structs``: ``TopicPartition`` is shmlog's (the same two
fields); ``OffsetAndMetadata`` has kafka-python's third field, ``leader_epoch``
(-1: unknown; shmlog's clients take it anywhere they take shmlog's own)."""

from __future__ import annotations

from typing import NamedTuple

from ..client.consumer import OffsetAndTimestamp
from ..common.structs import OffsetAndMetadata as ShmlogOffsetAndMetadata
from ..common.structs import TopicPartition

__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetAndTimestamp", "committed_offset"]


class OffsetAndMetadata(NamedTuple):
    """kafka-python's: an offset to commit, the committer's note, and the leader
    epoch it was read under (shmlog does not track it: -1)."""
    offset: int
    metadata: str | None = ""
    leader_epoch: int = -1


def committed_offset(offset: ShmlogOffsetAndMetadata) -> OffsetAndMetadata:
    """shmlog's committed offset in kafka-python's shape."""
    return OffsetAndMetadata(offset.offset, offset.metadata, -1)
