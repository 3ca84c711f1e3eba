"""Reading a partition from another process than the broker: segments mapped
read-only, bounded by what the broker has published in the state table.

Rules
-----
* Nothing at or past the published high watermark is ever returned, and no byte
  past the published end of the active segment is ever looked at (it may belong to
  a batch still being copied).
* Every batch is CRC-checked the first time this process reads it.
* The hot path makes no system call: the high watermark is an acquire load from
  shared memory and the segments are already mapped. The directory is listed again
  only when the published segment generation changes (a roll, a deletion).
* A reader holds the identity of its partition (topic key and partition number)
  and checks it against the row on every read: a deleted partition's row is freed
  and may be given to another partition, so a row that no longer names it, or a
  directory that is gone, is :class:`UnknownTopicOrPartitionError`, never a read
  of another partition's offsets nor a damaged-data error.
* The row's words are range-checked before use (``state.check_row``): a word no
  broker publishes is :class:`StateTableInconsistentError`, naming the table.
* A ``read_committed`` reader reads below the last stable offset alone (below the
  oldest transaction still open), and gives with each read the aborted transactions
  (:attr:`PartitionReader.aborted`) whose batches the decoding leaves out: the
  ``.txnindex`` entries of its segments, read again only when the row's aborted
  generation or segment generation moves (the broker writes an entry before it
  publishes a last stable offset past its marker).
* A listing is trusted only as the segment generation's seqlock says
  (``segment_generation``: the reader's side, :func:`follow`, is run here).

Theory of operation
-------------------
The broker publishes a row per partition: high watermark (last, with release),
log start offset, the active segment's base offset and published size, and a
segment generation. A read loads the row (high watermark first, with acquire),
maps any new segment files when the generation moved, finds the byte position of
the requested offset - walking batch headers on from where the previous read ended,
or through the sparse offset index of a sealed segment - and returns whole
batches from there, as views of the mapping.

When the generation moved, the reader follows it as ``segment_generation``
says (listing again at most ``READER_RESCAN_ATTEMPTS_MAX`` times). When that
leaves no set of mappings to read through (a change is under way and the
reader's mappings are older than the generation just before it: they may miss a
roll's files), the read returns no records with the position unchanged, so the
caller's poll comes back later. Returning nothing rather than raising keeps a
change of a few renames and fsyncs invisible to consumers, which already poll
again when a read finds nothing, and it never steps over a record.

Kernels are loaded before the first read: numba compiles (or loads from its disk
cache) a kernel at its first call, with the GIL held, for seconds on a cold cache.
Inside a poll that would starve the consumer's heartbeat thread and cost it its
group session, so :func:`warm_kernels` runs every kernel of the read path once, on
empty inputs of the types a read passes, and a consumer calls it when it is made.
"""

from __future__ import annotations

import bisect
import os

import numpy as np

from ..common import limits
from ..common.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from ..record import batch_layout as B
from ..record.decoding import NO_ABORTED
from ..record.records import warm_decoding
from ..shm import state_layout as S
from ..shm.state import PartitionStateTable, RowSnapshot, check_row
from ..storage import index_layout as I
from ..storage.mapped_file import MappedFile
from ..storage.segment_generation import follow
from ..storage.segment_read import ReadResult, collect_batches, find_batch
from ..storage.transaction_index_layout import ABORTED_DTYPE, read_aborted, txn_index_path

__all__ = ["PartitionReader", "warm_kernels"]

_NO_ROWS = np.zeros(0, ABORTED_DTYPE)


def warm_kernels() -> None:
    """Compile, or load from numba's disk cache, every kernel that reading and
    decoding a partition and waiting for records run, for the argument types they
    run with (a segment is a read-only mapping; an inflated batch is a writable
    array), so that no poll compiles. Idempotent; a few ms once they are loaded."""
    table = PartitionStateTable.scratch("warm-up", 1, writable=False)   # as attach maps it
    table.snapshot(0)
    table.high_watermark(0)
    table.segment_generation(0)
    table.journal_sequence()
    table.journal_changes(0, np.empty(S.JOURNAL_CAPACITY, np.int64))
    table.consumer_doorbell.wait(lambda: True, 0)      # found at once: never sleeps
    warm_decoding()
    # A segment mapped read-only, and the writable empty placeholder MappedFile
    # gives a segment file that is still empty (a fresh active segment).
    empty, log = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    log.flags.writeable = False
    collect_batches(log, "warm-up", 0, 0, limits.READ_SIZE_DEFAULT, 0, 0, 0)
    for data in (log, empty):
        find_batch(data, 0, 0, 0)
    table.close()


class _MappedSegment:
    """A segment's log and offset index, mapped read-only at their current sizes."""

    def __init__(self, directory: str, base_offset: int):
        # The log before the index: a roll trims the index first (Segment._seal), so
        # a log mapped at its sealed size comes with an index mapped at its own.
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, I.segment_file_name(base_offset, I.LOG_SUFFIX))
        self._log = MappedFile(self.log_path, None)
        self._index = MappedFile(
            os.path.join(directory, I.segment_file_name(base_offset, I.OFFSET_INDEX_SUFFIX)), None)
        self.size = self._log.size
        self.inode = self._log.inode
        self.index_path = self._index.path
        self.index_identity = (self._index.size, self._index.inode)
        self.verified_end = 0

    @property
    def log(self) -> np.ndarray:
        return self._log.bytes

    def position_of(self, offset: int, end: int, start: int, active: bool) -> int:
        """Byte position of the batch holding ``offset``, walking from ``start`` (a
        known batch boundary at or before it) or from the sparse index.

        The active segment's index is never read: a roll may trim that file at any
        moment, and a mapped page past the end of a file faults (SIGBUS). Only the
        log bytes below the published size are safe there, so the walk uses those.
        """
        if not active and start == 0:
            index = self._index.bytes
            entries = index[:index.size // I.OFFSET_ENTRY_LENGTH
                            * I.OFFSET_ENTRY_LENGTH].view(I.OFFSET_INDEX_DTYPE)
            slot = int(np.searchsorted(entries["relative_offset"], offset - self.base_offset,
                                       side="right")) - 1
            if slot >= 0:
                start = int(entries["position"][slot])
                # Compaction renames a cleaned log and its index in separately: an
                # entry is trusted only when the log has the batch it names there.
                if not _batch_starts_at(self.log, start, end,
                                        self.base_offset + int(entries["relative_offset"][slot])):
                    start = 0
        return int(find_batch(self.log, min(start, end), end, offset))

    def close(self) -> None:
        self._log.close()
        self._index.close()


def _identity(path: str) -> tuple[int, int]:
    """(size, inode) of a file; (0, -1) when it is missing (as MappedFile maps it)."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return 0, -1
    return status.st_size, status.st_ino


def _batch_starts_at(log: np.ndarray, position: int, end: int, base_offset: int) -> bool:
    """Does a batch with this base offset start at ``position``?"""
    if position < 0 or position + B.HEADER_LENGTH > end:
        return False
    header = log[position:position + B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)[0]
    return header["magic"] == B.MAGIC and header["base_offset"] == base_offset


class PartitionReader:
    """Reads one partition's published records, zero-copy.

    Parameters
    ----------
    directory : str
        The partition's directory (``<data dir>/topics/<topic>/<partition>``).
    table : PartitionStateTable
        The broker's table, attached.
    row : int
        The partition's row in it.
    topic_key, partition : int
        Who the row must belong to: the topic's key (``state.topic_key`` of its id)
        and the partition number, as the broker's metadata gave them.
    read_committed : bool
        Read below the last stable offset alone, and leave aborted transactions out
        (Kafka's ``isolation.level=read_committed``; see the module's rules).
    """

    def __init__(self, directory: str, table: PartitionStateTable, row: int, *,
                 topic_key: int, partition: int, read_committed: bool = False):
        self.directory = directory
        self.read_committed = read_committed
        # The aborted transactions the last read may meet (decode_columns' ``aborted``),
        # and the (aborted generation, segment generation) they were read at.
        self.aborted = NO_ABORTED
        self._all_aborted = NO_ABORTED
        self._segment_aborted: dict[int, np.ndarray] = {}    # base offset -> its entries
        self._aborted_read_at = None
        self.table = table
        self.row = row
        self.topic_key = topic_key
        self.partition = partition
        self._segments: list[_MappedSegment] = []
        self._bases: list[int] = []
        self._generation = None
        self._cursor = (-1, -1, 0)            # (next offset, segment base, byte position)
        # The high watermark the last read loaded (-1 before one): a position below it
        # after the read has more to read without the broker publishing anything.
        self.high_watermark_seen = -1

    def _map_generation(self) -> bool:
        """Make the mappings a consistent set for the published generation (listing
        the directory again as often as it moves, within limits). False when there
        is none to read through now: a change of the files is under way.
        """
        mapped = follow(lambda: self.table.segment_generation(self.row), self._generation,
                        self._rescan, limits.READER_RESCAN_ATTEMPTS_MAX)
        if mapped is None:
            return False
        self._generation = mapped
        return True

    def _rescan(self) -> None:
        """Map the segment files that are there now (a system call, but only when
        the published generation says the set changed). The result is not trusted
        (``_generation`` stays unknown) until the caller has checked the generation
        did not move during the listing."""
        self._generation = None
        try:
            listed = os.listdir(self.directory)
        except FileNotFoundError:
            raise self._deleted("its directory is gone") from None
        names = sorted(name for name in listed
                       if name.endswith(I.LOG_SUFFIX) and name[:-len(I.LOG_SUFFIX)].isdigit())
        kept = {segment.base_offset: segment for segment in self._segments}
        segments = []
        for name in names:
            base = int(name[:-len(I.LOG_SUFFIX)])
            old = kept.pop(base, None)
            try:
                status = os.stat(os.path.join(self.directory, name))
            except FileNotFoundError:
                if old is not None:
                    old.close()
                continue                       # deleted since the listing
            # A roll trims the index even when the log was full to the byte: both
            # files must be as mapped for a mapping to be kept.
            if old is not None and (old.size, old.inode) == (status.st_size, status.st_ino) \
                    and old.index_identity == _identity(old.index_path):
                segments.append(old)
                continue
            fresh = _MappedSegment(self.directory, base)
            if fresh.inode < 0:                # deleted between the stat and the mapping
                fresh.close()
                if old is not None:
                    old.close()
                continue
            if old is not None:
                if old.inode == fresh.inode:   # same bytes, now trimmed or grown
                    fresh.verified_end = min(old.verified_end, fresh.size)
                elif self._cursor[1] == base:  # a cleaned copy: its byte positions differ
                    self._cursor = (-1, -1, 0)
                old.close()
            segments.append(fresh)
        for gone in kept.values():
            gone.close()
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]

    def snapshot(self) -> RowSnapshot:
        """The partition's published row.

        Raises
        ------
        UnknownTopicOrPartitionError
            The partition was deleted: its row is free, or another partition's now
            (the message tells which).
        StateTableInconsistentError
            A word of the row is out of its range (``state.check_row``).
        """
        row = self.table.snapshot(self.row)
        # A row being freed publishes -1 offsets before it drops its topic key; a
        # hosted partition's row is published before its metadata is handed out.
        if row.topic_key == S.FREE_TOPIC_KEY:
            raise self._deleted(f"the topic was deleted: its state table row {self.row} "
                                f"is free now")
        if row.topic_key != self.topic_key or row.partition != self.partition:
            # Told apart from a free row: the row was freed, then given to another.
            raise self._deleted(
                f"the topic was deleted and its state table row {self.row} was reused "
                f"by another partition (topic key {row.topic_key:#x}, partition "
                f"{row.partition})")
        if row.high_watermark < 0:
            raise self._deleted(f"the topic was deleted: its state table row {self.row} "
                                f"is being freed")
        return check_row(self.table.name, self.row, row)

    def deleted(self) -> bool:
        """Was the partition deleted (its row freed or given to another)?"""
        try:
            self.snapshot()
        except UnknownTopicOrPartitionError:
            return True
        return False

    def _deleted(self, why: str) -> UnknownTopicOrPartitionError:
        return UnknownTopicOrPartitionError(
            f"{self.directory}: the partition is gone ({why}); consume an existing "
            f"topic, or create it again and assign its partitions anew")

    def high_watermark(self) -> int:
        return self.table.high_watermark(self.row)

    def end_offset(self, row: RowSnapshot | None = None) -> int:
        """Where this reader's reads end now (of ``row``, a snapshot just taken): the
        high watermark, or for read_committed the last stable offset (Kafka's end
        offset and lag in that isolation level)."""
        row = row if row is not None else self.snapshot()
        return min(row.last_stable_offset, row.high_watermark) if self.read_committed \
            else row.high_watermark

    def read(self, offset: int, max_bytes: int = limits.READ_SIZE_DEFAULT) -> ReadResult:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least
        one batch), all below the published high watermark.

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below the log start or above the high watermark.
        UnknownTopicOrPartitionError
            The partition was deleted.
        CorruptSegmentError
            A batch fails its CRC.
        """
        row = self.snapshot()
        if not row.log_start_offset <= offset <= row.high_watermark:
            raise OffsetOutOfRangeError(
                f"{self.directory}: offset {offset} is outside [{row.log_start_offset}, "
                f"{row.high_watermark}]", offset=offset, log_start_offset=row.log_start_offset,
                log_end_offset=row.high_watermark)
        # What this read may return stops here: the last stable offset for
        # read_committed (published with or after the high watermark loaded: the lower).
        high_watermark = self.high_watermark_seen = self.end_offset(row)
        empty = ReadResult(np.zeros(0, np.uint8), offset, row.active_segment_base_offset)
        if offset >= high_watermark:
            return empty
        # Mappings may end up newer than ``row`` (the generation moved since it was
        # loaded): that is safe, as they were all made at the files' current sizes,
        # and a segment newer than the row's active one holds only offsets at or
        # above its high watermark, which this read never reaches.
        if row.segment_generation != self._generation and not self._map_generation():
            return empty          # files are changing: no records now, the position stays
        if self.read_committed and \
                self._aborted_read_at != (row.aborted_generation, self._generation):
            self._read_aborted((row.aborted_generation, self._generation))
        index = bisect.bisect_right(self._bases, offset) - 1
        while 0 <= index < len(self._segments):
            segment = self._segments[index]
            active = segment.base_offset == row.active_segment_base_offset
            end = min(row.active_segment_size, segment.size) if active else segment.size
            cursor_offset, cursor_base, cursor_position = self._cursor
            if cursor_base == segment.base_offset and cursor_offset <= offset:
                position = segment.position_of(offset, end, cursor_position, active)
            else:
                position = segment.position_of(offset, end, 0, active)
            if position < end:
                break
            index += 1            # the offset lies in a gap after this segment's last batch
        else:
            # Nothing at or after the offset below the high watermark: compaction
            # removed the rest, so the next record will be at the watermark or later.
            return ReadResult(empty.data, high_watermark, row.active_segment_base_offset)
        stop, next_offset, segment.verified_end = collect_batches(
            segment.log, segment.log_path, position, end, max_bytes, high_watermark,
            segment.verified_end, offset)
        if next_offset < 0:
            return empty
        self._cursor = (int(next_offset), segment.base_offset, int(stop))
        if self._all_aborted.shape[0]:
            # Those a read of [offset, next_offset) meets (collectAbortedTxns' bounds).
            found = self._all_aborted
            self.aborted = found[(found[:, 2] >= offset) & (found[:, 1] < next_offset)]
        return ReadResult(segment.log[position:stop], int(next_offset), segment.base_offset)

    def _read_aborted(self, read_at: tuple[int, int]) -> None:
        """Read the aborted transactions of the segments mapped (their ``.txnindex``):
        every one when the set of segments changed, else the last alone (the broker
        indexes an abort in the active segment, the one holding its marker), so a
        partition of many segments costs one file read per abort, not one per
        segment."""
        same_segments = self._aborted_read_at is not None \
            and self._aborted_read_at[1] == read_at[1]
        for segment in self._segments[-1:] if same_segments else self._segments:
            self._segment_aborted[segment.base_offset] = read_aborted(
                txn_index_path(segment.log_path))
        found = [self._segment_aborted.get(segment.base_offset, _NO_ROWS)
                 for segment in self._segments]
        self._segment_aborted = {segment.base_offset: rows
                                 for segment, rows in zip(self._segments, found)}
        rows = np.concatenate(found) if found else _NO_ROWS
        self._all_aborted = np.stack([rows[name].astype(np.int64) for name in
                                      ("producer_id", "first_offset", "last_offset")], axis=1) \
            if rows.size else NO_ABORTED
        self.aborted = NO_ABORTED
        self._aborted_read_at = read_at

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments.clear()
        self._bases.clear()
