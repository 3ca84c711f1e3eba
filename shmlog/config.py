"""Topic configuration: Kafka's names, defaults and validation.

A topic stores only its overrides (in ``topic.json``); everything else comes from
the defaults below, which are Kafka's own. Values may be given as Python values or
as the strings a command line or config file supplies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from . import limits
from .errors import InvalidConfigError

LONG_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    name: str                               # Kafka's name, e.g. "segment.bytes"
    kind: type                              # int or str
    default: Any
    check: Callable[[Any], str | None]      # returns a complaint, or None when valid
    doc: str


def _at_least(minimum: int, maximum: int = LONG_MAX):
    def check(value):
        if not minimum <= value <= maximum:
            return f"must be in [{minimum}, {maximum}]"
        return None
    return check


def _one_of(*choices: str):
    def check(value):
        if value not in choices:
            return f"must be one of {', '.join(choices)}"
        return None
    return check


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
    ConfigKey("max.message.bytes", int, 1048588, _at_least(0, limits.BATCH_SIZE_MAX),
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
    ConfigKey("cleanup.policy", str, "delete", _one_of("delete"),
              "what happens to old segments: 'delete' (compaction is not built yet)"),
]
KEYS: dict[str, ConfigKey] = {key.name: key for key in _KEYS}


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
                raise InvalidConfigError(f"{key.name}: expected an integer, got {value!r}") from None
        if not isinstance(value, int):
            raise InvalidConfigError(f"{key.name}: expected an integer, got {value!r}")
        return value
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

    def __post_init__(self):
        for key in _KEYS:
            value = getattr(self, _attribute(key.name))
            complaint = key.check(value)
            if complaint:
                raise InvalidConfigError(f"{key.name}={value!r}: {complaint}")

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
