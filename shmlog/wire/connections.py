"""One Kafka client's connection as the listener's socket server holds it: its socket, plain
or TLS, its non-blocking TLS handshake, and what it received and has to write.

Rules
-----
* Nothing here blocks: every socket is non-blocking, and each call does what the
  socket takes now and says what it waits for (:meth:`Connection.handshake`,
  :meth:`Connection.receive`, :meth:`Connection.send`). The broker's loop
  serves every connection, so one that stalls (mid-handshake, mid-request) holds
  nothing but itself.
* TLS through the ``ssl`` object, never around it: the handshake is
  ``do_handshake`` retried on SSLWantRead/WriteError as the socket becomes ready;
  a receive takes every byte OpenSSL has decrypted (``pending()``), since those
  bytes make the socket no more readable and would otherwise wait unseen; a send
  hands OpenSSL at most ``limits.KAFKA_TLS_WRITE_CHUNK_SIZE`` bytes, small buffers
  joined, and after SSLWantWriteError the same bytes again (OpenSSL's rule for a
  write retried), which holds since the buffers change only by what was sent.
* A connection of a TLS or SASL listener has ``setup_deadline``: its handshake and
  its login must be over by then (``connection_setup_timeout_ms``), or the listener
  closes it.

Theory of operation
-------------------
:class:`Security` is how a listener secures its connections (a server
``SSLContext``, SASL settings, both, or neither: its security protocol);
:class:`Connection` is one accepted socket (an ``SSLSocket`` wrapped without a
handshake on a TLS listener) with the socket server's per-connection state.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import selectors
import socket
import ssl
import struct
import time

from ..common import limits
from ..common.errors import KafkaRequestError
from .authenticator import Authenticator, SaslSettings

__all__ = ["Security", "Connection", "PLAINTEXT"]

_SIZE = struct.Struct(">i")


@dataclasses.dataclass(frozen=True)
class Security:
    """How one listener secures its connections: TLS with ``tls`` (a server
    context), SASL logins with ``sasl``; ``protocol`` is its Kafka name, ``listener``
    the listener's name (what its clients are told of: Metadata's brokers)."""
    protocol: str = "PLAINTEXT"
    listener: str = "PLAINTEXT"
    tls: ssl.SSLContext | None = None
    sasl: SaslSettings | None = None


PLAINTEXT = Security()


class Connection:
    """One accepted connection and what the socket server knows of it."""
    __slots__ = ("id", "sock", "peer", "security", "received", "in_loop", "unsent",
                 "outgoing", "last_active", "frames_waiting", "events", "handshaking", "wants",
                 "setup_deadline", "auth", "close_after_write", "read_wants_write",
                 "close_at")

    def __init__(self, connection_id: int, sock: socket.socket, peer: str,
                 security: Security, setup_s: float) -> None:
        self.id = connection_id
        self.sock = sock
        self.peer = peer
        self.security = security
        self.received = bytearray()
        # The requests read and not yet handed over, whether one is with the handlers
        # (or, before a login, with the authenticator), and how many bytes of the
        # responses are not written yet.
        self.frames_waiting: collections.deque[bytes] = collections.deque()
        self.in_loop = False
        self.unsent = 0
        self.outgoing: collections.deque[memoryview] = collections.deque()
        self.last_active = time.monotonic()
        self.events = 0                   # what the selector watches for
        self.handshaking = security.tls is not None
        self.wants = selectors.EVENT_READ           # what the handshake waits for
        self.auth = None if security.sasl is None else Authenticator(security.sasl)
        self.setup_deadline = self.last_active + setup_s \
            if self.handshaking or self.auth is not None else None
        self.close_after_write = False    # an answer that ends the connection
        self.close_at: float | None = None  # when such a connection is closed
        self.read_wants_write = False     # OpenSSL must write before it reads on

    @property
    def logged_in(self) -> bool:
        """May its requests go to the broker's loop (a SASL login done, or none)?"""
        return self.auth is None or self.auth.done

    def split_frames(self, request_size_max: int, frames: list[bytes]) -> None:
        """Move every whole request frame received to ``frames`` (the caller adds
        them to :attr:`frames_waiting` under the server's lock, those before an
        error too).

        Raises
        ------
        KafkaRequestError
            A frame's size is negative or over ``request_size_max`` (over
            ``limits.KAFKA_UNAUTHENTICATED_REQUEST_SIZE_MAX`` before a login), checked
            before its body is read.
        """
        received = self.received
        size_max = request_size_max if self.logged_in else \
            min(request_size_max, limits.KAFKA_UNAUTHENTICATED_REQUEST_SIZE_MAX)
        while len(received) >= _SIZE.size:
            (size,) = _SIZE.unpack_from(received, 0)
            if size < 0 or size > size_max:
                setting = "socket.request.max.bytes" if self.logged_in else \
                    "what a client not logged in may send (Kafka's sasl.server.max.receive.size)"
                raise KafkaRequestError(f"a request of {size} bytes is over {setting} "
                                        f"({size_max})" if size > 0 else
                                        f"a request's size field is {size}")
            if len(received) < _SIZE.size + size:
                return
            frames.append(bytes(received[_SIZE.size:_SIZE.size + size]))
            del received[:_SIZE.size + size]

    def handshake(self) -> bool:
        """Take the TLS handshake as far as the socket allows: True when it is done,
        False while it waits (:attr:`wants` says for what).

        Raises
        ------
        OSError
            The handshake failed (ssl.SSLError: a client that is not TLS, a protocol
            or certificate refused) or the peer went away.
        """
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.wants = selectors.EVENT_READ
            return False
        except ssl.SSLWantWriteError:
            self.wants = selectors.EVENT_WRITE
            return False
        self.handshaking = False
        if self.auth is None:
            self.setup_deadline = None
        return True

    def receive(self) -> bytes | None:
        """What the socket has now: None when nothing, b"" when the peer closed (or
        reset, or broke TLS)."""
        self.read_wants_write = False
        try:
            data = self.sock.recv(limits.KAFKA_RECEIVE_CHUNK_SIZE)
        except (BlockingIOError, ssl.SSLWantReadError):
            return None
        except ssl.SSLWantWriteError:
            self.read_wants_write = True
            return None
        except OSError:
            return b""
        if not data or self.security.tls is None:
            return data
        # One SSL recv gives one TLS record (16 KiB at most): read records up to a
        # chunk, and then whatever OpenSSL decrypted beyond it, which would wait
        # unseen (the socket is no more readable for it).
        chunks, total = [data], len(data)
        try:
            while total < limits.KAFKA_RECEIVE_CHUNK_SIZE or self.sock.pending():
                more = self.sock.recv(max(self.sock.pending(),
                                          limits.KAFKA_RECEIVE_CHUNK_SIZE - total))
                if not more:
                    break                  # the end: the next receive sees it
                chunks.append(more)
                total += len(more)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass                           # what was decrypted is all there was
        except OSError:
            pass                           # the next receive sees the socket's end
        return b"".join(chunks)

    def send(self) -> int | None:
        """Write what the socket takes of :attr:`outgoing`: the bytes written, None
        when it takes nothing now.

        Raises
        ------
        OSError
            The peer went away, or TLS broke.
        """
        try:
            if self.security.tls is None:
                return self.sock.sendmsg(
                    list(itertools.islice(self.outgoing, limits.KAFKA_SEND_BUFFERS_MAX)))
            return self.sock.send(self._tls_chunk())
        except (BlockingIOError, ssl.SSLWantWriteError):
            return None
        except ssl.SSLWantReadError:
            # OpenSSL wants to read before it writes: renegotiation, which the
            # context turns off (tls.py); a peer that makes it happen is broken.
            raise ConnectionError("TLS asked to read during a write (renegotiation "
                                  "is off)") from None

    def _tls_chunk(self) -> memoryview | bytes:
        """The head of :attr:`outgoing`, at most a chunk: the same bytes as long as
        nothing was sent (what OpenSSL requires after SSLWantWriteError)."""
        head = self.outgoing[0]
        size = limits.KAFKA_TLS_WRITE_CHUNK_SIZE
        if len(head) >= size or len(self.outgoing) == 1:
            return head[:size]
        parts, total = [], 0
        for buffer in self.outgoing:
            parts.append(buffer[:size - total])
            total += len(parts[-1])
            if total >= size:
                break
        return b"".join(parts)

    def sent(self, count: int) -> None:
        """Drop ``count`` bytes written from the head of :attr:`outgoing`."""
        outgoing = self.outgoing
        while count and outgoing:
            head = outgoing[0]
            if count >= len(head):
                count -= len(head)
                outgoing.popleft()
            else:
                outgoing[0] = head[count:]
                count = 0

    def close(self) -> None:
        self.sock.close()
