"""Files mapped whole into memory, and the background prefaulter.

Theory of operation
-------------------
A writer appends into a read-write mapping of a sparse file of fixed capacity.
Writing to a page that is not yet in the page cache costs a trap, a page
allocation and zeroing, all on the writer's thread; on a full disk the trap
becomes a ``SIGBUS`` that kills the process. :meth:`MappedFile.reserve` avoids
both: ``posix_fallocate`` reserves the disk blocks first (a full disk is then an
ordinary ``ENOSPC``, raised as :class:`StorageError` before a byte is written), and
``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) maps every page of the range in
one call. All these calls release the GIL, so :func:`prefault_in_background` runs
them on a single worker thread that keeps reservations ahead of the writers while
the writers' compiled kernels (which release the GIL too) keep copying.

Pages past the data are made by writing zeros (``pwrite``) before they are
mapped, not by faulting them in: a fault on a reserved (unwritten) extent of a
mapping without readahead takes the file system's read path for each page (a
folio allocated, zeroed, "read" and given buffers one at a time). Profiled in a
broker draining rings into one partition, that was 82 % of its CPU (perf: every
sample under ``madvise``), and populating 512 MiB took 0.36-1.14 s against
0.12 s for writing its zeros and mapping them (ext4, this project's VM). Zeros are
written only where nothing is stored: the caller says where that starts
(``fresh_from``), and a page it cuts is only populated.

The rule that keeps ``SIGBUS`` away: a writable mapping is stored into only below
what its owner reserved. The file is extended sparse, which takes no blocks, so
mapping it is safe; a new file can have its first blocks reserved before it is
mapped at all (``reserved``), so that a full disk leaves nothing behind to undo
but the empty file. On tmpfs ``posix_fallocate`` allocates the pages themselves,
so the rule holds there too.

Readers map files read-only at their current size. A mapping is never unmapped
while a numpy view of it is alive: :meth:`MappedFile.close` drops only its own view
(``native.mapping`` unmaps with the last one), so a reader's zero-copy view stays
valid even after the file is deleted.

No mapping holds a file descriptor (``native.mapping``): a file is open only while
it is being mapped, reserved, trimmed or zeroed, so a broker's open files do not
grow with its partitions or segments. Reopening goes by path, never through a
symbolic link, and checks the inode is still the one mapped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
import mmap
import os

import numpy as np

from ..common import limits
from ..common.access import open_file
from ..common.errors import StorageError
from ..common.process_limits import open_files_error
from ..native import mapping

log = logging.getLogger(__name__)

__all__ = ["MappedFile", "prefault_in_background", "PAGE_SIZE"]

PAGE_SIZE = mmap.PAGESIZE
# Linux >= 5.14; on older kernels madvise fails with EINVAL and we fall back to
# MADV_WILLNEED, a hint (the pages then fault in on first write, as plain mmap would).
MADV_POPULATE_WRITE = 23

_populate_advice = MADV_POPULATE_WRITE

# What new pages are written from (``_write_zeros``), its pages touched: a write
# from a buffer still unfaulted (calloc's zeros) copied ~25x slower here, the
# kernel's atomic copy faulting over and over.
_ZEROS = memoryview(bytearray(limits.ZEROS_BUFFER_BYTES))
_ZEROS[:] = bytes(limits.ZEROS_BUFFER_BYTES)

# One worker thread: populating is memory-bandwidth bound, more threads would only
# compete with the writers for it.
_prefaulter = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefault")


def prefault_in_background(job) -> bool:
    """Run ``job()`` on the prefaulter thread; its errors are logged, not raised
    (the writer's own synchronous reservation raises them where they matter).
    False when it cannot be queued (the interpreter is shutting down)."""
    def guarded():
        try:
            job()
        except Exception:                       # noqa: BLE001 - logged, then retried inline
            log.exception("background prefault failed")
    try:
        _prefaulter.submit(guarded)
    except RuntimeError:
        return False
    return True



class MappedFile:
    """A file mapped whole: read-write at a fixed capacity (the file is extended,
    sparse, to it; a larger file keeps its size) or read-only at its current size.
    A missing file maps as empty when read-only (derived files such as indexes are
    then rebuilt). No descriptor stays open.

    Parameters
    ----------
    path : str
    capacity : int or None
        The size to map read-write; None maps the file read-only.
    reserved : int
        Bytes from the start whose blocks are reserved before the file is mapped
        (read-write only); a full disk raises before anything is mapped.

    Raises
    ------
    StorageError
        The file cannot be opened, reserved or mapped (nothing stays open then);
        :class:`ResourceLimitError` when a limit of the process (open files,
        mappings) is what refused.
    """

    def __init__(self, path: str, capacity: int | None, *, reserved: int = 0):
        self.path = path
        self.writable = capacity is not None
        self.bytes = np.zeros(0, np.uint8)
        self.size = 0                # the file's size when it was opened
        self.inode = -1
        try:
            # A file the broker writes: the data directory's mode, never a symlink.
            fd = open_file(path, os.O_RDWR | os.O_CREAT) if self.writable \
                else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as error:
            raise open_files_error(error) or \
                StorageError(f"cannot open {path}: {error}") from error
        try:
            self._map(fd, capacity, reserved)
            if reserved:
                if not self.size:               # a new file: nothing stored anywhere
                    self._write_zeros(fd, 0, reserved)
                self._populate(0, reserved)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(fd)

    def _map(self, fd: int, capacity: int | None, reserved: int) -> None:
        try:
            status = os.fstat(fd)
            self.size = status.st_size
            self.inode = status.st_ino      # tells a file replaced under the same name
            if self.writable and self.size < capacity:
                os.ftruncate(fd, capacity)
            if reserved:
                assert self.writable, "only a writable file is reserved"
                self._allocate(fd, 0, reserved)
            # A file larger than the capacity asked for (its config shrank since)
            # is mapped whole: nothing may ever read past the end of a mapping.
            length = max(capacity, self.size) if self.writable else self.size
            for _ in range(limits.SHRINK_ATTEMPTS_MAX):
                if not length:
                    return
                self.bytes = mapping.map_shared(fd, length, writable=self.writable)
                if self.writable:
                    # No readahead: a fault in a sparse file being written would read a
                    # window of holes around it first (zero pages allocated for nothing),
                    # which made populating a new segment's first pages take ~5 ms here
                    # instead of ~20 us. Written pages are in the page cache anyway.
                    mapping.advise(self.bytes, 0, length, mmap.MADV_RANDOM)
                    return
                # The owner may have trimmed the file (a roll) between fstat and mmap:
                # a read-only mapping past the end would fault, so take its new size.
                size = os.fstat(fd).st_size
                if size >= length:
                    return
                self.bytes = np.zeros(0, np.uint8)
                self.size = length = size
            raise StorageError(f"cannot map {self.path}: it keeps changing size")
        except OSError as error:
            raise StorageError(f"cannot map {self.path}: {error}") from error

    @contextlib.contextmanager
    def _descriptor(self):
        """The file open read-write for a moment (reserving, trimming, zeroing): by
        path, never through a symlink, and only while it is still the file mapped."""
        assert self.writable, "only a writable file is reserved or trimmed"
        try:
            fd = open_file(self.path, os.O_RDWR)
        except OSError as error:
            raise open_files_error(error) or \
                StorageError(f"cannot open {self.path}: {error}") from error
        try:
            if os.fstat(fd).st_ino != self.inode:
                raise StorageError(f"{self.path} was replaced while mapped; restart the "
                                   f"broker to map the new file")
            yield fd
        finally:
            os.close(fd)

    def reserve(self, start: int, end: int, fresh_from: int | None = None) -> None:
        """Allocate disk blocks for ``[start, end)`` and populate its pages; the whole
        pages from ``fresh_from`` on (nothing is stored there, nor will be until
        this returns) are made by writing zeros first.

        Raises
        ------
        StorageError
            The disk is full or the file system refused.
        """
        with self._descriptor() as fd:
            self._allocate(fd, start, end)
            if fresh_from is not None:
                self._write_zeros(fd, max(start, fresh_from), end)
        self._populate(start, end)

    def _write_zeros(self, fd: int, start: int, end: int) -> None:
        """Write zeros over the whole pages of ``[start, end)``: page cache made by a
        write, without the fault path (the module's theory)."""
        start += -start % PAGE_SIZE
        end -= end % PAGE_SIZE
        try:
            while start < end:
                start += os.pwrite(fd, _ZEROS[:end - start], start)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise StorageError(f"disk full: cannot write {end - start} bytes of "
                                   f"{self.path}; free space or lower retention") from error
            raise StorageError(f"cannot write {self.path}: {error}") from error

    def _allocate(self, fd: int, start: int, end: int) -> None:
        try:
            os.posix_fallocate(fd, start, end - start)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise StorageError(f"disk full: cannot reserve {end - start} bytes for "
                                   f"{self.path}; free space or lower retention") from error
            raise StorageError(f"cannot reserve space in {self.path}: {error}") from error

    def _populate(self, start: int, end: int) -> None:
        global _populate_advice
        number = mapping.advise(self.bytes, start, end, _populate_advice)
        if number == errno.EINVAL and _populate_advice == MADV_POPULATE_WRITE:
            log.info("MADV_POPULATE_WRITE unsupported; pages will fault in on first write")
            _populate_advice = mmap.MADV_WILLNEED
        elif number:
            raise StorageError(f"cannot populate {self.path} [{start}, {end}): "
                               f"{os.strerror(number)}")

    def trim(self, size: int) -> None:
        """Cut the file to ``size`` bytes (the mapping stays; nothing reads past it)."""
        with self._descriptor() as fd:
            os.ftruncate(fd, size)

    def zero_tail(self, size: int, capacity: int) -> None:
        """Drop everything from ``size`` on: the tail reads as zeros again."""
        with self._descriptor() as fd:
            os.ftruncate(fd, size)
            os.ftruncate(fd, capacity)

    def sync(self, start: int = 0, end: int | None = None) -> None:
        """msync ``[start, end)`` (start rounded down to a page)."""
        start -= start % PAGE_SIZE
        end = self.bytes.size if end is None else end
        try:
            mapping.sync(self.bytes, start, end)
        except OSError as error:
            raise StorageError(f"cannot sync {self.path}: {error}") from error

    def close(self) -> None:
        """Drop this file's view; the mapping goes with the last view of it."""
        self.bytes = np.zeros(0, np.uint8)
