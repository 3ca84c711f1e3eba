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
* The path to it is safe, as sshd's ``StrictModes`` wants a home directory's: the
  data directory and every directory above it, from ``/`` down, is a real directory
  (not a symbolic link), owned by root or by the broker's user, and not writable by
  group or others unless it has the sticky bit (``/tmp``). Anything else is refused
  (:class:`UnsafeDataDirectoryError`) before a byte is written: a user who may
  rename or plant an entry on the path could point the broker, and a root broker's
  modes, at any directory (``data -> /etc`` made every file there 0600).
* Modes are set only on what is recognisably the broker's: the entries below the
  data directory that are regular files or directories owned by the broker's user,
  each opened with ``O_NOFOLLOW`` and changed through that descriptor; a symbolic
  link, a device, a socket, another user's file are left as they are.

Theory of operation
-------------------
The policy is per process, like the umask it sets: the broker calls :func:`adopt`
once before it opens its data directory, and every creation in the storage modules
reads :func:`current`. A process that never adopts one (a tool or a test that opens
a :class:`~shmlog.storage.log_manager.LogManager` itself) gets the private policy. The data
directory's own mode gates everything below it (nobody else can traverse it), so
files written by older versions with wider modes stay private too.

The path is checked once, at start, walking it from ``/`` with one directory
descriptor at a time (``openat`` with ``O_DIRECTORY | O_NOFOLLOW``, as ``find
-P`` walks): a missing directory is made there, by the broker, so it is the
broker's. Once every directory on the path is root's or the broker's user's and
writable by nobody else (or sticky, where another's entry cannot replace one of
ours), nobody else can change what the path names, so the checked path is used from
then on (it is absolute and holds no ``..``: ``os.path.abspath`` of the setting).
"""

from __future__ import annotations

import dataclasses
import errno
import grp
import os
import pwd
import stat

from .errors import NotOwnedError, StorageError, UnsafeDataDirectoryError

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


def prepare_data_dir(path: str) -> str:
    """Check the path to the data directory (making what is missing of it) and refuse
    it when another user owns it or could change it; the checked absolute path, which
    is the one to use from then on.

    Raises
    ------
    UnsafeDataDirectoryError
        The directory or one above it is a symbolic link, is not a directory, belongs
        to another user than root or the broker's, or is writable by group or others
        without the sticky bit.
    NotOwnedError
        Another user owns the directory.
    StorageError
        It cannot be made.
    """
    resolved = os.path.abspath(path)
    names = [name for name in resolved.split(os.sep) if name]
    if not names:
        raise UnsafeDataDirectoryError("the data directory cannot be / itself: give the "
                                       "broker a directory of its own")
    descriptor = os.open(os.sep, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        status, here = os.fstat(descriptor), os.sep
        for name in names:
            _check_ancestor(resolved, here, status)
            here = os.path.join(here, name)
            child = _open_or_make(descriptor, name, resolved, here)
            os.close(descriptor)
            descriptor = child
            status = os.fstat(descriptor)
    finally:
        os.close(descriptor)
    if status.st_uid != os.geteuid():
        raise NotOwnedError(
            f"data directory {resolved} belongs to {owner_name(status.st_uid)}, not to the "
            f"broker's user {owner_name(os.geteuid())}: run the broker as its owner, or give "
            f"it a directory of its own")
    _check_not_writable(resolved, resolved, status)
    return resolved


def _open_or_make(parent: int, name: str, data_dir: str, here: str) -> int:
    """A descriptor of directory ``name`` in ``parent`` (made with the policy's mode
    when missing), never through a symbolic link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(2):
        try:
            return os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            try:
                os.mkdir(name, _current.directory_mode & 0o777, dir_fd=parent)
            except FileExistsError:
                continue                     # made meanwhile: open what is there
            except OSError as error:
                raise StorageError(f"cannot create data directory {data_dir} "
                                   f"({here}: {error})") from error
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise StorageError(f"cannot open data directory {data_dir} "
                                   f"({here}: {error})") from error
            _refuse_non_directory(parent, name, data_dir, here)
    raise StorageError(f"cannot create data directory {data_dir}: {here} keeps changing")


def _refuse_non_directory(parent: int, name: str, data_dir: str, here: str) -> None:
    status = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(status.st_mode):
        target = os.readlink(name, dir_fd=parent)
        raise UnsafeDataDirectoryError(
            f"data directory {data_dir}: {here} is a symbolic link (to {target}, of "
            f"{owner_name(status.st_uid)}); the broker never follows one on the way to its "
            f"data, since whoever can plant it could point the broker's writes and modes at "
            f"any directory: give the real path of a directory of the broker's own")
    raise UnsafeDataDirectoryError(f"data directory {data_dir}: {here} is not a directory")


def _check_ancestor(data_dir: str, here: str, status: os.stat_result) -> None:
    """A directory above the data directory: root's or the broker's user's, and not
    writable by others (unless sticky)."""
    if status.st_uid not in (0, os.geteuid()):
        raise UnsafeDataDirectoryError(
            f"data directory {data_dir}: {here} belongs to {owner_name(status.st_uid)}, who "
            f"could rename it or plant a symbolic link in it and send the broker's writes "
            f"elsewhere: put the data directory under directories of root or of the "
            f"broker's user {owner_name(os.geteuid())} only")
    _check_not_writable(data_dir, here, status)


def _check_not_writable(data_dir: str, here: str, status: os.stat_result) -> None:
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not status.st_mode & stat.S_ISVTX:
        raise UnsafeDataDirectoryError(
            f"data directory {data_dir}: {here} is writable by "
            f"{'others' if status.st_mode & stat.S_IWOTH else 'its group'} (mode "
            f"{stat.S_IMODE(status.st_mode):o}) without the sticky bit, so another user "
            f"could replace what it holds: chmod go-w {here} (or +t), or choose another "
            f"data directory")


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
        status = os.stat(path, follow_symlinks=False)
        if stat.S_IMODE(status.st_mode) == access.directory_mode and \
                (access.group_id is None or status.st_gid == access.group_id):
            return
        _protect(None, path, access.directory_mode)
        # fwalk: a descriptor per directory, never a symbolic link followed.
        for _, directories, files, directory in os.fwalk(path, follow_symlinks=False):
            for name in directories:
                _protect(directory, name, access.directory_mode)
            for name in files:
                _protect(directory, name, access.file_mode)
    except OSError as error:
        raise StorageError(f"cannot give data directory {path} mode "
                           f"{access.directory_mode:o} and group {access.group_id}: "
                           f"{error}") from error


def _protect(directory: int | None, name: str, mode: int) -> None:
    """Set the policy's group (if any), then ``mode``, of one entry that is the
    broker's own: a regular file or directory of its user, changed through a
    descriptor opened without following a symbolic link. Anything else (a link,
    a socket, a device, another user's entry) is left as it is."""
    status = os.stat(name, dir_fd=directory, follow_symlinks=False)
    if not _ours(status):
        return
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=directory)
    except FileNotFoundError:
        return                                         # gone meanwhile
    try:
        opened = os.fstat(descriptor)
        if not _ours(opened) or (opened.st_dev, opened.st_ino) != (status.st_dev, status.st_ino):
            return                                     # replaced meanwhile
        if _current.group_id is not None:
            os.fchown(descriptor, -1, _current.group_id)
        os.fchmod(descriptor, mode)
    finally:
        os.close(descriptor)


def _ours(status: os.stat_result) -> bool:
    return (stat.S_ISREG(status.st_mode) or stat.S_ISDIR(status.st_mode)) and \
        status.st_uid == os.geteuid()


def open_file(path: str, flags: int) -> int:
    """``os.open`` of a file in the data directory: made with the policy's mode,
    never through a symbolic link (raises ``OSError`` ELOOP on one)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, _current.file_mode)
