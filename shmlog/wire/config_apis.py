"""DescribeConfigs (versions 1-4), AlterConfigs (0-2) and IncrementalAlterConfigs
(0-1): a topic's settings and the broker's, read and changed over Kafka's wire as
``shmlog topics describe`` / ``alter`` read and change them.

Rules
-----
* **One path.** Every change goes through the topic service's ``alter_topic_config``
  (its checks: unknown names and bad values are INVALID_CONFIG, a change that could
  drop an internal topic's records is INVALID_CONFIG too); every read through its
  ``describe_topic`` (``config_sources``) and the broker's ``describe_broker_config``.
  ``validate_only`` runs the same checks (``_validate_topic_change``) and changes
  nothing. A cluster member's topic service answers a change once ZooKeeper holds
  it: the response waits for every resource's answer (``tickets.Gather``).
* **Kafka's names and sources.** Topic settings carry Kafka's names (``topic_config``);
  the broker's take Kafka's dotted form (``num_partitions`` is ``num.partitions``).
  A topic's override is DYNAMIC_TOPIC_CONFIG, a value the broker's file or flags set
  is STATIC_BROKER_CONFIG, anything else DEFAULT_CONFIG. A topic setting is writable
  (``read_only`` false); the broker's are static (read-only: change its file and
  restart it). None is sensitive: Kafka masks only PASSWORD settings, and shmlog has
  none (its CurveZMQ secret is a file's path, not the key).
* **Broker resources** name this broker's id (0 alone, the id Metadata gives; a
  cluster member's ``broker.id``) or ``""`` (Kafka's cluster-wide dynamic defaults:
  there are none). Another id, or a name that is not a number, is INVALID_REQUEST
  as Kafka says it. Altering a broker's settings is refused (INVALID_CONFIG, as
  ``Admin.alter_configs`` refuses it) unless the request changes nothing.
* **AlterConfigs replaces** a topic's overrides with exactly those given (the rest
  go back to their defaults); IncrementalAlterConfigs applies SET, DELETE, APPEND and
  SUBTRACT one by one, APPEND and SUBTRACT only to Kafka's LIST settings
  (``cleanup.policy``, the throttled-replica lists). A null value to set, a key
  named twice in one resource, or an unknown operation is INVALID_REQUEST.
* Other resource types (groups, loggers, client metrics) are INVALID_REQUEST: this
  broker keeps no settings for them.

Theory of operation
-------------------
Each resource is answered on its own: its error (``error_codes.for_error`` of the
typed error the topic service raised) with its message, the others unaffected.
Synonyms (v1+, ``include_synonyms``) list the value in force, then Kafka's default
under it when something overrides it; documentation (v3+) is the setting's own
description; the type is Kafka's ConfigDef type of the setting.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ..broker.topic_service import refuse_internal_config
from ..common.documented import doc_of
from ..common.errors import InvalidConfigError, LocalProtocolError, ShmlogError
from ..common.structs import ConfigSource
from ..common.topic_names import validate_topic_name
from ..config.broker import BrokerConfig
from ..config.cluster import ClusterConfig
from ..storage.topic_config import KEYS, TopicConfig
from . import codec
from .error_codes import NONE, for_error
from .tickets import Gather, ask_service

__all__ = ["ConfigApis", "topic_config_entries", "source_id", "config_text",
           "DESCRIBE_CONFIGS_KEY", "ALTER_CONFIGS_KEY", "INCREMENTAL_ALTER_CONFIGS_KEY"]

DESCRIBE_CONFIGS_KEY = 32
ALTER_CONFIGS_KEY = 33
INCREMENTAL_ALTER_CONFIGS_KEY = 44

# Kafka's ConfigResource.Type ids.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4

# Kafka's DescribeConfigsResponse.ConfigSource ids of shmlog's sources.
_SOURCE_IDS = {ConfigSource.TOPIC.value: 1,          # DYNAMIC_TOPIC_CONFIG
               ConfigSource.BROKER.value: 4,         # STATIC_BROKER_CONFIG
               ConfigSource.DEFAULT.value: 5}        # DEFAULT_CONFIG

# Kafka's ConfigDef.Type ids (DescribeConfigs v3+'s config_type).
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST = 1, 2, 3, 5, 6, 7
# The type Kafka's LogConfig gives each topic setting.
_TOPIC_TYPES = {
    "segment.bytes": _INT, "segment.ms": _LONG, "segment.index.bytes": _INT,
    "index.interval.bytes": _INT, "retention.ms": _LONG, "retention.bytes": _LONG,
    "max.message.bytes": _INT, "flush.messages": _LONG, "flush.ms": _LONG,
    "compression.type": _STRING, "message.timestamp.type": _STRING,
    "cleanup.policy": _LIST, "min.compaction.lag.ms": _LONG,
    "max.compaction.lag.ms": _LONG, "delete.retention.ms": _LONG,
    "min.cleanable.dirty.ratio": _DOUBLE, "min.insync.replicas": _INT,
    "unclean.leader.election.enable": _BOOLEAN,
    "leader.replication.throttled.replicas": _LIST,
    "follower.replication.throttled.replicas": _LIST,
}

_LISTS = tuple(name for name, kind in _TOPIC_TYPES.items() if kind == _LIST)

# IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType).
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3


def source_id(source: str) -> int:
    """Kafka's ConfigSource id of one of shmlog's sources (``structs.ConfigSource``)."""
    return _SOURCE_IDS[source]


def config_text(value: Any) -> str | None:
    """A setting's value as Kafka writes it (booleans lowercase, numbers in decimal)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def topic_config_entries(sources: dict) -> list[tuple[str, str | None, int]]:
    """(name, value text, Kafka source id) of each setting of ``describe_topic``'s
    ``config_sources``."""
    return [(name, config_text(entry["value"]), source_id(entry["source"]))
            for name, entry in sources.items()]


def _kafka_type(value: Any) -> int:
    if isinstance(value, bool):
        return _BOOLEAN
    if isinstance(value, int):
        return _LONG
    if isinstance(value, float):
        return _DOUBLE
    return _STRING


def _broker_docs() -> dict[str, str]:
    """{Kafka-style name: description} of every broker and cluster setting."""
    return {field.name.replace("_", "."): doc_of(field)
            for table in (BrokerConfig, ClusterConfig) for field in dataclasses.fields(table)}


@dataclasses.dataclass(frozen=True)
class _Setting:
    """One setting as DescribeConfigs reports it."""
    name: str
    value: Any
    source: str                   # structs.ConfigSource's value
    read_only: bool
    kind: int                     # Kafka's ConfigDef type id
    doc: str
    default: Any                  # Kafka's default, for the synonyms


class ConfigApis:
    """The config APIs over broker ``core`` (a BrokerCore), whose id on the wire is
    ``broker_id``; ``respond`` sends a response that waited (``KafkaApis.respond``)."""

    def __init__(self, core, broker_id: int, respond) -> None:
        self.core = core
        self.broker_id = broker_id
        self._respond = respond
        self._broker_docs = _broker_docs()

    def apis(self) -> dict:
        return {DESCRIBE_CONFIGS_KEY: (1, 4, self.describe_configs),
                ALTER_CONFIGS_KEY: (0, 2, self.alter_configs),
                INCREMENTAL_ALTER_CONFIGS_KEY: (0, 1, self.incremental_alter_configs)}

    # -- DescribeConfigs ---------------------------------------------------------------
    def describe_configs(self, request, header, body):
        cls = codec.response_class(DESCRIBE_CONFIGS_KEY)
        return cls(version=header.api_version, throttle_time_ms=0,
                   results=[self._described(cls, resource, body)
                            for resource in body.resources])

    def _described(self, cls, resource, body):
        result = cls.DescribeConfigsResult
        try:
            settings = self._settings(resource.resource_type, resource.resource_name)
        except ShmlogError as error:
            return result(error_code=for_error(error), error_message=str(error),
                          resource_type=resource.resource_type,
                          resource_name=resource.resource_name, configs=[])
        wanted = resource.configuration_keys
        if wanted is not None:
            wanted = set(wanted)
            settings = [setting for setting in settings if setting.name in wanted]
        return result(error_code=NONE, error_message=None, resource_type=resource.resource_type,
                      resource_name=resource.resource_name,
                      configs=[self._entry(result.DescribeConfigsResourceResult, setting, body)
                               for setting in settings])

    def _entry(self, cls, setting: _Setting, body):
        synonyms = []
        if body.include_synonyms:
            synonyms.append(cls.DescribeConfigsSynonym(
                name=setting.name, value=config_text(setting.value),
                source=source_id(setting.source)))
            if setting.source != ConfigSource.DEFAULT.value:
                synonyms.append(cls.DescribeConfigsSynonym(
                    name=setting.name, value=config_text(setting.default),
                    source=source_id(ConfigSource.DEFAULT.value)))
        return cls(name=setting.name, value=config_text(setting.value),
                   read_only=setting.read_only, config_source=source_id(setting.source),
                   is_default=setting.source == ConfigSource.DEFAULT.value, is_sensitive=False,
                   synonyms=synonyms, config_type=setting.kind,
                   documentation=setting.doc if body.include_documentation else None)

    def _settings(self, resource_type: int, name: str) -> list[_Setting]:
        """Every setting of a resource.

        Raises
        ------
        InvalidTopicError, UnknownTopicOrPartitionError
            A topic's name is not valid, or there is no such topic.
        LocalProtocolError
            A broker resource names another broker, or the type is not served.
        """
        if resource_type == TOPIC_RESOURCE:
            validate_topic_name(name)
            sources = self.core.topics.describe_topic(name)["config_sources"]
            return [_Setting(key, entry["value"], entry["source"], False,
                             _TOPIC_TYPES.get(key, _STRING), KEYS[key].doc, KEYS[key].default)
                    for key, entry in sources.items()]
        if resource_type == BROKER_RESOURCE:
            if not self._this_broker(name):
                return []                 # "": the cluster's dynamic defaults, none here
            configs = self.core.describe_broker_config()["configs"]
            return [_Setting(key.replace("_", "."), entry["value"], entry["source"], True,
                             _kafka_type(entry["value"]),
                             self._broker_docs.get(key.replace("_", "."), ""), None)
                    for key, entry in configs.items()]
        raise _unsupported_type(resource_type)

    def _this_broker(self, name: str) -> bool:
        """Whether a broker resource names this broker (False for ``""``, Kafka's
        cluster-wide defaults).

        Raises
        ------
        LocalProtocolError
            A name that is not a number, or another broker's id (Kafka's messages).
        """
        if name == "":
            return False
        try:
            broker_id = int(name)
        except ValueError:
            raise LocalProtocolError(f"Broker id must be an integer, but it is: {name}") from None
        if broker_id != self.broker_id:
            raise LocalProtocolError(f"Unexpected broker id, expected {self.broker_id} or empty "
                                     f"string, but received {name}")
        return True

    # -- AlterConfigs ------------------------------------------------------------------
    def alter_configs(self, request, header, body):
        return self._alter(request, header, body, ALTER_CONFIGS_KEY, self._replacement)

    def _replacement(self, name: str, configs: list) -> tuple[dict, list]:
        """AlterConfigs of one topic: its overrides become exactly ``configs``."""
        changes = {}
        for config in configs:
            if config.value is None:
                raise LocalProtocolError(f"Null value not supported for : {config.name}")
            changes[config.name] = config.value
        sources = self.core.topics.describe_topic(name)["config_sources"]
        stale = [key for key, entry in sources.items()
                 if entry["source"] == ConfigSource.TOPIC.value and key not in changes]
        return changes, stale

    # -- IncrementalAlterConfigs -------------------------------------------------------
    def incremental_alter_configs(self, request, header, body):
        return self._alter(request, header, body, INCREMENTAL_ALTER_CONFIGS_KEY,
                           self._operations)

    def _operations(self, name: str, configs: list) -> tuple[dict, list]:
        """IncrementalAlterConfigs of one topic: each operation on its setting."""
        duplicates = sorted(key for key, count in Counter(c.name for c in configs).items()
                            if count > 1)
        if duplicates:
            raise LocalProtocolError(f"Error due to duplicate config keys: {duplicates}")
        current = self.core.topics.describe_topic(name)["config"]
        changes, removed = {}, []
        for config in configs:
            operation, key, value = config.config_operation, config.name, config.value
            if operation == _DELETE:
                removed.append(key)
                continue
            if operation not in (_SET, _APPEND, _SUBTRACT):
                raise LocalProtocolError(f"Unknown config operation {operation} for {key}")
            if value is None:
                raise LocalProtocolError(f"Null value not supported for : {key}")
            if operation == _SET:
                changes[key] = value
                continue
            if _TOPIC_TYPES.get(key) != _LIST:
                verb = "append" if operation == _APPEND else "subtract"
                raise InvalidConfigError(f"Config value {verb} is not allowed for config key: "
                                         f"{key} (only list settings: {', '.join(_LISTS)})")
            changes[key] = _list_operation(operation, config_text(current[key]), value)
        return changes, removed

    # -- both alters -------------------------------------------------------------------
    def _alter(self, request, header, body, key: int, topic_changes):
        """An alter request, each resource answered on its own; ``topic_changes(name,
        configs)`` gives a topic's (settings to set, overrides to remove)."""
        cls = codec.response_class(key)
        resources = list(body.resources)

        def complete(results: dict):
            answers = []
            for index, resource in enumerate(resources):
                refused = results[index] if isinstance(results[index], ShmlogError) else None
                answers.append(cls.AlterConfigsResourceResponse(
                    error_code=for_error(refused) if refused else NONE,
                    error_message=str(refused) if refused else None,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name))
            return cls(version=header.api_version, throttle_time_ms=0, responses=answers)

        gather = Gather(len(resources), complete,
                        lambda response: self._respond(request, header, response))
        for index, resource in enumerate(resources):
            try:
                if resource.resource_type == TOPIC_RESOURCE:
                    validate_topic_name(resource.resource_name)
                    changes, removed = topic_changes(resource.resource_name, resource.configs)
                    if body.validate_only:
                        self._validate_topic_change(resource.resource_name, changes, removed)
                    else:
                        self._change_topic(gather, index, resource.resource_name, changes,
                                           removed)
                        continue
                elif resource.resource_type == BROKER_RESOURCE:
                    self._refuse_broker_change(resource.resource_name, resource.configs)
                else:
                    raise _unsupported_type(resource.resource_type)
            except ShmlogError as error:
                gather.put(index, error)
            else:
                gather.put(index, {})
        return gather.outcome()

    def _refuse_broker_change(self, name: str, configs: list) -> None:
        self._this_broker(name)
        if configs:
            raise InvalidConfigError(
                f"broker {self.broker_id}'s settings are static (its TOML file and flags): "
                f"change {', '.join(sorted({c.name for c in configs}))} there and restart "
                f"the broker")

    def _change_topic(self, gather: Gather, index: int, name: str, changes: dict,
                      removed: list) -> None:
        """Set ``changes`` and remove ``removed`` from topic ``name``'s overrides; the
        topic service's answer, now or later, goes into ``gather`` at ``index``."""
        try:
            result = ask_service(self.core, self.core.topics.alter_topic_config,
                                 lambda later: gather.put(index, later), name=name,
                                 set=changes, delete=removed)
        except ShmlogError as refused:
            gather.put(index, refused)
            return
        if result is not None:
            gather.put(index, result)

    def _validate_topic_change(self, name: str, changes: dict, removed: list) -> None:
        """Check that the topic service would take the change, changing nothing."""
        overrides = dict(self.core.topics.describe_topic(name)["overrides"])
        overrides.update(changes)
        for key in removed:
            if key not in overrides and key not in KEYS:
                raise InvalidConfigError(f"unknown topic config {key!r}")
            overrides.pop(key, None)
        refuse_internal_config(name, overrides, changes)
        TopicConfig.from_overrides(overrides)


def _list_operation(operation: int, current: str, value: str) -> str:
    """A LIST setting's value after APPEND or SUBTRACT of ``value``'s items (Kafka's
    comma-separated lists; an item already there is not appended twice)."""
    items = [item.strip() for item in current.split(",") if item.strip()]
    given = [item.strip() for item in value.split(",") if item.strip()]
    if operation == _APPEND:
        items += [item for item in given if item not in items]
    else:
        items = [item for item in items if item not in given]
    return ",".join(items)


def _unsupported_type(resource_type: int) -> LocalProtocolError:
    return LocalProtocolError(f"resource type {resource_type} is not served: this broker "
                              f"keeps settings for topics ({TOPIC_RESOURCE}) and brokers "
                              f"({BROKER_RESOURCE}) only")
