"""A broker's ZooKeeper session: the only module that imports kazoo.

:class:`ZooKeeperSession` wraps one ``KazooClient`` (one session per broker, shared by
the broker's loop and its controller, Kafka's ``ZooKeeperClient``) and offers the
requests the other modules of ``cluster.zk`` are written in: reads retried across a
connection loss, writes tried once, multi-ops (:class:`CreateOp`, :class:`SetDataOp`,
:class:`DeleteOp`, :class:`CheckOp`; each multi also gets the notice its ops'
``notice`` fields make, see :attr:`ZooKeeperSession.announce`), asynchronous
conditional sets and multis, and kazoo's watch recipes. What the znodes mean is
theirs (``paths`` lays them out).

Rules
-----
* **kazoo's threads never touch broker state.** Watch callbacks and the session
  listener only put events on queues (and call the queue's ``wake``, e.g. the
  appender doorbell). The session listener never blocks and never calls
  ZooKeeper (kazoo runs it on its connection thread; kazoo issue #355): it sets or
  clears :attr:`ZooKeeperSession.suspended`, counts losses, tells the state
  listeners (which only flag or spawn) and queues a ``SESSION`` event.
* **SUSPENDED means "I may no longer be controller; I can change no metadata".**
  kazoo reports it when the connection is lost or nothing was read for 2/3 of the
  negotiated session timeout T; ZooKeeper expires the session (and its ephemerals)
  only after T, so a controller that stops acting on ``suspended`` is fenced
  before another can be elected. A partition leader goes on serving (Kafka's
  rule: ``replication.hosted_replicas``); it writes no ISR change, and metadata
  requests are refused (``MetadataUnavailableError``) rather than queued.
* Reads are retried across a connection loss (bounded); writes are not (a retried
  write may have gone through): a lost connection during a write is
  :class:`ZooKeeperConnectionError`, its outcome unknown.
* **A refused write is a named error, never a kazoo exception**: another version
  is :class:`StaleStateVersionError`, a znode there already
  :class:`ZnodeExistsError`, a znode (or parent) missing :class:`ZnodeMissingError`,
  any other refusal a :class:`ZooKeeperConflictError`; each names the znode.
* kazoo's ``commit()`` does not raise when a multi fails; it returns one result per
  op (the failing op's exception, ``RolledBackError`` before it,
  ``RuntimeInconsistency`` after it): :meth:`ZooKeeperSession.multi` raises the
  failing op's refusal. Nothing of a refused multi is applied.

Theory of operation
-------------------
:meth:`ZooKeeperSession.start` connects (making the chroot first, with a short
session outside it, when it is missing) and creates the top-level paths. From then
on kazoo reconnects by itself; the listener turns its state changes into the
``suspended`` flag and ``SESSION`` events for every queue added with
:meth:`~ZooKeeperSession.add_events`.
Watches are kazoo's ``DataWatch``/``ChildrenWatch`` recipes, not one-shot watches:
those re-read and re-arm after a reconnection (a one-shot watch is fired with a
NONE event and forgotten on SUSPENDED; kazoo issue #151). They are set up on threads
of kazoo's handler (:meth:`~ZooKeeperSession.spawn`), so their owner never blocks.

kazoo runs with :class:`PollHandler`, its threading handler waiting with one
``poll(2)``: kazoo 2.11's own wait builds, registers and closes an epoll object for
every packet it sends or waits for, more than half of its connection thread's time
when thousands of watches fire at once (a broker's failure at 10,000 partitions),
and time it spends holding the GIL the broker's loop needs.
"""

from __future__ import annotations

import dataclasses
import functools
import select
import threading
import time
from typing import Any, Callable, Iterable, Self, Sequence

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry, RetryFailedError

from ...common import limits
from ...common.errors import (
    ShmlogError,
    StaleStateVersionError,
    ZnodeExistsError,
    ZnodeMissingError,
    ZooKeeperConflictError,
    ZooKeeperConnectionError,
)
from . import paths as zk_paths
from .events import EventKind, EventQueue, SessionState, WatchEvent

__all__ = ["ZooKeeperSession", "ZnodeReads", "CreateOp", "SetDataOp", "DeleteOp", "CheckOp",
           "Op", "op_size", "chunk_ops"]

# What a lost connection looks like from a request.
_CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError,
                      KazooTimeoutError, RetryFailedError)
# What a refused write looks like from a request.
_REFUSALS = (BadVersionError, NoNodeError, NodeExistsError)


# --- operations of a multi-op --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CreateOp:
    """Create ``path`` with ``body`` (its parent must exist); ``sequential``: with
    ZooKeeper's sequence number appended to the name. ``notice``: what the op
    announces in its multi (``state_changes``; see :meth:`ZooKeeperSession.multi`)."""
    path: str
    body: bytes = b""
    ephemeral: bool = False
    sequential: bool = False
    notice: Any = None


@dataclasses.dataclass(frozen=True)
class SetDataOp:
    """Set ``path``'s body if its version is ``version`` (-1: any); ``notice`` as
    :class:`CreateOp`'s."""
    path: str
    body: bytes
    version: int
    notice: Any = None


@dataclasses.dataclass(frozen=True)
class DeleteOp:
    """Delete ``path`` (it must have no children) if its version is ``version``."""
    path: str
    version: int = -1


@dataclasses.dataclass(frozen=True)
class CheckOp:
    """Fail the multi unless ``path``'s version is ``version``."""
    path: str
    version: int


Op = CreateOp | SetDataOp | DeleteOp | CheckOp


def op_size(op: Op) -> int:
    """What ``op`` adds to a multi-op's request, counted generously (bytes); an op
    with a notice counts twice, its body being repeated in its multi's notice."""
    body = getattr(op, "body", b"")
    size = len(op.path.encode()) + len(body) + limits.ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE
    return 2 * size if getattr(op, "notice", None) is not None else size


def chunk_ops(ops: Sequence[Op], size_max: int = limits.ZOOKEEPER_MULTI_SIZE_MAX,
              reserved: int = 0) -> list[list[Op]]:
    """``ops`` cut, in order, into runs whose :func:`op_size` sum stays within
    ``size_max`` less ``reserved`` (room for ops each run gets besides, a fence); an
    op too large alone is a run of its own (ZooKeeper judges it). No run is empty;
    no ops, no runs."""
    room = size_max - reserved
    chunks: list[list[Op]] = []
    size = 0
    for op in ops:
        cost = op_size(op)
        if not chunks or size + cost > room:
            chunks.append([])
            size = 0
        chunks[-1].append(op)
        size += cost
    return chunks


class ZooKeeperSession:
    """One ZooKeeper session and the requests made in it.

    Parameters
    ----------
    hosts : str
        ``zookeeper.connect``: ``"h1:2181,h2:2181/chroot"``; every path is under the
        chroot.
    session_timeout_ms : int
        The session timeout asked for (ZooKeeper clamps it to 2..20 ticks).
    connect_timeout_s : float
        How long :meth:`start` waits for the first session.

    Attributes
    ----------
    suspended : threading.Event
        Set while the session may be gone (SUSPENDED, LOST, not yet connected),
        cleared on CONNECTED: a controller writes nothing, a leader no ISR change,
        and metadata requests are refused while it is set.
    sessions_lost : int
        How many times the session was LOST.

    Requests return kazoo's ``ZnodeStat`` where a stat is asked for (read its
    ``version``, ``czxid`` and ``ephemeralOwner``).
    """

    #: Makes the op a multi adds for the notices its ops carry (``CreateOp.notice``),
    #: or None when they carry none: ``state_changes.notice_op`` in cluster mode.
    announce: Callable[[Sequence[Op]], Op | None] | None = None

    def __init__(self, hosts: str, *,
                 session_timeout_ms: int = limits.ZOOKEEPER_SESSION_TIMEOUT_MS_DEFAULT,
                 connect_timeout_s: float = limits.ZOOKEEPER_CONNECT_TIMEOUT_S):
        self.hosts = hosts
        self.session_timeout_s = session_timeout_ms / 1000
        self.connect_timeout_s = connect_timeout_s
        self._client = KazooClient(
            hosts=hosts, timeout=self.session_timeout_s, handler=PollHandler(),
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0})
        self._read_retry = KazooRetry(max_tries=limits.ZOOKEEPER_READ_ATTEMPTS_MAX, delay=0.1,
                                      max_delay=1.0, ignore_expire=True)
        self.suspended = threading.Event()
        self.suspended.set()
        self.sessions_lost = 0
        self._queues: list[EventQueue] = []
        self._queues_lock = threading.Lock()
        self._state_listeners: list[Callable[[SessionState], None]] = []

    # --- the session -------------------------------------------------------------------

    def start(self, *, create_paths: bool = True) -> Self:
        """Connect, and make sure the chroot and the base paths exist (Kafka's
        createChrootIfNecessary and createTopLevelPaths) unless ``create_paths`` is
        false (a reader that must change nothing: ``cluster_status``).

        Raises
        ------
        ZooKeeperConnectionError
            No session within ``connect_timeout_s``.
        """
        servers, slash, chroot = self.hosts.partition("/")
        if create_paths and slash and chroot.strip("/"):
            # Kafka's createChrootIfNecessary: a client under a chroot that does not
            # exist can create nothing, so a short session without it makes it.
            chroot_maker = KazooClient(hosts=servers, timeout=self.session_timeout_s)
            self._connect(chroot_maker)
            try:
                self._read(chroot_maker.ensure_path, "/" + chroot.strip("/"))
            finally:
                chroot_maker.stop()
                chroot_maker.close()
        self._client.add_listener(self._on_session_state)
        self._connect(self._client)
        self.suspended.clear()
        for path in zk_paths.BASE_PATHS if create_paths else ():
            self._read(self._client.ensure_path, path)
        return self

    def _connect(self, client: KazooClient) -> None:
        try:
            client.start(timeout=self.connect_timeout_s)
        except KazooTimeoutError:
            client.stop()
            client.close()
            raise ZooKeeperConnectionError(
                f"no ZooKeeper session with {self.hosts} within {self.connect_timeout_s} s: "
                f"is zookeeper.connect right, and is ZooKeeper up?") from None

    def close(self) -> None:
        """End the session (its ephemerals go at once) and kazoo's threads."""
        self._client.stop()
        self._client.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def session_id(self) -> int | None:
        """This session's id (the owner of the ephemerals it creates), None when
        not connected."""
        client_id = self._client.client_id
        return None if client_id is None else client_id[0]

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password): what another client needs to take over (or, in
        tests, to expire) this session; None when not connected."""
        return self._client.client_id

    def add_events(self, events: EventQueue) -> None:
        """Have session changes (``SESSION`` events) and what :meth:`broadcast` sends
        (re-registrations) queued on ``events`` too."""
        with self._queues_lock:
            self._queues.append(events)

    def remove_events(self, events: EventQueue) -> None:
        """Stop queueing session events on ``events``."""
        with self._queues_lock:
            if events in self._queues:
                self._queues.remove(events)

    def broadcast(self, event: WatchEvent) -> None:
        """Queue ``event`` on every queue added with :meth:`add_events`."""
        with self._queues_lock:
            targets = list(self._queues)
        for events in targets:
            events.put(event)

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """Call ``listener(state)`` at each session state change, on kazoo's
        connection thread, after ``suspended`` is updated and before the ``SESSION``
        event is queued: it must only flag or :meth:`spawn`, never block nor call
        ZooKeeper."""
        self._state_listeners.append(listener)

    def remove_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """Call ``listener`` no more."""
        if listener in self._state_listeners:
            self._state_listeners.remove(listener)

    def _on_session_state(self, state: str) -> None:
        """kazoo's session listener, on its connection thread: flags and queues only."""
        if state == KazooState.CONNECTED:
            self.suspended.clear()
        else:
            self.suspended.set()
            if state == KazooState.LOST:
                self.sessions_lost += 1
        session_state = SessionState(state)
        for listener in self._state_listeners:
            listener(session_state)
        self.broadcast(WatchEvent(EventKind.SESSION, session_state, None, -1))

    def spawn(self, function: Callable, *args) -> None:
        """Run ``function(*args)`` on a thread of kazoo's handler (it may block and
        call ZooKeeper)."""
        self._client.handler.spawn(function, *args)

    # --- reads: retried across a connection loss ----------------------------------------

    def get(self, path: str) -> tuple[bytes, Any] | None:
        """(body, ZnodeStat) of ``path``, None if it does not exist."""
        try:
            return self._read(self._client.get, path)
        except NoNodeError:
            return None

    def children(self, path: str) -> list[str]:
        """The names of ``path``'s children, [] if it does not exist."""
        try:
            return self._read(self._client.get_children, path)
        except NoNodeError:
            return []

    def exists(self, path: str, watch: Callable[[], None] | None = None) -> Any | None:
        """The ZnodeStat of ``path``, None if it does not exist; ``watch()`` is called
        once, on a kazoo thread, at its next change (creation, deletion, data)."""
        if watch is None:
            return self._read(self._client.exists, path)
        return self._read(self._client.exists, path, watch=lambda event: watch())

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents where missing (idempotent, so retried)."""
        self._read(self._client.ensure_path, path)

    def get_many(self, paths: Iterable[str]) -> dict[str, tuple[bytes, Any] | None]:
        """:meth:`get` of every path, pipelined (``limits.ZOOKEEPER_READS_IN_FLIGHT_MAX``
        in flight, not one round trip each); those lost with the connection are read
        again (bounded, as :meth:`get`).

        Raises
        ------
        ZooKeeperConnectionError
            Some path could not be read within the attempts.
        """
        return self._read_many(self._client.get_async, paths, None)

    def children_many(self, paths: Iterable[str]) -> dict[str, list[str]]:
        """:meth:`children` of every path, pipelined as :meth:`get_many`."""
        return self._read_many(self._client.get_children_async, paths, [])

    def _read_many(self, start: Callable, paths: Iterable[str], missing_value: Any) -> dict:
        found: dict[str, Any] = {}
        missing = list(dict.fromkeys(paths))
        for attempt in range(limits.ZOOKEEPER_READ_ATTEMPTS_MAX):
            if attempt:
                time.sleep(min(1.0, 0.1 * 2 ** attempt))
            lost = []
            for first in range(0, len(missing), limits.ZOOKEEPER_READS_IN_FLIGHT_MAX):
                window = missing[first:first + limits.ZOOKEEPER_READS_IN_FLIGHT_MAX]
                try:
                    pending = [(path, start(path)) for path in window]
                except _CONNECTION_ERRORS:
                    lost.extend(window)
                    continue
                for path, result in pending:
                    try:
                        found[path] = result.get()
                    except NoNodeError:
                        found[path] = missing_value
                    except _CONNECTION_ERRORS:
                        lost.append(path)
            if not lost:
                return found
            missing = lost
        raise ZooKeeperConnectionError(
            f"ZooKeeper ({self.hosts}) did not answer reads of {len(missing)} znodes "
            f"(e.g. {missing[0]}) in {limits.ZOOKEEPER_READ_ATTEMPTS_MAX} attempts")

    def _read(self, function: Callable, *args, **kwargs) -> Any:
        """An idempotent request, retried across connection losses (bounded)."""
        try:
            return self._read_retry(function, *args, **kwargs)
        except _CONNECTION_ERRORS as error:
            raise ZooKeeperConnectionError(
                f"ZooKeeper ({self.hosts}) did not answer {getattr(function, '__name__', '')}"
                f"{args[:1]}: {type(error).__name__}") from None

    # --- writes: tried once -------------------------------------------------------------

    def create(self, path: str, body: bytes = b"", *, ephemeral: bool = False) -> str:
        """Create ``path`` with ``body`` (an ephemeral goes with this session).

        Raises
        ------
        ZnodeExistsError
            ``path`` exists.
        ZnodeMissingError
            Its parent does not.
        ZooKeeperConnectionError
            The outcome is unknown.
        """
        return self._write(self._client.create, path, body, ephemeral=ephemeral)

    def set(self, path: str, body: bytes, *, version: int = -1) -> Any:
        """Set ``path``'s body if its zkVersion is ``version`` (-1: any); its new
        ZnodeStat.

        Raises
        ------
        StaleStateVersionError
            ``path`` has another zkVersion.
        ZnodeMissingError
            ``path`` does not exist.
        ZooKeeperConnectionError
            The outcome is unknown.
        """
        return self._write(self._client.set, path, body, version=version)

    def delete(self, path: str, *, version: int = -1) -> None:
        """Delete ``path`` (it must have no children) if its zkVersion is ``version``
        (-1: any).

        Raises
        ------
        StaleStateVersionError, ZnodeMissingError, ZooKeeperConnectionError
            As :meth:`set`.
        """
        self._write(self._client.delete, path, version=version)

    def set_async(self, path: str, body: bytes, version: int,
                  done: Callable[[Any], None]) -> None:
        """:meth:`set` without blocking: ``done`` gets the new ZnodeStat or the error
        (:class:`ShmlogError`), on a kazoo thread (so it must only queue)."""
        def finished(result) -> None:
            try:
                stat = result.get()
            except _REFUSALS as error:
                done(_refusal(error, path))
            except _CONNECTION_ERRORS as error:
                done(ZooKeeperConnectionError(
                    f"the connection to ZooKeeper was lost while writing {path}: its outcome "
                    f"is unknown ({type(error).__name__})"))
            else:
                done(stat)

        self._client.set_async(path, body, version=version).rawlink(finished)

    def multi(self, ops: Sequence[Op]) -> list:
        """Apply ``ops`` atomically (ZooKeeper's multi).

        Returns
        -------
        list
            One result per op: the created path, True (delete), a ZnodeStat (set),
            True (check).

        Raises
        ------
        ZooKeeperConflictError
            An op found its znode otherwise (the subclass says how; ``path`` names
            it); nothing was applied.
        ZooKeeperConnectionError
            The outcome is unknown.
        """
        announced = self._announced(ops)
        return _checked(self._write(self._transaction(announced).commit), announced)[:len(ops)]

    def multi_async(self, ops: Sequence[Op], done: Callable[[list | ShmlogError], None]) -> None:
        """:meth:`multi` without blocking: ``done`` gets, on a kazoo thread (so it
        must only queue), one outcome per op — its result, the refusal
        (:class:`ShmlogError`) of the op refused, None for an op rolled back with it
        — or the :class:`ZooKeeperConnectionError` when the outcome is unknown."""
        announced = self._announced(ops)

        def finished(result) -> None:
            try:
                results = result.get()
            except _CONNECTION_ERRORS as error:
                done(ZooKeeperConnectionError(
                    f"the connection to ZooKeeper was lost during a multi-op writing "
                    f"{announced[0].path} and {len(announced) - 1} more: its outcome is "
                    f"unknown ({type(error).__name__})"))
                return
            done([None if isinstance(outcome, (RolledBackError, RuntimeInconsistency))
                  else _refusal(outcome, op.path) if isinstance(outcome, Exception)
                  else outcome for outcome, op in zip(results, announced)][:len(ops)])

        try:
            self._transaction(announced).commit_async().rawlink(finished)
        except _CONNECTION_ERRORS as error:
            done(ZooKeeperConnectionError(f"not connected to ZooKeeper ({type(error).__name__})"))

    def _announced(self, ops: Sequence[Op]) -> list[Op]:
        """``ops`` and, when :attr:`announce` makes one of them, their notice last."""
        notice = self.announce(ops) if self.announce is not None else None
        return [*ops] if notice is None else [*ops, notice]

    def multi_chunked(self, ops: Sequence[Op], prefix: Sequence[Op] = (),
                      pipelined: bool = False) -> list:
        """``ops`` applied as a run of multi-ops that each fit ZooKeeper's request
        size (:func:`chunk_ops`), in order, each with ``prefix`` first (a fence);
        one multi when they fit. Each run is atomic, the whole is not: when one is
        refused, the runs before it stay applied and none after it is tried.

        ``pipelined``: every run is sent before the first answer is waited for
        (ZooKeeper still applies them in order, a session's requests being
        first-in first-out), so the runs after a refused one are tried too; for
        runs that each stand alone (partition states, each written against its
        version). The answers do not wait behind each other's watch notifications,
        thousands when the runs change thousands of watched states.

        Returns
        -------
        list
            One result per op of ``ops`` (the prefix's left out).

        Raises
        ------
        ZooKeeperConflictError, ZooKeeperConnectionError
            As :meth:`multi`, for the (first) run refused or lost.
        """
        prefix = list(prefix)
        reserved = sum(op_size(op) for op in prefix) + limits.ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE
        chunks = [prefix + chunk for chunk in chunk_ops(ops, reserved=reserved)]
        if not pipelined:
            return [result for chunk in chunks for result in self.multi(chunk)[len(prefix):]]
        sent = []
        for chunk in chunks:
            announced = self._announced(chunk)
            sent.append((chunk, announced,
                         self._write(self._transaction(announced).commit_async)))
        results: list = []
        refused: ZooKeeperConflictError | None = None
        for chunk, announced, pending in sent:
            try:
                results.extend(_checked(self._write(pending.get),
                                        announced)[len(prefix):len(chunk)])
            except ZooKeeperConflictError as error:
                refused = refused or error
        if refused is not None:
            raise refused
        return results

    def _transaction(self, ops: Sequence[Op]):
        transaction = self._client.transaction()
        for op in ops:
            _add(transaction, op)
        return transaction

    def _write(self, function: Callable, *args, **kwargs) -> Any:
        """A request tried once: a lost connection leaves its outcome unknown."""
        try:
            return function(*args, **kwargs)
        except _REFUSALS as error:
            raise _refusal(error, args[0] if args else "") from None
        except _CONNECTION_ERRORS as error:
            raise ZooKeeperConnectionError(
                f"the connection to ZooKeeper ({self.hosts}) was lost during a write to "
                f"{args[:1]}: its outcome is unknown ({type(error).__name__})") from None

    # --- watches -----------------------------------------------------------------------

    def data_watch(self, path: str, changed: Callable[[bytes | None, Any], bool | None]) -> None:
        """kazoo's DataWatch: ``changed(body, ZnodeStat)`` now and at each change of
        ``path`` (None, None while it does not exist), on a kazoo thread, until it
        returns False. Blocks for the first read: call it from :meth:`spawn`."""
        self._client.DataWatch(path, changed)

    def znode_reads(self, changed: Callable[[str, bytes | None, Any], bool | None]
                    ) -> "ZnodeReads":
        """A :class:`ZnodeReads`: many znodes read, and read again at each
        reconnection, without a thread or a blocking read each. Does not block."""
        return ZnodeReads(self, changed)

    def children_watch(self, path: str, changed: Callable[[list[str]], bool | None]) -> None:
        """kazoo's ChildrenWatch: ``changed(children)`` now and at each change of
        ``path``'s children, on a kazoo thread, until it returns False. Blocks for the
        first read: call it from :meth:`spawn`."""
        self._client.ChildrenWatch(path, changed)


class ZnodeReads:
    """Many znodes read without a thread or a blocking read each, and read again
    whenever the session is CONNECTED again (the same session or a new one):
    ``changed(path, body, stat)`` is called for each path when it is read ((None,
    None) when it does not exist), on kazoo's threads (so it must only queue),
    until it returns False for that path or :meth:`stop`.

    No watch is set: the partition states' changes come in notices
    (``state_changes``), and these reads give what is there when a topic is first
    seen and what a reconnection may have hidden. A path may so be reported twice,
    and ``stat.version`` orders the reports.
    """

    def __init__(self, session: ZooKeeperSession,
                 changed: Callable[[str, bytes | None, Any], bool | None]):
        self._session = session
        self._client = session._client
        self._changed = changed
        # Each path held -> when it was added (a count): a path added again while
        # its report was refusing it stays held.
        self._paths: dict[str, int] = {}
        self._added = 0
        self._lock = threading.Lock()
        self._stopped = False
        session.add_state_listener(self._on_state)

    def add(self, paths: Iterable[str]) -> None:
        """Hold ``paths`` too; each is read now (again, if it was held already)."""
        paths = list(paths)
        with self._lock:
            for path in paths:
                self._added += 1
                self._paths[path] = self._added
        for path in paths:
            self._read(path)

    def remove(self, paths: Iterable[str]) -> None:
        """Read these paths no more."""
        with self._lock:
            for path in paths:
                self._paths.pop(path, None)

    def stop(self) -> None:
        """Report nothing more."""
        self._stopped = True
        self._session.remove_state_listener(self._on_state)

    def _on_state(self, state: SessionState) -> None:
        # The connection thread must not call ZooKeeper: the reads go from another.
        if state is SessionState.CONNECTED and not self._stopped:
            self._session.spawn(self.read_all)

    def read_all(self) -> None:
        """Read every path again (the reads are sent, not waited for)."""
        with self._lock:
            paths = sorted(self._paths)
        for path in paths:
            self._read(path)

    def _read(self, path: str) -> None:
        if self._stopped or path not in self._paths:
            return
        try:
            result = self._client.get_async(path)
        except _CONNECTION_ERRORS:
            return                                 # read again when CONNECTED
        result.rawlink(functools.partial(self._got, path))

    def _got(self, path: str, result) -> None:
        try:
            body, stat = result.get()
        except NoNodeError:
            body, stat = None, None
        except _CONNECTION_ERRORS:
            return                                 # read again when CONNECTED
        added = self._paths.get(path)
        if self._stopped or added is None:
            return
        if self._changed(path, body, stat) is False:
            with self._lock:
                if self._paths.get(path) == added:
                    del self._paths[path]


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler whose ``select`` is one ``poll(2)`` (see the module's
    theory of operation); it answers as kazoo's own does (``selector_select``): a
    socket ready to read is listed as readable only, an error or a hang-up makes it
    ready both ways, no descriptor limit."""

    def select(self, rlist, wlist, xlist, timeout=None):
        interest: dict[int, int] = {}
        objects: dict[tuple[int, int], list] = {}     # (fd, POLLIN or POLLOUT) -> as given
        for fileobjs, flag in ((rlist, select.POLLIN), (wlist, select.POLLOUT)):
            for fileobj in fileobjs:
                fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
                interest[fd] = interest.get(fd, 0) | flag
                objects.setdefault((fd, flag), []).append(fileobj)
        poller = select.poll()
        for fd, flags in interest.items():
            poller.register(fd, flags)
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        readable, writable = [], []
        for fd, happened in poller.poll(None if timeout is None else timeout * 1000):
            # As selectors' epoll: anything but "writable" counts as readable, and
            # anything but "readable" as writable (errors and hang-ups are both).
            if happened & ~select.POLLOUT and interest[fd] & select.POLLIN:
                readable.extend(objects[fd, select.POLLIN])
            elif happened & ~select.POLLIN and interest[fd] & select.POLLOUT:
                writable.extend(objects[fd, select.POLLOUT])
        return readable, writable, []


def _add(transaction, op: Op) -> None:
    if isinstance(op, CreateOp):
        transaction.create(op.path, op.body, ephemeral=op.ephemeral, sequence=op.sequential)
    elif isinstance(op, SetDataOp):
        transaction.set_data(op.path, op.body, version=op.version)
    elif isinstance(op, DeleteOp):
        transaction.delete(op.path, version=op.version)
    else:
        assert isinstance(op, CheckOp), op
        transaction.check(op.path, op.version)


def _checked(results: list, ops: Sequence[Op]) -> list:
    """A multi's results, or the failing op's refusal raised (kazoo's ``commit``
    returns, per op, the failing op's exception, ``RolledBackError`` before it and
    ``RuntimeInconsistency`` after it)."""
    assert len(results) == len(ops), (results, ops)
    for result, op in zip(results, ops):
        if isinstance(result, Exception) and \
                not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            raise _refusal(result, op.path)
    return results


def _refusal(error: KazooException, path: str) -> ShmlogError:
    """The named error for a write ZooKeeper refused."""
    if isinstance(error, BadVersionError):
        return StaleStateVersionError(f"{path} has another zkVersion than the one written "
                                      f"against: someone wrote it since it was read", path=path)
    kind = ZnodeExistsError if isinstance(error, NodeExistsError) else \
        ZnodeMissingError if isinstance(error, NoNodeError) else ZooKeeperConflictError
    return kind(f"{path}: {type(error).__name__} (the znode is not as the writer believed)",
                path=path)
