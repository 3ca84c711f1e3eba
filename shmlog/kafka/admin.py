"""kafka-python's ``kafka.admin``: :class:`KafkaAdminClient` and the request
objects (``NewTopic``, ``NewPartitions``, ``ConfigResource``,
``ConfigResourceType``), which are ``shmlog.client.admin``'s."""

from __future__ import annotations

from typing import Iterable

from ..client.admin import (
    Admin,
    ConfigEntry,
    ConfigResource,
    ConfigResourceType,
    GroupInformation,
    MemberInformation,
    NewPartitions,
    NewTopic,
)
from ..common.structs import ConfigSource
from .structs import OffsetAndMetadata, TopicPartition, committed_offset

__all__ = ["KafkaAdminClient", "NewTopic", "NewPartitions", "ConfigResource",
           "ConfigResourceType", "ConfigEntry", "ConfigSource", "GroupInformation",
           "MemberInformation"]


class KafkaAdminClient(Admin):
    """kafka-python's ``KafkaAdminClient``: :class:`shmlog.Admin` with kafka-python's
    return shapes where shmlog's differ."""

    def list_consumer_groups(self) -> list[tuple[str, str]]:
        """``[(group_id, protocol_type)]``, as kafka-python lists groups."""
        return [(group["group_id"], "consumer") for group in super().list_consumer_groups()]

    def list_consumer_group_offsets(self, group_id: str,
                                    partitions: Iterable[TopicPartition] | None = None
                                    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """``{TopicPartition: OffsetAndMetadata}`` with kafka-python's three fields."""
        return {partition: committed_offset(offset) for partition, offset
                in super().list_consumer_group_offsets(group_id, partitions).items()}
