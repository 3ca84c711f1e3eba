"""``Admin``: topic and consumer-group administration against the local broker, over
its control endpoint."""

from __future__ import annotations

import time
from typing import Any, Mapping

from . import delete_records as deletion
from . import limits, settings
from .control_client import request
from .paths import default_data_dir
from .errors import LocalProtocolError
from .iso8601 import datetime_ms, duration_ms

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
        """Per partition: ``log_start_offset``, ``log_end_offset``, ``high_watermark``,
        ``size`` (bytes) and ``segment_count``."""
        return self._request("list_offsets", topic=topic)["partitions"]

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset whose record's timestamp is at or after ``timestamp_ms``
        (Kafka's ListOffsets by time), None when there is none."""
        return self._request("offset_for_timestamp", topic=topic, partition=partition,
                             timestamp=timestamp_ms)["offset"]

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
                          value: int | str | None = None) -> list[dict]:
        """What ``kafka-consumer-groups --reset-offsets`` would do: per partition of
        ``topics``, the current committed offset and the new one.

        ``to`` is ``earliest``, ``latest``, ``offset`` (``value``), ``timestamp``
        (``value`` in ms: the first offset at or after it, else the end),
        ``datetime`` (``value`` an ISO-8601 date-time, local time without a zone:
        as ``timestamp``), ``duration`` (``value`` an ISO-8601 duration such as
        ``PT10M``: as ``timestamp`` that long before now) or ``shift`` (``value``
        added to the committed offset): Kafka's ``--to-*``, ``--by-duration`` and
        ``--shift-by``. New offsets are clamped to the partition's [log start, log
        end], as Kafka's tool does.
        """
        if to not in ("earliest", "latest", "offset", "timestamp", "datetime", "duration",
                      "shift"):
            raise LocalProtocolError(f"cannot reset offsets to {to!r}")
        if to in ("offset", "timestamp", "datetime", "duration", "shift") and value is None:
            raise LocalProtocolError(f"resetting to {to} needs a value")
        if to == "datetime":
            to, value = "timestamp", datetime_ms(value)
        elif to == "duration":
            to, value = "timestamp", round(time.time() * 1000) - duration_ms(value)
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

    # -- records and log directories ----------------------------------------------------
    def delete_records(self, records_to_delete: Mapping, timeout_ms: int | None = None) -> dict:
        """Delete the records below an offset of each partition (kafka-python's
        ``delete_records``, Kafka's DeleteRecords): ``records_to_delete`` maps
        ``TopicPartition`` (or any ``(topic, partition)`` pair) to the offset the log
        is to start at; -1 is the partition's high watermark (delete everything
        committed).

        Returns, per partition (the keys given), ``{"partition_index",
        "low_watermark", "error_code"}`` (error_code 0: errors raise), once every
        low watermark reached its offset: in a cluster the lowest log start over the
        leader and its live followers, which learn the new start from the leader's
        next fetch response. Kafka's broker waits for that (``DelayedDeleteRecords``);
        here the client asks again until then (the request is idempotent).

        Parameters
        ----------
        timeout_ms : int, optional
            How long to wait for the low watermarks (default: the client's
            ``timeout_ms``).

        Raises
        ------
        OffsetOutOfRangeError
            An offset is past the partition's high watermark (or negative, not -1).
        UnknownTopicOrPartitionError, NotLeaderOrFollowerError
            A partition is unknown, or its leader did not answer as leader.
        RequestTimedOutError
            A low watermark stayed below its offset for ``timeout_ms``.
        """
        keys = {tuple(key): key for key in records_to_delete}
        entries = self.delete_records_report(
            {tuple(key): offset for key, offset in records_to_delete.items()}, timeout_ms)
        for entry in entries:
            error = deletion.partition_error(entry)
            if error is not None:
                raise error
        return {keys[(entry["topic"], entry["partition"])]: {
            "partition_index": entry["partition"], "low_watermark": entry["low_watermark"],
            "error_code": 0} for entry in entries}

    def delete_records_report(self, records_to_delete: Mapping,
                              timeout_ms: int | None = None) -> list[dict]:
        """:meth:`delete_records` without raising: per partition, the broker's answer
        (``delete_records.answer``: topic, partition, offset, low_watermark, and an
        error name or None, with its message), after waiting for the low watermarks
        of the partitions that succeeded (``REQUEST_TIMED_OUT`` for those still
        below their offset after ``timeout_ms``). What ``shmlog delete-records``
        prints."""
        wait_ms = self.timeout_ms if timeout_ms is None else \
            settings.integer("timeout_ms", timeout_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        deadline = time.monotonic() + wait_ms / 1000
        offsets = {}
        for (topic, partition), offset in records_to_delete.items():
            offsets[(topic, partition)] = settings.integer(
                "offset", offset, deletion.HIGH_WATERMARK, limits.OFFSET_MAX)
        done: dict[tuple[str, int], dict] = {}
        while True:
            reply = self._request("delete_records", partitions=[
                [topic, partition, offset] for (topic, partition), offset in offsets.items()])
            for entry in reply["partitions"]:
                name = (entry["topic"], entry["partition"])
                if entry["error"] is not None or entry["low_watermark"] >= entry["offset"]:
                    done[name] = entry
                    del offsets[name]
                else:       # -1 resolved once: asked again, the high watermark moved on
                    offsets[name] = entry["offset"]
                    done[name] = {**entry, "error": deletion.REQUEST_TIMED_OUT,
                                  "message": f"the low watermark stayed below "
                                             f"{entry['offset']} for {wait_ms} ms (a follower "
                                             f"has not fetched)"}
            if not offsets or time.monotonic() >= deadline:
                return [done[name] for name in records_to_delete]
            time.sleep(limits.DELETE_RECORDS_POLL_MS / 1000)

    def describe_log_dirs(self, topics: list[str] | None = None) -> dict:
        """Kafka's DescribeLogDirs for the local broker: ``{"log_dir", "partitions"}``,
        each partition with its topic, offsets, ``size`` (bytes), ``segment_count``,
        ``offset_lag`` and directory."""
        fields = {} if topics is None else {"topics": list(topics)}
        return self._request("describe_log_dirs", **fields)
