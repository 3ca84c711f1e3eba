"""The partition log (Kafka's ``UnifiedLog``): one partition's ordered log, composed
of the storage layer's parts; and the face of that layer, whose public names the
broker, the tools and the tests import from here.

Rules
-----
* One writer per partition directory: the process that owns the
  :class:`PartitionLog`. Readers in other processes map segments read-only and rely
  on the high watermark published elsewhere; nothing below it ever changes in place
  (truncation only removes what lies above the high watermark). They import only
  the read path (``storage.segment_read``), never this module.
* Bytes enter the log only through :meth:`PartitionLog.append` (or a compiled
  writer's :func:`append_batches`, whose copy it checks) and
  :meth:`PartitionLog.append_as_follower`, which validate every batch (structure,
  CRC32C, records: ``log_validator``) before any byte is copied.
* Nothing acknowledged is rewritten: offsets are assigned once, dense and increasing
  (a follower keeps its leader's, which compaction may have left with gaps).
* The leader-epoch cache (:attr:`PartitionLog.epochs`, ``leader_epochs``) follows
  the log: appends teach it their batches' epochs, truncation, a moved log start
  and a restart empty cut it, and an open makes it agree with what was recovered.
  So does the producer state (``producer_snapshots``): a snapshot at each roll,
  reloaded at an open and after a truncation.

Theory of operation
-------------------
The parts, cut as Kafka cuts its log, each in ``shmlog/storage``:

    log_segment     Segment: one .log with its .index and .timeindex, mapped,
                    and its .txnindex (transaction_index: aborted transactions)
    local_log       LocalLog: the segment list, the checkpoint, appending, rolling,
                    reading, truncating, the swap of cleaned segments
    log_loader      LogLoader: opening a directory, recovery, RecoveryReport
    log_validator   validating appended batches, compression.type
    log_retention   LogRetention: retention by time and size, the log start offset
    segment_append  the writer's kernels (append, indexes, rescan)
    segment_read    the read path's (find, collect, timestamp lookup), ReadResult

:class:`PartitionLog` holds what spans them: the leader-epoch cache, the producer
state and its snapshots, the flush policy (``flush.messages``, ``flush.ms``, the
recovery point), and the writer's contract below. An append is validated, copied
in by the local log (which rolls and reserves as the kernel asks), then taught to
the epoch cache and counted for the flush policy.

The writer's contract
---------------------
Whoever appends in compiled code (the broker's appender; a replication follower
would too) takes an :class:`AppendTarget` (:meth:`PartitionLog.append_target`):
the active segment's arrays and state (laid out in ``segment_state``) and the
limits :func:`append_batches` takes. It appends through it, publishes what it
appended, and gives the target back with the record count
(:meth:`PartitionLog.appended_by_kernel`) for the verified prefix, prefaulting
and the flush policy. The log tells that writer, through the one listener set
with :meth:`PartitionLog.set_listener`, of every change that makes the target or
the published offsets stale (a :class:`LogChange`: its own appends, a roll,
retention, truncation, a compaction swap, DeleteRecords, a new configuration),
at once and from inside the change, so no caller has to remember to.
"""

from __future__ import annotations

import logging
import shutil
from typing import Callable, NamedTuple

import numpy as np

from .common import limits
from .common.errors import AbortedTransactionOrderError, StorageError
from .record import batch_layout as B
from .record.records import encode_batch, now_ms
from .storage.leader_epochs import LeaderEpochCache, epoch_starts
from .storage.local_log import (
    CLEANING_DIRECTORY,
    SWAP_MANIFEST_FILE,
    LocalLog,
    LogChange,
    write_swap_manifest,
)
from .storage.log_loader import LogLoader, RecoveryReport
from .storage.log_retention import LogRetention
from .storage.log_segment import Segment
from .storage.log_validator import check_offsets_available, validate_produced, validate_replicated
from .storage.producer_snapshots import ProducerStateManager
from .storage.segment_append import append_batches
from .storage.segment_read import ReadResult, collect_batches, find_batch
from .storage.segment_state import CAPACITY_WORD, TIMESTAMP_NONE
from .storage.topic_config import TopicConfig
from .storage.transaction_index import AbortedTransaction

log = logging.getLogger(__name__)

# The storage layer's public names, as this module always offered them (their
# modules define them; see the table above).
__all__ = ["PartitionLog", "Segment", "AppendResult", "AppendTarget", "LogChange", "ReadResult",
           "RecoveryReport", "AbortedTransaction", "append_batches", "find_batch",
           "collect_batches", "warm_follower_kernels", "CLEANING_DIRECTORY", "SWAP_MANIFEST_FILE",
           "write_swap_manifest"]


class AppendResult(NamedTuple):
    """Offsets given to an append: ``base_offset`` .. ``last_offset`` inclusive."""
    base_offset: int
    last_offset: int
    log_append_time: int          # -1 unless the topic uses LogAppendTime
    batch_count: int


class AppendTarget(NamedTuple):
    """Where a compiled writer appends to a partition: the active segment's mapped
    arrays and state, and the arguments :func:`append_batches` takes from the
    topic's configuration (:meth:`PartitionLog.append_target`).

    Valid until the log tells its listener of a change (:class:`LogChange`); the
    writer then takes a new one. After appending through it, the writer gives it
    back with :meth:`PartitionLog.appended_by_kernel`. A log never appended to has
    no segment file yet: its target's arrays are empty (no room, so the kernel asks
    for space), and its first batch goes through :meth:`PartitionLog.append`, which
    makes them.
    """
    log: np.ndarray                # the active segment's log, mapped read-write
    offset_index: np.ndarray
    time_index: np.ndarray
    state: np.ndarray              # the segment's state (``segment_state``), shared
    segment_bytes: int             # segment.bytes, or the mapping's size when smaller
    segment_ms: int
    index_interval: int            # index.interval.bytes
    compiled: bool                 # compiled appends allowed: CreateTime, stored as
    #                                sent; else every batch goes through append()
    verified: bool                 # the log needs back: every byte was verified
    segment: Segment               # the log needs back: the segment appended to


class PartitionLog:
    """The ordered log of one partition: append, read, roll, recover, retain, truncate.

    Parameters
    ----------
    directory : str
        The partition's directory (created if missing).
    config : TopicConfig
        The topic's effective configuration.
    topic_id : str, optional
        The id of the topic the partition belongs to (``LogManager`` gives it): a
        topic deleted and created again under the same name has the same directory
        but another id, and a cleaning planned against the old one is refused.
    new : bool
        The caller just made the directory, empty (``LogManager``, for a partition it
        creates): there is nothing to recover, so nothing is listed or read; the
        log is what loading an empty directory makes, an empty active segment
        with no file yet.
    """

    def __init__(self, directory: str, config: TopicConfig | None = None, *,
                 topic_id: str | None = None, new: bool = False):
        self.directory = directory
        self.topic_id = topic_id
        self._local_log = LocalLog(directory, config or TopicConfig(), rolled=self._rolled,
                                   new=new)
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._flush_retry_ms = 0           # no flush before this (the last one failed)
        # Told when flush_due_ms may have moved earlier (the broker's FlushSchedule).
        self.flush_listener: Callable[[PartitionLog], None] | None = None
        # The leader epochs (see leader_epochs); this log's own paths keep it right.
        self.epochs = LeaderEpochCache(directory, new=new)
        # The producers' last batches below the active segment (producer_snapshots).
        self._producers = ProducerStateManager(directory)
        self._retention = LogRetention(self._local_log, self.epochs)
        if new:
            self._local_log.add_segment(0)
            self.recovery_report = RecoveryReport(recovery_point=0)
            return
        self.recovery_report = LogLoader(self._local_log, self.epochs,
                                         self.truncate_fully_and_start_at).load()
        self._producers.load(self._segments, self.log_start_offset)
        self._restore_aborts()

    def _restore_aborts(self) -> None:
        """Index again the aborts of the closed segments recovery scanned (those at or
        above the recovery point): an OS crash can keep their abort markers, written
        back by the kernel, and lose their ``.txnindex`` entries, never fsynced. The
        active segment's are :meth:`producer_state`'s."""
        # Those below the recovery point were flushed with their indexes.
        for segment, aborts in self._producers.aborts_from(
                self._segments, self.recovery_report.recovery_point):
            try:
                restored = self._local_log.restore_aborted_transactions(
                    segment, [AbortedTransaction(*row) for row in aborts.tolist()])
            except (StorageError, AbortedTransactionOrderError) as error:
                # The log opens all the same; a later open tries again.
                log.error("%s: the aborts of the segment at %d could not be indexed again "
                          "(%s): read_committed readers may see their records",
                          self.directory, segment.base_offset, error)
                continue
            if restored:
                log.warning("%s: %d aborted transactions of the segment at %d were missing "
                            "from its .txnindex (a crash): indexed again", self.directory,
                            restored, segment.base_offset)

    # -- properties ------------------------------------------------------------------
    @property
    def config(self) -> TopicConfig:
        """The topic's effective configuration; setting it tells the listener
        (``LogChange.CONFIG_CHANGED``: the append target's limits moved)."""
        return self._local_log.config

    @config.setter
    def config(self, config: TopicConfig) -> None:
        self._local_log.config = config
        self._tell_flush_listener()            # flush.ms may have come closer

    @property
    def generation(self) -> int:
        """The segment generation (see ``segment_generation``): even while the set of
        segment files is stable, odd while a change removes or replaces files."""
        return self._local_log.generation

    @property
    def active(self) -> Segment:
        return self._local_log.active

    @property
    def segments(self) -> list[Segment]:
        return list(self._local_log.segments)

    @property
    def log_end_offset(self) -> int:
        return self._local_log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._local_log.log_start_offset

    @property
    def recovery_point(self) -> int:
        """Everything below it was flushed (an open scans from there)."""
        return self._local_log.recovery_point

    @property
    def clean_offset(self) -> int:
        """Where the last compaction stopped: records below it are clean."""
        return self._local_log.clean_offset

    @property
    def size(self) -> int:
        return self._local_log.size

    @property
    def _segments(self) -> list[Segment]:
        """The local log's segment list itself, not a copy (emptied, it abandons the
        log as a killed process would: :meth:`close` then does nothing)."""
        return self._local_log.segments

    @property
    def _bases(self) -> list[int]:
        return self._local_log.bases

    # -- producer state ------------------------------------------------------------------
    def _rolled(self, sealed: Segment, base_offset: int) -> None:
        """The local log rolled: the producer snapshot at the new base."""
        self._producers.rolled(sealed, base_offset, self.log_start_offset)

    def producer_batches(self) -> np.ndarray:
        """The last batches of each idempotent producer in the log (its window,
        ``producer_window``; those wholly below the log start forgotten), one int64
        row each in ``producer_snapshots``' columns: producer id, epoch, base
        sequence, base offset, last offset delta; a producer's rows in log order.
        What the appender remembers at open and after a truncation: the snapshot
        below the active segment and a walk of the active segment."""
        return self._producers.batches(self.active, self.log_start_offset)

    def producer_state(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`producer_batches`, and the transactions open at the log end, one int64
        row each: producer id, epoch, first offset (``producer_snapshots``). One walk
        of the active segment gives both; an abort marker it meets whose ``.txnindex``
        entry is missing (a crash between the marker and its entry) is indexed."""
        state = self._producers.state(self.active)
        for producer_id, first_offset, marker_offset, last_stable in state.aborts().tolist():
            if any(entry.producer_id == producer_id and entry.last_offset == marker_offset
                   for entry in self.aborted_transactions(marker_offset, marker_offset + 1)):
                continue
            try:
                self.append_aborted_transaction(producer_id, first_offset, marker_offset,
                                                last_stable)
            except AbortedTransactionOrderError as error:
                log.warning("%s: the abort at offset %d is not indexed again: %s",
                            self.directory, marker_offset, error)
        return state.rows(self.log_start_offset), state.open_transactions()

    # -- the writer's contract --------------------------------------------------------
    def set_listener(self, listener: Callable[[LogChange], None] | None) -> None:
        """Tell ``listener`` (the partition's writer; None: nobody) of every change
        that invalidates its :class:`AppendTarget` or the offsets it published, at
        once, with what changed (a :class:`LogChange`). The listener takes a new
        target and publishes the partition again; for
        ``LogChange.SEGMENT_FILES_CHANGING`` it must publish before it returns (the
        seqlock, see ``segment_generation``). It must not change the log itself."""
        self._local_log.set_listener(listener)

    def append_target(self) -> AppendTarget:
        """The active segment as a compiled writer appends to it with
        :func:`append_batches`: valid until the listener hears of a change. Give it
        back to :meth:`appended_by_kernel` after appending through it."""
        segment = self.active
        config = self.config
        return AppendTarget(
            segment.log, segment.offset_index_bytes, segment.time_index_bytes, segment.state,
            min(config.segment_bytes, int(segment.state[CAPACITY_WORD])), config.segment_ms,
            config.index_interval_bytes,
            config.message_timestamp_type == "CreateTime"
            and config.compression_type in ("producer", "uncompressed"),
            segment.verified_end >= segment.size, segment)

    def appended_by_kernel(self, target: AppendTarget, message_count: int,
                           leader_epoch: int = -1) -> None:
        """The bookkeeping :meth:`append` does after its kernel call, for
        ``message_count`` records (offsets: a compiled writer's are dense) a
        compiled writer appended through ``target`` since it last called this,
        stamped with ``leader_epoch`` (-1: the writer does not say): the verified
        prefix (the kernel validated what it copied), the leader-epoch cache (an
        epoch above its latest began at the first of those offsets), prefaulting
        ahead, and the flush policy. Tells the listener nothing: the writer
        published those appends itself."""
        segment = target.segment
        if target.verified:
            segment.verified_end = segment.size
        if leader_epoch > self.epochs.latest_epoch and message_count:
            self.epochs.learn(leader_epoch, segment.next_offset - message_count)
        segment.prefault_ahead()
        self._after_append(message_count)

    # -- appending --------------------------------------------------------------------
    def append(self, batches, *, leader_epoch: int = 0) -> AppendResult:
        """Validate whole batches and append them; offsets are assigned here.

        Parameters
        ----------
        batches : bytes-like or numpy.ndarray
            One or more encoded batches back to back (see :func:`encode_batch`).
            Their base offsets are ignored and replaced.
        leader_epoch : int
            Stamped into every batch; one above the epoch cache's latest begins
            at this append's base offset (``epochs``). A lower one (a stale
            writer) leaves the cache alone.

        Returns
        -------
        AppendResult

        Raises
        ------
        CorruptRecordError
            A batch is malformed; nothing was appended.
        RecordTooLargeError
            A batch exceeds ``max.message.bytes``; nothing was appended.
        StorageError
            The disk is full or failed; nothing of the failing batch was appended.
        """
        config = self.config
        source, count = validate_produced(batches, config, self.directory)
        append_time = (now_ms() if config.message_timestamp_type == "LogAppendTime"
                       else TIMESTAMP_NONE)
        base_offset = self.log_end_offset
        check_offsets_available(self.directory, base_offset, count)
        try:
            self._local_log.append(source, append_time, leader_epoch)
        finally:
            # Even a failing append may have appended batches before the one that
            # failed, or rolled: the listener publishes whatever the log now holds.
            self._local_log.tell(LogChange.APPENDED)
            # Kafka's maybeAssignEpochStartOffset, before the flush policy runs.
            if leader_epoch > self.epochs.latest_epoch and self.log_end_offset > base_offset:
                self.epochs.learn(leader_epoch, base_offset)
        last_offset = self.log_end_offset - 1
        self._after_append(last_offset - base_offset + 1)
        return AppendResult(base_offset, last_offset,
                            append_time if append_time != TIMESTAMP_NONE else -1, count)

    def append_as_follower(self, batches) -> AppendResult:
        """Append a leader's batches as they are (Kafka's ``Log.appendAsFollower``):
        their base offsets (the log end jumps over a gap compaction left), leader
        epochs and timestamps are kept, nothing is recompressed or stamped, so the
        replica's bytes are the leader's. Validated as :meth:`append` validates
        (structure, CRC32C, records, ``max.message.bytes``, zstd inflation), with
        stored batches' offset rules. The leader-epoch cache learns each epoch
        the batches change to (Kafka assigns every appended batch's epoch).

        Parameters
        ----------
        batches : bytes-like or numpy.ndarray
            One or more batches back to back, as the leader's log holds them.

        Returns
        -------
        AppendResult
            The first batch's base offset and the last batch's last offset
            (``log_append_time`` is -1).

        Raises
        ------
        UnexpectedAppendOffsetError, OffsetsOutOfOrderError
            The first base offset is below the log end, or a batch's is not past
            the batch before it; nothing was appended.
        CorruptRecordError
            A batch is malformed; nothing was appended.
        RecordTooLargeError
            A batch exceeds ``max.message.bytes``; nothing was appended.
        StorageError
            The disk is full or failed; nothing of the failing batch was appended.
        """
        validated = validate_replicated(batches, self.config, self.directory,
                                        self.log_end_offset)
        source = validated.source
        try:
            self._local_log.append(source, TIMESTAMP_NONE, -1, True)
        finally:
            self._local_log.tell(LogChange.APPENDED)
            for epoch, start in epoch_starts(source, 0, source.size, self.epochs.latest_epoch,
                                             increases_only=False):
                if start < self.log_end_offset:        # appended (all, unless it failed)
                    self.epochs.learn(epoch, start)
        self._after_append(validated.next_offset - validated.first_base_offset)
        return AppendResult(validated.first_base_offset, validated.next_offset - 1, -1,
                            validated.batch_count)

    # -- aborted transactions ---------------------------------------------------------------
    def append_aborted_transaction(self, producer_id: int, first_offset: int, last_offset: int,
                                   last_stable_offset: int) -> None:
        """Index a transaction that aborted: ``producer_id``'s records from
        ``first_offset`` to its abort marker at ``last_offset``, appended already;
        ``last_stable_offset`` the partition's when the marker was appended. The entry
        goes to the active segment's ``.txnindex`` (the segment holding the marker,
        as Kafka's ``updateTxnIndex``), made at its first entry and synced by the
        next flush. Entries come in marker order.

        Raises
        ------
        AbortedTransactionOrderError
            ``last_offset`` is not past the previous entry's, lies below the active
            segment, or below ``first_offset``; nothing was written.
        StorageError
            The write failed (a full disk); nothing was indexed.
        """
        self._local_log.append_aborted_transaction(
            AbortedTransaction(producer_id, first_offset, last_offset, last_stable_offset))

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """The aborted transactions a read of ``[start_offset, end_offset)`` meets
        (Kafka's ``collectAbortedTxns``): every indexed one whose last offset is at or
        past ``start_offset`` and whose first offset is below ``end_offset``, from the
        segment holding ``start_offset`` on, in marker order."""
        return self._local_log.aborted_transactions(start_offset, end_offset)

    # -- flushing and rolling ------------------------------------------------------------
    def _after_append(self, message_count: int) -> None:
        was_clean = not self._unflushed_messages
        self._unflushed_messages += message_count
        if not self.maybe_flush() and was_clean:
            self._tell_flush_listener()           # flush.ms runs from now on

    def _tell_flush_listener(self) -> None:
        if self.flush_listener is not None and self._unflushed_messages:
            self.flush_listener(self)

    def flush_due_ms(self) -> int | None:
        """When ``flush.ms`` makes the unflushed records due for a flush (ms; a
        failed flush's retry time if later), or None when all are flushed."""
        if not self._unflushed_messages:
            return None
        return max(self._last_flush_ms + self.config.flush_ms, self._flush_retry_ms)

    def maybe_flush(self, now: int | None = None) -> bool:
        """Flush when ``flush.messages`` or ``flush.ms`` says so (the broker's
        scheduler calls this too, so an idle log still meets ``flush.ms``).

        A flush that fails (a full disk cannot take the checkpoint) is logged and
        tried again ``FLUSH_RETRY_INTERVAL_MS`` later: the appended data stays in
        the page cache and the recovery point where it was, so the next open scans
        a little more. Appends go on meanwhile.
        """
        if not self._unflushed_messages:
            return False
        now = now_ms() if now is None else now
        if now < self._flush_retry_ms:
            return False
        config = self.config
        if self._unflushed_messages >= config.flush_messages or \
                now - self._last_flush_ms >= config.flush_ms:
            try:
                self.flush()
            except StorageError as error:
                self._flush_retry_ms = now + limits.FLUSH_RETRY_INTERVAL_MS
                log.warning("%s: flush failed (%s); trying again in %d ms", self.directory,
                            error, limits.FLUSH_RETRY_INTERVAL_MS)
                self._tell_flush_listener()
                return False
            return True
        return False

    def flush(self) -> None:
        """msync every unflushed segment, then advance the recovery point.

        Raises
        ------
        StorageError
            The sync or the checkpoint failed; the recovery point did not move.
        """
        self._local_log.sync()
        # Every epoch of what the recovery point passes is in the epochs' file (a
        # reopen learns epochs only from above the recovery point).
        self.epochs.flush()
        self._local_log.checkpoint_recovery_point()
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()

    def roll(self, log_reserved: int = 0) -> Segment:
        """Seal the active segment and start a new one at the log end offset, with
        blocks for its first ``log_reserved`` bytes reserved before anything changes
        (``LocalLog.roll``: a full disk raises :class:`StorageError`, changing nothing)."""
        return self._local_log.roll(log_reserved)

    # -- reading ----------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int = limits.READ_SIZE_DEFAULT,
             max_offset: int | None = None) -> ReadResult:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least
        one batch) and below ``max_offset`` (default: the log end offset).

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below the log start or above the log end.
        CorruptSegmentError
            A batch on disk fails its CRC or structure check.
        """
        return self._local_log.read(offset, max_bytes, max_offset)

    def offset_for_timestamp(self, timestamp: int):
        """(offset, timestamp) of the first record whose timestamp is >= ``timestamp``,
        or None when there is none (Kafka's ``offsetsForTimes``; see
        ``LocalLog.offset_for_timestamp``).

        Raises
        ------
        CorruptSegmentError
            A damaged segment could hold the answer.
        """
        return self._local_log.offset_for_timestamp(timestamp)

    # -- retention, compaction and truncation ----------------------------------------------
    def delete_old_segments(self, now: int | None = None,
                            high_watermark: int | None = None) -> list[int]:
        """Apply ``retention.ms``, ``retention.bytes`` and the log start offset
        (``LogRetention.delete_old_segments``). Only whole segments below
        ``high_watermark`` (default: the log end) go. Returns the base offsets of
        the deleted segments."""
        return self._retention.delete_old_segments(now, high_watermark)

    def advance_log_start_offset(self, offset: int) -> list[int]:
        """Kafka's DeleteRecords: records below ``offset`` become unreadable, and the
        segments wholly below it are deleted (``LogRetention.advance_log_start_offset``).
        Returns the base offsets of the deleted segments.

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below the log start or past the log end.
        """
        return self._retention.advance_log_start_offset(offset)

    def replace_segments(self, cleaning) -> bool:
        """Swap in the cleaned segments of a :class:`cleaner.Cleaning`; False (and
        nothing changed but its cleaned files thrown away) when it was planned for
        another topic of the same name (deleted and created again meanwhile) or the
        segments it cleaned changed since it was planned (``LocalLog.replace_segments``
        says how a swap stays safe for readers and across a crash)."""
        return self._local_log.replace_segments(cleaning, self.topic_id)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset`` (replication's
        truncation), and the aborted transactions indexed with a marker there.
        Batches are atomic: a batch straddling ``offset`` goes whole.
        The leader-epoch cache drops the epochs that began at or past the new log
        end (Kafka's ``truncateFromEnd``); an ``offset`` at or past the log end
        changes nothing, the cache included (Kafka's ``truncateTo``).

        Returns the new log end offset.
        """
        if offset >= self.log_end_offset:
            return self.log_end_offset
        if offset <= self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return offset
        self._local_log.truncate_to(offset)
        self.epochs.truncate_from_end(self.log_end_offset)
        # The active segment may be an older one now.
        self._producers.load(self._segments, self.log_start_offset)
        return self.log_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset`` (a follower
        below its leader's log start: Kafka's ``truncateFullyAndStartAt``); the
        leader-epoch cache and the producer state are cleared."""
        self._local_log.truncate_fully_and_start_at(offset)
        self.epochs.clear()
        self._producers.clear()

    def close(self) -> None:
        """Seal the active segment (trimmed files, closing time-index entry), flush,
        advance the recovery point and release the mappings: the next open scans
        nothing."""
        if not self._segments:
            return
        # A full disk or a failing one: what can be done is done, the mappings are
        # released all the same, and the next open recovers what was left (as after
        # a crash).
        for finish in (self.active.close_for_append, self.flush):
            try:
                finish()
            except StorageError as error:
                log.warning("%s: not closed cleanly (%s); the next open recovers it",
                            self.directory, error)
        self._local_log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def warm_follower_kernels(directory: str) -> None:
    """Load the kernels a follower's append runs that a leader's never does (the
    append kernel keeping offsets, the stored batches' validation, the epoch walk;
    for a writable source and a read-only one, as a frame off the wire is), in a
    scratch partition at ``directory``, created and removed here: a broker's
    warm-up calls it, so a follower's first fetch loads no kernel with the GIL held.
    """
    config = TopicConfig()
    batch = encode_batch([b"warm-up"])
    partition_log = PartitionLog(directory, config)
    try:
        for base in (0, 5):                 # a gap between them, and a new epoch
            header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)
            header["base_offset"], header["leader_epoch"] = base, base
            partition_log.append_as_follower(
                batch if base == 0 else np.frombuffer(batch.tobytes(), np.uint8))
        partition_log.truncate_to(1)
    finally:
        partition_log.close()
        shutil.rmtree(directory, ignore_errors=True)
