"""The replication transport: every ZeroMQ socket a broker uses to talk to its
peers, driven by the broker's loop. Sockets and frames only; the rules, the messages and their codec
live in ``cluster/replication/`` (``rules``, ``messages``, ``codec``, ``layout``).

Rules
-----
* One ROUTER, bound on the broker's replication endpoint, serves requests from
  every peer (``ROUTER_MANDATORY``: a reply to a peer that is gone fails and is
  dropped, never queued; ``ROUTER_HANDOVER``: a peer's new connection takes over
  its routing id from a half-dead old one). One DEALER per remote broker sends
  this broker's requests (routing id ``b"<broker id>:<broker epoch>"``;
  ``IMMEDIATE``: nothing is queued for a peer that is not connected).
* Every socket has ``LINGER`` 0, TCP keepalive and a retransmission timeout,
  bounded queues and ``MAXMSGSIZE`` (a frame past
  ``limits.REPLICATION_RECORDS_SIZE_MAX`` is refused from its length prefix and its
  connection dropped, before it is buffered) (:func:`configure_socket`).
* **No ZMTP heartbeats**: libzmq 4.3.5 aborts the whole broker
  (``Assertion failed: !_io_error (src/stream_engine_base.cpp:310)``) when a
  heartbeat comes due on a connection whose peer went away while its receive queue
  was full (the engine marks the I/O error and waits for the queue to drain, but the
  heartbeat timer writes anyway): a slow or just-resumed broker whose peers gave up
  on it and reconnected. The nemesis found it; tests/unit/test_replication_sockets.py
  shows it. The kernel's TCP keepalive and ``TCP_MAXRT`` notice a dead peer as
  quickly, with no libzmq timer.
* A request carries a correlation id (from 1 up) and a timeout. A request not
  answered in time fails (:class:`RequestFailed`) and its peer's DEALER is closed
  and opened again: that drops whatever libzmq had queued for a dead peer, and the
  peer's other requests in flight fail too. A reply whose correlation id is not in
  flight (late, or never asked) is dropped.
* CurveZMQ (``security``, the default of a cluster config): the ROUTER is a CURVE
  server, and a ZAP handler here (bound to the endpoint's own context's
  ``inproc://zeromq.zap.01``, which libzmq asks during every handshake) accepts
  only the allowed public keys. Each DEALER is a CURVE client that connects only
  to a peer whose published key is allowed: a peer whose registration names
  another key, or none, is refused and logged, never connected to (ZooKeeper is
  not trusted with keys), and requests to it fail ``NO_PEER``. Every refused
  handshake (an unknown key, a peer without CURVE) is counted
  (:attr:`ReplicationEndpoint.refused_count`, from the ROUTER's monitor) and logged,
  rate-limited. Without ``security`` the sockets are plain TCP.
* Allowed keys can be added while the broker runs: a key not in the set (a
  handshake, a registration) makes the endpoint read ``curve.allowed.public.keys.dir``
  again, at most once per ``limits.CURVE_KEYS_RELOAD_INTERVAL_S``, and a peer refused
  for its key is connected to once its key file is there. Growing a cluster is:
  copy the new broker's ``.key`` into every broker's directory, then start it.
  Keys are never dropped while running (a removed file takes a restart). libzmq
  ends a connection whose handshake the server refused and never retries it: a
  DEALER refused by a peer that did not allow this broker's key yet is reopened by
  its first request's timeout, as a dead peer's is.
* Whatever a peer sends never stops the endpoint: a request that does not decode is
  answered with an ERROR (its correlation id if the envelope was readable, else
  0) and logged; a malformed reply, or a request sent as a reply, is logged and
  dropped. An ERROR is never answered.

Theory of operation
-------------------
The owner (the broker's loop) does the socket work itself, on its own thread, as
the Kafka listener's does: a thread owning the sockets and handing each message to
the loop cost a thread wake-up and a GIL hand-over each way (with the loop spinning
on the GIL, up to the interpreter's switch interval), several per replication round
trip. Every loop turn :meth:`ReplicationEndpoint.take` pumps: whatever the sockets
hold now is received and decoded into :class:`ReceivedRequest`,
:class:`ReceivedResponse` and :class:`RequestFailed` events (no waiting: libzmq's
``EVENTS`` of each socket, no syscall unless its descriptor was signalled), ZAP
handshakes are answered and requests past their deadline fail.
:meth:`~ReplicationEndpoint.request`, :meth:`~ReplicationEndpoint.reply` and
:meth:`~ReplicationEndpoint.set_peers` send at once (libzmq's I/O thread writes). Once
idle the loop sleeps in its ``wakeup.LoopSelector``, which watches every socket's
descriptor (:meth:`ReplicationEndpoint.attach`); :attr:`ReplicationEndpoint.waiting`,
asked last before it sleeps, reads each socket's ``EVENTS``, after which anything
that arrives signals the descriptor. Records arrive as uint8 numpy views of the
received frames (``copy=False``): no copy between the socket and the log's append.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq
import itertools
import logging
import struct
import time
from typing import Mapping

import zmq
from zmq.utils.z85 import encode as z85_encode

from .cluster.replication import layout as replication_layout
from .cluster.replication.codec import decode, encode
from .cluster.replication.layout import MessageType
from .cluster.replication.messages import Error, ErrorCode, Message
from .common import limits
from .common.errors import InvalidConfigError, LocalProtocolError, ReplicationProtocolError
from .common.throttled_log import ThrottledWarnings
from .config import curve_keys

__all__ = ["ReplicationEndpoint", "ReceivedRequest", "ReceivedResponse", "RequestFailed",
           "RequestFailure", "CurveSecurity", "configure_socket"]

log = logging.getLogger("shmlog.replication")

_I32_MAX = 2**31 - 1
# Where libzmq asks a context's ZAP handler (ZeroMQ RFC 27), and its answers.
_ZAP_ADDRESS = "inproc://zeromq.zap.01"
_ZAP_VERSION = b"1.0"
_ZAP_DOMAIN = b"shmlog-replication"
# The handshakes that failed: a refused key (AUTH), no CURVE or garbage (PROTOCOL).
_REFUSALS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
             | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


@dataclasses.dataclass(frozen=True)
class CurveSecurity:
    """A broker's CurveZMQ identity and the peers it accepts (keys in Z85).

    Parameters
    ----------
    public_key, secret_key
        This broker's key pair.
    allowed_public_keys
        The peers' public keys: only these may connect to the ROUTER, and a DEALER
        connects only to a server holding one of them.
    allowed_public_keys_dir
        The directory of ``.key`` files they came from (with the configured list),
        read again by :meth:`reloaded`; None: the set is fixed.
    """
    public_key: str
    secret_key: str
    allowed_public_keys: frozenset[str]
    allowed_public_keys_dir: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "allowed_public_keys", frozenset(self.allowed_public_keys))
        for key in (self.public_key, self.secret_key, *self.allowed_public_keys):
            if not curve_keys.is_z85_key(key):
                raise LocalProtocolError(f"a CURVE key is 40 characters of Z85, got {key!r:.60}")

    @classmethod
    def from_config(cls, config) -> "CurveSecurity | None":
        """The security a :class:`~shmlog.config.cluster.ClusterConfig` names (its key
        files read now), or None when it says ``plaintext``.

        Raises
        ------
        InvalidConfigError
            A key file cannot be read or is not valid, the secret key is not the
            public key's, or no peer is allowed.
        """
        if not config.curve:
            return None
        pair = curve_keys.read_key_pair(config.curve_secret_key_file)
        if zmq.curve_public(pair.secret_key.encode()).decode() != pair.public_key:
            raise InvalidConfigError(f"curve.secret.key.file: {config.curve_secret_key_file} "
                                     f"holds a secret key that is not its public key's")
        allowed = set(config.curve_allowed_public_keys)
        if config.curve_allowed_public_keys_dir is not None:
            allowed.update(curve_keys.read_public_keys_dir(config.curve_allowed_public_keys_dir))
        if not allowed:
            raise InvalidConfigError(f"curve.allowed.public.keys.dir: "
                                     f"{config.curve_allowed_public_keys_dir} holds no .key file: "
                                     f"this broker would accept no peer")
        return cls(pair.public_key, pair.secret_key, frozenset(allowed),
                   config.curve_allowed_public_keys_dir)

    def reloaded(self) -> "CurveSecurity":
        """This security with the keys of ``allowed_public_keys_dir`` read again,
        added to those allowed (never removed while running).

        Raises
        ------
        InvalidConfigError
            The directory cannot be listed or a ``.key`` file in it is not valid.
        """
        if self.allowed_public_keys_dir is None:
            return self
        added = curve_keys.read_public_keys_dir(self.allowed_public_keys_dir)
        return dataclasses.replace(self, allowed_public_keys=self.allowed_public_keys | set(added))


class RequestFailure(enum.Enum):
    """Why a request got no reply."""
    TIMED_OUT = "timed out"                   # no reply within its timeout
    PEER_RESET = "peer reset"                 # its peer's socket was reopened or removed
    NO_PEER = "no such peer"                  # set_peers names no endpoint for it
    BACKLOG_FULL = "backlog full"             # too many requests waiting for a connection


@dataclasses.dataclass(frozen=True)
class ReceivedRequest:
    """A request from a peer; answer it with :meth:`ReplicationEndpoint.reply`."""
    route: bytes
    message: Message


@dataclasses.dataclass(frozen=True)
class ReceivedResponse:
    """The reply (possibly an ERROR) to one of this broker's requests."""
    peer_id: int
    message: Message


@dataclasses.dataclass(frozen=True)
class RequestFailed:
    """A request of this broker that will get no reply."""
    peer_id: int
    correlation_id: int
    reason: RequestFailure


class ReplicationEndpoint:
    """This broker's replication sockets, driven by their owner's loop.

    Parameters
    ----------
    broker_id, broker_epoch
        This broker's id and epoch (the envelope's sender fields, and its DEALERs'
        routing id).
    address
        The ROUTER's endpoint (``tcp://host:port``; port ``*`` picks a free one:
        :attr:`address` then holds the one bound).
    security
        CurveZMQ keys (:class:`CurveSecurity`); None: plain TCP.
    """

    def __init__(self, broker_id: int, broker_epoch: int, address: str,
                 security: CurveSecurity | None = None):
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.security = security
        self.refused_count = 0          # handshakes refused
        self._context = zmq.Context()
        router = self._context.socket(zmq.ROUTER)
        configure_socket(router)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        guards: list[zmq.Socket] = []
        try:
            if security is not None:
                guards = _guard(router, security)
            router.bind(address)
        except zmq.ZMQError:
            for socket in [router] + guards:
                socket.close(linger=0)
            self._context.term()
            raise
        self.address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._correlation_ids = itertools.count(1)
        self._closed = False
        self._sockets = _Sockets(self, router, guards)

    @property
    def public_key(self) -> str | None:
        """The CURVE public key (Z85) this endpoint serves with; None on plain TCP."""
        return None if self.security is None else self.security.public_key

    @property
    def running(self) -> bool:
        """Is the endpoint open (False once closed)?"""
        return not self._closed

    # -- the owner's loop -----------------------------------------------------------------
    def attach(self, selector) -> None:
        """Have ``selector`` (the owner's ``wakeup.LoopSelector``) watch every socket
        here from now on, those opened later too: its sleep ends when one has
        something to do, and the next :meth:`pump` does it."""
        self._sockets.attach(selector)

    def pump(self) -> None:
        """Do what the sockets allow now, without waiting: receive (queueing events
        for :meth:`take`, up to ``limits.REPLICATION_INBOUND_QUEUED_MAX``), answer
        handshakes, send what waited for a connection, expire requests."""
        self._check_open()
        self._sockets.pump()

    @property
    def waiting(self) -> bool:
        """Is an event waiting, or a socket ready to be pumped? (What the owner asks
        last before it sleeps: a socket's readiness, read here, is what makes its
        descriptor signal anything that comes after.)"""
        return bool(self._sockets.events) or (not self._closed and self._sockets.ready())

    def take(self, limit: int = limits.REPLICATION_INBOUND_QUEUED_MAX) -> list:
        """Pump, then the events received so far (at most ``limit``), oldest first:
        :class:`ReceivedRequest`, :class:`ReceivedResponse`, :class:`RequestFailed`."""
        if not self._closed:
            self._sockets.pump()
        events = self._sockets.events
        taken = []
        while events and len(taken) < limit:
            taken.append(events.popleft())
        return taken

    def wait(self, timeout_s: float) -> None:
        """Sleep until a socket has something to do or ``timeout_s`` passes, then
        pump: for an owner without a loop of its own (tools, tests, benchmarks)."""
        self._check_open()
        self._sockets.wait(timeout_s)
        self._sockets.pump()

    # -- commands ---------------------------------------------------------------------------
    def request(self, peer_id: int, body,
                timeout_ms: int = limits.REPLICATION_REQUEST_TIMEOUT_MS_DEFAULT) -> int:
        """Send a request (a FETCH, EPOCH_END or PRODUCE body) to broker
        ``peer_id``; returns its correlation id. Its reply comes back as a
        :class:`ReceivedResponse`, or a :class:`RequestFailed` after ``timeout_ms``.
        A fetcher passes its ``max_wait_ms`` plus ``replica.socket.timeout.ms``
        (design note §3.1).

        Raises
        ------
        LocalProtocolError
            The endpoint is closed, or the message is invalid (``encode``).
        """
        self._check_open()
        for name, value, high in (("peer_id", peer_id, _I32_MAX),
                                  ("timeout_ms", timeout_ms, limits.CLIENT_WAIT_MS_MAX)):
            if type(value) is not int or not 0 <= value <= high:
                raise LocalProtocolError(f"{name} must be an integer in [0, {high}], "
                                         f"got {value!r:.80}")
        correlation_id = next(self._correlation_ids)
        frames = encode(Message(self.broker_id, self.broker_epoch, correlation_id, body))
        self._sockets.send_request(peer_id, time.monotonic() + timeout_ms / 1000,
                                   correlation_id, frames)
        return correlation_id

    def reply(self, to: ReceivedRequest, body) -> None:
        """Answer a request with ``body``."""
        self._check_open()
        frames = encode(Message(self.broker_id, self.broker_epoch,
                                to.message.correlation_id, body))
        self._sockets.send_reply(to.route, frames)

    def set_peers(self, peers: Mapping[int, str],
                  public_keys: Mapping[int, str | None] | None = None) -> None:
        """The endpoints of the other brokers (``{broker id: "tcp://host:port"}``,
        from the cluster metadata; this broker's own id is ignored) and the CURVE
        public keys their registrations publish (``{broker id: Z85 key or None}``;
        unused on plain TCP). With CURVE a peer whose key is missing or not allowed
        is refused and logged, never connected to. A peer removed, moved or
        re-keyed fails its requests in flight (``PEER_RESET``)."""
        self._check_open()
        public_keys = public_keys or {}
        table = {}
        for peer_id, endpoint in peers.items():
            if type(peer_id) is not int or not isinstance(endpoint, str):
                raise LocalProtocolError(f"peers map broker ids to endpoints, got "
                                         f"{peer_id!r}: {endpoint!r}")
            public_key = public_keys.get(peer_id)
            if public_key is not None and not isinstance(public_key, str):
                raise LocalProtocolError(f"a public key is a Z85 string, got {public_key!r:.60}")
            if peer_id != self.broker_id:
                table[peer_id] = (endpoint, public_key)
        self._sockets.set_peers(table)

    def close(self) -> None:
        """Close every socket; unanswered requests are dropped."""
        if self._closed:
            return
        self._closed = True
        self._sockets.close()
        self._context.term()

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the replication endpoint is closed")


def _guard(router: zmq.Socket, security: CurveSecurity) -> list[zmq.Socket]:
    """Make ``router`` a CURVE server whose handshakes its context's ZAP handler
    judges; returns the handler's socket and the ROUTER's monitor (made before the
    bind, so no handshake comes before them)."""
    zap = router.context.socket(zmq.ROUTER)
    zap.setsockopt(zmq.LINGER, 0)
    try:
        zap.bind(_ZAP_ADDRESS)
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.setsockopt(zmq.CURVE_SECRETKEY, security.secret_key.encode())
        router.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
        monitor = router.get_monitor_socket(_REFUSALS)
    except zmq.ZMQError:
        zap.close(linger=0)
        raise
    return [zap, monitor]


def configure_socket(socket: zmq.Socket) -> None:
    """Set the options every replication socket shares (module rules, limits)."""
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.MAXMSGSIZE, limits.REPLICATION_RECORDS_SIZE_MAX)
    socket.setsockopt(zmq.SNDHWM, limits.REPLICATION_SOCKET_QUEUED_MAX)
    socket.setsockopt(zmq.RCVHWM, limits.REPLICATION_SOCKET_QUEUED_MAX)
    # Dead peers are noticed by the kernel, never by ZMTP heartbeats (module rules).
    socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
    socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, limits.REPLICATION_KEEPALIVE_IDLE_S)
    socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, limits.REPLICATION_KEEPALIVE_INTERVAL_S)
    socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, limits.REPLICATION_KEEPALIVE_PROBES)
    socket.setsockopt(zmq.TCP_MAXRT, limits.REPLICATION_RETRANSMIT_TIMEOUT_MS)


@dataclasses.dataclass
class _Peer:
    peer_id: int
    endpoint: str
    public_key: str | None
    socket: zmq.Socket
    backlog: list                        # frames waiting for the connection


class _Sockets:
    """The endpoint's sockets and what is in flight on them (every method runs on
    the owner's thread)."""

    def __init__(self, endpoint: ReplicationEndpoint, router: zmq.Socket,
                 guards: list[zmq.Socket]):
        self.endpoint = endpoint
        self.router = router
        self.events: collections.deque = collections.deque()
        self.peers: dict[int, _Peer] = {}
        self.in_flight: dict[int, tuple[int, float]] = {}   # correlation id -> (peer, deadline)
        self.deadlines: list[tuple[float, int]] = []
        self.warnings = _warnings()
        self.security = endpoint.security
        self.refused_peers: dict[int, tuple[str, str | None]] = {}   # logged, not connected
        self.zap, self.monitor = guards if guards else (None, None)
        self.key_warnings, self.handshake_warnings = _warnings(), _warnings()
        self.keys_read_at = time.monotonic()                 # security's keys, as of then
        self.selector = None                                 # the owner's, once attached

    def sockets(self) -> list[zmq.Socket]:
        return [socket for socket in (self.zap, self.monitor, self.router)
                if socket is not None] + [peer.socket for peer in self.peers.values()]

    def attach(self, selector) -> None:
        self.selector = selector
        for socket in self.sockets():
            selector.watch(socket.getsockopt(zmq.FD))

    # --- one pump ----------------------------------------------------------------------

    def pump(self) -> None:
        """Everything the sockets allow now (no waiting). ``EVENTS`` is read from
        each: libzmq's descriptor of a socket signals only changes since it was."""
        if self.zap is not None:
            while self.zap.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._authenticate(self.zap.recv_multipart())
            while self.monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._refused(self.monitor.recv_multipart())
        room = limits.REPLICATION_INBOUND_QUEUED_MAX - len(self.events)
        while room > 0 and self.router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._serve(self.router.recv_multipart(copy=False))
            room -= 1
        for peer in list(self.peers.values()):
            events = peer.socket.getsockopt(zmq.EVENTS)
            if peer.backlog and events & zmq.POLLOUT:
                self._flush(peer)
            while room > 0 and events & zmq.POLLIN:
                self._response(peer, peer.socket.recv_multipart(copy=False))
                room -= 1
                events = peer.socket.getsockopt(zmq.EVENTS)
        if self.deadlines:
            self._expire(time.monotonic())
        if self.refused_peers:
            self._retry_refused()

    def ready(self) -> bool:
        """Would a pump find something to do now?"""
        if len(self.events) >= limits.REPLICATION_INBOUND_QUEUED_MAX:
            return False
        for socket in self.sockets():
            if socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return True
        return any(peer.backlog and peer.socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT
                   for peer in self.peers.values())

    def wait(self, timeout_s: float) -> None:
        """Sleep until a socket has something to do or ``timeout_s`` passes."""
        poller = zmq.Poller()
        for socket in self.sockets():
            poller.register(socket, zmq.POLLIN)
        for peer in self.peers.values():
            if peer.backlog:
                poller.register(peer.socket, zmq.POLLIN | zmq.POLLOUT)
        if self.deadlines:
            timeout_s = min(timeout_s, max(0.0, self.deadlines[0][0] - time.monotonic()))
        poller.poll(int(timeout_s * 1000) + 1)

    def close(self) -> None:
        for socket in self.sockets():
            self._forget(socket)
            socket.close(linger=0)

    def _forget(self, socket: zmq.Socket) -> None:
        """Stop the owner's selector watching ``socket`` (about to close)."""
        if self.selector is not None:
            self.selector.unwatch(socket.getsockopt(zmq.FD))

    def _emit(self, event) -> None:
        self.events.append(event)

    def send_request(self, peer_id: int, deadline: float, correlation_id: int,
                      frames: list) -> None:
        peer = self.peers.get(peer_id)
        if peer is None:
            self._emit(RequestFailed(peer_id, correlation_id, RequestFailure.NO_PEER))
            return
        if len(peer.backlog) >= limits.REPLICATION_PEER_BACKLOG_MAX:
            self._emit(RequestFailed(peer_id, correlation_id, RequestFailure.BACKLOG_FULL))
            return
        self.in_flight[correlation_id] = (peer_id, deadline)
        heapq.heappush(self.deadlines, (deadline, correlation_id))
        peer.backlog.append(frames)
        self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        """Send what waits for the peer's connection, oldest first, while it takes."""
        while peer.backlog:
            try:
                peer.socket.send_multipart(peer.backlog[0], zmq.NOBLOCK, copy=False)
            except zmq.Again:            # not connected yet (IMMEDIATE), or its queue is full
                return
            del peer.backlog[0]

    def send_reply(self, route: bytes, frames: list) -> None:
        try:
            self.router.send_multipart([route] + frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as error:    # gone (EHOSTUNREACH) or not reading (EAGAIN)
            self.warnings.warn("reply to %r dropped: %s", route, error)

    def set_peers(self, peers: dict[int, tuple[str, str | None]]) -> None:
        """Connect to the peers given (endpoint, public key), drop the others."""
        for peer_id, peer in list(self.peers.items()):
            if peers.get(peer_id) != (peer.endpoint, peer.public_key):
                self._drop_peer(peer)
        for peer_id in list(self.refused_peers):
            if peers.get(peer_id) != self.refused_peers[peer_id]:
                del self.refused_peers[peer_id]
        for peer_id, (endpoint, public_key) in peers.items():
            if peer_id not in self.peers and peer_id not in self.refused_peers:
                if self._trusted(peer_id, endpoint, public_key):
                    self._open_peer(peer_id, endpoint, public_key)
                else:
                    self.refused_peers[peer_id] = (endpoint, public_key)

    def _trusted(self, peer_id: int, endpoint: str, public_key: str | None) -> bool:
        """May this broker connect to the peer? On plain TCP always; with CURVE only
        to a key it was configured to allow (logged once per registration)."""
        if self.security is None or self._allows(public_key):
            return True
        log.error("broker %d at %s is not connected to: its registration names %s, which "
                  "is not in this broker's allowed public keys (curve.allowed.public.keys)",
                  peer_id, endpoint, "no CURVE key" if public_key is None else
                  f"CURVE key {public_key}")
        return False

    def _open_peer(self, peer_id: int, endpoint: str, public_key: str | None) -> None:
        socket = self.router.context.socket(zmq.DEALER)
        configure_socket(socket)
        if self.security is not None:
            socket.setsockopt(zmq.CURVE_SERVERKEY, public_key.encode())
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self.security.public_key.encode())
            socket.setsockopt(zmq.CURVE_SECRETKEY, self.security.secret_key.encode())
        socket.setsockopt(zmq.ROUTING_ID, f"{self.endpoint.broker_id}:"
                                          f"{self.endpoint.broker_epoch}".encode())
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.RECONNECT_IVL, limits.REPLICATION_RECONNECT_INTERVAL_MS)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, limits.REPLICATION_RECONNECT_INTERVAL_MS_MAX)
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as error:
            log.error("cannot connect to broker %d at %r: %s", peer_id, endpoint, error)
            socket.close(linger=0)
            return
        self.peers[peer_id] = _Peer(peer_id, endpoint, public_key, socket, [])
        if self.selector is not None:
            self.selector.watch(socket.getsockopt(zmq.FD))

    def _drop_peer(self, peer: _Peer, reason: RequestFailure = RequestFailure.PEER_RESET) -> None:
        """Close a peer's DEALER (dropping what libzmq queued for it) and fail its
        requests in flight."""
        del self.peers[peer.peer_id]
        self._forget(peer.socket)
        peer.socket.close(linger=0)
        for correlation_id, (peer_id, _) in list(self.in_flight.items()):
            if peer_id == peer.peer_id:
                del self.in_flight[correlation_id]
                self._emit(RequestFailed(peer_id, correlation_id, reason))

    def _expire(self, now: float) -> None:
        while self.deadlines and self.deadlines[0][0] <= now:
            _, correlation_id = heapq.heappop(self.deadlines)
            entry = self.in_flight.pop(correlation_id, None)
            if entry is None:
                continue                 # answered meanwhile
            peer_id = entry[0]
            self._emit(RequestFailed(peer_id, correlation_id, RequestFailure.TIMED_OUT))
            peer = self.peers.get(peer_id)
            if peer is not None:
                log.info("broker %d did not answer request %d in time: reconnecting",
                         peer_id, correlation_id)
                self._drop_peer(peer)
                self._open_peer(peer_id, peer.endpoint, peer.public_key)

    # --- who may connect (CURVE) -----------------------------------------------------

    def _allows(self, public_key: str | None) -> bool:
        """Is ``public_key`` allowed (the directory read again if it is not known)?"""
        if public_key is None:
            return False
        if public_key not in self.security.allowed_public_keys:
            self._reload_keys()
        return public_key in self.security.allowed_public_keys

    def _reload_keys(self) -> None:
        """Read the allowed keys' directory again, at most once per interval."""
        now = time.monotonic()
        if self.security.allowed_public_keys_dir is None or \
                now - self.keys_read_at < limits.CURVE_KEYS_RELOAD_INTERVAL_S:
            return
        self.keys_read_at = now
        try:
            self.security = self.security.reloaded()
        except InvalidConfigError as error:      # an operator's half-copied file: next time
            self.key_warnings.warn("the allowed public keys were not read again: %s", error)

    def _retry_refused(self) -> None:
        """Connect to the refused peers whose keys the directory allows by now."""
        self._reload_keys()
        for peer_id, (endpoint, public_key) in list(self.refused_peers.items()):
            if public_key in self.security.allowed_public_keys:
                del self.refused_peers[peer_id]
                log.info("broker %d's CURVE key %s is allowed now: connecting to %s",
                         peer_id, public_key, endpoint)
                self._open_peer(peer_id, endpoint, public_key)

    def _authenticate(self, frames: list) -> None:
        """Answer a ZAP request (RFC 27): 200 for an allowed CURVE key, else 400."""
        if len(frames) < 9 or frames[1] != b"" or frames[2] != _ZAP_VERSION:
            log.error("a malformed ZAP request from libzmq (%d frames): ignored", len(frames))
            return
        request_id, address, mechanism, credentials = frames[3], frames[5], frames[7], frames[8]
        public_key = z85_encode(credentials).decode() \
            if mechanism == b"CURVE" and len(credentials) == 32 else None
        allowed = self._allows(public_key)
        if not allowed:
            self.key_warnings.warn("refused a replication connection from %s: CURVE key "
                                   "%s is not allowed", address.decode(errors="replace"),
                                   public_key)
        status = (b"200", b"OK") if allowed else (b"400", b"public key not allowed")
        self.zap.send_multipart([frames[0], b"", _ZAP_VERSION, request_id, *status,
                                 (public_key or "").encode(), b""])

    def _refused(self, frames: list) -> None:
        """A handshake the ROUTER refused (its monitor's event): count and log it."""
        event, value = struct.unpack("=HI", frames[0][:6])     # zmq_socket_monitor's layout
        self.endpoint.refused_count += 1
        kind = "an unknown key" if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH else \
            f"a failed handshake (error {value:#x}: no CURVE, or not ZeroMQ)"
        self.handshake_warnings.warn("refused a replication connection: %s (%d refused so far)",
                                     kind, self.endpoint.refused_count)

    # --- what peers send -------------------------------------------------------------

    def _serve(self, frames: list) -> None:
        """A message on the ROUTER: a request to queue, or something to refuse."""
        route, frames = frames[0].bytes, frames[1:]
        try:
            message = decode([frame.buffer for frame in frames])
        except ReplicationProtocolError as error:
            self.warnings.warn("malformed replication request from %r: %s", route, error)
            correlation_id, message_type = _readable_envelope(frames)
            if message_type is not MessageType.ERROR:
                self._refuse(route, correlation_id, str(error))
            return
        if message.message_type in replication_layout.REQUEST_TYPES:
            self._emit(ReceivedRequest(route, message))
        elif message.message_type is not MessageType.ERROR:
            self.warnings.warn("a %s sent as a request by %r", message.message_type.name, route)
            self._refuse(route, message.correlation_id,
                         f"a {message.message_type.name} is not a request")

    def _refuse(self, route: bytes, correlation_id: int, reason: str) -> None:
        body = Error(ErrorCode.INVALID_REQUEST, reason)
        frames = encode(Message(self.endpoint.broker_id, self.endpoint.broker_epoch,
                                correlation_id, body))
        self.send_reply(route, frames)

    def _response(self, peer: _Peer, frames: list) -> None:
        """A message on a peer's DEALER: the reply to a request in flight, or dropped."""
        try:
            message = decode([frame.buffer for frame in frames])
        except ReplicationProtocolError as error:
            self.warnings.warn("malformed replication reply from broker %d: %s",
                               peer.peer_id, error)
            return
        entry = self.in_flight.get(message.correlation_id)
        if message.message_type in replication_layout.REQUEST_TYPES or entry is None \
                or entry[0] != peer.peer_id:
            log.debug("dropped a %s from broker %d with correlation id %d (late or unasked)",
                      message.message_type.name, peer.peer_id, message.correlation_id)
            return
        del self.in_flight[message.correlation_id]
        self._emit(ReceivedResponse(peer.peer_id, message))


def _readable_envelope(frames: list) -> tuple[int, MessageType | None]:
    """The correlation id and type of a message whose envelope is ours, else (0, None)."""
    if not frames or len(frames[0]) != replication_layout.ENVELOPE_LENGTH:
        return 0, None
    magic, version, type_number, _, _, correlation_id = \
        struct.unpack(replication_layout.ENVELOPE_FORMAT, frames[0].bytes)
    if magic != replication_layout.MAGIC or correlation_id < 0:
        return 0, None
    known = type_number in _TYPE_NUMBERS
    return correlation_id, MessageType(type_number) if known else None


_TYPE_NUMBERS = frozenset(int(message_type) for message_type in MessageType)


def _warnings() -> ThrottledWarnings:
    """Warnings about what peers send (a peer sending garbage in a loop must not
    flood the log)."""
    return ThrottledWarnings(log, limits.REPLICATION_WARNING_INTERVAL_S)
