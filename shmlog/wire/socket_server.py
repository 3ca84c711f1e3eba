"""The Kafka listener's sockets (Kafka's ``SocketServer``): a thread accepts
connections, reads size-prefixed requests, hands each to the broker's loop, and
writes the responses the loop passes back.

Rules
-----
* **Framing before trust.** A request's 4-byte size is checked against
  ``socket.request.max.bytes`` before a byte of its body is read (or a buffer for it
  made); a size over it, or negative, closes the connection (Kafka's
  ``InvalidReceiveException``).
* **One request at a time per connection** (Kafka mutes a channel while its
  request is handled): the next goes to the loop once the loop has answered the one
  before (or said none comes: acks=0), so responses go in request order. A request
  the client pipelined behind it, already read, goes at once, from the loop's own
  thread, while less than ``limits.KAFKA_PIPELINED_UNSENT_MAX`` of the connection's
  responses wait to be written; otherwise after they are. A connection is read only
  when it has nothing with the loop, nothing read and waiting, and nothing to write:
  it holds at most what one read brought and one chunk of responses.
* **Bounded.** At most ``connections_per_address_max`` connections per client
  address (a connection over it is closed at once); a connection with nothing in
  flight that received nothing for ``connections.max.idle.ms`` is closed. accept()
  failing for want of descriptors stops accepting for
  ``limits.KAFKA_ACCEPT_BACKOFF_S`` and says so in the log, never a crash or a spin.
* **Nothing a client sends stops the thread**: a reset, a half-written request, a
  request to a connection that is gone (its response is dropped).
* Responses are lists of buffers written with ``sendmsg`` as they are (a Fetch
  response's record batches, converted once for Kafka: never copied here).

Theory of operation
-------------------
Everything about a socket happens on this thread, in one ``selectors`` loop over
the listening sockets, the connections and one end of a socket pair the loop
writes to when it passes a response back to an empty outbox (so a sleeping select
wakes; a wake is pending otherwise). A complete request goes into the requests
queue with its connection's id, and the doorbell the broker's loop sleeps on is
rung; the loop takes requests with
:meth:`KafkaSocketServer.take` and answers with :meth:`KafkaSocketServer.send` (a
response), :meth:`KafkaSocketServer.no_response` or :meth:`KafkaSocketServer.close`.
Connection ids never repeat, so a response for a connection that closed meanwhile
finds nothing and is dropped.
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
import struct
import threading
import time

from ..common import limits
from ..common.errors import KafkaRequestError

__all__ = ["KafkaSocketServer", "WireRequest"]

log = logging.getLogger("shmlog.broker.kafka")

_SIZE = struct.Struct(">i")
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# The loop's wake byte is written holding the GIL (PyDLL: the write never blocks, the
# socket pair being non-blocking). A socket's send() lets the GIL go, and the loop's
# thread would then wait for it behind this listener's thread once per response.
_libc_holding_gil = ctypes.PyDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class WireRequest:
    """One request frame (after its size) and the connection it came on."""
    connection_id: int
    frame: bytes
    peer: str                    # the client's address, for the log


class _Connection:
    __slots__ = ("id", "sock", "peer", "received", "in_loop", "unsent", "outgoing",
                 "last_active", "frames_waiting", "events")

    def __init__(self, connection_id: int, sock: socket.socket, peer: str) -> None:
        self.id = connection_id
        self.sock = sock
        self.peer = peer
        self.received = bytearray()
        # Shared with the loop's thread, under the server's lock: the requests read and
        # not yet handed over, whether one is with the loop, and how many bytes of the
        # responses it passed back are not written yet.
        self.frames_waiting: collections.deque[bytes] = collections.deque()
        self.in_loop = False
        self.unsent = 0
        self.outgoing: collections.deque[memoryview] = collections.deque()
        self.last_active = time.monotonic()
        self.events = 0                   # what the selector watches for


class KafkaSocketServer(threading.Thread):
    """Listens on ``endpoints`` [(host, port)] (port 0: any free port; see
    :attr:`addresses`) from construction; from :meth:`serve` on, accepts and passes
    requests to the loop that sleeps on ``doorbell`` (a broker binds before it
    registers in a cluster, and serves once it can answer)."""

    def __init__(self, endpoints: list[tuple[str, int]], *,
                 request_size_max: int = limits.KAFKA_REQUEST_SIZE_MAX_DEFAULT,
                 idle_ms: int = limits.KAFKA_CONNECTIONS_IDLE_MS_DEFAULT,
                 connections_per_address_max: int =
                 limits.KAFKA_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT) -> None:
        super().__init__(name="shmlog-kafka-listener", daemon=True)
        self.doorbell = None
        self.request_size_max = request_size_max
        self.idle_s = idle_ms / 1000
        self.connections_per_address_max = connections_per_address_max
        self._selector = selectors.DefaultSelector()
        self._listening: list[socket.socket] = []
        try:
            for host, port in endpoints:
                self._listening.append(self._listen(host, port))
        except OSError:
            self._close_listening()
            raise
        #: The (host, port) each endpoint is bound to, in order.
        self.addresses = [sock.getsockname()[:2] for sock in self._listening]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._requests: collections.deque[WireRequest] = collections.deque()
        self._outbox: collections.deque[tuple[int, list | None]] = collections.deque()
        self._connections: dict[int, _Connection] = {}
        self._per_address: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._accepting_after = 0.0
        self._next_idle_check = 0.0
        self._stopping = threading.Event()

    def serve(self, doorbell) -> None:
        """Start accepting and reading; ring ``doorbell`` for each request queued."""
        self.doorbell = doorbell
        self.start()

    def _listen(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(limits.KAFKA_LISTEN_BACKLOG)
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, "listen")
        return sock

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
        """Write ``buffers`` (a framed response) on the connection; its next request
        may then be handed over."""
        self._post(connection_id, buffers)

    def no_response(self, connection_id: int) -> None:
        """The request in flight on the connection gets no response (acks=0)."""
        self._post(connection_id, [])

    def close(self, connection_id: int) -> None:
        """Close the connection (its request could not be served)."""
        self._post(connection_id, None)

    def _post(self, connection_id: int, buffers: list | None) -> None:
        size = sum(memoryview(buffer).nbytes for buffer in buffers) if buffers else 0
        with self._lock:
            wake = not self._outbox          # else a wake is pending: the thread drains all
            self._outbox.append((connection_id, buffers))
            connection = self._connections.get(connection_id)
            if connection is not None and buffers is not None:
                connection.in_loop = False
                connection.unsent += size
                self._pass_next(connection)  # taken by the loop in this same pass
        if wake:
            self._wake()

    def _pass_next(self, connection: _Connection) -> bool:
        """Queue the connection's next request for the loop if it may go now (with
        the lock held); whether it went."""
        if connection.in_loop or not connection.frames_waiting or \
                connection.unsent > limits.KAFKA_PIPELINED_UNSENT_MAX:
            return False
        connection.in_loop = True
        self._requests.append(WireRequest(connection.id, connection.frames_waiting.popleft(),
                                          connection.peer))
        return True

    def _wake(self) -> None:
        # -1 (EAGAIN) when the pair is full: a wake is pending already.
        _libc_holding_gil.write(self._wake_writer.fileno(), b"\0", 1)

    def stop(self) -> None:
        """Stop accepting and reading, close every connection (responses not yet
        written are dropped: the broker is stopping)."""
        self._stopping.set()
        if self.is_alive():
            self._wake()
            self.join(timeout=10)
        for connection in list(self._connections.values()):
            self._drop(connection)
        self._close_listening()
        self._wake_reader.close()
        self._wake_writer.close()
        self._selector.close()

    def _close_listening(self) -> None:
        for sock in self._listening:
            sock.close()

    # -- the thread ------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping.is_set():
            for key, events in self._selector.select(limits.KAFKA_LISTENER_POLL_S):
                if key.data is None:
                    self._drain_wakes()
                elif key.data == "listen":
                    self._accept(key.fileobj)
                else:
                    self._serve(key.data, events)
            self._answer_outbox()
            self._close_idle()
            self._resume_accepting()

    def _drain_wakes(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self, listening: socket.socket) -> None:
        while True:
            try:
                sock, address = listening.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno not in _OUT_OF_DESCRIPTORS:
                    raise
                log.warning("Kafka listener %s: accept failed (%s): the broker is at its "
                            "open-files limit (RLIMIT_NOFILE; raise it with ulimit -n, or "
                            "LimitNOFILE under systemd); not accepting for %.1f s",
                            listening.getsockname(), error.strerror,
                            limits.KAFKA_ACCEPT_BACKOFF_S)
                self._pause_accepting()
                return
            peer = address[0]
            if self._per_address[peer] >= self.connections_per_address_max:
                log.warning("Kafka listener: closed a connection from %s: it holds %d "
                            "already (max.connections.per.ip)", peer, self._per_address[peer])
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(next(self._ids), sock, peer)
            self._connections[connection.id] = connection
            self._per_address[peer] += 1
            self._watch(connection, idle=True)

    def _pause_accepting(self) -> None:
        self._accepting_after = time.monotonic() + limits.KAFKA_ACCEPT_BACKOFF_S
        for sock in self._listening:
            self._selector.unregister(sock)

    def _resume_accepting(self) -> None:
        if self._accepting_after and time.monotonic() >= self._accepting_after:
            self._accepting_after = 0.0
            for sock in self._listening:
                self._selector.register(sock, selectors.EVENT_READ, "listen")

    def _serve(self, connection: _Connection, events: int) -> None:
        if connection.id not in self._connections:
            return                        # closed earlier in this round
        if events & selectors.EVENT_WRITE:
            self._write(connection)
        if events & selectors.EVENT_READ and connection.id in self._connections:
            self._read(connection)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(limits.KAFKA_RECEIVE_CHUNK_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)        # the client closed (or reset) it
            return
        connection.last_active = time.monotonic()
        connection.received += data
        try:
            self._split_frames(connection)
        except KafkaRequestError as error:
            log.warning("Kafka listener: closed the connection from %s: %s", connection.peer,
                        error)
            self._drop(connection)
            return
        self._hand_over(connection)

    def _split_frames(self, connection: _Connection) -> None:
        received = connection.received
        frames = []
        try:
            self._split(received, frames)
        finally:
            if frames:
                with self._lock:
                    connection.frames_waiting.extend(frames)

    def _split(self, received: bytearray, frames: list) -> None:
        while len(received) >= _SIZE.size:
            (size,) = _SIZE.unpack_from(received, 0)
            if size < 0 or size > self.request_size_max:
                raise KafkaRequestError(
                    f"a request of {size} bytes is over socket.request.max.bytes "
                    f"({self.request_size_max})" if size > 0 else
                    f"a request's size field is {size}")
            if len(received) < _SIZE.size + size:
                return
            frames.append(bytes(received[_SIZE.size:_SIZE.size + size]))
            del received[:_SIZE.size + size]

    def _hand_over(self, connection: _Connection) -> None:
        """Give the loop the connection's next request if it may go (see
        :meth:`_pass_next`); watch the connection as it now stands."""
        with self._lock:
            handed = self._pass_next(connection)
            idle = not (connection.in_loop or connection.frames_waiting or connection.unsent)
        if handed:
            self.doorbell.ring()
        self._watch(connection, idle)

    def _watch(self, connection: _Connection, idle: bool) -> None:
        """Watch the connection for reading when it is ``idle`` (nothing with the
        loop, waiting or unwritten), and for writing while a response waits to be
        written."""
        events = (selectors.EVENT_READ if idle else 0) | \
            (selectors.EVENT_WRITE if connection.outgoing else 0)
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
        for connection_id, buffers in answers:
            connection = self._connections.get(connection_id)
            if connection is None:
                continue                  # closed meanwhile: the response is dropped
            if buffers is None:
                self._drop(connection)
                continue
            connection.outgoing.extend(memoryview(buffer).cast("B") for buffer in buffers
                                       if len(buffer))
            if connection.outgoing:
                self._write(connection)
            else:
                self._hand_over(connection)

    def _write(self, connection: _Connection) -> None:
        outgoing = connection.outgoing
        while outgoing:
            try:
                sent = connection.sock.sendmsg(
                    list(itertools.islice(outgoing, limits.KAFKA_SEND_BUFFERS_MAX)))
            except BlockingIOError:
                break
            except OSError:
                self._drop(connection)
                return
            with self._lock:
                connection.unsent -= sent
            while sent and outgoing:
                head = outgoing[0]
                if sent >= len(head):
                    sent -= len(head)
                    outgoing.popleft()
                else:
                    outgoing[0] = head[sent:]
                    sent = 0
        connection.last_active = time.monotonic()
        self._hand_over(connection)

    def _close_idle(self) -> None:
        now = time.monotonic()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + limits.KAFKA_LISTENER_POLL_S
        horizon = now - self.idle_s
        for connection in [c for c in self._connections.values()
                           if not (c.in_loop or c.frames_waiting or c.unsent)
                           and c.last_active < horizon]:
            log.info("Kafka listener: closed the connection from %s, idle for %.0f s "
                     "(connections.max.idle.ms)", connection.peer, self.idle_s)
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        if self._connections.pop(connection.id, None) is None:
            return
        self._per_address[connection.peer] -= 1
        if self._per_address[connection.peer] <= 0:
            del self._per_address[connection.peer]
        if connection.events:
            self._selector.unregister(connection.sock)
        connection.sock.close()
