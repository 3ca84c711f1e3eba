"""Topic configuration: Kafka's names, defaults and validation.

A topic stores only its overrides (in ``topic.json``); everything else comes from
the defaults below, which are Kafka's own. Values may be given as Python values or
as the strings a command line or config file supplies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from ..common import limits
from ..common.errors import InvalidConfigError
from ..common.structs import ConfigSource

LONG_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    name: str                               # Kafka's name, e.g. "segment.bytes"
    kind: type                              # int, float or str
    default: Any
    check: Callable[[Any], str | None]      # returns a complaint, or None when valid
    doc: str


def _accepting(text: str):
    """Give a check the description of what it accepts (:func:`accepted_values`)."""
    def named(check):
        check.accepted = text
        return check
    return named


def _bound(number) -> str:
    return "2^63-1" if number == LONG_MAX else str(number)


def _at_least(minimum: int, maximum: int = LONG_MAX):
    @_accepting(f"[{_bound(minimum)}, {_bound(maximum)}]")
    def check(value):
        if not minimum <= value <= maximum:
            return f"must be in [{minimum}, {maximum}]"
        return None
    return check


def _one_of(*choices: str):
    @_accepting(", ".join(choices))
    def check(value):
        if value not in choices:
            return f"must be one of {', '.join(choices)}"
        return None
    return check


def _between(minimum: float, maximum: float):
    @_accepting(f"[{minimum}, {maximum}]")
    def check(value):
        if not minimum <= value <= maximum:
            return f"must be in [{minimum}, {maximum}]"
        return None
    return check


CLEANUP_POLICIES = ("delete", "compact")


@_accepting("delete, compact, compact,delete")
def _cleanup_policy(value):
    """Kafka's list form: 'delete', 'compact', or both, comma-separated."""
    policies = [policy.strip() for policy in value.split(",")]
    if not policies or any(policy not in CLEANUP_POLICIES for policy in policies) or \
            len(set(policies)) != len(policies):
        return "must be 'delete', 'compact' or 'compact,delete'"
    return None


# A throttled-replicas value that throttles every replica of the topic (Kafka's "*").
ALL_REPLICAS = "*"


def parse_throttled_replicas(value: str) -> frozenset[tuple[int, int]] | str:
    """A throttled-replicas config value: ``ALL_REPLICAS``, or the set of
    (partition, broker) pairs it lists (empty for "").

    Raises
    ------
    InvalidConfigError
        Not ``*`` nor a comma-separated list of ``partition:broker``.
    """
    text = value.strip()
    if text == ALL_REPLICAS:
        return ALL_REPLICAS
    pairs = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        partition, colon, broker = item.partition(":")
        if not colon or not partition.strip().isdigit() or not broker.strip().isdigit():
            raise InvalidConfigError(f"throttled replicas {value!r}: {item!r} is not "
                                     f"partition:broker (or give {ALL_REPLICAS!r})")
        pairs.add((int(partition), int(broker)))
    return frozenset(pairs)


@_accepting("*, or partition:broker pairs, comma-separated")
def _throttled_replicas(value):
    """Kafka's ThrottledReplicaListValidator: '*' or partition:broker pairs."""
    try:
        parse_throttled_replicas(value)
    except InvalidConfigError as error:
        return str(error)
    return None


_KEYS = [
    ConfigKey("segment.bytes", int, 1 << 30,
              _at_least(limits.SEGMENT_SIZE_MIN, limits.SEGMENT_SIZE_MAX),
              "roll a new segment when the active one would exceed this size"),
    ConfigKey("segment.ms", int, 7 * 24 * 3600 * 1000, _at_least(1),
              "roll a new segment when its first batch is older than this"),
    ConfigKey("segment.index.bytes", int, 10 << 20,
              _at_least(limits.INDEX_SIZE_MIN, limits.SEGMENT_SIZE_MAX),
              "size of each sparse index; a full index rolls the segment"),
    ConfigKey("index.interval.bytes", int, 4096, _at_least(0, limits.SEGMENT_SIZE_MAX),
              "bytes of log between two index entries"),
    ConfigKey("retention.ms", int, 7 * 24 * 3600 * 1000, _at_least(-1),
              "delete segments whose newest record is older than this; -1: never"),
    ConfigKey("retention.bytes", int, -1, _at_least(-1),
              "delete the oldest segments while the partition is larger; -1: no limit"),
    ConfigKey("max.message.bytes", int, 1048588,
              _at_least(limits.BATCH_SIZE_MIN, limits.BATCH_SIZE_MAX),
              "largest record batch the log accepts"),
    ConfigKey("flush.messages", int, LONG_MAX, _at_least(1),
              "fsync after this many messages; default leaves it to the page cache"),
    ConfigKey("flush.ms", int, LONG_MAX, _at_least(0),
              "fsync when the last flush is older than this; default: page cache"),
    ConfigKey("compression.type", str, "producer",
              _one_of("producer", "uncompressed", "zstd"),
              "codec of stored batches; 'producer' keeps what the producer sent"),
    ConfigKey("message.timestamp.type", str, "CreateTime",
              _one_of("CreateTime", "LogAppendTime"),
              "keep the producer's timestamps, or stamp batches with the append time"),
    ConfigKey("cleanup.policy", str, "delete", _cleanup_policy,
              "what happens to old segments: 'delete' (retention), 'compact' (keep the "
              "latest record per key), or both ('compact,delete')"),
    ConfigKey("min.compaction.lag.ms", int, 0, _at_least(0),
              "a record stays uncompacted at least this long after its timestamp"),
    ConfigKey("max.compaction.lag.ms", int, LONG_MAX, _at_least(1),
              "a segment older than this is cleaned whatever its dirty ratio"),
    ConfigKey("delete.retention.ms", int, 24 * 3600 * 1000, _at_least(0),
              "how long a tombstone (null value) is kept in a compacted topic"),
    ConfigKey("min.cleanable.dirty.ratio", float, 0.5, _between(0.0, 1.0),
              "clean a compacted partition once this share of its closed bytes is dirty"),
    ConfigKey("min.insync.replicas", int, 1, _at_least(1),
              "in a cluster: acks=all batches are refused while fewer replicas are in sync "
              "(the broker's min.insync.replicas when not set)"),
    ConfigKey("unclean.leader.election.enable", str, "false", _one_of("true", "false"),
              "in a cluster: elect a replica that is not in sync when no in-sync one is "
              "alive (losing what it lacks)"),
    ConfigKey("leader.replication.throttled.replicas", str, "", _throttled_replicas,
              "in a cluster: partition:broker pairs (or '*') whose leader sends at most the "
              "broker's leader.replication.throttled.rate to replicas out of sync"),
    ConfigKey("follower.replication.throttled.replicas", str, "", _throttled_replicas,
              "in a cluster: partition:broker pairs (or '*') whose follower fetches at most "
              "the broker's follower.replication.throttled.rate while out of sync"),
]
KEYS: dict[str, ConfigKey] = {key.name: key for key in _KEYS}


def accepted_values(key: ConfigKey) -> str:
    """What ``key``'s check accepts, in words (``[1, 2^63-1]``, ``delete, compact``)."""
    return key.check.accepted


def _attribute(name: str) -> str:
    return name.replace(".", "_")


def _coerce(key: ConfigKey, value: Any) -> Any:
    if key.kind is int:
        if isinstance(value, bool):
            raise InvalidConfigError(f"{key.name}: expected an integer, got {value!r}")
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise InvalidConfigError(
                    f"{key.name}: expected an integer, got {value!r}") from None
        if not isinstance(value, int):
            raise InvalidConfigError(f"{key.name}: expected an integer, got {value!r}")
        return value
    if key.kind is float:
        if isinstance(value, bool):
            raise InvalidConfigError(f"{key.name}: expected a number, got {value!r}")
        try:
            return float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise InvalidConfigError(f"{key.name}: expected a number, got {value!r}") from None
    if not isinstance(value, str):
        raise InvalidConfigError(f"{key.name}: expected a string, got {value!r}")
    return value.strip()


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """The effective configuration of a topic, with Kafka's names as attributes
    (``segment.bytes`` is ``segment_bytes``)."""

    segment_bytes: int = KEYS["segment.bytes"].default
    segment_ms: int = KEYS["segment.ms"].default
    segment_index_bytes: int = KEYS["segment.index.bytes"].default
    index_interval_bytes: int = KEYS["index.interval.bytes"].default
    retention_ms: int = KEYS["retention.ms"].default
    retention_bytes: int = KEYS["retention.bytes"].default
    max_message_bytes: int = KEYS["max.message.bytes"].default
    flush_messages: int = KEYS["flush.messages"].default
    flush_ms: int = KEYS["flush.ms"].default
    compression_type: str = KEYS["compression.type"].default
    message_timestamp_type: str = KEYS["message.timestamp.type"].default
    cleanup_policy: str = KEYS["cleanup.policy"].default
    min_compaction_lag_ms: int = KEYS["min.compaction.lag.ms"].default
    max_compaction_lag_ms: int = KEYS["max.compaction.lag.ms"].default
    delete_retention_ms: int = KEYS["delete.retention.ms"].default
    min_cleanable_dirty_ratio: float = KEYS["min.cleanable.dirty.ratio"].default
    min_insync_replicas: int = KEYS["min.insync.replicas"].default
    unclean_leader_election_enable: str = KEYS["unclean.leader.election.enable"].default
    leader_replication_throttled_replicas: str = \
        KEYS["leader.replication.throttled.replicas"].default
    follower_replication_throttled_replicas: str = \
        KEYS["follower.replication.throttled.replicas"].default

    def __post_init__(self):
        for key in _KEYS:
            value = getattr(self, _attribute(key.name))
            complaint = key.check(value)
            if complaint:
                raise InvalidConfigError(f"{key.name}={value!r}: {complaint}")

    @property
    def compact(self) -> bool:
        return "compact" in self._policies()

    @property
    def delete(self) -> bool:
        """Do retention.ms and retention.bytes delete old segments?"""
        return "delete" in self._policies()

    def _policies(self) -> list[str]:
        return [policy.strip() for policy in self.cleanup_policy.split(",")]

    @property
    def batch_size_max(self) -> int:
        """The largest batch the log accepts: max.message.bytes, and a batch must also
        fit in one segment (segments are mapped at segment.bytes)."""
        return min(self.max_message_bytes, self.segment_bytes)

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None = None) -> "TopicConfig":
        """Defaults with ``overrides`` (Kafka names, e.g. ``{"segment.bytes": 4096}``)."""
        values = {}
        for name, value in (overrides or {}).items():
            key = KEYS.get(name)
            if key is None:
                raise InvalidConfigError(
                    f"unknown topic config {name!r}; known: {', '.join(sorted(KEYS))}")
            values[_attribute(name)] = _coerce(key, value)
        return cls(**values)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "TopicConfig":
        """A copy with ``overrides`` applied on top of this configuration."""
        merged = {**self.overrides(), **overrides}
        return TopicConfig.from_overrides(merged)

    def overrides(self) -> dict[str, Any]:
        """The settings that differ from Kafka's defaults, by Kafka name."""
        return {key.name: getattr(self, _attribute(key.name)) for key in _KEYS
                if getattr(self, _attribute(key.name)) != key.default}

    def as_dict(self) -> dict[str, Any]:
        """Every setting, by Kafka name."""
        return {key.name: getattr(self, _attribute(key.name)) for key in _KEYS}


def config_sources(config: TopicConfig, broker_defaults: Mapping[str, Any] | None = None,
                   overridden: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every setting of a topic as ``{name: {"value": ..., "source": ...}}``: the
    topic's overrides first, then what the broker sets for topics without one
    (``broker_defaults``: in a cluster, ``min.insync.replicas``), then Kafka's
    defaults (Kafka's ``DescribeConfigs`` resolution order). ``overridden`` names
    the topic's overrides where they are kept as given (a cluster's config znode);
    by default they are the values that differ from the defaults (a topic.json
    stores only those), so there an override set to the default value reads as the
    default, as the topic behaves."""
    overrides = config.overrides() if overridden is None else set(overridden)
    entries = {}
    for name, value in config.as_dict().items():
        if name in overrides:
            entries[name] = {"value": value, "source": ConfigSource.TOPIC.value}
        elif broker_defaults and name in broker_defaults:
            entries[name] = {"value": broker_defaults[name], "source": ConfigSource.BROKER.value}
        else:
            entries[name] = {"value": value, "source": ConfigSource.DEFAULT.value}
    return entries
