"""Replication frames (shmlog.cluster.replication.codec encode/decode, messages, layout).

Goal: every message type round-trips, records arrive byte-exact as views of their
frames, and whatever a peer sends, decode either returns a well-formed message or
raises ReplicationProtocolError (a PeerProtocolError): never any other exception.
Method: a round trip per type; a table of malformed frames, each naming what is
wrong; hypothesis fuzzing (mutated valid messages, arbitrary JSON bodies behind
valid envelopes, arbitrary frame lists).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmlog.cluster.replication import layout as replication_layout
from shmlog.cluster.replication.codec import decode, encode
from shmlog.cluster.replication.layout import MessageType
from shmlog.cluster.replication.messages import (
    DeleteRecords,
    DeleteRecordsPartition,
    DeleteRecordsResponse,
    DeleteRecordsResponsePartition,
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
    GroupRequest,
    GroupResponse,
    Message,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceResponsePartition,
)
from shmlog.common import limits
from shmlog.common.errors import LocalProtocolError, PeerProtocolError, ReplicationProtocolError

RECORDS_A = np.arange(300, dtype=np.uint8)
RECORDS_B = bytes(range(7)) * 3

MESSAGES = [
    Message(2, 1001, 7, Fetch(2, False, 500, 1, 10 << 20, (
        FetchPartition(123, 0, 4, 1200, 0, 1 << 20),
        FetchPartition(-5, 3, -1, 0, -1, 0)))),
    Message(1, 1000, 7, FetchResponse((
        FetchResponsePartition(123, 0, ErrorCode.NONE, 1180, 0, 1250, records=RECORDS_A),
        FetchResponsePartition(123, 1, ErrorCode.OFFSET_OUT_OF_RANGE, -1, 5, 9),
        FetchResponsePartition(123, 2, ErrorCode.NONE, 40, 0, 40, records=RECORDS_B)))),
    Message(2, 1001, 8, EpochEnd((EpochEndPartition(123, 0, 4, 3),))),
    Message(1, 1000, 8, EpochEndResponse((
        EpochEndResponsePartition(123, 0, ErrorCode.NONE, 2, 900),
        EpochEndResponsePartition(123, 1, ErrorCode.FENCED_LEADER_EPOCH, -1, -1)))),
    Message(3, 5, 9, Produce(-1, 30_000, (ProducePartition(7, 0, RECORDS_B),))),
    Message(1, 1000, 9, ProduceResponse((
        ProduceResponsePartition(7, 0, ErrorCode.NONE, 4000, -1, 0),))),
    Message(1, 1000, 0, Error(ErrorCode.INVALID_REQUEST, "bad magic é")),
    Message(2, 1001, 10, GroupRequest('{"version": 1, "type": "heartbeat", "group_id": "g é"}')),
    Message(1, 1000, 10, GroupResponse('{"version": 1, "ok": true}')),
    Message(2, 1001, 11, DeleteRecords((DeleteRecordsPartition(123, 0, 200),
                                        DeleteRecordsPartition(123, 1, -1)))),
    Message(1, 1000, 11, DeleteRecordsResponse((
        DeleteRecordsResponsePartition(123, 0, ErrorCode.NONE, 200, 150),
        DeleteRecordsResponsePartition(123, 1, ErrorCode.OFFSET_OUT_OF_RANGE, -7, -1)))),
    # Fetch sessions (KIP-227): an incremental fetch, a session error, a session's answer.
    Message(2, 1001, 12, Fetch(2, False, 500, 1, 10 << 20, (
        FetchPartition(123, 0, 4, 1200, 0, 1 << 20),), 77, 3, ((123, 1), (-5, 0)))),
    Message(1, 1000, 12, FetchResponse((), ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0)),
    Message(1, 1000, 13, FetchResponse((
        FetchResponsePartition(123, 0, ErrorCode.NONE, 40, 0, 40, records=RECORDS_B),),
        ErrorCode.NONE, 77)),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.message_type.name)
def test_every_type_round_trips(message):
    frames = encode(message)
    assert len(frames[0]) == replication_layout.ENVELOPE_LENGTH
    decoded = decode(frames)
    assert decoded == message
    entries = getattr(message.body, "partitions", ())
    for sent, received in zip(entries, getattr(decoded.body, "partitions", ())):
        if getattr(sent, "records", None) is None:
            assert getattr(received, "records", None) is None
        else:
            assert received.records.dtype == np.uint8
            assert received.records.tobytes() == bytes(memoryview(sent.records))


def test_records_are_views_of_their_frames_in_body_order():
    frames = encode(MESSAGES[1])
    assert len(frames) == 4                               # two entries carry records
    received = [bytearray(frame) if index >= 2 else frame for index, frame in enumerate(frames)]
    decoded = decode(received)
    received[2][0] = 0xFF                                 # the view sees the frame: no copy
    assert decoded.body.partitions[0].records[0] == 0xFF
    assert decoded.body.partitions[2].records.tobytes() == RECORDS_B


def test_the_envelope_layout():
    frames = encode(MESSAGES[0])
    magic, version, message_type, sender, epoch, correlation = struct.unpack("<HBBiqq", frames[0])
    assert (magic, version, message_type) == (0x5352, 1, MessageType.FETCH)
    assert (sender, epoch, correlation) == (2, 1001, 7)
    assert frames[0][:2] == b"RS"


def _with_body(frames, **changes):
    body = json.loads(frames[1])
    body.update(changes)
    return [frames[0], json.dumps(body).encode()] + list(frames[2:])


def _with_entry(frames, **changes):
    body = json.loads(frames[1])
    body["partitions"][0].update(changes)
    return [frames[0], json.dumps(body).encode()] + list(frames[2:])


def _envelope(**changes):
    fields = dict(magic=0x5352, version=1, type=1, sender=2, epoch=1001, correlation=7)
    fields.update(changes)
    return struct.pack("<HBBiqq", *fields.values())


FETCH = encode(MESSAGES[0])
FETCH_RESPONSE = encode(MESSAGES[1])


@pytest.mark.parametrize("frames, complaint", [
    ([], "at least 2 frames"),
    ([FETCH[0]], "at least 2 frames"),
    ([FETCH[0][:23], FETCH[1]], "envelope is 24 bytes"),
    ([_envelope(magic=0x1234), FETCH[1]], "bad magic"),
    ([_envelope(version=2), FETCH[1]], "unsupported version"),
    ([_envelope(type=max(MessageType) + 1), FETCH[1]], "unknown message type"),
    ([_envelope(sender=-1), FETCH[1]], "sender_broker_id"),
    ([_envelope(epoch=-3), FETCH[1]], "sender_broker_epoch"),
    ([_envelope(correlation=0), FETCH[1]], "correlation id above 0"),
    ([FETCH[0], b"\xff\xfe"], "not UTF-8 JSON"),
    ([FETCH[0], b"{"], "not UTF-8 JSON"),
    ([FETCH[0], b"[" * (limits.REPLICATION_BODY_SIZE_MAX + 1)], "exceeds"),
    ([FETCH[0], b"[" * 60_000], "nests too deep"),
    ([FETCH[0], b"[]"], "must be a JSON object"),
    (_with_body(FETCH, extra=1), "unknown ['extra']"),
    (_with_body(FETCH, observer=1), "observer must be true or false"),
    (_with_body(FETCH, max_wait_ms=10**6), "max_wait_ms must be an integer"),
    (_with_body(FETCH, max_wait_ms=1.5), "max_wait_ms must be an integer"),
    (_with_body(FETCH, max_wait_ms=True), "max_wait_ms must be an integer"),
    (_with_body(FETCH, replica_id=3), "not the sender's broker id"),
    (_with_body(FETCH, partitions={}), "must be a list"),
    (_with_body(FETCH, partitions=[1]), "must be a JSON object"),
    (_with_entry(FETCH, partition=-1), "partition must be an integer"),
    (_with_entry(FETCH, topic_key=2**63), "topic_key must be an integer"),
    (_with_entry(FETCH, fetch_offset=-1), "fetch_offset must be an integer"),
    (_with_entry(FETCH, partition=3, topic_key=-5), "names a partition twice"),
    (FETCH + [b"x"], "0 record frames in its body and 1 after it"),
    (FETCH_RESPONSE[:3], "2 record frames in its body and 1 after it"),
    (FETCH_RESPONSE[:2] + [FETCH_RESPONSE[3], FETCH_RESPONSE[2]], "records_bytes is 300"),
    (_with_entry(FETCH_RESPONSE, error=9999), "known error code"),
    (_with_entry(FETCH_RESPONSE, records_bytes=-1), "records_bytes must be an integer"),
    ([_envelope(type=7, correlation=0), json.dumps({"error": 42, "message": "x" * 2000}).encode()],
     "at most 1024 characters"),
    ([_envelope(type=7), b'{"error": 42, "message": "ok"}', b"x"], "has 2 frames"),
    ([_envelope(type=5), json.dumps({"acks": -1, "timeout_ms": 5, "partitions": [
        {"topic_key": 1, "partition": 0, "records_bytes": 0}]}).encode()], "records_bytes"),
])
def test_malformed_frames_are_refused(frames, complaint):
    with pytest.raises(ReplicationProtocolError, match=None) as raised:
        decode(frames)
    assert complaint in str(raised.value)
    assert isinstance(raised.value, PeerProtocolError)


def test_encode_refuses_what_a_peer_would_refuse():
    with pytest.raises(LocalProtocolError, match="partition_max_bytes"):
        encode(Message(2, 1, 1, Fetch(2, False, 0, 1, 1, (
            FetchPartition(1, 0, 0, 0, 0, limits.REPLICATION_RECORDS_SIZE_MAX + 1),))))
    with pytest.raises(LocalProtocolError, match="correlation id above 0"):
        encode(Message(2, 1, 0, EpochEnd(())))
    with pytest.raises(LocalProtocolError, match="must be an integer"):
        encode(Message(2, 1, 1, EpochEnd((EpochEndPartition(1, 0, 1.5, 0),))))
    with pytest.raises(LocalProtocolError, match="bytes-like"):
        encode(Message(2, 1, 1, Produce(1, 0, (ProducePartition(1, 0, [1, 2]),))))
    with pytest.raises(LocalProtocolError, match="not a replication message"):
        encode(Message(2, 1, 1, "FETCH"))
    long = encode(Message(2, 1, 0, Error(ErrorCode.INVALID_REQUEST, "y" * 5000)))
    assert len(decode(long).body.message) == limits.REPLICATION_ERROR_MESSAGE_LENGTH_MAX


def test_numpy_integers_and_enums_encode_as_integers():
    message = Message(2, 1, 1, EpochEnd((EpochEndPartition(np.int64(5), np.int32(1), 2, 1),)))
    assert decode(encode(message)) == Message(2, 1, 1, EpochEnd((EpochEndPartition(5, 1, 2, 1),)))


# --- fuzzing --------------------------------------------------------------------------

def _decodes_or_refuses(frames) -> None:
    try:
        decode(frames)
    except ReplicationProtocolError:
        pass


VALID = [encode(message) for message in MESSAGES]
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_fuzz_mutated_messages(frames, data):
    frames = [bytearray(memoryview(frame).tobytes()) for frame in frames]
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "truncate", "extend", "drop", "add", "swap"]))
        index = data.draw(st.integers(0, len(frames) - 1)) if frames else 0
        if action == "flip" and frames and frames[index]:
            position = data.draw(st.integers(0, len(frames[index]) - 1))
            frames[index][position] ^= data.draw(st.integers(1, 255))
        elif action == "truncate" and frames:
            del frames[index][data.draw(st.integers(0, len(frames[index]))):]
        elif action == "extend" and frames:
            frames[index] += data.draw(st.binary(max_size=8))
        elif action == "drop" and frames:
            del frames[index]
        elif action == "add":
            frames.insert(index, bytearray(data.draw(st.binary(max_size=40))))
        elif action == "swap" and len(frames) > 1:
            other = data.draw(st.integers(0, len(frames) - 1))
            frames[index], frames[other] = frames[other], frames[index]
    _decodes_or_refuses(frames)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20)
FIELD_NAMES = sorted({name for cls in (Fetch, FetchPartition, FetchResponsePartition,
                                       EpochEndPartition, EpochEndResponsePartition, Produce,
                                       ProducePartition, ProduceResponsePartition, GroupRequest,
                                       GroupResponse, Error)
                      for name in cls.SCHEMA} | {"partitions", "records_bytes"})
ALMOST = st.recursive(
    st.integers(-3, 2**31) | st.booleans() | st.none() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(FIELD_NAMES), children, max_size=8),
    max_leaves=30)


@FUZZ
@given(st.integers(1, 9), JSON | ALMOST, st.lists(st.binary(max_size=16), max_size=3))
def test_fuzz_bodies_behind_valid_envelopes(message_type, body, extra_frames):
    envelope = _envelope(type=message_type, sender=2)
    _decodes_or_refuses([envelope, json.dumps(body).encode()] + extra_frames)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_fuzz_arbitrary_frames(frames):
    _decodes_or_refuses(frames)


def test_a_forwarded_group_text_is_bounded():
    """GROUP and GROUP_RESPONSE carry a control frame's text: one longer than
    GROUP_FORWARD_TEXT_LENGTH_MAX is refused before it is sent, and the longest,
    even all quotes (JSON doubles them), fits a body a peer accepts."""
    with pytest.raises(LocalProtocolError, match="at most"):
        encode(Message(2, 1, 1, GroupRequest("x" * (limits.GROUP_FORWARD_TEXT_LENGTH_MAX + 1))))
    longest = '"\\' * (limits.GROUP_FORWARD_TEXT_LENGTH_MAX // 2)
    assert decode(encode(Message(1, 1, 1, GroupResponse(longest)))).body.reply == longest


@pytest.mark.parametrize("forgotten", [[[1]], [[1, 2, 3]], [["1", 2]], [[1, -1]], "x", [[1, True]]])
def test_a_malformed_forgotten_list_is_refused(forgotten):
    frames = encode(MESSAGES[0])
    body = json.loads(bytes(frames[1]))
    body["forgotten"] = forgotten
    frames[1] = json.dumps(body).encode()
    with pytest.raises(ReplicationProtocolError, match="forgotten"):
        decode(frames)
