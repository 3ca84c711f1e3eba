"""The appender drains rings into partition logs: offsets, completions, published
high watermarks, the slow path (zstd, LogAppendTime, rolls), bad input, entries
that land by the partition they name whatever row they carry (a lost row map, a
reused row), internal topics refused, and idempotent producers' sequences and
epochs (duplicates of any of the last five batches, gaps, KIP-360 epoch bumps,
fencing).

Method: real rings in /dev/shm, a real state table and real partition logs on
disk, all in this process; what the producer side of each ring sees (entry results)
and what the logs hold afterwards are both checked.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode
from shmlog.record import batch_layout as B
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.records import BatchStatus, encode_batch
from shmlog.ring import Ring
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name


@pytest.fixture
def world(tmp_path):
    """A log manager, a state table, an appender, and a ring factory; all cleaned up."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    names = []
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(prefix + "-state", 64)
    names += [prefix + "-state", bells_name(prefix + "-state")]
    appender = Appender(logs, table)

    def ring(capacity=1 << 20):
        name = f"{prefix}-ring{len(names)}"
        names.append(name)
        producer = Ring.create(name, capacity)
        appender.add_ring(Ring.attach(name))
        return producer

    yield logs, table, appender, ring
    logs.close()
    for name in names:
        shared_memory.unlink(name)
        assert not os.path.exists(f"/dev/shm/{name}")


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{index}".encode() for index in range(count)]


def test_batches_from_several_rings_land_in_order_with_their_offsets(world):
    logs, table, appender, ring = world
    logs.create_topic("events", partitions=2)
    rows = [appender.register_partition("events", partition) for partition in (0, 1)]
    destinations = {row: appender.destination("events", partition)
                    for partition, row in zip((0, 1), rows)}
    producers = [ring() for _ in range(3)]
    sent = {row: [] for row in rows}
    entries = []
    for round_number in range(20):
        for number, producer in enumerate(producers):
            row = rows[(round_number + number) % 2]
            batch_values = values(f"p{number}r{round_number}", 1 + round_number % 4)
            entries.append((producer, producer.put(destinations[row], encode_batch(batch_values),
                                                   1000),
                            row, batch_values))
    assert appender.drain() == len(entries)
    in_log_order = {row: [] for row in rows}
    for _, _, row, batch_values in entries:
        sent[row] += batch_values
    for partition, row in zip((0, 1), rows):
        partition_log = logs.partition_log("events", partition)
        records = all_records(partition_log)
        assert sorted(r.value for r in records) == sorted(sent[row])
        assert [r.offset for r in records] == list(range(len(sent[row])))
        assert table.high_watermark(row) == partition_log.log_end_offset == len(sent[row])
        for record in records:
            in_log_order[row].append(record.value)
    for producer, entry, row, batch_values in entries:
        result, _ = producer.result(entry)
        assert in_log_order[row][result:result + len(batch_values)] == batch_values
    for number in range(len(producers)):   # each producer's order is kept
        for row in rows:
            mine = [v for v in in_log_order[row] if v.startswith(f"p{number}r".encode())]
            assert mine == [v for _, _, t, batch in entries if t == row
                            and batch[0].startswith(f"p{number}r".encode()) for v in batch]


def test_bad_entries_are_completed_with_errors_and_never_appended(world):
    logs, table, appender, ring = world
    logs.create_topic("t", config={"max.message.bytes": 2000})
    row = appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    corrupt = encode_batch([b"flipped"]).copy()
    corrupt[B.HEADER_LENGTH + 3] ^= 0x01
    two_batches = np.concatenate([encode_batch([b"a"]), encode_batch([b"b"])])
    cases = [
        (to, encode_batch([b"good-1"]), 0),
        (to, corrupt, -BatchStatus.BAD_CRC),
        (to._replace(topic_key=to.topic_key + 1), encode_batch([b"nobody"]),
         -CompletionCode.UNKNOWN_PARTITION),
        (to._replace(row=63, partition=1), encode_batch([b"nobody"]),
         -CompletionCode.UNKNOWN_PARTITION),
        (to, two_batches, -CompletionCode.NOT_ONE_BATCH),
        (to, encode_batch([b"x" * 3000]), -CompletionCode.RECORD_TOO_LARGE),
        (to, np.frombuffer(b"garbage!" * 10, np.uint8), -BatchStatus.BAD_MAGIC),
        # Transactions' bytes: a producer writes no marker, and no transactional batch
        # in a partition its coordinator did not add to its transaction.
        (to, encode_marker(EndTransactionMarker(7, 0, True, 0)),
         -CompletionCode.CONTROL_FROM_PRODUCER),
        (to, encode_batch([b"in-a-transaction"], producer_id=7, producer_epoch=0,
                          base_sequence=0, transactional=True),
         -CompletionCode.INVALID_TXN_STATE),
        (to, encode_batch([b"good-2"]), 1),
    ]
    entries = [producer.put(case_destination, payload, 1000)
               for case_destination, payload, _ in cases]
    assert appender.drain() == len(cases)
    assert [producer.result(entry)[0] for entry in entries] == [int(c[2]) for c in cases]
    assert [r.value for r in all_records(logs.partition_log("t", 0))] == [b"good-1", b"good-2"]
    assert table.high_watermark(row) == 2


def test_the_slow_path_handles_zstd_log_append_time_and_rolls(world):
    logs, table, appender, ring = world
    logs.create_topic("zipped", config={"segment.bytes": 4096})
    logs.create_topic("stamped", config={"message.timestamp.type": "LogAppendTime"})
    zipped, stamped = (appender.register_partition(name, 0) for name in ("zipped", "stamped"))
    producer = ring()
    expected = []
    for number in range(40):
        batch_values = values(f"z{number}", 10)
        expected += batch_values
        producer.put(appender.destination("zipped", 0),
                     encode_batch(batch_values, compression="zstd" if number % 2 else None), 1000)
    entry = producer.put(appender.destination("stamped", 0), encode_batch([b"s"], timestamps=[5]),
                         1000)
    assert appender.drain() == 41
    zipped_log = logs.partition_log("zipped", 0)
    assert len(zipped_log.segments) > 2, "small segments rolled during the drain"
    assert [r.value for r in all_records(zipped_log)] == expected
    assert table.high_watermark(zipped) == 400
    assert table.snapshot(zipped).segment_generation == zipped_log.generation > 0
    assert table.snapshot(zipped).active_segment_base_offset == zipped_log.active.base_offset
    record = all_records(logs.partition_log("stamped", 0))[0]
    assert record.timestamp > 5 and producer.result(entry) == (0, record.timestamp)


def test_garbage_in_a_ring_poisons_only_that_ring(world):
    logs, table, appender, ring = world
    logs.create_topic("t")
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    good, bad = ring(), ring()
    bad.put(to, encode_batch([b"before"]), 1000)
    bad.put(to, encode_batch([b"never"]), 1000)
    second = R.aligned_entry_size(encode_batch([b"before"]).size)
    bad.data[second:second + 4].view(np.uint32)[0] = 5          # not an entry length
    good.put(to, encode_batch([b"good"]), 1000)
    appender.drain()
    assert bad.words[R.CONSUMER_ERROR_WORD] != 0
    good.put(to, encode_batch([b"still served"]), 1000)
    appender.drain()
    assert sorted(r.value for r in all_records(logs.partition_log("t", 0))) == \
        [b"before", b"good", b"still served"]


def test_draining_resumes_where_a_previous_consumer_stopped(world):
    logs, table, appender, ring = world
    logs.create_topic("t")
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    producer.put(to, encode_batch([b"one"]), 1000)
    appender.drain()
    producer.put(to, encode_batch([b"two"]), 1000)
    second = Appender(logs, table)                 # a restarted appender re-attaches
    second.register_partition("t", 0)
    second.add_ring(Ring.attach(producer.name))
    assert second.drain() == 1
    assert [r.value for r in all_records(logs.partition_log("t", 0))] == [b"one", b"two"]


def identified(values, producer_id, sequence, epoch=0, compression=None):
    return encode_batch(values, producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=sequence, compression=compression)


def test_a_batch_re_read_after_a_crash_is_acknowledged_not_appended_again(world, tmp_path):
    logs, table, appender, ring = world
    logs.create_topic("t")
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    producer.put(to, identified([b"a", b"b"], 7, 0), 1000)
    producer.put(to, identified([b"c"], 7, 2), 1000)
    appender.drain()
    # The broker died after appending the second batch but before releasing its ring
    # space (acknowledged or not): the entry is still there when a new broker attaches.
    entry_size = R.aligned_entry_size(identified([b"c"], 7, 2).size)
    producer.words[R.HEAD_WORD] -= entry_size
    logs.close()
    reopened = LogManager(str(tmp_path / "data"), )
    try:
        second = Appender(reopened, table)
        second.register_partition("t", 0)        # rebuilds the sequences from the log
        second.add_ring(Ring.attach(producer.name))
        assert second.drain() == 1
        assert producer.result(1) == (2, -1), "acknowledged with the original offset"
        assert [r.value for r in all_records(reopened.partition_log("t", 0))] == \
            [b"a", b"b", b"c"]
    finally:
        reopened.close()


def test_sequences_must_follow_on(world):
    logs, table, appender, ring = world
    logs.create_topic("t")
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    entries = [producer.put(to, identified([b"x"] * 3, 9, 0), 1000),
               producer.put(to, identified([b"y"], 9, 5), 1000),          # skips 3..4
               producer.put(to, identified([b"z"], 9, 3), 1000),
               producer.put(to, identified([b"w"], 10, 42), 1000),        # a new producer
               producer.put(to, identified([b"n"], -1, -1), 1000)]        # no identity
    appender.drain()
    assert [producer.result(entry)[0] for entry in entries] == \
        [0, -CompletionCode.OUT_OF_ORDER_SEQUENCE, 3, 4, 5]


def test_entries_land_in_the_partition_they_name_whatever_row_they_carry(world):
    """A broker that lost its row map in a crash hands out other rows, and a deleted
    topic's row goes to a new topic: the entries left in the ring still land in
    their own partitions (one re-read after the crash is not appended twice), and
    the entry for the deleted topic is refused, never appended to the row's new
    owner."""
    logs, table, appender, ring = world
    names = [("a", 0), ("a", 1), ("b", 0), ("gone", 0)]
    logs.create_topic("a", partitions=2)
    logs.create_topic("b")
    logs.create_topic("gone")
    for topic, partition in names:
        appender.register_partition(topic, partition)
    to = {name: appender.destination(*name) for name in names}
    producer = ring()
    producer.put(to["a", 0], identified([b"a0-first"], 5, 0), 1000)
    appender.drain()
    producer.words[R.HEAD_WORD] = 0               # acknowledged, not yet released
    entries = [producer.put(to["a", 1], encode_batch([b"a1"]), 1000),
               producer.put(to["b", 0], encode_batch([b"b0"]), 1000),
               producer.put(to["a", 0], identified([b"a0-second"], 5, 1), 1000),
               producer.put(to["gone", 0], encode_batch([b"gone"]), 1000)]
    appender.unregister_partition("gone", 0)
    logs.delete_topic("gone")
    logs.create_topic("new")
    restarted = Appender(logs, table)             # the rows are handed out anew
    for (topic, partition), row in [(("b", 0), to["a", 0].row), (("a", 0), to["a", 1].row),
                                    (("a", 1), to["b", 0].row), (("new", 0), to["gone", 0].row)]:
        assert restarted.register_partition(topic, partition, row) == row
    restarted.add_ring(Ring.attach(producer.name))
    assert restarted.drain() == 5
    assert producer.result(0) == (0, -1), "the re-read batch is acknowledged, not appended"
    assert [producer.result(entry)[0] for entry in entries] == \
        [0, 0, 1, -CompletionCode.UNKNOWN_PARTITION]
    held = {name: [r.value for r in all_records(logs.partition_log(*name))]
            for name in [("a", 0), ("a", 1), ("b", 0), ("new", 0)]}
    assert held == {("a", 0): [b"a0-first", b"a0-second"], ("a", 1): [b"a1"], ("b", 0): [b"b0"],
                    ("new", 0): []}
    assert [table.high_watermark(row) for row in (to["a", 1].row, to["a", 0].row)] == [2, 1]


def test_entries_for_an_internal_topic_are_refused(world):
    """Only the broker writes __consumer_offsets (Kafka refuses producers too)."""
    logs, table, appender, ring = world
    logs.create_topic("__consumer_offsets", partitions=2)
    for partition in (0, 1):
        appender.register_partition("__consumer_offsets", partition)
    producer = ring()
    entries = [producer.put(appender.destination("__consumer_offsets", partition),
                            encode_batch([b"forged commit"]), 1000) for partition in (0, 1)]
    assert appender.drain() == 2
    assert [producer.result(entry)[0] for entry in entries] == \
        [-CompletionCode.INTERNAL_TOPIC] * 2
    assert all(logs.partition_log("__consumer_offsets", partition).log_end_offset == 0
               for partition in (0, 1))


@pytest.mark.parametrize("compression", [None, "zstd"])      # compiled path, slow path
def test_a_higher_epoch_starts_again_at_sequence_0_and_a_lower_one_is_fenced(world, tmp_path,
                                                                             compression):
    """KIP-360 on the broker's side: a producer whose batch was refused sends the
    batches kept out again under its next epoch, from sequence 0; its older epoch
    is fenced from then on, also after a restart (rebuilt from the log)."""
    logs, table, appender, ring = world
    logs.create_topic("t", config={"max.message.bytes": 2000})
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    cases = [(identified([b"a"], 7, 0, 0, compression), 0),
             (identified([b"x" * 3000], 7, 1, 0), -CompletionCode.RECORD_TOO_LARGE),
             (identified([b"b"], 7, 2, 0, compression), -CompletionCode.OUT_OF_ORDER_SEQUENCE),
             (identified([b"b"], 7, 1, 1, compression), -CompletionCode.OUT_OF_ORDER_SEQUENCE),
             (identified([b"b"], 7, 0, 1, compression), 1),       # the new epoch, from 0
             (identified([b"b"], 7, 0, 1, compression), 1),       # a duplicate in it
             (identified([b"late"], 7, 2, 0, compression), -CompletionCode.INVALID_PRODUCER_EPOCH),
             (identified([b"c"], 7, 1, 1, compression), 2)]
    entries = [producer.put(to, batch, 1000) for batch, _ in cases]
    assert appender.drain() == len(cases)
    assert [producer.result(entry)[0] for entry in entries] == [int(c[1]) for c in cases]
    logs.close()
    reopened = LogManager(str(tmp_path / "data"))
    try:
        restarted = Appender(reopened, table)
        restarted.register_partition("t", 0)        # rebuilds the epochs from the log
        restarted.add_ring(Ring.attach(producer.name))
        entries = [producer.put(to, identified([b"old"], 7, 2, 0, compression), 1000),
                   producer.put(to, identified([b"d"], 7, 2, 1, compression), 1000)]
        assert restarted.drain() == 2
        assert [producer.result(entry)[0] for entry in entries] == \
            [-CompletionCode.INVALID_PRODUCER_EPOCH, 3]
        assert [r.value for r in all_records(reopened.partition_log("t", 0))] == \
            [b"a", b"b", b"c", b"d"]
    finally:
        reopened.close()


@pytest.mark.parametrize("compression", [None, "zstd"])      # compiled path, slow path
def test_resends_of_the_last_five_batches_are_acknowledged_with_their_own_offsets(
        world, tmp_path, compression):
    """Kafka's window (``NUM_BATCHES_TO_RETAIN``): a re-send of any of a producer's last
    five batches is acknowledged with that batch's base offset and not appended; the
    sixth-last, a gap, or a batch that starts as one held but ends elsewhere is out of
    order (as Kafka answers them); after a restart, the window is rebuilt from the log."""
    logs, table, appender, ring = world
    logs.create_topic("t")
    appender.register_partition("t", 0)
    to = appender.destination("t", 0)
    producer = ring()
    sent = []                     # producer 7's batches: two records each, from sequence 0
    for index in range(7):        # another producer's batch before each: offsets 1, 4, 7, ...
        producer.put(to, identified([b"other"], 8, index, 0, compression), 1000)
        sent.append(identified([b"%d" % index, b"%d'" % index], 7, 2 * index, 0, compression))
        producer.put(to, sent[-1], 1000)
    assert appender.drain() == 14
    offsets = [3 * index + 1 for index in range(7)]
    logged = [r.value for r in all_records(logs.partition_log("t", 0))]

    def results(batches, drain):
        entries = [producer.put(to, batch, 1000) for batch in batches]
        assert drain.drain() == len(entries)
        return [producer.result(entry) for entry in entries]

    # The last five, out of order of sending: each its own offsets, nothing appended.
    assert results([sent[index] for index in (4, 2, 6, 3, 5)], appender) == \
        [(offsets[index], -1) for index in (4, 2, 6, 3, 5)]
    out_of_order = -CompletionCode.OUT_OF_ORDER_SEQUENCE
    assert [result[0] for result in results(
        [sent[1], sent[0],                                        # the sixth-last and older
         identified([b"gap"], 7, 16, 0, compression),             # 14 is expected
         identified([b"6"], 7, 12, 0, compression)], appender)] == [out_of_order] * 4
    assert [r.value for r in all_records(logs.partition_log("t", 0))] == logged
    assert results([identified([b"next"], 7, 14, 0, compression)], appender)[0][0] == 21
    sent.append(identified([b"next"], 7, 14, 0, compression))
    offsets.append(21)
    logs.close()
    reopened = LogManager(str(tmp_path / "data"))
    try:
        restarted = Appender(reopened, table)
        restarted.register_partition("t", 0)        # rebuilds the windows from the log
        restarted.add_ring(Ring.attach(producer.name))
        assert [result[0] for result in results(sent[3:], restarted)] == offsets[3:]
        assert results([sent[2]], restarted)[0][0] == out_of_order
        assert reopened.partition_log("t", 0).log_end_offset == 22
    finally:
        reopened.close()


def test_a_partition_gets_the_row_it_asks_for_when_that_row_is_free(world):
    # A broker gives a partition its row of before a restart (partition-rows.json);
    # a row taken, or outside the table, gives the first free one instead.
    logs, table, appender, _ = world
    logs.create_topic("rows", 4)
    assert appender.register_partition("rows", 0, 5) == 5
    assert appender.register_partition("rows", 1, 5) == 0          # taken: the first free
    assert appender.register_partition("rows", 2, table.row_capacity) == 1   # outside
    assert appender.register_partition("rows", 3, None) == 2
    assert appender.register_partition("rows", 3, 7) == 2          # registered: its row


def test_a_drain_with_a_budget_serves_every_full_ring_alike(world):
    """Many producers: a drain pass that stops at its budget has taken one entry per
    ring per round, so no ring waits while another is drained (issue 26's fairness);
    the next pass goes on round-robin."""
    logs, table, appender, ring = world
    rings_count, entries_each = 8, 40
    logs.create_topic("many", partitions=rings_count)
    rows = [appender.register_partition("many", partition) for partition in range(rings_count)]
    for partition, producer in enumerate(ring() for _ in range(rings_count)):
        destination = appender.destination("many", partition)
        for number in range(entries_each):
            producer.put(destination, encode_batch(values(f"r{partition}e{number}", 1)), 1000)
    for budget in (rings_count * 5, rings_count * 3, rings_count * 20):
        appender.drain(entries_max=budget)
        drained = [table.high_watermark(row) for row in rows]
        assert max(drained) - min(drained) <= 1, drained
    appender.drain()
    assert [table.high_watermark(row) for row in rows] == [entries_each] * rings_count
