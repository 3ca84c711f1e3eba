"""``Admin``: topic administration against the local broker, over its control endpoint."""

from __future__ import annotations

from typing import Any, Mapping

from .broker import default_data_dir, request

__all__ = ["Admin"]


class Admin:
    """Create, inspect, change and delete topics, like Kafka's admin client.

    Parameters
    ----------
    bootstrap : str, optional
        The broker's data directory; default ``$SHMLOG_DATA_DIR`` or the default
        directory ``shmlog broker`` uses.
    timeout_ms : int
        How long to wait for each reply.

    Every method raises the broker's typed error (``InvalidTopicError``,
    ``TopicExistsError``, ``UnknownTopicOrPartitionError``, ...), or
    ``ShmlogError`` naming the command to start a broker when none answers.
    """

    def __init__(self, bootstrap: str | None = None, *, timeout_ms: int = 10_000):
        self.data_dir = bootstrap or default_data_dir()
        self.timeout_ms = timeout_ms

    def _request(self, request_type: str, **fields: Any) -> dict:
        return request(self.data_dir, request_type, timeout_ms=self.timeout_ms, **fields)

    def create_topic(self, name: str, partitions: int = 1,
                     config: Mapping[str, Any] | None = None) -> dict:
        return self._request("create_topic", name=name, partitions=partitions,
                             config=dict(config or {}))

    def delete_topic(self, name: str) -> None:
        self._request("delete_topic", name=name)

    def list_topics(self) -> list[str]:
        return self._request("list_topics")["topics"]

    def describe_topic(self, name: str) -> dict:
        """Partitions (with their directories and state-table rows) and the full config."""
        return self._request("describe_topic", name=name)

    def add_partitions(self, name: str, total: int) -> dict:
        return self._request("add_partitions", name=name, total=total)

    def alter_topic_config(self, name: str, set: Mapping[str, Any] | None = None,
                           delete: list[str] | None = None) -> dict:
        return self._request("alter_topic_config", name=name, set=dict(set or {}),
                             delete=list(delete or []))

    def metadata(self) -> dict:
        return self._request("metadata")
