"""Writing: ``df.write.format("shmlog")`` and ``writeStream.format("shmlog")``.

Rules
-----
* Rows with ``value`` (binary or string) and optionally ``key``, ``topic`` (or the
  ``topic`` option, which wins), ``partition`` and ``headers`` become records.
* Save mode append only: Spark refuses its default, ErrorIfExists, for every Python
  data source, and append is what Kafka's sink does anyway.
* A streaming query writes exactly once (option ``transactional``, true by
  default for streams): each micro-batch is written in transactions that commit
  together, once, keyed by the query's id and the micro-batch's id, so a query
  restarted from its checkpoint (after a failure or a stop mid-batch) neither
  duplicates nor loses output for read_committed readers
  (``sink_transactions``: the design). ``kafka.transaction.timeout.ms`` bounds how
  long a micro-batch's transactions may stay open (default
  ``limits.SPARK_SINK_TRANSACTION_TIMEOUT_MS``).
* A batch write is at-least-once by default, as Kafka's sink: a task flushes its
  records (``acks=1``) before it reports success, and a retried task produces its
  rows again. With ``option("transactional", "true")`` its tasks write in
  transactions the driver commits once every task succeeded (failed attempts',
  and a failed job's, are aborted): read_committed readers see the whole write or
  nothing of it - unless the driver dies while committing, when the transactions
  it had not committed yet are aborted at their timeout.
* With ``transactional`` false, a stream is at-least-once too (Kafka's sink).

Theory of operation
-------------------
Rows are grouped by partition (their own, Kafka's key partitioner where a row
names none but has a key, else the sticky partitioner's) and sent as whole batches
of at most the topic's max.message.bytes with ``Producer.send_batch``. A
transactional task makes its producer at its first row (its transactional id names
the query, the run, its partition and attempt), sends in one transaction, flushes
and leaves it open for the driver (:class:`WrittenRecords` carries it there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..client.partitioner import partition_for_key
from ..client.producer import Producer
from ..common import limits
from ..common.errors import LocalProtocolError
from ..common.paths import default_data_dir
from ..record import batch_layout as B
from . import sink_transactions as T
from .options import flag, number, option

__all__ = ["WrittenRecords", "write_batches", "BatchWriter", "StreamWriter"]


@dataclass
class WrittenRecords(WriterCommitMessage):
    """What a writing task reports to the driver: how many records it produced, and
    in a transactional write its open transaction (None when it had no row) and the
    streaming query's id."""
    records: int
    prepared: T.Prepared | None = None
    query: str | None = None


@dataclass(frozen=True)
class TaskTransaction:
    """How a transactional write's task names its transaction: the streaming query's
    id (None for a batch write), the run, the timeout."""
    query: str | None
    run: str
    timeout_ms: int
    _context: dict = field(default_factory=dict, compare=False)

    @classmethod
    def of_task(cls, run: str, timeout_ms: int, streaming: bool) -> "TaskTransaction":
        from pyspark import TaskContext
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if streaming else None
        if streaming and not query:
            raise LocalProtocolError("a streaming write's task has no query id "
                                     "(sql.streaming.queryId)")
        return cls(query, run, timeout_ms, {"partition": context.partitionId(),
                                            "attempt": context.attemptNumber()})

    def transactional_id(self) -> str:
        return T.transactional_id(self.query, self.run, self._context["partition"],
                                  self._context["attempt"])


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


def write_batches(batches, options, schema: StructType,
                  transaction: TaskTransaction | None = None) -> WrittenRecords:
    """Produce every row of the Arrow batches, flush, and count them. Rows are
    grouped by topic and partition (their own, their key's as Kafka's partitioner
    gives it, or the sticky partitioner's for neither) and sent as whole batches
    of at most the topic's max.message.bytes. With ``transaction``, in one
    transaction made at the first row and left open (reported in the result)."""
    if "value" not in schema.fieldNames():
        raise LocalProtocolError("writing to shmlog needs a value column (binary or string)")
    topic_option = option(options, "topic")
    if topic_option is None and "topic" not in schema.fieldNames():
        raise LocalProtocolError("give the topic option or a topic column")
    bootstrap = option(options, "bootstrap") or default_data_dir()
    written, producer, first = 0, None, None
    try:
        for batch in batches:
            count = batch.num_rows
            if not count:
                continue
            if producer is None:
                producer = _producer(bootstrap, transaction)
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
                    sent = producer.send_batch(topic, [values[row] for row in chunk],
                                               [keys[row] for row in chunk],
                                               partition=partition,
                                               headers=[headers[row] for row in chunk])
                    if first is None:
                        first = sent
            written += count
        if producer is not None:
            producer.flush()
        if transaction is None or producer is None:
            return WrittenRecords(written, None, transaction and transaction.query)
        # The transaction stays open: the driver commits it (sink_transactions).
        where = first.get()              # flushed: at once
        return WrittenRecords(written, T.Prepared(
            transaction.transactional_id(), producer.producer_id, producer.producer_epoch,
            transaction._context["partition"], transaction._context["attempt"],
            (where.topic, where.partition)), transaction.query)
    finally:
        if producer is not None:
            producer.close()


def _producer(bootstrap: str, transaction: TaskTransaction | None) -> Producer:
    if transaction is None:
        return Producer(bootstrap, acks=1)
    producer = Producer(bootstrap, acks="all", transactional_id=transaction.transactional_id(),
                        transaction_timeout_ms=transaction.timeout_ms)
    try:
        producer.init_transactions()
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer


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
    """What the batch and the stream writer share: a task's rows become records, in
    a transaction of its own when the write is transactional."""

    streaming = False

    def __init__(self, options, schema: StructType):
        self.options = {key.lower(): value for key, value in options.items()}
        self.schema = schema
        self.bootstrap = option(self.options, "bootstrap") or default_data_dir()
        self.transactional = flag(self.options, "transactional", self.streaming)
        self.timeout_ms = number(self.options, "kafka.transaction.timeout.ms",
                                 limits.SPARK_SINK_TRANSACTION_TIMEOUT_MS)
        self.run = T.new_run()         # on the driver, as the write starts

    def write(self, iterator) -> WrittenRecords:
        transaction = TaskTransaction.of_task(self.run, self.timeout_ms, self.streaming) \
            if self.transactional else None
        return write_batches(iterator, self.options, self.schema, transaction)


def _prepared(messages) -> list[T.Prepared]:
    return [message.prepared for message in messages
            if isinstance(message, WrittenRecords) and message.prepared is not None]


class BatchWriter(_Producing, DataSourceArrowWriter):
    """``df.write.format("shmlog")``: each task produces its rows; with
    ``transactional``, the driver commits every task's transaction at the end."""

    def commit(self, messages) -> None:
        if self.transactional:
            T.commit_write(self.bootstrap, self.run, _prepared(messages), self.timeout_ms)

    def abort(self, messages) -> None:
        """Records a failed job produced stay (at-least-once), unless transactional:
        then every transaction of the write is aborted."""
        if self.transactional:
            T.abort_others(self.bootstrap, T.prefix(None, self.run), set(), self.timeout_ms)


class StreamWriter(_Producing, DataSourceStreamArrowWriter):
    """``writeStream.format("shmlog")``: each task of a micro-batch produces its rows,
    in a transaction the driver commits with the micro-batch's (``sink_transactions``)."""

    streaming = True

    def commit(self, messages, batchId: int) -> None:
        """Transactional: decide and commit the micro-batch. Otherwise each task
        flushed its records before reporting: nothing is left to do."""
        if not self.transactional:
            return
        query = next((message.query for message in messages
                      if isinstance(message, WrittenRecords) and message.query), None)
        if query is not None:
            T.commit_micro_batch(self.bootstrap, query, batchId, self.run,
                                 _prepared(messages), self.timeout_ms)

    def abort(self, messages, batchId: int) -> None:
        """Transactional: the micro-batch's open transactions are aborted (a stored
        decision's are kept for the re-run). Otherwise records a failed task
        produced stay (at-least-once, as Kafka's sink)."""
        if not self.transactional:
            return
        query = next((message.query for message in messages or ()
                      if isinstance(message, WrittenRecords) and message.query), None)
        T.abort_micro_batch(self.bootstrap, query, batchId, self.run, self.timeout_ms)
