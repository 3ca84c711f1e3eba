"""The partition host: every partition this broker serves, and what keeps them
(Kafka's ReplicaManager): the logs, the partition state table, the appender that
drains producers' rings into them, and the broker's own appends.

Rules
-----
* A partition is hosted from the moment its topic is created (or grows) until it
  is deleted: its log is open, its row in the state table claimed, the appender
  takes entries for it. Every partition of every topic in the data directory is
  hosted (one broker, every partition local).
* A partition keeps its row across restarts (``partition-rows.json``, ``{"<topic>/
  <partition>": row}``, rewritten whole after every change, once per request however
  many topics it creates): producers put the row on ring entries, so entries still
  in a ring after a crash go where they were meant to. A rows file that cannot be
  read is ignored (partitions get new rows, and the appender finds misaddressed
  entries by their identity). It is not fsynced: it matters only to entries in the
  rings, which live in /dev/shm and die with the machine, as the page cache does;
  the broker's own crash (kill -9) leaves both.
* The broker's own records (offset commits) are appended through the appender
  (:meth:`PartitionHost.append`), as a producer's are: the same checks, the same
  publication of the partition's row, and the one place where replication will
  see every append.
* Whatever changes a partition outside the drain (retention, a config change, a
  cleaning swapped in) refreshes the appender's view of it and republishes its row:
  the log tells the appender itself (``PartitionLog.set_listener``), so no caller
  can forget to.
* Listeners (:meth:`PartitionHost.when_topics_change`) hear every change of the set
  of partitions (a topic created, deleted or grown), with the time.

Theory of operation
-------------------
:class:`PartitionHost` holds one :class:`HostedPartition` per partition (Kafka's
``Partition``: its name, its row, its log); requests look partitions up here, and
the state that cluster mode gives a partition (its leader epoch, its replicas, the
policy that moves its high watermark) belongs beside them.

The loop calls :meth:`PartitionHost.drain` every turn; it drains only when the
appender's doorbell rang since the last drain that left every ring empty (or
:meth:`PartitionHost.drain_soon` asked), and rings the consumers' doorbell after a
drain that appended. Each drain pass is timed around the compiled call, once per
pass (``drain_seconds``, for ``broker_stats``), and the cleaner's work is counted
as it is swapped in (``cleaner_progress``). Its periodic work is the flush policy
(``flush.messages`` at the append; ``flush.ms`` from ``flush_schedule``, which looks
only at the logs whose time came), retention (``retention.ms``, ``retention.bytes``)
and compaction: :meth:`PartitionHost.start_cleaning` hands the dirtiest compacted
partition to the cleaner's thread, and :meth:`PartitionHost.swap_cleaned` swaps its
result in on the loop's thread, if the partition's segments are still those that
were cleaned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Iterator, NamedTuple

import numpy as np

from ..common import limits
from ..common.errors import ShmlogError
from ..common.metrics import Histogram
from ..common.paths import shared_memory_prefix
from ..record.control import EndTransactionMarker, decode_marker
from ..record.records import decode_records, iter_batches, now_ms
from ..segments import PartitionLog
from ..shm.completion import completion_error
from ..shm.state import PartitionStateTable
from ..storage.cleaner import CleanerThread
from ..storage.cleaner import keys_max as cleaner_keys_max
from ..storage.cleaner import plan as cleaner_plan
from ..storage.delete_records import delete_target
from ..storage.durable_files import write_atomically
from ..storage.log_manager import LogManager, TopicMetadata
from .appender import DRAIN_ENTRIES_MAX, Appender
from .flush_schedule import FlushSchedule

# The broker's log: operators read one logger for the broker's work.
log = logging.getLogger("shmlog.broker")

__all__ = ["PartitionHost", "HostedPartition", "CleanerProgress", "InternalRecord", "ROWS_FILE"]

ROWS_FILE = "partition-rows.json"


@dataclasses.dataclass(frozen=True)
class HostedPartition:
    """One partition this broker hosts.

    Attributes
    ----------
    topic, partition : str, int
        Its name.
    row : int
        Its row in the state table (and on its producers' ring entries).
    log : PartitionLog
        Its log, open while it is hosted.
    """
    topic: str
    partition: int
    row: int
    log: PartitionLog


class InternalRecord(NamedTuple):
    """A record of an internal topic as a coordinator reads it back: its key and value,
    the producer id of its batch when that batch is transactional (else -1), and for
    a transaction's marker the marker (its key and value None)."""
    key: bytes | None
    value: bytes | None
    producer_id: int
    marker: EndTransactionMarker | None


def _records_of(data: np.ndarray, start_offset: int) -> Iterator[InternalRecord]:
    """The records of whole batches (from ``start_offset``) and their transactions."""
    position = 0
    for info in iter_batches(data):
        batch = data[position:position + info.batch_length]
        position += info.batch_length
        if info.is_control:
            if info.base_offset >= start_offset:
                yield InternalRecord(None, None, info.producer_id, decode_marker(batch))
            continue
        producer_id = info.producer_id if info.is_transactional else -1
        for record in decode_records(batch, start_offset=start_offset):
            yield InternalRecord(record.key, record.value, producer_id, None)


@dataclasses.dataclass
class CleanerProgress:
    """What the cleaner has done since the broker started (Kafka's LogCleaner
    metrics): cleanings swapped in, failed, the bytes they rewrote and kept, how
    long the last took, and the partition being cleaned now (None: idle)."""
    cleanings: int = 0
    failures: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    last_seconds: float | None = None
    cleaning: tuple[str, int] | None = None
    started: float | None = None          # monotonic: when ``cleaning`` was handed over


class PartitionHost:
    """The partitions of one data directory, their state table and their appender.

    Parameters
    ----------
    data_dir : str
        Locked for this object's lifetime (one broker per directory).
    partitions_max : int
        Rows of the state table it makes.
    cleaner_dedupe_buffer_size : int
        The memory of the cleaner's key map (bytes).
    table : PartitionStateTable, optional
        A table to use instead (the warm-up's, in anonymous memory).

    Attributes
    ----------
    drain_seconds : Histogram
        How long each drain pass took (the compiled call timed from Python, once
        per pass, never per entry).
    entries_drained : int
        Ring entries handled by drains since the start.
    cleaner_progress : CleanerProgress

    Raises
    ------
    DataDirectoryInUseError
        Another broker holds the directory.
    """

    def __init__(self, data_dir: str, *, partitions_max: int, cleaner_dedupe_buffer_size: int,
                 table: PartitionStateTable | None = None):
        self.data_dir = os.path.abspath(data_dir)
        self.logs = LogManager(self.data_dir)          # the lock: one broker per directory
        self.table_name = shared_memory_prefix(self.data_dir) + "-state" if table is None \
            else table.name
        # A table of ours left by a broker that died is replaced: we hold the lock.
        self.table = table if table is not None else \
            PartitionStateTable.create(self.table_name, partitions_max)
        self.appender = Appender(self.logs, self.table)
        self._partitions: dict[tuple[str, int], HostedPartition] = {}
        self._ordered: list[HostedPartition] | None = None     # partitions(), until a change
        self._flushes = FlushSchedule()
        self._listeners: list[Callable[[int], None]] = []
        self._rows_path = os.path.join(self.data_dir, ROWS_FILE)
        # What the rows file says, per topic: its entries as JSON text (``"<topic>/
        # <partition>": row, ...``), made when its partitions are hosted: saving the
        # file joins them, and never encodes every partition again (1,000 topics
        # created one request each spent 40 % of their time there).
        self._row_entries: dict[str, str] = {}
        rows = self._load_rows()
        for topic in self.logs.list_topics():
            self._host_partitions(topic, rows)
        self._save_rows()
        self._drained = self.table.appender_doorbell.sequence
        self._drain_due = True          # rings left by a crash are drained on registration
        self.cleaner = CleanerThread(cleaner_keys_max(cleaner_dedupe_buffer_size))
        self.drain_seconds = Histogram(limits.DRAIN_SECONDS_BUCKETS)
        self.entries_drained = 0
        self.cleaner_progress = CleanerProgress()

    # -- the rows file ---------------------------------------------------------------
    def _load_rows(self) -> dict:
        try:
            with open(self._rows_path) as source:
                rows = json.load(source)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("ignoring %s (%s): partitions get new rows", self._rows_path, error)
            return {}
        return {key: value for key, value in rows.items() if isinstance(value, int)} \
            if isinstance(rows, dict) else {}

    def _save_rows(self) -> None:
        body = "{" + ", ".join(entries for entries in self._row_entries.values() if entries) + "}"
        write_atomically(self._rows_path, body, sync=False)

    # -- hosting -----------------------------------------------------------------------
    def _host_partitions(self, topic: str, rows: dict) -> None:
        """Host every partition of ``topic`` not hosted yet (a row asked for in
        ``rows`` is used when free)."""
        count = self.logs.describe_topic(topic).partitions
        try:
            for partition in range(count):
                if (topic, partition) not in self._partitions:
                    row = self.appender.register_partition(topic, partition,
                                                           rows.get(f"{topic}/{partition}"))
                    hosted = self._partitions[(topic, partition)] = HostedPartition(
                        topic, partition, row, self.logs.partition_log(topic, partition))
                    self._flushes.watch(hosted.log)
        finally:            # the rows of those hosted, even when one could not be
            self._ordered = None
            self._row_entries[topic] = json.dumps({
                f"{topic}/{partition}": hosted.row for partition in range(count)
                if (hosted := self._partitions.get((topic, partition))) is not None})[1:-1]

    def when_topics_change(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(now)`` after every change of the topics: a topic created,
        deleted or grown (once for the topics one request created)."""
        self._listeners.append(listener)

    def _topics_changed(self) -> None:
        self._save_rows()
        now = now_ms()
        for listener in self._listeners:
            listener(now)

    def create_topic(self, name: str, partitions: int, config: dict,
                     topic_id: str | None = None) -> TopicMetadata:
        """Create a topic (internal ones too: no refusal here) and host its partitions;
        ``topic_id``: the cluster's id for it (a new one by default)."""
        metadata = self.logs.create_topic(name, partitions, config, topic_id=topic_id)
        self._host_partitions(name, {})
        self._topics_changed()
        return metadata

    def create_topics(self, topics: list[tuple[str, int, dict]]) -> list:
        """Create several topics, each ``(name, partitions, config)`` (Kafka's
        CreateTopics: one request, an outcome per topic), and host their partitions;
        the rows are saved and the listeners told once, for all of them. Per topic,
        in order, its ``TopicMetadata`` or the ``ShmlogError`` that refused it (the
        others are created all the same)."""
        outcomes: list = []
        try:
            for name, partitions, config in topics:
                try:
                    outcomes.append(self.logs.create_topic(name, partitions, config))
                except ShmlogError as error:
                    outcomes.append(error)
                    continue
                self._host_partitions(name, {})
        finally:
            if any(isinstance(outcome, TopicMetadata) for outcome in outcomes):
                self._topics_changed()
        return outcomes

    def delete_topic(self, name: str) -> None:
        """Stop hosting a topic's partitions (their rows are freed) and delete it."""
        for partition in range(self.logs.describe_topic(name).partitions):
            self.appender.unregister_partition(name, partition)
            self._flushes.forget(self._partitions.pop((name, partition)).log)
        self._ordered = None
        self._row_entries.pop(name, None)
        self.logs.delete_topic(name)
        self._topics_changed()

    def add_partitions(self, name: str, total: int) -> TopicMetadata:
        """Grow a topic to ``total`` partitions and host the new ones."""
        metadata = self.logs.add_partitions(name, total)
        self._host_partitions(name, {})
        self._topics_changed()
        return metadata

    def alter_topic_config(self, name: str, set_overrides: dict,
                           delete: tuple[str, ...]) -> TopicMetadata:
        """Change a topic's config; its partitions take it at once."""
        return self.logs.alter_topic_config(name, set_overrides, delete)

    # -- looking partitions up ------------------------------------------------------------
    def partition(self, topic: str, partition: int) -> HostedPartition:
        """A hosted partition.

        Raises
        ------
        UnknownTopicOrPartitionError
            No such topic, or no such partition of it.
        """
        self.logs.partition_log(topic, partition)    # its checks and its error messages
        return self._partitions[(topic, partition)]

    def partitions(self) -> Iterator[HostedPartition]:
        """Every hosted partition, by topic name, then partition number."""
        return iter(self.partition_list())

    def partition_list(self) -> list[HostedPartition]:
        """:meth:`partitions` as a list, kept until the set of partitions changes
        (the periodic tasks walk it every second: not rebuilt from the topics' metadata
        each time). The same list object while nothing changed; do not modify it."""
        if self._ordered is None:
            self._ordered = [self._partitions[(topic, partition)]
                             for topic in self.logs.list_topics()
                             for partition in range(self.logs.describe_topic(topic).partitions)]
        return self._ordered

    def partition_counts(self) -> dict[str, int]:
        """{topic: partition count} for every topic."""
        return {topic: self.logs.describe_topic(topic).partitions
                for topic in self.logs.list_topics()}

    # -- appending -----------------------------------------------------------------------
    def append(self, topic: str, partition: int, batch: np.ndarray, *,
               sequenced: bool = True) -> int:
        """Append a batch the broker made (an offset commit) through the appender,
        publish it and tell waiting consumers; its base offset. ``sequenced=False``:
        a coordinator's batch under a producer's id (a transaction's offsets), which
        takes no place in that producer's sequence (Kafka's origin Coordinator).

        Raises
        ------
        UnknownTopicOrPartitionError, StorageError, RecordTooLargeError, CorruptRecordError
            The appender refused the batch (``completion.completion_error``); nothing
            of it was appended.
        """
        result, _ = self.appender.append(self.partition(topic, partition).row, batch,
                                         sequenced=sequenced)
        if result < 0:
            raise completion_error(-result, topic, partition)
        self.table.consumer_doorbell.ring()
        return result

    def expect_transaction(self, topic: str, partition: int, producer_id: int,
                           producer_epoch: int) -> bool:
        """The partition admits the first transactional batch of the producer at
        ``producer_epoch`` (``Appender.expect_transaction``): False while a transaction
        of another epoch of it is open there.

        Raises
        ------
        UnknownTopicOrPartitionError
            The partition is not hosted here.
        """
        return self.appender.expect_transaction(self.partition(topic, partition).row,
                                                producer_id, producer_epoch)

    def write_marker(self, topic: str, partition: int, marker: EndTransactionMarker) -> int:
        """Append a transaction's end marker to the partition (``Appender.write_marker``)
        and tell waiting consumers; its offset.

        Raises
        ------
        UnknownTopicOrPartitionError, StorageError, NotLeaderOrFollowerError
            The marker is not in the partition.
        """
        result = self.appender.write_marker(self.partition(topic, partition).row, marker)
        if result < 0:
            raise completion_error(-result, topic, partition)
        self.table.consumer_doorbell.ring()
        return result

    def internal_records(self, topic: str, partition: int | None = None) \
            -> Iterator[InternalRecord]:
        """Every record of an internal topic (of one partition, or of all in order),
        oldest first, as the coordinators read them back at a start: each with its
        batch's producer id when transactional, and the transactions' markers among
        them."""
        if topic not in self.logs.list_topics():
            return
        partitions = range(self.logs.describe_topic(topic).partitions) if partition is None \
            else (partition,)
        for number in partitions:
            partition_log = self.partition(topic, number).log
            offset = partition_log.log_start_offset
            while offset < partition_log.log_end_offset:
                result = partition_log.read(offset, max_bytes=limits.READ_SIZE_DEFAULT)
                if not result.data.size:
                    break
                yield from _records_of(result.data, offset)
                offset = result.next_offset

    def drain_soon(self) -> None:
        """Drain the rings at the next turn, whether or not the doorbell rang (a ring
        was registered with entries in it; a safety net under the doorbell)."""
        self._drain_due = True

    def work_pending(self, sequence: int | None = None) -> bool:
        """Has anything been put into a ring (or asked of us) since the last drain
        that left every ring empty? (``sequence``: the doorbell's, if just read.)"""
        if sequence is None:
            sequence = self.table.appender_doorbell.sequence
        return self._drain_due or sequence != self._drained

    def drain(self) -> int:
        """Drain the rings if anything was put; tell waiting consumers of what was
        appended. Returns how many entries were handled."""
        sequence = self.table.appender_doorbell.sequence
        if not self.work_pending(sequence):
            return 0
        self._drain_due = False
        started = time.perf_counter()
        handled = self.appender.drain()
        self.drain_seconds.observe(time.perf_counter() - started)
        self.entries_drained += handled
        if handled:
            self.table.consumer_doorbell.ring()
        if handled < DRAIN_ENTRIES_MAX:
            self._drained = sequence          # every ring was empty after this sequence
        return handled

    # -- deleting records ------------------------------------------------------------------
    def delete_records(self, topic: str, partition: int, requested: int) -> tuple[str | None, int]:
        """Kafka's DeleteRecords on a partition this broker may delete from (a single
        broker's, or one it leads): the log start moves to ``requested`` (-1: the
        high watermark) and the segments below it go (``delete_records``' rules).
        Returns (a Kafka error name or None, the log start asked for).

        Raises
        ------
        UnknownTopicOrPartitionError
            No such partition.
        StorageError
            The checkpoint could not be written; the log start did not move.
        """
        hosted = self.partition(topic, partition)
        error, offset = delete_target(requested, log_start_offset=hosted.log.log_start_offset,
                                      high_watermark=self.appender.high_watermark(hosted.row))
        if error is None and offset > hosted.log.log_start_offset:
            deleted = hosted.log.advance_log_start_offset(offset)
            log.info("%s-%d: records below %d deleted (%d segments)", topic, partition, offset,
                     len(deleted))
        return error, offset

    # -- flushing, retention, cleaning ----------------------------------------------------
    def flush_due(self, now: int) -> None:
        """Flush the partitions whose ``flush.ms`` came (``flush_schedule``: only
        those are looked at; ``flush.messages`` is met at the append)."""
        self._flushes.run(now)

    def apply_retention(self, now: int | None = None) -> None:
        """Delete the segments retention lets go, in every partition: only below its
        high watermark (Kafka's rule; the log end while the policy says so)."""
        for hosted in self.partitions():
            hosted.log.delete_old_segments(now, self.appender.high_watermark(hosted.row))

    def start_cleaning(self, now: int | None = None) -> bool:
        """Hand the dirtiest compacted partition to the cleaner (when it is free);
        False when none is dirty enough."""
        if self.cleaner.busy:
            return False
        now = now_ms() if now is None else now
        plans = []
        for hosted in self._compacted_partitions():
            # Never past the last stable offset: an open transaction is not compacted.
            planned = cleaner_plan(hosted.log, now, self.appender.last_stable_offset(hosted.row))
            if planned is not None:
                plans.append((planned.dirty_ratio, hosted.topic, hosted.partition, planned))
        if not plans:
            return False
        _, topic, partition, planned = max(plans, key=lambda entry: entry[0])
        self.cleaner.submit((topic, partition), planned, now)
        self.cleaner_progress.cleaning = (topic, partition)
        self.cleaner_progress.started = time.monotonic()
        return True

    def _compacted_partitions(self) -> Iterator[HostedPartition]:
        """The partitions with ``cleanup.policy`` compact: a topic's partitions share
        its config, so a topic whose first partition is not compacted is passed over
        whole (thousands of partitions of deleted-policy topics cost nothing here)."""
        for topic, count in self.partition_counts().items():
            first = self._partitions.get((topic, 0))
            if first is None or not first.log.config.compact:
                continue
            for partition in range(count):
                hosted = self._partitions[(topic, partition)]
                if hosted.log.config.compact:
                    yield hosted

    def swap_cleaned(self) -> bool:
        """Swap in what the cleaner finished, if it has; True when a partition changed."""
        finished = self.cleaner.collect()
        if finished is None:
            return False
        (topic, partition), result = finished
        progress = self.cleaner_progress
        progress.cleaning = None
        if isinstance(result, Exception):
            progress.failures += 1
            log.error("cleaning %s-%d failed: %s", topic, partition, result)
            return False
        try:
            hosted = self.partition(topic, partition)
        except ShmlogError:
            return False                       # deleted while it was being cleaned
        if hosted.log.directory != result.plan.directory or \
                not hosted.log.replace_segments(result):
            return False
        log.info("cleaned %s-%d up to offset %d: %d -> %d bytes", topic, partition,
                 result.end_offset, result.bytes_before, result.bytes_after)
        progress.cleanings += 1
        progress.bytes_before += result.bytes_before
        progress.bytes_after += result.bytes_after
        if progress.started is not None:
            progress.last_seconds = time.monotonic() - progress.started
        return True

    def close(self) -> None:
        """Drain every ring, stop the cleaner, flush and close the logs, remove the
        shared memory."""
        self.appender.drain(entries_max=limits.BATCH_RECORD_COUNT_MAX)
        self.cleaner.stop()
        self.logs.close()
        owner = self.table.owner
        self.table.close()
        if owner:
            self.table.unlink()
