"""A Fetch's byte budgets through the listener, as KIP-74 sets them: whole batches only,
``partition_max_bytes`` per partition and ``max_bytes`` for the response, and the first
batch of the first partition with data sent however large it is (so a consumer is
never stuck behind a batch larger than it asked for), after which a partition whose
next batch does not fit gets nothing this time.

Method: the module's broker (``kafka_broker``); batches of known stored sizes written
with shmlog's Producer (``send_batch``: one batch each); raw Fetch requests (v4 and
v12, encoded by kafka-python's classes) on a socket; the batches of each partition's
records counted with ``kafka.record.MemoryRecords``. The limits a test sets are the
stored sizes of the batches, as the log reads them, or (zstd batches, which go out
inflated) the sizes sent.
"""

from __future__ import annotations

import socket
import struct

import pytest
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.record import MemoryRecords

from shmlog import Admin, Producer
from shmlog.record import records as R

WAIT_S = 20.0
BIG = 1 << 30


def batch_values(count: int, size: int) -> list[bytes]:
    return [b"%d-" % index + b"x" * size for index in range(count)]


def write(data_dir: str, topic: str, batches: dict[int, list[list[bytes]]]) -> dict:
    """Each partition's batches (lists of values), one stored batch each; returns each
    partition's stored batch sizes."""
    sizes = {}
    with Producer(data_dir) as producer:
        for partition, values_of_batches in batches.items():
            for values in values_of_batches:
                producer.send_batch(topic, values, partition=partition)
            sizes[partition] = [R.encode_batch(values).size for values in values_of_batches]
        producer.flush(timeout=WAIT_S)
    return sizes


def exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes (MSG_WAITALL on a socket with a timeout may return fewer)."""
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)


def fetch(address: str, topic: str, partitions: list[tuple[int, int, int]], max_bytes: int,
          version: int) -> dict[int, list[list[bytes]]]:
    """Fetch ``(partition, fetch offset, partition_max_bytes)`` once; returns each
    partition's batches as lists of record values."""
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=limit)
            for partition, offset, limit in partitions])])
    request.with_header(correlation_id=5, client_id="budgets")
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", exactly(sock, 4))[0]
        frame = struct.pack(">i", size) + exactly(sock, size)
    response = FetchResponse.decode(frame, version=version, header=True, framed=True)
    found = {}
    for answer in response.responses[0].partitions:
        assert answer.error_code == 0
        records, batches = MemoryRecords(answer.records or b""), []
        while (batch := records.next_batch()) is not None:
            batches.append([record.value for record in batch])
        found[answer.partition_index] = batches
    return found


@pytest.fixture(scope="module")
def topic(kafka_broker):
    """A topic of three partitions: 0 holds a batch larger than every limit below,
    then a small one; 1 three batches of about 1 KB; 2 stays empty."""
    data_dir, _ = kafka_broker
    Admin(data_dir).create_topic("budgets", 3)
    batches = {0: [batch_values(8, 4000), batch_values(1, 10)],
               1: [batch_values(2, 500), batch_values(3, 300), batch_values(1, 900)]}
    return "budgets", batches, write(data_dir, "budgets", batches)


@pytest.mark.parametrize("version", [4, 12])
def test_the_first_batch_comes_whole_however_large_and_nothing_after_it(kafka_broker, topic,
                                                                       version):
    name, batches, sizes = topic
    assert sizes[0][0] > 30_000
    got = fetch(kafka_broker[1], name, [(0, 0, 100), (1, 0, 100)], 100, version)
    assert got == {0: [batches[0][0]], 1: []}          # the rest of the budget is spent


@pytest.mark.parametrize("version", [4, 12])
def test_the_first_partition_with_data_is_the_one_that_gets_its_first_batch(
        kafka_broker, topic, version):
    name, batches, _ = topic
    got = fetch(kafka_broker[1], name, [(2, 0, 10), (0, 0, 10), (1, 0, 10)], 10, version)
    assert got == {2: [], 0: [batches[0][0]], 1: []}


@pytest.mark.parametrize("version", [4, 12])
def test_batches_that_fit_exactly_are_sent_and_one_byte_less_drops_the_last(
        kafka_broker, topic, version):
    name, batches, sizes = topic
    two = sum(sizes[1][:2])
    address = kafka_broker[1]
    assert fetch(address, name, [(1, 0, two)], BIG, version) == {1: batches[1][:2]}
    assert fetch(address, name, [(1, 0, two - 1)], BIG, version) == {1: batches[1][:1]}
    assert fetch(address, name, [(1, 0, BIG)], two, version) == {1: batches[1][:2]}
    assert fetch(address, name, [(1, 0, BIG)], two - 1, version) == {1: batches[1][:1]}
    assert fetch(address, name, [(1, 0, sum(sizes[1]))], BIG, version) == {1: batches[1]}


@pytest.mark.parametrize("version", [4, 12])
def test_a_later_partition_gets_what_the_first_left(kafka_broker, topic, version):
    name, batches, sizes = topic
    # The small second batch of partition 0 first, then partition 1 with room for
    # well over its first batch (the room left counts the bytes sent, as Kafka's
    # batches: every limit here is far from any batch's edge).
    small = len(batches[0][0])                          # its offset: after the big batch
    got = fetch(kafka_broker[1], name, [(0, small, BIG), (1, 0, BIG)],
                sizes[0][1] + sizes[1][0] + sizes[1][1] // 2, version)
    assert got == {0: [batches[0][1]], 1: batches[1][:1]}


@pytest.mark.parametrize("version", [4, 12])
def test_the_budget_counts_zstd_batches_as_sent_inflated(kafka_broker, version):
    # 10 batches of 1,000 zero kilobytes: ~1 KB each stored, ~1 MB each as Kafka's.
    data_dir, address = kafka_broker
    name = f"inflated-{version}"
    Admin(data_dir).create_topic(name, 2)
    with Producer(data_dir, compression="zstd") as producer:
        for partition in (0, 1):
            for _ in range(10):
                producer.send_batch(name, [bytes(1000)] * 1000, partition=partition)
        producer.flush(timeout=WAIT_S)
    got = fetch(address, name, [(0, 0, 5 << 20), (1, 0, 5 << 20)], 2_500_000, version)
    assert [len(got[0]), len(got[1])] == [2, 0]         # not all 10 (10 MB) of the first
    got = fetch(address, name, [(0, 0, 100), (1, 0, 100)], 100, version)
    assert [len(got[0]), len(got[1])] == [1, 0]         # the first batch, whole
    assert got[0][0] == [bytes(1000)] * 1000
