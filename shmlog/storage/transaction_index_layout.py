"""The transaction index's entry layout (Kafka's ``AbortedTxn``, version 0), and its
read-only reader.

A segment ``<base offset>.log`` may have a ``<base offset>.txnindex`` beside it: the
transactions aborted in that segment, one entry each, in the order their abort
markers were appended (a transaction belongs to the segment holding its marker,
whose offset is its ``last_offset``). A segment where no transaction aborted has no
file, as in Kafka. The file has no header; its entries are 34 bytes, big-endian, as
Kafka's ``TransactionIndex`` writes them (so Kafka's tools read ours)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------------------------------+-------------------------------+
  0 |         version (i16)         |                               |
    +-------------------------------+                               +
  4 |                       producer_id (i64)                       |
    +                               +-------------------------------+
  8 |                               |                               |
    +-------------------------------+                               +
 12 |                      first_offset (i64)                       |
    +                               +-------------------------------+
 16 |                               |                               |
    +-------------------------------+                               +
 20 |                       last_offset (i64)                       |
    +                               +-------------------------------+
 24 |                               |                               |
    +-------------------------------+                               +
 28 |                   last_stable_offset (i64)                    |
    +                               +-------------------------------+
 32 |                               |
    +-------------------------------+

``first_offset`` is the transaction's first record, ``last_offset`` its abort
marker, ``last_stable_offset`` the partition's last stable offset when the marker
was appended (the first offset of the oldest transaction still open then, or the
log end): no transaction open at that time began below it, which lets a search
stop early (Kafka's ``collectAbortedTxns``).

Rules
-----
* Whole entries only, in increasing ``last_offset`` order, each with
  ``first_offset <= last_offset`` and ``last_offset`` at or past the segment's
  base offset. What breaks that (a tail shorter than an entry, a version other than
  0, an entry out of order) ends the valid entries: :func:`valid_entries` counts
  those before it. The writer (``transaction_index``) cuts the rest when it opens
  the file (a kill in the middle of an append leaves a torn tail); a reader here
  just stops there.
* This module imports nothing of the log's writer: a consumer reads a segment's
  aborted transactions through :func:`read_aborted` alone.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..common.errors import StorageError
from . import index_layout as I

__all__ = ["AbortedTransaction", "ENTRY_DTYPE", "ENTRY_LENGTH", "VERSION", "ABORTED_DTYPE",
           "txn_index_path", "valid_entries", "transactions_of", "read_file", "read_transactions",
           "read_aborted"]

VERSION = 0

VERSION_OFFSET = 0
VERSION_SIZE = 2
PRODUCER_ID_OFFSET = VERSION_OFFSET + VERSION_SIZE
PRODUCER_ID_SIZE = 8
FIRST_OFFSET_OFFSET = PRODUCER_ID_OFFSET + PRODUCER_ID_SIZE
FIRST_OFFSET_SIZE = 8
LAST_OFFSET_OFFSET = FIRST_OFFSET_OFFSET + FIRST_OFFSET_SIZE
LAST_OFFSET_SIZE = 8
LAST_STABLE_OFFSET_OFFSET = LAST_OFFSET_OFFSET + LAST_OFFSET_SIZE
LAST_STABLE_OFFSET_SIZE = 8
ENTRY_LENGTH = LAST_STABLE_OFFSET_OFFSET + LAST_STABLE_OFFSET_SIZE

# The file's entries as stored (packed, big-endian).
ENTRY_DTYPE = np.dtype([("version", ">i2"), ("producer_id", ">i8"), ("first_offset", ">i8"),
                        ("last_offset", ">i8"), ("last_stable_offset", ">i8")])
# What read_aborted gives a consumer: native int64 columns.
ABORTED_DTYPE = np.dtype([("producer_id", "<i8"), ("first_offset", "<i8"),
                          ("last_offset", "<i8")])

assert ENTRY_LENGTH == ENTRY_DTYPE.itemsize == 34, "Kafka's AbortedTxn.TotalSize"
assert ENTRY_DTYPE.fields["last_offset"][1] == LAST_OFFSET_OFFSET
assert ENTRY_DTYPE.fields["last_stable_offset"][1] == LAST_STABLE_OFFSET_OFFSET


class AbortedTransaction(NamedTuple):
    """One entry of a transaction index (Kafka's ``AbortedTxn``)."""
    producer_id: int
    first_offset: int           # the transaction's first record
    last_offset: int            # its abort marker
    last_stable_offset: int     # the partition's, when the marker was appended

    def pack(self) -> bytes:
        """The entry's 34 bytes, as the file stores them."""
        entry = np.zeros(1, ENTRY_DTYPE)
        entry[0] = (VERSION, *self)
        return entry.tobytes()


def txn_index_path(log_path: str) -> str:
    """The ``.txnindex`` beside the segment ``log_path`` (a ``.log``)."""
    assert log_path.endswith(I.LOG_SUFFIX)
    return log_path[:-len(I.LOG_SUFFIX)] + I.TXN_INDEX_SUFFIX


def valid_entries(data, base_offset: int = 0) -> tuple[np.ndarray, str]:
    """The entries of a transaction index's bytes ``data`` up to the first that breaks
    the rules (a view, in ``ENTRY_DTYPE``), and why the rest is not taken ("" when
    every byte is in a whole, valid entry)."""
    data = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    whole = data.size - data.size % ENTRY_LENGTH
    entries = data[:whole].view(ENTRY_DTYPE)
    if not entries.size:
        return entries, (f"{data.size} bytes, shorter than an entry" if data.size else "")
    last = entries["last_offset"].astype(np.int64)
    bad = (entries["version"] != VERSION) \
        | (entries["first_offset"].astype(np.int64) > last) \
        | (entries["first_offset"].astype(np.int64) < 0) | (last < base_offset)
    bad[1:] |= np.diff(last) <= 0
    found = np.flatnonzero(bad)
    if found.size:
        first = int(found[0])
        entry = entries[first]
        if int(entry["version"]) != VERSION:
            reason = f"entry {first} has version {int(entry['version'])}, not {VERSION}"
        else:
            reason = (f"entry {first} (first offset {int(entry['first_offset'])}, last "
                      f"offset {int(entry['last_offset'])}) is out of order")
        return entries[:first], reason
    if whole != data.size:
        return entries, (f"{data.size - whole} bytes after entry {entries.size - 1} are not "
                         f"a whole entry")
    return entries, ""


def transactions_of(entries: np.ndarray) -> list[AbortedTransaction]:
    """Entries (``ENTRY_DTYPE``) as :class:`AbortedTransaction` tuples."""
    return [AbortedTransaction(int(producer_id), int(first), int(last), int(stable))
            for producer_id, first, last, stable in zip(
                entries["producer_id"].tolist(), entries["first_offset"].tolist(),
                entries["last_offset"].tolist(), entries["last_stable_offset"].tolist())]


def read_file(path: str) -> bytes:
    """The bytes of the file at ``path`` (empty when it is missing: a segment with no
    aborted transaction has none); never through a symbolic link.

    Raises
    ------
    StorageError
        The file cannot be read (a symbolic link is refused).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError as error:
        raise StorageError(f"cannot read {path}: {error}") from error
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as error:
        raise StorageError(f"cannot read {path}: {error}") from error
    finally:
        os.close(fd)


def read_transactions(path: str, base_offset: int = 0) -> list[AbortedTransaction]:
    """The valid entries of the transaction index at ``path`` (none when it is
    missing), read without changing the file.

    Raises
    ------
    StorageError
        The file cannot be read.
    """
    entries, _ = valid_entries(read_file(path), base_offset)
    return transactions_of(entries)


def read_aborted(path: str) -> np.ndarray:
    """A consumer's read of the transaction index at ``path``: its valid entries'
    (producer_id, first_offset, last_offset), one ``ABORTED_DTYPE`` row each in
    file order (increasing last offset); empty when the file is missing. A tail the
    writer is appending this moment, or a torn one, is left out.

    Raises
    ------
    StorageError
        The file cannot be read.
    """
    entries, _ = valid_entries(read_file(path))
    aborted = np.empty(entries.size, ABORTED_DTYPE)
    for name in ABORTED_DTYPE.names:
        aborted[name] = entries[name]
    return aborted
