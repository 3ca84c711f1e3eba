"""The broker's control endpoint: the one module of the broker that uses ZeroMQ
(clients have theirs in ``protocol/control_client.py``; replication has
``zmq_replication.py``).

Theory of operation
-------------------
A thread owns a ROUTER socket bound to the data directory's ``ipc://`` address and
queues each request for the broker's loop, ringing the doorbell the loop may sleep
on; the loop answers from its own thread and passes replies back through an
in-process pair of sockets, which the thread sends on. Replies may come in any
order and later than their request (a join waits for its rebalance): the ROUTER
socket routes each to its client by identity. ZeroMQ refuses frames longer than
``limits.CONTROL_FRAME_SIZE_MAX`` before buffering them; a malformed envelope is
refused at once, so no client waits for a reply that never comes.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading

import zmq

from ..common import access, limits
from ..common.errors import BrokerNotAvailableError, LocalProtocolError, ShmlogError
from ..common.paths import control_path
from ..protocol.control import error_reply

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
        # ZeroMQ checks each frame's length prefix against this and disconnects the
        # peer, so an oversized request is never buffered whole.
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.CONTROL_FRAME_SIZE_MAX)
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
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self.start()

    @property
    def waiting(self) -> bool:
        """Is a request waiting for the loop?"""
        return not self._requests.empty()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._outbox_receiver, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(limits.CONTROL_POLL_MS))
            if self._outbox_receiver in ready:
                identity, reply = self._outbox_receiver.recv_multipart()
                self.socket.send_multipart([identity, b"", reply])
                continue              # replies first: the loop may have sent several
            if self._stopping.is_set():
                return
            if self.socket in ready:
                self._receive(self.socket.recv_multipart())

    def _receive(self, frames: list) -> None:
        """Queue a request for the loop; refuse a malformed envelope at once, so its
        client is not left waiting for a reply that never comes."""
        # A REQ client sends [identity, empty delimiter, body].
        if len(frames) == 3 and frames[1] == b"":
            self._requests.put((frames[0], frames[2]))
            self.doorbell.ring()
            return
        refusal = LocalProtocolError(
            f"a request is one frame after the empty delimiter a REQ socket sends; got "
            f"{len(frames) - 1} frames ({', '.join(str(len(frame)) for frame in frames[1:8])} "
            f"bytes): send the JSON request as a single-part message")
        self.socket.send_multipart([frames[0], b"", error_reply(refusal)])

    def answer(self, handle) -> bool:
        """Answer the waiting request, if any (on the loop's thread):
        ``handle(identity, frame)`` returns the reply, or None for one sent later."""
        try:
            identity, frame = self._requests.get_nowait()
        except queue.Empty:
            return False
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
        while True:
            try:
                identity, _ = self._requests.get_nowait()
            except queue.Empty:
                break
            self.send(identity, error_reply(BrokerNotAvailableError("the broker is stopping")))
        self._stopping.set()
        self.join(timeout=10)
        for socket in (self._outbox, self._outbox_receiver):
            socket.close(linger=0)
        self.socket.close(linger=limits.CONTROL_POLL_MS)
        self._context.term()
