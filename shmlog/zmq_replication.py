"""The replication transport: one thread that owns every ZeroMQ socket a broker uses
to talk to its peers. Sockets and frames only; the rules, the messages and their codec
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
  server, and a ZAP handler on this thread (bound to the endpoint's own context's
  ``inproc://zeromq.zap.01``, which libzmq asks during every handshake) accepts
  only the allowed public keys. Each DEALER is a CURVE client that connects only
  to a peer whose published key is allowed: a peer whose registration names
  another key, or none, is refused and logged, never connected to (ZooKeeper is
  not trusted with keys), and requests to it fail ``NO_PEER``. Every refused
  handshake (an unknown key, a peer without CURVE) is counted
  (:attr:`ReplicationEndpoint.refused_count`, from the ROUTER's monitor) and logged,
  rate-limited. Without ``security`` the sockets are plain TCP.
* Allowed keys can be added while the broker runs: a key not in the set (a
  handshake, a registration) makes the thread read ``curve.allowed.public.keys.dir``
  again, at most once per ``limits.CURVE_KEYS_RELOAD_INTERVAL_S``, and a peer refused
  for its key is connected to once its key file is there. Growing a cluster is:
  copy the new broker's ``.key`` into every broker's directory, then start it.
  Keys are never dropped while running (a removed file takes a restart). libzmq
  ends a connection whose handshake the server refused and never retries it: a
  DEALER refused by a peer that did not allow this broker's key yet is reopened by
  its first request's timeout, as a dead peer's is.
* Whatever a peer sends never ends the thread: a request that does not decode is
  answered with an ERROR (its correlation id if the envelope was readable, else
  0) and logged; a malformed reply, or a request sent as a reply, is logged and
  dropped. An ERROR is never answered.

Theory of operation
-------------------
The owner (the broker's loop) calls :meth:`ReplicationEndpoint.request`,
:meth:`~ReplicationEndpoint.reply` and :meth:`~ReplicationEndpoint.set_peers` from
its own thread: each encodes on the caller's thread and passes the frames through an
in-process PUSH socket, which the endpoint's thread polls with its other sockets
(zero-copy: a records view travels as it is). What arrives is decoded on the
endpoint's thread into :class:`ReceivedRequest`, :class:`ReceivedResponse` and
:class:`RequestFailed` events, queued for the owner, and ``wake()`` (the broker's
doorbell) is called, as ``control_server.ControlEndpoint`` does. Records arrive as
uint8 numpy views of the received frames (``copy=False``): no copy between the
socket and the log's append.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import json
import logging
import queue
import struct
import threading
import time
from typing import Callable, Mapping

import zmq
from zmq.utils.z85 import encode as z85_encode

from .cluster.replication import layout as replication_layout
from .cluster.replication.codec import decode, encode
from .cluster.replication.layout import MessageType
from .cluster.replication.messages import Error, ErrorCode, Message
from .common import limits
from .common.errors import InvalidConfigError, LocalProtocolError, ReplicationProtocolError
from .config import curve_keys

__all__ = ["ReplicationEndpoint", "ReceivedRequest", "ReceivedResponse", "RequestFailed",
           "RequestFailure", "CurveSecurity", "configure_socket"]

log = logging.getLogger("shmlog.replication")

# Commands the owner sends the thread (first frame: a kind byte, then its fields).
_REQUEST = struct.Struct("<cidq")       # b"Q", peer id, deadline (monotonic s), correlation id
_REPLY = b"R"                           # b"R" + the requester's routing id
_PEERS = b"P"                           # b"P" + JSON {broker id: [endpoint, public key]}
_STOP = b"S"
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
    """This broker's replication sockets and the thread that owns them.

    Parameters
    ----------
    broker_id, broker_epoch
        This broker's id and epoch (the envelope's sender fields, and its DEALERs'
        routing id).
    address
        The ROUTER's endpoint (``tcp://host:port``; port ``*`` picks a free one:
        :attr:`address` then holds the one bound).
    wake
        Called (on the endpoint's thread) after events were queued: the broker's
        doorbell ``ring``.
    security
        CurveZMQ keys (:class:`CurveSecurity`); None: plain TCP.
    """

    _instances = itertools.count()

    def __init__(self, broker_id: int, broker_epoch: int, address: str,
                 wake: Callable[[], None] | None = None, security: CurveSecurity | None = None):
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.security = security
        self.refused_count = 0          # handshakes refused (written by the thread)
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
        inbox_address = f"inproc://shmlog-replication-{next(self._instances)}"
        inbox = self._context.socket(zmq.PULL)
        inbox.setsockopt(zmq.RCVHWM, limits.REPLICATION_OUTBOUND_QUEUED_MAX)
        inbox.bind(inbox_address)
        self._outbox = self._context.socket(zmq.PUSH)           # the owner's
        self._outbox.setsockopt(zmq.SNDHWM, limits.REPLICATION_OUTBOUND_QUEUED_MAX)
        self._outbox.connect(inbox_address)
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._correlation_ids = itertools.count(1)
        self._closed = False
        self._thread = _EndpointThread(self, router, inbox, self._events, wake, guards)
        self._thread.start()

    @property
    def public_key(self) -> str | None:
        """The CURVE public key (Z85) this endpoint serves with; None on plain TCP."""
        return None if self.security is None else self.security.public_key

    @property
    def running(self) -> bool:
        """Is the endpoint's thread running (False once closed)?"""
        return self._thread.is_alive()

    @property
    def waiting(self) -> bool:
        """Is an event waiting for the owner?"""
        return not self._events.empty()

    def take(self, limit: int = limits.REPLICATION_INBOUND_QUEUED_MAX) -> list:
        """The events received so far (at most ``limit``), oldest first:
        :class:`ReceivedRequest`, :class:`ReceivedResponse`, :class:`RequestFailed`."""
        events = []
        while len(events) < limit:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        return events

    def request(self, peer_id: int, body,
                timeout_ms: int = limits.REPLICATION_REQUEST_TIMEOUT_MS_DEFAULT) -> int:
        """Send a request (a FETCH, EPOCH_END or PRODUCE body) to broker
        ``peer_id``; returns its correlation id. Its reply comes back as a
        :class:`ReceivedResponse`, or a :class:`RequestFailed` after ``timeout_ms``
        (from the owner's thread only). A fetcher passes its ``max_wait_ms`` plus
        ``replica.socket.timeout.ms`` (design note §3.1).

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
        deadline = time.monotonic() + timeout_ms / 1000
        command = _REQUEST.pack(b"Q", peer_id, deadline, correlation_id)
        if not self._pass([command] + frames):
            self._events.put(RequestFailed(peer_id, correlation_id, RequestFailure.BACKLOG_FULL))
        return correlation_id

    def reply(self, to: ReceivedRequest, body) -> None:
        """Answer a request with ``body`` (from the owner's thread only)."""
        self._check_open()
        frames = encode(Message(self.broker_id, self.broker_epoch,
                                to.message.correlation_id, body))
        if not self._pass([_REPLY + to.route] + frames):
            log.warning("reply %d to %r dropped: the replication thread is not keeping up",
                        to.message.correlation_id, to.route)

    def _pass(self, frames: list) -> bool:
        """Hand frames to the thread without ever blocking the owner; False if its
        queue is full (the thread stopped, or is far behind)."""
        try:
            self._outbox.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

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
                table[str(peer_id)] = [endpoint, public_key]
        if not self._pass([_PEERS + json.dumps(table).encode()]):
            log.error("the peers update was dropped: the replication thread is not keeping up")

    def close(self) -> None:
        """Stop the thread (bounded by ``limits.REPLICATION_CLOSE_TIMEOUT_S``) and
        close every socket; unanswered requests are dropped."""
        if self._closed:
            return
        self._closed = True
        self._pass([_STOP])              # a thread that is gone needs no telling
        self._thread.join(timeout=limits.REPLICATION_CLOSE_TIMEOUT_S)
        self._outbox.close(linger=0)
        if self._thread.is_alive():
            log.error("the replication thread did not stop within %.1f s; its sockets leak",
                      limits.REPLICATION_CLOSE_TIMEOUT_S)
            return
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


class _EndpointThread(threading.Thread):
    """The thread that owns the sockets (every method runs on it)."""

    def __init__(self, endpoint: ReplicationEndpoint, router: zmq.Socket, inbox: zmq.Socket,
                 events: queue.SimpleQueue, wake: Callable[[], None] | None,
                 guards: list[zmq.Socket]):
        super().__init__(name=f"shmlog-replication-{endpoint.broker_id}", daemon=True)
        self.endpoint = endpoint
        self.router = router
        self.inbox = inbox
        self.events = events
        self.wake = wake
        self.peers: dict[int, _Peer] = {}
        self.by_socket: dict[zmq.Socket, _Peer] = {}
        self.in_flight: dict[int, tuple[int, float]] = {}   # correlation id -> (peer, deadline)
        self.deadlines: list[tuple[float, int]] = []
        self.queued = 0                                      # events since the last wake
        self.warnings = _Warnings()
        self.security = endpoint.security
        self.refused_peers: dict[int, tuple[str, str | None]] = {}   # logged, not connected
        self.zap, self.monitor = guards if guards else (None, None)
        self.key_warnings, self.handshake_warnings = _Warnings(), _Warnings()
        self.keys_read_at = time.monotonic()                 # security's keys, as of then
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)
        for guard in guards:
            self.poller.register(guard, zmq.POLLIN)
        self.watched: dict[zmq.Socket, int] = {}            # and how, besides the inbox

    def run(self) -> None:
        try:
            while self._turn():
                pass
        except Exception:                 # a bug: say so where the broker's log shows it
            log.exception("the replication thread failed")
            raise
        finally:
            for socket in [self.router, self.inbox] + [peer.socket for peer in self.peers.values()]:
                socket.close(linger=0)
            if self.zap is not None:
                self.zap.close(linger=0)
                self.monitor.close(linger=0)

    def _turn(self) -> bool:
        """One poll and what it found; False once the owner asked to stop."""
        reading = zmq.POLLIN if self.events.qsize() < limits.REPLICATION_INBOUND_QUEUED_MAX else 0
        self._watch(self.router, reading)
        for peer in self.peers.values():
            self._watch(peer.socket, reading | (zmq.POLLOUT if peer.backlog else 0))
        ready = dict(self.poller.poll(self._poll_timeout_ms()))
        if self.inbox in ready and not self._commands():
            return False
        if self.zap in ready:
            self._authenticate(self.zap.recv_multipart())
        if self.monitor in ready:
            self._refused(self.monitor.recv_multipart())
        if ready.get(self.router, 0) & zmq.POLLIN:
            self._serve(self.router.recv_multipart(copy=False))
        for socket, flags in ready.items():
            peer = self.by_socket.get(socket)
            if peer is None:
                continue
            if flags & zmq.POLLOUT:
                self._flush(peer)
            if flags & zmq.POLLIN:
                self._response(peer, socket.recv_multipart(copy=False))
        self._expire(time.monotonic())
        if self.refused_peers:
            self._retry_refused()
        if self.queued:
            self.queued = 0
            if self.wake is not None:
                self.wake()
        return True

    def _watch(self, socket: zmq.Socket, flags: int) -> None:
        """Poll ``socket`` for ``flags`` (0: not at all) from the next poll on."""
        if self.watched.get(socket, 0) == flags:
            return
        if flags:
            self.poller.register(socket, flags)
            self.watched[socket] = flags
        else:
            self.poller.unregister(socket)
            del self.watched[socket]

    def _poll_timeout_ms(self) -> int:
        while self.deadlines and self.deadlines[0][1] not in self.in_flight:
            heapq.heappop(self.deadlines)
        timeout = limits.REPLICATION_POLL_MS
        if self.deadlines:
            until_ms = int((self.deadlines[0][0] - time.monotonic()) * 1000) + 1
            timeout = min(timeout, max(0, until_ms))
        return timeout

    def _emit(self, event) -> None:
        self.events.put(event)
        self.queued += 1

    # --- the owner's commands --------------------------------------------------------

    def _commands(self) -> bool:
        """Carry out every command waiting; False on stop."""
        while True:
            try:
                frames = self.inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            command = frames[0].bytes
            kind = command[:1]
            if kind == _STOP:
                return False
            if kind == b"Q":
                _, peer_id, deadline, correlation_id = _REQUEST.unpack(command)
                self._send_request(peer_id, deadline, correlation_id, frames[1:])
            elif kind == _REPLY:
                self._send_reply(command[1:], frames[1:])
            else:
                assert kind == _PEERS, command[:16]
                self._set_peers({int(peer_id): tuple(address)
                                 for peer_id, address in json.loads(command[1:]).items()})

    def _send_request(self, peer_id: int, deadline: float, correlation_id: int,
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

    def _send_reply(self, route: bytes, frames: list) -> None:
        try:
            self.router.send_multipart([route] + frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as error:    # gone (EHOSTUNREACH) or not reading (EAGAIN)
            self.warnings.warn("reply to %r dropped: %s", route, error)

    def _set_peers(self, peers: dict[int, tuple[str, str | None]]) -> None:
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
        peer = _Peer(peer_id, endpoint, public_key, socket, [])
        self.peers[peer_id] = peer
        self.by_socket[socket] = peer

    def _drop_peer(self, peer: _Peer, reason: RequestFailure = RequestFailure.PEER_RESET) -> None:
        """Close a peer's DEALER (dropping what libzmq queued for it) and fail its
        requests in flight."""
        del self.peers[peer.peer_id]
        del self.by_socket[peer.socket]
        self._watch(peer.socket, 0)
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
        self._send_reply(route, frames)

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


class _Warnings:
    """Warnings about what peers send, at most one per
    ``limits.REPLICATION_WARNING_INTERVAL_S`` (a peer sending garbage in a loop must
    not flood the log); the next one says how many were suppressed."""

    def __init__(self) -> None:
        self.last = float("-inf")
        self.suppressed = 0

    def warn(self, message: str, *args) -> None:
        now = time.monotonic()
        if now - self.last < limits.REPLICATION_WARNING_INTERVAL_S:
            self.suppressed += 1
            return
        if self.suppressed:
            message += f" ({self.suppressed} similar warnings suppressed)"
        self.last, self.suppressed = now, 0
        log.warning(message, *args)
