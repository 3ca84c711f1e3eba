"""The producer's futures' callbacks (kafka-python's ``add_callback`` /
``add_errback``): who runs them, on which thread, when.

Rules
-----
* Callbacks cost ``send`` nothing: they hang on the batch (``batch.callbacks``), which
  joins a list this runner watches; a batch without callbacks is never looked at.
* Each callback runs once, outside the producer's lock (a callback may send), through
  ``producer_batch.run_callback`` (what it raises is logged).
* A callback added to a future already done runs at once, on the caller's thread.

Theory of operation
-------------------
The runner's thread starts with the first callback added. While any batch it watches
is not done, it resolves the broker's completions (``harvest``, the sender's) every
``limits.PRODUCER_CALLBACK_POLL_MS`` and runs the callbacks of the batches that are
done; while none waits it sleeps on a condition of the producer's lock. ``flush`` and
``close`` run those due too (:meth:`CallbackRunner.fire`), holding ``running`` as the
thread does, so when ``flush`` returns its batches' callbacks have run, those the
thread had under way included.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..common import limits
from .producer_batch import FutureRecordMetadata, ProducerBatch, run_callback

__all__ = ["CallbackRunner"]


class CallbackRunner:
    """Runs the callbacks of a producer's futures as their batches complete.

    Parameters
    ----------
    lock : threading.Lock
        The producer's lock.
    harvest : callable
        Resolves every batch the broker has completed (called with the lock held).
    """

    def __init__(self, lock: threading.Lock, harvest: Callable[[], None]):
        self.lock = lock
        self.harvest = harvest
        self.closed = False
        # The batches whose callbacks wait, in the order they were added.
        self.watched: list[ProducerBatch] = []
        self.waiting = threading.Condition(lock)
        self.thread: threading.Thread | None = None    # started with the first callback
        # Held while callbacks run, so flush returns after those under way have run.
        self.running = threading.RLock()

    def add(self, future: FutureRecordMetadata, function, errback: bool) -> None:
        """Run ``function`` once ``future`` is done: now, on this thread, when it is;
        else on the runner's thread."""
        batch = future.batch
        with self.lock:
            if not batch.done and not self.closed:
                self.harvest()
            if not batch.done:
                if batch.callbacks is None:
                    batch.callbacks = []
                    self.watched.append(batch)
                batch.callbacks.append((future, function, errback))
                if self.thread is None:
                    self.thread = threading.Thread(target=self._loop, name="shmlog-callbacks",
                                                   daemon=True)
                    self.thread.start()
                self.waiting.notify()
                return
        run_callback(future, function, errback)

    def fire(self) -> None:
        """Run the callbacks of every watched batch that is done, each once, outside
        the producer's lock."""
        with self.running:
            with self.lock:
                done = [batch for batch in self.watched if batch.done]
                if not done:
                    return
                self.watched = [batch for batch in self.watched if not batch.done]
                due = [callback for batch in done for callback in batch.callbacks]
                for batch in done:
                    batch.callbacks = None
            for future, function, errback in due:
                run_callback(future, function, errback)

    def _loop(self) -> None:
        """While callbacks wait: look for completions every PRODUCER_CALLBACK_POLL_MS
        and run the callbacks of what completed; asleep while none wait."""
        poll_s = limits.PRODUCER_CALLBACK_POLL_MS / 1000
        while True:
            with self.lock:
                while not self.watched and not self.closed:
                    self.waiting.wait()
                closed = self.closed
                if not closed:
                    self.harvest()
            self.fire()
            if closed:
                return          # close ran what completed; the rest never will
            time.sleep(poll_s)

    def close(self) -> None:
        """The producer closes (lock held): the thread runs what is done and stops."""
        self.closed = True
        self.waiting.notify_all()

    def join(self) -> None:
        """After :meth:`close`, without the lock: run the callbacks due (the errbacks of
        the batches the close failed) and wait for the thread."""
        self.fire()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
