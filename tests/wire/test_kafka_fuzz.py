"""The Kafka listener fuzzed with hypothesis (issue 28): valid headers with garbage
bodies, valid bodies mutated (truncated, bytes flipped, lengths inside set huge or
negative), frames cut short then half-closed, sizes over ``socket.request.max.bytes``,
unknown API keys and versions, and record batches damaged past their CRC (given a
matching CRC again) produced and fetched back. Whatever each connection is sent, the broker stays
alive and another connection keeps being served.

Method: ONE broker process for the module (its output kept in a file), with a topic
holding a few records; each example opens a raw connection, sends its bytes, and
reads for at most ``READ_S`` whatever comes back: a response (whose size and
correlation id must match the request it answers), the connection closed, or
nothing (a request the broker holds: a long poll, acks=0). Then a well-behaved
connection, open across all examples, must get an ApiVersions and a Metadata answer
(about a topic no example can name) within ``WAIT_S``. At the end the broker process
is alive and its output holds no traceback: a client's bytes only ever close their
own connection.

Requests are drawn from kafka-python's schemas (``codec.request_class``): for every
API key the broker advertises and each of its versions, a message whose fields are
drawn from their types (strings, integers at their bounds, arrays of 0-3 items,
nulls where allowed), encoded, then mutated or not. Examples are derandomized
(hypothesis ``derandomize=True``): a failure reproduces on every run, and hypothesis
prints the falsifying example (API key, version, bytes).
"""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.errors import CorruptRecordError as KafkaCorruptRecordError
from kafka.protocol.schemas.fields.array import ArrayField
from kafka.protocol.schemas.fields.codecs import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)
from kafka.protocol.schemas.fields.struct import StructField
from kafka.protocol.schemas.fields.struct_array import StructArrayField
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from helpers import kafka_listener_address, unlink_shared_memory
from shmlog import Admin, Producer
from shmlog.native.crc32c import crc32c
from shmlog.server.broker import Broker
from shmlog.wire import codec

WAIT_S = 20.0             # the well-behaved connection's answer (a 2-core machine, loaded)
READ_S = 0.5              # what an example's connection may get back; silence is allowed
REQUEST_SIZE_MAX = 1024 * 1024
TOPIC = "fuzz-topic"          # the fuzz names it: it may delete it, or add partitions
# The topic the well-behaved connection asks about: longer than any string drawn, so
# no example names it.
CHECKED_TOPIC = "shmlog-fuzz-checked-topic"
# The topic damaged record batches are produced to (no example names it either).
PRODUCED_TOPIC = "shmlog-fuzz-produced-topic"
PRODUCE_KEY, FETCH_KEY = 0, 1
GROUP = "fuzz-group"
METADATA_KEY = 3
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")
# SHMLOG_FUZZ_SCALE=N runs N times the examples, NEW ones (random, not derandomized:
# hypothesis prints a failure's @reproduce_failure blob); by default the examples are
# derandomized, the same on every run.
SCALE = int(os.environ.get("SHMLOG_FUZZ_SCALE", "1"))
FUZZ = settings(deadline=None, derandomize=SCALE == 1, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


# -- the broker and the well-behaved connection ---------------------------------------

class _Raw:
    """A blocking connection that sends requests and reads their responses."""

    def __init__(self, address: str, timeout: float) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation = 0

    def ask(self, api_key: int, version: int, message):
        self.correlation += 1
        cls = codec.request_class(api_key)
        header = _HEADER.pack(api_key, version, self.correlation, 5) + b"check"
        if cls.flexible_version_q(version):
            header += b"\x00"
        payload = header + bytes(message.encode(version=version))
        self.sock.sendall(_SIZE.pack(len(payload)) + payload)
        size = _SIZE.unpack(self._exactly(4))[0]
        body = self._exactly(size)
        assert _SIZE.unpack_from(body)[0] == self.correlation
        flexible_header = api_key != codec.API_VERSIONS_KEY and \
            codec.response_class(api_key).flexible_version_q(version)
        return codec.response_class(api_key).decode(body[5 if flexible_header else 4:],
                                                    version=version)

    def _exactly(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            assert chunk, "the broker closed the well-behaved connection"
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()


class _Target:
    """The broker under fuzz: its address, what it advertises, its output file and
    the well-behaved connection."""

    def __init__(self, broker: Broker, address: str, output: str) -> None:
        self.broker = broker
        self.address = address
        self.output = output
        self.checker = _Raw(address, WAIT_S)
        answer = self.checker.ask(codec.API_VERSIONS_KEY, 3,
                                  codec.request_class(codec.API_VERSIONS_KEY)(
                                      version=3, client_software_name="fuzz",
                                      client_software_version="1"))
        assert answer.error_code == 0
        #: {api key: (min version, max version)} as ApiVersions advertises them
        self.versions = {entry.api_key: (entry.min_version, entry.max_version)
                         for entry in answer.api_keys}
        self.examples = 0
        self.outcomes: dict[str, int] = {}

    def still_served(self) -> None:
        """The well-behaved connection gets ApiVersions and Metadata answered."""
        api_versions = codec.request_class(codec.API_VERSIONS_KEY)
        answer = self.checker.ask(codec.API_VERSIONS_KEY, 3, api_versions(
            version=3, client_software_name="fuzz", client_software_version="1"))
        assert answer.error_code == 0 and len(answer.api_keys) == len(self.versions)
        version = self.versions[METADATA_KEY][1]
        metadata = codec.request_class(METADATA_KEY)
        topic = metadata.MetadataRequestTopic(name=CHECKED_TOPIC)
        if version >= 10:
            topic = metadata.MetadataRequestTopic(name=CHECKED_TOPIC, topic_id=uuid.UUID(int=0))
        answer = self.checker.ask(METADATA_KEY, version, metadata(
            version=version, topics=[topic], allow_auto_topic_creation=False))
        assert [(t.name, t.error_code) for t in answer.topics] == [(CHECKED_TOPIC, 0)]
        assert self.broker.process.poll() is None, "the broker process ended"

    def tally(self, outcome: str) -> None:
        self.examples += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("kafka-fuzz")
    data_dir, output = str(directory / "data"), str(directory / "broker.log")
    with Broker(data_dir, output=output, listeners="PLAINTEXT://127.0.0.1:0",
                socket_request_max_bytes=REQUEST_SIZE_MAX,
                group_initial_rebalance_delay_ms=0) as broker:
        Admin(data_dir).create_topic(TOPIC, 2)
        Admin(data_dir).create_topic(CHECKED_TOPIC, 1)
        Admin(data_dir).create_topic(PRODUCED_TOPIC, 2)
        with Producer(data_dir) as producer:
            for index in range(4):
                producer.send(TOPIC, f"record-{index}".encode(), partition=index % 2)
            producer.flush(timeout=WAIT_S)
        found = _Target(broker, kafka_listener_address(data_dir), output)
        try:
            yield found
        finally:
            found.checker.close()
            print(f"\nfuzzed {found.examples} connections: {found.outcomes}")
    unlink_shared_memory(data_dir)


# -- one example -----------------------------------------------------------------------

def _exchange(target: _Target, data: bytes, correlations: list[int],
              half_close: bool = False) -> str:
    """Send ``data`` on a new connection (then half-close it if asked); read for at
    most READ_S: the responses must answer ``correlations`` (distinct) in order.
    The outcome: "answered", "closed" or "silent"."""
    host, port = target.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"                       # closed while we still sent
        received = bytearray()
        deadline = time.monotonic() + READ_S
        answered = 0
        while answered < len(correlations):
            left = deadline - time.monotonic()
            if left <= 0:
                return "silent"
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return "silent"
            except ConnectionResetError:
                return "closed"
            if not chunk:
                return "closed"
            received += chunk
            while len(received) >= 4 and len(received) >= 4 + _SIZE.unpack_from(received)[0]:
                size = _SIZE.unpack_from(received)[0]
                assert size >= 4, f"a response of {size} bytes"
                # in order, each at most once; a produce with acks=0 has none
                answering = _SIZE.unpack_from(received, 4)[0]
                assert answering in correlations[answered:], \
                    f"a response to {answering}: out of order, or for no request sent"
                answered = correlations.index(answering, answered) + 1
                del received[:4 + size]
        return "answered"


def _run(target: _Target, frames: list[bytes], correlations: list[int],
         half_close: bool = False) -> None:
    target.tally(_exchange(target, b"".join(frames), correlations, half_close))
    target.still_served()


def _frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def _header(api_key: int, version: int, correlation: int) -> bytes:
    """A request header (v1, or v2 with no tagged fields for a flexible version)."""
    header = _HEADER.pack(api_key, version, correlation, 4) + b"fuzz"
    cls = codec.request_class(api_key)
    if cls is not None and 0 <= version and cls.flexible_version_q(version):
        header += b"\x00"
    return header


# -- messages drawn from kafka-python's schemas -----------------------------------------

_INTEGERS = {Int8: 8, Int16: 16, Int32: 32, Int64: 64}


def _integers(bits: int):
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return st.one_of(st.integers(-2, 4), st.sampled_from([low, high, -1]),
                     st.integers(low, high))


_STRINGS = st.one_of(st.sampled_from([TOPIC, GROUP, "", "fuzz"]), st.text(max_size=12))


def _simple(field, version: int):
    kind = field._type
    if kind in _INTEGERS:
        drawn = _integers(_INTEGERS[kind])
    elif kind is UnsignedInt16:
        drawn = st.integers(0, 65535)
    elif kind is Boolean:
        drawn = st.booleans()
    elif kind is Float64:
        drawn = st.floats(allow_nan=True)
    elif kind is UUID:
        drawn = st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    elif kind is BitField:
        drawn = st.none()
    elif isinstance(kind, String):
        drawn = _STRINGS
    elif kind is Bytes:
        drawn = st.binary(max_size=64)
    else:
        raise AssertionError(f"no strategy for {field!r}")
    return _nullable(field, version, drawn)


def _nullable(field, version: int, drawn):
    return st.one_of(st.none(), drawn) if field.nullable_for_version_q(version) else drawn


def _field(field, version: int):
    if isinstance(field, StructArrayField):
        return _nullable(field, version, st.lists(_struct(field, field.data_class, version),
                                                  max_size=3))
    if isinstance(field, ArrayField):
        return _nullable(field, version, st.lists(_simple(field.array_of, version),
                                                  max_size=3))
    if isinstance(field, StructField):
        return _nullable(field, version, _struct(field, field.data_class, version))
    return _simple(field, version)


def _struct(struct, make, version: int, fixed=None):
    fields = {field.name: _field(field, version) for field in struct.untagged_fields(version)}
    return st.fixed_dictionaries(fields).map(lambda drawn: make(**drawn, **(fixed or {})))


def _message(api_key: int, version: int):
    """A request of ``api_key`` at ``version`` with every untagged field drawn."""
    cls = codec.request_class(api_key)
    return _struct(cls._struct, cls, version, {"version": version})


@st.composite
def _requests(draw, versions: dict[int, tuple[int, int]]):
    """(api key, version, encoded body) of an API the broker serves."""
    api_key = draw(st.sampled_from(sorted(versions)))
    low, high = versions[api_key]
    version = draw(st.integers(low, high))
    message = draw(_message(api_key, version))
    return api_key, version, bytes(message.encode(version=version))


_HUGE = [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x7f\xff", b"\xff\xfe",
         b"\xff\xff\xff\xff\x07", b"\xfe\xff\xff\xff\x0f"]


@st.composite
def _mutated(draw, body: bytes) -> bytes:
    """``body`` truncated, bytes flipped, or a length inside it (int32, int16 or a
    compact varint at any offset) set huge or negative; 1 to 3 of these."""
    data = bytearray(body)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["truncate", "flip", "length"]))
        if how == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif how == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= draw(st.integers(1, 255))
        elif how == "length":
            at = draw(st.integers(0, len(data)))
            value = draw(st.sampled_from(_HUGE))
            # an int32 or int16 overwrites what is there; a varint replaces one byte
            width = 1 if len(value) == 5 else len(value)
            data[at:at + width] = value
    return bytes(data)


# -- the examples ----------------------------------------------------------------------

@settings(FUZZ, max_examples=200 * SCALE)
@given(data=st.data())
def test_valid_headers_with_garbage_bodies(target, data):
    api_key = data.draw(st.sampled_from(sorted(target.versions)), label="api key")
    low, high = target.versions[api_key]
    version = data.draw(st.integers(low, high), label="version")
    body = data.draw(st.binary(max_size=200), label="body")
    _run(target, [_frame(_header(api_key, version, 7) + body)], [7])


@settings(FUZZ, max_examples=500 * SCALE)
@given(data=st.data())
def test_valid_requests_and_mutated_ones(target, data):
    """Up to three requests sent at once on one connection (pipelined), each valid
    or mutated."""
    frames, correlations = [], []
    for correlation in range(1, data.draw(st.integers(1, 3), label="requests") + 1):
        api_key, version, body = data.draw(_requests(target.versions), label="request")
        if data.draw(st.booleans(), label="mutate"):
            body = data.draw(_mutated(body), label="mutated body")
        frames.append(_frame(_header(api_key, version, correlation) + body))
        correlations.append(correlation)
    _run(target, frames, correlations)


@settings(FUZZ, max_examples=60 * SCALE)
@given(data=st.data())
def test_frames_larger_than_sent_then_half_closed(target, data):
    api_key, version, body = data.draw(_requests(target.versions), label="request")
    payload = _header(api_key, version, 1) + body
    claimed = data.draw(st.integers(len(payload) + 1, REQUEST_SIZE_MAX), label="size")
    sent = data.draw(st.integers(0, len(payload)), label="bytes sent")
    _run(target, [_SIZE.pack(claimed) + payload[:sent]], [], half_close=True)


@settings(FUZZ, max_examples=40 * SCALE)
@given(size=st.one_of(st.integers(REQUEST_SIZE_MAX + 1, 2**31 - 1),
                      st.integers(-2**31, -1), st.sampled_from([2**31 - 1, -1, -2])),
       tail=st.binary(max_size=64))
def test_sizes_over_the_limit_or_negative(target, size, tail):
    _run(target, [_SIZE.pack(size) + tail], [1])


@settings(FUZZ, max_examples=80 * SCALE)
@given(data=st.data())
def test_unknown_api_keys_and_versions(target, data):
    served = target.versions
    if data.draw(st.booleans(), label="unknown key"):
        api_key = data.draw(st.integers(-2**15, 2**15 - 1).filter(lambda key: key not in served),
                            label="api key")
        version = data.draw(st.integers(-2**15, 2**15 - 1), label="version")
    else:
        api_key = data.draw(st.sampled_from(sorted(served)), label="api key")
        low, high = served[api_key]
        version = data.draw(st.one_of(st.integers(high + 1, 2**15 - 1),
                                      st.integers(-2**15, low - 1)), label="version")
    body = data.draw(st.binary(max_size=64), label="body")
    _run(target, [_frame(_header(api_key, version, 3) + body)], [3])


@settings(FUZZ, max_examples=60 * SCALE)
@given(frame=st.binary(max_size=14))
def test_headers_cut_short(target, frame):
    _run(target, [_frame(frame)], [_SIZE.unpack_from(frame, 4)[0]] if len(frame) >= 8 else [0])


_RECORDS = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=16)),
                               st.one_of(st.none(), st.binary(max_size=64)),
                               st.lists(st.tuples(st.text(max_size=4),
                                                  st.one_of(st.none(), st.binary(max_size=8))),
                                        max_size=2)),
                     min_size=1, max_size=5)


def _kafka_batch(records, codec_id: int) -> bytes:
    """A record batch v2 built by kafka-python (none, gzip or zstd)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec_id,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for index, (key, value, headers) in enumerate(records):
        builder.append(index, timestamp=1_700_000_000_000 + index, key=key, value=value,
                       headers=headers)
    return bytes(builder.build())


def _produce_then_fetch(partition: int, batch: bytes, produce_version: int,
                        fetch_version: int) -> list[bytes]:
    """A Produce (acks=1) of ``batch`` and a Fetch of the partition from offset 0."""
    produce = codec.request_class(PRODUCE_KEY)
    data = produce.TopicProduceData(name=PRODUCED_TOPIC, partition_data=[
        produce.TopicProduceData.PartitionProduceData(index=partition, records=batch)])
    fetch = codec.request_class(FETCH_KEY)
    asked = fetch.FetchTopic(topic=PRODUCED_TOPIC, topic_id=uuid.UUID(int=0), partitions=[
        fetch.FetchTopic.FetchPartition(partition=partition, fetch_offset=0,
                                        partition_max_bytes=1 << 20)])
    return [_frame(_header(PRODUCE_KEY, produce_version, 1) + bytes(produce(
                version=produce_version, transactional_id=None, acks=1, timeout_ms=5000,
                topic_data=[data]).encode(version=produce_version))),
            _frame(_header(FETCH_KEY, fetch_version, 2) + bytes(fetch(
                version=fetch_version, replica_id=-1, max_wait_ms=0, min_bytes=1,
                max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                topics=[asked], forgotten_topics_data=[], rack_id="").encode(
                    version=fetch_version)))]


@settings(FUZZ, max_examples=150 * SCALE)
@given(data=st.data())
def test_record_batches_damaged_past_their_crc(target, data):
    """Produce: kafka-python's batches (none, gzip, zstd), damaged (bytes flipped, a
    length set huge, cut short) and, mostly, given a CRC that matches again, so the
    broker's own structure checks (``record/kafka_batches.py``) meet them; then a
    Fetch of the partition sends back whatever was stored."""
    batch = bytearray(_kafka_batch(data.draw(_RECORDS, label="records"),
                                   data.draw(st.sampled_from([0, 1, 4]), label="codec")))
    if data.draw(st.integers(0, 9), label="damage") > 0:
        batch = bytearray(data.draw(_mutated(bytes(batch)), label="damaged"))
        if len(batch) > 21 and data.draw(st.integers(0, 4), label="recrc") > 0:
            batch[17:21] = crc32c(bytes(batch[21:])).to_bytes(4, "big")
    low, high = target.versions[PRODUCE_KEY]
    fetch_low, fetch_high = target.versions[FETCH_KEY]
    frames = _produce_then_fetch(data.draw(st.integers(0, 1), label="partition"), bytes(batch),
                                 data.draw(st.integers(low, high), label="produce version"),
                                 data.draw(st.integers(fetch_low, fetch_high),
                                           label="fetch version"))
    _run(target, frames, [1, 2])


def _parsed(batch) -> int:
    """How many records ``batch`` holds, each parsed by kafka-python; but a header key
    that is not UTF-8 is no fault (Kafka's broker does not check them either, and
    kafka-python refuses the batch for it): the batch is counted, unparsed."""
    try:
        return sum(1 for _ in batch)
    except KafkaCorruptRecordError as error:
        assert "UnicodeDecodeError" in str(error), error
        return 0


def test_what_was_stored_goes_back_to_kafka_with_a_valid_crc(target):
    """Every batch the broker took in the test above is sent back as Kafka's record
    batches whose CRCs match and whose records parse, and the offsets run on."""
    fetch = codec.request_class(FETCH_KEY)
    version = target.versions[FETCH_KEY][1]
    records = 0
    for partition in (0, 1):
        offset = 0
        while True:
            asked = fetch.FetchTopic(topic=PRODUCED_TOPIC, topic_id=uuid.UUID(int=0),
                                     partitions=[fetch.FetchTopic.FetchPartition(
                                         partition=partition, fetch_offset=offset,
                                         partition_max_bytes=1 << 20)])
            answer = target.checker.ask(FETCH_KEY, version, fetch(
                version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1, topics=[asked],
                forgotten_topics_data=[], rack_id=""))
            [answered] = answer.responses[0].partitions
            assert answered.error_code == 0
            batches = MemoryRecords(bytes(answered.records or b""))
            before = offset
            while (batch := batches.next_batch()) is not None:
                assert batch.validate_crc()
                offset = batch.base_offset + batch.last_offset_delta + 1
                records += _parsed(batch)
            if offset == before or offset >= answered.high_watermark:
                break
    print(f"\n{records} records stored from damaged batches read back")


def test_the_broker_survived_without_a_traceback(target):
    """Last: the broker lives, serves, and its output holds no traceback."""
    target.still_served()
    with open(target.output, encoding="utf-8", errors="replace") as output:
        log = output.read()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
    assert target.examples > 0
