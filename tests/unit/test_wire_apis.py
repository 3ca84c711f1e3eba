"""KafkaApis keeps serving whatever a handler's response does: one that does not
encode (a bug) closes its own connection, is logged, and the next request is
answered.

Method: KafkaApis over a stand-in for the socket server (a list of request frames in,
the connections written or closed recorded), with one area serving Heartbeat whose
handler answers as it is told; frames encoded with kafka-python's request class.
"""

from __future__ import annotations

import logging
import struct

from kafka.protocol.consumer.group import HeartbeatRequest

from shmlog.wire import codec
from shmlog.wire.apis import KafkaApis
from shmlog.wire.socket_server import WireRequest

HEARTBEAT_KEY = 12


class _Sockets:
    """What KafkaApis asks of the socket server, recorded."""

    def __init__(self, requests) -> None:
        self.requests = list(requests)
        self.sent: list[int] = []
        self.closed: list[int] = []
        self.waiting = False

    def pump(self) -> None:
        pass                      # no sockets: the requests are given

    def take(self):
        return self.requests.pop(0) if self.requests else None

    def send(self, connection_id, buffers) -> None:
        self.sent.append(connection_id)

    def close(self, connection_id) -> None:
        self.closed.append(connection_id)

    def no_response(self, connection_id) -> None:
        self.sent.append(connection_id)


class _Heartbeats:
    """Heartbeat v0, answered with ``error_code`` (a str does not encode)."""

    def __init__(self) -> None:
        self.error_codes = ["not a number", 0]

    def apis(self) -> dict:
        return {HEARTBEAT_KEY: (0, 0, self.heartbeat)}

    def heartbeat(self, request, header, body):
        return codec.response_class(HEARTBEAT_KEY)(version=0,
                                                   error_code=self.error_codes.pop(0))


def _heartbeat(connection_id: int) -> WireRequest:
    body = bytes(HeartbeatRequest(version=0, group_id="g", generation_id=1,
                                  member_id="m").encode(version=0))
    frame = struct.pack(">hhih", HEARTBEAT_KEY, 0, connection_id, 1) + b"t" + body
    return WireRequest(connection_id, frame, "127.0.0.1")


def test_a_response_that_does_not_encode_closes_its_connection_only(caplog):
    sockets = _Sockets([_heartbeat(1), _heartbeat(2)])
    apis = KafkaApis(sockets, [_Heartbeats()])
    with caplog.at_level(logging.ERROR, logger="shmlog.broker.kafka"):
        assert apis.answer()
    assert sockets.closed == [1] and sockets.sent == [2]
    assert "does not encode" in caplog.text
