"""Named POSIX shared-memory objects (in /dev/shm), mapped whole.

The rings and the partition state table are built on these calls; what lives
inside each object is described by its layout module.

Rules
-----
* An object is created exclusively (``O_EXCL``), then given its mode explicitly
  (``shm_open`` applies the umask) and, to share it with a group, that group: a
  name is never opened when someone else made it first.
* A name that exists already is checked for its owner: one of ours left by a
  process that is gone is replaced when the caller knows it is stale (the broker
  holds its directory's lock); one of another user is refused with
  :class:`NotOwnedError` naming it, since predictable names can be squatted.
* Every page of an object is allocated when it is created (``posix_fallocate``):
  a full /dev/shm is a :class:`ResourceLimitError` then, never a SIGBUS in whichever
  process first writes a page tmpfs cannot back.
"""

from __future__ import annotations

import errno
import mmap
import os
import time

import numpy as np
import posix_ipc

from ..common import limits
from ..common.access import owner_name
from ..common.errors import (
    LocalProtocolError,
    NotOwnedError,
    ResourceLimitError,
    ShmlogError,
    StorageError,
)
from ..common.process_limits import open_files_error

__all__ = ["create", "attach", "unlink", "names", "peek", "owner_and_age_s",
           "write_magic_and_version", "read_magic_and_version", "DIRECTORY"]

# Where Linux (glibc) keeps the objects as files: their owner, mode and age are
# read there, and a listing finds a broker's leftovers.
DIRECTORY = "/dev/shm"


def _path(name: str) -> str:
    longest = limits.SHARED_MEMORY_NAME_LENGTH_MAX
    if not isinstance(name, str) or not name or "/" in name or len(name) > longest:
        raise LocalProtocolError(f"a shared-memory name must be 1-{longest} characters "
                                 f"without '/', got {name!r}")
    return "/" + name


def _open_exclusively(name: str, size: int, what: str, replace_stale: bool):
    try:
        return posix_ipc.SharedMemory(_path(name), posix_ipc.O_CREX, mode=0o600, size=size)
    except posix_ipc.ExistentialError:
        pass
    try:
        owner = os.stat(os.path.join(DIRECTORY, name)).st_uid
    except FileNotFoundError:
        owner = os.geteuid()                          # gone meanwhile: try once more
    if owner != os.geteuid():
        raise NotOwnedError(
            f"the {what} name {name!r} is taken by an object of {owner_name(owner)}, not of "
            f"{owner_name(os.geteuid())}: remove it (as its owner or root: rm "
            f"{os.path.join(DIRECTORY, name)}) and start again") from None
    if not replace_stale:
        raise LocalProtocolError(f"a {what} named {name!r} already exists")
    unlink(name)                 # ours, and the caller knows its maker is gone
    try:
        return posix_ipc.SharedMemory(_path(name), posix_ipc.O_CREX, mode=0o600, size=size)
    except posix_ipc.ExistentialError:
        raise LocalProtocolError(f"a {what} named {name!r} was made again while it was "
                                 f"being replaced") from None


def create(name: str, size: int, what: str, *, mode: int = 0o600, group_id: int | None = None,
           replace_stale: bool = False) -> mmap.mmap:
    """Create ``name`` of ``size`` zero bytes with ``mode`` (and ``group_id``), and map it.

    Parameters
    ----------
    replace_stale : bool
        An object of that name owned by this user is left by a process that is
        gone (the caller knows): replace it.

    Raises
    ------
    NotOwnedError
        Another user's object has the name.
    LocalProtocolError
        Our own object has it (and ``replace_stale`` is false).
    ShmlogError
        The mode or group cannot be set (not a member of the group).
    ResourceLimitError
        /dev/shm has no room for ``size`` bytes (nothing is left behind).
    """
    memory = _open_exclusively(name, size, what, replace_stale)
    try:
        try:
            # Made 0600 whatever the umask; widened to the group only once it is its.
            if group_id is not None:
                os.fchown(memory.fd, -1, group_id)
            os.fchmod(memory.fd, mode)
        except OSError as error:
            raise ShmlogError(f"cannot give {what} {name!r} mode {mode:o} and group "
                              f"{group_id}: {error}") from None
        _allocate(memory.fd, name, size, what)
        return mmap.mmap(memory.fd, size)
    except BaseException:
        unlink(name)
        raise
    finally:
        memory.close_fd()


def _allocate(fd: int, name: str, size: int, what: str) -> None:
    """Give the object every page it will ever use, now. /dev/shm is a tmpfs, which
    finds a page at its first write, and a write it cannot find one for kills the
    writer with SIGBUS; allocated here, a full /dev/shm is an error at creation."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise ShmlogError(f"cannot allocate {what} {name!r} ({size} bytes): {error}") \
                from None
        status = os.statvfs(DIRECTORY)
        raise ResourceLimitError(
            f"{DIRECTORY} is full: {what} {name!r} needs {size} bytes and "
            f"{status.f_bavail * status.f_frsize} are free; free shared memory (remove what "
            f"stopped processes left in {DIRECTORY}), make {DIRECTORY} larger (mount -o "
            f"remount,size=...), or ask for less (a smaller ring_size, fewer partitions_max)",
            limit=DIRECTORY) from None


def attach(name: str, minimum_size: int, what: str, *, writable: bool = True) -> mmap.mmap:
    """Map an existing object whole: for reading and writing, or (``writable``
    false) read-only, opened ``O_RDONLY``, so an object whose mode lets this user
    only read it can be mapped (numpy views of it are read-only too).

    Raises
    ------
    ShmlogError
        No object of that name exists, this user may not open it, or it is smaller
        than ``minimum_size``.
    """
    try:
        memory = posix_ipc.SharedMemory(_path(name), read_only=not writable)
    except posix_ipc.ExistentialError:
        raise ShmlogError(f"no {what} named {name!r} in {DIRECTORY}") from None
    except posix_ipc.PermissionsError:
        raise ShmlogError(f"{owner_name(os.geteuid())} may not open {what} {name!r} "
                          f"({_describe(name)}); a broker's shared memory is shared only "
                          f"between its own user and the members of its data_group") from None
    try:
        size = memory.size
        if size < minimum_size:
            raise ShmlogError(f"{what} {name!r} is {size} bytes, smaller than any valid one")
        return mmap.mmap(memory.fd, size,
                         access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        memory.close_fd()


def _describe(name: str) -> str:
    try:
        status = os.stat(os.path.join(DIRECTORY, name))
    except OSError:
        return "owner unknown"
    return f"owned by {owner_name(status.st_uid)}, gid {status.st_gid}, mode " \
           f"{status.st_mode & 0o777:o}"


def unlink(name: str) -> None:
    """Remove ``name`` from /dev/shm (existing mappings stay valid); no error if gone."""
    try:
        posix_ipc.unlink_shared_memory(_path(name))
    except posix_ipc.ExistentialError:
        pass


def names(prefix: str) -> list[str]:
    """The objects whose names start with ``prefix``.

    Raises
    ------
    ResourceLimitError
        The open-files limit left no descriptor to list /dev/shm with.
    """
    try:
        return sorted(name for name in os.listdir(DIRECTORY) if name.startswith(prefix))
    except FileNotFoundError:
        return []
    except OSError as error:
        raise open_files_error(error) or \
            StorageError(f"cannot list {DIRECTORY}: {error}") from error


def peek(name: str, size: int) -> bytes:
    """The first ``size`` bytes of an object (fewer if it is smaller), without mapping it.

    Raises
    ------
    OSError
        It is gone, or this user may not read it.
    """
    descriptor = os.open(os.path.join(DIRECTORY, name), os.O_RDONLY | os.O_NOFOLLOW
                         | os.O_CLOEXEC)
    try:
        return os.pread(descriptor, size, 0)
    finally:
        os.close(descriptor)


def owner_and_age_s(name: str) -> tuple[int, int, float]:
    """The owner's uid and gid, and the seconds since the object's metadata last
    changed.

    Raises
    ------
    OSError
        It is gone.
    """
    status = os.stat(os.path.join(DIRECTORY, name))
    return status.st_uid, status.st_gid, max(0.0, time.time() - status.st_ctime)


def write_magic_and_version(mapped: mmap.mmap, magic: int, version: int) -> None:
    """Stamp the first 6 bytes: a u32 magic, then a u16 version (every layout's start)."""
    header = np.frombuffer(mapped, np.uint8, count=6)
    header[:4] = np.frombuffer(np.uint32(magic).tobytes(), np.uint8)
    header[4:6] = np.frombuffer(np.uint16(version).tobytes(), np.uint8)


def read_magic_and_version(mapped: mmap.mmap) -> tuple[int, int]:
    header = np.frombuffer(mapped, np.uint8, count=6)
    return int(header[:4].view(np.uint32)[0]), int(header[4:6].view(np.uint16)[0])
