"""Who may read a broker's data: the one place that decides file and shared-memory modes.

Rules
-----
* Private by default: the data directory and every directory below it 0700, every
  file 0600, the control socket and the shared-memory objects (state table and its
  doorbells, rings) 0600. Only the broker's user reads a record.
* ``data_group`` (a broker setting) shares with one group, as PostgreSQL's
  ``initdb --allow-group-access`` does: directories 0750 with the set-group-id bit
  (what is made below inherits the group, so no file needs a chgrp), files 0640
  (only the broker writes them; the group's consumers map them read-only), and
  0660, group-owned, for what the group must write: the control socket (connect(2)
  needs write permission), the producers' rings (the broker writes the head and
  completions of a group producer's ring) and the state table's doorbells
  (producers ring the appender's, consumers count themselves as sleepers). The
  state table itself is written by the broker only, so it takes the file mode
  (0640): a member of the group maps it read-only and cannot make another user's
  consumers misread (``shm/state_layout``).
* Modes are given explicitly where a file is made, and the broker's umask (077, or
  027 with a group) makes anything made without one no wider.
* A data directory is the broker's own: one owned by another user is refused (a
  root broker would otherwise write where that user plants symbolic links), and the
  lock and the files the broker makes there are opened with ``O_NOFOLLOW``: a
  symbolic link is an error, never a write through to its target.

Theory of operation
-------------------
The policy is per process, like the umask it sets: the broker calls :func:`adopt`
once before it opens its data directory, and every creation in the storage modules
reads :func:`current`. A process that never adopts one (a tool or a test that opens
a :class:`~shmlog.storage.log_manager.LogManager` itself) gets the private policy. The data
directory's own mode gates everything below it (nobody else can traverse it), so
files written by older versions with wider modes stay private too.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import stat

from .errors import NotOwnedError, StorageError

__all__ = ["Access", "adopt", "current", "group_id_of", "prepare_data_dir", "protect_data_dir",
           "open_file",
           "make_directories", "make_new_directory", "owner_name"]


@dataclasses.dataclass(frozen=True)
class Access:
    """Private (``group_id`` None) or shared with one group."""
    group_id: int | None = None

    @property
    def directory_mode(self) -> int:
        return 0o700 if self.group_id is None else 0o2750

    @property
    def file_mode(self) -> int:
        return 0o600 if self.group_id is None else 0o640

    @property
    def writable_mode(self) -> int:
        """The control socket and the shared memory clients write (rings, doorbells)."""
        return 0o600 if self.group_id is None else 0o660

    @property
    def umask(self) -> int:
        return 0o077 if self.group_id is None else 0o027


_current = Access()


def adopt(access: Access) -> None:
    """Make ``access`` this process's policy, and set the umask to match."""
    global _current
    _current = access
    os.umask(access.umask)


def current() -> Access:
    return _current


def group_id_of(name: str) -> int:
    """The gid of group ``name``.

    Raises
    ------
    KeyError
        No such group.
    """
    return grp.getgrnam(name).gr_gid


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_directories(path: str) -> None:
    """``os.makedirs`` with the policy's directory mode (parents made too)."""
    os.makedirs(path, mode=_current.directory_mode & 0o777, exist_ok=True)


def make_new_directory(path: str) -> bool:
    """Make one directory (its parent exists) with the policy's mode: True when this
    call made it, False when it was already there."""
    try:
        os.mkdir(path, _current.directory_mode & 0o777)
    except FileExistsError:
        return False
    return True


def prepare_data_dir(path: str) -> None:
    """Create the data directory if needed; refuse it when another user owns it.

    Raises
    ------
    NotOwnedError
        Another user owns the directory.
    StorageError
        It cannot be made.
    """
    try:
        make_directories(path)
        status = os.stat(path)
    except OSError as error:
        raise StorageError(f"cannot create data directory {path}: {error}") from error
    if status.st_uid != os.geteuid():
        raise NotOwnedError(
            f"data directory {path} belongs to {owner_name(status.st_uid)}, not to the broker's "
            f"user {owner_name(os.geteuid())}: run the broker as its owner, or give it a "
            f"directory of its own")


def protect_data_dir(path: str) -> None:
    """Give the data directory the policy's mode (and group): once its lock is
    held, so a broker refused by the lock changes nothing. When the policy changed
    since the last broker (the directory's mode or group differ), everything below
    it is given the new modes too, so a group added later reads the old data.

    Raises
    ------
    StorageError
        A mode or group cannot be set (the user is not in the group).
    """
    access = _current
    try:
        status = os.stat(path)
        if stat.S_IMODE(status.st_mode) == access.directory_mode and \
                (access.group_id is None or status.st_gid == access.group_id):
            return
        _protect(path, access.directory_mode)
        for root, directories, files in os.walk(path):
            for name in directories:
                _protect(os.path.join(root, name), access.directory_mode)
            for name in files:
                _protect(os.path.join(root, name), access.file_mode)
    except OSError as error:
        raise StorageError(f"cannot give data directory {path} mode "
                           f"{access.directory_mode:o} and group {access.group_id}: "
                           f"{error}") from error


def _protect(path: str, mode: int) -> None:
    """Set the policy's group (if any), then ``mode``, of one entry; never through
    a symbolic link (one is left as it is)."""
    if os.path.islink(path):
        return
    if _current.group_id is not None:
        os.chown(path, -1, _current.group_id, follow_symlinks=False)
    os.chmod(path, mode)


def open_file(path: str, flags: int) -> int:
    """``os.open`` of a file in the data directory: made with the policy's mode,
    never through a symbolic link (raises ``OSError`` ELOOP on one)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, _current.file_mode)
