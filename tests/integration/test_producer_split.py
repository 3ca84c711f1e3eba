"""A batch the broker refuses as too large is split and sent again (Kafka's KIP-126):
``max.message.bytes`` lowered under a running producer fails no record that fits on
its own; every such record is appended once, in the order sent; a record too large
on its own fails alone, with :class:`RecordTooLargeError`.

Method: the package's shared broker, a topic of each test's own. The producer lingers
long, so its batches hold many records when the limit drops (through
``Admin.alter_topic_config``, the broker's own request) below the size of those
batches but above every record but one; the records are read back with a real
consumer. The idempotent producer (the default) is checked for order and exactly
once; the one without idempotence, and ``send_batch`` with a limit it cached
before it was lowered, for every record appended once. Every wait is bounded.
"""

from __future__ import annotations

import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import RecordTooLargeError

TIMEOUT_S = 120
RECORDS = 300
VALUE_SIZE = 200             # a record takes ~230 bytes
LIMIT_LOWERED = 1_000        # room for a record and a batch header, not for five records
BATCH_SIZE = 256 << 10      # the records sent before the change all gather in one batch
OVERSIZED_AT = 100           # the record that alone exceeds the lowered limit


@pytest.fixture
def broker(integration_broker):
    return integration_broker


def value(number: int) -> bytes:
    return b"%05d:" % number + b"v" * VALUE_SIZE


def read_all(data_dir: str, topic: str, count: int) -> list[bytes]:
    """Every record of partition 0, oldest first (``count`` expected; bounded)."""
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        found = []
        for _ in range(TIMEOUT_S * 10):
            for records in consumer.poll(timeout_ms=100).values():
                found += [record.value for record in records]
            if len(found) >= count:
                break
        found += [record.value for records in consumer.poll(timeout_ms=200).values()
                  for record in records]
        return found


def send_around_the_change(data_dir: str, topic: str, producer: Producer) -> list:
    """Half the records gather, then the limit drops, then the rest follow: the
    futures, in order. One record (OVERSIZED_AT) is over the lowered limit."""
    futures = []
    for number in range(RECORDS):
        if number == RECORDS // 2:
            Admin(data_dir).alter_topic_config(topic, set={"max.message.bytes": LIMIT_LOWERED})
        oversized = number == OVERSIZED_AT
        futures.append(producer.send(topic, value(number) + (b"x" * 2 * LIMIT_LOWERED
                                                             if oversized else b"")))
    producer.flush(timeout=TIMEOUT_S)
    return futures


def test_a_lowered_limit_splits_the_batches_and_only_the_record_too_large_fails(broker):
    Admin(broker).create_topic("split", 1)
    with Producer(broker, linger_ms=60_000, batch_size=BATCH_SIZE) as producer:
        futures = send_around_the_change(broker, "split", producer)
        with pytest.raises(RecordTooLargeError):
            futures[OVERSIZED_AT].get(timeout=TIMEOUT_S)
        offsets = [future.get(timeout=TIMEOUT_S).offset
                   for number, future in enumerate(futures) if number != OVERSIZED_AT]
        assert producer.metrics()["producer-metrics"]["record-error-total"] <= RECORDS
    expected = [value(number) for number in range(RECORDS) if number != OVERSIZED_AT]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    found = read_all(broker, "split", len(expected))
    assert found == expected, "every record that fits, once, in the order sent"
    assert offsets == list(range(len(expected)))


def test_without_idempotence_every_record_that_fits_is_appended_once(broker):
    Admin(broker).create_topic("split-plain", 1)
    with Producer(broker, linger_ms=60_000, batch_size=BATCH_SIZE,
                  enable_idempotence=False) as producer:
        futures = send_around_the_change(broker, "split-plain", producer)
        with pytest.raises(RecordTooLargeError):
            futures[OVERSIZED_AT].get(timeout=TIMEOUT_S)
        for number, future in enumerate(futures):
            if number != OVERSIZED_AT:
                future.get(timeout=TIMEOUT_S)
    expected = [value(number) for number in range(RECORDS) if number != OVERSIZED_AT]
    found = read_all(broker, "split-plain", len(expected))
    assert sorted(found) == expected, "every record that fits, once"


def test_send_batch_sized_to_a_limit_since_lowered_is_split(broker):
    Admin(broker).create_topic("split-batch", 1)
    with Producer(broker) as producer:
        producer.send("split-batch", b"first").get(timeout=TIMEOUT_S)   # the limit cached
        Admin(broker).alter_topic_config("split-batch",
                                         set={"max.message.bytes": LIMIT_LOWERED})
        values = [value(number) for number in range(40)]
        metadata = producer.send_batch("split-batch", values).get(timeout=TIMEOUT_S)
        assert (metadata.base_offset, metadata.record_count) == (1, 40)
        with pytest.raises(RecordTooLargeError):
            producer.send("split-batch", b"x" * 2 * LIMIT_LOWERED).get(timeout=TIMEOUT_S)
    assert read_all(broker, "split-batch", 41) == [b"first"] + values
