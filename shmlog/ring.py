"""Single-producer, single-consumer rings in POSIX shared memory.

Rules
-----
* One producer process writes a ring; one consumer (the broker's appender) reads
  it. Neither ever takes a lock.
* Cross-process ordering uses the acquire/release atomics of ``atomics.py`` only;
  no spin loop reads a counter with a plain load.
* The consumer trusts nothing the producer wrote: its own head is kept privately
  (``Ring.consumer_head``, which the appender starts from; the shared head word
  is only published), and every entry is bounds-checked before it is handed out
  (see ``ring_layout``).

Theory of operation
-------------------
The producer owns ``tail`` and the bytes between ``tail`` and ``head + capacity``;
the consumer owns ``head`` and the bytes between ``head`` and ``tail``. A put
writes the entry into free space and then publishes it by a release store of the
new tail; the consumer's acquire load of the tail makes the entry's bytes visible
before it reads them. When the consumer is done with entries, a release store of
the head hands their space back; the producer's acquire load of the head orders
its reuse after the consumer's last read. Each side only ever moves its own counter
forward, so one load of the other's counter is always a safe (if stale) bound.

The compiled kernels :func:`put_entry` and :func:`next_entry` are what the producer
and the appender call in their own compiled loops; :class:`Ring` wraps them for
Python callers, with a blocking put that backs off (spin, yield, sleep) up to a
timeout, like Kafka's ``max.block.ms``.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import NamedTuple

import numpy as np

from .common import limits
from .common.access import Access
from .common.errors import CorruptRingError, LocalProtocolError, RecordTooLargeError, RingFullError
from .native.atomics import (
    fence,
    load_acquire,
    load_relaxed,
    py_load_acquire,
    py_store_release,
    store_relaxed,
    store_release,
)
from .native.jit import copy_bytes, kernel, load_i64, load_u32, store_i64, store_u32
from .shm import ring_layout as R
from .shm import shared_memory
from .shm.wakeup import Doorbell

__all__ = ["Ring", "Destination", "put_entry", "next_entry", "complete_entry",
           "harvest_completions", "maker_pid", "MAKER_UNKNOWN", "MAKER_PENDING", "PUT_OK",
           "PUT_FULL",
           "ENTRY_OK", "ENTRY_NONE", "ENTRY_CORRUPT"]

PUT_OK = 0
PUT_FULL = 1
ENTRY_OK = 0
ENTRY_NONE = 1
ENTRY_CORRUPT = 2


class Destination(NamedTuple):
    """Where an entry goes (see ``ring_layout``): the partition's row in the state
    table, and the partition it must be: its topic's key and its number."""
    row: int
    topic_key: int
    partition: int


@kernel
def _aligned(size):
    return (size + R.ENTRY_ALIGNMENT - 1) & ~np.int64(R.ENTRY_ALIGNMENT - 1)


@kernel
def put_entry(words, data, capacity, row, topic_key, partition, payload, start, length):
    """Write one entry (``payload[start:start + length]``, addressed to ``row``,
    ``topic_key`` and ``partition``) and publish it.

    Returns PUT_OK, or PUT_FULL when it does not fit now. The caller guarantees
    ``aligned_entry_size(length) <= capacity`` and the payload bounds.
    """
    tail = load_relaxed(words, R.TAIL_WORD)          # only this producer stores it
    head = load_acquire(words, R.HEAD_WORD)          # orders reuse after the consumer's reads
    needed = _aligned(R.ENTRY_HEADER_LENGTH + length)
    position = tail & (capacity - 1)
    padding = 0
    if position + needed > capacity:
        padding = capacity - position                 # entries never wrap
    if tail + padding + needed - head > capacity:
        return PUT_FULL
    if padding:
        store_u32(data, position, R.PADDING_MARKER)
        position = 0
    published = load_relaxed(words, R.PUBLISHED_WORD)             # only this producer stores it
    store_u32(data, position + R.ENTRY_LENGTH_OFFSET, R.ENTRY_HEADER_LENGTH + length)
    store_u32(data, position + R.ENTRY_ROW_OFFSET, row)
    store_i64(data, position + R.ENTRY_NUMBER_OFFSET, published)
    store_i64(data, position + R.ENTRY_TOPIC_KEY_OFFSET, topic_key)
    store_u32(data, position + R.ENTRY_PARTITION_OFFSET, partition)
    store_u32(data, position + R.ENTRY_RESERVED_OFFSET, 0)
    copy_bytes(data, position + R.ENTRY_HEADER_LENGTH, payload, start, length)
    # Publish: every byte written above is visible to whoever acquires this tail.
    store_release(words, R.TAIL_WORD, tail + padding + needed)
    store_relaxed(words, R.PUBLISHED_WORD, published + 1)
    return PUT_OK


@kernel
def next_entry(words, data, capacity, head):
    """The entry at the consumer's ``head``.

    Returns (status, position, length, row, topic key, partition, entry number, head
    after it):
    ENTRY_NONE when the ring is empty, ENTRY_CORRUPT (position = where) when the
    bytes cannot be an entry. Padding markers are skipped. Nothing here writes shared memory: the
    consumer publishes its head when it is done with the entries.
    """
    # Acquire: the bytes of every entry below this tail are complete.
    tail = load_acquire(words, R.TAIL_WORD)
    while True:
        if tail == head:
            return ENTRY_NONE, 0, 0, 0, 0, 0, 0, head
        if tail - head > capacity or tail - head < 0:
            return ENTRY_CORRUPT, head & (capacity - 1), 0, 0, 0, 0, 0, head
        position = head & (capacity - 1)
        length = np.int64(load_u32(data, position + R.ENTRY_LENGTH_OFFSET))
        if length == R.PADDING_MARKER:
            head += capacity - position
            continue
        if length < R.ENTRY_HEADER_LENGTH or position + length > capacity \
                or head + _aligned(length) > tail:
            return ENTRY_CORRUPT, position, length, 0, 0, 0, 0, head
        row = np.int64(load_u32(data, position + R.ENTRY_ROW_OFFSET))
        number = load_i64(data, position + R.ENTRY_NUMBER_OFFSET)
        topic_key = load_i64(data, position + R.ENTRY_TOPIC_KEY_OFFSET)
        partition = np.int64(load_u32(data, position + R.ENTRY_PARTITION_OFFSET))
        if number < 0:
            return ENTRY_CORRUPT, position, length, 0, 0, 0, 0, head
        return (ENTRY_OK, position, length, row, topic_key, partition, number,
                head + _aligned(length))


@kernel
def complete_entry(words, completions, entry_number, result, timestamp):
    """Consumer: record entry ``entry_number``'s result, then acknowledge it (release:
    the slot is written before the producer can see the new count). Entries are
    completed in order; completing one again rewrites its slot. Returns whether a
    producer sleeps on the count (``ring_layout``: the consumer then wakes it)."""
    slot = (entry_number % R.COMPLETION_SLOTS) * R.COMPLETION_WORDS
    store_relaxed(completions, slot + R.COMPLETION_RESULT_WORD, result)
    store_relaxed(completions, slot + R.COMPLETION_TIMESTAMP_WORD, timestamp)
    # A re-read entry (a consumer restarted before releasing it) must not lower the count.
    if entry_number + 1 > load_relaxed(words, R.ACKNOWLEDGED_WORD):
        store_release(words, R.ACKNOWLEDGED_WORD, entry_number + 1)
    # Dekker's, with the sleeper's raise, fence, load (wakeup.Doorbell).
    fence()
    return load_relaxed(words, R.COMPLETION_SLEEPERS_WORD) != 0


@kernel
def harvest_completions(words, completions, first, results, timestamps):
    """Producer: copy the results of entries ``first`` .. acknowledged - 1 into
    ``results``/``timestamps`` (from index 0); return the acknowledged count."""
    acknowledged = load_acquire(words, R.ACKNOWLEDGED_WORD)
    # The count is input (the ring is 0660 with a data group). One past the entries
    # put (the room in ``results``) or gone back is no consumer's: nothing is taken
    # as acknowledged (the sends wait, then time out), never a write past ``results``.
    if acknowledged < first or acknowledged > first + results.shape[0]:
        return first
    for entry in range(first, acknowledged):
        slot = (entry % R.COMPLETION_SLOTS) * R.COMPLETION_WORDS
        results[entry - first] = load_relaxed(completions, slot + R.COMPLETION_RESULT_WORD)
        timestamps[entry - first] = load_relaxed(completions, slot + R.COMPLETION_TIMESTAMP_WORD)
    return acknowledged


MAKER_UNKNOWN = -1       # maker_pid: not a ring of this version
MAKER_PENDING = 0        # maker_pid: its header is still being written


def maker_pid(name: str) -> int:
    """The pid of the process that made ring ``name``, read without mapping it:
    MAKER_PENDING while its header is being written, MAKER_UNKNOWN when the object
    is not a ring of this version.

    Raises
    ------
    OSError
        It is gone, or this user may not read it.
    """
    header = shared_memory.peek(name, R.HEADER_END)
    if len(header) < R.HEADER_END:
        return MAKER_PENDING                       # its size is set after it is made
    magic = int.from_bytes(header[R.MAGIC_OFFSET:R.MAGIC_OFFSET + R.MAGIC_SIZE], "little")
    version = int.from_bytes(header[R.VERSION_OFFSET:R.VERSION_OFFSET + R.VERSION_SIZE],
                             "little")
    if magic == 0 or version == 0:
        # Ring.create stamps the magic, then the version: a header read in between
        # (many producers starting while the liveness check lists the rings) is one
        # still being written, not one of another version.
        return MAKER_PENDING
    if magic != R.MAGIC or version != R.VERSION:
        return MAKER_UNKNOWN
    return int.from_bytes(header[R.PRODUCER_PID_OFFSET:R.HEADER_END], "little", signed=True)


class Ring:
    """A ring mapped into this process; ``create`` it as the producer or ``attach``
    to it as the consumer (or as a producer reopening its own ring)."""

    def __init__(self, name: str, memory: mmap.mmap, *, owner: bool):
        self.name = name
        self._memory = memory
        self.owner = owner
        self.words = np.frombuffer(memory, np.int64, count=R.CONTROL_SIZE // R.WORD_SIZE)
        self.completions = np.frombuffer(memory, np.int64, offset=R.COMPLETIONS_OFFSET,
                                         count=R.COMPLETION_SLOTS * R.COMPLETION_WORDS)
        self.capacity = len(memory) - R.DATA_OFFSET
        self.data = np.frombuffer(memory, np.uint8, offset=R.DATA_OFFSET, count=self.capacity)
        # The consumer's private copies: it never trusts what the producer could overwrite.
        # ``consumer_head``: the byte count up to which this consumer has taken entries
        # (the shared head word only publishes it); a consumer that attaches starts
        # where the previous one released, so the appender starts its own head here.
        self.consumer_head = int(self.words[R.HEAD_WORD])
        self._taken_numbers: list[int] = []          # taken, not yet completed
        # The producer's: entries put, and results copied out but not yet claimed.
        self._published = int(self.words[R.PUBLISHED_WORD])
        self._harvested = int(self.words[R.ACKNOWLEDGED_WORD])
        self._results: dict[int, tuple[int, int]] = {}
        # What a producer waiting for completions sleeps on (see ring_layout).
        self.completion_bell = Doorbell(self.words, R.ACKNOWLEDGED_WORD,
                                        R.COMPLETION_SLEEPERS_WORD)
        # False for a producer that never asks (acks=0): results are then dropped as
        # they are harvested, or they would pile up, one per entry, for ever.
        self.keeps_results = True

    @classmethod
    def create(cls, name: str, capacity: int, *, group_id: int | None = None) -> "Ring":
        """Create a new ring in /dev/shm (fails if one of that name exists): 0600, or
        0660 owned by ``group_id`` for a broker that shares its data with that group
        (see ``access``: the broker must write the ring's head and completions)."""
        R.check_capacity(capacity)
        mapped = shared_memory.create(name, R.DATA_OFFSET + capacity, "ring",
                                      mode=Access(group_id).writable_mode, group_id=group_id)
        shared_memory.write_magic_and_version(mapped, R.MAGIC, R.VERSION)
        ring = cls(name, mapped, owner=True)
        ring.words[R.CAPACITY_WORD] = capacity
        ring.words[R.PRODUCER_PID_WORD] = os.getpid()
        return ring

    @classmethod
    def attach(cls, name: str) -> "Ring":
        """Map an existing ring, checking its header first.

        Raises
        ------
        CorruptRingError
            The object is not a ring of this version, its size disagrees with it or
            is no valid capacity, or its head word is no entry boundary.
        ShmlogError
            No ring of that name exists.
        """
        mapped = shared_memory.attach(name, R.DATA_OFFSET + R.CAPACITY_MIN, "ring")
        magic, version = shared_memory.read_magic_and_version(mapped)
        capacity = int(np.frombuffer(mapped, np.int64, count=R.CAPACITY_WORD + 1)[-1])
        if magic != R.MAGIC or version != R.VERSION:
            raise CorruptRingError(f"{name!r} is not a version-{R.VERSION} ring (magic "
                                   f"{magic:#x}, version {version})", name=name)
        if capacity != len(mapped) - R.DATA_OFFSET:
            raise CorruptRingError(f"ring {name!r} says capacity {capacity} but holds "
                                   f"{len(mapped) - R.DATA_OFFSET} data bytes", name=name)
        try:
            R.check_capacity(capacity)
        except LocalProtocolError as error:
            raise CorruptRingError(f"ring {name!r}: {error}", name=name) from None
        ring = cls(name, mapped, owner=False)
        # The head the consumer starts from is the one word of the consumer's line it
        # reads back: an entry starts on ENTRY_ALIGNMENT, so one that does not (or a
        # negative count) would have next_entry read a length across the region's end.
        if ring.consumer_head < 0 or ring.consumer_head % R.ENTRY_ALIGNMENT:
            head = ring.consumer_head
            ring.close()
            raise CorruptRingError(f"ring {name!r} says its consumer released {head} bytes, "
                                   f"not a count of {R.ENTRY_ALIGNMENT}-byte aligned entries",
                                   name=name)
        return ring

    # -- producer ------------------------------------------------------------------
    def _payload(self, payload) -> np.ndarray:
        buffer = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8)
        if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous:
            raise LocalProtocolError("a ring payload must be a contiguous 1-D uint8 buffer")
        if R.aligned_entry_size(buffer.size) > self.capacity:
            raise RecordTooLargeError(f"an entry of {buffer.size} bytes cannot fit ring "
                                      f"{self.name!r} of {self.capacity} bytes")
        return buffer

    def _try_put(self, destination: Destination, buffer: np.ndarray) -> int:
        if self._published - self._harvested >= R.COMPLETION_SLOTS:
            self._harvest()
            if self._published - self._harvested >= R.COMPLETION_SLOTS:
                return -1               # every completion slot still holds an unread result
        row, topic_key, partition = destination
        if put_entry(self.words, self.data, self.capacity, row, topic_key, partition, buffer, 0,
                     buffer.size) != PUT_OK:
            return -1
        self._published += 1
        return self._published - 1

    def try_put(self, destination: Destination, payload) -> int:
        """Put one entry for ``destination`` if it fits now: its entry number, or -1
        when the ring (or its completion slots) is full."""
        return self._try_put(destination, self._payload(payload))

    def put(self, destination: Destination, payload, timeout_ms: int) -> int:
        """Put one entry for ``destination`` (a :class:`Destination` or a tuple of
        the same fields), waiting up to ``timeout_ms`` for space; its entry number.

        Raises
        ------
        RingFullError
            The ring stayed full for the whole wait.
        """
        buffer = self._payload(payload)
        deadline = time.monotonic() + timeout_ms / 1000
        attempt = 0
        sleep = limits.RING_PUT_SLEEP_FIRST_S
        while (entry := self._try_put(destination, buffer)) < 0:
            attempt += 1
            if attempt <= limits.RING_PUT_SPIN_COUNT:
                continue
            if time.monotonic() >= deadline:
                raise RingFullError(f"ring {self.name!r} stayed full for {timeout_ms} ms: the "
                                    f"broker's appender is behind or gone")
            if attempt <= limits.RING_PUT_SPIN_COUNT + limits.RING_PUT_YIELD_COUNT:
                os.sched_yield()
            else:
                time.sleep(sleep)
                sleep = min(sleep * 2, limits.RING_PUT_SLEEP_LONGEST_S)
        return entry

    def _harvest(self) -> None:
        pending = max(0, self._published - self._harvested)
        results = np.empty(pending, np.int64)
        timestamps = np.empty(pending, np.int64)
        acknowledged = int(harvest_completions(self.words, self.completions, self._harvested,
                                               results, timestamps))
        if self.keeps_results:
            for index in range(acknowledged - self._harvested):
                self._results[self._harvested + index] = (int(results[index]),
                                                          int(timestamps[index]))
        self._harvested = acknowledged

    @property
    def consumer_error(self) -> int:
        """Why the consumer stopped reading this ring (a ``CompletionCode``), or 0
        while it reads it. Loaded with acquire: the completions the consumer stored
        before it gave up are visible to a harvest after this load."""
        return int(py_load_acquire(self.words, R.CONSUMER_ERROR_WORD))

    @property
    def results_held(self) -> int:
        """Results harvested and not yet claimed by :meth:`result`."""
        return len(self._results)

    def result(self, entry: int):
        """``(result, timestamp)`` of an acknowledged entry (claimed once), or None
        while the consumer has not finished it."""
        if entry not in self._results:
            self._harvest()
        return self._results.pop(entry, None)

    def await_completions(self, timeout_s: float) -> bool:
        """Producer: sleep until the consumer acknowledges an entry not harvested
        yet, or ``timeout_s`` passes; whether one is acknowledged (the GIL let go).
        A count that cannot be a consumer's (``harvest_completions`` would take
        nothing) is no acknowledgement: the sleep runs to its timeout."""
        def acknowledged() -> bool:
            return self._harvested < py_load_acquire(self.words, R.ACKNOWLEDGED_WORD) \
                <= self._published
        return bool(self.completion_bell.wait(acknowledged, timeout_s)) or acknowledged()

    @property
    def unacknowledged(self) -> int:
        """Entries put whose results are not yet known."""
        self._harvest()
        return self._published - self._harvested

    # -- consumer ------------------------------------------------------------------
    def next(self):
        """The next entry as ``(Destination, payload view)``, or None when the ring is
        empty.
        The view stays valid until :meth:`release` hands its space back.

        Raises
        ------
        CorruptRingError
            The ring holds bytes that cannot be an entry.
        """
        status, position, length, row, topic_key, partition, number, head = next_entry(
            self.words, self.data, self.capacity, self.consumer_head)
        if status == ENTRY_NONE:
            return None
        if status == ENTRY_CORRUPT:
            raise CorruptRingError(f"ring {self.name!r}: no valid entry at byte {position} "
                                   f"(length field {length}); the producer wrote garbage",
                                   name=self.name, position=int(position))
        self.consumer_head = int(head)
        self._taken_numbers.append(int(number))
        start = int(position) + R.ENTRY_HEADER_LENGTH
        return (Destination(int(row), int(topic_key), int(partition)),
                self.data[start:int(position) + int(length)])

    def complete(self, result: int, timestamp: int = -1) -> None:
        """Finish the oldest taken, unfinished entry with ``result`` (a base offset, or
        a negative error code) and acknowledge it to the producer."""
        if not self._taken_numbers:
            raise LocalProtocolError("complete() without an entry taken and not completed")
        if complete_entry(self.words, self.completions, self._taken_numbers.pop(0), result,
                          timestamp):
            self.completion_bell.wake()

    def release(self) -> None:
        """Hand the space of every entry taken so far back to the producer."""
        py_store_release(self.words, R.HEAD_WORD, self.consumer_head)

    @property
    def used(self) -> int:
        """Bytes published and not yet released (a snapshot)."""
        return int(self.words[R.TAIL_WORD]) - int(self.words[R.HEAD_WORD])

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the ring (views handed out keep the mapping alive until dropped)."""
        self.words = self.data = self.completions = None
        try:
            self._memory.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        """Remove the ring's name from /dev/shm (mappings stay valid)."""
        shared_memory.unlink(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

