"""Shared file mappings that hold no file descriptor, counted against the kernel's
limit on mappings.

Rules
-----
* A mapping is unmapped only when nothing can reach it: when the last numpy view
  of it is freed. Closing the file's owner drops its own view; a reader's zero-copy
  view keeps the pages valid for as long as it lives.
* Every mapping made here is counted; :func:`check_room` refuses a new one, with
  :class:`ResourceLimitError` naming ``vm.max_map_count``, while the process still
  has :data:`limits.MAPPINGS_HEADROOM` mappings left for everything else (malloc
  arenas, thread stacks, libraries), so hitting the limit is an error, never a
  crash elsewhere.

Theory of operation
-------------------
Python 3.11's ``mmap.mmap`` duplicates the descriptor it is given and keeps the
copy open for the mapping's life (for ``resize`` and ``size``, which shmlog never
calls). A partition's active segment is three mapped files, so a broker with
thousands of partitions would hold thousands of descriptors that do nothing, and
reach ``RLIMIT_NOFILE`` long before any other limit. The kernel needs no
descriptor once a mapping exists, so :func:`map_shared` calls libc's ``mmap``
itself and wraps the pages in a ctypes array whose owner unmaps them when it is
freed; the numpy arrays made from it keep it alive.

The kernel's limit is per process (``vm.max_map_count``, 65,530 by default, each
mapping one entry unless ``mprotect`` splits it). Counting ``/proc/self/maps`` costs
a read of the whole list, so :func:`check_room` counts it only when the mappings
made here since the last count could have brought the process near the limit, and
after every :data:`limits.MAPPINGS_RECOUNT_EVERY` of them (the process's other
mappings, malloc's and threads', change too; the headroom covers what they add in
between).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

import numpy as np

from ..common import limits
from ..common.errors import ResourceLimitError

__all__ = ["map_shared", "sync", "advise", "check_room", "mappings_live"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.msync.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int

_MAP_FAILED = ctypes.c_void_p(-1).value
_SYNCHRONOUS = 4         # msync(2)'s MS_SYNC: wait for the write-back

MAX_MAP_COUNT_PATH = "/proc/sys/vm/max_map_count"


class _Counter:
    """Mappings this module made and has not unmapped, and the process's whole count
    when it was last read from ``/proc/self/maps``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = 0
        self.counted = 0          # /proc/self/maps' lines at the last count
        self.live_at_count = 0    # ``live`` then
        self.limit = _read_max_map_count()


def _read_max_map_count() -> int:
    try:
        with open(MAX_MAP_COUNT_PATH) as source:
            return int(source.read())
    except (OSError, ValueError):
        return limits.MAX_MAP_COUNT_ASSUMED


_counter = _Counter()


class _Owner:
    """Unmaps its pages when freed (after the last view of them)."""

    __slots__ = ("address", "length")

    def __init__(self, address: int, length: int):
        self.address = address
        self.length = length

    def __del__(self):
        _libc.munmap(self.address, self.length)
        with _counter.lock:
            _counter.live -= 1


def map_shared(fd: int, length: int, *, writable: bool) -> np.ndarray:
    """``length`` bytes of the file open on ``fd`` mapped shared (read-write or
    read-only), as a uint8 array; the descriptor may be closed right after.

    Raises
    ------
    ResourceLimitError
        The process is at its mapping limit (``vm.max_map_count``).
    OSError
        The kernel refused the mapping for another reason.
    """
    assert length > 0, "an empty file is not mapped"
    check_room()
    protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    address = _libc.mmap(None, length, protection, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        number = ctypes.get_errno()
        if number == errno.ENOMEM:
            raise _limit_error("the kernel refused a mapping (ENOMEM)")
        raise OSError(number, os.strerror(number))
    with _counter.lock:
        _counter.live += 1
    pages = (ctypes.c_ubyte * length).from_address(address)
    pages.owner = _Owner(address, length)     # freed with the last view: unmaps
    view = np.frombuffer(pages, np.uint8)
    # A store into a read-only mapping would be a SIGSEGV: numpy refuses it instead
    # (and kernels compiled for read-only arrays, as mmap's were, match it).
    view.flags.writeable = writable
    return view


def sync(view: np.ndarray, start: int, end: int) -> None:
    """msync ``view[start:end]`` (``start`` a page boundary) and wait for it.

    Raises
    ------
    OSError
        The write-back failed (an I/O error, a full thin-provisioned disk).
    """
    if end > start and _libc.msync(view.ctypes.data + start, end - start, _SYNCHRONOUS) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def advise(view: np.ndarray, start: int, end: int, advice: int) -> int:
    """madvise ``view[start:end]``; 0, or the errno the kernel answered."""
    if _libc.madvise(view.ctypes.data + start, end - start, advice) != 0:
        return ctypes.get_errno()
    return 0


def mappings_live() -> int:
    """Mappings made here and not yet unmapped."""
    return _counter.live


def check_room() -> None:
    """Refuse a new mapping while the process is within the headroom of its limit.

    Raises
    ------
    ResourceLimitError
        Naming ``vm.max_map_count``, the count and how to raise it.
    """
    counter = _counter
    with counter.lock:
        made = counter.live - counter.live_at_count
        room = counter.limit - limits.MAPPINGS_HEADROOM - counter.counted
        # Counted again after half the room left at the last count (at least every
        # MAPPINGS_RECOUNT_EVERY): far from the limit, a recount per thousands of
        # mappings, not one per few hundred (each reads every line of the maps).
        if counter.counted and made < max(limits.MAPPINGS_RECOUNT_EVERY, room // 2) and \
                made < room:
            return
        counter.counted = _count_mappings()
        counter.live_at_count = counter.live
        counter.limit = _read_max_map_count()
        if counter.counted < counter.limit - limits.MAPPINGS_HEADROOM:
            return
    raise _limit_error(f"the process has {counter.counted} memory mappings")


def _count_mappings() -> int:
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


def _limit_error(what: str) -> ResourceLimitError:
    limit = _counter.limit
    return ResourceLimitError(
        f"{what}, and vm.max_map_count is {limit} (with {limits.MAPPINGS_HEADROOM} kept for "
        f"the process's own use): each partition's active segment takes 3 mappings; raise "
        f"the limit (sysctl -w vm.max_map_count={limit * 4}) or host fewer partitions",
        limit="vm.max_map_count")
