"""Ending a verb on SIGINT (Ctrl-C) and SIGTERM, whatever this process inherited.

Why it must be set, not assumed: a shell starts a background command (``cmd &``, and
every command of a script it runs in the background) with SIGINT ignored, and Python
installs its KeyboardInterrupt handler only over the default disposition, so such a
process would never see its Ctrl-C. So :func:`~shmlog.cli.main` sets SIGINT's handler
for every verb (a KeyboardInterrupt it turns into exit 130, no traceback), and a verb
that runs until it is told to stop sets its own, putting back what was there after.

Two ways to stop
----------------
* :func:`stopped_by_signals`: the signal raises KeyboardInterrupt wherever the main
  thread is. For verbs whose work may be cut anywhere (``cluster up`` and
  ``zookeeper`` stop their servers on the way out).
* :class:`StopRequest`: the signal is noted (``number``), and raises only while the
  verb says it waits on something outside (``raising``: reading stdin, sleeping
  between views). A verb that holds a client (``produce``, ``consume``,
  ``status --watch``) uses it: a KeyboardInterrupt raised inside the client, between
  taking a lock and the ``try`` that releases it, would leave the lock taken and the
  client's close waiting on it forever, the hang ``yes | shmlog produce`` met. The
  verb looks at ``number`` where its loop may end, ends as it would at the end of its
  input (a producer flushes, a consumer commits), and exits with
  ``exit_codes.exit_on_signal(number)``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator

__all__ = ["STOP_SIGNALS", "stopped_by_signals", "StopRequest", "interrupts"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt; after it, their
    handlers are what they were."""
    previous = {number: signal.signal(number, signal.default_int_handler)
                for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt even when this process was
    started with it ignored (what ``main`` runs every verb in). Off the main thread
    (``main`` called from a thread of a program) nothing changes: only the main
    thread may set a handler, and signals reach only it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class StopRequest:
    """Within the block, SIGINT and SIGTERM are noted in ``number`` (the first one's;
    0 while none came), and raise KeyboardInterrupt only while ``raising`` is true,
    once: the verb sets it around a wait that only a signal may cut short (a read of
    stdin, a sleep), and clears it after. Set ``raising`` before looking at
    ``number``: a signal between the two then raises rather than being missed."""

    def __init__(self):
        self.number = 0
        self.raising = False
        self._previous = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is not threading.main_thread():
            return self                 # no signal reaches this thread: none is noted
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._note)
        return self

    def _note(self, number, frame) -> None:
        if not self.number:
            self.number = number
        if self.raising:
            self.raising = False
            raise KeyboardInterrupt

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a stop signal comes (or came already)."""
        try:
            self.raising = True
            if not self.number:
                time.sleep(seconds)
        except KeyboardInterrupt:
            pass
        finally:
            self.raising = False
