"""ListOffsets and OffsetForLeaderEpoch through real clients: the earliest and latest
offsets and the offset of a time as librdkafka and kafka-python ask for them, a
deleted prefix moving the earliest, and OffsetForLeaderEpoch and the fencing of a
stale current leader epoch as kafka-python's classes encode them.

Method: the module's broker (``kafka_broker``); records put with shmlog's own
Producer at chosen timestamps; every wait bounded.
"""

from __future__ import annotations

import socket
import struct

from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import TopicPartition as KafkaClientPartition
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

from shmlog import Admin, Producer

WAIT_S = 20.0
BASE_MS = 1_700_000_000_000


def _put(data_dir: str, topic: str, timestamps: list[int]) -> None:
    with Producer(data_dir) as producer:
        for index, timestamp in enumerate(timestamps):
            producer.send(topic, f"v{index}".encode(), partition=0, timestamp_ms=timestamp)
        producer.flush(timeout=WAIT_S)


def _ask(address: str, request, response_class):
    """One request on a raw socket, encoded and decoded by kafka-python's classes."""
    host, port = address.rsplit(":", 1)
    request.with_header(correlation_id=5, client_id="offsets-test")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        payload = sock.recv(size, socket.MSG_WAITALL)
    flexible = response_class.flexible_version_q(request.API_VERSION)
    body = payload[4 + (1 if flexible else 0):]
    return response_class.decode(body, version=request.API_VERSION)


def test_kafka_python_reads_earliest_latest_and_times(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("times", 1)
    _put(data_dir, "times", [BASE_MS + 10 * index for index in range(10)])
    consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=10_000)
    try:
        partition = TopicPartition("times", 0)
        assert consumer.beginning_offsets([partition]) == {partition: 0}
        assert consumer.end_offsets([partition]) == {partition: 10}
        found = consumer.offsets_for_times({partition: BASE_MS + 35})[partition]
        assert (found.offset, found.timestamp) == (4, BASE_MS + 40)
        assert consumer.offsets_for_times({partition: BASE_MS + 1000})[partition] is None
    finally:
        consumer.close()


def test_librdkafka_reads_the_watermarks_and_times(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("watermarks", 1)
    _put(data_dir, "watermarks", [BASE_MS + index for index in range(5)])
    Admin(data_dir).delete_records({("watermarks", 0): 2})
    consumer = KafkaClientConsumer({"bootstrap.servers": address, "group.id": "unused"})
    try:
        assert consumer.get_watermark_offsets(KafkaClientPartition("watermarks", 0),
                                              timeout=WAIT_S) == (2, 5)
        [found] = consumer.offsets_for_times([KafkaClientPartition("watermarks", 0, BASE_MS + 3)],
                                             timeout=WAIT_S)
        assert found.offset == 3 and found.error is None
    finally:
        consumer.close()


def test_the_largest_timestamp_and_an_unknown_partition(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("largest", 1)
    _put(data_dir, "largest", [BASE_MS + 5, BASE_MS + 90, BASE_MS + 20])
    topic = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest[7](replica_id=-1, isolation_level=1, topics=[
        topic(name="largest", partitions=[
            topic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-3),
            topic.ListOffsetsPartition(partition_index=7, current_leader_epoch=-1, timestamp=-1)])])
    response = _ask(address, request, ListOffsetsResponse)
    largest, unknown = response.topics[0].partitions
    assert (largest.error_code, largest.offset, largest.timestamp) == (0, 1, BASE_MS + 90)
    assert unknown.error_code == 3                           # UNKNOWN_TOPIC_OR_PARTITION


def test_offset_for_leader_epoch_and_a_fenced_epoch(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("epochs", 1)
    _put(data_dir, "epochs", [BASE_MS] * 3)
    topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    asked = [topic.OffsetForLeaderPartition(partition=0, current_leader_epoch=0, leader_epoch=0),
             topic.OffsetForLeaderPartition(partition=0, current_leader_epoch=5, leader_epoch=0)]
    request = OffsetForLeaderEpochRequest[4](replica_id=-1,
                                             topics=[topic(topic="epochs", partitions=asked)])
    current, unknown = _ask(address, request, OffsetForLeaderEpochResponse).topics[0].partitions
    assert (current.error_code, current.leader_epoch, current.end_offset) == (0, 0, 3)
    assert unknown.error_code == 75                          # UNKNOWN_LEADER_EPOCH


def test_every_list_offsets_version_answers_earliest_and_latest(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("versions", 1)
    _put(data_dir, "versions", [BASE_MS] * 4)
    Admin(data_dir).delete_records({("versions", 0): 1})
    topic = ListOffsetsRequest.ListOffsetsTopic
    for version in range(1, 8):
        asked = [topic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                            timestamp=timestamp) for timestamp in (-2, -1)]
        request = ListOffsetsRequest[version](replica_id=-1, isolation_level=0,
                                              topics=[topic(name="versions", partitions=asked)])
        earliest, latest = _ask(address, request, ListOffsetsResponse).topics[0].partitions
        assert (earliest.error_code, earliest.offset) == (0, 1), version
        assert (latest.error_code, latest.offset) == (0, 4), version
