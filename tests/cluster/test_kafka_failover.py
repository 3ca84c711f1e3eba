"""Kafka clients against a cluster through a failover: librdkafka's idempotent
producer at acks=all keeps producing while the partition's leader is killed -9, and
every record it was told is written is there afterwards, exactly once, as a
librdkafka consumer reads it; kafka-python's and aiokafka's idempotent producers
(through the client harness, tests/kafka_clients) do the same through a kill -9 of
the leader, as their own consumers read it; a batch stored in pieces and re-sent to
the new leader is not appended twice; a produce sent to a follower gets
NOT_LEADER_OR_FOLLOWER.

Method: the shared fault cluster (session timeout 3 s), a topic of one partition at
RF 3 with min.insync.replicas 2; the producer runs in a thread, sending a numbered
record every few milliseconds, and records which numbers were acknowledged; the
leader is killed once a few hundred are, then restarted (the fixture would too).
Every wait is bounded.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaClientConsumer
from confluent_kafka import Producer as KafkaClientProducer
from confluent_kafka import TopicPartition as KafkaClientPartition
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from cluster.workload import WAIT_S, leader_of, wait_for_leader, wait_in_sync
from kafka_clients import CLIENTS, Record
from kafka_clients.raw import receive_exactly
from shmlog import Admin

TOPIC = "kafka-failover"
# Records per round of a harness producer (one producer each).
ROUND = 50


def _acked_producer(cluster, stop: threading.Event, acked: set, errors: list) -> None:
    producer = KafkaClientProducer({"bootstrap.servers": cluster.bootstrap_servers,
                                    "enable.idempotence": True, "acks": "all",
                                    "linger.ms": 2, "message.timeout.ms": 60_000})

    def delivered(error, message) -> None:
        if error is None:
            acked.add(int(message.value()))
        else:
            errors.append(error)

    number = 0
    while not stop.is_set():
        producer.produce(TOPIC, str(number).encode(), on_delivery=delivered)
        producer.poll(0.003)
        number += 1
    assert producer.flush(WAIT_S) == 0


def _read_all(cluster, count_at_least: int) -> list[int]:
    consumer = KafkaClientConsumer({"bootstrap.servers": cluster.bootstrap_servers,
                                    "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([KafkaClientPartition(TOPIC, 0, 0)])
        found, deadline = [], time.monotonic() + WAIT_S
        while len(found) < count_at_least and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                found.append(int(message.value()))
        return found
    finally:
        consumer.close()


def test_acks_all_survives_a_leader_killed_and_nothing_is_doubled(fault_cluster):
    cluster = fault_cluster
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        TOPIC, 1, {"min.insync.replicas": "2"}, replication_factor=3)
    leader, _ = wait_for_leader(cluster, TOPIC)
    stop, acked, errors = threading.Event(), set(), []
    producing = threading.Thread(target=_acked_producer, args=(cluster, stop, acked, errors))
    producing.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(acked) < 300:
            assert time.monotonic() < deadline and producing.is_alive()
            time.sleep(0.05)
        cluster.kill(leader)
        wait_for_leader(cluster, TOPIC, not_in=(leader,))
        before = len(acked)
        while len(acked) < before + 300:                 # acknowledged by the new leader
            assert time.monotonic() < deadline + WAIT_S and producing.is_alive()
            time.sleep(0.05)
    finally:
        stop.set()
        producing.join(WAIT_S + 10)
    assert errors == []
    cluster.start_broker(leader)
    read = _read_all(cluster, len(acked))
    assert len(read) == len(set(read))                   # idempotent: nothing twice
    assert acked <= set(read)                            # nothing acknowledged lost


def _harness_producer(client, cluster, topic: str, stop: threading.Event, acked: set,
                      refused: list) -> None:
    """Rounds of numbered records through ``client``'s idempotent acks=all producer
    (a new producer each round) until ``stop``: a record reported written joins
    ``acked``, one reported failed goes to ``refused`` (never sent again)."""
    number = 0
    while not stop.is_set():
        records = [Record(b"%d" % (number + index), partition=0) for index in range(ROUND)]
        deliveries = client.produce(cluster.bootstrap_servers, topic, records, acks="all",
                                    idempotence=True, timeout_s=WAIT_S / 2)
        for record, delivery in zip(records, deliveries, strict=True):
            if delivery.error is None:
                acked.add(int(record.value))
            else:
                refused.append(delivery.error)
        number += ROUND


@pytest.mark.parametrize("name", ["kafka-python", "aiokafka"])
def test_a_python_client_loses_nothing_acknowledged_through_a_leader_killed(fault_cluster,
                                                                          name):
    client = CLIENTS[name]
    if client.missing():
        pytest.skip(client.missing())
    cluster = fault_cluster
    topic = f"kafka-failover-{name}-{uuid.uuid4().hex[:6]}"
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        topic, 1, {"min.insync.replicas": "2"}, replication_factor=3)
    leader, _ = wait_for_leader(cluster, topic)
    stop, acked, refused = threading.Event(), set(), []
    producing = threading.Thread(target=_harness_producer,
                                 args=(client, cluster, topic, stop, acked, refused))
    producing.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(acked) < 2 * ROUND:
            assert time.monotonic() < deadline and producing.is_alive(), refused[-3:]
            time.sleep(0.05)
        cluster.kill(leader)
        wait_for_leader(cluster, topic, not_in=(leader,))
        before = len(acked)
        while len(acked) < before + 2 * ROUND:            # acknowledged by the new leader
            assert time.monotonic() < deadline + WAIT_S and producing.is_alive(), refused[-3:]
            time.sleep(0.05)
    finally:
        stop.set()
        producing.join(WAIT_S + 10)
    cluster.start_broker(leader)
    end = _end_offset(cluster, topic)
    read = [int(record.value) for record in
            client.consume(cluster.bootstrap_servers, topic, end, offsets={0: 0},
                           timeout_s=WAIT_S)]
    assert len(read) == end                              # the whole log, as the client reads it
    assert len(read) == len(set(read))                   # idempotent: nothing twice
    assert acked <= set(read)                            # nothing acknowledged lost


def _end_offset(cluster, topic: str) -> int:
    """The partition's high watermark, as librdkafka asks the leader for it."""
    consumer = KafkaClientConsumer({"bootstrap.servers": cluster.bootstrap_servers,
                                    "group.id": "unused"})
    try:
        return consumer.get_watermark_offsets(KafkaClientPartition(topic, 0),
                                              timeout=WAIT_S)[1]
    finally:
        consumer.close()


def test_a_follower_refuses_produce_with_not_leader(fault_cluster):
    cluster = fault_cluster
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        "kafka-not-leader", 1, replication_factor=3)
    leader, _ = wait_for_leader(cluster, "kafka-not-leader")
    follower = next(broker for broker in (1, 2, 3) if broker != leader)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 16)
    builder.append(0, timestamp=1, key=None, value=b"x", headers=[])
    answer = _produce_to(cluster.kafka_address(follower), "kafka-not-leader",
                         bytes(builder.build()), acks=1)
    assert answer.error_code == 6                         # NOT_LEADER_OR_FOLLOWER
    assert leader_of(cluster, "kafka-not-leader") is not None


def _produce_to(address: str, topic: str, records: bytes, acks: int = -1):
    """One Produce (v9) of ``records`` to partition 0 of ``topic`` at ``address``:
    the partition's answer."""
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=acks, timeout_ms=int(WAIT_S * 1000),
                                topic_data=[data(name=topic, partition_data=[
                                    data.PartitionProduceData(index=0, records=records)])])
    request.with_header(correlation_id=1, client_id="raw")
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S + 5) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", receive_exactly(sock, 4))[0]
        payload = receive_exactly(sock, size)
    return ProduceResponse.decode(payload[5:], version=9).responses[0].partition_responses[0]


def _until_acknowledged(address: str, topic: str, records: bytes):
    """``_produce_to`` again, as a client re-sends, while the answer is one a client
    retries (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS(_AFTER_APPEND):
    a leader settling, followers slow to start on a loaded machine)."""
    deadline = time.monotonic() + 3 * WAIT_S
    while (answer := _produce_to(address, topic, records)).error_code in (6, 7, 19, 20):
        assert time.monotonic() < deadline, f"still {answer.error_code}"
        time.sleep(0.2)
    return answer


def _idempotent_batch(sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=4242, producer_epoch=0,
                                        base_sequence=sequence, batch_size=1 << 20)
    for index, value in enumerate(values):
        builder.append(index, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


def test_a_batch_stored_in_pieces_resent_to_the_new_leader_is_not_doubled(fault_cluster):
    """A Kafka batch over max.message.bytes once stored is appended in pieces; the
    followers remember the pieces one by one. Its leader killed -9, the batch
    re-sent to the new leader is acknowledged with its first offset (the run of
    pieces matched), not appended again."""
    cluster = fault_cluster
    topic = "kafka-pieces-failover"
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        topic, 1, {"min.insync.replicas": "2", "max.message.bytes": "4000"},
        replication_factor=3)
    leader, _ = wait_for_leader(cluster, topic)
    wait_in_sync(cluster, topic, (1, 2, 3))          # every copy remembers the pieces
    batch = _idempotent_batch(0, [bytes([index]) * 300 for index in range(40)])  # 3+ pieces
    first = _until_acknowledged(cluster.kafka_address(leader), topic, batch)
    assert (first.error_code, first.base_offset) == (0, 0)      # acks=all: on the ISR
    wait_in_sync(cluster, topic, (1, 2, 3))          # a follower slow to start caught up
    cluster.kill(leader)
    try:
        new_leader, _ = wait_for_leader(cluster, topic, not_in=(leader,))
        address = cluster.kafka_address(new_leader)
        again = _until_acknowledged(address, topic, batch)
        assert (again.error_code, again.base_offset) == (0, 0)
        follows = _until_acknowledged(address, topic, _idempotent_batch(40, [b"next"]))
        assert (follows.error_code, follows.base_offset) == (0, 40)
        assert _end_offset(cluster, topic) == 41                # nothing appended twice
    finally:
        cluster.start_broker(leader)
