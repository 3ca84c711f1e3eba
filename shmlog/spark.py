"""Spark: read and write shmlog topics with ``format("shmlog")``, batch and streaming.

Usage::

    from shmlog import spark as shmlog_spark
    session = shmlog_spark.session("local[2]")          # or register(an existing session)
    df = session.read.format("shmlog").option("subscribe", "events").load()

Code written for Spark's Kafka source ports by changing the format name: the same
columns (``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType``, and ``headers`` with ``includeHeaders``) and the same options
where they apply (``subscribe``, ``subscribePattern``, ``assign``,
``startingOffsets``/``endingOffsets``, ``startingTimestamp``/``endingTimestamp``,
``startingOffsetsByTimestampStrategy``, ``maxOffsetsPerTrigger``,
``maxRecordsPerPartition``, ``minPartitions``, ``failOnDataLoss``,
``includeHeaders``), plus ``bootstrap``: the broker's data directory.

Theory of operation
-------------------
Planning (on the driver) asks the local broker for metadata and reads offsets from
its partition state table, then cuts every partition's offset range into Spark
partitions (one per log partition, more when a range is large or
``minPartitions`` asks). A task maps the partition's segments read-only through a
:class:`~shmlog.consumer.Consumer` of the broker on its own host, reads only below
the high watermark, and turns each fetched chunk into one Arrow record batch:
keys and values are gathered into Arrow's binary layout by a compiled kernel, the
other columns are numpy arrays handed to Arrow as they are.

Locality. The Python Data Source API cannot pin a task to a host, so a task reads
through the broker whose data directory is ``bootstrap`` *on the host the task
runs on*. Run the executors on the broker hosts (Spark standalone workers started
there, see ``tools/spark_cluster.py``). A task on a host without that broker, or
whose broker does not hold the partition, fails with a clear error naming its
host - it never reads anything else.

Offsets in streaming are ``{"topic": {"partition": next offset}}`` (Kafka's JSON,
partition numbers as strings); Spark checkpoints them, so a restarted query goes on
from where it stopped, without a gap or a duplicate. Records lost to retention
between two micro-batches fail the query when ``failOnDataLoss`` is true (the
default, as in Kafka) and are skipped otherwise.

Writing: ``df.write.format("shmlog").mode("append")`` (Spark refuses its default
save mode, ErrorIfExists, for every Python data source; append is what Kafka's
sink does anyway). Rows with ``value`` (binary or string) and optionally ``key``,
``topic`` (or the ``topic`` option, which wins), ``partition`` and ``headers``
become records: grouped by partition (Kafka's key partitioner where a row names
none) and sent as whole batches with ``acks=1``, flushed before a task reports
success. A retried task produces its rows again: the sink is at-least-once, as
Kafka's is.

For batch jobs, :func:`bulk_read` reads through a JVM data source instead (see
there), several times faster: every row of ``format("shmlog")`` crosses from a
Python worker to the JVM. Its Java sources ship in the package (``shmlog/jvm``);
:func:`session` compiles them once per PySpark version and caches the jar. Where
that cannot be done (no JDK, a compile error), :func:`session` still works with
``format("shmlog")``: it logs why once, and :func:`bulk_read` raises
:class:`~shmlog.errors.BulkReaderUnavailableError` with that reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamArrowWriter, DataSourceStreamReader,
                                    InputPartition, WriterCommitMessage)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from .control_client import request
from .paths import default_data_dir
from .consumer import Consumer, TopicPartition
from .errors import (BulkReaderUnavailableError, LocalProtocolError, OffsetOutOfRangeError,
                     ShmlogError)
from . import batch_layout as B
from .producer import Producer, partition_for_key
from .records import RecordColumns, gather_fields

log = logging.getLogger(__name__)

__all__ = ["ShmlogDataSource", "register", "session", "bulk_read", "SCHEMA",
           "SCHEMA_WITH_HEADERS"]

SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType())])
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))
SCHEMA_WITH_HEADERS = StructType(SCHEMA.fields + [StructField("headers", HEADERS_TYPE)])

_ARROW_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
_ARROW_FIELDS = [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                 ("partition", pa.int32()), ("offset", pa.int64()),
                 ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]
_ARROW_SCHEMA = pa.schema(_ARROW_FIELDS)
_ARROW_SCHEMA_WITH_HEADERS = pa.schema(_ARROW_FIELDS + [("headers", pa.list_(_ARROW_HEADER))])

EARLIEST, LATEST = -2, -1            # Kafka's markers in per-partition offset JSON
# How much one task fetches per Arrow batch, and how long it waits for records its
# plan says are there (they are below the high watermark, so at once).
FETCH_BYTES = 4 << 20
STALL_TIMEOUT_MS = 60_000
MAX_RECORDS_PER_PARTITION_DEFAULT = 4_000_000


# --- Arrow --------------------------------------------------------------------------

def _binary(data: np.ndarray, positions: np.ndarray, lengths: np.ndarray,
            arrow_type=pa.binary()) -> pa.Array:
    """One Arrow binary (or string) column from fields of ``data``: a compiled gather."""
    count = lengths.size
    offsets = np.empty(count + 1, np.int32)
    out = np.empty(int(np.maximum(lengths, 0).sum()), np.uint8)
    gather_fields(data, positions, lengths, offsets, out)
    nulls = lengths < 0
    null_count = int(nulls.sum())
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(arrow_type, count, [validity, pa.py_buffer(offsets),
                                                     pa.py_buffer(out)], null_count)


def _headers(columns: RecordColumns) -> pa.Array:
    counts = columns.header_counts.astype(np.int64)
    list_offsets = np.zeros(counts.size + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    # Entry indexes of every record's headers, in record order.
    entries = (np.repeat(columns.header_starts - list_offsets[:-1], counts)
               + np.arange(int(list_offsets[-1])))
    keys = _binary(columns.data, columns.header_key_positions[entries],
                   columns.header_key_lengths[entries], pa.string())
    values = _binary(columns.data, columns.header_value_positions[entries],
                     columns.header_value_lengths[entries])
    entries_array = pa.StructArray.from_arrays([keys, values], fields=list(_ARROW_HEADER))
    return pa.ListArray.from_arrays(pa.array(list_offsets), entries_array,
                                    type=pa.list_(_ARROW_HEADER))


def to_arrow(columns: RecordColumns, topic: str, partition: int,
             include_headers: bool = False) -> pa.RecordBatch:
    """Records as an Arrow batch with Spark's Kafka schema."""
    count = len(columns)
    name = topic.encode()
    arrays = [
        _binary(columns.data, columns.key_positions, columns.key_lengths),
        _binary(columns.data, columns.value_positions, columns.value_lengths),
        pa.Array.from_buffers(pa.string(), count, [
            None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(name)),
            pa.py_buffer(name * count)]),
        pa.array(np.full(count, partition, np.int32)),
        pa.array(columns.offsets),
        pa.array(columns.timestamps * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(columns.timestamp_types.astype(np.int32)),
    ]
    if include_headers:
        arrays.append(_headers(columns))
    return pa.RecordBatch.from_arrays(
        arrays, schema=_ARROW_SCHEMA_WITH_HEADERS if include_headers else _ARROW_SCHEMA)


# --- options ------------------------------------------------------------------------

def _option(options, name: str, default=None):
    """An option by its name in any case (Spark hands them over lower-cased)."""
    return options.get(name.lower(), default)


def _flag(options, name: str, default: bool) -> bool:
    value = str(_option(options, name, default)).strip().lower()
    if value not in ("true", "false"):
        raise LocalProtocolError(f"option {name} must be true or false, got {value!r}")
    return value == "true"


def _number(options, name: str, default: int | None, minimum: int = 1) -> int | None:
    if _option(options, name) is None:
        return default
    try:
        value = int(_option(options, name))
    except ValueError:
        raise LocalProtocolError(f"option {name} must be an integer, got "
                                 f"{_option(options, name)!r}") from None
    if value < minimum:
        raise LocalProtocolError(f"option {name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class _Options:
    """The options of a read, checked once on the driver (and pickled to tasks)."""
    bootstrap: str
    include_headers: bool
    fail_on_data_loss: bool
    min_partitions: int | None
    max_records_per_partition: int
    max_offsets_per_trigger: int | None
    raw: dict

    @classmethod
    def parse(cls, options) -> "_Options":
        raw = {key.lower(): value for key, value in options.items()}
        strategies = [name for name in ("subscribe", "subscribePattern", "assign")
                      if _option(raw, name)]
        if len(strategies) != 1:
            raise LocalProtocolError("give exactly one of the options subscribe, "
                                     "subscribePattern and assign")
        return cls(bootstrap=_option(raw, "bootstrap") or default_data_dir(),
                   include_headers=_flag(raw, "includeHeaders", False),
                   fail_on_data_loss=_flag(raw, "failOnDataLoss", True),
                   min_partitions=_number(raw, "minPartitions", None),
                   max_records_per_partition=_number(raw, "maxRecordsPerPartition",
                                                     MAX_RECORDS_PER_PARTITION_DEFAULT),
                   max_offsets_per_trigger=_number(raw, "maxOffsetsPerTrigger", None),
                   raw=raw)

    def partitions(self) -> list[TopicPartition]:
        """The topic partitions the options name, as the broker has them now."""
        topics = {entry["name"]: len(entry["partitions"])
                  for entry in request(self.bootstrap, "metadata")["topics"]}
        if _option(self.raw, "assign"):
            try:
                assigned = json.loads(_option(self.raw, "assign"))
                wanted = [TopicPartition(str(topic), int(partition))
                          for topic, numbers in assigned.items() for partition in numbers]
            except (ValueError, TypeError, AttributeError):
                raise LocalProtocolError(f"option assign must be JSON like "
                                         f"{{\"topic\": [0, 1]}}, got "
                                         f"{_option(self.raw, 'assign')!r}") from None
            for topic, partition in wanted:
                if not 0 <= partition < topics.get(topic, 0):
                    raise LocalProtocolError(f"assign names {topic}-{partition}, which the "
                                             f"broker at {self.bootstrap} does not have")
            return wanted
        if _option(self.raw, "subscribe"):
            names = [name.strip() for name in _option(self.raw, "subscribe").split(",")
                     if name.strip()]
            missing = [name for name in names if name not in topics]
            if missing:
                raise LocalProtocolError(f"unknown topics {missing} at {self.bootstrap}")
        else:
            pattern = re.compile(_option(self.raw, "subscribePattern"))
            names = sorted(name for name in topics if pattern.fullmatch(name))
        return [TopicPartition(name, partition) for name in names
                for partition in range(topics[name])]

    def resolve(self, consumer: Consumer, partitions: list[TopicPartition], which: str,
                default: str) -> dict[TopicPartition, int]:
        """``startingOffsets``/``endingOffsets`` (or the timestamp options) as an
        offset per partition."""
        earliest = consumer.beginning_offsets(partitions)
        latest = consumer.end_offsets(partitions)
        timestamp = _option(self.raw, f"{which}Timestamp")
        if timestamp is not None:
            found = consumer.offsets_for_times({p: int(timestamp) for p in partitions})
            strategy = _option(self.raw, "startingOffsetsByTimestampStrategy", "error").lower()
            offsets = {}
            for partition, result in found.items():
                if result is None and strategy == "error" and which == "starting":
                    raise LocalProtocolError(
                        f"no record of {partition.topic}-{partition.partition} has a "
                        f"timestamp >= {timestamp}; set startingOffsetsByTimestampStrategy "
                        f"to latest to start at the end")
                offsets[partition] = latest[partition] if result is None else result.offset
            return offsets
        spec = _option(self.raw, f"{which}Offsets", default)
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


# --- planning ------------------------------------------------------------------------

class OffsetRange(InputPartition):
    """One Spark partition: offsets [start, end) of one log partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def plan(starts: dict, ends: dict, options: _Options) -> list[OffsetRange]:
    """Cut every partition's range into Spark partitions: none for an empty range,
    pieces of at most ``maxRecordsPerPartition`` records, and more pieces (in
    proportion to size) until there are ``minPartitions``."""
    ranges = [(partition, starts[partition], ends[partition]) for partition in starts
              if ends[partition] > starts[partition]]
    total = sum(end - start for _, start, end in ranges)
    planned = []
    for (topic, number), start, end in ranges:
        pieces = -(-(end - start) // options.max_records_per_partition)
        if options.min_partitions:
            pieces = max(pieces, round(options.min_partitions * (end - start) / total))
        pieces = max(1, min(pieces, end - start))
        bounds = np.linspace(start, end, pieces + 1).round().astype(np.int64)
        planned += [OffsetRange(topic, number, int(low), int(high))
                    for low, high in zip(bounds[:-1], bounds[1:]) if high > low]
    return planned


def read_range(piece: OffsetRange, options: _Options):
    """Arrow batches of one offset range, read from this host's broker."""
    if not isinstance(piece, OffsetRange):
        return                          # Spark's stand-in partition for an empty plan
    try:
        consumer = Consumer(bootstrap=options.bootstrap, auto_offset_reset="none",
                            fetch_max_bytes=FETCH_BYTES)
    except ShmlogError as error:
        raise ShmlogError(f"Spark task on host {socket.gethostname()}: no shmlog broker at "
                          f"{options.bootstrap} here ({error}). Run the executors on the "
                          f"broker's host.") from None
    partition = TopicPartition(piece.topic, piece.partition)
    with consumer:
        consumer.assign([partition])
        consumer.seek(partition, piece.start)
        position = piece.start
        while position < piece.end:
            try:
                columns = consumer.poll_batch(timeout_ms=STALL_TIMEOUT_MS).get(partition)
            except OffsetOutOfRangeError:
                start = consumer.beginning_offsets([partition])[partition]
                if options.fail_on_data_loss or start <= position:
                    raise ShmlogError(
                        f"{piece.topic}-{piece.partition}: offsets {position}..{start - 1} "
                        f"were deleted (retention) before they were read; set "
                        f"failOnDataLoss to false to skip them") from None
                consumer.seek(partition, start)
                position = start
                continue
            if columns is None and consumer.position(partition) >= piece.end:
                break                   # the rest of the range was compacted away
            if columns is None:
                raise ShmlogError(f"{piece.topic}-{piece.partition}: nothing at offset "
                                  f"{position} within {STALL_TIMEOUT_MS} ms, below the "
                                  f"planned end {piece.end}")
            columns = columns.before_offset(piece.end)
            if len(columns):
                # Past the last record, and past any compacted gap after it.
                position = max(int(columns.offsets[-1]) + 1, consumer.position(partition))
                yield to_arrow(columns, piece.topic, piece.partition, options.include_headers)
            else:
                position = piece.end


# --- the data source ---------------------------------------------------------------------

class ShmlogDataSource(DataSource):
    """``format("shmlog")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "shmlog"

    def schema(self) -> StructType:
        return SCHEMA_WITH_HEADERS if _flag(self.options, "includeHeaders", False) else SCHEMA

    def reader(self, schema: StructType) -> "_BatchReader":
        return _BatchReader(_Options.parse(self.options))

    def streamReader(self, schema: StructType) -> "_StreamReader":
        return _StreamReader(_Options.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> "_Writer":
        return _Writer(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> "_StreamWriter":
        return _StreamWriter(self.options, schema)


def plan_batch(options: _Options) -> list[OffsetRange]:
    """The offset ranges of a batch read (from startingOffsets to endingOffsets)."""
    with Consumer(bootstrap=options.bootstrap) as consumer:
        partitions = options.partitions()
        starts = options.resolve(consumer, partitions, "starting", "earliest")
        ends = options.resolve(consumer, partitions, "ending", "latest")
        latest = consumer.end_offsets(partitions)
    for partition in partitions:
        if ends[partition] > latest[partition]:
            raise LocalProtocolError(f"endingOffsets for {partition.topic}-"
                                     f"{partition.partition} is {ends[partition]}, past "
                                     f"its high watermark {latest[partition]}")
    return plan(starts, ends, options)


class _BatchReader(DataSourceReader):
    def __init__(self, options: _Options):
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        return plan_batch(self.options)

    def read(self, partition: OffsetRange):
        return read_range(partition, self.options)


def _to_json(offsets: dict[TopicPartition, int]) -> dict:
    result: dict[str, dict[str, int]] = {}
    for (topic, number), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(number)] = int(offset)
    return result


def _from_json(offsets: dict) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, int(number)): int(offset)
            for topic, numbers in offsets.items() for number, offset in numbers.items()}


class _StreamReader(DataSourceStreamReader):
    def __init__(self, options: _Options):
        self.options = options

    def _consumer(self) -> Consumer:
        return Consumer(bootstrap=self.options.bootstrap)

    def initialOffset(self) -> dict:
        with self._consumer() as consumer:
            partitions = self.options.partitions()
            return _to_json(self.options.resolve(consumer, partitions, "starting", "latest"))

    def getDefaultReadLimit(self):
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        """The high watermarks, limited to ``max_rows`` more records in all (shared in
        proportion to each partition's backlog, as Kafka does). Partitions that
        appeared since ``start`` are read from their beginning."""
        begun = _from_json(start)
        with self._consumer() as consumer:
            partitions = self.options.partitions()
            latest = consumer.end_offsets(partitions)
            new = [p for p in partitions if p not in begun]
            begun.update(consumer.beginning_offsets(new) if new else {})
        end = {p: max(latest[p], begun[p]) for p in partitions}
        if isinstance(limit, ReadMaxRows):
            backlog = {p: end[p] - begun[p] for p in partitions}
            total = sum(backlog.values())
            if total > limit.max_rows:
                shares = {p: backlog[p] * limit.max_rows // total for p in partitions}
                left = limit.max_rows - sum(shares.values())
                for p in sorted(partitions, key=lambda p: -backlog[p])[:left]:
                    shares[p] += 1
                end = {p: begun[p] + min(shares[p], backlog[p]) for p in partitions}
        return _to_json(end)

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        starts, ends = _from_json(start), _from_json(end)
        if set(ends) - set(starts):             # a partition new in this micro-batch
            with self._consumer() as consumer:
                starts.update(consumer.beginning_offsets(set(ends) - set(starts)))
        return plan({p: starts[p] for p in ends}, ends, self.options)

    def read(self, partition: OffsetRange):
        return read_range(partition, self.options)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log keeps records by retention, not by readers."""


# --- writing -------------------------------------------------------------------------------

@dataclass
class WrittenRecords(WriterCommitMessage):
    records: int


def _column(batch: pa.RecordBatch, name: str, convert=None) -> list | None:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    values = batch.column(index).to_pylist()
    return values if convert is None else [convert(value) for value in values]


def _as_bytes(value):
    return value.encode() if isinstance(value, str) else value


def _as_headers(entries) -> list:
    return [(entry["key"], entry["value"]) for entry in entries or []]


def write_batches(batches, options, schema: StructType) -> WrittenRecords:
    """Produce every row of the Arrow batches, flush, and count them. Rows are
    grouped by topic and partition (their own, their key's as Kafka's partitioner
    gives it, or the sticky partitioner's for neither) and sent as whole batches
    of at most the topic's max.message.bytes."""
    if "value" not in schema.fieldNames():
        raise LocalProtocolError("writing to shmlog needs a value column (binary or string)")
    topic_option = _option(options, "topic")
    if topic_option is None and "topic" not in schema.fieldNames():
        raise LocalProtocolError("give the topic option or a topic column")
    written = 0
    with Producer(_option(options, "bootstrap") or default_data_dir(), acks=1) as producer:
        for batch in batches:
            count = batch.num_rows
            values = _column(batch, "value", _as_bytes)
            keys = _column(batch, "key", _as_bytes) or [None] * count
            topics = [topic_option] * count if topic_option else _column(batch, "topic")
            partitions = _column(batch, "partition") or [None] * count
            headers = _column(batch, "headers", _as_headers) or [[]] * count
            groups: dict[tuple, list[int]] = {}
            widths: dict[str, int] = {}               # partitions per topic
            for row in range(count):
                topic, partition, key = topics[row], partitions[row], keys[row]
                if topic is None:
                    raise LocalProtocolError("a row has a null topic and no topic option")
                if partition is None and key is not None:
                    if topic not in widths:
                        widths[topic] = len(producer.partitions_for(topic))
                    partition = partition_for_key(key, widths[topic])
                groups.setdefault((topic, partition), []).append(row)
            for (topic, partition), rows in groups.items():
                for chunk in _chunks(rows, values, keys, headers,
                                     producer.batch_bytes_max(topic) - B.HEADER_LENGTH):
                    producer.send_batch(topic, [values[row] for row in chunk],
                                        [keys[row] for row in chunk], partition=partition,
                                        headers=[headers[row] for row in chunk])
            written += count
        producer.flush()
    return WrittenRecords(written)


def _chunks(rows: list[int], values, keys, headers, limit: int):
    """``rows`` cut into runs whose records fit ``limit`` bytes (a record alone that
    does not fit goes on its own, for send_batch to refuse with a clear error)."""
    start, size = 0, 0
    for index, row in enumerate(rows):
        record = B.RECORD_HEADER_LENGTH + len(values[row] or b"") + len(keys[row] or b"")
        if headers[row]:
            record += sum(B.HEADER_ENTRY_LENGTH + len(name.encode()) + len(value or b"")
                          for name, value in headers[row])
        if size + record > limit and index > start:
            yield rows[start:index]
            start, size = index, 0
        size += record
    yield rows[start:]


class _Producing:
    """What the batch and the stream writer share: a task's rows become records."""

    def __init__(self, options, schema: StructType):
        self.options = {key.lower(): value for key, value in options.items()}
        self.schema = schema

    def write(self, iterator) -> WrittenRecords:
        return write_batches(iterator, self.options, self.schema)


class _Writer(_Producing, DataSourceArrowWriter):
    pass


class _StreamWriter(_Producing, DataSourceStreamArrowWriter):
    def commit(self, messages, batchId: int) -> None:
        """Each task flushed its records before reporting: nothing is left to do."""

    def abort(self, messages, batchId: int) -> None:
        """Records a failed task produced stay (at-least-once, as Kafka's sink)."""


# --- the host-pinned bulk reader ----------------------------------------------------------------

_BULK_SOURCE = "io.shmlog.spark.BulkSource"
# Session settings: the bulk reader's class when the session has it, else why not.
_BULK_SOURCE_SETTING = "spark.shmlog.bulkSource"
_BULK_UNAVAILABLE_SETTING = "spark.shmlog.bulkUnavailable"
_JVM_SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")


def bulk_jar() -> str:
    """The bulk reader's jar, compiled from the Java sources shipped in the package
    against this PySpark's jars on first use, and cached (by source hash) under
    ``$SHMLOG_CACHE_DIR`` (default ~/.cache/shmlog).

    Raises
    ------
    BulkReaderUnavailableError
        There is no ``javac`` (a JRE without a JDK), the sources are missing, or they
        do not compile against this PySpark; the message says which.
    """
    javac = (os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
             if os.environ.get("JAVA_HOME") else shutil.which("javac"))
    if javac is None or not os.path.exists(javac):
        raise BulkReaderUnavailableError(
            f"no javac at {javac}" if javac else "no javac on PATH (a JRE without a JDK)")
    sources = sorted(os.path.join(root, name) for root, _, names in os.walk(_JVM_SOURCES)
                     for name in names if name.endswith(".java"))
    if not sources:
        raise BulkReaderUnavailableError(f"no Java sources under {_JVM_SOURCES}: this "
                                         f"installation of shmlog is incomplete")
    digest = hashlib.sha256(pyspark.__version__.encode())
    for path in sources:
        with open(path, "rb") as source:
            digest.update(source.read())
    cache = os.environ.get("SHMLOG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shmlog")
    jar = os.path.join(cache, f"shmlog-bulk-{digest.hexdigest()[:16]}.jar")
    if os.path.exists(jar):
        return jar
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as classes:
        classpath = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
        try:
            compiled = subprocess.run([javac, "-nowarn", "-d", classes, "-cp", classpath,
                                       *sources], capture_output=True, text=True)
        except OSError as error:
            raise BulkReaderUnavailableError(f"cannot run {javac}: {error}") from None
        if compiled.returncode != 0:
            raise BulkReaderUnavailableError(
                f"{javac} failed with status {compiled.returncode}:\n{compiled.stderr.strip()}")
        partial = jar + f".{os.getpid()}.tmp"
        with zipfile.ZipFile(partial, "w") as archive:
            for root, _, names in os.walk(classes):
                for name in names:
                    path = os.path.join(root, name)
                    archive.write(path, os.path.relpath(path, classes))
        os.replace(partial, jar)
    return jar


def bulk_read(spark, **options):
    """A batch read like ``spark.read.format("shmlog")`` (same options, same schema
    without headers) through the bulk reader: a JVM data source that reads the
    segments straight into Spark's columnar batches, only the columns the query
    uses, each task preferring - and checking - the host that stores its range.
    Needs a session from :func:`session` (which ships the reader's jar).

    Raises
    ------
    BulkReaderUnavailableError
        The session has no bulk reader (the message says why).
    ShmlogError
        Headers were asked for.
    """
    parsed = _Options.parse(options)
    if parsed.include_headers:
        raise ShmlogError("the bulk reader has no headers column; use format('shmlog')")
    if _BULK_SOURCE not in spark.conf.get(_BULK_SOURCE_SETTING, ""):
        reason = spark.conf.get(_BULK_UNAVAILABLE_SETTING, "") or \
            "the session was not made by shmlog.spark.session()"
        raise BulkReaderUnavailableError(
            f"this Spark session has no shmlog bulk reader ({reason}); read with "
            f"spark.read.format('shmlog') instead, or create the session with "
            f"shmlog.spark.session() on a machine with a JDK (javac)")
    directories = {(entry["name"], part["partition"]): part["directory"]
                   for entry in request(parsed.bootstrap, "metadata")["topics"]
                   for part in entry["partitions"]}
    host = socket.gethostname()
    ranges = [{"topic": piece.topic, "partition": piece.partition, "start": piece.start,
               "end": piece.end, "directory": directories[(piece.topic, piece.partition)],
               "host": host} for piece in plan_batch(parsed)]
    return spark.read.format(_BULK_SOURCE).option("plan", json.dumps(ranges)).load()


# --- sessions --------------------------------------------------------------------------------

def register(spark) -> None:
    """Make ``format("shmlog")`` available in a Spark session."""
    spark.dataSource.register(ShmlogDataSource)


_bulk_jar_failure: list[BulkReaderUnavailableError] = []


def _bulk_jar_once() -> str:
    """:func:`bulk_jar`, but a failure is logged and remembered: it is tried (and
    explained) once per process, not on every session."""
    if _bulk_jar_failure:
        raise _bulk_jar_failure[0]
    try:
        return bulk_jar()
    except BulkReaderUnavailableError as error:
        log.warning("the shmlog bulk reader is unavailable, so bulk_read() will fail; "
                    "format('shmlog') works: %s", error)
        _bulk_jar_failure.append(error)
        raise


def session(master: str = "local[2]", app_name: str = "shmlog", **conf):
    """A Spark session with ``format("shmlog")`` registered, whose Python workers run
    this interpreter (and find the same compiled-kernel cache), and with the bulk
    reader of :func:`bulk_read` when it can be compiled (a warning says why not).

    Raises
    ------
    ShmlogError
        No Java runtime is installed (Spark needs Java 17 or later).
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ShmlogError("Spark needs a Java runtime (17 or later): install one (e.g. apt "
                          "install openjdk-17-jre-headless) or set JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4"}
    if os.environ.get("NUMBA_CACHE_DIR"):
        settings["spark.executorEnv.NUMBA_CACHE_DIR"] = os.environ["NUMBA_CACHE_DIR"]
    try:
        jar = _bulk_jar_once()
    except BulkReaderUnavailableError as error:
        settings[_BULK_UNAVAILABLE_SETTING] = str(error).splitlines()[0]
    else:
        settings["spark.jars"] = ",".join(filter(None, [conf.pop("spark.jars", None), jar]))
        settings[_BULK_SOURCE_SETTING] = _BULK_SOURCE
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
