"""The front of a partition's log: retention by time and by size, and the log start
offset DeleteRecords moves (Kafka's ``deleteOldSegments`` and
``maybeIncrementLogStartOffset``).

Rules
-----
* Only whole segments go, from the front, and only those wholly below the high
  watermark: nothing a consumer may not have read yet is deleted. An empty active
  segment never goes; an expired active one is sealed (rolled) first.
* A segment goes when it lies wholly below the log start, or when the topic's
  ``cleanup.policy`` includes ``delete`` and it is older than ``retention.ms``
  (its largest timestamp, see ``Segment.age_timestamp``) or the log without it
  still holds ``retention.bytes`` (never the active segment, for size).
* The log start offset never moves back. DeleteRecords checkpoints the new start
  before any file goes, so it survives a crash; the leader-epoch cache and the
  producer snapshots below the new first segment follow it.
* Deleting files is a change of the segment files: the generation is odd from
  before the first file goes until after the last (``LocalLog.segments_changing``),
  and a check that deletes nothing leaves it, and every reader's mappings, alone.

Theory of operation
-------------------
Both paths walk the segments from the front while each is deletable (by the rules
above) and delete it; the log start then moves up to the first segment left, and
the checkpoint is written (a failure to write it is harmless: an open takes the
log start from the first segment).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

from ..common.errors import StorageError
from ..record.records import now_ms
from .leader_epochs import LeaderEpochCache
from .local_log import LocalLog, LogChange
from .log_segment import Segment
from .producer_snapshots import delete_snapshots, snapshot_offsets

log = logging.getLogger(__name__)

__all__ = ["LogRetention"]


class LogRetention:
    """Retention and the log start of one partition's ``local_log``, whose
    leader-epoch cache is ``epochs``."""

    def __init__(self, local_log: LocalLog, epochs: LeaderEpochCache):
        self._local_log = local_log
        self._epochs = epochs

    def delete_old_segments(self, now: int | None = None,
                            high_watermark: int | None = None) -> list[int]:
        """Apply ``retention.ms``, ``retention.bytes`` and the log start offset.

        Only whole segments below ``high_watermark`` (default: the log end) go.
        Returns the base offsets of the deleted segments.
        """
        local_log = self._local_log
        config = local_log.config
        now = now_ms() if now is None else now
        retention_ms, retention_bytes = config.retention_ms, config.retention_bytes
        by_retention = config.delete       # a compact-only topic keeps every key

        def expired(segment: Segment, total: int) -> bool:
            expired_by_time = by_retention and retention_ms >= 0 and \
                segment.age_timestamp() < now - retention_ms
            over_size = (by_retention and retention_bytes >= 0
                         and segment is not local_log.active
                         and total - segment.size >= retention_bytes)
            return expired_by_time or over_size

        return self._delete_front_segments(
            local_log.log_end_offset if high_watermark is None else high_watermark, expired)

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
        local_log = self._local_log
        if not local_log.log_start_offset <= offset <= local_log.log_end_offset:
            raise local_log.out_of_range(offset)
        if offset == local_log.log_start_offset:
            return []
        local_log.log_start_offset = offset
        local_log.write_checkpoint()
        self._epochs.truncate_from_start(offset)
        local_log.tell(LogChange.LOG_START_MOVED)
        return self._delete_front_segments(offset, lambda segment, total: False)

    def _delete_front_segments(self, high_watermark: int,
                               expired: Callable[[Segment, int], bool]) -> list[int]:
        """Delete segments from the front while each lies wholly below the log start
        or ``expired(segment, bytes of the log left)`` says so, and below
        ``high_watermark``; the base offsets of those deleted."""
        local_log = self._local_log
        segments, bases = local_log.segments, local_log.bases
        deleted = []
        total = local_log.size
        with contextlib.ExitStack() as changing:
            while segments:
                segment = segments[0]
                if segment.size == 0 and segment is local_log.active or \
                        segment.next_offset > high_watermark:
                    break
                below_start = segment is not local_log.active and \
                    bases[1] <= local_log.log_start_offset
                if not (below_start or expired(segment, total)):
                    break
                if not deleted:
                    # Odd before the first file goes; a check that deletes nothing
                    # leaves the generation (and every reader's mappings) alone.
                    changing.enter_context(local_log.segments_changing())
                if segment is local_log.active:
                    local_log.roll()    # an expired active segment is sealed, then deleted
                total -= segment.size
                deleted.append(segment.base_offset)
                local_log.delete_first_segment()
            if deleted:
                self._moved_to_first_segment()
        return deleted

    def _moved_to_first_segment(self) -> None:
        """After deleting front segments: the log start is at least the first one's
        base, and the epochs, the producer snapshots and the checkpoint follow."""
        local_log = self._local_log
        first_base = local_log.bases[0]
        local_log.log_start_offset = max(local_log.log_start_offset, first_base)
        self._epochs.truncate_from_start(local_log.log_start_offset)
        directory = local_log.directory
        delete_snapshots(directory, [offset for offset in snapshot_offsets(directory)
                                     if offset < first_base])
        try:
            local_log.write_checkpoint()
        except StorageError as error:
            # Harmless: an open takes the log start from the first segment.
            log.warning("%s: retention's checkpoint not written (%s)", directory, error)
