"""One connection to a Kafka listener speaking requests built with kafka-python's
message classes, for tests that send what no client would (every version, unknown
members, members of other brokers' groups)."""

from __future__ import annotations

import socket
import struct


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
        size = struct.unpack(">i", self._exactly(4))[0]
        body = self._exactly(size)
        assert struct.unpack(">i", body[:4])[0] == self.correlation
        return response_class.decode(body[5 if flexible else 4:], version=version)

    def _exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
