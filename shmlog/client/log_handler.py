"""``LogHandler``: Python's ``logging`` into a topic, through the shared-memory path of
this host's broker (shmlog's own Producer, not the Kafka listener).

Rules
-----
* A logging call never waits for the broker. ``emit`` formats the record in the
  caller's thread (its arguments and traceback are the caller's, and may change
  after) and appends it to a bounded buffer (``buffer_records``); one shipping thread
  per handler takes the buffer and hands its records to the handler's Producer, whose
  waits (a full ring, a broker restarting, a control request) are that thread's.
* A full buffer: ``overflow="drop"`` (the default: an application's logging must not
  stall it) drops the new record; ``overflow="block"`` makes the logging call wait up
  to ``block_ms`` (Kafka's max.block.ms, 60 s) for room, then drops it. Every record
  dropped is counted in :attr:`LogHandler.dropped`: for want of room, logged after
  close, or still buffered when close's wait ran out. Records the Producer took and
  then failed (the broker refused their batch, or a send raised) are counted in
  :attr:`LogHandler.failed`. Close says both in one warning when either is not zero.
* The handler never logs into itself: a record logged on its shipping thread, or
  from inside its own ``emit`` (a formatter or ``key`` callable that logs), is not
  shipped (nor counted: it is the handler's own machinery talking). Its own troubles
  (a send that raised, a producer that could not be made in a child) go to stderr,
  one line per kind of error, never through ``logging``.
* Fork: a child inherits the handler but neither its thread nor its producer (a ring
  is its maker's process's, and the parent keeps using it). The child drops its copy
  of the parent's buffered records (the parent ships them), and its first record
  starts its own thread, which makes its own Producer. The parent's producer is never
  touched in the child (not flushed, not closed).
* Exit: ``logging.shutdown`` (atexit) calls ``flush`` and ``close``, each bounded by
  ``close_timeout_s``. A multiprocessing child ends with ``os._exit``, without atexit:
  there the handler closes through multiprocessing's exit finalizers instead. A child
  of a bare ``os.fork`` that ends with ``os._exit`` must call ``logging.shutdown()`` (or
  the handler's ``close()``) first, as for any buffering handler.

Theory of operation
-------------------
A record becomes ``(value, key, headers, timestamp_ms)``: the handler's Formatter's
text as UTF-8, the key (None, the logger's name, or a callable's), the headers
``level`` and ``logger`` and any given, and ``record.created`` in milliseconds (the
record's CreateTime: consumers see when it was logged, not when it shipped). Appending
it is a lock, a length check and a deque append; the shipping thread, asleep on the
condition while the buffer is empty (no timer), is woken only when it sleeps. It swaps
the whole buffer for an empty one and sends its records without the lock, so logging
threads append while it sends; the Producer gathers them into batches as any sends.

``flush`` waits until the records emitted before it are handed to the Producer, then
for the Producer's flush (acknowledged by the broker). ``close`` stops taking records,
lets the thread hand over what is buffered, closes the Producer (leaving the broker,
removing its ring), all within one deadline, and counts what it could not ship.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from ..common import limits, settings
from ..common.errors import InvalidConfigError, ShmlogError
from .producer import Producer

__all__ = ["LogHandler"]

log = logging.getLogger(__name__)

OVERFLOW_POLICIES = ("drop", "block")


def _header_pairs(headers: Any) -> list[tuple[str, bytes]]:
    """The extra headers every record carries: a dict or pairs of str to str or bytes."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or ())
    checked = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], (str, bytes))):
            raise InvalidConfigError(f"headers must map names (str) to str or bytes values, "
                                     f"got {pair!r:.100}")
        name, value = pair
        checked.append((name, value.encode() if isinstance(value, str) else value))
    return checked


def _key_function(key: Any) -> Callable[[logging.LogRecord], bytes | None] | None:
    """What makes a record's key: None (no key), "logger" or a callable of the record."""
    if key is None:
        return None
    if key == "logger":
        return lambda record: record.name.encode()
    if callable(key):
        def keyed(record: logging.LogRecord) -> bytes | None:
            made = key(record)
            return made.encode() if isinstance(made, str) else made
        return keyed
    raise InvalidConfigError(f"key must be None, 'logger' or a callable of the LogRecord, "
                             f"got {key!r:.100}")


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= limits.CLIENT_WAIT_MS_MAX / 1000:
        raise InvalidConfigError(f"{name} must be a number of seconds in [0, "
                                 f"{limits.CLIENT_WAIT_MS_MAX // 1000}], got {value!r:.100}")
    return float(value)


class LogHandler(logging.Handler):
    """A ``logging.Handler`` that ships records into ``topic`` of the broker of a data
    directory, on this host, through a Producer of its own.

    Parameters
    ----------
    topic : str
        The topic (it must exist: ``Admin.create_topic`` or ``shmlog topics create``).
    bootstrap : str, optional
        The broker's data directory (default: ``$SHMLOG_DATA_DIR`` or the default).
    key : None, "logger" or callable
        The records' key: none (the sticky partitioner spreads them), the logger's
        name (a logger's records stay in order in one partition), or
        ``key(record) -> bytes | str | None``.
    headers : dict or [(str, bytes | str)], optional
        Headers every record carries after ``level`` and ``logger``.
    level : int or str
        The handler's level (``logging.Handler``'s).
    buffer_records : int
        Records formatted and not yet handed to the producer, at most.
    overflow : "drop" or "block"
        What a logging call does when the buffer is full: drop the record (counted
        in :attr:`dropped`), or wait up to ``block_ms`` for room, then drop it.
    block_ms : int
        How long a logging call may wait with ``overflow="block"``.
    close_timeout_s : float
        How long ``flush`` and ``close`` (so ``logging.shutdown`` at exit) wait for
        the buffered records to be acknowledged.
    **producer_options
        The Producer's settings (``acks``, ``linger_ms``, ``compression``,
        ``ring_size``, ``client_id``, ...).

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range.
    UnknownTopicOrPartitionError
        ``topic`` does not exist.
    ShmlogError
        No broker answers (the message names the command that starts one).
    """

    def __init__(self, topic: str, bootstrap: str | None = None, *, key: Any = None,
                 headers: Any = None, level: int | str = logging.NOTSET,
                 buffer_records: int = limits.LOG_HANDLER_BUFFER_RECORDS_DEFAULT,
                 overflow: str = "drop", block_ms: int = limits.MAX_BLOCK_MS_DEFAULT,
                 close_timeout_s: float = limits.LOG_HANDLER_CLOSE_TIMEOUT_S_DEFAULT,
                 **producer_options):
        # Every setting is checked before Handler.__init__ registers the handler with
        # logging (whose shutdown at exit flushes and closes every handler it has).
        if not isinstance(topic, str) or not topic:
            raise InvalidConfigError(f"topic must be a topic's name, got {topic!r:.100}")
        self.topic = topic
        self._key = _key_function(key)
        self._headers = _header_pairs(headers)
        self.buffer_records = settings.integer("buffer_records", buffer_records, 1,
                                               limits.LOG_HANDLER_BUFFER_RECORDS_MAX)
        self.overflow = settings.choice("overflow", overflow, OVERFLOW_POLICIES)
        self.block_ms = settings.integer("block_ms", block_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        self.close_timeout_s = _seconds("close_timeout_s", close_timeout_s)
        self._bootstrap, self._producer_options = bootstrap, producer_options
        super().__init__(level)
        self._fresh_state()
        # Made here, in the caller's thread, so that a missing broker or topic is the
        # constructor's error; a forked child makes its own in its shipping thread.
        self._producer = self._open_producer()
        self._start()
        owner = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(owner))

    def _fresh_state(self) -> None:
        """The buffer, its signals and the counts, new (at start, and in a child)."""
        self._buffer: collections.deque = collections.deque()
        self._wake = threading.Event()   # set for the shipping thread asleep on it
        # Waits that are rare (a flush, a close, a logging call blocked for room) are on
        # this condition; the shipping thread notifies it only when one waits.
        self._done = threading.Condition(threading.Lock())
        self._waiting = 0                # calls waiting on it
        self._local = threading.local()
        self._emitted = 0                # records appended to the buffer, ever
        self._handed = 0                 # records taken from it and sent (or failed)
        self._sleeping = False           # the shipping thread waits for records
        self._closed = False
        self._thread: threading.Thread | None = None
        self._shipper_ident: int | None = None
        self._producer = None
        self._send_failures = 0
        self._refused: int | None = None   # the producer's failed records, once closed
        self._noted: set[str] = set()
        self._dropped = 0                # by emits (their thread holds the handler's lock)
        self._unshipped = 0              # by close, or by a child that has no producer
        self._shut = False               # close() ran

    def _open_producer(self):
        producer = Producer(self._bootstrap, **self._producer_options)
        try:
            producer.partitions_for(self.topic)   # an unknown topic fails here
        except BaseException:
            producer.close()
            raise
        return producer

    def _start(self) -> None:
        """Start the shipping thread (in the maker, or in a child at its first record)."""
        self._thread = threading.Thread(target=self._ship_loop, daemon=True,
                                        name=f"shmlog-log-handler-{self.topic}")
        self._thread.start()
        multiprocessing = sys.modules.get("multiprocessing")
        if multiprocessing is not None and multiprocessing.parent_process() is not None:
            # A multiprocessing child ends with os._exit: atexit (so logging.shutdown)
            # never runs there, its exit finalizers do.
            from multiprocessing import util
            util.Finalize(None, self.close, exitpriority=0)

    # -- the caller's side -----------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Records not shipped: the buffer was full (past ``block_ms`` with
        ``overflow="block"``), the handler was closed, or close's wait ran out."""
        return self._dropped + self._unshipped

    @property
    def failed(self) -> int:
        """Records the producer took and failed: a send raised, or the broker refused
        their batch."""
        refused = self._refused
        if refused is None:              # open: ask the producer (a closed one cannot say)
            refused = self._producer_errors()
        return self._send_failures + refused

    def _producer_errors(self) -> int:
        producer = self._producer
        if producer is None:
            return 0
        return int(producer.metrics()["producer-metrics"]["record-error-total"])

    def emit(self, record: logging.LogRecord) -> None:
        """Format ``record`` and buffer it for the shipping thread; never waits for the
        broker (with ``overflow="block"``, at most ``block_ms`` for room).

        ``Handler.handle`` calls it with the handler's lock held, so emits are one at
        a time: the counts and the length check need no lock of their own; the
        shipping thread only takes records from the buffer's other end."""
        local = self._local
        if threading.get_ident() == self._shipper_ident or getattr(local, "busy", False):
            return                       # the handler's own machinery logging
        local.busy = True
        try:
            entry = self._entry(record)
        except Exception:
            self.handleError(record)     # logging's way: stderr, never a raise
            return
        finally:
            local.busy = False
        if self._closed or (len(self._buffer) >= self.buffer_records
                            and not self._wait_for_room()):
            self._dropped += 1
            return
        self._buffer.append(entry)
        self._emitted += 1
        if self._sleeping:
            self._wake.set()
        elif self._thread is None:
            self._start()                # a forked child's first record

    def _entry(self, record: logging.LogRecord) -> tuple:
        value = self.format(record).encode("utf-8", "backslashreplace")
        key = None if self._key is None else self._key(record)
        headers = [("level", record.levelname.encode()), ("logger", record.name.encode()),
                   *self._headers]
        return value, key, headers, int(record.created * 1000)

    def _wait_for_room(self) -> bool:
        """With ``overflow="block"``: wait up to block_ms for room."""
        if self.overflow == "drop":
            return False
        return self._wait(lambda: self._closed or len(self._buffer) < self.buffer_records,
                          self.block_ms / 1000) and not self._closed

    def _wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._done:
            self._waiting += 1
            try:
                return self._done.wait_for(predicate, timeout_s)
            finally:
                self._waiting -= 1

    def flush(self) -> None:
        """Wait, at most ``close_timeout_s``, until every record emitted before this
        call is acknowledged by the broker (a timeout is said on stderr, not raised:
        logging calls flush where nothing may raise)."""
        deadline = time.monotonic() + self.close_timeout_s
        target = self._emitted
        self._wait(lambda: self._handed >= target or self._closed or self._thread is None,
                   self.close_timeout_s)
        producer = self._producer
        if producer is not None:
            try:
                producer.flush(max(0.0, deadline - time.monotonic()))
            except ShmlogError as error:
                self._note(error)

    def close(self) -> None:
        """Stop taking records, ship what is buffered and close the producer, all
        within ``close_timeout_s``; what could not be shipped is counted in
        :attr:`dropped`, and one warning says what was dropped or failed."""
        if self._shut:
            return super().close()
        self._shut = True
        deadline = time.monotonic() + self.close_timeout_s
        self._closed = True
        self._wake.set()
        with self._done:
            self._done.notify_all()      # logging calls blocked for room: they drop
        self.acquire()                   # an emit under way has appended: later ones see
        self.release()                   # _closed (emits hold this lock)
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self._unshipped += len(self._buffer)   # the wait ran out before these
        self._buffer.clear()
        self._close_producer(deadline)
        self._report()
        super().close()

    def _close_producer(self, deadline: float) -> None:
        producer = self._producer
        if producer is None:
            return
        try:
            # Flushed first: what the broker refuses is known (and counted) before the
            # producer closes and can no longer say.
            producer.flush(max(0.0, deadline - time.monotonic()))
        except ShmlogError as error:
            self._note(error)
        self._refused = self._producer_errors()
        try:
            producer.close(max(0.0, deadline - time.monotonic()))
        except ShmlogError as error:
            self._note(error)

    def _report(self) -> None:
        failed = self.failed
        if not (self.dropped or failed):
            return
        self._local.busy = True          # not into this handler (closed, it would count)
        try:
            log.warning("LogHandler for topic %r: %d records dropped (overflow=%r, "
                        "buffer_records=%d), %d failed", self.topic, self.dropped,
                        self.overflow, self.buffer_records, failed)
        finally:
            self._local.busy = False

    # -- the shipping thread ------------------------------------------------------------
    def _ship_loop(self) -> None:
        self._shipper_ident = threading.get_ident()
        producer = self._producer or self._open_in_child()
        buffer, wake = self._buffer, self._wake
        while producer is not None:
            if buffer:
                self._ship_some(producer, buffer)
                continue
            if self._closed:
                return                   # closed, and nothing left
            # Asleep only when the buffer is still empty after _sleeping is set: an
            # emit appends, then looks at _sleeping, so one of the two sees the other.
            wake.clear()
            self._sleeping = True
            if not buffer and not self._closed:
                wake.wait()
            self._sleeping = False

    def _ship_some(self, producer, buffer: collections.deque) -> None:
        """Hand up to LOG_HANDLER_SHIP_CHUNK_RECORDS buffered records to the producer,
        then tell the waits (flush, close, a logging call blocked for room)."""
        send, topic, take = producer.send, self.topic, buffer.popleft
        count = 0
        try:
            while count < limits.LOG_HANDLER_SHIP_CHUNK_RECORDS:
                value, key, headers, timestamp_ms = take()
                count += 1
                try:
                    send(topic, value, key, headers, None, timestamp_ms)
                except Exception as error:   # noqa: BLE001 (counted and said, never raised)
                    self._send_failures += 1
                    self._note(error)
        except IndexError:
            pass                         # the buffer is empty
        self._handed += count
        if self._waiting:
            with self._done:
                self._done.notify_all()

    def _open_in_child(self):
        """A forked child's producer; without one, its records are dropped."""
        try:
            self._producer = self._open_producer()
            return self._producer
        except Exception as error:        # noqa: BLE001 (said on stderr, records counted)
            self._note(error)
            self._closed = True
            self._unshipped += len(self._buffer)
            self._buffer.clear()
            with self._done:
                self._done.notify_all()
            return None

    def _note(self, error: BaseException) -> None:
        """One stderr line per kind of error: never through logging (it would come back
        here), never a flood."""
        kind = type(error).__name__
        if kind in self._noted:
            return
        self._noted.add(kind)
        try:
            sys.stderr.write(f"shmlog LogHandler for topic {self.topic!r}: {kind}: {error} "
                             f"(further {kind}s are counted, not printed)\n")
        except Exception:                 # noqa: BLE001 (no stderr left: nothing to say)
            pass

    def __repr__(self) -> str:
        return (f"<LogHandler {self.topic!r} ({logging.getLevelName(self.level)}, "
                f"dropped {self.dropped})>")


def _after_fork_in_child(owner: weakref.ref) -> None:
    """In a forked child: forget the parent's thread, producer and buffered records."""
    handler = owner()
    if handler is not None:
        closed, shut = handler._closed, handler._shut   # closed before the fork: stays so
        handler._fresh_state()
        handler._closed, handler._shut = closed, shut
