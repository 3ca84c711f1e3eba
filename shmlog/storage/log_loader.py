"""Opening a partition's directory (Kafka's ``LogLoader``): finish an interrupted
compaction swap, adopt the segments the last flush covered, scan the ones it did
not, cut a torn tail, and bring the leader-epoch cache into agreement with what
was recovered; a :class:`RecoveryReport` says what was found and done.

Rules
-----
* Nothing acknowledged and flushed is ever cut: a segment below the recovery point
  that fails its check is kept, and marked damaged (reads of it report the damage,
  :class:`CorruptSegmentError`, instead of the log silently losing it).
* Above the recovery point, the log is cut at the first invalid batch (a torn
  write): the rest of that segment and every later segment go, later ones first, so
  a crash in between never leaves a gap in offsets.
* What the loader leaves is a log whose last segment is active and whose log start
  is at most its end (else the log restarts empty at the checkpointed log start,
  as Kafka does when unflushed data below it was lost).

Theory of operation
-------------------
``checkpoint.json`` holds the recovery point, the offset below which everything
was flushed. On open, every segment holding offsets at or above it is scanned
batch by batch (CRC32C and structure, ``segment_append.rescan``; an active
segment's scan ends at its file's first hole, ``SEEK_HOLE``: what was never
written holds no batch); the log is truncated at the first invalid batch, later
segments are deleted, the indexes of scanned segments are rebuilt, their
transaction indexes cut to the recovered end (an aborted transaction whose marker
was lost goes with it), and the report says what was cut. An abort whose marker
survived but whose entry did not (an OS crash keeps what the kernel wrote back) is
indexed again from a walk of its segment (``PartitionLog``: the active segment's
by ``producer_state``, the closed ones' at open). The producer state is
loaded after, from the recovered log (``PartitionLog``, ``producer_snapshots``): a
transaction whose marker was cut off is open again
(``tests/unit/test_log_recovery_transactions.py`` cuts a log at every byte). Indexes of older
segments get a sanity check (``Segment.load_closed``) and are rebuilt when they
fail it. A last segment closed cleanly (its end is the recovery point) is adopted
without a scan.

The leader-epoch cache is then rebuilt from every batch header when its file was
missing or bad; else it learns the epochs of the batches at and above the
recovery point (the unflushed part, whose epochs a crash may have kept out of its
file); then it is cut to the recovered log end and to the log start.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from ..common import limits
from ..record.records import BatchStatus
from . import index_layout as I
from .leader_epochs import LeaderEpochCache, epoch_starts
from .local_log import LocalLog, finish_swap
from .log_segment import Segment
from .segment_state import POSITION_WORD

log = logging.getLogger(__name__)

__all__ = ["LogLoader", "RecoveryReport"]


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


class LogLoader:
    """Loads the segments of ``local_log``'s directory into it (its segment list
    empty, its checkpoint read), recovering what a crash left, and makes the
    leader-epoch cache ``epochs`` agree with the result.

    Parameters
    ----------
    local_log : LocalLog
        The log to load, as just made.
    epochs : LeaderEpochCache
        The partition's leader-epoch cache, as read from its file.
    restart_at : callable
        ``restart_at(offset)`` empties the whole log (and every state that follows
        it) and starts it at ``offset``: what ``PartitionLog.truncate_fully_and_start_at``
        does.
    """

    def __init__(self, local_log: LocalLog, epochs: LeaderEpochCache, restart_at):
        self._local_log = local_log
        self._epochs = epochs
        self._restart_at = restart_at
        self.directory = local_log.directory

    def load(self) -> RecoveryReport:
        """Finish a swap a crash interrupted, open the segments, recover what is above
        the recovery point, and load the leader epochs. Returns what was done."""
        local_log = self._local_log
        finish_swap(self.directory, local_log.config)
        recovery_point = local_log.recovery_point
        report = self._open()
        self._load_epochs(recovery_point)
        return report

    # -- segments ----------------------------------------------------------------------
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
            if suffix in (I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX, I.TXN_INDEX_SUFFIX) \
                    and stem.isdigit() and int(stem) not in bases:
                os.unlink(os.path.join(self.directory, name))
        return bases

    def _open(self) -> RecoveryReport:
        local_log = self._local_log
        report = RecoveryReport(recovery_point=local_log.recovery_point)
        bases = self._segment_bases()
        if not bases:
            local_log.add_segment(max(local_log.log_start_offset, local_log.recovery_point))
            return report
        for index, base in enumerate(bases):
            segment = Segment(self.directory, base, local_log.config, active=False)
            local_log.adopt_segment(segment)
            last = index == len(bases) - 1
            if not last and bases[index + 1] <= local_log.recovery_point:
                self._load_flushed(segment, report)
            elif last and segment.load_closed() and \
                    segment.next_offset == local_log.recovery_point:
                local_log.reactivate_last()              # closed cleanly: nothing to scan
            elif not self._recover_segment(segment, last, bases[index + 1:], report):
                break
        local_log.log_start_offset = max(local_log.log_start_offset, local_log.bases[0])
        if local_log.log_start_offset > local_log.log_end_offset:
            # Unflushed data below a checkpointed start offset was lost: Kafka's answer
            # is an empty log that starts there.
            log.warning("%s: log start %d is past the recovered end %d; restarting the log "
                        "empty at %d", self.directory, local_log.log_start_offset,
                        local_log.log_end_offset, local_log.log_start_offset)
            self._restart_at(local_log.log_start_offset)
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
        file_size = _log_file_size(segment)
        segment.active = last
        data_end = _data_end(segment.log_path, file_size) if last else file_size
        status, valid_end = segment.rebuild(data_end if last else None)
        if last:
            torn_bytes = _nonzero_extent(segment.log, valid_end, data_end)
            segment.truncate_tail(valid_end)
            segment.txn_index.truncate_to(segment.next_offset)
            if torn_bytes:
                report.cut(segment.log_path, valid_end, torn_bytes, status)
            return True
        if status == 0:
            return True
        report.cut(segment.log_path, valid_end, file_size - valid_end, status)
        # Later segments go first: a crash in between must not leave a gap in offsets.
        for base in later_bases:
            doomed = Segment(self.directory, base, self._local_log.config, active=False)
            report.deleted_segments.append(doomed.log_path)
            report.truncated_bytes += _log_file_size(doomed)
            doomed.delete()
        segment.state[POSITION_WORD] = valid_end       # reopening zeroes what follows
        self._local_log.reactivate_last()
        segment.txn_index.truncate_to(segment.next_offset)
        return False

    # -- leader epochs -------------------------------------------------------------------
    def _load_epochs(self, recovery_point: int) -> None:
        """Make the leader-epoch cache agree with the log just opened (Kafka's ``Log``
        load): rebuilt from every batch header when its file was missing or bad;
        else taught the epochs of the batches at and above ``recovery_point`` (the
        unflushed part, whose epochs a crash may have kept out of the file); then
        cut to the recovered log end and to the log start."""
        epochs, local_log = self._epochs, self._local_log
        if epochs.needs_rebuild:
            epochs.rebuild(self._scan_epochs(local_log.log_start_offset, -1))
        else:
            for epoch, start in self._scan_epochs(recovery_point, epochs.latest_epoch):
                epochs.assign(epoch, start)
        epochs.truncate_from_end(local_log.log_end_offset)
        epochs.truncate_from_start(local_log.log_start_offset)

    def _scan_epochs(self, offset: int, latest_epoch: int) -> list[tuple[int, int]]:
        """Where the epoch rises above ``latest_epoch`` and every epoch before it, in
        the batches from the one holding ``offset`` to the log end (batch headers
        only; a walk stops at damage and goes on in the next segment)."""
        found: list[tuple[int, int]] = []
        segments = self._local_log.segments
        first = max(self._local_log.segment_index_for(offset), 0)
        for index, segment in enumerate(segments[first:]):
            if not segment.size:
                continue                  # an empty (perhaps pending) segment: no header
            position = segment.position_of(offset) if index == 0 else 0
            found += epoch_starts(segment.log, position, segment.size, latest_epoch)
            if found:
                latest_epoch = found[-1][0]
        return found


def _log_file_size(segment: Segment) -> int:
    return os.stat(segment.log_path).st_size


def _data_end(path: str, file_size: int) -> int:
    """Where the first hole of the log file begins (its size when it has none, or
    when the file system cannot tell): the bytes past it were never written, so a
    scan of a crashed active segment (a sparse file of full capacity) ends there,
    and the index slots reserved for that scan are those of the bytes written, not
    of the capacity (which reserved and zero-filled megabytes of index per empty
    partition: minutes for thousands of them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return file_size
    try:
        return min(file_size, os.lseek(fd, 0, os.SEEK_HOLE))
    except OSError:                  # no SEEK_HOLE here: the whole file may hold data
        return file_size
    finally:
        os.close(fd)


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
