"""Small records the clients share: a partition's name, a committed offset.

Light: ``Admin`` and the ``shmlog`` command's broker-asking verbs use them, so this
module imports nothing (the consumer, which loads numba, re-exports them).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition", "OffsetAndMetadata"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to read) and the committer's note."""
    offset: int
    metadata: str = ""
