"""The log on disk: segments, their indexes, and the partition log.

Rules
-----
* One writer per partition directory: the process that owns the
  :class:`PartitionLog`. Readers in other processes map segments read-only and rely
  on the high watermark published elsewhere; nothing below it ever changes in place
  (truncation only removes what lies above the high watermark).
* Bytes enter the log only through :meth:`PartitionLog.append` (or a compiled
  writer's :func:`append_batches`, whose copy it checks) and
  :meth:`PartitionLog.append_as_follower`, which validate every batch (structure,
  CRC32C, records) before any byte is copied.
* Nothing acknowledged is rewritten: offsets are assigned once, dense and increasing
  (a follower keeps its leader's, which compaction may have left with gaps).
* The leader-epoch cache (:attr:`PartitionLog.epochs`, ``leader_epochs``) follows
  the log: appends teach it their batches' epochs, truncation, a moved log start
  and a restart empty cut it, and an open makes it agree with what was recovered.

Theory of operation
-------------------
A partition is a directory of segments named by base offset, as in Kafka::

    00000000000000000000.log  .index  .timeindex
    00000000000000368769.log  .index  .timeindex      <- active segment
    checkpoint.json                                    recovery point, log start offset
    leader-epoch-checkpoint.json                       epoch -> start offset (leader_epochs)
    00000000000000368769.producers.json                producers' last batches below it,
                                                       written at the roll (producer_snapshots)

The active segment's files are sparse files of their full configured size, mapped
read-write once. Disk blocks are reserved with ``fallocate`` and page tables
populated (``MADV_POPULATE_WRITE``) a step ahead of the write position, so appends
neither page-fault on every 4 KiB page nor die of ``SIGBUS`` on a full disk: a full
disk fails the reservation, which raises :class:`StorageError` before any byte moves.
Space never written reads as zeros, and a zero batch length marks the end of the data.

No store ever lands past a reservation, in any of the three files. The segment's
state says how many bytes of the log and of each index are reserved; the append
kernel copies a batch only when the log bytes it takes, the index entries it may
add and the slot of the closing time-index entry (which sealing writes) are all
reserved, and otherwise asks Python for room (``NEED_SPACE``). Each reservation
of the log reserves index slots in proportion (an entry per
``index.interval.bytes`` of log at most), so the kernel seldom asks for the
indexes alone. A rescan reserves, before it starts, the slots its log can need at
most. A roll reserves the new segment's first step before mapping its files and
before sealing the old segment: a full disk fails the roll with nothing changed,
and the next append tries again. When the background reservation fails, it stops
until an append's own reservation succeeds (the disk has room again).

A segment and its files are ``storage.log_segment``'s; the kernels are
``storage.segment_append``'s (the writer's) and ``storage.segment_read``'s (the read
path, which a reader in another process imports instead of this module).

The compiled kernel :func:`append_batches` copies validated batches into the
mapping, stamps base offset and leader epoch, adds sparse index entries every
``index.interval.bytes``, and returns early when the segment must roll or more
space must be reserved; Python does those and calls it again. Rolling trims the
closed segment's files to their used length. Every kernel that walks batches
steps with ``records.batch_frame``, the one bounds check of a walk.

Recovery: ``checkpoint.json`` holds the recovery point, the offset below which
everything was flushed. On open, every segment holding offsets at or above it is
scanned batch by batch (CRC32C and structure); the log is truncated at the first
invalid batch, later segments are deleted, the indexes of scanned segments are
rebuilt, and a :class:`RecoveryReport` says what was cut. Indexes of older segments
get a sanity check and are rebuilt when they fail it.

The segment generation tells readers in other processes when to list the
directory again: a seqlock, whose rules ``segment_generation`` holds (odd around
retention, the segments DeleteRecords drops, truncation and a compaction swap; a roll
moves it by two).

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

import bisect
import contextlib
import dataclasses
import enum
import json
import logging
import os
import shutil
from typing import Callable, NamedTuple

import numpy as np

from .common import access, limits
from .common.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    OffsetOutOfRangeError,
    OffsetOverflowError,
    OffsetsOutOfOrderError,
    RecordTooLargeError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from .native.jit import (
    kernel,
    load_i32,
    load_i64,
    load_u16,
)
from .record import batch_layout as B
from .record.records import (
    BatchStatus,
    Compression,
    batch_info,
    check_batch,
    check_inflated,
    check_produced_batch,
    encode_batch,
    iter_batches,
    now_ms,
    recompress_batch,
)
from .storage import index_layout as I
from .storage.durable_files import fsync_directory, write_atomically
from .storage.leader_epochs import LeaderEpochCache, epoch_starts
from .storage.log_segment import Segment
from .storage.producer_snapshots import (
    ProducerState,
    delete_snapshots,
    read_snapshot,
    snapshot_offsets,
    write_snapshot,
)
from .storage.segment_append import append_batches
from .storage.segment_generation import SegmentGeneration
from .storage.segment_read import ReadResult, collect_batches, find_batch
from .storage.segment_state import (
    APPENDED,
    CAPACITY_WORD,
    NEED_ROLL,
    NEXT_OFFSET_WORD,
    POSITION_WORD,
    REJECTED,
    TIMESTAMP_NONE,
)
from .storage.topic_config import TopicConfig

log = logging.getLogger(__name__)

__all__ = ["PartitionLog", "Segment", "AppendResult", "AppendTarget", "LogChange", "ReadResult",
           "RecoveryReport", "append_batches", "find_batch", "collect_batches",
           "warm_follower_kernels"]

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1
# Compaction writes cleaned segments here, then renames them into place; the
# manifest lists a swap in progress, so recovery can finish it (see replace_segments).
CLEANING_DIRECTORY = ".cleaning"
SWAP_MANIFEST_FILE = "cleaning-swap.json"

# The batch status the validating kernels return for a bad base offset.
_BAD_OFFSET = int(BatchStatus.BAD_OFFSET)

# --- the validating kernels ------------------------------------------------------------

@kernel
def _validate(source, start, end):
    """Validate appended batches: (status, position of the first bad one, batches,
    zstd batches, largest batch length)."""
    position = start
    count = 0
    compressed = 0
    largest = 0
    while position < end:
        status, length = check_produced_batch(source, position, end, True)
        if status != 0:
            return status, position, count, compressed, largest
        largest = max(largest, length)
        if load_u16(source, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK != B.CODEC_NONE:
            compressed += 1
        count += 1
        position += length
    return 0, position, count, compressed, largest


# _validate_replicated's status for a batch whose base is not past the batch before
# it (not a BatchStatus: the batch itself may be fine).
_OUT_OF_ORDER = -1


@kernel
def _validate_replicated(source, start, end):
    """Validate a follower's batches as stored batches (recovery's rules: compaction
    leaves sparse offset deltas) whose base offsets each follow the batch before:
    (status, position of the first bad one, batches, zstd batches, largest batch
    length, first base offset, the offset after the last batch). ``status`` is a
    :class:`BatchStatus`, or ``_OUT_OF_ORDER``."""
    position = start
    count = 0
    compressed = 0
    largest = 0
    first_base = np.int64(-1)
    next_offset = np.int64(-1)
    while position < end:
        status, length = check_batch(source, position, end, True, True)
        if status != 0:
            return status, position, count, compressed, largest, first_base, next_offset
        base_offset = load_i64(source, position + B.BASE_OFFSET_OFFSET)
        last_offset_delta = np.int64(load_i32(source, position + B.LAST_OFFSET_DELTA_OFFSET))
        if base_offset < 0 or base_offset >= limits.OFFSET_MAX - last_offset_delta:
            return _BAD_OFFSET, position, count, compressed, largest, first_base, next_offset
        if count and base_offset < next_offset:
            return _OUT_OF_ORDER, position, count, compressed, largest, first_base, next_offset
        if count == 0:
            first_base = base_offset
        next_offset = base_offset + last_offset_delta + 1
        largest = max(largest, length)
        if load_u16(source, position + B.ATTRIBUTES_OFFSET) & B.CODEC_MASK != B.CODEC_NONE:
            compressed += 1
        count += 1
        position += length
    return 0, position, count, compressed, largest, first_base, next_offset


# --- results ---------------------------------------------------------------------------

class AppendResult(NamedTuple):
    """Offsets given to an append: ``base_offset`` .. ``last_offset`` inclusive."""
    base_offset: int
    last_offset: int
    log_append_time: int          # -1 unless the topic uses LogAppendTime
    batch_count: int



class LogChange(enum.Enum):
    """What a :class:`PartitionLog` tells its listener changed (see
    :meth:`PartitionLog.set_listener`). Each one makes the writer's
    :class:`AppendTarget`, or the offsets it published, stale."""
    APPENDED = "appended"                  # append() took batches (and may have rolled)
    ROLLED = "rolled"                      # a new active segment, outside a change of files
    SEGMENT_FILES_CHANGING = "segment files changing"   # the generation turned odd or even:
    #   retention (or DeleteRecords' deletion), truncation or a compaction swap begins or
    #   ends; publish before returning
    LOG_START_MOVED = "log start moved"    # DeleteRecords
    CONFIG_CHANGED = "config changed"      # the target's limits and compiled flag may differ


class AppendTarget(NamedTuple):
    """Where a compiled writer appends to a partition: the active segment's mapped
    arrays and state, and the arguments :func:`append_batches` takes from the
    topic's configuration (:meth:`PartitionLog.append_target`).

    Valid until the log tells its listener of a change (:class:`LogChange`); the
    writer then takes a new one. After appending through it, the writer gives it
    back with :meth:`PartitionLog.appended_by_kernel`.
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


@dataclasses.dataclass
class RecoveryReport:
    """What opening a partition found and did."""
    recovery_point: int
    segments_scanned: int = 0
    truncated_path: str = ""
    truncated_position: int = -1
    truncated_bytes: int = 0
    truncated_reason: str = ""
    deleted_segments: list = dataclasses.field(default_factory=list)
    rebuilt_indexes: list = dataclasses.field(default_factory=list)
    corrupt_segments: list = dataclasses.field(default_factory=list)   # (path, position, reason)

    def cut(self, path: str, position: int, size: int, status: int) -> None:
        self.truncated_path = path
        self.truncated_position = position
        self.truncated_bytes = size
        self.truncated_reason = BatchStatus(status).name

    @property
    def clean(self) -> bool:
        return (self.truncated_bytes == 0 and not self.deleted_segments
                and not self.rebuilt_indexes and not self.corrupt_segments)


def _nonzero_extent(log_bytes: np.ndarray, start: int, end: int) -> int:
    """Bytes from ``start`` to the end of the last non-zero chunk before a zero
    chunk: how much a torn tail really held (a crashed active segment is a sparse
    file of full capacity, so the scan stops at the first all-zero chunk)."""
    chunk = 1 << 20
    extent = 0
    for position in range(start, end, chunk):
        window = log_bytes[position:min(position + chunk, end)]
        nonzero = np.flatnonzero(window)
        if not nonzero.size:
            break
        extent = position + int(nonzero[-1]) + 1 - start
    return extent


# --- the partition log ----------------------------------------------------------------

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
    """

    def __init__(self, directory: str, config: TopicConfig | None = None, *,
                 topic_id: str | None = None):
        self.directory = directory
        self._config = config or TopicConfig()
        self.topic_id = topic_id
        # The partition's writer, told of every change (see set_listener).
        self._listener: Callable[[LogChange], None] | None = None
        # Moves whenever the set of segment files changes (readers list it again then).
        self._generation = SegmentGeneration(directory)
        try:
            access.make_directories(directory)
        except OSError as error:
            raise StorageError(f"cannot create {directory}: {error}") from error
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._flush_retry_ms = 0           # no flush before this (the last one failed)
        checkpoint = self._read_checkpoint()
        self.recovery_point = checkpoint.get("recovery_point", 0)
        self.log_start_offset = checkpoint.get("log_start_offset", 0)
        # Where the last compaction stopped: records below it are clean.
        self.clean_offset = checkpoint.get("clean_offset", 0)
        self._finish_swap()
        # The leader epochs (see leader_epochs); this log's own paths keep it right.
        self.epochs = LeaderEpochCache(directory)
        # The producers' last batches below the active segment (producer_snapshots).
        self._producers = ProducerState()
        recovery_point = self.recovery_point
        self.recovery_report = self._open()
        self._load_epochs(recovery_point)
        self._load_producers()

    # -- properties ------------------------------------------------------------------
    @property
    def config(self) -> TopicConfig:
        """The topic's effective configuration; setting it tells the listener
        (``LogChange.CONFIG_CHANGED``: the append target's limits moved)."""
        return self._config

    @config.setter
    def config(self, config: TopicConfig) -> None:
        self._config = config
        self._tell(LogChange.CONFIG_CHANGED)

    @property
    def generation(self) -> int:
        """The segment generation (see ``segment_generation``): even while the set of
        segment files is stable, odd while a change removes or replaces files."""
        return self._generation.value

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(segment.size for segment in self._segments)

    # -- opening and recovery --------------------------------------------------------
    def _segment_bases(self) -> list[int]:
        bases = []
        for name in os.listdir(self.directory):
            stem, suffix = os.path.splitext(name)
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.directory, name))
            elif suffix == I.LOG_SUFFIX and stem.isdigit() and len(stem) == I.FILE_NAME_DIGITS:
                if int(stem) > limits.OFFSET_MAX:
                    log.warning("%s: ignoring %s, its base offset is out of range",
                                self.directory, name)
                    continue
                bases.append(int(stem))
        bases.sort()
        # Index files whose log is gone (a deletion cut short) are removed.
        for name in os.listdir(self.directory):
            stem, suffix = os.path.splitext(name)
            if suffix in (I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX) and stem.isdigit() \
                    and int(stem) not in bases:
                os.unlink(os.path.join(self.directory, name))
        return bases

    def _open(self) -> RecoveryReport:
        report = RecoveryReport(recovery_point=self.recovery_point)
        bases = self._segment_bases()
        if not bases:
            self._add_segment(max(self.log_start_offset, self.recovery_point))
            return report
        for index, base in enumerate(bases):
            segment = Segment(self.directory, base, self.config, active=False)
            self._segments.append(segment)
            self._bases.append(base)
            last = index == len(bases) - 1
            if not last and bases[index + 1] <= self.recovery_point:
                self._load_flushed(segment, report)
            elif last and segment.load_closed() and segment.next_offset == self.recovery_point:
                self._reactivate_last()              # closed cleanly: nothing to scan
            elif not self._recover_segment(segment, last, bases[index + 1:], report):
                break
        self.log_start_offset = max(self.log_start_offset, self._bases[0])
        if self.log_start_offset > self.log_end_offset:
            # Unflushed data below a checkpointed start offset was lost: Kafka's answer
            # is an empty log that starts there.
            log.warning("%s: log start %d is past the recovered end %d; restarting the log "
                        "empty at %d", self.directory, self.log_start_offset,
                        self.log_end_offset, self.log_start_offset)
            self.truncate_fully_and_start_at(self.log_start_offset)
        if not report.clean:
            log.warning("recovered %s: %s", self.directory, report)
        return report

    def _load_flushed(self, segment: Segment, report: RecoveryReport) -> None:
        """A segment below the recovery point: trust its data, check its indexes."""
        if segment.load_closed():
            return
        report.rebuilt_indexes.append(segment.log_path)
        status, end = segment.rebuild()
        if status != 0:
            # Flushed data is damaged, not torn: keep it, so reads report the damage
            # (CorruptSegmentError) instead of the log silently losing it.
            segment.damaged_at = end
            report.corrupt_segments.append((segment.log_path, end, BatchStatus(status).name))

    def _recover_segment(self, segment: Segment, last: bool, later_bases: list[int],
                         report: RecoveryReport) -> bool:
        """Scan a segment at or above the recovery point. False when it was cut (and
        every later segment deleted): it is then the active segment."""
        report.segments_scanned += 1
        segment.close()
        file_size = self._log_file_size(segment)
        segment.active = last
        status, valid_end = segment.rebuild(file_size if last else None)
        if last:
            torn_bytes = _nonzero_extent(segment.log, valid_end, file_size)
            segment.truncate_tail(valid_end)
            if torn_bytes:
                report.cut(segment.log_path, valid_end, torn_bytes, status)
            return True
        if status == 0:
            return True
        report.cut(segment.log_path, valid_end, file_size - valid_end, status)
        # Later segments go first: a crash in between must not leave a gap in offsets.
        for base in later_bases:
            doomed = Segment(self.directory, base, self.config, active=False)
            report.deleted_segments.append(doomed.log_path)
            report.truncated_bytes += self._log_file_size(doomed)
            doomed.delete()
        segment.state[POSITION_WORD] = valid_end       # reopening zeroes what follows
        self._reactivate_last()
        return False

    @staticmethod
    def _log_file_size(segment: Segment) -> int:
        return os.stat(segment.log_path).st_size

    def _reactivate_last(self) -> None:
        """Make the last (sealed) segment the active one again, keeping the state its
        files gave. (A full index makes the next append roll it.)"""
        self.active.reopen_for_append()

    def _add_segment(self, base_offset: int) -> Segment:
        """A new, empty active segment holding no blocks (an idle partition holds
        none; the first append reserves)."""
        segment = Segment.create(self.directory, base_offset, self.config)
        self._segments.append(segment)
        self._bases.append(base_offset)
        return segment

    def _load_epochs(self, recovery_point: int) -> None:
        """Make the leader-epoch cache agree with the log just opened (Kafka's ``Log``
        load): rebuilt from every batch header when its file was missing or bad;
        else taught the epochs of the batches at and above ``recovery_point`` (the
        unflushed part, whose epochs a crash may have kept out of the file); then
        cut to the recovered log end and to the log start."""
        if self.epochs.needs_rebuild:
            self.epochs.rebuild(self._scan_epochs(self.log_start_offset, -1))
        else:
            for epoch, start in self._scan_epochs(recovery_point, self.epochs.latest_epoch):
                self.epochs.assign(epoch, start)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.epochs.truncate_from_start(self.log_start_offset)

    def _scan_epochs(self, offset: int, latest_epoch: int) -> list[tuple[int, int]]:
        """Where the epoch rises above ``latest_epoch`` and every epoch before it, in
        the batches from the one holding ``offset`` to the log end (batch headers
        only; a walk stops at damage and goes on in the next segment)."""
        found: list[tuple[int, int]] = []
        first = max(self._segment_for(offset), 0)
        for index, segment in enumerate(self._segments[first:]):
            position = segment.position_of(offset) if index == 0 else 0
            found += epoch_starts(segment.log, position, segment.size, latest_epoch)
            if found:
                latest_epoch = found[-1][0]
        return found

    def _load_producers(self) -> None:
        """The producer state below the active segment: its snapshot, or the latest
        one below it and a walk of the segments after that (from the log start if
        there is none), written as its snapshot for the next open. Snapshots past
        the active segment (of segments recovery or truncation removed) go."""
        active_base = self.active.base_offset
        offsets = snapshot_offsets(self.directory)
        delete_snapshots(self.directory, [offset for offset in offsets if offset > active_base])
        rows, start = None, -1
        for offset in reversed([offset for offset in offsets if offset <= active_base]):
            rows = read_snapshot(self.directory, offset)
            if rows is not None:
                start = offset
                break
        self._producers = ProducerState(rows)
        if start == active_base:
            return
        for segment in self._segments[:-1]:
            if segment.next_offset > start:
                self._producers.remember(segment.log, 0, segment.size, start)
        if len(self._segments) > 1:               # walked: the next open need not
            self._write_producer_snapshot(active_base)

    def _write_producer_snapshot(self, offset: int) -> None:
        """Write the producer state as the snapshot at ``offset``, forgetting first the
        producers whose last batch lies below the log start (Kafka's eviction), so
        neither the state nor its snapshots grow with every producer ever seen."""
        rows = self._producers.rows(self.log_start_offset)
        if len(rows) < len(self._producers):
            self._producers = ProducerState(rows)
        try:
            write_snapshot(self.directory, offset, rows)
        except StorageError as error:
            # Only a shortcut: the next open walks from the snapshot before it.
            log.warning("%s: producer snapshot at %d not written (%s)", self.directory, offset,
                        error)

    def producer_batches(self) -> np.ndarray:
        """The last batch of each idempotent producer in the log (those wholly below
        the log start forgotten), one int64 row each in ``producer_snapshots``'
        columns: producer id, epoch, base sequence, base offset, last offset delta.
        What the appender remembers at open and after a truncation: the snapshot
        below the active segment and a walk of the active segment."""
        state = self._producers.copy()
        active = self.active
        state.remember(active.log, 0, active.size)
        return state.rows(self.log_start_offset)

    # -- the writer's contract --------------------------------------------------------
    def set_listener(self, listener: Callable[[LogChange], None] | None) -> None:
        """Tell ``listener`` (the partition's writer; None: nobody) of every change
        that invalidates its :class:`AppendTarget` or the offsets it published, at
        once, with what changed (a :class:`LogChange`). The listener takes a new
        target and publishes the partition again; for
        ``LogChange.SEGMENT_FILES_CHANGING`` it must publish before it returns (the
        seqlock, see ``segment_generation``). It must not change the log itself."""
        self._listener = listener

    def _tell(self, change: "LogChange") -> None:
        if self._listener is not None:
            self._listener(change)

    def append_target(self) -> "AppendTarget":
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

    def appended_by_kernel(self, target: "AppendTarget", message_count: int,
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
            self.epochs.assign(leader_epoch, segment.next_offset - message_count)
        segment.prefault_ahead()
        self._after_append(message_count)

    # -- checkpoint --------------------------------------------------------------------
    def _read_checkpoint(self) -> dict:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        try:
            with open(path) as source:
                checkpoint = json.load(source)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("ignoring unreadable %s (%s): recovering from offset 0", path, error)
            return {}
        if not isinstance(checkpoint, dict) or checkpoint.get("version") != CHECKPOINT_VERSION:
            log.warning("ignoring %s: not a version-%d checkpoint", path, CHECKPOINT_VERSION)
            return {}
        values = {key: checkpoint.get(key) for key in ("recovery_point", "log_start_offset")}
        values["clean_offset"] = checkpoint.get("clean_offset", 0)
        if not all(isinstance(value, int) and not isinstance(value, bool)
                   and 0 <= value <= limits.OFFSET_MAX for value in values.values()):
            log.warning("ignoring %s: offsets out of range (%s)", path, values)
            return {}
        return values

    def _write_checkpoint(self) -> None:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        body = json.dumps({"version": CHECKPOINT_VERSION, "recovery_point": self.recovery_point,
                           "log_start_offset": self.log_start_offset,
                           "clean_offset": self.clean_offset})
        write_atomically(path, body)

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
        config = self._config
        source = self._as_source(batches)
        status, bad_position, count, compressed, largest = _validate(source, 0, source.size)
        self._check_validated(status, bad_position, count, largest)
        if compressed:
            self._check_compressed(source)
        source = self._apply_compression_type(source)
        append_time = (now_ms() if config.message_timestamp_type == "LogAppendTime"
                       else TIMESTAMP_NONE)
        base_offset = self.log_end_offset
        if base_offset > limits.OFFSET_MAX - count * limits.BATCH_RECORD_COUNT_MAX:
            raise OffsetOverflowError(
                f"{self.directory}: {count} more batches could take offsets past "
                f"{limits.OFFSET_MAX} (the log end is {base_offset})")
        try:
            self._append_validated(source, append_time, leader_epoch)
        finally:
            # Even a failing append may have appended batches before the one that
            # failed, or rolled: the listener publishes whatever the log now holds.
            if self._listener is not None:          # (inline: once per append)
                self._listener(LogChange.APPENDED)
            # Kafka's maybeAssignEpochStartOffset, before the flush policy runs.
            if leader_epoch > self.epochs.latest_epoch and self.log_end_offset > base_offset:
                self.epochs.assign(leader_epoch, base_offset)
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
        UnexpectedAppendOffsetError
            The first base offset is below the log end; nothing was appended.
        OffsetsOutOfOrderError
            A batch's base offset is not past the batch before it; nothing was
            appended.
        CorruptRecordError
            A batch is malformed; nothing was appended.
        RecordTooLargeError
            A batch exceeds ``max.message.bytes``; nothing was appended.
        StorageError
            The disk is full or failed; nothing of the failing batch was appended.
        """
        source = self._as_source(batches)
        status, bad_position, count, compressed, largest, first_base, next_offset = \
            _validate_replicated(source, 0, source.size)
        self._check_validated(status, bad_position, count, largest)
        if first_base < self.log_end_offset:
            raise UnexpectedAppendOffsetError(
                f"{self.directory}: a follower's append starts at offset {first_base}, below "
                f"the log end {self.log_end_offset}; nothing was appended",
                status=int(BatchStatus.BAD_OFFSET), position=0)
        if compressed:
            self._check_compressed(source)
        try:
            self._append_validated(source, TIMESTAMP_NONE, -1, True)
        finally:
            if self._listener is not None:
                self._listener(LogChange.APPENDED)
            for epoch, start in epoch_starts(source, 0, source.size, self.epochs.latest_epoch,
                                             increases_only=False):
                if start < self.log_end_offset:        # appended (all, unless it failed)
                    self.epochs.assign(epoch, start)
        self._after_append(int(next_offset - first_base))
        return AppendResult(int(first_base), int(next_offset) - 1, -1, int(count))

    def _as_source(self, batches) -> np.ndarray:
        source = batches if isinstance(batches, np.ndarray) else np.frombuffer(batches, np.uint8)
        if source.dtype != np.uint8 or source.ndim != 1 or not source.flags.c_contiguous:
            raise CorruptRecordError("batches must be a contiguous 1-D uint8 buffer")
        return source

    def _check_validated(self, status: int, bad_position: int, count: int, largest: int) -> None:
        """Raise what a validating walk found (see :meth:`append`)."""
        if status == _OUT_OF_ORDER:
            raise OffsetsOutOfOrderError(
                f"{self.directory}: the batch at byte {bad_position} of a follower's append "
                f"does not start past the batch before it; nothing was appended",
                status=int(BatchStatus.BAD_OFFSET), position=int(bad_position))
        if status != 0 or count == 0:
            reason = BatchStatus(status).name if count or status else "EMPTY"
            raise CorruptRecordError(
                f"{self.directory}: rejected batch at byte {bad_position} of the append: "
                f"{reason}; nothing was appended", status=int(status), position=int(bad_position))
        if largest > self._config.batch_size_max:
            config = self._config
            raise RecordTooLargeError(
                f"{self.directory}: a batch of {largest} bytes exceeds the limit of "
                f"{config.batch_size_max} (max.message.bytes="
                f"{config.max_message_bytes}, segment.bytes={config.segment_bytes}); "
                f"nothing was appended: send smaller batches or raise max.message.bytes")

    def _append_validated(self, source: np.ndarray, append_time: int, leader_epoch: int,
                          keep_offsets: bool = False) -> None:
        """Copy validated batches in through :func:`append_batches`, rolling and
        reserving as it asks (with ``keep_offsets``, a roll starts the new segment
        at the base offset of the batch that asked for it, as Kafka's follower
        rolls at the batch's first offset)."""
        config = self._config
        position = 0
        while True:
            segment = self._segments[-1]
            # Bytes this process appended were validated on the way in; they extend the
            # verified prefix only where it already reaches the end.
            verified = segment.verified_end >= segment.size
            # A segment mapped before segment.bytes was lowered or raised keeps its size.
            segment_bytes = min(config.segment_bytes, int(segment.state[CAPACITY_WORD]))
            status, position, _ = append_batches(
                source, position, source.size, segment.log, segment.offset_index_bytes,
                segment.time_index_bytes, segment.state, segment_bytes, config.segment_ms,
                config.index_interval_bytes, append_time, leader_epoch, False, keep_offsets)
            assert status != REJECTED, "the source was validated and is private"
            if verified:
                segment.verified_end = segment.size
            if status == APPENDED:
                break
            length = int(source[position + B.BATCH_LENGTH_OFFSET:][:B.BATCH_LENGTH_SIZE]
                         .view("<u4")[0])
            if status == NEED_ROLL:
                self._roll(length, int(source[position:position + B.HEADER_LENGTH]
                                       .view(B.BATCH_HEADER_DTYPE)[0]["base_offset"])
                           if keep_offsets else None)
            else:
                segment.make_room(length, config.index_interval_bytes)
        self.active.prefault_ahead()

    def _apply_compression_type(self, source: np.ndarray) -> np.ndarray:
        """Recompress batches whose codec differs from ``compression.type`` (unless it
        is "producer", which keeps what the producer sent)."""
        wanted = self.config.compression_type
        if wanted == "producer":
            return source
        codec = Compression.parse(wanted)
        infos = list(iter_batches(source))
        if all(info.compression is codec for info in infos):
            return source
        converted = [recompress_batch(source, info, codec) for info in infos]
        largest = max(batch.size for batch in converted)
        if largest > self.config.batch_size_max:
            raise RecordTooLargeError(
                f"{self.directory}: stored as compression.type={wanted}, a batch would be "
                f"{largest} bytes, over the limit of {self.config.batch_size_max}; nothing "
                f"was appended")
        return np.concatenate(converted)

    def _check_compressed(self, source: np.ndarray) -> None:
        position = 0
        while position < source.size:
            info = batch_info(source, position)       # _validate framed every batch
            if info.compression is Compression.ZSTD:
                check_inflated(source, info)
            position += info.batch_length

    def _after_append(self, message_count: int) -> None:
        self._unflushed_messages += message_count
        self.maybe_flush()

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
        if self._unflushed_messages >= self._config.flush_messages or \
                now - self._last_flush_ms >= self._config.flush_ms:
            try:
                self.flush()
            except StorageError as error:
                self._flush_retry_ms = now + limits.FLUSH_RETRY_INTERVAL_MS
                log.warning("%s: flush failed (%s); trying again in %d ms", self.directory,
                            error, limits.FLUSH_RETRY_INTERVAL_MS)
                return False
            return True
        return False

    def roll(self, log_reserved: int = 0) -> Segment:
        """Seal the active segment and start a new one at the log end offset, with
        blocks for its first ``log_reserved`` bytes reserved (a whole step; an
        append that needs a roll asks for its batch) before anything changes.

        Tells the listener (``LogChange.ROLLED``), unless the roll is part of a
        change of the segment files, whose end tells it.

        Raises
        ------
        StorageError
            The disk is full or failed: the active segment is still the active one,
            unchanged, and the next roll tries again.
        """
        if self.active.size == 0:
            return self.active
        segment = self._roll(log_reserved)
        if not self._generation.changing_now:
            self._tell(LogChange.ROLLED)
        return segment

    def _roll(self, log_reserved: int, base_offset: int | None = None) -> Segment:
        """:meth:`roll` of the active segment, telling nobody; the new segment starts
        at ``base_offset`` (a follower's batch past a gap), default the log end."""
        base = self.log_end_offset if base_offset is None else base_offset
        assert base >= self.log_end_offset, "a segment never starts below the log end"
        segment = Segment.create(self.directory, base, self.config, log_reserved)
        try:
            self.active.close_for_append()
        except StorageError:
            segment.delete()
            raise
        sealed = self.active
        self._segments.append(segment)
        self._bases.append(base)
        self._generation.rolled()
        # Kafka's snapshot at each roll: every producer's last batch below the new base.
        self._producers.remember(sealed.log, 0, sealed.size)
        self._write_producer_snapshot(base)
        if log_reserved:
            segment.prefault_ahead()       # appends are under way: keep ahead of them
        return segment

    def flush(self) -> None:
        """msync every unflushed segment, then advance the recovery point.

        Raises
        ------
        StorageError
            The sync or the checkpoint failed; the recovery point did not move.
        """
        for segment in self._segments:
            if segment.flushed_end < segment.size:
                segment.sync()
        fsync_directory(self.directory)
        # Every epoch of what the recovery point passes is in the epochs' file (a
        # reopen learns epochs only from above the recovery point).
        self.epochs.flush()
        previous, self.recovery_point = self.recovery_point, self.log_end_offset
        try:
            self._write_checkpoint()
        except StorageError:
            self.recovery_point = previous
            raise
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()

    # -- reading ----------------------------------------------------------------------
    def _segment_for(self, offset: int) -> int:
        return bisect.bisect_right(self._bases, offset) - 1

    def _out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"{self.directory}: offset {offset} is outside the log "
            f"[{self.log_start_offset}, {self.log_end_offset}]; seek to a valid offset "
            f"(auto_offset_reset chooses one)", offset=offset,
            log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset)

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
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise self._out_of_range(offset)
        upper = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        index = self._segment_for(offset)
        empty = np.zeros(0, np.uint8)
        while 0 <= index < len(self._segments):
            segment = self._segments[index]
            position = segment.position_of(offset)
            if position < segment.size:
                break
            index += 1            # offset lies in a gap after this segment's last batch
        else:
            return ReadResult(empty, offset, self.active.base_offset)
        end, next_offset, segment.verified_end = collect_batches(
            segment.log, segment.log_path, position, segment.size, max_bytes, upper,
            segment.verified_end, offset)
        if next_offset < 0:
            return ReadResult(empty, offset, segment.base_offset)
        return ReadResult(segment.log[position:end], int(next_offset), segment.base_offset)

    def offset_for_timestamp(self, timestamp: int):
        """(offset, timestamp) of the first record whose timestamp is >= ``timestamp``,
        or None when there is none (Kafka's ``offsetsForTimes``).

        Segments are found by binary search over the running maximum of their
        largest timestamps (the first segment whose maximum reaches ``timestamp``
        holds the answer), then through the segment's time index.
        """
        running = np.maximum.accumulate([segment.max_timestamp for segment in self._segments])
        first = int(np.searchsorted(running, timestamp, side="left"))
        found = None
        for searched, segment in enumerate(self._segments[first:], first):  # noqa: B007 - read after
            if segment.max_timestamp < timestamp or segment.next_offset <= self.log_start_offset:
                continue
            found = segment.offset_for_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                break
        else:
            searched = len(self._segments) - 1
        # A damaged segment's timestamps past its damage are unknown: the answer could
        # be in there, so any answer after it would be a guess.
        for segment in self._segments[:searched + 1]:
            if segment.damaged_at >= 0 and segment.next_offset > self.log_start_offset:
                raise CorruptSegmentError(
                    f"{segment.log_path}: damaged from byte {segment.damaged_at}; records "
                    f"there may hold timestamp {timestamp}", path=segment.log_path,
                    position=segment.damaged_at)
        return found

    # -- retention and truncation -------------------------------------------------------
    def delete_old_segments(self, now: int | None = None,
                            high_watermark: int | None = None) -> list[int]:
        """Apply ``retention.ms``, ``retention.bytes`` and the log start offset.

        Only whole segments below ``high_watermark`` (default: the log end) go.
        Returns the base offsets of the deleted segments.
        """
        now = now_ms() if now is None else now
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        by_retention = self.config.delete       # a compact-only topic keeps every key

        def expired(segment: Segment, total: int) -> bool:
            expired_by_time = by_retention and retention_ms >= 0 and \
                segment.age_timestamp() < now - retention_ms
            over_size = (by_retention and retention_bytes >= 0 and segment is not self.active
                         and total - segment.size >= retention_bytes)
            return expired_by_time or over_size

        return self._delete_front_segments(
            self.log_end_offset if high_watermark is None else high_watermark, expired)

    def _delete_front_segments(self, high_watermark: int,
                               expired: Callable[[Segment, int], bool]) -> list[int]:
        """Delete segments from the front while each lies wholly below the log start
        or ``expired(segment, bytes of the log left)`` says so, and below
        ``high_watermark``; the base offsets of those deleted."""
        deleted = []
        total = self.size
        with contextlib.ExitStack() as changing:
            while self._segments:
                segment = self._segments[0]
                if segment.size == 0 and segment is self.active or \
                        segment.next_offset > high_watermark:
                    break
                below_start = segment is not self.active and self._bases[1] <= self.log_start_offset
                if not (below_start or expired(segment, total)):
                    break
                if not deleted:
                    # Odd before the first file goes; a check that deletes nothing
                    # leaves the generation (and every reader's mappings) alone.
                    changing.enter_context(self._segments_changing())
                if segment is self.active:
                    self.roll()       # an expired active segment is sealed, then deleted
                total -= segment.size
                deleted.append(segment.base_offset)
                self._segments.pop(0)
                self._bases.pop(0)
                segment.delete()
            if deleted:
                self.log_start_offset = max(self.log_start_offset, self._bases[0])
                self.epochs.truncate_from_start(self.log_start_offset)
                delete_snapshots(self.directory, [offset for offset in snapshot_offsets(
                    self.directory) if offset < self._bases[0]])
                try:
                    self._write_checkpoint()
                except StorageError as error:
                    # Harmless: an open takes the log start from the first segment.
                    log.warning("%s: retention's checkpoint not written (%s)", self.directory,
                                error)
        return deleted

    def _segments_changing(self):
        """Bracket a change that removes or replaces segment files (the seqlock's
        writer side, see ``segment_generation``): the listener publishes the odd
        generation before the first file operation and the even one after the last
        (``LogChange.SEGMENT_FILES_CHANGING``), when every other field it publishes
        has its new value."""
        return self._generation.changing(lambda: self._tell(LogChange.SEGMENT_FILES_CHANGING))

    # -- compaction ----------------------------------------------------------------------
    def replace_segments(self, cleaning) -> bool:
        """Swap in the cleaned segments of a :class:`cleaner.Cleaning`; False (and
        nothing changed but its cleaned files thrown away) when it was planned for
        another topic of the same name (deleted and created again meanwhile) or the
        segments it cleaned changed since it was planned.

        Each cleaned segment is renamed over the first segment of its group; once
        every group's are in place, the groups' other segments are deleted. A
        reader that maps the directory in between sees a cleaned segment and old
        ones holding the same offsets: both are valid copies of the records. A
        manifest made durable before the first rename lets recovery finish a swap
        a crash interrupted (:meth:`_finish_swap`).

        The generation is odd for the whole swap (see :meth:`_segments_changing`): a
        reader listing the directory meanwhile could find the old first segment of
        a group but not the others (already deleted), and step over offsets that
        only the cleaned copy holds; the odd generation tells it to list again later.
        """
        discard = os.path.join(self.directory, CLEANING_DIRECTORY)
        if cleaning.topic_id != self.topic_id:
            # Same directory, same layout maybe, but the records of another topic:
            # the cleaner's offset map (or the files it read) were the old topic's.
            log.warning("%s: refusing a cleaning planned for topic id %s (the topic is now "
                        "%s)", self.directory, cleaning.topic_id, self.topic_id)
            shutil.rmtree(discard, ignore_errors=True)
            return False
        current = {segment.base_offset: segment for segment in self._segments[:-1]}
        for planned in cleaning.plan.segments:
            segment = current.get(planned.base_offset)
            if planned.next_offset > cleaning.end_offset:
                break
            if segment is None or segment.size != planned.size:
                shutil.rmtree(discard, ignore_errors=True)
                return False
        write_swap_manifest(self.directory, cleaning.groups)     # changes no segment file
        with self._segments_changing():
            replaced = {base for group in cleaning.groups for base in group.replaces}
            for base in replaced:
                current[base].close()            # the broker's own mappings of the old files
            self._finish_swap()
            cleaned = {group.base_offset for group in cleaning.groups}
            segments = []
            for segment in self._segments:
                if segment.base_offset in cleaned:
                    segment = Segment(self.directory, segment.base_offset, self.config,
                                      active=False)
                    if not segment.load_closed():
                        segment.rebuild()
                elif segment.base_offset in replaced:
                    continue
                segments.append(segment)
            self._segments = segments
            self._bases = [segment.base_offset for segment in segments]
            self.clean_offset = cleaning.end_offset
            self._write_checkpoint()
        return True

    def _finish_swap(self) -> None:
        """Complete a swap of cleaned segments that the manifest says was begun, or
        throw away cleaned files that never got that far.

        Every step is durable before the next one starts, and each can run again
        after a crash: the cleaned files of every group are renamed into place and
        the directory fsynced before the first replaced segment is deleted (until
        then the old segments hold every record); the deletions are fsynced before
        the manifest, which would redo them, goes; and its removal is fsynced, so a
        manifest never comes back to replay an old swap over a later cleaning.
        """
        manifest_path = os.path.join(self.directory, SWAP_MANIFEST_FILE)
        cleaning = os.path.join(self.directory, CLEANING_DIRECTORY)
        committed = True
        try:
            with open(manifest_path) as source:
                groups = json.load(source)["groups"]
        except FileNotFoundError:
            groups, committed = [], False
        except (OSError, ValueError, KeyError, TypeError) as error:
            # The manifest is written atomically after the cleaned files are on disk:
            # unreadable, it was never committed, and the old segments are intact.
            log.warning("%s: ignoring unreadable %s (%s)", self.directory, manifest_path, error)
            groups = []
        if groups:
            for group in groups:
                base = int(group["base_offset"])
                # The log last: whoever maps the cleaned log finds its indexes in
                # place (a reader still checks an index entry against its log).
                for suffix in (I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX, I.LOG_SUFFIX):
                    name = I.segment_file_name(base, suffix)
                    if os.path.exists(os.path.join(cleaning, name)):
                        os.replace(os.path.join(cleaning, name), os.path.join(self.directory, name))
            fsync_directory(self.directory)
            for group in groups:
                base = int(group["base_offset"])
                for replaced in group["replaces"]:
                    if int(replaced) != base:
                        Segment(self.directory, int(replaced), self.config, active=False).delete()
            fsync_directory(self.directory)
        shutil.rmtree(cleaning, ignore_errors=True)
        if committed:
            try:
                os.unlink(manifest_path)
            except FileNotFoundError:
                pass
            fsync_directory(self.directory)

    def advance_log_start_offset(self, offset: int) -> list[int]:
        """Kafka's DeleteRecords (``maybeIncrementLogStartOffset``): records below
        ``offset`` become unreadable, and the segments wholly below it are deleted
        (Kafka leaves those to its next retention check; here the disk is freed
        when this returns). The new start is checkpointed before any file goes, so
        it survives a crash or a restart. An ``offset`` at the log start changes
        nothing. Returns the base offsets of the deleted segments.

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below the log start (it never moves back) or past the log
            end. (The high watermark bound is the caller's: ``delete_records``.)
        """
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise self._out_of_range(offset)
        if offset == self.log_start_offset:
            return []
        self.log_start_offset = offset
        self._write_checkpoint()
        self.epochs.truncate_from_start(offset)
        self._tell(LogChange.LOG_START_MOVED)
        return self._delete_front_segments(offset, lambda segment, total: False)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset`` (replication's
        truncation). Batches are atomic: a batch straddling ``offset`` goes whole.
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
        with self._segments_changing():
            while len(self._segments) > 1 and self._bases[-1] >= offset:
                self._segments.pop().delete()
                self._bases.pop()
                self._reactivate_last()
            segment = self.active
            position = segment.position_of(offset)
            if position < segment.size:
                first_dropped = batch_info(segment.log, position).base_offset
                segment.truncate(position)
                # A gap left by compaction before the dropped batch stays part of the log.
                segment.state[NEXT_OFFSET_WORD] = max(segment.next_offset,
                                                      min(offset, first_dropped))
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self._write_checkpoint()
        self.epochs.truncate_from_end(self.log_end_offset)
        self._load_producers()            # the active segment may be an older one now
        return self.log_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset`` (a follower
        below its leader's log start: Kafka's ``truncateFullyAndStartAt``); the
        leader-epoch cache is cleared."""
        with self._segments_changing():
            for segment in self._segments:
                segment.delete()
            self._segments.clear()
            self._bases.clear()
            self._add_segment(offset)
            self.log_start_offset = offset
            self.recovery_point = offset
            self._write_checkpoint()
        self.epochs.clear()
        delete_snapshots(self.directory, snapshot_offsets(self.directory))
        self._producers = ProducerState()

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
        for segment in self._segments:
            segment.close()
        self._segments.clear()
        self._bases.clear()

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


def write_swap_manifest(directory: str, groups) -> None:
    """Commit a swap of cleaned segments (``cleaner.CleanedGroup``s): from here on,
    :meth:`PartitionLog._finish_swap` completes it, even after a crash.

    The cleaner fsynced the cleaned files' data; their names are made durable first
    (the cleaning directory, then the partition directory that holds it), because a
    manifest that survives a crash without them would have recovery delete replaced
    segments with nothing renamed in their place. The partition directory is fsynced
    again after the manifest, so it is on disk before the first rename.
    """
    fsync_directory(os.path.join(directory, CLEANING_DIRECTORY))
    fsync_directory(directory)
    manifest = [{"base_offset": group.base_offset, "replaces": list(group.replaces)}
                for group in groups]
    write_atomically(os.path.join(directory, SWAP_MANIFEST_FILE),
                     json.dumps({"version": CHECKPOINT_VERSION, "groups": manifest}))
    fsync_directory(directory)

