"""The Kafka listener's sockets (Kafka's ``SocketServer``), served on the broker's
loop's own thread: it accepts connections, reads size-prefixed requests, queues
each for the loop's handlers, and writes their responses as they are given.

Rules
-----
* **Framing before trust.** A request's 4-byte size is checked against
  ``socket.request.max.bytes`` before a byte of its body is read (or a buffer for it
  made); a size over it, or negative, closes the connection (Kafka's
  ``InvalidReceiveException``).
* **One request at a time per connection** (Kafka mutes a channel while its
  request is handled): the next goes to the handlers once the one before is
  answered (or said to get none: acks=0), so responses go in request order. A
  request the client pipelined behind it, already read, goes at once, while less
  than ``limits.KAFKA_PIPELINED_UNSENT_MAX`` of the connection's responses wait to
  be written; otherwise after they are. A connection is read only when it has
  nothing with the handlers, nothing read and waiting, and nothing to write: it
  holds at most what one read brought and one chunk of responses.
* **Bounded.** At most ``connections_per_address_max`` connections per client
  address (a connection over it is closed at once); a connection with nothing in
  flight that received nothing for ``connections.max.idle.ms`` is closed. accept()
  failing for want of descriptors stops accepting for
  ``limits.KAFKA_ACCEPT_BACKOFF_S`` and says so in the log, never a crash or a spin.
* **Nothing a client sends stops the loop**: a reset, a half-written request, a
  response to a connection that is gone (it is dropped). Nothing here blocks.
* Responses are lists of buffers written with ``sendmsg`` as they are (a Fetch
  response's record batches, converted once for Kafka: never copied here); over TLS
  they go through the ``ssl`` object (``connections``).
* **Secured as the listener says** (``connections.Security``): on a TLS listener
  (SSL, SASL_SSL) each connection's handshake is driven here without blocking, and
  on a SASL listener (SASL_PLAINTEXT, SASL_SSL) no request but ApiVersions reaches
  the handlers before the client logged in (``authenticator``; the checks run on
  its worker threads). A connection has ``connection_setup_timeout_ms`` to finish
  both, or it is closed.

Theory of operation
-------------------
Kafka hands requests between network threads and request-handler threads; in
CPython that hand-over costs two thread wake-ups and two GIL hand-overs per
request (measured: 0.5-0.9 ms for an ApiVersions round trip, against 50 us of
work). So the loop that answers also does the socket work: every turn it looks at
the sockets without waiting (:meth:`KafkaSocketServer.pump`, one ``epoll_wait``),
and once idle it sleeps on them and on its doorbell at once: its
``wakeup.LoopSelector`` watches this server's selector (:meth:`KafkaSocketServer.fileno`,
an epoll that reads as ready when a socket here is). A request read whole
goes into the requests queue with its connection's id; the loop takes requests
with :meth:`KafkaSocketServer.take` and answers with :meth:`KafkaSocketServer.send`
(a response, written at once, as far as the socket takes it),
:meth:`KafkaSocketServer.no_response` or :meth:`KafkaSocketServer.close`.
Connection ids never repeat, so a response for a connection that closed meanwhile
finds nothing and is dropped. Only a SASL worker's login result comes from
another thread: through the outbox, under the lock, with a byte on the pair.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import errno
import itertools
import logging
import selectors
import socket
import threading
import time

from ..common import limits
from ..common.errors import KafkaRequestError
from .authenticator import Action, SaslWorker
from .connections import PLAINTEXT, Connection, Security

__all__ = ["KafkaSocketServer", "WireRequest"]

log = logging.getLogger("shmlog.broker.kafka")

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# The wake byte is written holding the GIL (PyDLL: the write never blocks, the socket
# pair being non-blocking): the thread writing it would otherwise wait for the GIL
# again behind the loop it just woke.
_libc_holding_gil = ctypes.PyDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class WireRequest:
    """One request frame (after its size) and the connection it came on."""
    connection_id: int
    frame: bytes
    peer: str                    # the client's address, for the log
    listener: str = "PLAINTEXT"  # the name of the listener it came to


class _Listening:
    """A listening socket and how its connections are secured."""
    __slots__ = ("sock", "security")

    def __init__(self, sock: socket.socket, security: Security) -> None:
        self.sock = sock
        self.security = security


class _Logins:
    """The TLS handshakes and SASL logins of :class:`KafkaSocketServer`'s connections
    (a part of it, on its thread, apart only to keep each class short)."""

    def _handshake(self, connection: Connection) -> None:
        try:
            done = connection.handshake()
        except OSError as error:
            # Port scanners, clients speaking plaintext, certificates refused: one
            # line each, at info (a warning per scanner would drown the log).
            log.info("Kafka listener: closed the connection from %s: its TLS handshake "
                     "failed: %s", connection.peer, error)
            self._drop(connection)
            return
        connection.last_active = time.monotonic()
        if done:
            self._read(connection)        # a request may have come with its Finished
        else:
            self._watch(connection, idle=False)

    def _act(self, connection: Connection, action: Action) -> None:
        """Carry out what a connection's authenticator said (its request counts as
        with the loop until the answer is passed on)."""
        if action.work is not None:
            if not self._sasl_worker.submit(connection.id, action.work):
                log.warning("Kafka listener: refused a SASL login from %s: %s",
                            connection.peer, action.refusal.reason)
                self._act(connection, action.refusal)
            else:
                self._watch(connection, idle=False)
            return
        if action.close:
            log.info("Kafka listener: closed the connection from %s: %s", connection.peer,
                     action.reason)
            if not action.buffers:
                self._drop(connection)
                return
            connection.close_after_write = True
        elif connection.logged_in:
            connection.setup_deadline = None
            log.debug("Kafka listener: %s logged in as %s (SASL %s)", connection.peer,
                      connection.auth.principal, connection.auth.mechanism)
        connection.in_loop = False
        connection.unsent += sum(len(buffer) for buffer in action.buffers)
        connection.outgoing.extend(memoryview(buffer).cast("B") for buffer in action.buffers)
        self._write(connection)

    def _close_failed_logins(self) -> None:
        now = time.monotonic()
        while self._closing and self._closing[0].close_at <= now:
            self._drop(self._closing.popleft())


class KafkaSocketServer(_Logins):
    """Listens on ``endpoints`` [(host, port) or (host, port, Security)] (port 0:
    any free port; see :attr:`addresses`; no Security: PLAINTEXT) from construction;
    from :meth:`serve` on, accepts and reads as the loop drives it (a broker binds
    before it registers in a cluster, and serves once it can answer)."""

    def __init__(self, endpoints: list[tuple], *,
                 request_size_max: int = limits.KAFKA_REQUEST_SIZE_MAX_DEFAULT,
                 idle_ms: int = limits.KAFKA_CONNECTIONS_IDLE_MS_DEFAULT,
                 connections_per_address_max: int =
                 limits.KAFKA_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
                 setup_timeout_ms: int = limits.KAFKA_CONNECTION_SETUP_MS_DEFAULT) -> None:
        self.request_size_max = request_size_max
        self.idle_s = idle_ms / 1000
        self.setup_s = setup_timeout_ms / 1000
        self.connections_per_address_max = connections_per_address_max
        self._selector = selectors.DefaultSelector()
        self._listening: list[_Listening] = []
        try:
            for host, port, *security in endpoints:
                self._listening.append(self._listen(host, port,
                                                    security[0] if security else PLAINTEXT))
        except OSError:
            self._close_listening()
            raise
        #: The (host, port) each endpoint is bound to, in order.
        self.addresses = [item.sock.getsockname()[:2] for item in self._listening]
        self._sasl_worker: SaslWorker | None = None
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._lock = threading.Lock()                      # the outbox's
        self._requests: collections.deque[WireRequest] = collections.deque()
        self._outbox: collections.deque[tuple[int, list | Action | None]] = \
            collections.deque()
        self._connections: dict[int, Connection] = {}
        self._closing: collections.deque[Connection] = collections.deque()   # by close_at
        self._per_address: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._accepting_after = 0.0
        self._next_idle_check = 0.0

    def serve(self) -> None:
        """Accept and read from now on, as the loop pumps (:meth:`pump`) and sleeps
        on :meth:`fileno` among its descriptors."""
        if any(item.security.sasl is not None for item in self._listening):
            self._sasl_worker = SaslWorker(self._post)

    def fileno(self) -> int:
        """A descriptor that reads as ready while a socket here has something to do
        (this server's epoll), for the loop's sleep."""
        return self._selector.fileno()

    def seconds_to_next_timer(self) -> float | None:
        """Seconds until this server has timed work (a refused login's close, the
        end of an accept back-off), None when it has none."""
        deadlines = [self._closing[0].close_at] if self._closing else []
        if self._accepting_after:
            deadlines.append(self._accepting_after)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _listen(self, host: str, port: int, security: Security) -> _Listening:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(limits.KAFKA_LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        listening = _Listening(sock, security)
        self._selector.register(sock, selectors.EVENT_READ, listening)
        return listening

    # -- the loop's side -------------------------------------------------------------
    @property
    def waiting(self) -> bool:
        """Is a request waiting for the loop?"""
        return bool(self._requests)

    def take(self) -> WireRequest | None:
        """The oldest request waiting for the loop, or None."""
        try:
            return self._requests.popleft()
        except IndexError:
            return None

    def send(self, connection_id: int, buffers: list) -> None:
        """Write ``buffers`` (a framed response) on the connection, as far as its
        socket takes them now; its next request may then be queued."""
        connection = self._connections.get(connection_id)
        if connection is None:
            return                            # closed meanwhile: the response is dropped
        connection.in_loop = False
        chunks = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
        connection.unsent += sum(chunk.nbytes for chunk in chunks)
        connection.outgoing.extend(chunks)
        if connection.outgoing:
            self._write(connection)
        else:
            self._hand_over(connection)

    def no_response(self, connection_id: int) -> None:
        """The request in flight on the connection gets no response (acks=0)."""
        self.send(connection_id, [])

    def close(self, connection_id: int) -> None:
        """Close the connection (its request could not be served)."""
        connection = self._connections.get(connection_id)
        if connection is not None:
            self._drop(connection)

    def pump(self) -> None:
        """Do what the sockets allow now, without waiting: accept, read (queueing
        the requests read whole), write."""
        for key, events in self._selector.select(0):
            if key.data is None:
                self._drain_wakes()
            elif isinstance(key.data, _Listening):
                self._accept(key.data)
            else:
                self._serve(key.data, events)
        if self._outbox:
            self._answer_outbox()
        if self._closing:
            self._close_failed_logins()
        self._close_idle()
        if self._accepting_after:
            self._resume_accepting()

    def _post(self, connection_id: int, action: Action) -> None:
        """A SASL worker's login result, from its thread: the loop's next turn
        carries it out."""
        with self._lock:
            wake = not self._outbox          # else a wake is pending: the loop drains all
            self._outbox.append((connection_id, action))
        if wake:
            self._wake()

    def _pass_next(self, connection: Connection) -> bool:
        """Queue the connection's next request for the handlers if it may go now
        (before a SASL login, the authenticator decides instead); whether it went."""
        if connection.in_loop or not connection.frames_waiting or not connection.logged_in \
                or connection.unsent > limits.KAFKA_PIPELINED_UNSENT_MAX:
            return False
        connection.in_loop = True
        self._requests.append(WireRequest(connection.id, connection.frames_waiting.popleft(),
                                          connection.peer, connection.security.listener))
        return True

    def _wake(self) -> None:
        # -1 (EAGAIN) when the pair is full: a wake is pending already.
        _libc_holding_gil.write(self._wake_writer.fileno(), b"\0", 1)

    def stop(self) -> None:
        """Stop accepting and reading, close every connection (responses not yet
        written are dropped: the broker is stopping)."""
        if self._sasl_worker is not None:
            self._sasl_worker.stop()
        for connection in list(self._connections.values()):
            self._drop(connection)
        self._close_listening()
        self._wake_reader.close()
        self._wake_writer.close()
        self._selector.close()

    def _close_listening(self) -> None:
        for item in self._listening:
            item.sock.close()

    # -- one turn ---------------------------------------------------------------------
    def _drain_wakes(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self, listening: _Listening) -> None:
        while True:
            try:
                sock, address = listening.sock.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno not in _OUT_OF_DESCRIPTORS:
                    raise
                log.warning("Kafka listener %s: accept failed (%s): the broker is at its "
                            "open-files limit (RLIMIT_NOFILE; raise it with ulimit -n, or "
                            "LimitNOFILE under systemd); not accepting for %.1f s",
                            listening.sock.getsockname(), error.strerror,
                            limits.KAFKA_ACCEPT_BACKOFF_S)
                self._pause_accepting()
                return
            peer = address[0]
            if self._per_address[peer] >= self.connections_per_address_max:
                log.warning("Kafka listener: closed a connection from %s: it holds %d "
                            "already (max.connections.per.ip)", peer, self._per_address[peer])
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if listening.security.tls is not None:
                    sock = listening.security.tls.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False)
            except OSError:
                sock.close()                  # reset before it was served
                continue
            connection = Connection(next(self._ids), sock, peer, listening.security,
                                    self.setup_s)
            self._connections[connection.id] = connection
            self._per_address[peer] += 1
            self._watch(connection, idle=True)

    def _pause_accepting(self) -> None:
        self._accepting_after = time.monotonic() + limits.KAFKA_ACCEPT_BACKOFF_S
        for item in self._listening:
            self._selector.unregister(item.sock)

    def _resume_accepting(self) -> None:
        if self._accepting_after and time.monotonic() >= self._accepting_after:
            self._accepting_after = 0.0
            for item in self._listening:
                self._selector.register(item.sock, selectors.EVENT_READ, item)

    def _serve(self, connection: Connection, events: int) -> None:
        if connection.id not in self._connections:
            return                        # closed earlier in this round
        if connection.handshaking:
            self._handshake(connection)
            return
        if events & selectors.EVENT_WRITE:
            if connection.outgoing:
                self._write(connection)
            elif connection.read_wants_write:
                self._read(connection)
        if events & selectors.EVENT_READ and connection.id in self._connections:
            self._read(connection)

    def _read(self, connection: Connection) -> None:
        data = connection.receive()
        if data is None:
            self._hand_over(connection)   # watched again as it stands
            return
        if not data:
            self._drop(connection)        # the client closed (or reset) it
            return
        connection.last_active = time.monotonic()
        connection.received += data
        frames: list[bytes] = []
        try:
            connection.split_frames(self.request_size_max, frames)
        except KafkaRequestError as error:
            log.warning("Kafka listener: closed the connection from %s: %s", connection.peer,
                        error)
            self._drop(connection)
            return
        finally:
            connection.frames_waiting.extend(frames)
        self._hand_over(connection)

    def _hand_over(self, connection: Connection) -> None:
        """Give the loop the connection's next request if it may go (see
        :meth:`_pass_next`); before a SASL login, its authenticator says what becomes
        of it. Watch the connection as it then stands."""
        if connection.close_after_write:
            self._watch(connection, idle=False)     # a failed login's answer, then the end
            return
        if not connection.logged_in:
            frame = connection.frames_waiting.popleft() \
                if not connection.in_loop and connection.frames_waiting else None
            if frame is not None:
                connection.in_loop = True
                action = connection.auth.on_frame(frame)
                if not action.to_loop:
                    self._act(connection, action)
                    return
                self._requests.append(WireRequest(connection.id, frame, connection.peer,
                                                  connection.security.listener))
        self._pass_next(connection)
        self._watch(connection, not (connection.in_loop or connection.frames_waiting or
                                     connection.unsent))

    def _watch(self, connection: Connection, idle: bool) -> None:
        """Watch the connection for what its TLS handshake waits for; else for reading
        when it is ``idle`` (nothing with the loop, waiting or unwritten), and for
        writing while a response waits to be written (or OpenSSL must write before it
        reads on)."""
        if connection.handshaking:
            events = connection.wants
        else:
            events = (selectors.EVENT_READ if idle else 0) | \
                (selectors.EVENT_WRITE if connection.outgoing or connection.read_wants_write
                 else 0)
        if events == connection.events:
            return
        if connection.events == 0:
            self._selector.register(connection.sock, events, connection)
        elif events == 0:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, events, connection)
        connection.events = events

    def _answer_outbox(self) -> None:
        with self._lock:
            answers, self._outbox = self._outbox, collections.deque()
        for connection_id, action in answers:
            connection = self._connections.get(connection_id)
            if connection is not None:    # else closed meanwhile: the answer is dropped
                self._act(connection, action)

    def _write(self, connection: Connection) -> None:
        while connection.outgoing:
            try:
                sent = connection.send()
            except OSError:
                self._drop(connection)
                return
            if sent is None:
                break
            connection.unsent -= sent
            connection.sent(sent)
        connection.last_active = time.monotonic()
        if connection.close_after_write and not connection.outgoing and \
                connection.close_at is None:
            # Kafka's connection.failed.authentication.delay.ms: the client reads the
            # answer before the end (it is not read meanwhile).
            connection.close_at = time.monotonic() + limits.KAFKA_FAILED_LOGIN_CLOSE_DELAY_S
            self._closing.append(connection)
        self._hand_over(connection)

    def _close_idle(self) -> None:
        now = time.monotonic()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + limits.KAFKA_LISTENER_POLL_S
        horizon = now - self.idle_s
        for connection in list(self._connections.values()):
            if connection.setup_deadline is not None and now > connection.setup_deadline:
                log.info("Kafka listener: closed the connection from %s: its %s did not "
                         "finish within %.1f s (connection_setup_timeout_ms)",
                         connection.peer, "TLS handshake" if connection.handshaking
                         else "SASL login", self.setup_s)
                self._drop(connection)
            elif not (connection.in_loop or connection.frames_waiting or connection.unsent) \
                    and connection.last_active < horizon:
                log.info("Kafka listener: closed the connection from %s, idle for %.0f s "
                         "(connections.max.idle.ms)", connection.peer, self.idle_s)
                self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        if self._connections.pop(connection.id, None) is None:
            return
        self._per_address[connection.peer] -= 1
        if self._per_address[connection.peer] <= 0:
            del self._per_address[connection.peer]
        if connection.events:
            self._selector.unregister(connection.sock)
        connection.close()
