"""Named POSIX shared-memory objects (in /dev/shm), mapped whole.

The rings and the partition state table are built on these two calls; what lives
inside each object is described by its layout module.
"""

from __future__ import annotations

import mmap

import numpy as np
import posix_ipc

from .errors import LocalProtocolError, ShmlogError

__all__ = ["create", "attach", "unlink", "write_magic_and_version", "read_magic_and_version"]

NAME_LENGTH_MAX = 200                 # NAME_MAX is 255; leave room for a prefix


def _path(name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or len(name) > NAME_LENGTH_MAX:
        raise LocalProtocolError(f"a shared-memory name must be 1-{NAME_LENGTH_MAX} characters "
                                 f"without '/', got {name!r}")
    return "/" + name


def create(name: str, size: int, what: str) -> mmap.mmap:
    """Create ``name`` (which must not exist) of ``size`` zero bytes and map it."""
    try:
        memory = posix_ipc.SharedMemory(_path(name), posix_ipc.O_CREX, mode=0o600, size=size)
    except posix_ipc.ExistentialError:
        raise LocalProtocolError(f"a {what} named {name!r} already exists") from None
    try:
        return mmap.mmap(memory.fd, size)
    finally:
        memory.close_fd()


def attach(name: str, minimum_size: int, what: str) -> mmap.mmap:
    """Map an existing object whole.

    Raises
    ------
    ShmlogError
        No object of that name exists, or it is smaller than ``minimum_size``.
    """
    try:
        memory = posix_ipc.SharedMemory(_path(name))
    except posix_ipc.ExistentialError:
        raise ShmlogError(f"no {what} named {name!r} in /dev/shm") from None
    try:
        size = memory.size
        if size < minimum_size:
            raise ShmlogError(f"{what} {name!r} is {size} bytes, smaller than any valid one")
        return mmap.mmap(memory.fd, size)
    finally:
        memory.close_fd()


def unlink(name: str) -> None:
    """Remove ``name`` from /dev/shm (existing mappings stay valid); no error if gone."""
    try:
        posix_ipc.unlink_shared_memory(_path(name))
    except posix_ipc.ExistentialError:
        pass


def write_magic_and_version(mapped: mmap.mmap, magic: int, version: int) -> None:
    """Stamp the first 6 bytes: a u32 magic, then a u16 version (every layout's start)."""
    header = np.frombuffer(mapped, np.uint8, count=6)
    header[:4] = np.frombuffer(np.uint32(magic).tobytes(), np.uint8)
    header[4:6] = np.frombuffer(np.uint16(version).tobytes(), np.uint8)


def read_magic_and_version(mapped: mmap.mmap) -> tuple[int, int]:
    header = np.frombuffer(mapped, np.uint8, count=6)
    return int(header[:4].view(np.uint32)[0]), int(header[4:6].view(np.uint16)[0])
