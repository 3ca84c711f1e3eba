"""One segment of a partition's log (Kafka's ``LogSegment``): a ``.log`` file with its
sparse ``.index`` (offset -> byte position) and ``.timeindex`` (timestamp -> offset),
mapped into memory, the segment's append state (``segment_state``), and its
``.txnindex`` of aborted transactions (``transaction_index``), made at its first entry.

Rules
-----
* One writer: the process that owns the partition's log. Only the active (last)
  segment is written; a sealed one changes only when a rebuild rewrites its
  indexes or a truncation reopens it.
* No store ever lands past a reservation, in any of the three files (the append
  kernel checks it, see ``segment_append``). Reservation, here or on the
  prefaulter thread, never overlaps sealing, truncating or closing: all of them
  hold the segment's reservation lock (fallocate on a trimmed file would grow it
  again).
* A sealed segment's files are trimmed to their data, indexes before the log (a
  reader takes a log at its sealed size, then maps its index).
* Space never written reads as zeros, and a zero batch length marks the end of the
  data: a truncation zeroes everything past its cut.

Theory of operation
-------------------
The active segment's files are sparse files of their full configured size, mapped
read-write once. Disk blocks are reserved with ``fallocate`` and page tables
populated (``MADV_POPULATE_WRITE``) a step ahead of the write position, so appends
neither page-fault on every 4 KiB page nor die of ``SIGBUS`` on a full disk: a full
disk fails the reservation, which raises :class:`StorageError` before any byte
moves. How far ahead follows the partition's write rate (``reservation``: its
:class:`ReservePace`, shared by the partition's segments): an append that finds
the room used up reserves inline and tells the pace it stalled, and each
background reservation tells it the write position, from which it takes the rate.
Each reservation of the log reserves index slots in proportion (an entry per
``index.interval.bytes`` of log at most), so the append kernel seldom asks for the
indexes alone (:meth:`Segment.make_room`). An active segment's rescan reserves,
before it starts, the slots its log can need at most; a sealed segment's rebuilds
its indexes in memory and then reserves only what they hold (what its appends
wrote, whose blocks it has: a full disk still reopens it after a crash). When the
background reservation (:meth:`Segment.prefault_ahead`) fails, it stops until an
append's own reservation succeeds (the disk has room again).

Opening: a closed segment's files are adopted as they are when its indexes pass a
sanity check (:meth:`Segment.load_closed`), else its log is rescanned and both
indexes rebuilt (:meth:`Segment.rebuild`); cutting damaged data is the caller's
decision (``log_loader``). Sealing (:meth:`Segment.close_for_append`) writes the
closing time-index entry and trims the files; a truncation reopens a sealed
segment (:meth:`Segment.reopen_for_append`).

Lookups (by offset, by timestamp) are the read path's (``segment_read``), through
the indexes' entries in use.

The transaction index is no mapping: a file of 34-byte entries (Kafka's format),
read at its first use and appended to as transactions abort (``transaction_index``).
It follows the log: a truncation cuts the entries whose marker it removed, deleting
the segment deletes it, syncing the segment syncs it; a roll leaves it as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import numpy as np

from ..common import limits
from ..common.errors import CorruptSegmentError, StorageError
from ..record import batch_layout as B
from ..record.records import BatchStatus, batch_frame, batch_info
from . import index_layout as I
from .mapped_file import PAGE_SIZE, MappedFile, prefault_in_background
from .reservation import ReservePace
from .segment_append import (
    append_time_entry,
    index_slots_reserved,
    rescan,
    verify_prefix,
    will_index,
)
from .segment_read import offset_for_timestamp, position_of
from .segment_state import (
    CAPACITY_WORD,
    INDEXED_TIMESTAMP_WORD,
    MAX_TIMESTAMP_WORD,
    NEXT_OFFSET_WORD,
    OFFSET_CAPACITY_WORD,
    OFFSET_ENTRIES_WORD,
    OFFSET_RESERVED_WORD,
    POSITION_WORD,
    RESERVED_WORD,
    ROLL_TIMESTAMP_WORD,
    SINCE_INDEX_WORD,
    TIME_CAPACITY_WORD,
    TIME_ENTRIES_WORD,
    TIME_RESERVED_WORD,
    new_segment_state,
)
from .topic_config import TopicConfig
from .transaction_index import TransactionIndex

log = logging.getLogger(__name__)

__all__ = ["Segment"]

# What a pending segment's views are: no byte, so no store can land (zero capacity).
# Writable, as every view the compiled writer holds is (numba types read-only apart).
_NO_BYTES = np.zeros(0, np.uint8)

assert limits.SEGMENT_RESERVE_AHEAD_MIN % PAGE_SIZE == 0
assert limits.SEGMENT_RESERVE_AHEAD_MAX >= limits.SEGMENT_RESERVE_AHEAD_MIN

# The state words a rescan writes (``segment_state``'s "written by" column): it starts
# them as an empty segment's, keeping what mapping and reservation wrote.
_RESCANNED_WORDS = np.array([POSITION_WORD, NEXT_OFFSET_WORD, SINCE_INDEX_WORD,
                             OFFSET_ENTRIES_WORD, TIME_ENTRIES_WORD, MAX_TIMESTAMP_WORD,
                             INDEXED_TIMESTAMP_WORD, ROLL_TIMESTAMP_WORD])


class Segment:
    """One ``.log`` file with its ``.index`` and ``.timeindex`` (and ``.txnindex``)."""

    def __init__(self, directory: str, base_offset: int, config: TopicConfig, *, active: bool,
                 pace: ReservePace | None = None):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.log_path = os.path.join(directory, I.segment_file_name(base_offset, I.LOG_SUFFIX))
        self.offset_index_path = os.path.join(
            directory, I.segment_file_name(base_offset, I.OFFSET_INDEX_SUFFIX))
        self.time_index_path = os.path.join(
            directory, I.segment_file_name(base_offset, I.TIME_INDEX_SUFFIX))
        # The transactions aborted in this segment: no file until the first one.
        self.txn_index = TransactionIndex(
            os.path.join(directory, I.segment_file_name(base_offset, I.TXN_INDEX_SUFFIX)),
            base_offset)
        self.state = new_segment_state(base_offset)
        self.active = active
        self.verified_end = 0          # bytes below this were checked in this process
        self.damaged_at = -1           # where kept-but-failed data starts (a flushed segment)
        self.flushed_end = 0
        self._log: MappedFile | None = None
        self._offset_index: MappedFile | None = None
        self._time_index: MappedFile | None = None
        # An empty active segment whose files are not made yet (see create's
        # ``deferred``): it reads as empty until materialize() makes them.
        self.pending = False
        # Reservation (here or on the prefaulter thread) never overlaps sealing,
        # truncating or closing: fallocate on a trimmed file would grow it again.
        self._reserve_lock = threading.Lock()
        self._prefault_pending = False
        # The background reservation failed (a full disk): it waits until an
        # append's own reservation succeeds, instead of failing after every append.
        self._prefault_refused = False
        # How far ahead to reserve: the partition's (its local log passes it on).
        self.pace = pace if pace is not None else ReservePace(time.monotonic())

    @classmethod
    def create(cls, directory: str, base_offset: int, config: TopicConfig,
               log_reserved: int = 0, pace: ReservePace | None = None, *,
               deferred: bool = False) -> "Segment":
        """A new, empty active segment; blocks for its first ``log_reserved`` bytes
        (and, when there are any, the distance ``pace`` keeps ahead) and the index
        slots they can need are reserved before its files are mapped.

        ``deferred`` (with nothing to reserve) makes no file at all: the segment is
        ``pending`` until :meth:`materialize` (the first append) makes and maps its
        three files, as Kafka's ``LazyIndex`` defers an index. A partition never
        written costs its directory only; its views are empty arrays, whose zero
        capacity sends a compiled writer back to ``LocalLog.append``.

        Raises
        ------
        StorageError
            The disk is full or failed; no file of the segment is left.
        """
        segment = cls(directory, base_offset, config, active=True, pace=pace)
        if deferred and not log_reserved:
            segment.pending = True
            return segment
        try:
            segment.map(log_reserved)
        except StorageError:
            segment.delete()
            raise
        return segment

    def materialize(self) -> bool:
        """Make and map a pending segment's files (nothing to do for any other);
        True when it made them. The caller moves the segment generation: a reader
        that listed the directory before found no file of this segment.

        Raises
        ------
        StorageError
            The disk is full or failed; no file is left and the segment is still
            pending.
        """
        if not self.pending:
            return False
        self.pending = False
        try:
            self.map()
        except StorageError:
            self.delete()
            self.pending, self.active = True, True
            raise
        return True

    # -- mapping -----------------------------------------------------------------
    def map(self, log_reserved: int = 0) -> None:
        """Map the three files (read-write at full capacity when active, with blocks
        for the first ``log_reserved`` bytes of the log, and the index slots they
        can need, reserved before the files are mapped)."""
        if self._log is not None or self.pending:
            return
        paths = (self.log_path, self.offset_index_path, self.time_index_path)
        capacities, reservations = (None, None, None), (0, 0, 0)
        if self.active:
            ahead = self.pace.settle(time.monotonic()) if log_reserved else 0
            capacities, reservations = _active_extents(self.config, log_reserved + ahead)
        opened = []
        try:
            for path, capacity, reserved in zip(paths, capacities, reservations):
                opened.append(MappedFile(path, capacity, reserved=reserved))
        except StorageError:
            for mapped in opened:
                mapped.close()
            raise
        self._log, self._offset_index, self._time_index = opened
        state = self.state
        state[CAPACITY_WORD] = self._log.bytes.size
        state[OFFSET_CAPACITY_WORD] = self._offset_index.bytes.size // I.OFFSET_ENTRY_LENGTH
        state[TIME_CAPACITY_WORD] = self._time_index.bytes.size // I.TIME_ENTRY_LENGTH
        state[RESERVED_WORD], state[OFFSET_RESERVED_WORD], state[TIME_RESERVED_WORD] = reservations

    @property
    def log(self) -> np.ndarray:
        """The log's mapped bytes (empty while the segment is pending)."""
        self.map()
        return _NO_BYTES if self.pending else self._log.bytes

    @property
    def offset_index_bytes(self) -> np.ndarray:
        """The offset index's mapped bytes (the append kernel stores entries there)."""
        self.map()
        return _NO_BYTES if self.pending else self._offset_index.bytes

    @property
    def time_index_bytes(self) -> np.ndarray:
        """The time index's mapped bytes (the append kernel stores entries there)."""
        self.map()
        return _NO_BYTES if self.pending else self._time_index.bytes

    @property
    def size(self) -> int:
        return int(self.state[POSITION_WORD])

    @property
    def next_offset(self) -> int:
        return int(self.state[NEXT_OFFSET_WORD])

    @property
    def max_timestamp(self) -> int:
        """Largest timestamp in the segment (numpy's int64 minimum when empty)."""
        return int(self.state[MAX_TIMESTAMP_WORD])

    def age_timestamp(self) -> int:
        """What retention.ms measures: the largest record timestamp, or, when the
        records carry none (-1, as Kafka allows), the log file's modification time."""
        if self.max_timestamp >= 0 or self.pending:
            return self.max_timestamp
        return os.stat(self.log_path).st_mtime_ns // 1_000_000

    def offset_entries(self) -> np.ndarray:
        self.map()
        count = int(self.state[OFFSET_ENTRIES_WORD])
        return self.offset_index_bytes[:count * I.OFFSET_ENTRY_LENGTH].view(I.OFFSET_INDEX_DTYPE)

    def time_entries(self) -> np.ndarray:
        self.map()
        count = int(self.state[TIME_ENTRIES_WORD])
        return self.time_index_bytes[:count * I.TIME_ENTRY_LENGTH].view(I.TIME_INDEX_DTYPE)

    # -- opening ---------------------------------------------------------------------
    def load_closed(self) -> bool:
        """Adopt a closed segment's files as they are; False when its indexes fail the
        sanity check (the caller then rebuilds them)."""
        self.map()
        size = self._log.size
        offsets, times = self._offset_index, self._time_index
        if offsets.size % I.OFFSET_ENTRY_LENGTH or times.size % I.TIME_ENTRY_LENGTH:
            return False
        self.state[POSITION_WORD] = size
        self.state[OFFSET_ENTRIES_WORD] = offsets.size // I.OFFSET_ENTRY_LENGTH
        self.state[TIME_ENTRIES_WORD] = times.size // I.TIME_ENTRY_LENGTH
        entries, stamps = self.offset_entries(), self.time_entries()
        if not _indexes_in_order(entries, stamps, size):
            return False
        if size:
            position = int(entries["position"][-1]) if entries.size else 0
            last = _last_batch(self.log, position, size, self.base_offset)
            if last is None:
                return False
            self.state[NEXT_OFFSET_WORD] = last.next_offset
            if int(stamps["relative_offset"][-1]) + self.base_offset > last.last_offset:
                return False
            self.state[MAX_TIMESTAMP_WORD] = int(stamps["timestamp"][-1])
            self.state[INDEXED_TIMESTAMP_WORD] = self.state[MAX_TIMESTAMP_WORD]
            self.state[ROLL_TIMESTAMP_WORD] = batch_info(self.log, 0).max_timestamp
        return True

    def rebuild(self, end: int | None = None) -> tuple[int, int]:
        """Rescan the log from byte 0 and rebuild both indexes in place.

        Returns (status, end of the valid prefix); the state then describes that
        prefix. The log file itself is never cut here: a sealed segment keeps every
        byte (its size stays the file's, so reads reach damage and report it) and is
        sealed again; cutting is the caller's decision.
        """
        if self.active:
            self.map()
        else:
            self._map_for_rebuild()
        # The kernel trusts ``end``: never let it past the mapping.
        end = self._log.bytes.size if end is None else min(end, self._log.bytes.size)
        if self.active:
            entries = _index_entries_for(end, self.config.index_interval_bytes)
            with self._reserve_lock:
                self._reserve_indexes(entries, entries)      # the most the rescan can write
            offsets, times = self._offset_index.bytes, self._time_index.bytes
        else:
            # In memory first (pages are only touched as entries are written), then
            # stored with blocks for what they hold: a sealed segment's rebuilt
            # indexes are as long as those its appends wrote, whose blocks it has,
            # so a full disk (a restart after a crash) still opens its log.
            # (np.zeros is calloc's: untouched pages cost nothing; zeros_like fills.)
            offsets = np.zeros(self._offset_index.bytes.size, np.uint8)
            times = np.zeros(self._time_index.bytes.size, np.uint8)
        state = self.state
        state[_RESCANNED_WORDS] = new_segment_state(self.base_offset)[_RESCANNED_WORDS]
        status, position = rescan(self._log.bytes, end, offsets, times, state,
                                  self.config.index_interval_bytes)
        self.verified_end = int(position)
        if not self.active:
            self._store_rebuilt_indexes(offsets, times)
            state[POSITION_WORD] = self._log.bytes.size
            self.close_for_append()
        return int(status), int(position)

    def _store_rebuilt_indexes(self, offsets: np.ndarray, times: np.ndarray) -> None:
        """Copy a sealed segment's indexes, rebuilt in memory, into its files, with
        blocks reserved for their entries and the time index's closing entry only.

        Raises
        ------
        StorageError
            The disk has no room for them (they grew past what the files held).
        """
        state = self.state
        offset_bytes = int(state[OFFSET_ENTRIES_WORD]) * I.OFFSET_ENTRY_LENGTH
        time_bytes = int(state[TIME_ENTRIES_WORD]) * I.TIME_ENTRY_LENGTH
        with self._reserve_lock:
            self._reserve_indexes(int(state[OFFSET_ENTRIES_WORD]),
                                  int(state[TIME_ENTRIES_WORD]) + 1)
        self._offset_index.bytes[:offset_bytes] = offsets[:offset_bytes]
        self._time_index.bytes[:time_bytes] = times[:time_bytes]

    def _map_for_rebuild(self) -> None:
        """Map a sealed segment for rebuilding its indexes: the log read-only (a
        rescan only reads it), the indexes read-write with room for every entry the
        log could need (their blocks are reserved by :meth:`rebuild`)."""
        self.close()
        size = os.stat(self.log_path).st_size
        capacity = max(self.config.segment_index_bytes,
                       _index_entries_for(size, self.config.index_interval_bytes)
                       * I.TIME_ENTRY_LENGTH)
        self._log = MappedFile(self.log_path, None)
        self._offset_index = MappedFile(self.offset_index_path, capacity)
        self._time_index = MappedFile(self.time_index_path, capacity)
        state = self.state
        state[CAPACITY_WORD] = self._log.bytes.size
        state[OFFSET_CAPACITY_WORD] = capacity // I.OFFSET_ENTRY_LENGTH
        state[TIME_CAPACITY_WORD] = capacity // I.TIME_ENTRY_LENGTH
        state[OFFSET_RESERVED_WORD] = state[TIME_RESERVED_WORD] = 0

    def reserve(self, end: int) -> None:
        """Make ``[0, end)`` of the active log writable without faults (whole pages,
        up to the capacity), with the index slots that much log can need.
        Serialised with the prefaulter and with sealing.

        Raises
        ------
        StorageError
            The disk is full or failed; what was reserved before stays.
        """
        with self._reserve_lock:
            if self.active:
                self._reserve(end)

    def _reserve(self, end: int) -> None:
        state = self.state
        reserved = int(state[RESERVED_WORD])
        target = _whole_pages(end, int(state[CAPACITY_WORD]))
        if target > reserved:
            entries = _index_entries_for(target, self.config.index_interval_bytes)
            self._reserve_indexes(entries, entries)
            # Past the data and past what was reserved, nothing is stored: appends
            # store only below the reservation, and bytes past the data are
            # written over by the next append anyway.
            fresh_from = max(reserved, int(state[POSITION_WORD]))
            self._log.reserve(reserved, target, fresh_from)
            state[RESERVED_WORD] = target

    def _reserve_indexes(self, offset_entries: int, time_entries: int) -> None:
        """Reserve blocks for the first ``offset_entries`` / ``time_entries`` slots of
        the indexes (whole pages, within their capacities). The lock is held."""
        for index, wanted, slot in ((self._offset_index, offset_entries * I.OFFSET_ENTRY_LENGTH,
                                     OFFSET_RESERVED_WORD),
                                    (self._time_index, time_entries * I.TIME_ENTRY_LENGTH,
                                     TIME_RESERVED_WORD)):
            reserved = int(self.state[slot])
            target = _whole_pages(wanted, index.bytes.size)
            if target > reserved:
                index.reserve(reserved - reserved % PAGE_SIZE, target)
                self.state[slot] = target

    def make_room(self, length: int, index_interval: int) -> None:
        """Reserve what appending a batch of ``length`` bytes needs: the log bytes,
        an entry of each index, and the time index's closing entry.

        Raises
        ------
        StorageError
            The disk is full or failed; nothing of the segment changed.
        """
        state = self.state
        with self._reserve_lock:
            assert self.active, "only the active segment is appended to"
            assert not self.pending, "a pending segment's first append is LocalLog.append's"
            now = time.monotonic()
            # The log's room ran out under an append (not only an index's slots).
            if state[RESERVED_WORD] and state[RESERVED_WORD] < self.size + length:
                self.pace.stalled(now)
            self._reserve(self.size + length + self.pace.settle(now))
            self._reserve_indexes(int(state[OFFSET_ENTRIES_WORD]) + 1,
                                  int(state[TIME_ENTRIES_WORD]) + 2)
            self._prefault_refused = False        # there is room again
        # What the kernel checks: it must find the room now, or it would ask again.
        if state[RESERVED_WORD] < self.size + length or \
                not index_slots_reserved(state, will_index(state, index_interval)):
            raise StorageError(f"{self.log_path}: no room for a batch of {length} bytes at "
                               f"byte {self.size} (capacity {int(state[CAPACITY_WORD])})")

    def prefault_ahead(self) -> None:
        """Keep the pace's distance reserved past the write position, on the
        prefaulter thread, so appends find their pages ready; queued once less than
        half of it is left."""
        state = self.state
        now = time.monotonic()
        ahead = self.pace.settle(now)
        if self._prefault_pending or self._prefault_refused or not self.active or \
                state[RESERVED_WORD] >= state[CAPACITY_WORD] or \
                2 * (state[RESERVED_WORD] - state[POSITION_WORD]) >= ahead:
            return
        self._prefault_pending = True
        self.pace.prefaulting(now, int(state[POSITION_WORD]))
        ahead = self.pace.ahead

        def job():
            try:
                self.reserve(int(self.state[POSITION_WORD]) + ahead)
            except StorageError as error:
                self._prefault_refused = True
                log.warning("%s; appends reserve for themselves until there is room", error)
            finally:
                self._prefault_pending = False
        if not prefault_in_background(job):
            self._prefault_pending = False       # shutting down: appends reserve inline

    def close_for_append(self) -> None:
        """Seal the segment: closing time-index entry, files trimmed to their data."""
        with self._reserve_lock:
            self._seal()

    def _seal(self) -> None:
        state = self.state
        if self.pending:
            self.active = False        # no file to trim (never written: a roll skips it)
            return
        # The slot kept free for the closing entry may be gone in a segment that was
        # sealed before (and reopened): it then has its closing entry already.
        if state[POSITION_WORD] and state[MAX_TIMESTAMP_WORD] > state[INDEXED_TIMESTAMP_WORD] \
                and state[TIME_ENTRIES_WORD] < state[TIME_CAPACITY_WORD]:
            # Appends keep this slot reserved: this reserves only after a reopen.
            self._reserve_indexes(0, int(state[TIME_ENTRIES_WORD]) + 1)
            append_time_entry(self._time_index.bytes, state, state[NEXT_OFFSET_WORD] - 1)
        # Indexes first: a reader maps the log, then the index, and takes a log at
        # its sealed size for a sealed segment, whose index it then reads. Trimmed
        # after the log, the index could still be mapped at its full size by then,
        # and reading that mapping past the trimmed end faults (SIGBUS).
        self._offset_index.trim(int(state[OFFSET_ENTRIES_WORD]) * I.OFFSET_ENTRY_LENGTH)
        self._time_index.trim(int(state[TIME_ENTRIES_WORD]) * I.TIME_ENTRY_LENGTH)
        if self._log.writable:                 # a rebuilt sealed segment's log is read-only
            self._log.trim(int(state[POSITION_WORD]))
        state[CAPACITY_WORD] = state[POSITION_WORD]
        state[RESERVED_WORD] = state[POSITION_WORD]
        state[OFFSET_RESERVED_WORD] = state[TIME_RESERVED_WORD] = 0   # trimmed: nothing to store
        self.active = False

    def reopen_for_append(self) -> None:
        """Map a sealed segment read-write at full capacity again, keeping its state,
        with the tail past its data zeroed. Under the reservation lock, so a queued
        prefault never sees it half-reopened."""
        with self._reserve_lock:
            self._close_mappings()
            self.active = True
            if self.pending:
                return                 # nothing on disk: it stays empty and pending
            self.map()
            self._zero_tail(self.size)
        self.verified_end = min(self.verified_end, self.size)
        self.flushed_end = self.size

    def truncate_tail(self, position: int) -> None:
        """Make everything from ``position`` on read as zeros (the end-of-data mark),
        so no stale batch past the end can ever be mistaken for data."""
        with self._reserve_lock:
            self._zero_tail(position)

    def _zero_tail(self, position: int) -> None:
        assert self.active
        self._log.zero_tail(position, int(self.state[CAPACITY_WORD]))
        self.state[RESERVED_WORD] = position - position % PAGE_SIZE

    def _clear_indexes(self) -> None:
        """Zero both indexes, keeping the blocks reserved for them (a rebuild stores
        there next); the lock is held."""
        for index, slot in ((self._offset_index, OFFSET_RESERVED_WORD),
                            (self._time_index, TIME_RESERVED_WORD)):
            kept = int(self.state[slot])
            index.zero_tail(kept, index.bytes.size)       # the mapping's size, not the config's
            index.bytes[:kept] = 0

    def truncate(self, position: int) -> None:
        """Cut the active segment's log at batch boundary ``position``; rebuild indexes,
        and cut the transaction index's entries whose markers went.

        Raises
        ------
        CorruptSegmentError
            The bytes before ``position`` fail their check; nothing was changed.
        """
        status, end = verify_prefix(self.log, position)
        if status != 0 or end != position:
            raise CorruptSegmentError(
                f"{self.log_path}: {BatchStatus(status).name if status else 'NOT_A_BOUNDARY'} "
                f"at byte {end} before the truncation point {position}; nothing was truncated",
                path=self.log_path, position=int(end))
        # The first offset cut: an aborted transaction whose marker is there or past it goes.
        cut_offset = batch_info(self.log, position).base_offset if position < self.size \
            else self.next_offset
        entries = _index_entries_for(position, self.config.index_interval_bytes)
        with self._reserve_lock:
            # Reserved first: a full disk fails the truncation with nothing changed.
            self._reserve_indexes(entries, entries)
            self._zero_tail(position)
            self._clear_indexes()
        self.flushed_end = min(self.flushed_end, position)
        status, end = self.rebuild(position)
        assert status == 0 and end == position, "the prefix was verified above"
        self.txn_index.truncate_to(cut_offset)

    # -- lookups ---------------------------------------------------------------------
    def position_of(self, offset: int) -> int:
        """Byte position of the batch holding ``offset`` (or the end)."""
        return position_of(self.log, self.size, self.base_offset, self.offset_entries(), offset)

    def offset_for_timestamp(self, timestamp: int, min_offset: int):
        """(offset, timestamp) of the first record at or after ``min_offset`` whose
        timestamp is >= ``timestamp``, or None (``segment_read``: damage on the way
        raises :class:`CorruptSegmentError`)."""
        return offset_for_timestamp(self.log, self.log_path, self.size, self.base_offset,
                                    self.offset_entries(), self.time_entries(), timestamp,
                                    min_offset)

    def sync(self) -> None:
        """msync what was written since the last sync (log first, then indexes), and
        fsync the transaction index when it changed."""
        if self._log is not None:
            self._log.sync(self.flushed_end, self.size)
            self._offset_index.sync()
            self._time_index.sync()
            self.flushed_end = self.size
        self.txn_index.sync()

    def close(self) -> None:
        with self._reserve_lock:
            self._close_mappings()
        self.txn_index.close()

    def _close_mappings(self) -> None:
        self.active = False       # a prefault still queued finds nothing to do
        for mapped in (self._log, self._offset_index, self._time_index):
            if mapped is not None:
                mapped.close()
        self._log = self._offset_index = self._time_index = None

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index_path, self.time_index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.txn_index.delete()


def _index_entries_for(log_size: int, index_interval: int) -> int:
    """The most entries either index of a segment holding ``log_size`` bytes of log
    can need: an entry marks a batch at least ``index.interval.bytes`` (and a batch
    header) after the previous one, and the time index adds its closing entry."""
    return log_size // max(index_interval, B.HEADER_LENGTH) + 2


def _whole_pages(size: int, capacity: int) -> int:
    """``size`` rounded up to whole pages, within ``capacity``."""
    return min(-(-size // PAGE_SIZE) * PAGE_SIZE, capacity)



def _active_extents(config: TopicConfig, log_reserved: int) -> tuple[tuple, tuple]:
    """(capacities, reservations) of an active segment's three files, log first: the
    configured sizes, and blocks for the first ``log_reserved`` bytes of the log
    and for the index slots that much log can need (whole pages)."""
    capacities = (config.segment_bytes, config.segment_index_bytes, config.segment_index_bytes)
    log_reserved = _whole_pages(log_reserved, config.segment_bytes)
    entries = _index_entries_for(log_reserved, config.index_interval_bytes) \
        if log_reserved else 0
    reservations = (log_reserved,
                    _whole_pages(entries * I.OFFSET_ENTRY_LENGTH, capacities[1]),
                    _whole_pages(entries * I.TIME_ENTRY_LENGTH, capacities[2]))
    return capacities, reservations


def _indexes_in_order(entries: np.ndarray, stamps: np.ndarray, log_size: int) -> bool:
    """The sanity check of a closed segment's indexes (Kafka's ``sanityCheck``):
    offsets and positions strictly increase in the offset index, within the log;
    timestamps and offsets strictly increase in the time index, which holds at
    least the closing entry when the log is not empty."""
    if entries.size and (np.any(np.diff(entries["relative_offset"].astype(np.int64)) <= 0)
                         or np.any(np.diff(entries["position"].astype(np.int64)) <= 0)
                         or int(entries["position"][-1]) >= log_size):
        return False
    if log_size and not stamps.size:
        return False       # a non-empty closed segment always has a closing entry
    return not (stamps.size and (
        np.any(np.diff(stamps["timestamp"]) <= 0)
        or np.any(np.diff(stamps["relative_offset"].astype(np.int64)) <= 0)))


def _last_batch(log: np.ndarray, position: int, end: int, base_offset: int):
    """The header (``BatchInfo``) of the last batch of ``log[position:end]``, walking
    headers from ``position`` (the last indexed batch); None when a frame fails or a
    batch's offsets cannot be a segment's at ``base_offset``."""
    last = None
    while position < end:
        status, _ = batch_frame(log, position, end)
        if status != 0:
            return None
        last = batch_info(log, position)
        if last.base_offset < base_offset or last.last_offset_delta < 0 \
                or last.base_offset + last.last_offset_delta >= limits.OFFSET_MAX:
            return None
        position += last.batch_length
    return last
