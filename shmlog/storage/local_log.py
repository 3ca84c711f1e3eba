"""The segments of one partition's directory (Kafka's ``LocalLog``): the segment list,
the checkpoint, appending validated batches, rolling, reading, truncating, and the
swap of cleaned segments the cleaner hands back.

Rules
-----
* One writer per partition directory: the process that owns the log. Readers in
  other processes map segments read-only and rely on the high watermark published
  elsewhere; nothing below it ever changes in place (truncation only removes what
  lies above the high watermark).
* Bytes enter only through :meth:`LocalLog.append`, of batches the caller validated
  (``log_validator``), or through a compiled writer's own ``append_batches``.
* Offsets never go back: a segment never starts below the log end, and a
  truncation leaves a gap compaction made before the cut part of the log.
* Every change of the set of segment files moves the segment generation, a seqlock
  whose rules ``segment_generation`` holds: odd around a change that removes or
  replaces files (:meth:`LocalLog.segments_changing`: the front segments retention
  deletes, truncation, a compaction swap), by two after a roll. The listener hears
  of each (:class:`LogChange`) at once, from inside the change.
* ``checkpoint.json`` holds the recovery point (everything below it was flushed),
  the log start offset and the clean offset; it is replaced atomically.

Theory of operation
-------------------
A partition is a directory of segments named by base offset, as in Kafka::

    00000000000000000000.log  .index  .timeindex  .txnindex
    00000000000000368769.log  .index  .timeindex      <- active segment
                                                       (.txnindex: its aborted
                                                       transactions, when it had any)
    checkpoint.json                                    recovery point, log start offset
    leader-epoch-checkpoint.json                       epoch -> start offset (leader_epochs)
    00000000000000368769.producers.json                producers' last batches below it,
                                                       written at the roll (producer_snapshots)

The segments are kept in base-offset order, the active one last, with their base
offsets beside them for a binary search. :meth:`LocalLog.append` calls the append
kernel and, when it asks, rolls or reserves room and calls it again. A roll
reserves the new segment's first step before mapping its files and before sealing
the old segment: a full disk fails the roll with nothing changed, and the next
append tries again. Whoever owns the log hears of every roll (``rolled``: the
producer snapshot is taken there).

A log that starts empty (a new partition, an empty directory, a truncation that
restarts the log) has an active segment with no file: it is made by the first
append, and the generation moves then as for a roll. A new partition is its
directory alone, and a crash before its first append leaves just that, which the
loader opens as an empty log; nothing acknowledged can be in a file not made yet.

The transactions aborted in a segment are indexed in its ``.txnindex``
(``transaction_index``): :meth:`LocalLog.append_aborted_transaction` adds to the
active segment's, :meth:`LocalLog.aborted_transactions` collects them across
segments (Kafka's ``collectAbortedTransactions``), a truncation cuts them with the
log, deleting a segment deletes them, a swap carries them into the cleaned segment.

Compaction writes cleaned segments into ``.cleaning``; a swap
(:meth:`LocalLog.replace_segments`) commits a manifest, renames the cleaned files
over the first segment of each group and deletes the others. :func:`finish_swap`
does those steps, and redoes them at the next open after a crash.
"""

from __future__ import annotations

import bisect
import enum
import json
import logging
import os
import shutil
import time
from typing import Callable

import numpy as np

from ..common import access, limits
from ..common.errors import CorruptSegmentError, OffsetOutOfRangeError, StorageError
from ..record import batch_layout as B
from ..record.records import batch_info
from . import index_layout as I
from .durable_files import fsync_directory, write_atomically
from .log_segment import Segment
from .reservation import ReservePace
from .segment_append import append_batches
from .segment_generation import SegmentGeneration
from .segment_read import ReadResult, collect_batches
from .segment_state import APPENDED, CAPACITY_WORD, NEED_ROLL, NEXT_OFFSET_WORD, REJECTED
from .topic_config import TopicConfig
from .transaction_index import AbortedTransaction

log = logging.getLogger(__name__)

__all__ = ["LocalLog", "LogChange", "CHECKPOINT_FILE", "CLEANING_DIRECTORY",
           "SWAP_MANIFEST_FILE", "read_checkpoint", "finish_swap", "write_swap_manifest"]

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1
# Compaction writes cleaned segments here, then renames them into place; the
# manifest lists a swap in progress, so recovery can finish it (see finish_swap).
CLEANING_DIRECTORY = ".cleaning"
SWAP_MANIFEST_FILE = "cleaning-swap.json"


class LogChange(enum.Enum):
    """What a partition log tells its listener changed (see
    ``PartitionLog.set_listener``). Each one makes the writer's ``AppendTarget``,
    or the offsets it published, stale."""
    APPENDED = "appended"                  # append() took batches (and may have rolled)
    ROLLED = "rolled"                      # a new active segment, outside a change of files
    SEGMENT_FILES_CHANGING = "segment files changing"   # the generation turned odd or even:
    #   retention (or DeleteRecords' deletion), truncation or a compaction swap begins or
    #   ends; publish before returning
    LOG_START_MOVED = "log start moved"    # DeleteRecords
    CONFIG_CHANGED = "config changed"      # the target's limits and compiled flag may differ


class LocalLog:
    """The segments of one partition's directory and its checkpoint.

    Parameters
    ----------
    directory : str
        The partition's directory (created if missing).
    config : TopicConfig
        The topic's effective configuration.
    rolled : callable
        ``rolled(sealed, base_offset)``, called after every roll with the segment
        just sealed and the new active segment's base offset.
    new : bool
        The directory was just made, empty, by the caller: there is no checkpoint
        to read and no directory to make.

    Attributes
    ----------
    segments, bases : list
        The segments in base-offset order, the active one last, and their base
        offsets; changed only by this class's methods (and ``log_loader``'s, through
        :meth:`adopt_segment`), in place: the lists are never rebound.
    recovery_point, log_start_offset, clean_offset : int
        The checkpoint's offsets: everything below the recovery point was flushed;
        nothing below the log start is readable; records below the clean offset
        were compacted.
    """

    def __init__(self, directory: str, config: TopicConfig, *,
                 rolled: Callable[[Segment, int], None], new: bool = False):
        self.directory = directory
        self._config = config
        self._rolled = rolled
        # The partition's writer, told of every change (see set_listener).
        self._listener: Callable[[LogChange], None] | None = None
        # Moves whenever the set of segment files changes (readers list it again then).
        self._generation = SegmentGeneration(directory)
        if not new:
            try:
                access.make_directories(directory)
            except OSError as error:
                raise StorageError(f"cannot create {directory}: {error}") from error
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        # How far ahead the active segment reserves: passed from segment to segment.
        self.pace = ReservePace(time.monotonic())
        checkpoint = {} if new else read_checkpoint(directory)
        self.recovery_point = checkpoint.get("recovery_point", 0)
        self.log_start_offset = checkpoint.get("log_start_offset", 0)
        # Where the last compaction stopped: records below it are clean.
        self.clean_offset = checkpoint.get("clean_offset", 0)
        # What the file holds, so an unchanged checkpoint is not written again (two
        # fsyncs per partition: thousands of them make a broker's shutdown slow).
        # A new log's offsets (all 0) are what a missing file means: nothing to write
        # until one moves, so a partition never written costs no close-time fsync.
        self._checkpointed = self._checkpoint_fields() if checkpoint or new else None
        # Entries made or removed since the directory was last fsynced (a new one
        # holds none: its first segment's files set this).
        self._directory_changed = not new

    @property
    def config(self) -> TopicConfig:
        """The topic's effective configuration; setting it tells the listener
        (``LogChange.CONFIG_CHANGED``: the append target's limits moved)."""
        return self._config

    @config.setter
    def config(self, config: TopicConfig) -> None:
        self._config = config
        self.tell(LogChange.CONFIG_CHANGED)

    @property
    def generation(self) -> int:
        """The segment generation (see ``segment_generation``)."""
        return self._generation.value

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(segment.size for segment in self.segments)

    # -- the listener ------------------------------------------------------------------
    def set_listener(self, listener: Callable[[LogChange], None] | None) -> None:
        """Tell ``listener`` (None: nobody) of every change (see
        ``PartitionLog.set_listener``)."""
        self._listener = listener

    def tell(self, change: LogChange) -> None:
        """Tell the listener, if any, of ``change``."""
        if self._listener is not None:
            self._listener(change)

    def segments_changing(self):
        """Bracket a change that removes or replaces segment files (the seqlock's
        writer side, see ``segment_generation``): the listener publishes the odd
        generation before the first file operation and the even one after the last
        (``LogChange.SEGMENT_FILES_CHANGING``), when every other field it publishes
        has its new value."""
        return self._generation.changing(lambda: self.tell(LogChange.SEGMENT_FILES_CHANGING))

    # -- the segment list ----------------------------------------------------------------
    def adopt_segment(self, segment: Segment) -> None:
        """Add a segment found on disk after the others (``log_loader``'s); it
        reserves at the partition's pace."""
        segment.pace = self.pace
        self._directory_changed = True
        self.segments.append(segment)
        self.bases.append(segment.base_offset)

    def add_segment(self, base_offset: int) -> Segment:
        """A new, empty active segment with no file yet (``Segment.create``'s
        ``deferred``): an idle partition holds no file, mapping or block; the first
        append makes them (:meth:`append`)."""
        segment = Segment.create(self.directory, base_offset, self.config, pace=self.pace,
                                 deferred=True)
        self.adopt_segment(segment)
        return segment

    def _materialize_active(self) -> None:
        """Make the pending active segment's files before the first append into it.
        The generation moves by two, as a roll's does: a reader that listed the
        directory while it held no file of this segment lists it again before it
        reads an offset published after this."""
        if self.segments[-1].materialize():
            self._directory_changed = True
            self._generation.rolled()

    def reactivate_last(self) -> None:
        """Make the last (sealed) segment the active one again, keeping the state its
        files gave. (A full index makes the next append roll it.)"""
        self.active.reopen_for_append()

    def delete_first_segment(self) -> Segment:
        """Remove the first segment from the list and delete its files (retention's;
        the caller brackets it with :meth:`segments_changing`)."""
        segment = self.segments.pop(0)
        self.bases.pop(0)
        self._directory_changed = True
        segment.delete()
        return segment

    def segment_index_for(self, offset: int) -> int:
        """Where in :attr:`segments` the segment that would hold ``offset`` is (the
        last whose base offset is at or below it); -1 below the first."""
        return bisect.bisect_right(self.bases, offset) - 1

    # -- checkpoint ----------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        """Replace ``checkpoint.json`` with the current offsets.

        Raises
        ------
        StorageError
            It could not be written; the old one stays.
        """
        fields = self._checkpoint_fields()
        if fields == self._checkpointed:
            return
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        body = json.dumps({"version": CHECKPOINT_VERSION, "recovery_point": fields[0],
                           "log_start_offset": fields[1], "clean_offset": fields[2]})
        write_atomically(path, body)
        self._checkpointed = fields

    def _checkpoint_fields(self) -> tuple[int, int, int]:
        return self.recovery_point, self.log_start_offset, self.clean_offset

    # -- appending and rolling -------------------------------------------------------------
    def append(self, source: np.ndarray, append_time: int, leader_epoch: int,
               keep_offsets: bool = False) -> None:
        """Copy validated batches in through ``append_batches``, rolling and
        reserving as it asks (with ``keep_offsets``, a roll starts the new segment
        at the base offset of the batch that asked for it, as Kafka's follower
        rolls at the batch's first offset).

        Raises
        ------
        StorageError
            The disk is full or failed; the batches before the failing one are in.
        """
        config = self._config
        position = 0
        self._materialize_active()
        while True:
            segment = self.segments[-1]
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

    def roll(self, log_reserved: int = 0) -> Segment:
        """Seal the active segment and start a new one at the log end offset, with
        blocks for its first ``log_reserved`` bytes reserved; an empty active
        segment stays. Tells the listener (``LogChange.ROLLED``), unless the roll is
        part of a change of the segment files, whose end tells it.

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
            self.tell(LogChange.ROLLED)
        return segment

    def _roll(self, log_reserved: int, base_offset: int | None = None) -> Segment:
        """:meth:`roll` of the active segment, telling nobody (an append's roll: the
        append tells); the new segment starts at ``base_offset`` (a follower's batch
        past a gap), default the log end."""
        base = self.log_end_offset if base_offset is None else base_offset
        assert base >= self.log_end_offset, "a segment never starts below the log end"
        segment = Segment.create(self.directory, base, self.config, log_reserved, self.pace)
        try:
            self.active.close_for_append()
        except StorageError:
            segment.delete()
            raise
        sealed = self.active
        self.adopt_segment(segment)
        self._generation.rolled()
        self._rolled(sealed, base)
        if log_reserved:
            segment.prefault_ahead()       # appends are under way: keep ahead of them
        return segment

    # -- flushing ----------------------------------------------------------------------------
    def sync(self) -> None:
        """msync every unflushed segment and fsync the directory.

        Raises
        ------
        StorageError
            A sync failed.
        """
        for segment in self.segments:
            if segment.flushed_end < segment.size or segment.txn_index.unsynced:
                segment.sync()
        if self._directory_changed:
            self._directory_changed = False
            try:
                fsync_directory(self.directory)
            except StorageError:
                self._directory_changed = True
                raise

    def checkpoint_recovery_point(self) -> None:
        """Move the recovery point to the log end (everything is synced) and write the
        checkpoint.

        Raises
        ------
        StorageError
            The checkpoint could not be written; the recovery point did not move.
        """
        previous, self.recovery_point = self.recovery_point, self.log_end_offset
        try:
            self.write_checkpoint()
        except StorageError:
            self.recovery_point = previous
            raise

    # -- reading -------------------------------------------------------------------------------
    def out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        """The error for ``offset`` outside ``[log start, log end]``."""
        return OffsetOutOfRangeError(
            f"{self.directory}: offset {offset} is outside the log "
            f"[{self.log_start_offset}, {self.log_end_offset}]; seek to a valid offset "
            f"(auto_offset_reset chooses one)", offset=offset,
            log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset)

    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> ReadResult:
        """Whole batches from the one holding ``offset`` (``PartitionLog.read``)."""
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise self.out_of_range(offset)
        upper = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        index = self.segment_index_for(offset)
        empty = np.zeros(0, np.uint8)
        while 0 <= index < len(self.segments):
            segment = self.segments[index]
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
        """(offset, timestamp) of the first record whose timestamp is >= ``timestamp``
        (``PartitionLog.offset_for_timestamp``).

        Segments are found by binary search over the running maximum of their
        largest timestamps (the first segment whose maximum reaches ``timestamp``
        holds the answer), then through the segment's time index.
        """
        segments = self.segments
        running = np.maximum.accumulate([segment.max_timestamp for segment in segments])
        first = int(np.searchsorted(running, timestamp, side="left"))
        found = None
        for searched, segment in enumerate(segments[first:], first):  # noqa: B007 - read after
            if segment.max_timestamp < timestamp or segment.next_offset <= self.log_start_offset:
                continue
            found = segment.offset_for_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                break
        else:
            searched = len(segments) - 1
        # A damaged segment's timestamps past its damage are unknown: the answer could
        # be in there, so any answer after it would be a guess.
        for segment in segments[:searched + 1]:
            if segment.damaged_at >= 0 and segment.next_offset > self.log_start_offset:
                raise CorruptSegmentError(
                    f"{segment.log_path}: damaged from byte {segment.damaged_at}; records "
                    f"there may hold timestamp {timestamp}", path=segment.log_path,
                    position=segment.damaged_at)
        return found

    # -- aborted transactions ----------------------------------------------------------------
    def append_aborted_transaction(self, entry: AbortedTransaction) -> None:
        """Index an aborted transaction in the active segment's ``.txnindex`` (the
        segment holding its abort marker, ``entry.last_offset``), made at its first
        entry (``PartitionLog.append_aborted_transaction``).

        Raises
        ------
        AbortedTransactionOrderError
            Its last offset is not past the previous entry's, or lies below the active
            segment; nothing was written.
        StorageError
            The write failed; nothing was indexed.
        """
        if self.active.txn_index.append(entry):
            self._directory_changed = True          # a new file: the next sync fsyncs it

    def restore_aborted_transactions(self, segment: Segment,
                                     entries: list[AbortedTransaction]) -> int:
        """Put back into a closed segment's ``.txnindex`` the aborted transactions a
        walk of it found (``entries``, in marker order) that the index lacks: an OS
        crash can keep a marker the kernel wrote back and lose its entry. The index is
        written again from the first missing entry on, every entry it held kept, and
        synced. Returns how many were missing.

        Raises
        ------
        StorageError
            The index cannot be written.
        """
        existing = segment.txn_index.entries()
        held = {(entry.producer_id, entry.last_offset) for entry in existing}
        missing = [entry for entry in entries
                   if (entry.producer_id, entry.last_offset) not in held]
        if not missing:
            return 0
        start = missing[0].last_offset
        segment.txn_index.truncate_to(start)
        for entry in sorted([entry for entry in existing if entry.last_offset >= start]
                            + missing, key=lambda entry: entry.last_offset):
            if segment.txn_index.append(entry):
                self._directory_changed = True      # a new file: the next sync fsyncs it
        segment.txn_index.sync()
        return len(missing)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """Every indexed aborted transaction overlapping ``[start_offset, end_offset)``
        (last offset at or past the start, first offset below the end), in order: the
        entries of the segment holding ``start_offset`` and of every segment after it
        (a transaction begun in the range may have its marker far past it), until an
        entry's last stable offset reaches ``end_offset``, which says no later one can
        overlap (Kafka's ``collectAbortedTransactions``)."""
        found: list[AbortedTransaction] = []
        for segment in self.segments[max(self.segment_index_for(start_offset), 0):]:
            entries, complete = segment.txn_index.collect(start_offset, end_offset)
            found += entries
            if complete:
                break
        return found

    # -- truncation ------------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset``, which lies above the log
        start and below the log end (``PartitionLog.truncate_to``), and checkpoint."""
        with self.segments_changing():
            while len(self.segments) > 1 and self.bases[-1] >= offset:
                self.segments.pop().delete()
                self.bases.pop()
                self.reactivate_last()
            segment = self.active
            position = segment.position_of(offset)
            if position < segment.size:
                first_dropped = batch_info(segment.log, position).base_offset
                segment.truncate(position)
                # A gap left by compaction before the dropped batch stays part of the log.
                segment.state[NEXT_OFFSET_WORD] = max(segment.next_offset,
                                                      min(offset, first_dropped))
            # No marker at or past the cut is left (a gap at the end held none either).
            segment.txn_index.truncate_to(offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self.write_checkpoint()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset``; checkpoint."""
        with self.segments_changing():
            for segment in self.segments:
                segment.delete()
            self.segments.clear()
            self.bases.clear()
            self.add_segment(offset)
            self.log_start_offset = offset
            self.recovery_point = offset
            self.write_checkpoint()

    # -- compaction ------------------------------------------------------------------------------
    def replace_segments(self, cleaning, topic_id: str | None) -> bool:
        """Swap in the cleaned segments of a ``cleaner.Cleaning`` of the topic
        ``topic_id`` (``PartitionLog.replace_segments``); False, and nothing changed
        but its cleaned files thrown away, when it was planned for another topic or
        the segments it cleaned changed since."""
        discard = os.path.join(self.directory, CLEANING_DIRECTORY)
        if cleaning.topic_id != topic_id:
            # Same directory, same layout maybe, but the records of another topic:
            # the cleaner's offset map (or the files it read) were the old topic's.
            log.warning("%s: refusing a cleaning planned for topic id %s (the topic is now "
                        "%s)", self.directory, cleaning.topic_id, topic_id)
            shutil.rmtree(discard, ignore_errors=True)
            return False
        current = {segment.base_offset: segment for segment in self.segments[:-1]}
        for planned in cleaning.plan.segments:
            segment = current.get(planned.base_offset)
            if planned.next_offset > cleaning.end_offset:
                break
            if segment is None or segment.size != planned.size:
                shutil.rmtree(discard, ignore_errors=True)
                return False
        write_swap_manifest(self.directory, cleaning.groups)     # changes no segment file
        with self.segments_changing():
            replaced = {base for group in cleaning.groups for base in group.replaces}
            for base in replaced:
                current[base].close()            # the broker's own mappings of the old files
            finish_swap(self.directory, self.config)
            cleaned = {group.base_offset for group in cleaning.groups}
            segments = []
            for segment in self.segments:
                if segment.base_offset in cleaned:
                    segment = Segment(self.directory, segment.base_offset, self.config,
                                      active=False)
                    if not segment.load_closed():
                        segment.rebuild()
                elif segment.base_offset in replaced:
                    continue
                segments.append(segment)
            self.segments[:] = segments
            self.bases[:] = [segment.base_offset for segment in segments]
            self.clean_offset = cleaning.end_offset
            self.write_checkpoint()
        return True

    def close(self) -> None:
        """Release every segment's mappings and forget the segments (the caller sealed
        and flushed what it could)."""
        for segment in self.segments:
            segment.close()
        self.segments.clear()
        self.bases.clear()


def read_checkpoint(directory: str) -> dict:
    """The offsets of ``directory``'s ``checkpoint.json``: ``recovery_point``,
    ``log_start_offset`` and ``clean_offset``; empty when it is missing, unreadable,
    of another version or out of range (recovery then starts from offset 0)."""
    path = os.path.join(directory, CHECKPOINT_FILE)
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


def finish_swap(directory: str, config: TopicConfig) -> None:
    """Complete a swap of cleaned segments that the manifest says was begun, or
    throw away cleaned files that never got that far.

    Every step is durable before the next one starts, and each can run again
    after a crash: the cleaned files of every group are renamed into place and
    the directory fsynced before the first replaced segment is deleted (until
    then the old segments hold every record); the deletions are fsynced before
    the manifest, which would redo them, goes; and its removal is fsynced, so a
    manifest never comes back to replay an old swap over a later cleaning.
    """
    manifest_path = os.path.join(directory, SWAP_MANIFEST_FILE)
    cleaning = os.path.join(directory, CLEANING_DIRECTORY)
    committed = True
    try:
        with open(manifest_path) as source:
            groups = json.load(source)["groups"]
    except FileNotFoundError:
        groups, committed = [], False
    except (OSError, ValueError, KeyError, TypeError) as error:
        # The manifest is written atomically after the cleaned files are on disk:
        # unreadable, it was never committed, and the old segments are intact.
        log.warning("%s: ignoring unreadable %s (%s)", directory, manifest_path, error)
        groups = []
    if groups:
        for group in groups:
            base = int(group["base_offset"])
            # The log last: whoever maps the cleaned log finds its indexes in
            # place (a reader still checks an index entry against its log). A
            # cleaned group has a .txnindex (perhaps empty) when a segment it
            # replaces had one.
            for suffix in (I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX, I.TXN_INDEX_SUFFIX,
                           I.LOG_SUFFIX):
                name = I.segment_file_name(base, suffix)
                if os.path.exists(os.path.join(cleaning, name)):
                    os.replace(os.path.join(cleaning, name), os.path.join(directory, name))
        fsync_directory(directory)
        for group in groups:
            base = int(group["base_offset"])
            for replaced in group["replaces"]:
                if int(replaced) != base:
                    Segment(directory, int(replaced), config, active=False).delete()
        fsync_directory(directory)
    shutil.rmtree(cleaning, ignore_errors=True)
    if committed:
        try:
            os.unlink(manifest_path)
        except FileNotFoundError:
            pass
        fsync_directory(directory)


def write_swap_manifest(directory: str, groups) -> None:
    """Commit a swap of cleaned segments (``cleaner.CleanedGroup``s): from here on,
    :func:`finish_swap` completes it, even after a crash.

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
