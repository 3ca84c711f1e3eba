"""Writing: ``df.write.format("shmlog")`` and ``writeStream.format("shmlog")``.

Rules
-----
* Rows with ``value`` (binary or string) and optionally ``key``, ``topic`` (or the
  ``topic`` option, which wins), ``partition`` and ``headers`` become records.
* Save mode append only: Spark refuses its default, ErrorIfExists, for every Python
  data source, and append is what Kafka's sink does anyway.
* At-least-once, as Kafka's sink: a task flushes its records (``acks=1``) before it
  reports success, and a retried task produces its rows again.

Theory of operation
-------------------
Rows are grouped by partition (their own, Kafka's key partitioner where a row
names none but has a key, else the sticky partitioner's) and sent as whole batches
of at most the topic's max.message.bytes with ``Producer.send_batch``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..client.partitioner import partition_for_key
from ..client.producer import Producer
from ..common.errors import LocalProtocolError
from ..common.paths import default_data_dir
from ..record import batch_layout as B
from .options import option

__all__ = ["WrittenRecords", "write_batches", "BatchWriter", "StreamWriter"]


@dataclass
class WrittenRecords(WriterCommitMessage):
    """What a writing task reports to the driver: how many records it produced."""
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
    topic_option = option(options, "topic")
    if topic_option is None and "topic" not in schema.fieldNames():
        raise LocalProtocolError("give the topic option or a topic column")
    written = 0
    with Producer(option(options, "bootstrap") or default_data_dir(), acks=1) as producer:
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


class BatchWriter(_Producing, DataSourceArrowWriter):
    """``df.write.format("shmlog")``: each task produces its rows."""


class StreamWriter(_Producing, DataSourceStreamArrowWriter):
    """``writeStream.format("shmlog")``: each task of a micro-batch produces its rows."""

    def commit(self, messages, batchId: int) -> None:
        """Each task flushed its records before reporting: nothing is left to do."""

    def abort(self, messages, batchId: int) -> None:
        """Records a failed task produced stay (at-least-once, as Kafka's sink)."""
