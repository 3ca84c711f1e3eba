"""The broker's control endpoint: the one module of the broker that uses ZeroMQ
(clients have theirs in ``protocol/control_client.py``; replication has
``zmq_replication.py``).

Rules
-----
* No client can grow the broker's memory or starve the others: ZeroMQ buffers at
  most ``limits.CONTROL_PEER_RECEIVE_HWM`` messages of one client before it stops
  reading its connection, and the broker keeps at most
  ``limits.CONTROL_PEER_REQUESTS_MAX`` of one client's requests unanswered and
  ``limits.CONTROL_PEER_BYTES_MAX`` bytes of them waiting; a request past either is
  answered at once with :class:`TooManyRequestsInFlightError`, never queued.
* The loop takes waiting requests one client at a time, in turn: another client's
  ping waits for at most one request of a client that floods.
* A frame over ``limits.CONTROL_FRAME_SIZE_MAX`` is answered at once with
  :class:`ControlRequestTooLargeError`, unparsed; one over
  ``limits.CONTROL_FRAME_RECEIVED_SIZE_MAX`` (ZeroMQ's MAXMSGSIZE) disconnects its
  sender unread (see ``limits``: the client checks the size before it sends, so
  only a client that skipped the check meets either). A malformed envelope is
  refused at once, so no client waits for a reply that never comes.

Theory of operation
-------------------
A thread owns a ROUTER socket bound to the data directory's ``ipc://`` address and
queues each request for the broker's loop (:class:`_Waiting`: a queue per client,
and each client's count of requests in flight), ringing the doorbell the loop may
sleep on; the loop answers from its own thread and passes replies back through an
in-process pair of sockets, which the thread sends on, counting each client's
request answered. Replies may come in any order and later than their request (a
join waits for its rebalance): the ROUTER socket routes each to its client by
identity.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque

import zmq

from ..common import access, limits
from ..common.errors import (
    BrokerNotAvailableError,
    LocalProtocolError,
    ShmlogError,
    TooManyRequestsInFlightError,
)
from ..common.paths import control_path
from ..protocol.control import error_reply, request_too_large

__all__ = ["ControlEndpoint", "remove_control_socket"]

log = logging.getLogger("shmlog.broker")


def remove_control_socket(data_dir: str) -> None:
    """After a clean stop, no socket file is left (a client then fails at once)."""
    path = control_path(data_dir)
    for remove in (lambda: os.unlink(path), lambda: os.rmdir(os.path.dirname(path))):
        try:
            remove()
        except OSError:
            pass                     # gone, or run/ holds something else: keep it


class _Waiting:
    """The requests waiting for the loop, a queue per client taken in turn, and each
    client's requests in flight (received, not yet answered) and bytes waiting. The
    control thread admits requests and counts replies; the loop takes requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[bytes, deque] = {}
        self._turns: deque[bytes] = deque()            # clients with requests waiting
        self._in_flight: dict[bytes, list[int]] = {}   # identity -> [requests, bytes]

    def __bool__(self) -> bool:
        return bool(self._turns)

    def admit(self, identity: bytes, frame: bytes) -> TooManyRequestsInFlightError | None:
        """Queue ``frame``; the refusal instead when its client is at a bound."""
        with self._lock:
            counts = self._in_flight.setdefault(identity, [0, 0])
            if counts[0] >= limits.CONTROL_PEER_REQUESTS_MAX or \
                    counts[1] + len(frame) > limits.CONTROL_PEER_BYTES_MAX:
                refusal = TooManyRequestsInFlightError(
                    f"the broker holds {counts[0]} of this client's control requests "
                    f"unanswered ({counts[1]} bytes waiting); it keeps at most "
                    f"{limits.CONTROL_PEER_REQUESTS_MAX} (limits.CONTROL_PEER_REQUESTS_MAX) "
                    f"and {limits.CONTROL_PEER_BYTES_MAX} bytes "
                    f"(limits.CONTROL_PEER_BYTES_MAX) per client: this one was refused, "
                    f"not queued; wait for replies before sending more")
                if counts[0] == 0:
                    del self._in_flight[identity]
                return refusal
            counts[0] += 1
            counts[1] += len(frame)
            if identity not in self._queues:
                self._queues[identity] = deque()
                self._turns.append(identity)
            self._queues[identity].append(frame)
            return None

    def take(self) -> tuple[bytes, bytes] | None:
        """The next client's oldest waiting request, or None."""
        with self._lock:
            if not self._turns:
                return None
            identity = self._turns.popleft()
            waiting = self._queues[identity]
            frame = waiting.popleft()
            self._in_flight[identity][1] -= len(frame)
            if waiting:
                self._turns.append(identity)
            else:
                del self._queues[identity]
            return identity, frame

    def answered(self, identity: bytes) -> None:
        """One of ``identity``'s requests was answered."""
        with self._lock:
            counts = self._in_flight.get(identity)
            if counts is not None:
                counts[0] -= 1
                if counts[0] <= 0:
                    del self._in_flight[identity]


class ControlEndpoint(threading.Thread):
    """Owns the ROUTER socket: receives requests and hands them to the broker's loop
    (ringing the doorbell it may sleep on); sends the replies the loop passes back
    through an in-process pair of sockets. Replies may come in any order and later
    than their request (a join waits for its rebalance): a ROUTER socket routes each
    to its client by identity."""

    _instances = itertools.count()

    def __init__(self, address: str, doorbell):
        super().__init__(name="shmlog-control", daemon=True)
        self._context = context = zmq.Context()
        self.socket = context.socket(zmq.ROUTER)
        # ZeroMQ checks each frame's length prefix against MAXMSGSIZE and disconnects
        # the peer, so a frame far over the limit is never buffered whole (one a little
        # over it is received, to be answered: see limits); RCVHWM stops reading a
        # client whose requests pile up.
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.CONTROL_FRAME_RECEIVED_SIZE_MAX)
        self.socket.setsockopt(zmq.RCVHWM, limits.CONTROL_PEER_RECEIVE_HWM)
        self.socket.bind(address)
        # Made under the broker's umask (never wider); the group, if one shares the
        # data, must write it to connect.
        policy = access.current()
        path = address[len("ipc://"):]
        if policy.group_id is not None:
            os.chown(path, -1, policy.group_id)
        os.chmod(path, policy.writable_mode)
        outbox = f"inproc://shmlog-control-replies-{next(self._instances)}"
        self._outbox_receiver = context.socket(zmq.PAIR)      # this thread's
        self._outbox_receiver.bind(outbox)
        self._outbox = context.socket(zmq.PAIR)               # the loop's
        self._outbox.connect(outbox)
        self.doorbell = doorbell
        self._requests = _Waiting()
        self._stopping = threading.Event()
        self.start()

    @property
    def waiting(self) -> bool:
        """Is a request waiting for the loop?"""
        return bool(self._requests)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._outbox_receiver, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(limits.CONTROL_POLL_MS))
            if self._outbox_receiver in ready:
                identity, reply = self._outbox_receiver.recv_multipart()
                self._requests.answered(identity)
                self.socket.send_multipart([identity, b"", reply])
                continue              # replies first: the loop may have sent several
            if self._stopping.is_set():
                return
            if self.socket in ready:
                # Not copied: a frame refused for its size is never made a bytes object.
                self._receive(self.socket.recv_multipart(copy=False))

    def _receive(self, frames: list) -> None:
        """Queue a request for the loop; refuse at once, so its client is not left
        waiting for a reply that never comes, a malformed envelope, a frame over the
        limit, and a request past its client's bounds."""
        identity = frames[0].bytes
        # A REQ client sends [identity, empty delimiter, body].
        if len(frames) == 3 and len(frames[1]) == 0:
            if len(frames[2]) > limits.CONTROL_FRAME_SIZE_MAX:
                refusal: ShmlogError | None = request_too_large(len(frames[2]))
            else:
                refusal = self._requests.admit(identity, frames[2].bytes)
            if refusal is None:
                self.doorbell.ring()
                return
        else:
            refusal = LocalProtocolError(
                f"a request is one frame after the empty delimiter a REQ socket sends; got "
                f"{len(frames) - 1} frames "
                f"({', '.join(str(len(frame)) for frame in frames[1:8])} bytes): send the "
                f"JSON request as a single-part message")
        self.socket.send_multipart([identity, b"", error_reply(refusal)])

    def answer(self, handle) -> bool:
        """Answer the waiting request, if any (on the loop's thread):
        ``handle(identity, frame)`` returns the reply, or None for one sent later."""
        taken = self._requests.take()
        if taken is None:
            return False
        identity, frame = taken
        try:
            reply = handle(identity, frame)
        except Exception as error:         # noqa: BLE001 - a bug must not end the broker
            log.exception("control request failed")
            reply = error_reply(ShmlogError(f"internal error: {error}"))
        if reply is not None:
            self.send(identity, reply)
        return True

    def send(self, identity: bytes, reply: bytes) -> None:
        """Pass a reply to the socket's thread (from the loop's thread only)."""
        self._outbox.send_multipart([identity, reply])

    def stop(self) -> None:
        """Send the replies passed so far, refuse requests not yet answered, stop."""
        while (taken := self._requests.take()) is not None:
            self.send(taken[0], error_reply(BrokerNotAvailableError("the broker is stopping")))
        self._stopping.set()
        self.join(timeout=10)
        for socket in (self._outbox, self._outbox_receiver):
            socket.close(linger=0)
        self.socket.close(linger=limits.CONTROL_POLL_MS)
        self._context.term()
