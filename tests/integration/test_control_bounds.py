"""The control endpoint's bounds against a real broker: a request over the frame limit
is a typed error at once (refused by the client before it sends, and by the broker
for a raw client that sends it anyway), and a client that pipelines large requests
without reading the replies neither grows the broker's memory nor holds up another
client's ping (issue 27, row 7).

Method: a real broker process; the library's client, and raw ZeroMQ sockets (a REQ
for the oversized frame, a DEALER that floods) speaking the control protocol's
envelope. The broker's memory is read from ``/proc/PID/status`` (VmRSS) while the
flood runs; the flooder stops early once the bound is passed, so a broker without
the bounds is not driven to gigabytes. Every wait is bounded; nothing asserts on
time.
"""

from __future__ import annotations

import threading

import pytest
import zmq

from shmlog import Broker
from shmlog.common import limits
from shmlog.common.errors import ControlRequestTooLargeError, TooManyRequestsInFlightError
from shmlog.common.paths import control_address
from shmlog.protocol.control import decode_reply, encode_request
from shmlog.protocol.control_client import request

WAIT_MS = 60_000
FLOOD_REQUESTS = 1_000
# The broker's growth allowed while flooded: ZeroMQ's buffer and the broker's queue
# for one client hold 20 MiB of requests at most (limits); a broker that queued
# every request held 2.7 GB after 3,000 of them.
GROWTH_MAX = 256 << 20


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_an_oversized_request_is_a_typed_error_at_once_and_the_broker_serves_on(data_dir):
    with Broker(data_dir) as broker:
        # The client refuses before it sends.
        with pytest.raises(ControlRequestTooLargeError, match="CONTROL_FRAME_SIZE_MAX"):
            request(data_dir, "create_topic", timeout_ms=WAIT_MS, name="big",
                    config={"x": "y" * limits.CONTROL_FRAME_SIZE_MAX})
        # The broker answers a client that skipped the check.
        context = zmq.Context.instance()
        raw = context.socket(zmq.REQ)
        raw.setsockopt(zmq.LINGER, 0)
        try:
            raw.connect(control_address(data_dir))
            raw.send(b" " * (limits.CONTROL_FRAME_SIZE_MAX + 1))
            assert raw.poll(WAIT_MS, zmq.POLLIN), "no reply to an oversized request"
            with pytest.raises(ControlRequestTooLargeError, match="CONTROL_FRAME_SIZE_MAX"):
                decode_reply(raw.recv())
        finally:
            raw.close()
        assert request(data_dir, "ping", timeout_ms=WAIT_MS)["pid"] == broker.process.pid
        assert request(data_dir, "list_topics", timeout_ms=WAIT_MS)["topics"] == []


class Flooder(threading.Thread):
    """Pipelines large requests on a DEALER socket and reads no reply; stops after
    FLOOD_REQUESTS, or once the broker grew past GROWTH_MAX (``grew``)."""

    def __init__(self, data_dir: str, pid: int):
        super().__init__(daemon=True)
        self.pid, self.baseline = pid, resident_bytes(pid)
        self.peak, self.sent, self.grew, self.error = self.baseline, 0, False, None
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 4)       # this process buffers little
        self.socket.setsockopt(zmq.SNDTIMEO, WAIT_MS)
        self.socket.connect(control_address(data_dir))

    def run(self) -> None:
        body = encode_request("ping", pad="x" * (limits.CONTROL_FRAME_SIZE_MAX - 100))
        try:
            while self.sent < FLOOD_REQUESTS:
                self.socket.send_multipart([b"", body], copy=False)   # REQ's envelope
                self.sent += 1
                if self.sent % 10 == 0:
                    self.peak = max(self.peak, resident_bytes(self.pid))
                    if self.peak - self.baseline > GROWTH_MAX:
                        self.grew = True
                        return
        except zmq.Again as error:
            self.error = error                       # the broker read nothing for a minute

    def replies(self) -> list[Exception | dict]:
        found: list[Exception | dict] = []
        while self.socket.poll(1_000, zmq.POLLIN):
            _, frame = self.socket.recv_multipart()
            try:
                found.append(decode_reply(frame))
            except Exception as error:               # noqa: BLE001 - the refusals are counted
                found.append(error)
        return found


def test_a_flooding_client_neither_grows_the_broker_nor_holds_up_a_ping(data_dir):
    with Broker(data_dir) as broker:
        pid = broker.process.pid
        request(data_dir, "ping")
        flooder = Flooder(data_dir, pid)
        try:
            flooder.start()
            while flooder.is_alive() and flooder.sent < FLOOD_REQUESTS // 10:
                flooder.join(0.01)
            for _ in range(3):                       # while it floods
                assert request(data_dir, "ping", timeout_ms=WAIT_MS)["pid"] == pid
            flooder.join(WAIT_MS / 1000 * 5)
            assert not flooder.is_alive() and flooder.error is None
            assert not flooder.grew, \
                f"the broker grew by {(flooder.peak - flooder.baseline) >> 20} MiB"
            assert resident_bytes(pid) - flooder.baseline < GROWTH_MAX
            replies = flooder.replies()
            assert any(isinstance(reply, TooManyRequestsInFlightError) for reply in replies)
            assert "CONTROL_PEER_REQUESTS_MAX" in str(next(
                reply for reply in replies if isinstance(reply, TooManyRequestsInFlightError)))
        finally:
            flooder.join(WAIT_MS / 1000)
            flooder.socket.close()
        assert request(data_dir, "ping", timeout_ms=WAIT_MS)["pid"] == pid
