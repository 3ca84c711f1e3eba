"""``Admin``: topic and consumer-group administration against the local broker, over
its control endpoint.

Two shapes of the same requests: shmlog's singular methods (``create_topic``,
``describe_topic``, ...) answer with the broker's reply, and kafka-python's plural
ones (``create_topics([NewTopic(...)])``, ``describe_configs([ConfigResource(...)])``,
...) take kafka-python's request objects, defined here, and answer with typed
records.

Rules (Kafka's, for the plural methods)
-----
* A plural request acts on every item it names even when one fails, then raises
  the first item's error (Kafka answers an error per item; kafka-python raises).
* ``validate_only`` checks everything the broker would (name, partition count,
  settings, existence) and changes nothing.
* ``alter_configs`` replaces a topic's overrides with the ones given, as Kafka's
  (non-incremental) AlterConfigs does; a broker's settings are static (its file).
* ``describe_configs`` gives each setting its value as Kafka writes it (a string)
  and its source (``structs.ConfigSource``: the topic's override, the broker's
  setting, or Kafka's default).

Light: ``shmlog topics`` and ``shmlog groups`` use this module, so it imports
neither numpy nor numba (``validate_only`` loads the config registry and the topic
name rule on first use, which do).
"""

from __future__ import annotations

import enum
import json
import time
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from ..common import limits, settings
from ..common.errors import (
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidPartitionsError,
    LocalProtocolError,
    ShmlogError,
    TopicExistsError,
    UnsupportedKafkaOptionError,
    UnsupportedRequestError,
)
from ..common.paths import default_data_dir
from ..common.structs import ConfigSource, OffsetAndMetadata, TopicPartition
from ..common.topic_names import validate_topic_name
from ..protocol.control import decode_entry
from ..protocol.control_client import request
from ..storage import delete_records as deletion
from ..storage.topic_config import TopicConfig
from . import options as client_options
from .offset_reset import plan_offset_reset

__all__ = ["Admin", "NewTopic", "NewPartitions", "ConfigResource", "ConfigResourceType",
           "ConfigEntry", "GroupInformation", "MemberInformation"]


class NewTopic:
    """A topic to create (kafka-python's): ``num_partitions`` and
    ``replication_factor`` -1 take the broker's defaults; ``replica_assignments``
    (placing replicas by hand) is not supported."""

    def __init__(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                 replica_assignments: Mapping | None = None,
                 topic_configs: Mapping[str, Any] | None = None):
        self.name = name
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignments = dict(replica_assignments or {})
        self.topic_configs = dict(topic_configs or {})

    def __repr__(self) -> str:
        return (f"NewTopic({self.name!r}, num_partitions={self.num_partitions}, "
                f"replication_factor={self.replication_factor}, "
                f"topic_configs={self.topic_configs!r})")


class NewPartitions:
    """A topic's new partition count (kafka-python's); ``new_assignments`` is not
    supported."""

    def __init__(self, total_count: int, new_assignments: list | None = None):
        self.total_count = total_count
        self.new_assignments = new_assignments


class ConfigResourceType(enum.IntEnum):
    """Kafka's resource type numbers."""
    BROKER = 4
    TOPIC = 2


class ConfigResource:
    """A topic's or a broker's settings (kafka-python's): ``configs`` names the
    settings to describe (None: all) or gives those to set."""

    def __init__(self, resource_type: ConfigResourceType | str, name: str,
                 configs: Mapping[str, Any] | Iterable[str] | None = None):
        if not isinstance(resource_type, ConfigResourceType):
            try:
                resource_type = ConfigResourceType[str(resource_type).upper()]
            except KeyError:
                raise LocalProtocolError(f"resource type must be TOPIC or BROKER, got "
                                         f"{resource_type!r}") from None
        self.resource_type = resource_type
        self.name = name
        self.configs = configs

    def __repr__(self) -> str:
        return f"ConfigResource({self.resource_type.name}, {self.name!r}, {self.configs!r})"


class ConfigEntry(NamedTuple):
    """One setting as ``describe_configs`` gives it: its value as Kafka writes it (a
    string; None for an unset optional setting) and where it comes from."""
    name: str
    value: str | None
    source: ConfigSource
    is_default: bool
    read_only: bool
    is_sensitive: bool = False


class MemberInformation(NamedTuple):
    """A group member (kafka-python's field names; ``member_assignment`` is the list
    of its partitions, ``member_metadata`` the topics it subscribed to)."""
    member_id: str
    client_id: str
    client_host: str
    member_metadata: list
    member_assignment: list


class GroupInformation(NamedTuple):
    """A consumer group (kafka-python's field names): state ``"Dead"`` with no
    members for a group that does not exist, as Kafka answers."""
    error_code: int
    group: str
    state: str
    protocol_type: str
    protocol: str
    members: list
    authorized_operations: Any = None


def _kafka_text(value: Any) -> str | None:
    """A setting's value as Kafka's DescribeConfigs writes it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Admin:
    """Create, inspect, change and delete topics, like Kafka's admin client.

    Parameters
    ----------
    bootstrap : str, optional
        The broker's data directory; default ``$SHMLOG_DATA_DIR`` or the default
        directory ``shmlog broker`` uses.
    timeout_ms : int
        How long to wait for each reply (kafka-python's ``request_timeout_ms``);
        10 s by default, and ``limits.ADMIN_TOPIC_CHANGE_WAIT_MS`` for a topic
        change (a cluster's broker answers one once it took effect).
    bootstrap_servers : str or [str], optional
        kafka-python's name for ``bootstrap``.
    client_id : str, optional
        A name for this client (kept in :attr:`client_id`).
    **kafka_options
        kafka-python's other options: taken and ignored, or refused
        (``client_options``).

    Every method raises the broker's typed error (``InvalidTopicError``,
    ``TopicExistsError``, ``UnknownTopicOrPartitionError``, ...), or
    ``ShmlogError`` naming the command to start a broker when none answers; the
    constructor raises ``InvalidConfigError`` for a bad setting.
    """

    def __init__(self, bootstrap: str | None = None, *, timeout_ms: int | None = None,
                 bootstrap_servers=None, client_id: str | None = None,
                 request_timeout_ms: int | None = None, **kafka_options):
        self.data_dir = settings.bootstrap(bootstrap, bootstrap_servers) or default_data_dir()
        client_options.check_kafka_options(client_options.ADMIN, kafka_options,
                                           ("bootstrap", "timeout_ms", "bootstrap_servers",
                                            "client_id", "request_timeout_ms"))
        if timeout_ms is not None and request_timeout_ms is not None and \
                timeout_ms != request_timeout_ms:
            raise InvalidConfigError(f"timeout_ms={timeout_ms} and request_timeout_ms="
                                     f"{request_timeout_ms} disagree; give one of them")
        timeout_ms = timeout_ms if timeout_ms is not None else request_timeout_ms
        self._change_timeout_ms = limits.ADMIN_TOPIC_CHANGE_WAIT_MS if timeout_ms is None \
            else None
        self.timeout_ms = settings.integer("timeout_ms", 10_000 if timeout_ms is None
                                           else timeout_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        self.client_id = settings.optional_text("client_id", client_id)

    def _request(self, request_type: str, timeout_ms: int | None = None, **fields: Any) -> dict:
        return request(self.data_dir, request_type,
                       timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
                       **fields)

    def _change(self, timeout_ms: int | None) -> int | None:
        """A topic change's timeout: the one given, else :attr:`_change_timeout_ms`."""
        return timeout_ms if timeout_ms is not None else self._change_timeout_ms

    def close(self) -> None:
        """Nothing to release (each request uses its own socket): kafka-python's shape."""

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def create_topic(self, name: str, partitions: int = 1,
                     config: Mapping[str, Any] | None = None,
                     replication_factor: int | None = None) -> dict:
        """Create a topic; in a cluster, ``replication_factor`` replicas of each
        partition are spread over the live brokers (the broker's
        ``default.replication.factor`` when None)."""
        fields = {} if replication_factor is None else {"replication_factor": replication_factor}
        return self._request("create_topic", self._change_timeout_ms, name=name,
                             partitions=partitions, config=dict(config or {}), **fields)

    def delete_topic(self, name: str) -> None:
        self._request("delete_topic", self._change_timeout_ms, name=name)

    def list_topics(self) -> list[str]:
        return self._request("list_topics")["topics"]

    def describe_topic(self, name: str) -> dict:
        """Partitions (with their directories and state-table rows) and the full config."""
        return self._request("describe_topic", name=name)

    def add_partitions(self, name: str, total: int) -> dict:
        return self._request("add_partitions", self._change_timeout_ms, name=name, total=total)

    def alter_topic_config(self, name: str, set: Mapping[str, Any] | None = None,
                           delete: list[str] | None = None) -> dict:
        return self._request("alter_topic_config", self._change_timeout_ms, name=name,
                             set=dict(set or {}), delete=list(delete or []))

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

    def list_consumer_group_offsets(self, group_id: str,
                                    partitions: Iterable[TopicPartition] | None = None
                                    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """What the group committed: ``{TopicPartition: OffsetAndMetadata}`` (both
        tuples: ``(topic, partition): (offset, metadata)``), for ``partitions`` only
        when given (kafka-python's shape)."""
        wanted = None if partitions is None else {tuple(partition) for partition in partitions}
        return {TopicPartition(topic, partition): OffsetAndMetadata(offset, metadata)
                for topic, partition, offset, metadata
                in self._request("fetch_offsets", group_id=group_id)["offsets"]
                if wanted is None or (topic, partition) in wanted}

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
        ``topics``, the current committed offset and the new one, for ``to`` one of
        ``offset_reset.TARGETS`` (:func:`offset_reset.plan_offset_reset`)."""
        return plan_offset_reset(self, group_id, topics, to=to, value=value)

    # -- kafka-python's plural methods ---------------------------------------------------
    def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                      validate_only: bool = False) -> dict[str, dict]:
        """Create each :class:`NewTopic`; ``{name: its description}`` (empty
        descriptions with ``validate_only``, which creates nothing).

        As Kafka's CreateTopics, the topics travel in one request (several when they
        would not fit in one frame, ``limits.CREATE_TOPICS_REQUEST_BYTES_MAX``, or hold
        more than ``limits.CREATE_TOPICS_REQUEST_PARTITIONS_MAX`` partitions, each
        request within ``timeout_ms``), and the broker creates them in one pass; a
        cluster's broker takes one topic per request, and gets them so.

        Raises
        ------
        TopicExistsError, InvalidTopicError, InvalidPartitionsError, InvalidConfigError,
        InvalidReplicationFactorError
            The first topic's error, after every other topic was created.
        UnsupportedKafkaOptionError
            A topic places its replicas by hand (``replica_assignments``).
        """
        topics = list(new_topics)
        for topic in topics:
            if topic.replica_assignments:
                raise UnsupportedKafkaOptionError(
                    f"NewTopic {topic.name!r}: replica_assignments is not supported; the "
                    f"broker places replicas (rack-aware round robin, as Kafka)")
        fields = [_new_topic_fields(topic) for topic in topics]
        created, errors = {}, []
        if validate_only:
            existing = set(self.list_topics())
            for topic in fields:
                try:
                    _validate_new_topic(topic["name"], topic["partitions"], topic["config"],
                                        existing)
                    created[topic["name"]] = {}
                except ShmlogError as error:
                    errors.append(error)
        else:
            try:
                outcomes = self._create_in_requests(fields, timeout_ms)
            except UnsupportedRequestError:         # a cluster's broker: one by one
                outcomes = (self._create_one(topic, timeout_ms) for topic in fields)
            for topic, outcome in zip(fields, outcomes):
                if isinstance(outcome, ShmlogError):
                    errors.append(outcome)
                else:
                    created[topic["name"]] = outcome
        if errors:
            raise errors[0]
        return created

    def _create_in_requests(self, topics: list[dict], timeout_ms: int | None) -> list:
        """create_topics requests for ``topics``, as few as fit in frames: per topic,
        its description or the error that refused it."""
        outcomes: list = []
        for chunk in _chunks(topics, limits.CREATE_TOPICS_REQUEST_BYTES_MAX,
                             limits.CREATE_TOPICS_REQUEST_PARTITIONS_MAX):
            answer = self._request("create_topics", self._change(timeout_ms), topics=chunk)
            for entry in answer["topics"]:
                try:
                    outcomes.append(decode_entry(entry))
                except ShmlogError as error:
                    outcomes.append(error)
        return outcomes

    def _create_one(self, topic: dict, timeout_ms: int | None):
        """One create_topic request: the description, or the error that refused it."""
        try:
            return self._request("create_topic", self._change(timeout_ms), **topic)
        except ShmlogError as error:
            return error

    def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        """Delete each topic; raises the first one's error once all were tried."""
        timeout_ms = self._change(timeout_ms)
        _first_error([lambda name=name: self._request("delete_topic", timeout_ms, name=name)
                      for name in topics])

    def create_partitions(self, topic_partitions: Mapping[str, NewPartitions],
                          timeout_ms: int | None = None, validate_only: bool = False) -> None:
        """Grow each topic to its :class:`NewPartitions` ``total_count``; raises the
        first topic's error once all were tried (``InvalidPartitionsError`` for a
        count not above the current one)."""
        for name, new in topic_partitions.items():
            if new.new_assignments is not None:
                raise UnsupportedKafkaOptionError(
                    f"NewPartitions for {name!r}: new_assignments is not supported; the "
                    f"broker places the new partitions")

        def grow(name: str, total: int) -> None:
            if not validate_only:
                self._request("add_partitions", self._change(timeout_ms), name=name,
                              total=total)
                return
            current = len(self.describe_topic(name)["partitions"])
            if isinstance(total, bool) or not isinstance(total, int) or total <= current:
                raise InvalidPartitionsError(f"topic {name!r} has {current} partitions; the "
                                             f"new count must be larger, got {total!r}")
        _first_error([lambda name=name, new=new: grow(name, new.total_count)
                      for name, new in topic_partitions.items()])

    def describe_configs(self, config_resources: Iterable[ConfigResource],
                         include_synonyms: bool = False) -> list[dict[str, ConfigEntry]]:
        """Per resource, in order: ``{name: ConfigEntry}`` of its settings (only those
        its ``configs`` names, when it names any), each with its value and source.
        A BROKER resource is the broker this client reaches (its id, or any name
        for a single broker). ``include_synonyms`` is accepted and has no effect."""
        described = []
        for resource in config_resources:
            if resource.resource_type is ConfigResourceType.TOPIC:
                entries = self._request("describe_topic", name=resource.name)["config_sources"]
                read_only = False
            else:
                entries = self._broker_configs(resource.name)
                read_only = True          # the broker's settings are static: its file
            wanted = None if resource.configs is None else set(resource.configs)
            described.append({
                name: ConfigEntry(name, _kafka_text(entry["value"]),
                                  ConfigSource(entry["source"]),
                                  entry["source"] == ConfigSource.DEFAULT.value, read_only)
                for name, entry in entries.items() if wanted is None or name in wanted})
        return described

    def _broker_configs(self, name: str) -> dict:
        reply = self._request("describe_broker_config")
        broker_id = reply["broker_id"]
        if broker_id >= 0 and str(name) != str(broker_id):
            raise LocalProtocolError(f"this client reaches broker {broker_id} (through "
                                     f"{self.data_dir}), not broker {name!r}")
        return reply["configs"]

    def alter_configs(self, config_resources: Iterable[ConfigResource]) -> None:
        """Set each TOPIC resource's overrides to exactly its ``configs`` (the others
        go back to their defaults: Kafka's AlterConfigs); raises the first
        resource's error once all were tried.

        Raises
        ------
        InvalidConfigError
            An unknown setting or a bad value, or a BROKER resource (a broker's
            settings are static: change its file and restart it).
        """
        def alter(resource: ConfigResource) -> None:
            if resource.resource_type is not ConfigResourceType.TOPIC:
                raise InvalidConfigError(
                    f"broker {resource.name}'s settings are static (its TOML file and "
                    f"flags): change them there and restart the broker")
            configs = dict(resource.configs or {})
            current = self._request("describe_topic", name=resource.name)["config_sources"]
            stale = [name for name, entry in current.items()
                     if entry["source"] == ConfigSource.TOPIC.value and name not in configs]
            self._request("alter_topic_config", name=resource.name, set=configs, delete=stale)
        _first_error([lambda resource=resource: alter(resource)
                      for resource in config_resources])

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> list[GroupInformation]:
        """Per group, in order, its state, assignor and members with their
        partitions (state ``"Dead"`` for a group that does not exist)."""
        described = []
        for group_id in group_ids:
            try:
                group = self.describe_consumer_group(group_id)
            except GroupIdNotFoundError:
                described.append(GroupInformation(0, group_id, "Dead", "", "", []))
                continue
            members = [MemberInformation(member["member_id"], member["client_id"],
                                         member.get("client_host", ""),
                                         list(member["topics"]),
                                         [TopicPartition(*entry) for entry in member["assignment"]])
                       for member in group["members"]]
            described.append(GroupInformation(0, group_id, group["state"], "consumer",
                                              group["protocol"] or "", members))
        return described

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> list[tuple[str, Any]]:
        """Delete each group: ``[(group_id, None or its error)]`` (kafka-python
        answers per group, raising nothing)."""
        results = []
        for group_id in group_ids:
            try:
                self.delete_consumer_group(group_id)
                results.append((group_id, None))
            except ShmlogError as error:
                results.append((group_id, error))
        return results

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


def _new_topic_fields(topic: "NewTopic") -> dict:
    """A :class:`NewTopic` as create_topic's fields (Kafka's -1s: the defaults)."""
    fields = {"name": topic.name,
              "partitions": limits.NUM_PARTITIONS_DEFAULT if topic.num_partitions == -1
              else topic.num_partitions,
              "config": dict(topic.topic_configs)}
    if topic.replication_factor != -1:
        fields["replication_factor"] = topic.replication_factor
    return fields


def _chunks(topics: list[dict], size_max: int, partitions_max: int) -> Iterator[list[dict]]:
    """``topics`` (create_topic's fields) in order, in runs whose JSON takes at most
    ``size_max`` bytes and whose partitions number at most ``partitions_max`` (a topic
    over either alone: the broker judges it, a frame too large is refused naming
    the limit)."""
    chunk: list[dict] = []
    size = partitions = 0
    for topic in topics:
        length = len(json.dumps(topic)) + 2
        count = topic["partitions"] if isinstance(topic["partitions"], int) else 1
        if chunk and (size + length > size_max or partitions + count > partitions_max):
            yield chunk
            chunk, size, partitions = [], 0, 0
        chunk.append(topic)
        size += length
        partitions += count
    if chunk:
        yield chunk


def _first_error(actions: list) -> None:
    """Run every action; then raise the first one's error, if any did."""
    errors = []
    for action in actions:
        try:
            action()
        except ShmlogError as error:
            errors.append(error)
    if errors:
        raise errors[0]


def _validate_new_topic(name: str, partitions: int, configs: Mapping[str, Any],
                        existing: set[str]) -> None:
    """What the broker checks before creating a topic (``validate_only``)."""
    validate_topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or \
            not 1 <= partitions <= limits.PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(f"topic {name!r}: num_partitions must be in [1, "
                                     f"{limits.PARTITIONS_PER_TOPIC_MAX}], got {partitions!r}")
    TopicConfig.from_overrides(configs)
    if name in existing:
        raise TopicExistsError(f"topic {name!r} already exists")
