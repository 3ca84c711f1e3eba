"""The partition state table: offsets the broker publishes, read without a syscall.

Rules
-----
* The broker owns the table and is its only writer, and the permissions enforce
  it: the table is made with the data directory's file mode (0600, or 0640 with a
  ``data_group``), and clients map it read-only. The only words clients write, the
  doorbells, live in an object of their own (``state_layout``: the doorbell
  object), 0660 with a group. A member of the data group can therefore ring or
  miscount a doorbell (a wake-up too many, or a sleep until its timeout), never
  change what a consumer of another user reads.
* A reader checks the words of its row before it uses them (:func:`check_row`):
  only the broker's user or root can write them, but a word out of its range is
  :class:`StateTableInconsistentError` naming the table, never an overflow, a
  false damaged-data error or a silent empty read.
* Publishing a row writes every other field, then the high watermark with a release
  store. Reading loads the high watermark with an acquire load first, so all bytes
  below it in the segment files are visible (see ``state_layout``).
* The segment generation is a seqlock over the partition's set of files, whose
  rules ``segment_generation`` holds; this module stores and loads it (release,
  and a fence then acquire: :func:`load_segment_generation`).
* Every publish names its row in the journal of changed rows after the row's
  stores (:func:`publish_row`); the journal's sequence is stored (release) by
  :func:`journal_flush`, which whoever publishes calls before anyone may be told
  of what was published (a producer's completion, the consumers' doorbell), and
  :func:`publish_row` itself every ``JOURNAL_UNFLUSHED_MAX`` publishes.
* The broker trusts nothing a reader could write: its journal cursor is checked
  (slot positions are masked, a cursor out of its window starts again at the
  published sequence), so a scribbled control area costs readers a full look at
  their rows, never memory safety (``state_layout``: the journal).

Theory of operation
-------------------
A consumer holding many partitions follows the journal (:func:`journal_changes`):
from the sequence it saw to the one published, the rows named are those whose
change it may not have read yet; it reads those, and any it knows have more, and
once in a while, or when it was lapped, every one (``client/fetcher.py``). A row
published again before the sequence moves is not named twice: a reader learns of
the slot only from a sequence stored after the latest publish, so it reads the row
after that publish, whichever it was.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import time

import numpy as np

from ..common import access, limits
from ..common.errors import LocalProtocolError, PeerProtocolError, StateTableInconsistentError
from ..native.atomics import fence, load_acquire, load_relaxed, store_relaxed, store_release
from ..native.jit import kernel
from . import shared_memory
from . import state_layout as S
from .wakeup import Doorbell

__all__ = ["PartitionStateTable", "RowSnapshot", "topic_key", "publish_row", "check_row",
           "load_last_stable_offset",
           "bells_name", "unlink_table",
           "load_high_watermark", "load_segment_generation", "journal_note", "journal_flush",
           "journal_changes", "journal_sequence", "JOURNAL_LAPPED"]

# What journal_changes returns for a count when the reader must look at every row: it
# was lapped (slots it had not read may be written over) or the sequence went back.
JOURNAL_LAPPED = -1


@kernel
def journal_note(control, row):
    """Name ``row`` in the journal after a publish of it (the broker's side): a new
    slot unless one written since the sequence was last stored names it already,
    and the sequence stored once ``JOURNAL_UNFLUSHED_MAX`` publishes wait on it."""
    sequence = load_relaxed(control, S.JOURNAL_SEQUENCE_WORD)     # only the broker stores it
    written = control[S.JOURNAL_WRITTEN_WORD]
    pending = control[S.JOURNAL_PENDING_WORD]
    # A cursor out of its window was scribbled on: start again from the sequence.
    if not (0 <= written - sequence <= pending < S.JOURNAL_UNFLUSHED_MAX):
        written, pending = sequence, 0
    named = False
    for position in range(sequence, written):
        if load_relaxed(control, S.JOURNAL_SLOTS_WORD + (position & S.JOURNAL_SLOT_MASK)) == row:
            named = True
            break
    if not named:
        store_relaxed(control, S.JOURNAL_SLOTS_WORD + (written & S.JOURNAL_SLOT_MASK), row)
        written += 1
    pending += 1
    if pending >= S.JOURNAL_UNFLUSHED_MAX:
        store_release(control, S.JOURNAL_SEQUENCE_WORD, written)
        pending = 0
    control[S.JOURNAL_WRITTEN_WORD] = written
    control[S.JOURNAL_PENDING_WORD] = pending


@kernel
def journal_flush(control):
    """Publish the journal's slots written so far (release: they, and the rows
    published before them, are visible to whoever loads the new sequence)."""
    sequence = load_relaxed(control, S.JOURNAL_SEQUENCE_WORD)
    written = control[S.JOURNAL_WRITTEN_WORD]
    if 0 < written - sequence <= S.JOURNAL_UNFLUSHED_MAX:
        store_release(control, S.JOURNAL_SEQUENCE_WORD, written)
    else:
        control[S.JOURNAL_WRITTEN_WORD] = sequence      # nothing written, or scribbled on
    control[S.JOURNAL_PENDING_WORD] = 0


@kernel
def journal_sequence(control):
    """The journal's published sequence (acquire: every row publish its slots name
    is visible). A reader about to look at every row loads it first, so that what
    changes during the look is named from here on."""
    return load_acquire(control, S.JOURNAL_SEQUENCE_WORD)


@kernel
def journal_changes(control, seen, out):
    """The rows named since sequence ``seen`` (the reader's side, a seqlock):
    (sequence, count) with the rows in ``out[:count]`` (a slot array of
    ``JOURNAL_CAPACITY``); count is JOURNAL_LAPPED when the slots cannot be trusted
    (more new than the broker leaves unwritten, or the sequence went back), and the
    reader must look at every row."""
    first = load_acquire(control, S.JOURNAL_SEQUENCE_WORD)
    new = first - seen
    if new < 0 or new > S.JOURNAL_CAPACITY - S.JOURNAL_UNFLUSHED_MAX:
        return first, JOURNAL_LAPPED
    for index in range(new):
        out[index] = load_relaxed(control, S.JOURNAL_SLOTS_WORD
                                  + ((seen + index) & S.JOURNAL_SLOT_MASK))
    # The slot loads cannot move after the second load of the sequence: if it shows
    # the broker still short of the slots read (plus those it writes ahead), none of
    # them was written over while they were read.
    fence()
    last = load_acquire(control, S.JOURNAL_SEQUENCE_WORD)
    if last < first or last - seen > S.JOURNAL_CAPACITY - S.JOURNAL_UNFLUSHED_MAX:
        return last, JOURNAL_LAPPED
    return first, new


@kernel
def publish_row(rows, control, row, log_start_offset, log_end_offset, high_watermark,
                active_segment_base_offset, active_segment_size, segment_generation,
                last_stable_offset, aborted_generation):
    """Store a row's fields, the high watermark last (release: it covers the rest
    and every byte appended below it).

    The last stable offset is stored (release) just before it, after the aborted
    generation: a read_committed reader that loads it (acquire) finds every aborted
    transaction below it in the ``.txnindex`` files, which the broker wrote before
    this publish. A reader that pairs it with an older high watermark reads below
    the lower of the two.

    The active segment's base offset is stored (release) after the generation and
    the size: a reader that loads it (acquire) and sees a new active segment also
    sees the generation of that roll, so it maps the files again before it reads
    the sealed segment, whose files the roll trimmed. (Seeing a new base with an
    old generation, it would read a trimmed index through an old, longer mapping:
    SIGBUS.)

    The generation itself is stored with release too: every rename and unlink of a
    change to the segment files comes before the even generation that ends it, so a
    reader that loads that generation with acquire (load_segment_generation) and
    then lists the directory sees all of them.

    The row is then named in the journal (``control``: :func:`journal_note`); the
    caller stores the journal's sequence (:func:`journal_flush`) before it tells
    anyone of the publish."""
    base = row * S.ROW_WORDS
    store_relaxed(rows, base + S.ACTIVE_SEGMENT_SIZE_WORD, active_segment_size)
    store_relaxed(rows, base + S.LOG_START_OFFSET_WORD, log_start_offset)
    store_relaxed(rows, base + S.LOG_END_OFFSET_WORD, log_end_offset)
    store_release(rows, base + S.SEGMENT_GENERATION_WORD, segment_generation)
    store_release(rows, base + S.ACTIVE_SEGMENT_BASE_OFFSET_WORD, active_segment_base_offset)
    store_relaxed(rows, base + S.ABORTED_GENERATION_WORD, aborted_generation)
    store_release(rows, base + S.LAST_STABLE_OFFSET_WORD, last_stable_offset)
    store_release(rows, base + S.HIGH_WATERMARK_WORD, high_watermark)
    journal_note(control, row)


@kernel
def load_high_watermark(rows, row):
    """The published high watermark (acquire: records below it may be read)."""
    return load_acquire(rows, row * S.ROW_WORDS + S.HIGH_WATERMARK_WORD)


@kernel
def load_last_stable_offset(rows, row):
    """The published last stable offset (acquire: every aborted transaction below it
    is in the partition's ``.txnindex`` files) and the aborted generation that came
    with it."""
    base = row * S.ROW_WORDS
    last_stable_offset = load_acquire(rows, base + S.LAST_STABLE_OFFSET_WORD)
    return last_stable_offset, load_relaxed(rows, base + S.ABORTED_GENERATION_WORD)


@kernel
def load_segment_generation(rows, row):
    """The published segment generation, loaded after a full fence (the seqlock's
    read, see ``segment_generation``): the directory listing just made cannot be
    reordered after this load. Acquire: the listing that follows a load of an even
    generation sees every file operation published before it."""
    fence()
    return load_acquire(rows, row * S.ROW_WORDS + S.SEGMENT_GENERATION_WORD)


@kernel
def _snapshot(rows, row, out):
    base = row * S.ROW_WORDS
    out[S.HIGH_WATERMARK_WORD] = load_acquire(rows, base + S.HIGH_WATERMARK_WORD)
    # Before the generation and size: see publish_row.
    out[S.ACTIVE_SEGMENT_BASE_OFFSET_WORD] = load_acquire(
        rows, base + S.ACTIVE_SEGMENT_BASE_OFFSET_WORD)
    out[S.LAST_STABLE_OFFSET_WORD] = load_acquire(rows, base + S.LAST_STABLE_OFFSET_WORD)
    for field in (S.LOG_START_OFFSET_WORD, S.LOG_END_OFFSET_WORD, S.SEGMENT_GENERATION_WORD,
                  S.TOPIC_KEY_WORD, S.PARTITION_WORD, S.ACTIVE_SEGMENT_SIZE_WORD,
                  S.ABORTED_GENERATION_WORD):
        out[field] = load_relaxed(rows, base + field)


@dataclasses.dataclass(frozen=True)
class RowSnapshot:
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    active_segment_base_offset: int
    segment_generation: int
    topic_key: int
    partition: int
    active_segment_size: int
    last_stable_offset: int
    aborted_generation: int


def check_row(table: str, row: int, snapshot: RowSnapshot) -> RowSnapshot:
    """``snapshot`` of a live row (high watermark >= 0), its words checked against
    what the broker can publish: offsets in [0, OFFSET_MAX], the active segment's
    base at or below the log end, its size within a segment's, the generation not
    negative.

    Raises
    ------
    StateTableInconsistentError
        A word is out of its range (the table was written by another than the broker).
    """
    # One expression on the common path: this runs on every read of a partition.
    if 0 <= snapshot.log_start_offset <= _OFFSET_TOP and 0 <= snapshot.high_watermark \
            <= _OFFSET_TOP and 0 <= snapshot.active_segment_base_offset \
            <= snapshot.log_end_offset <= _OFFSET_TOP and 0 <= snapshot.active_segment_size \
            <= limits.SEGMENT_SIZE_MAX and snapshot.segment_generation >= 0 \
            and 0 <= snapshot.last_stable_offset <= _OFFSET_TOP:
        return snapshot
    wrong = _wrong_word(snapshot)
    if wrong is not None:
        raise StateTableInconsistentError(
            f"partition state table {table!r}, row {row}: {wrong}, which no broker "
            f"publishes; the table was tampered with (only the broker's user or root may "
            f"write it). The segment files are not at fault: restart the broker (it makes "
            f"a new table) and find who writes to /dev/shm/{table}", table=table, row=row)
    return snapshot


# The largest offset a row may hold: one below OFFSET_MAX, so a reader may add one.
_OFFSET_TOP = limits.OFFSET_MAX - 1


def _wrong_word(snapshot: RowSnapshot) -> str | None:
    """What is wrong with a live row's words, or None."""
    for name in ("log_start_offset", "log_end_offset", "high_watermark",
                 "active_segment_base_offset", "last_stable_offset"):
        value = getattr(snapshot, name)
        if not 0 <= value <= _OFFSET_TOP:
            return f"{name} is {value}"
    if snapshot.active_segment_base_offset > snapshot.log_end_offset:
        return (f"the active segment's base offset {snapshot.active_segment_base_offset} is "
                f"past the log end {snapshot.log_end_offset}")
    if not 0 <= snapshot.active_segment_size <= limits.SEGMENT_SIZE_MAX:
        return f"the active segment's size is {snapshot.active_segment_size}"
    if snapshot.segment_generation < 0:
        return f"the segment generation is {snapshot.segment_generation}"
    return None


def bells_name(table_name: str) -> str:
    """The name of the doorbell object of the table ``table_name``."""
    return table_name + S.BELLS_SUFFIX


def unlink_table(name: str) -> None:
    """Remove the table ``name`` and its doorbells from /dev/shm; no error if gone."""
    shared_memory.unlink(name)
    shared_memory.unlink(bells_name(name))


def topic_key(topic_id: str) -> int:
    """A non-zero int64 naming a topic in the table (from its hex id)."""
    key = int(topic_id[:16], 16) & 0x7FFF_FFFF_FFFF_FFFF
    return key or 1


class PartitionStateTable:
    """The table and its doorbells, mapped: ``create`` them in the broker, ``attach``
    to them elsewhere (the table read-only)."""

    def __init__(self, name: str, mapped, bells, *, owner: bool):
        self.name = name
        self._mapped = mapped
        self._bells = bells
        self.owner = owner
        self.control = np.frombuffer(mapped, np.int64, count=S.CONTROL_SIZE // S.WORD_SIZE)
        self.row_capacity = (len(mapped) - S.ROWS_OFFSET) // S.ROW_SIZE
        self.rows = np.frombuffer(mapped, np.int64, offset=S.ROWS_OFFSET,
                                  count=self.row_capacity * S.ROW_WORDS)
        self.bells = np.frombuffer(bells, np.int64, count=S.BELLS_WORDS)
        # Producers ring the first after publishing a ring entry; the broker rings the
        # second after publishing records.
        self.appender_doorbell = Doorbell(self.bells, S.APPENDER_SEQUENCE_WORD,
                                          S.APPENDER_SLEEPERS_WORD)
        self.consumer_doorbell = Doorbell(self.bells, S.CONSUMER_SEQUENCE_WORD,
                                          S.CONSUMER_SLEEPERS_WORD)

    @classmethod
    def scratch(cls, name: str, row_capacity: int, *, writable: bool) -> "PartitionStateTable":
        """A table in anonymous memory, all zeros (a warm-up's): ``writable`` as the
        broker maps its table, or read-only as a client does, so that the kernels
        compiled are those of that side."""
        mapped = mmap.mmap(-1, S.ROWS_OFFSET + row_capacity * S.ROW_SIZE,
                           access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        return cls(name, mapped, mmap.mmap(-1, S.BELLS_SIZE), owner=False)

    @classmethod
    def create(cls, name: str, row_capacity: int) -> "PartitionStateTable":
        """Make the table and its doorbells, replacing objects of ours of those
        names: only the owner of the data directory calls this. The table gets the
        policy's file mode (``access.current()``: the group may only read it), the
        doorbells its writable mode.

        Raises
        ------
        NotOwnedError
            Another user's object has one of the names.
        """
        if not isinstance(row_capacity, int) or row_capacity < 1:
            raise LocalProtocolError(
                f"row capacity must be a positive integer, got {row_capacity!r}")
        # Objects of ours left under these names are a dead broker's: the caller holds
        # the data directory's lock, so nobody uses them.
        policy = access.current()
        mapped = shared_memory.create(name, S.ROWS_OFFSET + row_capacity * S.ROW_SIZE,
                                      "partition state table", mode=policy.file_mode,
                                      group_id=policy.group_id, replace_stale=True)
        try:
            bells = shared_memory.create(bells_name(name), S.BELLS_SIZE, "state table doorbells",
                                         mode=policy.writable_mode, group_id=policy.group_id,
                                         replace_stale=True)
        except BaseException:
            mapped.close()
            shared_memory.unlink(name)
            raise
        shared_memory.write_magic_and_version(bells, S.BELLS_MAGIC, S.BELLS_VERSION)
        shared_memory.write_magic_and_version(mapped, S.MAGIC, S.VERSION)
        table = cls(name, mapped, bells, owner=True)
        table.control[S.ROW_CAPACITY_WORD] = row_capacity
        table.control[S.BROKER_PID_WORD] = os.getpid()
        table.control[S.BROKER_EPOCH_WORD] = time.time_ns()
        return table

    @classmethod
    def attach(cls, name: str) -> "PartitionStateTable":
        """Map the broker's table (read-only) and its doorbells, checking their headers.

        Raises
        ------
        PeerProtocolError
            An object is not a state table (or doorbells) of this version.
        ShmlogError
            There is no such table (no broker is running under that name).
        """
        mapped = shared_memory.attach(name, S.ROWS_OFFSET + S.ROW_SIZE, "partition state table",
                                      writable=False)
        try:
            bells = shared_memory.attach(bells_name(name), S.BELLS_SIZE,
                                         "state table doorbells")
        except BaseException:
            mapped.close()
            raise
        for what, memory, magic, version in (("partition state table", mapped, S.MAGIC,
                                              S.VERSION),
                                             ("state table doorbells", bells, S.BELLS_MAGIC,
                                              S.BELLS_VERSION)):
            found_magic, found_version = shared_memory.read_magic_and_version(memory)
            if found_magic != magic or found_version != version:
                mapped.close()
                bells.close()
                raise PeerProtocolError(f"{name!r} has no version-{version} {what} (magic "
                                        f"{found_magic:#x}, version {found_version})")
        table = cls(name, mapped, bells, owner=False)
        if table.control[S.ROW_CAPACITY_WORD] != table.row_capacity:
            said = table.control[S.ROW_CAPACITY_WORD]
            table.close()
            raise PeerProtocolError(f"state table {name!r} says {said} rows but holds "
                                    f"{table.row_capacity}")
        return table

    @property
    def broker_epoch(self) -> int:
        return int(self.control[S.BROKER_EPOCH_WORD])

    def _check_row(self, row: int) -> int:
        if not isinstance(row, (int, np.integer)) or not 0 <= row < self.row_capacity:
            raise LocalProtocolError(f"row {row!r} is outside the table's "
                                     f"{self.row_capacity} rows")
        return int(row)

    # -- broker side ---------------------------------------------------------------
    def claim(self, row: int, key: int, partition: int) -> None:
        """Give a free row to (topic, partition); its offsets start at -1 (unknown)."""
        row = self._check_row(row)
        base = row * S.ROW_WORDS
        self.rows[base:base + S.ROW_WORDS] = -1
        self.rows[base + S.PARTITION_WORD] = partition
        self.rows[base + S.TOPIC_KEY_WORD] = key

    def free(self, row: int) -> None:
        row = self._check_row(row)
        base = row * S.ROW_WORDS
        publish_row(self.rows, self.control, row, -1, -1, -1, -1, -1, -1, -1, -1)
        self.rows[base + S.TOPIC_KEY_WORD] = S.FREE_TOPIC_KEY
        journal_flush(self.control)

    def publish(self, row: int, log_start_offset: int, log_end_offset: int,
                high_watermark: int, active_segment_base_offset: int,
                active_segment_size: int, segment_generation: int,
                last_stable_offset: int | None = None, aborted_generation: int = 0) -> None:
        """Publish a row (:func:`publish_row`); the last stable offset is the high
        watermark unless given (no transaction open)."""
        if last_stable_offset is None:
            last_stable_offset = high_watermark
        publish_row(self.rows, self.control, self._check_row(row), log_start_offset,
                    log_end_offset, high_watermark, active_segment_base_offset,
                    active_segment_size, segment_generation, last_stable_offset,
                    aborted_generation)
        journal_flush(self.control)

    def flush_journal(self) -> None:
        """Store the journal's sequence over the rows published so far (after a
        compiled publish, before telling anyone of it)."""
        journal_flush(self.control)

    # -- reader side ---------------------------------------------------------------
    def high_watermark(self, row: int) -> int:
        return int(load_high_watermark(self.rows, self._check_row(row)))

    def journal_sequence(self) -> int:
        """The journal's published sequence (see :func:`journal_sequence`)."""
        return int(journal_sequence(self.control))

    def journal_changes(self, seen: int, out: np.ndarray) -> tuple[int, int]:
        """The rows named since sequence ``seen``: (sequence, count), the rows in
        ``out[:count]`` (``out``: int64, ``JOURNAL_CAPACITY`` long); count
        JOURNAL_LAPPED when every row must be looked at (see
        :func:`journal_changes`)."""
        if out.shape != (S.JOURNAL_CAPACITY,) or out.dtype != np.int64:
            raise LocalProtocolError(f"journal slots are read into int64[{S.JOURNAL_CAPACITY}]")
        sequence, count = journal_changes(self.control, seen, out)
        return int(sequence), int(count)

    def segment_generation(self, row: int) -> int:
        """The row's segment generation, loaded after a fence (see
        :func:`load_segment_generation`): what a reader checks after listing."""
        return int(load_segment_generation(self.rows, self._check_row(row)))

    def snapshot(self, row: int) -> RowSnapshot:
        out = np.empty(S.ROW_WORDS, np.int64)
        _snapshot(self.rows, self._check_row(row), out)
        return RowSnapshot(int(out[S.LOG_START_OFFSET_WORD]), int(out[S.LOG_END_OFFSET_WORD]),
                           int(out[S.HIGH_WATERMARK_WORD]),
                           int(out[S.ACTIVE_SEGMENT_BASE_OFFSET_WORD]),
                           int(out[S.SEGMENT_GENERATION_WORD]), int(out[S.TOPIC_KEY_WORD]),
                           int(out[S.PARTITION_WORD]), int(out[S.ACTIVE_SEGMENT_SIZE_WORD]),
                           int(out[S.LAST_STABLE_OFFSET_WORD]),
                           int(out[S.ABORTED_GENERATION_WORD]))

    # -- lifetime ------------------------------------------------------------------
    def unlink(self) -> None:
        """Remove the table and its doorbells from /dev/shm (closed or not)."""
        unlink_table(self.name)

    def close(self) -> None:
        self.control = self.rows = self.bells = None
        self.appender_doorbell = self.consumer_doorbell = None
        for memory in (self._mapped, self._bells):
            try:
                memory.close()
            except BufferError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
