"""The topic requests: metadata, create (one topic, or many in one request),
delete, list, describe, add partitions, alter config, offsets by position or time,
and deleting records (Kafka's Metadata, CreateTopics, DeleteTopics,
CreatePartitions, IncrementalAlterConfigs, ListOffsets and DeleteRecords).

Rules
-----
* Internal topics (``internal_topics.INTERNAL_TOPICS``: ``__consumer_offsets``) are the
  broker's: it creates them on first use (``group_service``); a client cannot
  create, delete or grow them (Kafka's rule).
* A config change that could drop an internal topic's records is refused
  (:func:`refuse_internal_config`, ``InternalTopicConfigError``): the topic keeps
  its config. Other settings of it may change.
* Metadata names, for every partition, its row in the state table and its
  directory: what a consumer maps, and what a producer puts on its ring entries.
* Every field a client sends is checked (``control.require``) before anything
  changes; the partitions themselves change in the partition host.
* ``create_topics`` answers per topic, as Kafka's CreateTopics does: each entry is
  the topic's description or its error (``control.error_entry``); one topic refused
  leaves the others created. It is a single broker's request: a cluster's broker
  does not serve it (``ClusterTopicService``), and the client asks per topic.

Theory of operation
-------------------
A :class:`~shmlog.broker.service.Service` with no clock and nothing held back: each
request is answered at once from the :class:`PartitionHost` (which tells its
listeners, the group coordinator among them, when the topics changed).
"""

from __future__ import annotations

import os

from ..common import access
from ..common.errors import (
    InternalTopicConfigError,
    InternalTopicError,
    InvalidConfigError,
    InvalidReplicationFactorError,
    LocalProtocolError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import INTERNAL_TOPICS
from ..protocol.control import error_entry, require
from ..storage import delete_records as deletion
from ..storage.topic_config import TopicConfig, config_sources
from .partition_host import PartitionHost
from .service import ImmediateService

__all__ = ["TopicService", "refuse_internal", "refuse_internal_config", "delete_records_entries"]

# Settings of an internal topic a client may not set, though inert while its policy is
# compact-only (log_retention deletes by time or size only under "delete"): set, they
# are a deletion armed for the day the policy changes (a config znode written by hand,
# a broker without this check), and retention.ms=1 would then drop every commit.
_INTERNAL_RETENTION_KEYS = frozenset({"retention.ms", "retention.bytes"})


def _checked_topic(name, partitions, config, replication_factor) -> tuple[str, int, dict]:
    """A new topic's (name, partitions, config), its fields checked; partitions are
    the partition host's to judge."""
    refuse_internal(name, "created")
    if replication_factor is not None and require(replication_factor, int,
                                                  "replication_factor") != 1:
        # Kafka refuses a factor above the live brokers (INVALID_REPLICATION_FACTOR).
        raise InvalidReplicationFactorError(
            f"a single broker keeps one copy of each partition: replication factor "
            f"{replication_factor} cannot be met for topic {name!r:.100} (a cluster can: "
            f"see shmlog cluster)")
    return require(name, str, "name"), partitions, require(config or {}, dict, "config")


def refuse_internal(name, done: str) -> None:
    """Clients never create, delete or grow an internal topic (Kafka refuses it too):
    the broker owns it, and a group's commits are found by hashing the group id over
    its partition count, so another count or a new empty topic loses every commit.
    The name's type is checked first: a list or dict is a malformed request, not a
    lookup that fails on an unhashable key."""
    if require(name, str, "name") in INTERNAL_TOPICS:
        raise InternalTopicError(f"{name} is an internal topic (the consumer groups' committed "
                                f"offsets); the broker manages it, it cannot be {done} by a "
                                f"client")


def refuse_internal_config(name: str, overrides: dict, changed) -> None:
    """Refuse a config change of an internal topic that could drop a live commit.

    ``overrides`` is the topic's config as it would be after the change, ``changed``
    the names the change sets. What can drop a commit: a cleanup policy with
    ``delete`` in it (a policy set so, or ``compact`` removed and Kafka's default,
    ``delete``, back): retention then deletes whole segments, a group's latest
    commit among them, and a restarted coordinator reads back only what is left. A
    compact-only log keeps every key's latest record, so compaction settings
    (``min.compaction.lag.ms``, ``delete.retention.ms``, ...) and segment sizes cannot
    lose a live commit and stay free. Retention settings are refused too (see
    ``_INTERNAL_RETENTION_KEYS``). Kafka's broker has no such check; its code for a
    refused config is INVALID_CONFIG, whose class this error extends.
    """
    if name not in INTERNAL_TOPICS:
        return
    try:
        resulting = TopicConfig.from_overrides(overrides)
    except InvalidConfigError:
        return                                  # refused as any topic's, by the caller
    armed = sorted(_INTERNAL_RETENTION_KEYS.intersection(changed))
    if resulting.delete or armed:
        what = f"cleanup.policy={resulting.cleanup_policy!r}" if resulting.delete else \
            f"{', '.join(armed)}"
        raise InternalTopicConfigError(
            f"{name} is an internal topic (the consumer groups' committed offsets): "
            f"{what} could let retention delete live commits; its cleanup.policy stays "
            f"'compact' and its retention settings are the broker's. Nothing was changed")


class TopicService(ImmediateService):
    """Topic requests over a :class:`PartitionHost`.

    Parameters
    ----------
    host : PartitionHost
    prefix : str
        The broker's shared-memory prefix (metadata tells producers where their
        rings go).
    """

    def __init__(self, host: PartitionHost, prefix: str):
        self.host = host
        self.prefix = prefix

    def handlers(self) -> dict:
        return {"metadata": self.metadata, "create_topic": self.create_topic,
                "create_topics": self.create_topics,
                "delete_topic": self.delete_topic, "list_topics": self.list_topics,
                "describe_topic": self.describe_topic, "add_partitions": self.add_partitions,
                "alter_topic_config": self.alter_topic_config,
                "offset_for_timestamp": self.offset_for_timestamp,
                "list_offsets": self.list_offsets, "delete_records": self.delete_records,
                "describe_log_dirs": self.describe_log_dirs}

    # -- requests ------------------------------------------------------------------
    def _topic(self, name: str) -> dict:
        logs = self.host.logs
        metadata = logs.describe_topic(require(name, str, "name"))
        return {"name": metadata.name, "topic_id": metadata.topic_id,
                "partitions": [{"partition": partition,
                                "row": self.host.partition(metadata.name, partition).row,
                                "directory": os.path.join(logs.topics_dir, metadata.name,
                                                          str(partition))}
                               for partition in range(metadata.partitions)],
                "config": metadata.config.as_dict(),
                # The topic's own settings (topic.json), apart: tools show them alone.
                "overrides": metadata.config.overrides()}

    def metadata(self, topics: list | None = None) -> dict:
        names = self.host.logs.list_topics() if topics is None else \
            [require(name, str, "topics") for name in require(topics, list, "topics")]
        return {"state_table": self.host.table_name,
                "broker_epoch": self.host.table.broker_epoch,
                "ring_prefix": self.prefix, "ring_group_id": access.current().group_id,
                "topics": [self._topic(name) for name in names]}

    def create_topic(self, name, partitions: int = 1, config: dict | None = None,
                     replication_factor: int | None = None) -> dict:
        self.host.create_topic(*_checked_topic(name, partitions, config, replication_factor))
        return self._topic(name)

    def create_topics(self, topics) -> dict:
        """Create every topic of ``topics``, a list of ``{"name", "partitions",
        "config", "replication_factor"}`` (the last three optional, as create_topic's
        fields), in one pass of the partition host; ``{"topics": [entry, ...]}`` in
        order, each entry a description (``ok``) or an error."""
        checked, entries = [], []
        for topic in require(topics, list, "topics"):
            try:
                checked.append(self._new_topic(require(topic, dict, "topics")))
                entries.append(None)
            except ShmlogError as error:
                entries.append(error_entry(error))
        outcomes = iter(self.host.create_topics(checked))
        for index, entry in enumerate(entries):
            if entry is not None:
                continue
            outcome = next(outcomes)
            entries[index] = error_entry(outcome) if isinstance(outcome, ShmlogError) \
                else {"ok": True, **self._topic(outcome.name)}
        return {"topics": entries}

    def _new_topic(self, topic: dict) -> tuple[str, int, dict]:
        """(name, partitions, config) of one topic of a create_topics request, checked
        as create_topic checks its fields."""
        unknown = set(topic) - {"name", "partitions", "config", "replication_factor"}
        if unknown:
            raise LocalProtocolError(f"create_topics: unknown fields {sorted(unknown)} for "
                                     f"topic {topic.get('name')!r:.100}")
        return _checked_topic(topic.get("name"), topic.get("partitions", 1),
                              topic.get("config"), topic.get("replication_factor"))

    def delete_topic(self, name) -> dict:
        refuse_internal(name, "deleted")
        self.host.delete_topic(require(name, str, "name"))
        return {}

    def list_topics(self) -> dict:
        return {"topics": self.host.logs.list_topics()}

    def describe_topic(self, name) -> dict:
        """The topic's metadata and, in ``config_sources``, each setting's value
        and where it comes from (``config.config_sources``: Admin.describe_configs)."""
        topic = self._topic(name)
        topic["config_sources"] = config_sources(
            self.host.logs.describe_topic(topic["name"]).config, self.broker_topic_defaults(),
            self.topic_overrides(topic["name"]))
        return topic

    def topic_overrides(self, name: str) -> list[str] | None:
        """The names of the topic's overrides as set, where they are kept so (None
        here: topic.json keeps the values that differ from the defaults)."""
        return None

    def broker_topic_defaults(self) -> dict:
        """Topic settings the broker sets for topics without an override (none on a
        single broker: Kafka's defaults apply)."""
        return {}

    def add_partitions(self, name, total) -> dict:
        refuse_internal(name, "given partitions")
        self.host.add_partitions(require(name, str, "name"), total)
        return self._topic(name)

    def alter_topic_config(self, name, set: dict | None = None, delete: list | None = None) -> dict:
        name, changes = require(name, str, "name"), require(set or {}, dict, "set")
        removed = tuple(require(delete or [], list, "delete"))
        if name in INTERNAL_TOPICS:
            overrides = self.host.logs.describe_topic(name).config.overrides()
            overrides.update(changes)
            for key in removed:
                overrides.pop(key, None)
            refuse_internal_config(name, overrides, changes)
        self.host.alter_topic_config(name, changes, removed)
        return self._topic(name)

    def offset_for_timestamp(self, topic, partition, timestamp) -> dict:
        """Kafka's ListOffsets by time: the first offset whose timestamp is >= it."""
        hosted = self.host.partition(require(topic, str, "topic"),
                                     require(partition, int, "partition"))
        found = hosted.log.offset_for_timestamp(require(timestamp, int, "timestamp"))
        return {"offset": found[0] if found else None,
                "timestamp": found[1] if found else None}

    def list_offsets(self, topic) -> dict:
        """Kafka's ListOffsets for earliest and latest: each partition's log start
        and log end offsets."""
        metadata = self.host.logs.describe_topic(require(topic, str, "topic"))
        return {"partitions": [self._offsets_of(self.host.partition(metadata.name, partition))
                               for partition in range(metadata.partitions)]}

    def _offsets_of(self, hosted) -> dict:
        """A partition's offsets and disk use: log start and end, high watermark,
        bytes and segments."""
        partition_log = hosted.log
        return {"partition": hosted.partition,
                "log_start_offset": partition_log.log_start_offset,
                "log_end_offset": partition_log.log_end_offset,
                "high_watermark": self.host.appender.high_watermark(hosted.row),
                "size": partition_log.size, "segment_count": len(partition_log.segments)}

    def describe_log_dirs(self, topics: list | None = None) -> dict:
        """Kafka's DescribeLogDirs for this broker's one log directory: per partition
        hosted here (of ``topics``, default every topic) its offsets, bytes, segments and offset
        lag (Kafka's: how far the log end is below the high watermark, 0 for a
        current log; a follower's lag behind its leader is in its high watermark)."""
        names = self.host.logs.list_topics() if topics is None else \
            [require(name, str, "topics") for name in require(topics, list, "topics")]
        partitions = []
        for name in names:
            metadata = self.host.logs.describe_topic(name)
            for partition in range(metadata.partitions):
                try:
                    hosted = self.host.partition(metadata.name, partition)
                except UnknownTopicOrPartitionError:
                    continue                  # a cluster member hosts some partitions only
                entry = {"topic": metadata.name, **self._offsets_of(hosted),
                         "directory": hosted.log.directory}
                entry["offset_lag"] = max(entry["high_watermark"] - entry["log_end_offset"], 0)
                partitions.append(entry)
        return {"log_dir": self.host.logs.topics_dir, "partitions": partitions}

    def delete_records(self, partitions) -> dict:
        """Kafka's DeleteRecords: ``partitions`` is a list of ``[topic, partition,
        offset]``; per partition, ``delete_records.answer``'s entry (a single broker
        leads every partition, and its low watermark is its own log start). Nothing
        waits here: the client asks again while a low watermark is behind."""
        return {"partitions": [self._delete_records_of(topic, partition, offset)
                               for topic, partition, offset in delete_records_entries(partitions)]}

    def _delete_records_of(self, topic: str, partition: int, offset: int) -> dict:
        refused = deletion.refuse_internal(topic, partition, offset)
        if refused is not None:
            return refused
        try:
            error, target = self.host.delete_records(topic, partition, offset)
        except ShmlogError as refused:
            name = deletion.UNKNOWN_TOPIC_OR_PARTITION if isinstance(
                refused, UnknownTopicOrPartitionError) else deletion.KAFKA_STORAGE_ERROR
            return deletion.answer(topic, partition, offset, deletion.UNKNOWN_OFFSET, name,
                                   str(refused))
        start = self.host.partition(topic, partition).log.log_start_offset
        return deletion.answer(topic, partition, target, start, error)


def delete_records_entries(partitions) -> list[tuple[str, int, int]]:
    """The ``[topic, partition, offset]`` triples of a delete_records request, checked.

    Raises
    ------
    LocalProtocolError
        Not a list of such triples, or a partition named twice.
    """
    entries = []
    for entry in require(partitions, list, "partitions"):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and all(isinstance(value, int) and not isinstance(value, bool)
                        for value in entry[1:])):
            raise LocalProtocolError(f"delete_records takes [topic, partition, offset] "
                                     f"entries, got {entry!r:.200}")
        entries.append((entry[0], entry[1], entry[2]))
    if len({entry[:2] for entry in entries}) != len(entries):
        raise LocalProtocolError("delete_records names a partition twice")
    return entries
