"""The Prometheus endpoint's HTTP server: one thread, one event loop (``selectors``),
bounded in connections, time and bytes.

Rules
-----
* One thread serves every connection: the number of the broker's threads does not
  grow with its scrapers (prometheus-client's server started one per connection,
  and 2,000 idle connections held 2,000 threads and descriptors).
* At most ``limits.METRICS_CONNECTIONS_MAX`` connections are open; one beyond is
  accepted and closed at once (its client sees the connection end, not a hang),
  and a warning says so once, until the count is below the cap again.
* A connection must deliver its request's head (request line and headers, at most
  ``limits.METRICS_REQUEST_SIZE_MAX`` bytes, else ``431``) within
  ``limits.METRICS_REQUEST_TIMEOUT_S`` of its accept, and read its reply with no
  pause longer than ``limits.METRICS_WRITE_TIMEOUT_S``; else it is closed. An idle
  or slow (slowloris) client holds its descriptor that long at most.
* Each reply closes its connection (``Connection: close``, as prometheus-client's
  WSGI server did): no connection idles between scrapes.
* An ``accept`` refused by a limit (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``)
  pauses accepting for ``limits.METRICS_ACCEPT_RETRY_S`` (the listening socket
  stays readable, so accepting at every turn would spin) and is logged once until
  an accept succeeds again; nothing this thread meets ends the broker.

Theory of operation
-------------------
:class:`MetricsHttpServer` binds, listens, and runs its loop on a daemon thread:
the listening socket and each connection are registered with a selector; a
connection is read until its head ends (``\\r\\n\\r\\n``), answered with what
``respond(method, target, headers)`` returns (status, headers, body; the caller
renders and caches the scrape), written as the socket takes it, and closed. The
loop wakes at least every ``limits.METRICS_POLL_S`` to close connections past
their deadline and to see :meth:`MetricsHttpServer.stop`. ``respond`` runs on this
thread and may take seconds (it asks the broker's loop for its stats): meanwhile
other connections wait, in the kernel's backlog or their buffers, which is no
worse for them (they would get the same scrape) and bounds the broker's work.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from typing import Callable

from ..common import limits

log = logging.getLogger("shmlog.broker")

__all__ = ["MetricsHttpServer", "Reply"]

# status line ("200 OK"), headers, body
Reply = tuple[str, list[tuple[str, str]], bytes]
_ACCEPT_LIMITS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Connection:
    __slots__ = ("socket", "received", "reply", "sent", "deadline")

    def __init__(self, connection: socket.socket, deadline: float):
        self.socket, self.deadline = connection, deadline
        self.received = b""
        self.reply: memoryview | None = None
        self.sent = 0


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(method, target, {lower-case header name: value}) of a request head, None
    when it is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def _encode(reply: Reply) -> bytes:
    status, headers, body = reply
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


class MetricsHttpServer:
    """Serve ``respond`` over HTTP on ``address``:``port`` (0: a free port) from one
    thread (see the module's rules).

    Raises
    ------
    OSError
        The address cannot be bound (the port is taken).
    """

    def __init__(self, respond: Callable[[str, str, dict[str, str]], Reply], port: int,
                 address: str):
        self._respond = respond
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((address, port))
            self._listener.listen(limits.METRICS_LISTEN_BACKLOG)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._connections: dict[int, _Connection] = {}
        self._accepting_after: float | None = None      # paused by a limit until then
        self._over_cap = self._accept_refused = False   # said once, until it passes
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shmlog-metrics", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    def stop(self, timeout_s: float) -> None:
        """Stop serving; the thread closes every socket as it ends (within
        ``timeout_s``, unless a scrape is being rendered: it then ends after it)."""
        self._stopping.set()
        self._thread.join(timeout_s)

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(limits.METRICS_POLL_S):
                    if key.data is None:
                        self._accept()
                    else:
                        self._serve(key.data)
                self._expire(time.monotonic())
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            self._selector.close()
            self._listener.close()

    def _accept(self) -> None:
        for _ in range(limits.METRICS_LISTEN_BACKLOG):      # what waits, bounded per turn
            try:
                accepted, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in _ACCEPT_LIMITS:
                    self._pause_accepting(error)
                    return
                continue                                    # ECONNABORTED and kin
            self._accepted(accepted)

    def _accepted(self, accepted: socket.socket) -> None:
        if self._accept_refused:
            self._accept_refused = False
            log.warning("the metrics endpoint accepts connections again")
        if len(self._connections) >= limits.METRICS_CONNECTIONS_MAX:
            accepted.close()
            if not self._over_cap:
                self._over_cap = True
                log.warning("the metrics endpoint holds %d connections, its cap "
                            "(limits.METRICS_CONNECTIONS_MAX): new ones are closed at "
                            "once until some end (idle ones end after %g s)",
                            limits.METRICS_CONNECTIONS_MAX, limits.METRICS_REQUEST_TIMEOUT_S)
            return
        accepted.setblocking(False)
        connection = _Connection(accepted, time.monotonic() + limits.METRICS_REQUEST_TIMEOUT_S)
        self._connections[accepted.fileno()] = connection
        self._selector.register(accepted, selectors.EVENT_READ, connection)

    def _pause_accepting(self, error: OSError) -> None:
        self._selector.unregister(self._listener)
        self._accepting_after = time.monotonic() + limits.METRICS_ACCEPT_RETRY_S
        if not self._accept_refused:
            self._accept_refused = True
            log.error("the metrics endpoint cannot accept a connection (%s): a limit of "
                      "the process or host (RLIMIT_NOFILE: ulimit -n, or fs.file-max); it "
                      "tries again every %g s and says so once", error,
                      limits.METRICS_ACCEPT_RETRY_S)

    def _expire(self, now: float) -> None:
        if self._accepting_after is not None and now >= self._accepting_after:
            self._accepting_after = None
            self._selector.register(self._listener, selectors.EVENT_READ, None)
        for connection in [each for each in self._connections.values() if now > each.deadline]:
            self._close(connection)

    # -- one connection --------------------------------------------------------------------
    def _serve(self, connection: _Connection) -> None:
        try:
            if connection.reply is None:
                self._read(connection)
            else:
                self._write(connection)
        except OSError:                    # reset by the peer, and kin: it is gone
            self._close(connection)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.socket.recv(limits.METRICS_REQUEST_SIZE_MAX + 1
                                          - len(connection.received))
        except BlockingIOError:
            return
        if not data:
            self._close(connection)        # it left before asking
            return
        connection.received += data
        end = connection.received.find(b"\r\n\r\n")
        if end >= 0:
            reply = self._reply_to(_parse_head(connection.received[:end]))
        elif len(connection.received) > limits.METRICS_REQUEST_SIZE_MAX:
            reply = ("431 Request Header Fields Too Large", [],
                     b"# request head over limits.METRICS_REQUEST_SIZE_MAX bytes\n")
        else:
            return
        connection.reply = memoryview(_encode(reply))
        connection.deadline = time.monotonic() + limits.METRICS_WRITE_TIMEOUT_S
        self._selector.modify(connection.socket, selectors.EVENT_WRITE, connection)
        self._write(connection)

    def _reply_to(self, request: tuple[str, str, dict[str, str]] | None) -> Reply:
        if request is None:
            return "400 Bad Request", [], b"# not an HTTP/1.x request\n"
        try:
            return self._respond(*request)
        except Exception:              # noqa: BLE001 - a bug must not end the endpoint
            log.exception("the metrics endpoint failed to answer a request")
            return "500 Internal Server Error", [], b"# see the broker's log\n"

    def _write(self, connection: _Connection) -> None:
        try:
            connection.sent += connection.socket.send(connection.reply[connection.sent:])
        except BlockingIOError:
            return
        connection.deadline = time.monotonic() + limits.METRICS_WRITE_TIMEOUT_S
        if connection.sent == len(connection.reply):
            connection.socket.shutdown(socket.SHUT_WR)
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        self._connections.pop(connection.socket.fileno(), None)
        try:
            self._selector.unregister(connection.socket)
        except (KeyError, ValueError):
            pass
        connection.socket.close()
        if self._over_cap and len(self._connections) < limits.METRICS_CONNECTIONS_MAX:
            self._over_cap = False
