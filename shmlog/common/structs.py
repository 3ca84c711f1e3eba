"""Small records the clients share: a partition's name, a committed offset, where
a setting comes from.

Light: ``Admin`` and the ``shmlog`` command's broker-asking verbs use them, so this
module imports nothing (the consumer, which loads numba, re-exports them).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["TopicPartition", "OffsetAndMetadata", "ConfigSource"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to read) and the committer's note."""
    offset: int
    metadata: str = ""


class ConfigSource(enum.Enum):
    """Where a topic's (or broker's) setting comes from, as Kafka's DescribeConfigs
    tells (its ConfigSource). The values travel in the broker's replies."""
    DEFAULT = "default"        # Kafka's DEFAULT_CONFIG: nobody set it
    TOPIC = "topic"            # DYNAMIC_TOPIC_CONFIG: the topic's own override
    BROKER = "broker"          # STATIC_BROKER_CONFIG: the broker's file or flags
