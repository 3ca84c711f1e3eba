"""The hand-written Fetch response against kafka-python's own FetchResponse class
(built from Kafka's schema), for every version served: every field decodes back,
the record bytes round trip, and the record buffers are passed through, not copied."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse

from shmlog.wire.fetch_response import FetchedPartition, encode_fetch_response

int64 = st.integers(-1, 2**62)


@st.composite
def partitions(draw):
    records = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=3))
    aborted = draw(st.none() | st.lists(st.tuples(int64, int64), max_size=2))
    return FetchedPartition(draw(st.integers(0, 1000)), draw(st.integers(-1, 100)),
                            draw(int64), draw(int64), draw(int64), aborted,
                            [memoryview(record) for record in records],
                            draw(st.integers(-1, 5)))


def decode(version: int, buffers: list):
    data = b"".join(bytes(buffer) for buffer in buffers)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    header = 4 + 4 + (1 if version >= 12 else 0)        # size, correlation id, tags
    assert int.from_bytes(data[4:8], "big") == 42
    return FetchResponse.decode(data[header:], version=version)


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 12), st.lists(st.tuples(st.text(min_size=1, max_size=10),
                                              st.lists(partitions(), max_size=3)),
                                    max_size=3),
       st.integers(0, 100), st.integers(0, 2**31 - 1))
def test_every_version_decodes_back(version, topics, error, session):
    buffers = encode_fetch_response(version, 42, topics, error_code=error, session_id=session,
                                    throttle_time_ms=7)
    decoded = decode(version, buffers)
    assert decoded.throttle_time_ms == 7
    if version >= 7:
        assert (decoded.error_code, decoded.session_id) == (error, session)
    assert [topic.topic for topic in decoded.responses] == [name for name, _ in topics]
    for (_, sent), got in zip(topics, decoded.responses):
        for answer, partition in zip(sent, got.partitions, strict=True):
            assert (partition.partition_index, partition.error_code, partition.high_watermark,
                    partition.last_stable_offset) == (answer.partition, answer.error_code,
                                                      answer.high_watermark,
                                                      answer.last_stable_offset)
            if version >= 5:
                assert partition.log_start_offset == answer.log_start_offset
            if version >= 11:
                assert partition.preferred_read_replica == answer.preferred_read_replica
            aborted = partition.aborted_transactions
            assert (None if aborted is None else
                    [(entry.producer_id, entry.first_offset) for entry in aborted]) == \
                answer.aborted
            assert bytes(partition.records or b"") == b"".join(bytes(r) for r in answer.records)


@pytest.mark.parametrize("version", [4, 12])
def test_record_buffers_are_passed_through(version):
    records = [memoryview(b"first batch"), memoryview(b"second")]
    buffers = encode_fetch_response(version, 42, [("t", [FetchedPartition(0, records=records)])])
    assert sum(buffer is record for buffer in buffers for record in records) == 2
