"""Bad replication frames sent to running brokers never crash them.

Goal: whatever arrives on a broker's replication endpoint (garbage, a wrong magic or
version, an unknown type, a frame past the size limit, a body that is not ours,
stale and future leader epochs, offsets out of range, partitions that do not exist,
nonsense EPOCH_END requests, a request left waiting by a peer that went away) is
answered with an error or dropped, logged as a warning, and the broker goes on
replicating: it answers ping, and an acks=all round trip works.

Method: the shared three brokers (``fault_cluster``), a topic of RF 2
(min.insync.replicas 2: the third broker observes it), a raw ZeroMQ DEALER connected
to each one's replication endpoint; each bad message is sent, its answer
(if it has one) read back with a bounded wait and checked; at the end the brokers'
output (``LocalCluster``'s log files) holds the warnings and no traceback.
Senders are a broker id no broker has, so the KIP-380 stale-epoch check lets the
requests through to the partition checks. The cluster talks CurveZMQ: the raw peer
holds broker 1's key pair (allowed everywhere), so its frames reach the decoder.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import zmq

from cluster.workload import broker_output, create_topic, describe, replica_offsets, wait_in_sync
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.cluster.replication import layout as replication_layout
from shmlog.cluster.replication.codec import decode, encode
from shmlog.cluster.replication.messages import (
    EpochEnd,
    EpochEndPartition,
    EpochEndResponse,
    Error,
    ErrorCode,
    Fetch,
    FetchPartition,
    FetchResponse,
    Message,
    Produce,
    ProducePartition,
)
from shmlog.common import limits
from shmlog.config import curve_keys
from shmlog.protocol.control_client import request
from shmlog.shm.state import topic_key

TOPIC = "framed"
STRANGER = 77                  # a broker id no broker has
ANSWER_WAIT_MS = 5000


class RawPeer:
    """A DEALER that speaks (and mis-speaks) the replication protocol to one broker:
    a CURVE client with ``keys`` (a ``curve_keys.KeyPair``) of the server holding
    ``server_key``, or plain TCP without."""

    def __init__(self, endpoint: str, identity: bytes = b"77:0",
                 keys: curve_keys.KeyPair | None = None, server_key: str | None = None):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, identity)
        if keys is not None:
            self.socket.curve_serverkey = server_key.encode()
            self.socket.curve_publickey = keys.public_key.encode()
            self.socket.curve_secretkey = keys.secret_key.encode()
        self.socket.connect(endpoint)
        self.correlation_id = 0

    def send(self, frames: list) -> None:
        self.socket.send_multipart(frames, copy=True)

    def message(self, body) -> list:
        """The frames of a well-formed message from :data:`STRANGER`."""
        self.correlation_id += 1
        return encode(Message(STRANGER, 0, self.correlation_id, body))

    def answer(self) -> Message | None:
        if not self.socket.poll(ANSWER_WAIT_MS):
            return None
        return decode(self.socket.recv_multipart())

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def trusted_peer(cluster, broker_id: int) -> RawPeer:
    """A raw peer of broker ``broker_id`` that holds broker 1's key pair."""
    server_key = curve_keys.read_public_key(
        f"{cluster.keys_directory}/broker-{broker_id}{curve_keys.PUBLIC_SUFFIX}")
    return RawPeer(cluster.replication_endpoint(broker_id),
                   keys=curve_keys.read_key_pair(cluster.secret_key_file(1)),
                   server_key=server_key)


def envelope(magic=replication_layout.MAGIC, version=replication_layout.VERSION,
             message_type=int(replication_layout.MessageType.FETCH), correlation_id=9) -> bytes:
    return struct.pack(replication_layout.ENVELOPE_FORMAT, magic, version, message_type,
                       STRANGER, 0, correlation_id)


def fetch(key, partition=0, epoch=0, offset=0, observer=True, max_wait_ms=0) -> Fetch:
    return Fetch(STRANGER, observer, max_wait_ms, 1, 1 << 20,
                 (FetchPartition(key, partition, epoch, offset, 0, 1 << 20),))


def error_of(answer: Message) -> ErrorCode:
    body = answer.body
    if isinstance(body, Error):
        return body.error
    assert isinstance(body, (FetchResponse, EpochEndResponse)), body
    return body.partitions[0].error


def malformed(peer: RawPeer) -> None:
    """Messages that do not decode: each is answered with an INVALID_REQUEST ERROR,
    under its correlation id when the envelope was ours, else 0."""
    body = json.dumps({"replica_id": STRANGER}).encode()
    for frames, correlation_id in [
            ([b"\x00garbage"], 0),
            ([b""], 0),
            ([b"x" * replication_layout.ENVELOPE_LENGTH, body], 0),
            ([envelope(magic=0x1234), body], 0),
            ([envelope(version=9), body], 9),
            ([envelope(message_type=99), body], 9),
            ([envelope(), b"{not json"], 9),
            ([envelope(), b"[1, 2, 3]"], 9),
            ([envelope(), json.dumps({"replica_id": "x"}).encode()], 9),
            ([envelope(), body, b"a records frame nobody asked for"], 9),
            ([envelope(correlation_id=0), body], 0)]:
        peer.send(frames)
        answer = peer.answer()
        assert answer is not None and isinstance(answer.body, Error), frames[:1]
        assert answer.body.error is ErrorCode.INVALID_REQUEST
        assert answer.correlation_id == correlation_id, (frames[:1], answer)


def refused_requests(peer: RawPeer, key: int, leader_epoch: int, log_end: int,
                     leads: bool) -> None:
    """Well-formed requests the partition checks refuse, each with its Kafka error."""
    expected = [
        (fetch(key, epoch=leader_epoch - 1), ErrorCode.FENCED_LEADER_EPOCH),
    ] if leader_epoch > 0 else []          # epoch -1 is Kafka's "no epoch": not checked
    expected += [
        (fetch(key, epoch=leader_epoch + 5), ErrorCode.UNKNOWN_LEADER_EPOCH),
        (fetch(key ^ 1, epoch=leader_epoch), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (fetch(key, partition=7, epoch=leader_epoch), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (EpochEnd((EpochEndPartition(key, 0, leader_epoch + 100, 2**31 - 1),)),
         ErrorCode.UNKNOWN_LEADER_EPOCH),
        (EpochEnd((EpochEndPartition(key ^ 1, 3, 0, 0),)), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    if leads:
        expected += [
            (fetch(key, epoch=leader_epoch, offset=log_end + 1000),
             ErrorCode.OFFSET_OUT_OF_RANGE),
            (fetch(key, epoch=leader_epoch, observer=False), ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    else:
        expected += [(fetch(key, epoch=leader_epoch), ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    for body, error in expected:
        peer.send(peer.message(body))
        answer = peer.answer()
        assert answer is not None, body
        assert error_of(answer) is error, (body, answer)
    # A response sent as a request, and a PRODUCE of bytes that are no batch: answered
    # with some error, the broker unharmed.
    peer.send(peer.message(EpochEndResponse(())))
    assert isinstance(peer.answer().body, Error)
    peer.send(peer.message(Produce(-1, 1000, (ProducePartition(
        key, 0, np.frombuffer(b"not a record batch", np.uint8)),))))
    peer.answer()


def test_bad_frames_never_crash_a_broker(fault_cluster):
    cluster = fault_cluster
    create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 2)
    entry = describe(cluster, 1, TOPIC)
    replicas = tuple(entry["replicas"])
    wait_in_sync(cluster, TOPIC, replicas)
    entry = describe(cluster, 1, TOPIC)
    warned_before = {broker_id: len(broker_output(cluster, broker_id)) for broker_id in (1, 2, 3)}
    key = topic_key(Admin(cluster.data_dir(1)).describe_topic(TOPIC)["topic_id"])
    for broker_id in (1, 2, 3):
        peer = trusted_peer(cluster, broker_id)
        try:
            malformed(peer)
            log_end, _ = replica_offsets(cluster, broker_id, TOPIC)
            refused_requests(peer, key, entry["leader_epoch"], log_end,
                             leads=broker_id == entry["leader"])
            # A frame past the size limit: the connection is dropped before it is read.
            peer.send([envelope(), b"\0" * (limits.REPLICATION_RECORDS_SIZE_MAX + 1)])
            # A fetch that waits, from a peer that leaves before its answer.
            peer.send(peer.message(fetch(key, epoch=entry["leader_epoch"], offset=log_end,
                                         max_wait_ms=500)))
        finally:
            peer.close()
    for broker_id in (1, 2, 3):
        assert request(cluster.data_dir(broker_id), "ping", timeout_ms=ANSWER_WAIT_MS) is not None
    leader = entry["leader"]
    with Producer(cluster.data_dir(leader), acks="all") as producer:
        offsets = [producer.send(TOPIC, b"after-%d" % n, partition=0).get(timeout=30).offset
                   for n in range(10)]
    assert offsets == sorted(offsets)
    wait_in_sync(cluster, TOPIC, replicas)
    cluster.wait_for(lambda: len({replica_offsets(cluster, broker_id, TOPIC)
                                  for broker_id in (1, 2, 3)}) == 1, 30, "the replicas to agree")
    for broker_id in (1, 2, 3):
        logged = broker_output(cluster, broker_id)[warned_before[broker_id]:]
        assert "malformed replication request" in logged, logged[-3000:]
        assert "Traceback" not in logged, logged[-3000:]
