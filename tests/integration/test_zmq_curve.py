"""CurveZMQ on the replication transport (``zmq_replication`` with ``CurveSecurity``).

Goal: two endpoints holding each other's keys exchange requests and replies; a peer
whose key is not allowed (a raw DEALER with keys of its own) and a peer without
CURVE get nothing through and nothing back, and each refusal is counted; an endpoint
never connects to a peer whose published key it does not allow (its requests fail
``NO_PEER``) and connects once the published key is an allowed one; a key that
changes under a peer reconnects it; a key file copied into the allowed directory
while the endpoint runs is served and connected to without a restart.

Method: endpoints on 127.0.0.1 in this process, each with its own context (its own
ZAP handler), as brokers have; raw pyzmq DEALERs play the strangers. Every wait is
bounded; times are never asserted.
"""

from __future__ import annotations

import os
import time

import pytest
import zmq

from shmlog.cluster.replication.codec import decode, encode
from shmlog.cluster.replication.messages import Fetch, FetchPartition, FetchResponse, Message
from shmlog.config import curve_keys
from shmlog.zmq_replication import (
    CurveSecurity,
    ReceivedRequest,
    ReceivedResponse,
    ReplicationEndpoint,
    RequestFailed,
    RequestFailure,
)

WAIT_S = 10.0
# How long a stranger waits for an answer that must not come (a trusted peer's answer
# takes milliseconds: see the control case in the same test).
SILENCE_S = 1.5
# How long a wait sleeps on its own endpoint before it pumps every endpoint again.
POLL_S = 0.01


def key_pair() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


class Node:
    """An endpoint, pumped as its broker's loop would: every wait pumps every open
    node (a CURVE handshake needs the server's ZAP answer, sent from its pump)."""

    open: list["Node"] = []

    def __init__(self, broker_id: int, keys: tuple[str, str], allowed: set[str]):
        self.keys = keys
        self.endpoint = ReplicationEndpoint(broker_id, 1, "tcp://127.0.0.1:*",
                                            CurveSecurity(*keys, frozenset(allowed)))
        self.events: list = []
        Node.open.append(self)

    def next(self, kind: type):
        deadline = time.monotonic() + WAIT_S
        while True:
            for node in Node.open:
                node.events += node.endpoint.take()
            for event in self.events:
                if isinstance(event, kind):
                    self.events.remove(event)
                    return event
            assert time.monotonic() < deadline, f"no {kind.__name__} within {WAIT_S} s"
            self.endpoint.wait(POLL_S)

    def close(self) -> None:
        Node.open.remove(self)
        self.endpoint.close()


def pumping(endpoints, until, timeout_s: float) -> bool:
    """Pump ``endpoints`` until ``until()`` is true (True) or ``timeout_s`` passed
    (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for endpoint in endpoints:
            endpoint.pump()
        if until():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


@pytest.fixture
def pair():
    """Two endpoints (brokers 1 and 2) that allow each other."""
    keys = [key_pair(), key_pair()]
    allowed = {public for public, _ in keys}
    nodes = [Node(1, keys[0], allowed), Node(2, keys[1], allowed)]
    yield nodes
    for node in nodes:
        node.close()


def fetch(broker_id: int) -> Fetch:
    return Fetch(broker_id, False, 500, 1, 10 << 20, (FetchPartition(123, 0, 4, 0, 0, 1 << 20),))


def round_trip(leader: Node, follower: Node) -> None:
    follower.endpoint.request(leader.endpoint.broker_id, fetch(follower.endpoint.broker_id),
                              timeout_ms=int(WAIT_S * 1000))
    request = leader.next(ReceivedRequest)
    leader.endpoint.reply(request, FetchResponse(()))
    assert isinstance(follower.next(ReceivedResponse).message.body, FetchResponse)


def stranger(context: zmq.Context, server: Node, keys: tuple[str, str] | None) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        socket.curve_serverkey = server.endpoint.public_key.encode()
        socket.curve_publickey, socket.curve_secretkey = (key.encode() for key in keys)
    socket.connect(server.endpoint.address)
    return socket


def test_allowed_peers_talk_and_strangers_get_nothing(pair):
    leader, follower = pair
    follower.endpoint.set_peers({1: leader.endpoint.address}, {1: leader.endpoint.public_key})
    round_trip(leader, follower)
    context = zmq.Context()
    try:
        strangers = [stranger(context, leader, key_pair()), stranger(context, leader, None)]
        trusted = stranger(context, leader, follower.keys)
        for socket in strangers + [trusted]:
            socket.send_multipart(encode(Message(2, 1, 5, fetch(2))))
        # The control: the same request from a holder of an allowed key is served.
        request = leader.next(ReceivedRequest)
        leader.endpoint.reply(request, FetchResponse(()))
        assert pumping([leader.endpoint], lambda: trusted.poll(0), WAIT_S)
        assert decode(trusted.recv_multipart()).correlation_id == 5
        assert not pumping([leader.endpoint],
                           lambda: any(socket.poll(0) for socket in strangers), SILENCE_S)
        assert leader.endpoint.take() == [] and leader.events == []
        refused_both = pumping([leader.endpoint], lambda: leader.endpoint.refused_count >= 2,
                               WAIT_S)                     # one of each, retried since
        assert refused_both, leader.endpoint.refused_count
    finally:
        context.destroy(linger=0)
    round_trip(leader, follower)                       # still serving its peer


def test_a_peer_publishing_a_key_not_allowed_is_never_connected_to(pair):
    leader, follower = pair
    with zmq.Context() as context:
        listener = context.socket(zmq.STREAM)          # sees any TCP connection
        listener.setsockopt(zmq.LINGER, 0)
        address = listener.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{address}"
        for published in (key_pair()[0], None):
            follower.endpoint.set_peers({1: endpoint}, {1: published})
            follower.endpoint.request(1, fetch(2), timeout_ms=int(WAIT_S * 1000))
            failed = follower.next(RequestFailed)
            assert failed.reason is RequestFailure.NO_PEER
        # The control: an allowed key at the same address is connected to.
        follower.endpoint.set_peers({1: endpoint}, {1: leader.endpoint.public_key})
        assert listener.poll(WAIT_S * 1000)
        listener.close(linger=0)
    # The key published for a peer changes: it is connected to with the new key.
    follower.endpoint.set_peers({1: leader.endpoint.address}, {1: leader.endpoint.public_key})
    round_trip(leader, follower)


def test_plain_tcp_endpoints_need_no_keys():
    endpoints = [ReplicationEndpoint(broker_id, 1, "tcp://127.0.0.1:*") for broker_id in (1, 2)]
    try:
        assert endpoints[0].public_key is None
        endpoints[1].set_peers({1: endpoints[0].address})
        with zmq.Context() as context:
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoints[0].address)
            socket.send_multipart(encode(Message(2, 1, 5, fetch(2))))
            deadline = time.monotonic() + WAIT_S
            while not endpoints[0].waiting:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert isinstance(endpoints[0].take()[0], ReceivedRequest)
            socket.close(linger=0)
    finally:
        for endpoint in endpoints:
            endpoint.close()


def newcomer_socket(context: zmq.Context, endpoint: ReplicationEndpoint,
                    keys: curve_keys.KeyPair) -> zmq.Socket:
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.curve_serverkey = endpoint.public_key.encode()
    client.curve_publickey = keys.public_key.encode()
    client.curve_secretkey = keys.secret_key.encode()
    client.connect(endpoint.address)
    return client


def test_a_key_copied_into_the_allowed_directory_is_taken_while_running(tmp_path):
    """Growing a cluster: a new broker's key file lands in the directory; the running
    endpoint then serves it and connects to it, with no restart."""
    own = curve_keys.write_key_pair(str(tmp_path), "broker-1")
    newcomer_dir = tmp_path / "newcomer"
    newcomer_dir.mkdir()
    newcomer = curve_keys.write_key_pair(str(newcomer_dir), "broker-2")
    endpoint = ReplicationEndpoint(1, 1, "tcp://127.0.0.1:*", CurveSecurity(
        own.public_key, own.secret_key, frozenset([own.public_key]), str(tmp_path)))
    context = zmq.Context()
    try:
        listener = context.socket(zmq.STREAM)
        listener.setsockopt(zmq.LINGER, 0)
        address = f"tcp://127.0.0.1:{listener.bind_to_random_port('tcp://127.0.0.1')}"
        endpoint.set_peers({2: address}, {2: newcomer.public_key})
        early = newcomer_socket(context, endpoint, newcomer)
        assert pumping([endpoint], lambda: endpoint.refused_count >= 1, WAIT_S), \
            "the unknown key was not refused"
        early.close(linger=0)
        assert not listener.poll(0)
        os.replace(newcomer_dir / "broker-2.key", tmp_path / "broker-2.key")
        assert pumping([endpoint], lambda: listener.poll(0), WAIT_S), \
            "the registration's key, allowed now, not connected"
        # libzmq ends a connection whose handshake was refused (no retry): a new one.
        client = newcomer_socket(context, endpoint, newcomer)
        client.send_multipart(encode(Message(2, 1, 5, fetch(2))))
        assert pumping([endpoint], lambda: endpoint.waiting, WAIT_S), \
            "the newcomer's request never arrived"             # its reconnection is accepted
        assert isinstance(endpoint.take()[0], ReceivedRequest)
    finally:
        context.destroy(linger=0)
        endpoint.close()
