"""Leader epochs of one partition: the offset at which each leader epoch began
(Kafka's ``LeaderEpochFileCache``; KIP-101, KIP-279).

Rules
-----
* Entries ``(epoch, start_offset)`` are strictly increasing in both fields. An
  epoch's end is the next entry's start (or the log end, for the latest epoch).
* :meth:`LeaderEpochCache.assign` ignores an entry with the latest epoch and no
  lower start, and otherwise first drops every entry that the new one would make
  non-monotonic (Kafka's ``maybeTruncateNonMonotonicEntries``): an epoch at or
  above the new one, or a start at or above the new start.
* Every change rewrites the checkpoint ``leader-epoch-checkpoint.json`` in the
  partition directory whole (``durable_files.write_atomically``)::

      {"version": 1, "entries": [[epoch, start_offset], ...]}

  **without an fsync** (Kafka 3.7 too, KAFKA-15046: a broker made leader of
  thousands of partitions at once paid one fsync each, seconds in all), and an
  epoch the log's own appended batches carry (:meth:`LeaderEpochCache.learn`) is
  not written at all until the log's next flush: until then recovery learns it
  again from those batches, which are above the recovery point (written at once,
  it made every partition's first record wait for a file write).
  :meth:`LeaderEpochCache.flush`, which the log's flush calls before it advances
  its recovery point, writes and fsyncs it, so below the recovery point every epoch
  the log holds is in the file. A process killed keeps what it wrote (the page cache
  survives it); a machine's crash may leave the file old, empty or unreadable,
  which loading repairs as after any crash: an unreadable file is rebuilt from
  the batch headers, and an old one learns the epochs of the batches above the
  recovery point and is cut to the recovered log (``log_loader``). What only the
  lost write held is an epoch begun without records, which a rebuild cannot know
  either (below). A write that fails (a full disk) keeps the change in memory,
  logs it, and is retried by the next change or by the flush.
* A missing or unreadable file is rebuilt from the log's batch headers (the
  owner's job: :attr:`LeaderEpochCache.needs_rebuild`, :func:`epoch_starts`); a
  rebuild cannot know an epoch that began without records (a leader assigns
  ``(epoch, log end)`` before its first append), which Kafka's own recovery
  cannot either: that leader assigns it again when it leads again.
* One thread uses a cache: the partition's owner (the broker's loop).

Theory of operation
-------------------
The owner (``segments.PartitionLog``, as its ``epochs``) keeps the cache right on
its own paths, as Kafka's ``Log`` does: appends assign the epochs of their
batches (``maybeAssignEpochStartOffset``), truncation drops entries from the end
(``truncateFromEnd``), a moved log start drops them from the start
(``truncateFromStart``: the last entry before it is moved up to it), a log
restarted empty clears it, and opening truncates it to the recovered log.

A follower that must find where its log and its leader's diverge asks the leader
for the end of its latest epoch (OffsetForLeaderEpoch), which the leader answers
with :meth:`LeaderEpochCache.end_offset_for`, then answers itself the same
question for the epoch the leader named; the four cases are Kafka's
``endOffsetFor``.

:func:`epoch_starts` walks batch headers in compiled code (stepping with
``records.batch_frame``, the one bounds check of every walk) and reports where
the stamped epoch changes: what a rebuild, a recovery and a follower's append
learn from.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
from typing import Iterable

import numpy as np

from ..common import limits
from ..common.errors import LocalProtocolError, StorageError
from ..native.jit import kernel, load_i32, load_i64
from ..record import batch_layout as B
from ..record.records import batch_frame
from .durable_files import write_atomically

log = logging.getLogger(__name__)

__all__ = ["LeaderEpochCache", "epoch_starts", "CHECKPOINT_FILE", "UNDEFINED_EPOCH",
           "UNDEFINED_EPOCH_OFFSET"]

CHECKPOINT_FILE = "leader-epoch-checkpoint.json"
CHECKPOINT_VERSION = 1
UNDEFINED_EPOCH = -1
# What end_offset_for answers when it knows nothing of the epoch (Kafka's
# UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH_OFFSET = (UNDEFINED_EPOCH, -1)
EPOCH_MAX = (1 << 31) - 1          # the batch header's partition leader epoch is an i32


@kernel
def _epoch_starts(buffer, position, end, latest_epoch, increases_only, epochs, starts):
    """Walk batch headers from ``position`` and store ``(epoch, base offset)`` for
    each batch whose epoch differs from the previous one's (``latest_epoch`` before
    the first), or with ``increases_only`` is above every epoch before it; negative
    epochs (none stamped) are skipped. Returns (entries stored, position reached,
    whether the walk ended): it stops early when ``epochs`` is full, at the batch
    it could not store; at the end of the data or at a batch it cannot frame it
    ends."""
    count = 0
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != 0:
            return count, position, True
        epoch = np.int64(load_i32(buffer, position + B.LEADER_EPOCH_OFFSET))
        if epoch >= 0 and (epoch > latest_epoch if increases_only else epoch != latest_epoch):
            if count == epochs.size:
                return count, position, False
            epochs[count] = epoch
            starts[count] = load_i64(buffer, position + B.BASE_OFFSET_OFFSET)
            count += 1
            latest_epoch = epoch
        position += length
    return count, position, True


def epoch_starts(buffer: np.ndarray, start: int, end: int, latest_epoch: int = UNDEFINED_EPOCH,
                 *, increases_only: bool = True) -> list[tuple[int, int]]:
    """Where the leader epoch stamped on the batches of ``buffer[start:end]`` changes:
    ``(epoch, base offset)`` of each batch whose epoch is above every one before it
    (``latest_epoch`` included), or with ``increases_only=False`` differs from the
    batch before it (what a follower's append feeds to :meth:`LeaderEpochCache.assign`,
    Kafka's rule for every appended batch). The walk stops at the end of the data
    or at the first batch it cannot frame.
    """
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous:
        raise LocalProtocolError("epoch_starts walks a contiguous 1-D uint8 buffer")
    end = min(int(end), buffer.size)         # the kernel trusts it
    epochs = np.empty(limits.LEADER_EPOCH_SCAN_CHUNK, np.int64)
    starts = np.empty_like(epochs)
    found: list[tuple[int, int]] = []
    position, done = int(start), False
    while not done:
        count, position, done = _epoch_starts(buffer, position, end, latest_epoch,
                                              increases_only, epochs, starts)
        found += zip(epochs[:count].tolist(), starts[:count].tolist())
        if count:
            latest_epoch = found[-1][0]
    return found


def _checked_entries(body) -> list[tuple[int, int]] | None:
    """The entries of a parsed checkpoint, or None when it is not a valid one."""
    if not isinstance(body, dict) or body.get("version") != CHECKPOINT_VERSION:
        return None
    entries = body.get("entries")
    if not isinstance(entries, list) or len(entries) > limits.LEADER_EPOCH_ENTRIES_MAX:
        return None
    checked: list[tuple[int, int]] = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(value, int) and not isinstance(value, bool) for value in entry)):
            return None
        epoch, start = entry
        if not (0 <= epoch <= EPOCH_MAX and 0 <= start <= limits.OFFSET_MAX):
            return None
        if checked and (epoch <= checked[-1][0] or start <= checked[-1][1]):
            return None
        checked.append((epoch, start))
    return checked


class LeaderEpochCache:
    """The leader epochs of one partition and their start offsets, checkpointed in
    ``<directory>/leader-epoch-checkpoint.json`` (see the module's rules).

    Opening reads the file; when it is missing or unreadable the cache starts
    empty with :attr:`needs_rebuild` set, and its owner calls :meth:`rebuild` with
    what its log's batch headers say (:func:`epoch_starts`).

    Parameters
    ----------
    directory : str
        The partition's directory.
    new : bool
        The directory was just made, empty: the cache starts empty without a look.
    """

    def __init__(self, directory: str, *, new: bool = False):
        self.path = os.path.join(directory, CHECKPOINT_FILE)
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._dirty = False               # a change the file does not hold yet
        self._unsynced = False            # the file was written without an fsync since
        self._corrupt = False
        self.needs_rebuild = False
        if new:
            return                  # a directory just made holds no file: nothing to read
        entries = self._read()
        if entries is None:
            self.needs_rebuild = True
        else:
            self._set(entries)

    def _read(self) -> list[tuple[int, int]] | None:
        try:
            with open(self.path) as source:
                body = json.load(source)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log.warning("%s is unreadable (%s): rebuilding it from the log", self.path, error)
            self._corrupt = True
            return None
        entries = _checked_entries(body)
        if entries is None:
            log.warning("%s is not a valid version-%d leader-epoch checkpoint: rebuilding it "
                        "from the log", self.path, CHECKPOINT_VERSION)
            self._corrupt = True
        return entries

    def _set(self, entries: Iterable[tuple[int, int]]) -> None:
        self._epochs = [int(epoch) for epoch, _ in entries]
        self._starts = [int(start) for _, start in entries]

    def _changed(self) -> None:
        """Write the file after a change, without an fsync; a failed write is
        retried later (rules)."""
        self._dirty = True
        try:
            self._write(sync=False)
        except StorageError as error:
            log.warning("%s not written (%s); kept in memory, written with the next change "
                        "or flush", self.path, error)

    def flush(self) -> None:
        """Make the file hold every change, durably (fsynced), if it does not yet.

        Raises
        ------
        StorageError
            The write failed; the change stays in memory.
        """
        if self._dirty or self._unsynced:
            self._write(sync=True)

    def _write(self, sync: bool) -> None:
        write_atomically(self.path, json.dumps(
            {"version": CHECKPOINT_VERSION,
             "entries": [[epoch, start] for epoch, start in zip(self._epochs, self._starts)]}),
            sync=sync)
        self._dirty, self._unsynced = False, not sync

    def rebuild(self, entries: Iterable[tuple[int, int]]) -> None:
        """Replace every entry with ``entries`` (a walk over the log's batch headers,
        in log order), each through :meth:`assign`'s rules, and write the file (not
        when the file was merely missing and there is nothing to remember: an
        empty partition makes no file). Clears :attr:`needs_rebuild`."""
        self._epochs, self._starts = [], []
        for epoch, start in entries:
            self._assign(epoch, start)
        if self._epochs or self._corrupt:
            self._changed()
        self.needs_rebuild = self._corrupt = False

    # -- reading ------------------------------------------------------------------------
    @property
    def latest_epoch(self) -> int:
        """The latest epoch, or ``UNDEFINED_EPOCH`` (-1) when there is none."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def latest(self) -> tuple[int, int] | None:
        """The latest ``(epoch, start_offset)``, or None."""
        return (self._epochs[-1], self._starts[-1]) if self._epochs else None

    def entries(self) -> list[tuple[int, int]]:
        """Every ``(epoch, start_offset)``, oldest first."""
        return list(zip(self._epochs, self._starts))

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """The answer to OffsetForLeaderEpoch for ``epoch`` (Kafka's ``endOffsetFor``):
        ``(epoch, log_end_offset)`` for the latest epoch; ``UNDEFINED_EPOCH_OFFSET``
        for ``UNDEFINED_EPOCH`` or an epoch above every entry; otherwise the start of
        the first epoch above ``epoch``, with the epoch of the last entry at or
        below it (or ``epoch`` itself when there is none: that history is gone
        from this log, and the follower truncates to where the next one began)."""
        if epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH_OFFSET
        if self._epochs and epoch == self._epochs[-1]:
            return epoch, int(log_end_offset)
        higher = bisect.bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # -- changing -----------------------------------------------------------------------
    def learn(self, epoch: int, start_offset: int) -> None:
        """:meth:`assign` an epoch that appended batches carry, writing the file with
        the log's next flush (rules), not now.

        Raises
        ------
        LocalProtocolError
            ``epoch`` or ``start_offset`` is negative or out of range.
        """
        if self._assign(epoch, start_offset):
            self._dirty = True

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` began at ``start_offset`` (rules: the same epoch at
        no lower start changes nothing; entries the new one would make
        non-monotonic go first).

        Raises
        ------
        LocalProtocolError
            ``epoch`` or ``start_offset`` is negative or out of range.
        """
        if self._assign(epoch, start_offset):
            self._changed()

    def _assign(self, epoch: int, start_offset: int) -> bool:
        if isinstance(epoch, bool) or not 0 <= epoch <= EPOCH_MAX \
                or isinstance(start_offset, bool) or not 0 <= start_offset <= limits.OFFSET_MAX:
            raise LocalProtocolError(f"a leader epoch entry needs an epoch in [0, {EPOCH_MAX}] "
                                     f"and a start offset in [0, {limits.OFFSET_MAX}], got "
                                     f"({epoch!r}, {start_offset!r})")
        epoch, start_offset = int(epoch), int(start_offset)
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        removed = 0
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            removed += 1
            dropped = (self._epochs.pop(), self._starts.pop())
        if removed > 1 or removed and dropped[1] != start_offset:
            # One entry at the same start is a leader that never appended: expected.
            log.warning("%s: epoch %d at offset %d dropped %d conflicting entries", self.path,
                        epoch, start_offset, removed)
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop every entry starting at or after ``end_offset`` (the log was cut
        there: Kafka's ``truncateFromEnd``)."""
        if end_offset < 0 or not self._starts or self._starts[-1] < end_offset:
            return
        keep = bisect.bisect_left(self._starts, end_offset)
        del self._epochs[keep:], self._starts[keep:]
        self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop the entries starting at or before ``start_offset`` (the log now starts
        there), keeping the last of them with its start moved up to ``start_offset``:
        its epoch still holds the first records (Kafka's ``truncateFromStart``)."""
        below = bisect.bisect_right(self._starts, start_offset)
        if below == 0 or below == 1 and self._starts[0] == start_offset:
            return
        epoch = self._epochs[below - 1]
        self._epochs[:below] = [epoch]
        self._starts[:below] = [start_offset]
        self._changed()

    def clear(self) -> None:
        """Forget every entry (the log restarted empty), and write the empty file.
        Clears :attr:`needs_rebuild`: an empty log has nothing to rebuild from."""
        self._epochs, self._starts = [], []
        self.needs_rebuild = self._corrupt = False
        self._changed()
