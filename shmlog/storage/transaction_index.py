"""A segment's aborted-transaction index (Kafka's ``TransactionIndex``): the
``<base offset>.txnindex`` beside its ``.log``, written by the log's owner. The
entries' format, and the read-only reader a consumer uses, are
``transaction_index_layout``'s.

Rules
-----
* One writer: the process that owns the partition's log. Entries are appended to
  the active segment's index only, in increasing ``last_offset`` order (an entry
  out of order is refused, :class:`AbortedTransactionOrderError`, and nothing is
  written); a truncation cuts the entries whose marker it removed, a deletion
  removes the file with its segment's.
* No file until the first entry: a segment where no transaction aborted has none,
  as in Kafka. The file is made with the data directory's file mode and never
  opened through a symbolic link (``access.open_file``).
* No descriptor stays open (as ``mapped_file``'s mappings hold none): the file is
  opened for each append, truncation or sync, which are rare (one per aborted
  transaction), so a broker's open files do not grow with its segments.
* An entry is one ``write`` of its 34 bytes with ``O_APPEND``; a kill in the middle
  leaves a torn tail, which the next open cuts (the whole entries before it are
  kept, one line logged).

Theory of operation
-------------------
A :class:`TransactionIndex` costs nothing until it is used: its entries are read on
first use (:meth:`TransactionIndex.entries`, an append, a truncation), the file's
torn or invalid tail cut then, and kept in memory after (34 bytes an aborted
transaction) for the searches of :meth:`TransactionIndex.collect`. Appends and
truncations change the file and the entries in memory together; :meth:`sync`
fsyncs the file when either changed it since the last sync. Closing forgets the
entries (the next use reads them again), not that a sync is owed.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os

from ..common.access import open_file
from ..common.errors import AbortedTransactionOrderError, StorageError
from ..common.process_limits import open_files_error
from .transaction_index_layout import (
    ENTRY_LENGTH,
    AbortedTransaction,
    read_file,
    transactions_of,
    valid_entries,
)

log = logging.getLogger(__name__)

__all__ = ["TransactionIndex", "AbortedTransaction"]


class TransactionIndex:
    """The aborted transactions of the segment at ``base_offset``, in the file
    ``path`` (made at the first :meth:`append`)."""

    def __init__(self, path: str, base_offset: int):
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTransaction] | None = None    # read at first use
        self._unsynced = False

    @property
    def unsynced(self) -> bool:
        """The file changed since it was last synced."""
        return self._unsynced

    def _load(self) -> list[AbortedTransaction]:
        """The entries, read from the file at first use; a torn or invalid tail is cut.

        Raises
        ------
        StorageError
            The file cannot be read, cut, or is a symbolic link.
        """
        if self._entries is not None:
            return self._entries
        data = read_file(self.path)
        entries, reason = valid_entries(data, self.base_offset)
        if reason:
            kept = entries.size * ENTRY_LENGTH
            with self._opened(os.O_WRONLY) as fd:
                if fd is not None:
                    self._call(os.ftruncate, fd, kept)
            self._unsynced = True
            log.warning("%s: %s; cut from byte %d of %d, keeping %d entries (a torn write?)",
                        self.path, reason, kept, len(data), entries.size)
        self._entries = transactions_of(entries)
        return self._entries

    @contextlib.contextmanager
    def _opened(self, flags: int):
        """The file opened with ``flags`` (never through a symbolic link), closed after;
        None when it does not exist (and ``flags`` do not make it)."""
        try:
            fd = open_file(self.path, flags)
        except FileNotFoundError:
            yield None
            return
        except OSError as error:
            raise open_files_error(error) or \
                StorageError(f"cannot open {self.path}: {error}") from error
        try:
            yield fd
        finally:
            os.close(fd)

    def _call(self, operation, *arguments):
        try:
            return operation(*arguments)
        except OSError as error:
            raise StorageError(f"{self.path}: {operation.__name__} failed: {error}") from error

    def entries(self) -> list[AbortedTransaction]:
        """Every entry, in file order (a copy)."""
        return list(self._load())

    def append(self, entry: AbortedTransaction) -> bool:
        """Add ``entry`` at the end; True when this made the file (a new directory
        entry: its owner fsyncs the directory).

        Raises
        ------
        AbortedTransactionOrderError
            Its last offset is not past the last entry's, is below the segment's base
            offset or below its own first offset; nothing was written.
        StorageError
            The write failed (a full disk); the file is as it was.
        """
        entries = self._load()
        entry = AbortedTransaction(*(int(value) for value in entry))
        previous = entries[-1].last_offset if entries else None
        if (previous is not None and entry.last_offset <= previous) \
                or entry.last_offset < self.base_offset \
                or not 0 <= entry.first_offset <= entry.last_offset:
            raise AbortedTransactionOrderError(
                f"{self.path}: an aborted transaction of producer {entry.producer_id} at "
                f"offsets {entry.first_offset}..{entry.last_offset} cannot follow "
                + (f"the entry whose last offset is {previous}" if previous is not None
                   else f"the segment's base offset {self.base_offset}")
                + ": entries are appended in increasing last offset, within the segment")
        made = not os.path.lexists(self.path)
        failure: OSError | None = None
        written = 0
        with self._opened(os.O_WRONLY | os.O_CREAT | os.O_APPEND) as fd:
            try:
                written = os.write(fd, entry.pack())
            except OSError as error:
                failure = error
            if written != ENTRY_LENGTH:
                # A short write (a full disk): the file is cut back to its entries.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, len(entries) * ENTRY_LENGTH)
        if written != ENTRY_LENGTH:
            if made:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            what = failure if failure is not None else f"{written} of {ENTRY_LENGTH} bytes"
            raise (failure is not None and open_files_error(failure)) or StorageError(
                f"{self.path}: cannot append an aborted transaction ({what})") from failure
        entries.append(entry)
        self._unsynced = True
        return made

    def truncate_to(self, offset: int) -> None:
        """Remove the entries whose last offset (abort marker) is at or past ``offset``
        (Kafka's ``truncateTo``); the file stays, perhaps empty.

        Raises
        ------
        StorageError
            The file cannot be cut.
        """
        entries = self._load()
        kept = bisect.bisect_left([entry.last_offset for entry in entries], offset)
        if kept == len(entries):
            return
        with self._opened(os.O_WRONLY) as fd:
            if fd is not None:
                self._call(os.ftruncate, fd, kept * ENTRY_LENGTH)
        del entries[kept:]
        self._unsynced = True

    def collect(self, start_offset: int, end_offset: int) -> tuple[list[AbortedTransaction], bool]:
        """Kafka's ``collectAbortedTxns``: the entries that overlap offsets
        ``[start_offset, end_offset)`` (last offset at or past the start, first offset
        below the end), and whether the search is complete: an entry whose last
        stable offset reaches ``end_offset`` says no later aborted transaction began
        below it, so later segments need no look."""
        found = []
        for entry in self._load():
            if entry.last_offset >= start_offset and entry.first_offset < end_offset:
                found.append(entry)
            if entry.last_stable_offset >= end_offset:
                return found, True
        return found, False

    def rename(self, path: str) -> None:
        """Move the file (when there is one) to ``path``, and use that path from now on
        (Kafka's ``renameTo``).

        Raises
        ------
        StorageError
            The rename failed; the old path stays in use.
        """
        if os.path.lexists(self.path):
            self._call(os.replace, self.path, path)
        self.path = path

    def sync(self) -> None:
        """fsync the file, when an append or a truncation changed it since the last sync.

        Raises
        ------
        StorageError
            The fsync failed (it is owed still).
        """
        if not self._unsynced:
            return
        with self._opened(os.O_RDONLY) as fd:
            if fd is not None:
                self._call(os.fsync, fd)
        self._unsynced = False

    def close(self) -> None:
        """Forget the entries read (the next use reads the file again)."""
        self._entries = None

    def delete(self) -> None:
        """Remove the file (when there is one); the index is empty after."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._entries = []
        self._unsynced = False
