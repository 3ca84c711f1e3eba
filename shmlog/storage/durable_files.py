"""Durable file changes: a file replaced whole, a directory's entries made durable.

Rules
-----
* A file that must never be seen half-written (a checkpoint, a topic's metadata,
  a swap manifest, the broker's rows and producer-id block) is written to
  ``<path>.tmp``, fsynced, and renamed over ``<path>``: a crash leaves the old file
  or the new one, never a mix (the ``.tmp`` is removed by whoever lists the
  directory next, e.g. ``PartitionLog`` on open).
* A rename, creation or unlink is durable only once its directory is fsynced;
  a caller that orders changes across a crash (a compaction swap) fsyncs the
  directory between them with :func:`fsync_directory`.
* Both raise :class:`StorageError`, naming the path, for any ``OSError``
  (:class:`ResourceLimitError`, naming it, when the open-files limit refused).
"""

from __future__ import annotations

import os

from ..common import access
from ..common.errors import StorageError
from ..common.process_limits import open_files_error

__all__ = ["write_atomically", "fsync_directory"]


def write_atomically(path: str, body: str, *, sync: bool = True) -> None:
    """Replace ``path`` with ``body`` (text): written to a temporary file, fsynced,
    then renamed over it, with the file mode ``access`` gives data files.

    ``sync`` false skips the fsync, for a file its reader can rebuild when a crash
    of the machine (not of the process: the page cache survives that) leaves it
    old, empty or unreadable; its owner fsyncs it later with ``sync`` true (the
    leader-epoch checkpoint, before the log's recovery point passes its changes).

    Raises
    ------
    StorageError
        The write, the fsync or the rename failed; ``path`` is unchanged.
    """
    temporary = path + ".tmp"
    try:
        with os.fdopen(access.open_file(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                       "w") as target:
            target.write(body)
            target.flush()
            if sync:
                os.fsync(target.fileno())
        os.replace(temporary, path)
    except OSError as error:
        raise open_files_error(error) or \
            StorageError(f"cannot write {path}: {error}") from error


def fsync_directory(directory: str) -> None:
    """Make the directory's entries (creations, renames, unlinks) durable.

    Raises
    ------
    StorageError
        The directory cannot be opened or fsynced.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise open_files_error(error) or \
            StorageError(f"cannot fsync directory {directory}: {error}") from error
