"""The replication transport (shmlog.zmq_replication) over real sockets.

Goal: requests and replies travel between brokers' endpoints with their correlation
ids and records byte-exact; a peer that goes away costs a reported timeout and a
reconnect, not a hang; whatever a raw socket sends never stops an endpoint from
serving the next good request; close() closes the sockets.
Method: endpoints on 127.0.0.1 with ports picked by the kernel, in this process
(each pumped by its owner, as a broker's loop pumps its own); a raw DEALER plays a
hostile peer. Every wait is bounded; times are never asserted.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
import zmq

from shmlog.cluster.replication.codec import decode, encode
from shmlog.cluster.replication.layout import MessageType
from shmlog.cluster.replication.messages import (
    EpochEnd,
    EpochEndPartition,
    EpochEndResponse,
    EpochEndResponsePartition,
    Error,
    ErrorCode,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchResponsePartition,
    Message,
)
from shmlog.common import limits
from shmlog.common.errors import LocalProtocolError
from shmlog.zmq_replication import (
    ReceivedRequest,
    ReceivedResponse,
    ReplicationEndpoint,
    RequestFailed,
    RequestFailure,
)

WAIT_S = 10.0
ANY_PORT = "tcp://127.0.0.1:*"
# How long a wait sleeps on its own endpoint before it pumps every node again.
POLL_S = 0.01


class Node:
    """An endpoint and the events it received. A broker's loop pumps its endpoint;
    here every wait pumps every open node (what one sends before its peer's
    connection is up goes out on its own next pump)."""

    open: list["Node"] = []

    def __init__(self, broker_id: int, broker_epoch: int = 100, address: str = ANY_PORT):
        self.endpoint = ReplicationEndpoint(broker_id, broker_epoch, address)
        self.events: list = []
        Node.open.append(self)

    def wait_for(self, kind: type, count: int = 1) -> list:
        deadline = time.monotonic() + WAIT_S
        while True:
            for node in Node.open:
                node.events += node.endpoint.take()
            found = [event for event in self.events if isinstance(event, kind)]
            if len(found) >= count:
                for event in found[:count]:
                    self.events.remove(event)
                return found[:count]
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {kind.__name__} within {WAIT_S} s; have {self.events}"
            self.endpoint.wait(min(remaining, POLL_S))

    def close(self) -> None:
        if self in Node.open:
            Node.open.remove(self)
        self.endpoint.close()


@pytest.fixture
def nodes():
    made: list[Node] = []

    def make(*args, **kwargs) -> Node:
        made.append(Node(*args, **kwargs))
        return made[-1]
    yield make
    for node in made:
        node.close()


def fetch(broker_id: int, offset: int = 0) -> Fetch:
    return Fetch(broker_id, False, 500, 1, 10 << 20,
                 (FetchPartition(123, 0, 4, offset, 0, 1 << 20),))


def test_request_and_reply_with_records_byte_exact(nodes):
    leader, follower = nodes(1), nodes(2, broker_epoch=7)
    follower.endpoint.set_peers({1: leader.endpoint.address, 2: "tcp://ignored:1"})
    correlation_id = follower.endpoint.request(1, fetch(2, 1200), timeout_ms=5000)
    [request] = leader.wait_for(ReceivedRequest)
    assert request.route == b"2:7"
    assert request.message == Message(2, 7, correlation_id, fetch(2, 1200))
    big = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    small = b"\x01\x02\x03"
    leader.endpoint.reply(request, FetchResponse((
        FetchResponsePartition(123, 0, ErrorCode.NONE, 1180, 0, 1250, records=big),
        FetchResponsePartition(123, 1, ErrorCode.NONE, 5, 0, 5),
        FetchResponsePartition(123, 2, ErrorCode.NONE, 9, 0, 9, records=small))))
    [response] = follower.wait_for(ReceivedResponse)
    assert response.peer_id == 1
    assert response.message.correlation_id == correlation_id
    assert response.message.sender_broker_id == 1
    partitions = response.message.body.partitions
    assert np.array_equal(partitions[0].records, big)
    assert not partitions[0].records.flags.owndata          # a view of the received frame
    assert partitions[1].records is None
    assert partitions[2].records.tobytes() == small


def test_several_requests_in_flight_answered_out_of_order(nodes):
    leader, follower = nodes(1), nodes(2)
    follower.endpoint.set_peers({1: leader.endpoint.address})
    sent = [follower.endpoint.request(1, EpochEnd((EpochEndPartition(5, index, 3, 2),)), 5000)
            for index in range(5)]
    requests = leader.wait_for(ReceivedRequest, 5)
    for request in reversed(requests):
        partition = request.message.body.partitions[0].partition
        leader.endpoint.reply(request, EpochEndResponse((
            EpochEndResponsePartition(5, partition, ErrorCode.NONE, 2, 100 + partition),)))
    responses = follower.wait_for(ReceivedResponse, 5)
    answered = {response.message.correlation_id:
                response.message.body.partitions[0].end_offset for response in responses}
    assert answered == {correlation_id: 100 + index for index, correlation_id in enumerate(sent)}


def test_a_peer_that_disappears_times_out_and_a_restarted_one_is_reached(nodes):
    leader = nodes(1)
    address = leader.endpoint.address
    follower = nodes(2)
    follower.endpoint.set_peers({1: address})
    correlation_id = follower.endpoint.request(1, fetch(2), 5000)
    leader.wait_for(ReceivedRequest)
    leader.close()                                   # gone before it answered
    lost = follower.endpoint.request(1, fetch(2), timeout_ms=300)
    failures = follower.wait_for(RequestFailed, 2)
    assert {(failure.correlation_id, failure.reason) for failure in failures} >= {
        (lost, RequestFailure.TIMED_OUT)}
    assert {failure.correlation_id for failure in failures} == {correlation_id, lost}
    # A request sent while the peer is down waits (within its timeout) for it to return.
    waiting = follower.endpoint.request(1, fetch(2, 5), timeout_ms=5000)
    time.sleep(0.2)
    restarted = nodes(1, broker_epoch=101, address=address)
    [request] = restarted.wait_for(ReceivedRequest)
    assert request.message.correlation_id == waiting
    restarted.endpoint.reply(request, FetchResponse(()))
    [response] = follower.wait_for(ReceivedResponse)
    assert (response.message.correlation_id, response.message.sender_broker_epoch) == (waiting, 101)


def test_a_late_reply_is_dropped(nodes):
    leader, follower = nodes(1), nodes(2)
    follower.endpoint.set_peers({1: leader.endpoint.address})
    late = follower.endpoint.request(1, fetch(2), timeout_ms=200)
    [request] = leader.wait_for(ReceivedRequest)
    [failure] = follower.wait_for(RequestFailed)
    assert (failure.correlation_id, failure.reason) == (late, RequestFailure.TIMED_OUT)
    leader.endpoint.reply(request, FetchResponse(()))          # after the timeout
    on_time = follower.endpoint.request(1, fetch(2), timeout_ms=5000)
    [request] = leader.wait_for(ReceivedRequest)
    leader.endpoint.reply(request, FetchResponse(()))
    [response] = follower.wait_for(ReceivedResponse)
    assert response.message.correlation_id == on_time
    time.sleep(0.1)
    assert not [event for event in follower.endpoint.take() if isinstance(event, ReceivedResponse)]


def test_unknown_and_removed_peers_fail_their_requests(nodes):
    leader, follower = nodes(1), nodes(2)
    nobody = follower.endpoint.request(9, fetch(2), 5000)
    [failure] = follower.wait_for(RequestFailed)
    assert (failure.correlation_id, failure.reason) == (nobody, RequestFailure.NO_PEER)
    follower.endpoint.set_peers({1: leader.endpoint.address})
    pending = follower.endpoint.request(1, fetch(2), 5000)
    leader.wait_for(ReceivedRequest)
    follower.endpoint.set_peers({})
    [failure] = follower.wait_for(RequestFailed)
    assert (failure.correlation_id, failure.reason) == (pending, RequestFailure.PEER_RESET)
    with pytest.raises(LocalProtocolError):
        follower.endpoint.set_peers({"1": "tcp://x:1"})
    with pytest.raises(LocalProtocolError, match="peer_id"):
        follower.endpoint.request(-1, fetch(2), 5000)
    with pytest.raises(LocalProtocolError, match="timeout_ms"):
        follower.endpoint.request(1, fetch(2), 2.5)


def _envelope(message_type=1, sender=5, correlation=42, magic=0x5352):
    return struct.pack("<HBBiqq", magic, 1, message_type, sender, 1, correlation)


@pytest.fixture
def raw_peer(nodes, monkeypatch):
    """A leader whose sockets refuse frames over 1 MiB, and a raw DEALER to it."""
    monkeypatch.setattr(limits, "REPLICATION_RECORDS_SIZE_MAX", 1 << 20)
    leader = nodes(1)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(leader.endpoint.address)
    yield leader, socket
    socket.close(linger=0)
    context.term()


def _receive(socket, node: Node, timeout_s: float) -> list | None:
    """What the raw ``socket`` receives within ``timeout_s`` (None: nothing), the
    endpoint of ``node`` pumped meanwhile, as its broker's loop would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node.endpoint.pump()
        if socket.poll(POLL_S * 1000):
            return socket.recv_multipart()
    return None


def _answer(socket, leader: Node) -> Message | None:
    """The leader's answer to what the raw socket sent, if any comes within a second."""
    frames = _receive(socket, leader, 1.0)
    return None if frames is None else decode(frames)


@pytest.mark.parametrize("frames, correlation_id", [
    ([b"garbage"], 0),
    ([b"x" * 24, b"{}"], 0),                                   # 24 bytes, wrong magic
    ([_envelope(magic=0xBEEF), b"{}"], 0),
    ([_envelope(), b"{not json"], 42),
    ([_envelope(), b'{"replica_id": 5}'], 42),                 # fields missing
    ([_envelope(message_type=2), b'{"partitions": []}'], 42),  # a response sent as a request
    ([_envelope(message_type=77), b"{}"], 42),                 # an unknown type
    ([_envelope(), encode(Message(5, 1, 42, fetch(5)))[1], b"extra"], 42),
])
def test_malformed_requests_get_an_error_and_the_endpoint_serves_on(raw_peer, frames,
                                                                    correlation_id):
    leader, socket = raw_peer
    socket.send_multipart(frames)
    answer = _answer(socket, leader)
    assert answer is not None and answer.message_type is MessageType.ERROR
    assert answer.body.error is ErrorCode.INVALID_REQUEST
    assert answer.correlation_id == correlation_id
    socket.send_multipart(encode(Message(5, 1, 43, fetch(5))))
    [request] = leader.wait_for(ReceivedRequest)
    assert request.message.correlation_id == 43


def test_errors_and_oversized_frames_are_dropped_without_an_answer(raw_peer):
    leader, socket = raw_peer
    socket.send_multipart(encode(Message(5, 1, 0, Error(ErrorCode.INVALID_REQUEST, "x"))))
    assert _answer(socket, leader) is None                      # an ERROR is never answered
    socket.send_multipart([_envelope(), b"{}", b"r" * ((1 << 20) + 1)])
    assert _answer(socket, leader) is None                      # refused by MAXMSGSIZE
    socket.send_multipart(encode(Message(5, 1, 44, fetch(5))))  # the DEALER reconnects
    [request] = leader.wait_for(ReceivedRequest)
    assert request.message.correlation_id == 44
    assert not leader.events


def test_close_closes_the_sockets_and_refuses_more(nodes):
    node, other = nodes(1), nodes(2)
    node.endpoint.set_peers({2: other.endpoint.address, 3: "tcp://127.0.0.1:9"})
    node.endpoint.request(3, fetch(1), 60_000)                  # waits for a peer never there
    node.endpoint.close()
    assert not node.endpoint.running
    node.endpoint.close()                                       # twice is fine
    with pytest.raises(LocalProtocolError, match="closed"):
        node.endpoint.request(2, fetch(1), 1000)


def test_duplicated_unasked_and_malformed_replies_are_dropped(nodes):
    """A raw ROUTER plays a leader that answers twice, answers what was never asked,
    sends a request down the reply path and sends garbage: the follower sees one
    response for its one request, and goes on."""
    context = zmq.Context()
    leader = context.socket(zmq.ROUTER)
    leader.setsockopt(zmq.LINGER, 0)
    port = leader.bind_to_random_port("tcp://127.0.0.1")
    try:
        follower = nodes(2)
        follower.endpoint.set_peers({1: f"tcp://127.0.0.1:{port}"})
        asked = follower.endpoint.request(1, fetch(2), 5000)
        route, *frames = _receive(leader, follower, WAIT_S)
        assert route == b"2:100" and decode(frames).correlation_id == asked
        reply = encode(Message(1, 1, asked, FetchResponse(())))
        for junk in ([b"garbage"], encode(Message(1, 1, asked + 50, FetchResponse(()))),
                     encode(Message(1, 1, asked, fetch(1))), reply, reply):
            leader.send_multipart([route] + junk)
        [response] = follower.wait_for(ReceivedResponse)
        assert response.message.correlation_id == asked
        again = follower.endpoint.request(1, fetch(2), 5000)
        route, *frames = _receive(leader, follower, WAIT_S)
        leader.send_multipart([route] + encode(Message(1, 1, again, FetchResponse(()))))
        [response] = follower.wait_for(ReceivedResponse)
        assert response.message.correlation_id == again
        assert not follower.events and not follower.endpoint.take()
    finally:
        leader.close(linger=0)
        context.term()
