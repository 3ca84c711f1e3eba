"""The codec refuses a request whose field is null where its version does not allow
it (found by tests/wire/test_kafka_fuzz.py: kafka-python decodes a length of -1 as
None whatever the schema says, and a Produce whose topic_data was -1 reached its
handler, which failed with a traceback); a null the schema allows, and a UUID of
zeros (Kafka's "no id", which kafka-python also decodes as None), still decode.

Method: request frames written by hand (header v1, then the body's fields), decoded
with ``codec.read_header`` and ``codec.decode_request``.
"""

from __future__ import annotations

import struct

import pytest

from shmlog.common.errors import KafkaRequestError
from shmlog.wire import codec

PRODUCE, LIST_OFFSETS, METADATA = 0, 2, 3


def _decode(api_key: int, version: int, body: bytes):
    frame = memoryview(struct.pack(">hhih", api_key, version, 9, -1) + body)
    return codec.decode_request(codec.read_header(frame), frame)


def _produce_v3(topic_data: bytes, transactional_id: bytes = b"\xff\xff") -> bytes:
    # transactional_id (nullable), acks int16, timeout_ms int32, topic_data array
    return transactional_id + struct.pack(">hi", 1, 1000) + topic_data


@pytest.mark.parametrize("api_key, version, body, field", [
    (PRODUCE, 3, _produce_v3(struct.pack(">i", -1)), "topic_data"),
    # one topic whose name is null, then no partitions
    (PRODUCE, 3, _produce_v3(struct.pack(">ihi", 1, -1, 0)), "topic_data.name"),
    # replica_id, then topics null
    (LIST_OFFSETS, 1, struct.pack(">ii", -1, -1), "topics"),
])
def test_a_null_the_version_does_not_allow_is_refused(api_key, version, body, field):
    with pytest.raises(KafkaRequestError, match=rf"{field} is null"):
        _decode(api_key, version, body)


def test_a_null_the_version_allows_decodes():
    assert _decode(PRODUCE, 3, _produce_v3(struct.pack(">i", 0))).transactional_id is None
    assert _decode(METADATA, 1, struct.pack(">i", -1)).topics is None   # every topic


def test_a_topic_id_of_zeros_is_not_a_null():
    # Metadata v12: topics [1: topic_id zeros, name compact "t", no tags], then
    # allow_auto_topic_creation, include_topic_authorized_operations, no tags
    body = b"\x02" + bytes(16) + b"\x02t" + b"\x00" + b"\x01\x00" + b"\x00"
    flexible = struct.pack(">hhih", METADATA, 12, 9, -1) + b"\x00" + body
    frame = memoryview(flexible)
    decoded = codec.decode_request(codec.read_header(frame), frame)
    assert [topic.name for topic in decoded.topics] == ["t"]
