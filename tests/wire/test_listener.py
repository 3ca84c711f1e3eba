"""The Kafka listener against real clients and hostile bytes: ApiVersions and
Metadata as librdkafka (confluent-kafka) and kafka-python see them, auto-creation,
and what a malformed, oversized or unsupported request does (its connection closed,
the broker serving on), plus the per-address and idle bounds.

Method: one broker process per module with ``listeners = PLAINTEXT://127.0.0.1:0``
(its port from ``shmlog status``'s stats); the clients are the real libraries;
hostile requests are written on raw sockets, and responses read there are decoded
with kafka-python's message classes. Every wait is bounded.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from kafka.protocol.metadata import ApiVersionsResponse

from helpers import kafka_listener_address
from kafka_clients.raw import receive_exactly
from shmlog import Admin
from shmlog.server.broker import Broker
from shmlog.wire.local_metadata import cluster_id_of

WAIT_S = 20.0


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _frame(api_key: int, version: int, correlation_id: int, body: bytes = b"",
           client_id: bytes = b"test", flexible: bool = False) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if flexible:
        header += b"\x00"                        # no tagged fields
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def _receive(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", receive_exactly(sock, 4))[0]
    return receive_exactly(sock, size)


def _closed_by_broker(sock: socket.socket) -> bool:
    """Whether the broker closed the connection (EOF or reset within the wait)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _api_versions(address: str) -> ApiVersionsResponse:
    with _connect(address) as sock:
        sock.sendall(_frame(18, 0, 7))
        response = _receive(sock)
    assert struct.unpack(">i", response[:4])[0] == 7
    return ApiVersionsResponse.decode(response[4:], version=0)


def test_librdkafka_lists_the_topics_and_the_broker(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("listed", 3)
    metadata = AdminClient({"bootstrap.servers": address}).list_topics(timeout=WAIT_S)
    assert len(metadata.topics["listed"].partitions) == 3
    assert all(partition.leader == 0 and partition.replicas == [0] and partition.isrs == [0]
               for partition in metadata.topics["listed"].partitions.values())
    host, port = address.rsplit(":", 1)
    assert [(b.id, b.host, b.port) for b in metadata.brokers.values()] == [(0, host, int(port))]
    assert metadata.cluster_id == cluster_id_of(data_dir)


def test_kafka_python_sees_the_partitions(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("seen", 2)
    consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=10_000)
    try:
        assert "seen" in consumer.topics()
        assert consumer.partitions_for_topic("seen") == {0, 1}
    finally:
        consumer.close()


def test_metadata_creates_a_topic_on_first_use(kafka_broker):
    data_dir, address = kafka_broker
    producer = KafkaProducer(bootstrap_servers=address, request_timeout_ms=10_000,
                             max_block_ms=int(WAIT_S * 1000))
    try:
        # A producer's Metadata for one topic allows auto-creation (v4+'s flag).
        assert producer.partitions_for("made-on-first-use") == {0}
    finally:
        producer.close()
    assert "made-on-first-use" in Admin(data_dir).list_topics()


def test_api_versions_advertises_what_is_served(kafka_broker):
    response = _api_versions(kafka_broker[1])
    assert response.error_code == 0
    served = {entry.api_key: (entry.min_version, entry.max_version)
              for entry in response.api_keys}
    assert served[18] == (0, 4) and served[3] == (0, 12)


def test_a_too_new_api_versions_gets_unsupported_version_and_the_versions(kafka_broker):
    with _connect(kafka_broker[1]) as sock:
        sock.sendall(_frame(18, 99, 11, flexible=True))
        response = _receive(sock)
    assert struct.unpack(">i", response[:4])[0] == 11
    decoded = ApiVersionsResponse.decode(response[4:], version=0)
    assert decoded.error_code == 35
    assert {entry.api_key for entry in decoded.api_keys} >= {3, 18}


@pytest.mark.parametrize("frame", [
    pytest.param(struct.pack(">i", 200 * 1024 * 1024), id="over-socket.request.max.bytes"),
    pytest.param(struct.pack(">i", -5), id="negative-size"),
    pytest.param(struct.pack(">i", 3) + b"abc", id="shorter-than-a-header"),
    pytest.param(_frame(3, 99, 1), id="unserved-version"),
    pytest.param(_frame(1000, 0, 1), id="unknown-api"),
    pytest.param(_frame(3, 12, 1, b"\xff\xff\xff", flexible=True), id="garbage-body"),
    pytest.param(struct.pack(">i", 10) + struct.pack(">hhih", 3, 1, 1, 500),
                 id="client-id-past-end"),
])
def test_a_bad_request_closes_its_connection_and_nothing_else(kafka_broker, frame):
    address = kafka_broker[1]
    with _connect(address) as bystander, _connect(address) as sock:
        sock.sendall(frame)
        assert _closed_by_broker(sock)
        bystander.sendall(_frame(18, 0, 3))          # an open connection still served
        assert struct.unpack(">i", _receive(bystander)[:4])[0] == 3
    assert _api_versions(address).error_code == 0


def test_responses_come_in_request_order_on_one_connection(kafka_broker):
    with _connect(kafka_broker[1]) as sock:
        # Five requests in one write (a client pipelines them), answered one by one.
        sock.sendall(b"".join(_frame(18, version, 100 + index)
                              for index, version in enumerate((0, 1, 2, 1, 0))))
        correlations = [struct.unpack(">i", _receive(sock)[:4])[0] for _ in range(5)]
    assert correlations == [100, 101, 102, 103, 104]


def test_connections_per_address_and_idle_connections_are_bounded(tmp_path):
    data_dir = str(tmp_path / "data")
    with Broker(data_dir, listeners="PLAINTEXT://127.0.0.1:0", max_connections_per_ip=2,
                connections_max_idle_ms=1_000):
        address = kafka_listener_address(data_dir)
        first, second = _connect(address), _connect(address)
        third = _connect(address)
        try:
            assert _closed_by_broker(third)                  # over the cap: closed at once
            first.sendall(_frame(18, 0, 1))
            _receive(first)
            # Idle for longer than connections.max.idle.ms: the broker closes both.
            assert _closed_by_broker(first) and _closed_by_broker(second)
            deadline = time.monotonic() + WAIT_S
            while True:              # their slots are free again once the broker closed them
                with _connect(address) as fourth:
                    fourth.sendall(_frame(18, 0, 2))
                    try:
                        _receive(fourth)
                        break
                    except ConnectionError:
                        assert time.monotonic() < deadline
        finally:
            for sock in (first, second, third):
                sock.close()
