"""One connection to a Kafka listener speaking requests built with kafka-python's
message classes, for tests that send what no client would (every version, unknown
members, members of other brokers' groups)."""

from __future__ import annotations

import socket
import struct


def receive_exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes from ``sock``; ConnectionError if it closes first."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


class RawConnection:
    """One connection speaking requests built with kafka-python's classes."""

    def __init__(self, address: str, timeout_s: float = 20.0):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.correlation = 0

    def ask(self, request, response_class, version: int):
        self.correlation += 1
        flexible = request.flexible_version_q(version)
        header = struct.pack(">hhih", request.API_KEY, version, self.correlation, 4) + b"test"
        payload = header + (b"\x00" if flexible else b"") + bytes(request.encode(version=version))
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", receive_exactly(self.sock, 4))[0]
        body = receive_exactly(self.sock, size)
        assert struct.unpack(">i", body[:4])[0] == self.correlation
        return response_class.decode(body[5 if flexible else 4:], version=version)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ask_once(address: str, request, response_class, timeout_s: float = 30.0):
    """One request (kafka-python's new-style class, its version chosen) on a
    connection of its own: its response, decoded by ``response_class``."""
    request.with_header(correlation_id=9, client_id="raw")
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", receive_exactly(sock, 4))[0]
        payload = receive_exactly(sock, size)
    flexible = response_class.flexible_version_q(request.API_VERSION)
    return response_class.decode(payload[4 + flexible:], version=request.API_VERSION)
