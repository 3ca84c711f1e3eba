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
``includeHeaders``, ``kafka.isolation.level``: read_committed reads below the
last stable offsets and leaves aborted transactions out), plus ``bootstrap``: the
broker's data directory, and
``includeReadLocality``: a ``readLocality`` column saying how each row's task read
it (``local`` or ``remote``, see Locality).

Theory of operation
-------------------
Planning (on the driver) asks the local broker for metadata and reads offsets from
its partition state table, then cuts every partition's offset range into Spark
partitions (one per log partition, more when a range is large or
``minPartitions`` asks). A task maps the partition's segments read-only through a
:class:`~shmlog.client.consumer.Consumer` of the broker on its own host, reads only below
the high watermark, and turns each fetched chunk into one Arrow record batch:
keys and values are gathered into Arrow's binary layout by a compiled kernel, the
other columns are numpy arrays handed to Arrow as they are.

Locality (``locality.py``). A task reads through *its own host's* broker: the one
whose data directory is ``SHMLOG_SPARK_BOOTSTRAP`` in the executor's environment
(set per worker: ``tools/spark_cluster.py --worker-bootstrap HOST=DIR``), else
``bootstrap`` - on a single host, the driver's broker. Run the executors on the
broker hosts. In a cluster every broker hosts every partition (leader, follower or
observer copy): a task reads its broker's copy in place, below *that copy's* high
watermark, waiting (bounded) for it to cover the range's end - a follower's trails
the high watermark the plan used (the driver's broker's, Kafka asks the leader; a
copy's is never past the leader's, so every copy reaches it). The read is local
when the task's broker is the leader or an in-sync follower, remote otherwise. The
plan names every range's preferred hosts, those of the in-sync replicas (their
registrations' hosts, which Spark standalone workers on the broker hosts register
with too): the JVM bulk reader hands them to Spark; the Python Data Source API
cannot pin a task, so ``format("shmlog")`` tasks run anywhere and read through
their host's broker: how many read locally is chance, but each task's read counts
as its host says (local exactly on an in-sync replica's host,
``locality.placement_locality``). A task on a host without a broker, or whose broker holds no
copy, fails with a clear error naming its host and the partition - it never reads
anything else.

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
success. A streaming write is exactly-once (option ``transactional``, true by
default for streams): every micro-batch's tasks write in transactions that the
driver commits together once, keyed by the query's id and the batch id, so a
restarted query neither duplicates nor loses output for read_committed readers
(``sink_transactions.py``). A batch write is at-least-once, as Kafka's, unless
``transactional`` is true: then its tasks' transactions commit when the job
succeeds.

For batch jobs, :func:`bulk_read` reads through a JVM data source instead (see
there), several times faster: every row of ``format("shmlog")`` crosses from a
Python worker to the JVM. Its Java sources ship in the package
(``shmlog/spark/jvm``); :func:`session` compiles them once per PySpark version and
caches the jar. Where
that cannot be done (no JDK, a compile error), :func:`session` still works with
``format("shmlog")``: it logs why once, and :func:`bulk_read` raises
:class:`~shmlog.common.errors.BulkReaderUnavailableError` with that reason.

Modules
-------
``options.py`` (the options, checked on the driver), ``schema.py`` (the columns:
Spark's schema and the Arrow batches), ``locality.py`` (which broker a task reads
through, preferred hosts, local or remote), ``source.py`` (planning and reading,
batch and streaming), ``sink.py`` (writing), ``sink_transactions.py`` (the exactly-once sink's
two-phase commit), ``data_source.py`` (``format("shmlog")``
and :func:`register`), ``bulk.py`` (the JVM bulk reader: its jar and
:func:`bulk_read`), ``sessions.py`` (:func:`session`). Each module's public names
are for the others and for tools (``perf/bench_spark.py``); the package uses only
public names of the rest of shmlog.
"""

from __future__ import annotations

from .bulk import bulk_jar, bulk_read
from .data_source import ShmlogDataSource, register
from .options import EARLIEST, LATEST, MAX_RECORDS_PER_PARTITION_DEFAULT, ReadOptions
from .schema import HEADERS_TYPE, SCHEMA, SCHEMA_WITH_HEADERS, to_arrow
from .sessions import session
from .sink import WrittenRecords, write_batches
from .source import FETCH_BYTES, STALL_TIMEOUT_MS, OffsetRange, plan, plan_batch, read_range

__all__ = ["ShmlogDataSource", "register", "session", "bulk_read", "SCHEMA",
           "SCHEMA_WITH_HEADERS",
           # the names of the package's modules that tools/, perf/ and the tests use
           "bulk_jar", "EARLIEST", "LATEST", "MAX_RECORDS_PER_PARTITION_DEFAULT", "ReadOptions",
           "HEADERS_TYPE", "to_arrow", "WrittenRecords", "write_batches", "FETCH_BYTES",
           "STALL_TIMEOUT_MS", "OffsetRange", "plan", "plan_batch", "read_range"]
