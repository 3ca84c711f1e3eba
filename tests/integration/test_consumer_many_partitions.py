"""A consumer assigned thousands of partitions looks, per fetch, only at those the
broker's journal of changed rows names: every record still comes once and in order,
after a lapped journal (a full look instead), and across a broker restart.

Method: a real broker child process hosting a topic of 2,000 partitions, a
``Producer`` writing to a handful of them through its ring, a ``Consumer`` in this
process assigned all 2,000. What a fetch looked at is counted by the fetcher
(``consumer.metrics()``: journal fetches, partitions they examined and the most one
examined, full looks, laps), never timed. Segments are 1 MiB, so a partition that
takes records reserves 1 MiB, not a default segment's steps. Every wait is bounded.
"""

from __future__ import annotations

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common import limits
from shmlog.server.broker import Broker

TIMEOUT_S = 30
WIDE = 2000
BUSY = (3, 501, 1000, 1499, 1999)
CONFIG = {"segment.bytes": 1 << 20}
ROUNDS_MAX = 5


@pytest.fixture
def data_dir(tmp_path):
    path = str(tmp_path / "data")
    yield path
    unlink_shared_memory(path)


def create_wide(data_dir) -> None:
    # 2,000 partitions (three files each) take the broker seconds to create, more on a
    # loaded host than a request's default wait.
    Admin(data_dir, timeout_ms=TIMEOUT_S * 4000).create_topic("wide", WIDE, config=CONFIG)


def counts(consumer) -> dict:
    return consumer.metrics()["consumer-fetch-manager-metrics"]


def send(producer, partitions, per_partition, first=0) -> None:
    """``per_partition`` records to each partition, round-robin (value: partition and
    number), all acknowledged."""
    futures = [producer.send("wide", b"%d:%d" % (partition, n), partition=partition)
               for n in range(first, first + per_partition) for partition in partitions]
    for future in futures:
        future.get(timeout=TIMEOUT_S)


def drain(consumer, count) -> list:
    records = []
    for _ in range(2000):
        for batch in consumer.poll(timeout_ms=50, max_records=10_000).values():
            records += batch
        if len(records) >= count:
            break
    return records


def check_once_in_order(records, partitions, first, per_partition) -> None:
    """Every record of numbers [first, first + per_partition) of each partition, once,
    in order, at consecutive offsets."""
    by_partition: dict[int, list] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record)
    assert sorted(by_partition) == sorted(partitions)
    for partition, got in by_partition.items():
        assert [r.value for r in got] == [b"%d:%d" % (partition, n)
                                           for n in range(first, first + per_partition)]
        assert [r.offset for r in got] == list(range(got[0].offset, got[0].offset
                                                     + per_partition))


def assigned_all(data_dir) -> Consumer:
    consumer = Consumer(bootstrap=data_dir, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("wide", p) for p in range(WIDE)])
    assert consumer.poll(timeout_ms=0) == {}           # the first fetch: a full look
    assert counts(consumer)["full-scans-total"] >= 1
    return consumer


def following_the_journal(consumer, producer, partitions, first, per_partition) -> int:
    """Records sent to ``partitions`` come once and in order, found by fetches that
    followed the journal and looked at no more partitions than took records; the
    next record number. A round that met a full look (one is due every
    FETCH_FULL_SCAN_INTERVAL_S, and a slow machine may reach it) proves nothing of
    the journal, so another round is sent, up to ROUNDS_MAX."""
    for _ in range(ROUNDS_MAX):
        assert consumer.poll(timeout_ms=0) == {}      # a full look due is taken here
        before = counts(consumer)
        send(producer, partitions, per_partition, first)
        records = drain(consumer, per_partition * len(partitions))
        after = counts(consumer)
        check_once_in_order(records, partitions, first, per_partition)
        first += per_partition
        fetches = after["journal-fetches-total"] - before["journal-fetches-total"]
        examined = after["partitions-examined-total"] - before["partitions-examined-total"]
        assert examined <= fetches * len(partitions)
        assert after["partitions-examined-max"] <= len(BUSY)
        if after["full-scans-total"] == before["full-scans-total"]:
            assert fetches > 0 and examined >= len(partitions)
            return first
    pytest.fail(f"{ROUNDS_MAX} rounds each met a full look")


def test_a_poll_looks_only_at_the_partitions_the_journal_names(data_dir):
    with Broker(data_dir):
        create_wide(data_dir)
        with assigned_all(data_dir) as consumer, Producer(data_dir) as producer:
            following_the_journal(consumer, producer, BUSY[:1], 0, 100)
            following_the_journal(consumer, producer, BUSY, 0, 100)
            assert consumer.poll(timeout_ms=20) == {}
            assert counts(consumer)["journal-laps-total"] == 0


def test_a_lapped_journal_and_a_restarted_broker_lose_and_repeat_nothing(data_dir):
    """Records enough to name more rows than the journal holds while the consumer
    does not poll: its next fetch finds it was lapped and looks at every partition,
    then follows the journal again. A broker restart (a new table, a journal that
    starts over) is followed the same way, every position kept."""
    spread = [n * 31 for n in range(64)]                  # none of BUSY among them
    per_partition = -(-limits.STATE_JOURNAL_CAPACITY // len(spread)) + 2
    broker = Broker(data_dir).start()
    try:
        create_wide(data_dir)
        with assigned_all(data_dir) as consumer:
            before = counts(consumer)
            # One record a batch, round-robin: every publish names another row than
            # the last 63, so the broker's unflushed window never shares a slot, and
            # the journal takes one slot a record: more than it holds.
            with Producer(data_dir, batch_size=0, linger_ms=0) as producer:
                send(producer, spread, per_partition)
            records = drain(consumer, per_partition * len(spread))
            after = counts(consumer)
            check_once_in_order(records, spread, 0, per_partition)
            assert after["journal-laps-total"] > before["journal-laps-total"]
            assert after["full-scans-total"] > before["full-scans-total"]
            with Producer(data_dir) as producer:
                following_the_journal(consumer, producer, BUSY, 0, 10)

            broker.stop()
            broker = Broker(data_dir).start()
            # Nothing new yet; the idle poll finds the new broker and maps its table
            # (had it not, the records below would never come: the old table is dead).
            assert consumer.poll(timeout_ms=int(limits.BROKER_CHECK_INTERVAL_S * 4000)) == {}
            with Producer(data_dir) as producer:
                following_the_journal(consumer, producer, spread[:3], per_partition, 10)
            assert consumer.poll(timeout_ms=20) == {}
    finally:
        broker.stop()


def test_pauses_resumes_and_seeks_are_looked_at_without_a_journal_entry(data_dir):
    """A partition's records published while it was paused come when it is resumed,
    and a seek back reads again, though the journal named the row only once, before
    (the fetcher looks at what was moved or resumed from outside: ``touched``)."""
    with Broker(data_dir):
        create_wide(data_dir)
        busy = TopicPartition("wide", BUSY[1])
        with assigned_all(data_dir) as consumer, Producer(data_dir) as producer:
            consumer.pause(busy)
            send(producer, BUSY[:2], 5)
            records = drain(consumer, 5)
            check_once_in_order(records, BUSY[:1], 0, 5)
            for _ in range(3):
                assert consumer.poll(timeout_ms=20) == {}, "paused"
            consumer.resume(busy)
            check_once_in_order(drain(consumer, 5), BUSY[1:2], 0, 5)
            consumer.seek(busy, 2)
            assert [r.offset for r in drain(consumer, 3)] == [2, 3, 4]
            assert consumer.poll(timeout_ms=20) == {}
