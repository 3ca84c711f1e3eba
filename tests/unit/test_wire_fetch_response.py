"""The hand-written Fetch response, read back by two independent codecs for every
version served (4-12): kafka-python's ``FetchResponse`` (built from Kafka's schema,
the codec the listener uses) and kio's (another implementation, from the same
schemas).

Goal: any Kafka client reads every field of every response the listener writes; the
record bytes arrive exactly; the record buffers are passed to ``sendmsg`` as given,
never copied; and a real stored batch, converted for Kafka, reaches kafka-python's
record parser whole through the response.

Method:

* Hypothesis draws whole responses (topics of any Unicode name, partitions with
  every field over its full range, null and empty aborted lists and records, record
  buffers of several kinds: bytes, memoryviews, numpy arrays, a memoryview of 8-byte
  items whose ``len`` is not its size). Each is encoded, joined and decoded with
  header and size prefix by kafka-python, whose own encoding of what it decoded must
  equal ours byte for byte, and by kio, which must consume the frame exactly; both
  must give back every field the version has.
* The output list holds every record buffer given, the same object, in order.
* A response goes through a real socket pair with ``sendmsg``, carrying batches
  ``encode_batch`` made (one of them zstd) and ``to_kafka`` converted, and its
  records are read with ``kafka.record.MemoryRecords``.
* Versions outside 4-12 are refused; a response of many partitions without records
  is one buffer.
"""

from __future__ import annotations

import datetime
import importlib
import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.record import MemoryRecords
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from shmlog.common.errors import LocalProtocolError
from shmlog.record import batch_layout as B
from shmlog.record import records as R
from shmlog.record.kafka_batches import to_kafka
from shmlog.wire.fetch_response import VERSIONS, FetchedPartition, encode_fetch_response

INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)
ERROR_CODES = st.sampled_from(sorted(code.value for code in ErrorCode))   # kio knows these


@st.composite
def record_buffers(draw):
    """A buffer of bytes in one of the kinds a caller may give."""
    data = draw(st.binary(max_size=64))
    kind = draw(st.sampled_from(["bytes", "memoryview", "array", "wide"]))
    if kind == "memoryview":
        return memoryview(data)
    if kind == "array":
        return np.frombuffer(data, np.uint8).copy()
    if kind == "wide":                    # 8-byte items: its len is not its size
        return memoryview(np.frombuffer(data + bytes(-len(data) % 8), "<u8").copy())
    return data


RECORD_BUFFERS = st.none() | st.lists(record_buffers(), max_size=3)


@st.composite
def partitions(draw) -> FetchedPartition:
    return FetchedPartition(
        partition=draw(INT32), error_code=draw(ERROR_CODES), high_watermark=draw(INT64),
        last_stable_offset=draw(INT64), log_start_offset=draw(INT64),
        aborted=draw(st.none() | st.lists(st.tuples(INT64, INT64), max_size=3)),
        records=draw(RECORD_BUFFERS), preferred_read_replica=draw(INT32))


TOPICS = st.lists(st.tuples(st.text(max_size=20), st.lists(partitions(), max_size=4)),
                  max_size=3)


def joined(buffers: list) -> bytes:
    return b"".join(memoryview(buffer).cast("B") for buffer in buffers)


def expected(version: int, correlation_id: int, throttle: int, error: int, session: int,
             topics) -> dict:
    """The fields ``version`` carries, as the tests compare them."""
    def partition(answer: FetchedPartition) -> tuple:
        fields = [answer.partition, answer.error_code, answer.high_watermark,
                  answer.last_stable_offset]
        if version >= 5:
            fields.append(answer.log_start_offset)
        fields.append(None if answer.aborted is None else [tuple(a) for a in answer.aborted])
        if version >= 11:
            fields.append(answer.preferred_read_replica)
        fields.append(None if answer.records is None else joined(answer.records))
        return tuple(fields)

    return {"correlation_id": correlation_id, "throttle_time_ms": throttle,
            "error_code": error if version >= 7 else None,
            "session_id": session if version >= 7 else None,
            "topics": [(name, [partition(answer) for answer in answers])
                       for name, answers in topics]}


def read_by_kafka_python(version: int, data: bytes) -> dict:
    response = FetchResponse.decode(data, version=version, header=True, framed=True)
    # kafka-python writes what it read back byte for byte: nothing was left unread,
    # misread, or read as a default.
    assert response.encode(header=True, framed=True) == data

    def partition(got) -> tuple:
        fields = [got.partition_index, got.error_code, got.high_watermark,
                  got.last_stable_offset]
        if version >= 5:
            fields.append(got.log_start_offset)
        aborted = got.aborted_transactions
        fields.append(None if aborted is None else
                      [(entry.producer_id, entry.first_offset) for entry in aborted])
        if version >= 11:
            fields.append(got.preferred_read_replica)
        fields.append(None if got.records is None else bytes(got.records))
        return tuple(fields)

    return {"correlation_id": response.header.correlation_id,
            "throttle_time_ms": response.throttle_time_ms,
            "error_code": response.error_code if version >= 7 else None,
            "session_id": response.session_id if version >= 7 else None,
            "topics": [(topic.topic, [partition(got) for got in topic.partitions])
                       for topic in response.responses]}


def read_by_kio(version: int, data: bytes) -> dict:
    schema = importlib.import_module(f"kio.schema.fetch.v{version}.response").FetchResponse
    header, header_size = entity_reader(schema.__header_schema__)(data, 4)
    response, body_size = entity_reader(schema)(data, 4 + header_size)
    assert 4 + header_size + body_size == len(data)

    def partition(got) -> tuple:
        fields = [got.partition_index, got.error_code.value, got.high_watermark,
                  got.last_stable_offset]
        if version >= 5:
            fields.append(got.log_start_offset)
        aborted = got.aborted_transactions
        fields.append(None if aborted is None else
                      [(entry.producer_id, entry.first_offset) for entry in aborted])
        if version >= 11:
            fields.append(got.preferred_read_replica)
        fields.append(None if got.records is None else bytes(got.records))
        return tuple(fields)

    return {"correlation_id": header.correlation_id,
            "throttle_time_ms": response.throttle_time // datetime.timedelta(milliseconds=1),
            "error_code": response.error_code.value if version >= 7 else None,
            "session_id": response.session_id if version >= 7 else None,
            "topics": [(topic.topic, [partition(got) for got in topic.partitions])
                       for topic in response.responses]}


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), correlation_id=INT32,
       throttle=st.integers(0, 2**31 - 1), error=ERROR_CODES, session=INT32, topics=TOPICS)
def test_every_version_reads_back_in_both_codecs(version, correlation_id, throttle, error,
                                                session, topics):
    buffers = encode_fetch_response(version, correlation_id, topics, error_code=error,
                                    session_id=session, throttle_time_ms=throttle)
    data = joined(buffers)
    assert int.from_bytes(data[:4], "big", signed=True) == len(data) - 4
    want = expected(version, correlation_id, throttle, error, session, topics)
    assert read_by_kafka_python(version, data) == want
    assert read_by_kio(version, data) == want
    # The record buffers are in the output themselves, in order: nothing copied.
    rest = iter(buffers)
    for answer in (answer for _, answers in topics for answer in answers):
        for record in answer.records or ():
            assert any(sent is record for sent in rest)


@pytest.mark.parametrize("version", [4, 12])
def test_record_buffers_are_passed_through(version):
    records = [memoryview(b"first batch"), np.frombuffer(b"second", np.uint8)]
    buffers = encode_fetch_response(version, 42, [("t", [FetchedPartition(0, records=records)])])
    assert [buffer for buffer in buffers if any(buffer is r for r in records)] == records
    assert len(buffers) == 4              # fields, the two batches, what follows them


def test_partitions_without_records_make_one_buffer():
    topics = [(f"topic-{index}", [FetchedPartition(partition) for partition in range(10)])
              for index in range(100)]
    for version in (4, 12):
        buffers = encode_fetch_response(version, 1, topics)
        assert len(buffers) == 1
        decoded = FetchResponse.decode(buffers[0], version=version, header=True, framed=True)
        assert sum(len(topic.partitions) for topic in decoded.responses) == 1000


@pytest.mark.parametrize("version", [-1, 0, 3, 13, 18])
def test_versions_not_written_are_refused(version):
    with pytest.raises(LocalProtocolError, match="v4-v12"):
        encode_fetch_response(version, 1, [])


def stored_run() -> np.ndarray:
    """Two batches as a read of the log gives them: offsets 40-42, then 43-44 (zstd)."""
    first = R.encode_batch([b"v0", None, b""], keys=[b"k0", None, b"k2"],
                           headers=[[("h", b"x")], [], [("n", None)]],
                           timestamps=[1000, 1001, 1002])
    second = R.encode_batch([b"z" * 500, b"y"], timestamps=[2000, 2001], compression="zstd")
    for batch, base in ((first, 40), (second, 43)):
        batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)["base_offset"] = base
    return np.concatenate([first, second])


STORED = [(40, b"k0", b"v0", [("h", b"x")], 1000), (41, None, None, [], 1001),
          (42, b"k2", b"", [("n", None)], 1002), (43, None, b"z" * 500, [], 2000),
          (44, None, b"y", [], 2001)]


def send_and_receive(buffers: list) -> bytes:
    """``buffers`` through a real socket with ``sendmsg``, read back whole."""
    sender, receiver = socket.socketpair()
    with sender, receiver:
        size = sum(memoryview(buffer).nbytes for buffer in buffers)
        assert sender.sendmsg(buffers) == size          # small: one call sends it all
        received = bytearray()
        while len(received) < size:
            received += receiver.recv(size - len(received))
    return bytes(received)


@pytest.mark.parametrize("version", [4, 11, 12])
def test_stored_batches_reach_kafka_pythons_record_parser(version):
    kafka_batches = to_kafka(stored_run())
    answer = FetchedPartition(3, 0, 45, 45, 40, aborted=[], records=[kafka_batches])
    buffers = encode_fetch_response(version, 9, [("events", [answer])])
    assert any(buffer is kafka_batches for buffer in buffers)
    response = FetchResponse.decode(send_and_receive(buffers), version=version, header=True,
                                    framed=True)
    partition = response.responses[0].partitions[0]
    assert (partition.partition_index, partition.high_watermark) == (3, 45)
    records = MemoryRecords(partition.records)
    found = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        found += [(record.offset, record.key, record.value, list(record.headers),
                   record.timestamp) for record in batch]
    assert found == STORED
