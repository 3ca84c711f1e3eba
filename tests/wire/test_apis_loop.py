"""KafkaApis on a real listener socket, in this process: a response that does not
encode (a handler's bug) closes its connection and the loop answers the next
request, as a handler that raises does.

Method: a KafkaSocketServer on a free loopback port with a doorbell in this
process's memory, and KafkaApis with one area whose DescribeCluster handler
returns a response kafka-python's codec refuses (an int where the codec wants the
set of authorized operations: the bug that once ended a broker's loop). The test
plays the broker's loop (``answer`` until the socket shows the outcome). Every
wait is bounded.
"""

from __future__ import annotations

import socket
import struct
import time

from shmlog.wire import codec
from shmlog.wire.apis import KafkaApis
from shmlog.wire.socket_server import KafkaSocketServer

WAIT_S = 20.0
DESCRIBE_CLUSTER_KEY = 60


class _BrokenArea:
    """DescribeCluster answered with a response that cannot encode."""

    def apis(self) -> dict:
        return {DESCRIBE_CLUSTER_KEY: (0, 0, self.describe_cluster)}

    def describe_cluster(self, request, header, body):
        cls = codec.response_class(DESCRIBE_CLUSTER_KEY)
        return cls(version=0, throttle_time_ms=0, error_code=0, error_message=None,
                   cluster_id="c", controller_id=0, brokers=[], authorized_operations=7984)


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    if codec.request_class(api_key).flexible_version_q(version):
        header += b"\x00"                           # no tagged fields
    return struct.pack(">i", len(header) + len(body)) + header + body


def _answer_until(apis: KafkaApis, sock: socket.socket) -> bytes:
    """Play the loop until ``sock`` receives something or is closed: what it got
    (b"" when closed)."""
    sock.setblocking(False)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        apis.answer()
        try:
            return sock.recv(65536)
        except BlockingIOError:
            time.sleep(0.01)
        except ConnectionResetError:
            return b""
    raise AssertionError(f"no answer and no close within {WAIT_S} s")


def test_a_response_that_does_not_encode_closes_only_its_connection():
    server = KafkaSocketServer([("127.0.0.1", 0)])
    server.serve()
    try:
        apis = KafkaApis(server, [_BrokenArea()])
        host, port = server.addresses[0]
        request = codec.request_class(DESCRIBE_CLUSTER_KEY)(
            version=0, include_cluster_authorized_operations=True)
        with socket.create_connection((host, port), timeout=WAIT_S) as broken:
            broken.sendall(_frame(DESCRIBE_CLUSTER_KEY, 0, 1,
                                  bytes(request.encode(version=0))))
            assert _answer_until(apis, broken) == b""
        with socket.create_connection((host, port), timeout=WAIT_S) as healthy:
            healthy.sendall(_frame(codec.API_VERSIONS_KEY, 0, 2, b""))
            answer = _answer_until(apis, healthy)
        assert struct.unpack(">ii", answer[:8])[1] == 2       # its correlation id
    finally:
        server.stop()
