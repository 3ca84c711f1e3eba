"""Transactions end to end on one broker process: a transactional Producer's commits
and aborts as read_committed and read_uncommitted consumers see them (poll,
poll_batch, iteration), the last stable offset holding readers at an open
transaction, offsets committed inside a transaction, and zombie fencing between two
producers of one transactional id.

Method: one broker process; shmlog's own Producer and Consumer; every wait bounded.
"""

from __future__ import annotations

import threading
import time

import pytest

from helpers import RestartableBroker
from shmlog import Admin, Consumer, Producer
from shmlog.client.consumer import TopicPartition
from shmlog.common.errors import IllegalStateError, ProducerFencedError, TransactionAbortedError
from shmlog.common.structs import OffsetAndMetadata
from shmlog.server.broker import Broker

WAIT_S = 30.0
POLL_MS = 200


@pytest.fixture
def broker(data_dir):
    with Broker(data_dir, group_initial_rebalance_delay_ms=0):
        with Admin(data_dir) as admin:
            admin.create_topic("out", 2)
            admin.create_topic("in", 1)
        yield data_dir


def read_all(data_dir: str, isolation_level: str, expected: int, *,
             topic: str = "out") -> list[bytes]:
    """Every record value a fresh consumer of ``topic`` reads (polling until
    ``expected`` are in, or WAIT_S; then once more to see nothing else comes)."""
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                  isolation_level=isolation_level) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)])
        values = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=POLL_MS).values():
                values += [record.value for record in records]
        for records in consumer.poll(timeout_ms=POLL_MS).values():
            values += [record.value for record in records]
        return sorted(values)


def test_committed_records_are_read_and_aborted_ones_never(broker):
    with Producer(broker, transactional_id="t1", linger_ms=0) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for index in range(4):
            producer.send("out", f"committed-{index}".encode(), partition=index % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("out", b"aborted-0", partition=0)
        producer.send_batch("out", [b"aborted-1", b"aborted-2"], partition=1)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("out", b"committed-4", partition=1)
        producer.commit_transaction()
    committed = sorted(f"committed-{index}".encode() for index in range(5))
    assert read_all(broker, "read_committed", 5) == committed
    assert read_all(broker, "read_uncommitted", 8) == sorted(
        committed + [b"aborted-0", b"aborted-1", b"aborted-2"])
    # poll_batch's columns and iteration leave the aborted records out too.
    with Consumer(bootstrap=broker, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition("out", 1)])
        columns = []
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, columns)) < 3 and time.monotonic() < deadline:
            columns += list(consumer.poll_batch(timeout_ms=POLL_MS).values())
        assert sorted(batch.value(index) for batch in columns for index in range(len(batch))) == \
            [b"committed-1", b"committed-3", b"committed-4"]
    with Consumer("out", bootstrap=broker, auto_offset_reset="earliest",
                  isolation_level="read_committed", consumer_timeout_ms=2_000) as consumer:
        assert sorted(record.value for record in consumer) == committed


def test_an_open_transaction_holds_read_committed_readers_at_its_first_offset(broker):
    with Producer(broker) as plain, \
            Producer(broker, transactional_id="t2", linger_ms=0) as producer:
        plain.send("out", b"before", partition=0).get(WAIT_S)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("out", b"open", partition=0).get(WAIT_S)
        plain.send("out", b"behind", partition=0).get(WAIT_S)
        assert read_all(broker, "read_committed", 1) == [b"before"]
        assert read_all(broker, "read_uncommitted", 3) == [b"before", b"behind", b"open"]
        with Consumer(bootstrap=broker, isolation_level="read_committed") as consumer:
            partition = TopicPartition("out", 0)
            consumer.assign([partition])
            assert consumer.end_offsets([partition])[partition] == 1, \
                "read_committed's end is the last stable offset"
        producer.commit_transaction()
    assert read_all(broker, "read_committed", 3) == [b"before", b"behind", b"open"]


def test_offsets_sent_to_a_transaction_count_once_it_commits(broker):
    with Producer(broker) as plain:
        plain.send_batch("in", [b"a", b"b", b"c"], partition=0).get(WAIT_S)
    with Consumer("in", bootstrap=broker, group_id="g", auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer, \
            Producer(broker, transactional_id="t3", linger_ms=0) as producer:
        producer.init_transactions()
        records = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < 3 and time.monotonic() < deadline:
            records += [r for batch in consumer.poll(timeout_ms=POLL_MS).values() for r in batch]
        assert len(records) == 3
        partition = TopicPartition("in", 0)
        for commit in (False, True):
            producer.begin_transaction()
            producer.send("out", b"transformed", partition=0)
            producer.send_offsets_to_transaction({partition: OffsetAndMetadata(3, "")},
                                                 consumer.group_metadata())
            assert consumer.committed(partition) is None
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
                assert consumer.committed(partition) is None
        assert consumer.committed(partition) == 3


def test_a_second_producer_of_the_id_fences_the_first(broker):
    first = Producer(broker, transactional_id="t4", linger_ms=0)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send("out", b"zombie", partition=0).get(WAIT_S)
        with Producer(broker, transactional_id="t4", linger_ms=0) as second:
            second.init_transactions()            # aborts the first's transaction
            with pytest.raises(ProducerFencedError):
                first.commit_transaction()
            with pytest.raises(ProducerFencedError):
                first.begin_transaction()
            second.begin_transaction()
            second.send("out", b"successor", partition=0)
            second.commit_transaction()
    finally:
        first.close()
    assert read_all(broker, "read_committed", 1) == [b"successor"]


def test_sends_need_a_transaction_and_a_failed_send_needs_an_abort(broker):
    with Producer(broker, transactional_id="t5", linger_ms=0) as producer:
        with pytest.raises(IllegalStateError, match="init_transactions"):
            producer.begin_transaction()
        producer.init_transactions()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            producer.send("out", b"outside", partition=0)
        producer.begin_transaction()
        producer.send("out", b"small", partition=0).get(WAIT_S)       # the limit is cached
        with Admin(broker) as admin:
            admin.alter_topic_config("out", {"max.message.bytes": 200})
        future = producer.send("out", b"x" * 500, partition=0)        # the broker refuses it
        producer.flush()
        assert future.failed()
        with pytest.raises(TransactionAbortedError):
            producer.commit_transaction()
        producer.abort_transaction()            # and a new epoch: the sequences start over
        producer.begin_transaction()
        producer.send("out", b"after", partition=0).get(WAIT_S)
        producer.commit_transaction()
    assert read_all(broker, "read_committed", 1) == [b"after"], "small was aborted"


def test_a_transaction_goes_on_across_its_brokers_restart(data_dir):
    """SIGKILL of the broker mid-transaction, sends while it is down, then a start: the
    producer, waiting for their completions, registers its ring again and keeps the
    identity the coordinator gave it (not the ring's), so the transaction's records
    sent before and after the kill commit together."""
    broker = RestartableBroker(data_dir)
    starting = threading.Thread(target=broker.start)
    try:
        with Admin(data_dir) as admin:
            admin.create_topic("out", 2)
        with Producer(data_dir, transactional_id="t-restart", linger_ms=0) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("out", b"before", partition=0).get(timeout=WAIT_S)
            broker.kill()
            waiting = producer.send("out", b"after-0", partition=0)
            starting.start()
            waiting.get(timeout=WAIT_S)       # the broker started meanwhile
            producer.send("out", b"after-1", partition=1)
            producer.commit_transaction()
        starting.join(WAIT_S)
        assert read_all(data_dir, "read_committed", 3) == [b"after-0", b"after-1", b"before"]
    finally:
        if starting.ident is not None:
            starting.join(WAIT_S)
        broker.stop()


def test_kafka_pythons_spelling_of_a_transaction(broker):
    """A kafka-python program's transactional producer, as it imports and calls it."""
    from shmlog.kafka import KafkaProducer
    from shmlog.kafka.errors import ProducerFencedError as KafkaProducerFenced
    from shmlog.kafka.structs import OffsetAndMetadata as KafkaOffsetAndMetadata
    from shmlog.kafka.structs import TopicPartition as KafkaTopicPartition
    producer = KafkaProducer(bootstrap_servers=broker, transactional_id="t6",
                             transaction_timeout_ms=30_000)
    successor = None
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("out", b"kafka-python", partition=0)
        producer.send_offsets_to_transaction(
            {KafkaTopicPartition("in", 0): KafkaOffsetAndMetadata(0, "", -1)}, "kafka-group")
        producer.commit_transaction()
        successor = KafkaProducer(bootstrap_servers=broker, transactional_id="t6")
        successor.init_transactions()
        producer.begin_transaction()              # local: the fence shows at the broker
        producer.send("out", b"zombie", partition=0)
        with pytest.raises(KafkaProducerFenced):
            producer.commit_transaction()
    finally:
        producer.close()
        if successor is not None:
            successor.close()
    assert read_all(broker, "read_committed", 1) == [b"kafka-python"]
