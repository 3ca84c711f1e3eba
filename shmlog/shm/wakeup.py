"""Doorbells: how an idle process sleeps until another one has work for it.

A doorbell is two int64 words in shared memory, each on a cache line of its own
(see ``state_layout``): a *sequence* the ringer bumps every time it makes work,
and a count of *sleepers*. The sleeper is told of new work by a Linux futex on
the sequence word (its low 32 bits), so a sleeping consumer or appender costs no
CPU and wakes in microseconds; the ringer pays for the futex syscall only while
somebody sleeps.

The handshake is Dekker's, with sequentially consistent fences::

    ringer                              sleeper
    publish the work (release)          sleepers += 1
    sequence += 1                       fence
    fence                               seen = sequence
    if sleepers: futex_wake(sequence)   if no work: futex_wait(sequence, seen)
                                        sleepers -= 1

Either the ringer sees the sleeper (and wakes it), or the sleeper sees the work or
the new sequence (and the futex refuses to sleep on a stale value). A waiter always
passes a timeout, so a ringer that dies between its two steps costs a delay,
never a hang. Where the futex syscall is unknown (not Linux on x86-64 or arm64) a
waiter sleeps in short naps instead.

The words are input: every client of the broker writes them (the state table's
doorbell object is 0660 with a data group), so any value must be harmless, and is.
A sequence is only bumped (wrapping, in compiled code) and compared by the futex;
a sleepers count only decides whether the ringer makes the wake-up call. Garbage
costs a futex call too many, or a sleeper left to its timeout: a delay, never a
lost record, a crash or an overflow (``int`` of an int64 word never overflows).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import selectors
import socket
import threading
import time

from ..common import limits
from ..native.atomics import fence, fetch_add, load_acquire
from ..native.jit import kernel

__all__ = ["Doorbell", "DoorbellRelay", "LoopSelector", "pause"]

_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT = 0                    # shared (not FUTEX_PRIVATE): the word is in shared memory
_FUTEX_WAKE = 1
_WAKE_EVERYONE = 0x7FFFFFFF
_libc = ctypes.CDLL(None, use_errno=True) if _FUTEX_SYSCALL is not None else None
# The wake-up call holds the GIL through it (PyDLL): it never blocks, and a thread that
# let the GIL go for it (CDLL does) waits for the GIL again behind whichever thread took
# it, which for a thread ringing the broker's loop is that loop.
# So is the write of a wake byte into a non-blocking socket pair (LoopSelector).
_libc_keeping_gil = ctypes.PyDLL(None, use_errno=True)
_libc_holding_gil = _libc_keeping_gil if _FUTEX_SYSCALL is not None else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def pause(idle_s: float, doorbell: "Doorbell", attempt, longest_sleep, *,
          spin_s: float = limits.IDLE_SPIN_S, yield_s: float = limits.IDLE_YIELD_S,
          sleep=None):
    """One pause of a loop that has found nothing for ``idle_s`` seconds: nothing
    (spinning), a yield of the CPU, or a sleep on ``doorbell`` of at most
    ``longest_sleep()`` seconds (asked only then: a loop's timers cost a spinning
    pass nothing), or with ``sleep(attempt, seconds)``, a loop's own way of sleeping
    that the doorbell also ends (:class:`DoorbellRelay`). Returns what ``attempt``
    found if it was tried (see :meth:`Doorbell.wait`)."""
    if idle_s < spin_s:
        return None
    if idle_s < yield_s:
        os.sched_yield()
        return None
    if sleep is not None:
        return sleep(attempt, longest_sleep())
    return doorbell.wait(attempt, longest_sleep())


# These kernels are a few atomic instructions: they keep the GIL (nogil=False), since a
# thread that lets it go for nanoseconds of work waits for it again behind another.
@kernel(nogil=False)
def _ring(words, sequence_word, sleepers_word):
    """Announce new work; True when somebody sleeps and needs the futex woken."""
    fetch_add(words, sequence_word, 1)
    fence()
    return load_acquire(words, sleepers_word) > 0


@kernel(nogil=False)
def _lie_down(words, sequence_word, sleepers_word):
    """Count this process among the sleepers; the sequence it may sleep on."""
    fetch_add(words, sleepers_word, 1)
    fence()
    return load_acquire(words, sequence_word)


@kernel(nogil=False)
def _get_up(words, sleepers_word):
    fetch_add(words, sleepers_word, -1)


@kernel(nogil=False)
def _sequence(words, sequence_word):
    return load_acquire(words, sequence_word)


class Doorbell:
    """The doorbell at ``words[sequence_word]`` / ``words[sleepers_word]`` (an int64
    view of shared memory that outlives this object's use)."""

    def __init__(self, words, sequence_word: int, sleepers_word: int):
        self.words = words
        self.sequence_word = sequence_word
        self.sleepers_word = sleepers_word
        self._address = ctypes.c_void_p(words.ctypes.data + sequence_word * words.itemsize)

    @property
    def sequence(self) -> int:
        """How often the bell was rung (an acquire load: work announced before it is
        visible)."""
        return int(_sequence(self.words, self.sequence_word))

    def ring(self) -> None:
        """Announce work made before this call; wake whoever sleeps on the bell."""
        if _ring(self.words, self.sequence_word, self.sleepers_word):
            self.wake()

    def wake(self) -> None:
        """The wake-up call alone, for a sequence word whose owner moved it (a ring's
        acknowledged count) and found sleepers after its fence."""
        if _libc_holding_gil is not None:
            _libc_holding_gil.syscall(_FUTEX_SYSCALL, self._address, _FUTEX_WAKE, _WAKE_EVERYONE,
                                      None, None, 0)

    def lie_down(self) -> int:
        """Count the caller among the sleepers (ringers then make the wake-up call);
        the sequence it may sleep on. Each call is paired with :meth:`get_up`."""
        return int(_lie_down(self.words, self.sequence_word, self.sleepers_word))

    def get_up(self) -> None:
        _get_up(self.words, self.sleepers_word)

    def sleep_on(self, seen: int, timeout_s: float) -> None:
        """Sleep until the sequence is no longer ``seen`` (at once if it is not) or
        ``timeout_s`` passes, the GIL let go. Whoever sleeps has lain down, or sleeps
        for somebody who has (:class:`DoorbellRelay`)."""
        if _libc is None:
            time.sleep(min(timeout_s, limits.IDLE_NAP_S))
            return
        seconds = int(timeout_s)
        timeout = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
        expected = ctypes.c_uint32(seen & 0xFFFFFFFF)
        if _libc.syscall(_FUTEX_SYSCALL, self._address, _FUTEX_WAIT, expected,
                         ctypes.byref(timeout), None, 0) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
                raise OSError(code, f"futex wait: {os.strerror(code)}")

    def wait(self, attempt, timeout_s: float, sleep=None):
        """Sleep until the bell rings or ``timeout_s`` passes, unless ``attempt()``,
        tried once after lying down, finds work: then its result, else None.
        ``sleep(seen, timeout_s)`` replaces :meth:`sleep_on` for a loop that sleeps
        its own way and has the bell end it (:class:`DoorbellRelay`)."""
        seen = self.lie_down()
        try:
            found = attempt()
            if found or timeout_s <= 0:
                return found
            (sleep or self.sleep_on)(seen, timeout_s)
            return None
        finally:
            self.get_up()


class DoorbellRelay:
    """Lets a loop that sleeps in ``select`` (on sockets) be woken by a doorbell too:
    while the loop sleeps it *arms* the relay with the sequence it saw after lying
    down, and the relay's thread sleeps on the doorbell for it and calls ``wake``
    (which makes one of the loop's descriptors readable) once the bell has rung.

    One wake per arming: after relaying, the thread waits to be armed again, so a
    loop slow to disarm costs no spinning. A ring that came before the thread slept
    is seen at once (the futex refuses a stale sequence), so none is lost between
    the loop's last look and its select; the loop's own lying down is what makes
    ringers call the futex, which also wakes this thread.
    """

    def __init__(self, doorbell: Doorbell, wake, name: str) -> None:
        self._doorbell = doorbell
        self._wake = wake
        self._changed = threading.Condition(threading.Lock())
        self._armed = False
        self._seen = 0
        self._arming = 0                  # counts armings: one wake for each at most
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def arm(self, seen: int) -> None:
        with self._changed:
            self._armed, self._seen = True, seen
            self._arming += 1
            self._changed.notify()

    def disarm(self) -> None:
        with self._changed:
            self._armed = False

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        self._doorbell.ring()             # out of a sleep on the bell
        self._thread.join(timeout=limits.DOORBELL_RELAY_STOP_S)

    def _run(self) -> None:
        relayed = 0
        while True:
            with self._changed:
                while not (self._stopping or (self._armed and self._arming != relayed)):
                    self._changed.wait()
                if self._stopping:
                    return
                seen, arming = self._seen, self._arming
            self._doorbell.sleep_on(seen, limits.DOORBELL_RELAY_NAP_S)
            if self._doorbell.sequence == seen:
                continue                  # a nap's end: sleep on while armed
            with self._changed:
                if self._armed and self._arming == arming:
                    relayed = arming
                    self._wake()


class LoopSelector:
    """A loop's sleep on descriptors and on a doorbell at once.

    The loop's own descriptors (a listener's selector, a ZeroMQ socket's ``FD``:
    anything that reads as ready when its owner has work) are watched in one epoll,
    with one end of a socket pair that a :class:`DoorbellRelay` writes a byte into
    when ``doorbell`` rings while the loop sleeps. A sleep only returns: the loop's
    next turn has each owner do what its descriptors allow (``pump``), so a
    descriptor an owner leaves ready (level-triggered) ends the next sleep at once.
    """

    def __init__(self, doorbell: Doorbell, name: str) -> None:
        self.doorbell = doorbell
        self._selector = selectors.DefaultSelector()
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._selector.register(self._reader, selectors.EVENT_READ)
        self._relay = DoorbellRelay(doorbell, self.wake, name)
        self._relay.start()

    def watch(self, descriptor) -> None:
        """Wake the loop when ``descriptor`` (a file object or number) reads as ready."""
        self._selector.register(descriptor, selectors.EVENT_READ)

    def unwatch(self, descriptor) -> None:
        self._selector.unregister(descriptor)

    def wake(self) -> None:
        """End the loop's sleep, or its next one (from any thread)."""
        # -1 (EAGAIN) when the pair is full: a wake is pending already.
        _libc_keeping_gil.write(self._writer.fileno(), b"\0", 1)

    def sleep(self, attempt, timeout_s: float):
        """Sleep until a watched descriptor is ready, the doorbell rings or
        ``timeout_s`` passes; unless ``attempt()``, tried once the doorbell counts
        this loop among its sleepers, finds work: then its result (as
        :meth:`Doorbell.wait`)."""
        return self.doorbell.wait(attempt, timeout_s, sleep=self._select_relayed)

    def _select_relayed(self, seen: int, timeout_s: float) -> None:
        self._relay.arm(seen)
        try:
            woken = self._selector.select(timeout_s)
        finally:
            self._relay.disarm()
        if any(key.fileobj is self._reader for key, _ in woken):
            try:
                while self._reader.recv(4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        self._relay.stop()
        self._selector.close()
        self._reader.close()
        self._writer.close()
