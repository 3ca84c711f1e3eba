"""``Admin``: topic and consumer-group administration against the local broker, over
its control endpoint."""

from __future__ import annotations

from typing import Any, Mapping

from . import limits, settings
from .control_client import request
from .paths import default_data_dir
from .errors import LocalProtocolError

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
    ``ShmlogError`` naming the command to start a broker when none answers; the
    constructor raises ``InvalidConfigError`` for a bad setting.
    """

    def __init__(self, bootstrap: str | None = None, *, timeout_ms: int = 10_000):
        self.data_dir = settings.data_directory(bootstrap) or default_data_dir()
        self.timeout_ms = settings.integer("timeout_ms", timeout_ms, 0, limits.CLIENT_WAIT_MS_MAX)

    def _request(self, request_type: str, **fields: Any) -> dict:
        return request(self.data_dir, request_type, timeout_ms=self.timeout_ms, **fields)

    def create_topic(self, name: str, partitions: int = 1,
                     config: Mapping[str, Any] | None = None,
                     replication_factor: int | None = None) -> dict:
        """Create a topic; in a cluster, ``replication_factor`` replicas of each
        partition are spread over the live brokers (the broker's
        ``default.replication.factor`` when None)."""
        fields = {} if replication_factor is None else {"replication_factor": replication_factor}
        return self._request("create_topic", name=name, partitions=partitions,
                             config=dict(config or {}), **fields)

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

    def list_offsets(self, topic: str) -> list[dict]:
        """Per partition: ``log_start_offset`` and ``log_end_offset``."""
        return self._request("list_offsets", topic=topic)["partitions"]

    # -- consumer groups ----------------------------------------------------------------
    def list_consumer_groups(self) -> list[dict]:
        """Every group: id, state, assignor, member count."""
        return self._request("list_groups")["groups"]

    def describe_consumer_group(self, group_id: str) -> dict:
        """State, generation, members and their assignments, and per partition the
        committed offset, log end offset and lag."""
        return self._request("describe_group", group_id=group_id)

    def list_consumer_group_offsets(self, group_id: str) -> dict:
        """{(topic, partition): (offset, metadata)} of what the group committed."""
        return {(topic, partition): (offset, metadata) for topic, partition, offset, metadata
                in self._request("fetch_offsets", group_id=group_id)["offsets"]}

    def alter_consumer_group_offsets(self, group_id: str, offsets: Mapping) -> None:
        """Commit ``{(topic, partition): offset}`` for a group with no active members
        (``NonEmptyGroupError`` otherwise)."""
        self._request("commit_offsets", group_id=group_id,
                      offsets=[[topic, partition, offset, ""]
                               for (topic, partition), offset in sorted(offsets.items())])

    def delete_consumer_group(self, group_id: str) -> None:
        """Forget a group with no active members, and its committed offsets."""
        self._request("delete_group", group_id=group_id)

    def plan_offset_reset(self, group_id: str, topics: list[str], *, to: str,
                          value: int | None = None) -> list[dict]:
        """What ``kafka-consumer-groups --reset-offsets`` would do: per partition of
        ``topics``, the current committed offset and the new one.

        ``to`` is ``earliest``, ``latest``, ``offset`` (``value``), ``timestamp``
        (``value`` in ms: the first offset at or after it, else the end) or
        ``shift`` (``value`` added to the committed offset). New offsets are clamped
        to the partition's [log start, log end], as Kafka's tool does.
        """
        if to not in ("earliest", "latest", "offset", "timestamp", "shift"):
            raise LocalProtocolError(f"cannot reset offsets to {to!r}")
        if to in ("offset", "timestamp", "shift") and value is None:
            raise LocalProtocolError(f"resetting to {to} needs a value")
        committed = self.list_consumer_group_offsets(group_id)
        plan = []
        for topic in topics:
            for entry in self.list_offsets(topic):
                partition = entry["partition"]
                start, end = entry["log_start_offset"], entry["log_end_offset"]
                current = committed.get((topic, partition), (None, ""))[0]
                if to == "earliest":
                    target = start
                elif to == "latest":
                    target = end
                elif to == "offset":
                    target = value
                elif to == "shift":
                    target = (current if current is not None else end) + value
                else:
                    found = self._request("offset_for_timestamp", topic=topic,
                                          partition=partition, timestamp=value)["offset"]
                    target = end if found is None else found
                plan.append({"topic": topic, "partition": partition, "current": current,
                             "new": min(max(target, start), end)})
        return plan
