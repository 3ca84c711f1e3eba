"""The options of a shmlog read or write, Kafka's names where they apply, read in
any case (Spark hands them over lower-cased), and checked once on the driver.

Rules
-----
* Exactly one of ``subscribe``, ``subscribePattern`` and ``assign`` names what to
  read; ``bootstrap`` is the broker's data directory (default: the default data
  directory).
* A bad option is a :class:`~shmlog.common.errors.LocalProtocolError` naming the option
  and the value given, raised while the query is planned, not in a task.
* Starting and ending offsets are Kafka's: ``earliest``, ``latest``, or JSON of
  ``{"topic": {"partition": offset}}`` where ``-2`` is earliest and ``-1`` latest;
  or a timestamp, resolved to the first offset at or after it.
* ``kafka.isolation.level`` (Spark's Kafka connector's name; ``isolationLevel`` is
  taken too): ``read_uncommitted`` (the default) reads below the high watermark,
  ``read_committed`` below the last stable offset, leaving aborted transactions'
  records out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..client.consumer import Consumer, TopicPartition
from ..common import limits
from ..common.errors import LocalProtocolError
from ..common.paths import default_data_dir
from ..protocol.control_client import request

__all__ = ["ReadOptions", "option", "flag", "number", "isolation_level", "EARLIEST", "LATEST",
           "MAX_RECORDS_PER_PARTITION_DEFAULT", "READ_COMMITTED", "READ_UNCOMMITTED"]

EARLIEST, LATEST = -2, -1            # Kafka's markers in per-partition offset JSON
# The package's public name for the limit (tools and tests read it here).
MAX_RECORDS_PER_PARTITION_DEFAULT = limits.SPARK_MAX_RECORDS_PER_PARTITION_DEFAULT


def option(options, name: str, default=None):
    """An option by its name in any case (Spark hands them over lower-cased)."""
    return options.get(name.lower(), default)


def flag(options, name: str, default: bool) -> bool:
    """A true/false option (any case), else ``default``; anything else is refused
    (:class:`~shmlog.common.errors.LocalProtocolError`)."""
    value = str(option(options, name, default)).strip().lower()
    if value not in ("true", "false"):
        raise LocalProtocolError(f"option {name} must be true or false, got {value!r}")
    return value == "true"


READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
# The option's names: Spark's Kafka connector's (what a Kafka user writes), and ours.
ISOLATION_LEVEL_OPTIONS = ("kafka.isolation.level", "isolationLevel")


def isolation_level(options) -> str:
    """``kafka.isolation.level`` (or ``isolationLevel``): ``read_uncommitted`` (the
    default) or ``read_committed``; anything else is refused
    (:class:`~shmlog.common.errors.LocalProtocolError`)."""
    given = [option(options, name) for name in ISOLATION_LEVEL_OPTIONS
             if option(options, name) is not None]
    value = str(given[0] if given else READ_UNCOMMITTED).strip().lower()
    if value not in (READ_UNCOMMITTED, READ_COMMITTED) or \
            any(str(other).strip().lower() != value for other in given):
        raise LocalProtocolError(f"option kafka.isolation.level must be read_uncommitted or "
                                 f"read_committed, got {' and '.join(map(repr, given))}")
    return value


def number(options, name: str, default: int | None, minimum: int = 1) -> int | None:
    """An integer option of at least ``minimum``, else ``default``; anything else is
    refused (:class:`~shmlog.common.errors.LocalProtocolError`)."""
    if option(options, name) is None:
        return default
    try:
        value = int(option(options, name))
    except ValueError:
        raise LocalProtocolError(f"option {name} must be an integer, got "
                                 f"{option(options, name)!r}") from None
    if value < minimum:
        raise LocalProtocolError(f"option {name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class ReadOptions:
    """The options of a read, checked once on the driver (and pickled to tasks)."""
    bootstrap: str
    include_headers: bool
    include_read_locality: bool
    fail_on_data_loss: bool
    min_partitions: int | None
    max_records_per_partition: int
    max_offsets_per_trigger: int | None
    raw: dict
    isolation_level: str = READ_UNCOMMITTED

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED

    @classmethod
    def parse(cls, options) -> "ReadOptions":
        raw = {key.lower(): value for key, value in options.items()}
        strategies = [name for name in ("subscribe", "subscribePattern", "assign")
                      if option(raw, name)]
        if len(strategies) != 1:
            raise LocalProtocolError("give exactly one of the options subscribe, "
                                     "subscribePattern and assign")
        return cls(bootstrap=option(raw, "bootstrap") or default_data_dir(),
                   include_headers=flag(raw, "includeHeaders", False),
                   include_read_locality=flag(raw, "includeReadLocality", False),
                   fail_on_data_loss=flag(raw, "failOnDataLoss", True),
                   min_partitions=number(raw, "minPartitions", None),
                   max_records_per_partition=number(raw, "maxRecordsPerPartition",
                                                     limits.SPARK_MAX_RECORDS_PER_PARTITION_DEFAULT),
                   max_offsets_per_trigger=number(raw, "maxOffsetsPerTrigger", None),
                   raw=raw, isolation_level=isolation_level(raw))

    def consumer(self, bootstrap: str | None = None, **settings) -> Consumer:
        """A consumer of the broker at ``bootstrap`` (default: the option's) at the
        read's isolation level: its end offsets are the last stable offsets in
        read_committed, and it leaves aborted transactions out."""
        return Consumer(bootstrap=bootstrap or self.bootstrap,
                        isolation_level=self.isolation_level, **settings)

    def partitions(self) -> list[TopicPartition]:
        """The topic partitions the options name, as the broker has them now."""
        topics = {entry["name"]: len(entry["partitions"])
                  for entry in request(self.bootstrap, "metadata")["topics"]}
        if option(self.raw, "assign"):
            try:
                assigned = json.loads(option(self.raw, "assign"))
                wanted = [TopicPartition(str(topic), int(partition))
                          for topic, numbers in assigned.items() for partition in numbers]
            except (ValueError, TypeError, AttributeError):
                raise LocalProtocolError(f"option assign must be JSON like "
                                         f"{{\"topic\": [0, 1]}}, got "
                                         f"{option(self.raw, 'assign')!r}") from None
            for topic, partition in wanted:
                if not 0 <= partition < topics.get(topic, 0):
                    raise LocalProtocolError(f"assign names {topic}-{partition}, which the "
                                             f"broker at {self.bootstrap} does not have")
            return wanted
        if option(self.raw, "subscribe"):
            names = [name.strip() for name in option(self.raw, "subscribe").split(",")
                     if name.strip()]
            missing = [name for name in names if name not in topics]
            if missing:
                raise LocalProtocolError(f"unknown topics {missing} at {self.bootstrap}")
        else:
            pattern = re.compile(option(self.raw, "subscribePattern"))
            names = sorted(name for name in topics if pattern.fullmatch(name))
        return [TopicPartition(name, partition) for name in names
                for partition in range(topics[name])]

    def resolve(self, consumer: Consumer, partitions: list[TopicPartition], which: str,
                default: str) -> dict[TopicPartition, int]:
        """``startingOffsets``/``endingOffsets`` (or the timestamp options) as an
        offset per partition."""
        earliest = consumer.beginning_offsets(partitions)
        latest = consumer.end_offsets(partitions)
        timestamp = option(self.raw, f"{which}Timestamp")
        if timestamp is not None:
            found = consumer.offsets_for_times({p: int(timestamp) for p in partitions})
            strategy = option(self.raw, "startingOffsetsByTimestampStrategy", "error").lower()
            offsets = {}
            for partition, result in found.items():
                if result is None and strategy == "error" and which == "starting":
                    raise LocalProtocolError(
                        f"no record of {partition.topic}-{partition.partition} has a "
                        f"timestamp >= {timestamp}; set startingOffsetsByTimestampStrategy "
                        f"to latest to start at the end")
                offsets[partition] = latest[partition] if result is None else result.offset
            return offsets
        spec = option(self.raw, f"{which}Offsets", default)
        if spec in ("earliest", "latest"):
            return dict(earliest if spec == "earliest" else latest)
        try:
            given = {TopicPartition(topic, int(number)): int(offset)
                     for topic, numbers in json.loads(spec).items()
                     for number, offset in numbers.items()}
        except (ValueError, TypeError, AttributeError):
            raise LocalProtocolError(f"option {which}Offsets must be earliest, latest or "
                                     f"JSON like {{\"topic\": {{\"0\": 23}}}}, got "
                                     f"{spec!r}") from None
        offsets = {}
        for partition in partitions:
            offset = given.get(partition, EARLIEST if which == "starting" else LATEST)
            offsets[partition] = (earliest[partition] if offset == EARLIEST
                                  else latest[partition] if offset == LATEST else offset)
        return offsets
