"""The appender's seams for replication: a high watermark set from outside, entries
whose completion waits for it (acks=all) while their ring space goes back at once,
completions in ring order, the leader epoch stamped on every batch, the "appended"
event, the broker's own appends (Appender.append); and acks=all's rules: entries refused
before the append (NOT_ENOUGH_REPLICAS) or failed after it (NOT_ENOUGH_REPLICAS_AFTER_APPEND)
while a partition is under min.insync.replicas, and parked entries refused after a
truncation (refuse_parked_from: kept below the offset, failed from it, in ring order).

Method: real rings in /dev/shm, a real state table, real partition logs on disk and
a real PartitionReader (what a consumer reads through), all in this process; what
the producer side of each ring sees (entry results, the acknowledged count, the
head) and what the table and the reader show are checked.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode, HighWatermarkPolicy
from shmlog.client.reader import PartitionReader
from shmlog.common.errors import (
    LocalProtocolError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from shmlog.record.records import decode_records, encode_batch, iter_batches
from shmlog.ring import Ring, put_entry
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name

EXTERNAL = HighWatermarkPolicy.EXTERNAL


@pytest.fixture
def world(tmp_path):
    """A log manager, a state table, an appender, a ring factory and a reader
    factory; all cleaned up."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    names = [prefix + "-state", bells_name(prefix + "-state")]
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(names[0], 16)
    appender = Appender(logs, table)
    readers = []

    def ring(capacity=1 << 20, awaits_high_watermark=False):
        name = f"{prefix}-ring{len(names)}"
        names.append(name)
        producer = Ring.create(name, capacity)
        appender.add_ring(Ring.attach(name), awaits_high_watermark=awaits_high_watermark)
        return producer

    def reader(topic, partition=0):
        snapshot = table.snapshot(appender.row_of(topic, partition))
        readers.append(PartitionReader(logs.partition_log(topic, partition).directory, table,
                                       appender.row_of(topic, partition),
                                       topic_key=snapshot.topic_key, partition=partition))
        return readers[-1]

    yield logs, table, appender, ring, reader
    for opened in readers:
        opened.close()
    logs.close()
    for name in names:
        shared_memory.unlink(name)
        assert not os.path.exists(f"/dev/shm/{name}")


def batch(*values, **fields):
    return encode_batch(list(values), **fields)


def acknowledged(producer: Ring) -> int:
    return int(producer.words[R.ACKNOWLEDGED_WORD])


def test_a_held_high_watermark_moves_only_forward_and_readers_stop_below_it(world):
    logs, table, appender, ring, reader = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring()
    for first in (0, 3):
        values = [b"v%d" % offset for offset in range(first, first + 3)]
        producer.put(appender.destination("t", 0), batch(*values), 1000)
    assert appender.drain() == 2
    snapshot = table.snapshot(row)
    assert (snapshot.log_end_offset, snapshot.high_watermark) == (6, 0), \
        "the log end is published, the high watermark held"
    assert producer.result(0) == (0, -1), "a ring that does not await the watermark: acks=1"
    consumer = reader("t")
    assert consumer.read(0).data.size == 0
    with pytest.raises(OffsetOutOfRangeError):
        consumer.read(3)
    assert appender.advance_high_watermark(row, 3) == 3
    assert [r.value for r in decode_records(consumer.read(0).data)] == [b"v0", b"v1", b"v2"]
    assert consumer.read(3).data.size == 0, "nothing at or above the high watermark"
    assert appender.advance_high_watermark(row, 1) == 3, "never backwards"
    assert appender.advance_high_watermark(row, 100) == 6, "never past the log end"
    assert (table.high_watermark(row), appender.high_watermark(row)) == (6, 6)
    assert [r.offset for r in decode_records(consumer.read(3).data)] == [3, 4, 5]


def test_advancing_needs_a_hosted_partition_whose_watermark_is_set_from_outside(world):
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    with pytest.raises(LocalProtocolError):
        appender.advance_high_watermark(row, 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        appender.advance_high_watermark(row + 1, 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        appender.set_leader_epoch(row + 1, 1)
    for epoch in (-1, 2**31, "1"):
        with pytest.raises(LocalProtocolError):
            appender.set_leader_epoch(row, epoch)


def test_deferred_completions_wait_for_the_watermark_in_ring_order(world):
    """An acks=all ring: its space goes back as soon as each batch is copied (or
    refused); its completions wait until the held partition's high watermark
    covers the batch, and later entries of the same ring (a local partition's, a
    refusal) wait behind it. Another ring's entry to the held partition completes at
    once: it does not await the watermark."""
    logs, table, appender, ring, reader = world
    logs.create_topic("held", config={"max.message.bytes": 2000})
    logs.create_topic("local")
    held, local = (appender.register_partition(topic, 0) for topic in ("held", "local"))
    appender.set_high_watermark_policy(held, EXTERNAL)
    eager, patient = ring(), ring(awaits_high_watermark=True)
    eager.put(appender.destination("held", 0), batch(b"eager"), 1000)
    assert appender.drain() == 1 and eager.result(0) == (0, -1)
    entries = [patient.put(appender.destination("held", 0), batch(b"a", b"b", b"c"), 1000),
               patient.put(appender.destination("local", 0), batch(b"local"), 1000),
               patient.put(appender.destination("held", 0), batch(b"x" * 3000), 1000),
               patient.put(appender.destination("local", 0), batch(b"local2"), 1000)]
    assert appender.drain() == 4
    assert patient.used == 0, "every entry's space is back"
    assert acknowledged(patient) == 0 and patient.result(entries[0]) is None
    assert table.high_watermark(local) == 2, "the local partition's batches are published"
    assert [r.value for r in decode_records(reader("local").read(0).data)] == \
        [b"local", b"local2"]
    assert appender.advance_high_watermark(held, 3) == 3      # the batch ends at offset 3
    assert acknowledged(patient) == 0
    eager.put(appender.destination("local", 0), batch(b"meanwhile"), 1000)
    assert appender.drain() == 1 and eager.result(1) == (2, -1)
    assert appender.advance_high_watermark(held, 4) == 4
    assert acknowledged(patient) == 4
    assert [patient.result(entry)[0] for entry in entries] == \
        [1, 0, -CompletionCode.RECORD_TOO_LARGE, 1]


def test_a_deferring_ring_keeps_being_read_while_nothing_completes(world):
    """A ring of one page holds a few entries at a time; its producer puts many
    more, and each drain takes them, as the space goes back when they are copied."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(R.CAPACITY_MIN, awaits_high_watermark=True)
    payload = batch(b"x" * 200)
    assert R.aligned_entry_size(payload.size) * 100 > 5 * R.CAPACITY_MIN
    for number in range(100):
        assert producer.try_put(appender.destination("t", 0), payload) == number
        appender.drain()
    assert logs.partition_log("t", 0).log_end_offset == 100
    assert acknowledged(producer) == 0 and producer.used == 0
    appender.advance_high_watermark(row, 100)
    assert [producer.result(number) for number in range(100)] == [(n, -1) for n in range(100)]


def test_parked_completions_are_bounded_by_the_completion_slots(world):
    """A producer never has more than COMPLETION_SLOTS entries unacknowledged; one
    that puts more anyway (past Ring's own check) is not read further until its
    parked completions drain, so they never outgrow their queue."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    to = appender.destination("t", 0)
    for _ in range(R.COMPLETION_SLOTS):
        producer.put(to, batch(b"v"), 1000)
    assert producer.try_put(to, batch(b"v")) == -1, "Ring keeps to the bound itself"
    extra = batch(b"one too many")
    assert put_entry(producer.words, producer.data, producer.capacity, *to, extra, 0,
                     extra.size) == 0
    assert appender.drain() == R.COMPLETION_SLOTS
    assert producer.used == R.aligned_entry_size(extra.size), "the extra entry is not read"
    assert appender.advance_high_watermark(row, R.COMPLETION_SLOTS) == R.COMPLETION_SLOTS
    assert acknowledged(producer) == R.COMPLETION_SLOTS
    assert appender.drain() == 1 and producer.used == 0
    appender.advance_high_watermark(row, R.COMPLETION_SLOTS + 1)
    assert acknowledged(producer) == R.COMPLETION_SLOTS + 1


def test_parked_completions_end_when_the_watermark_follows_the_log_end_or_the_partition_goes(
        world):
    logs, table, appender, ring, _ = world
    logs.create_topic("kept")
    logs.create_topic("gone")
    kept, gone = (appender.register_partition(topic, 0) for topic in ("kept", "gone"))
    for row in (kept, gone):
        appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    entries = [producer.put(appender.destination(topic, 0), batch(b"v"), 1000)
               for topic in ("gone", "kept", "kept")]
    assert appender.drain() == 3 and acknowledged(producer) == 0
    appender.unregister_partition("gone", 0)
    assert producer.result(entries[0]) == (-CompletionCode.UNKNOWN_PARTITION, -1)
    assert acknowledged(producer) == 1, "the rest still waits for its own partition"
    appender.set_high_watermark_policy(kept, HighWatermarkPolicy.LOG_END)
    assert table.high_watermark(kept) == 2
    assert [producer.result(entry) for entry in entries[1:]] == [(0, -1), (1, -1)]


def test_a_duplicate_of_a_deferred_batch_waits_for_the_original(world):
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    to = appender.destination("t", 0)
    identified = batch(b"a", b"b", producer_id=3, producer_epoch=0, base_sequence=0)
    entries = [producer.put(to, identified, 1000), producer.put(to, identified, 1000)]
    assert appender.drain() == 2
    assert appender.advance_high_watermark(row, 1) == 1 and acknowledged(producer) == 0
    appender.advance_high_watermark(row, 2)
    assert [producer.result(entry) for entry in entries] == [(0, -1), (0, -1)]
    assert logs.partition_log("t", 0).log_end_offset == 2


@pytest.mark.parametrize("compression", [None, "zstd"])      # compiled path, slow path
def test_every_batch_is_stamped_with_the_leader_epoch(world, compression):
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    producer = ring()
    to = appender.destination("t", 0)
    producer.put(to, batch(b"epoch 0", compression=compression), 1000)
    appender.drain()
    appender.set_leader_epoch(row, 7)
    producer.put(to, batch(b"epoch 7", compression=compression), 1000)
    appender.drain()
    assert appender.append(row, batch(b"by the broker")) == (2, -1)
    active = logs.partition_log("t", 0).active
    assert [(info.base_offset, info.leader_epoch)
            for info in iter_batches(active.log[:active.size])] == [(0, 0), (1, 7), (2, 7)]


def test_take_appended_reports_each_partition_appended_to_once_with_its_log_end(world):
    logs, table, appender, ring, _ = world
    logs.create_topic("t", partitions=3)
    rows = [appender.register_partition("t", partition) for partition in range(3)]
    producer = ring()
    for partition, value in [(0, b"a"), (1, b"b"), (0, b"c")]:
        producer.put(appender.destination("t", partition), batch(value), 1000)
    producer.put(appender.destination("t", 1), batch(b"zipped", compression="zstd"), 1000)
    producer.put(appender.destination("t", 2), b"not a batch", 1000)     # refused
    assert appender.drain() == 5
    assert sorted(appender.take_appended()) == sorted([(rows[0], 2), (rows[1], 2)])
    assert appender.take_appended() == []
    appender.append(rows[2], batch(b"commit"))
    assert appender.take_appended() == [(rows[2], 1)]


def test_append_follows_the_watermark_policy_and_the_sequence_rules(world):
    logs, table, appender, _, reader = world
    logs.create_topic("__consumer_offsets")
    row = appender.register_partition("__consumer_offsets", 0)
    commit = batch(b"k", producer_id=11, producer_epoch=0, base_sequence=0)
    assert appender.append(row, commit) == (0, -1)
    assert table.high_watermark(row) == 1
    assert appender.append(row, commit) == (0, -1), "a duplicate is not appended again"
    assert appender.append(row, b"garbage")[0] < 0
    appender.set_high_watermark_policy(row, EXTERNAL)
    assert appender.append(row, batch(b"held"))[0] == 1
    snapshot = table.snapshot(row)
    assert (snapshot.log_end_offset, snapshot.high_watermark) == (2, 1)
    assert [r.value for r in all_records(logs.partition_log("__consumer_offsets", 0))] == \
        [b"k", b"held"]
    with pytest.raises(UnknownTopicOrPartitionError):
        appender.append(row + 1, commit)


# --- acks=all and min.insync.replicas ---------------------------------------------------

NOT_ENOUGH_REPLICAS = -CompletionCode.NOT_ENOUGH_REPLICAS
AFTER_APPEND = -CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
NOT_LEADER = CompletionCode.NOT_LEADER_OR_FOLLOWER


def identified(sequence: int, *values: bytes, compression=None):
    return batch(*(values or (b"s%d" % sequence,)), producer_id=5, producer_epoch=0,
                 base_sequence=sequence, compression=compression)


@pytest.mark.parametrize("compression", [None, "zstd"])      # compiled path, slow path
def test_acks_all_under_min_isr_is_refused_before_the_append_and_uses_no_sequence(
        world, compression):
    """Kafka's Partition.appendRecordsToLeader: requiredAcks == -1 and an ISR smaller
    than min.insync.replicas -> NotEnoughReplicasException, nothing appended."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    to = appender.destination("t", 0)
    appender.set_under_min_isr(row, True)
    assert appender.under_min_isr(row)
    refused = producer.put(to, identified(0, compression=compression), 1000)
    assert appender.drain() == 1
    assert producer.result(refused) == (NOT_ENOUGH_REPLICAS, -1)
    assert logs.partition_log("t", 0).log_end_offset == 0, "nothing appended"
    assert appender.parked_count(row) == 0
    appender.set_under_min_isr(row, False)
    again = producer.put(to, identified(0, compression=compression), 1000)
    assert appender.drain() == 1 and appender.parked_count(row) == 1
    appender.advance_high_watermark(row, 1)
    assert producer.result(again) == (0, -1), "sequence 0 is still the next one"


def test_acks_all_under_min_isr_when_the_watermark_covers_it_fails_after_the_append(world):
    """Kafka's Partition.checkEnoughReplicasReachOffset: the high watermark reached
    the batch with the ISR under min.insync.replicas -> NOT_ENOUGH_REPLICAS_AFTER_APPEND;
    the record is in the log, and its sequence used (a re-send is a duplicate)."""
    logs, table, appender, ring, reader = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    to = appender.destination("t", 0)
    entries = [producer.put(to, identified(0, b"ok"), 1000)]
    assert appender.drain() == 1
    assert appender.advance_high_watermark(row, 1) == 1
    assert producer.result(entries[0]) == (0, -1), "the ISR is large enough: the offset"
    entries.append(producer.put(to, identified(1, b"late"), 1000))
    assert appender.drain() == 1 and acknowledged(producer) == 1
    appender.set_under_min_isr(row, True)       # the ISR shrank while it was parked
    assert appender.advance_high_watermark(row, 2) == 2
    assert producer.result(entries[1]) == (AFTER_APPEND, -1)
    assert [r.value for r in decode_records(reader("t").read(0).data)] == [b"ok", b"late"]
    appender.set_under_min_isr(row, False)
    resent = producer.put(to, identified(1, b"late"), 1000)
    assert appender.drain() == 1
    assert producer.result(resent) == (1, -1), "deduplicated to the original offset"
    assert logs.partition_log("t", 0).log_end_offset == 2


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_rings_that_do_not_await_the_watermark_ignore_min_isr(world, compression):
    """acks=0/1 are unchanged: Kafka checks min.insync.replicas for acks=-1 only."""
    logs, table, appender, ring, _ = world
    logs.create_topic("plain")
    logs.create_topic("held")
    plain, held = (appender.register_partition(topic, 0) for topic in ("plain", "held"))
    appender.set_high_watermark_policy(held, EXTERNAL)
    for row in (plain, held):
        appender.set_under_min_isr(row, True)
    eager = ring()
    entries = [eager.put(appender.destination(topic, 0), batch(b"v", compression=compression),
                         1000) for topic in ("plain", "held")]
    assert appender.drain() == 2
    assert [eager.result(entry) for entry in entries] == [(0, -1), (0, -1)]
    assert table.high_watermark(plain) == 1 and table.snapshot(held).log_end_offset == 1


def test_refuse_parked_from_keeps_what_lies_below_and_fails_the_rest_in_ring_order(world):
    """The design's parked completions across a leadership change: after the log is
    truncated to T, a parked entry whose batch ends below T stays parked until the
    high watermark covers it; one ending at or above T fails with
    NOT_LEADER_OR_FOLLOWER, but not before the entries ahead of it in its ring."""
    logs, table, appender, ring, _ = world
    logs.create_topic("held")
    logs.create_topic("local")
    held, local = (appender.register_partition(topic, 0) for topic in ("held", "local"))
    appender.set_high_watermark_policy(held, EXTERNAL)
    first, second = ring(awaits_high_watermark=True), ring(awaits_high_watermark=True)
    to = appender.destination("held", 0)
    entries = [first.put(to, batch(b"0", b"1"), 1000),                    # offsets 0-1
               first.put(to, batch(b"2", b"3"), 1000),                    # 2-3: straddles T
               first.put(appender.destination("local", 0), batch(b"l"), 1000),
               first.put(to, batch(b"4"), 1000)]                          # 4
    assert appender.drain() == 4
    late = second.put(to, batch(b"5"), 1000)                              # 5
    assert appender.drain() == 1
    assert appender.parked_count(held) == 4 and appender.parked_count(local) == 0
    assert logs.partition_log("held", 0).truncate_to(3) == 2, "the batch 2-3 goes whole"
    appender.refuse_parked_from(held, 3, NOT_LEADER)
    assert second.result(late) == (-NOT_LEADER, -1), "nothing ahead of it: at once"
    assert acknowledged(first) == 0, "the batch 0-1 stays parked, and the rest behind it"
    assert appender.parked_count(held) == 1
    assert appender.advance_high_watermark(held, 2) == 2
    assert [first.result(entry) for entry in entries] == \
        [(0, -1), (-NOT_LEADER, -1), (0, -1), (-NOT_LEADER, -1)]
    assert appender.parked_count(held) == 0


def test_refuse_parked_fails_every_entry_waiting_for_the_partition(world):
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring(awaits_high_watermark=True)
    entries = [producer.put(appender.destination("t", 0), batch(b"v"), 1000) for _ in range(3)]
    assert appender.drain() == 3
    appender.advance_high_watermark(row, 1)
    appender.refuse_parked(row, NOT_LEADER)
    assert [producer.result(entry) for entry in entries] == \
        [(0, -1), (-NOT_LEADER, -1), (-NOT_LEADER, -1)]
    assert appender.parked_count(row) == 0


def test_the_acks_all_seams_check_their_arguments(world):
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    for call in (lambda: appender.set_under_min_isr(row + 1, True),
                 lambda: appender.refuse_parked(row + 1, NOT_LEADER),
                 lambda: appender.refuse_parked_from(row + 1, 0, NOT_LEADER),
                 lambda: appender.parked_count(row + 1)):
        with pytest.raises(UnknownTopicOrPartitionError):
            call()
    for call in (lambda: appender.refuse_parked(row, 109),
                 lambda: appender.refuse_parked_from(row, -1, NOT_LEADER),
                 lambda: appender.set_awaits_high_watermark(7, True)):
        with pytest.raises(LocalProtocolError):
            call()


def test_a_ring_can_start_awaiting_the_watermark(world):
    """A broker adopts a ring not knowing its producer's acks; the producer registers
    again and says: its next entries wait for the high watermark."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    producer = ring()
    to = appender.destination("t", 0)
    producer.put(to, batch(b"a"), 1000)
    assert appender.drain() == 1 and acknowledged(producer) == 1
    appender.set_awaits_high_watermark(0, True)
    producer.put(to, batch(b"b"), 1000)
    assert appender.drain() == 1 and acknowledged(producer) == 1
    appender.advance_high_watermark(row, 2)
    assert acknowledged(producer) == 2


# --- a leader that may have been replaced (ZooKeeper session suspended) ------------------

@pytest.mark.parametrize("compression", [None, "zstd"])      # compiled path, slow path
def test_a_fenced_leader_refuses_acks_all_with_not_leader_and_serves_acks_1(world, compression):
    """The design's rule for a suspended ZooKeeper session (beyond Kafka 2.8, which
    does not fence on it): acks=all entries are refused with NOT_LEADER_OR_FOLLOWER
    before the min ISR mark is looked at, nothing appended and no sequence used;
    acks=1 entries are appended as before."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    strict, eager = ring(awaits_high_watermark=True), ring()
    to = appender.destination("t", 0)
    appender.set_fenced(row, True)
    appender.set_under_min_isr(row, True)
    assert appender.fenced(row)
    refused = strict.put(to, identified(0, compression=compression), 1000)
    served = eager.put(to, batch(b"v", compression=compression), 1000)
    assert appender.drain() == 2
    assert strict.result(refused) == (-NOT_LEADER, -1)
    assert eager.result(served) == (0, -1)
    assert logs.partition_log("t", 0).log_end_offset == 1, "only the acks=1 batch"
    appender.set_fenced(row, False)
    appender.set_under_min_isr(row, False)
    again = strict.put(to, identified(0, compression=compression), 1000)
    assert appender.drain() == 1
    appender.advance_high_watermark(row, 2)
    assert strict.result(again) == (1, -1), "sequence 0 is still the next one"


# A wait that runs this long was not woken: the appender lost its wake-up.
LOST_AFTER_S = 10.0


def _asleep_on_completions(producer: Ring) -> tuple[threading.Thread, list]:
    """A thread of the producer asleep on its ring's completions (returns once it
    lay down); what its wait found, and when, lands in the list."""
    woken: list = []
    waiter = threading.Thread(target=lambda: woken.append(
        (producer.await_completions(LOST_AFTER_S), time.monotonic())))
    waiter.start()
    deadline = time.monotonic() + LOST_AFTER_S
    while not producer.words[R.COMPLETION_SLEEPERS_WORD]:
        assert time.monotonic() < deadline and waiter.is_alive(), "the producer never lay down"
        time.sleep(0.001)
    return waiter, woken


def test_a_producer_asleep_on_its_completions_is_woken_by_a_drain_and_by_a_high_watermark(
        world):
    """A completion stored by the compiled drain, and one parked until the high
    watermark covers its batch, each wake the producer that sleeps on them."""
    logs, table, appender, ring, _ = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, EXTERNAL)
    eager, patient = ring(), ring(awaits_high_watermark=True)
    for producer, complete in ((eager, appender.drain),
                               (patient, lambda: appender.advance_high_watermark(row, 2))):
        entry = producer.put(appender.destination("t", 0), batch(b"v"), 1000)
        if producer is patient:
            assert appender.drain() == 1 and producer.result(entry) is None   # parked
        waiter, woken = _asleep_on_completions(producer)
        asked = time.monotonic()
        complete()
        waiter.join(LOST_AFTER_S + 5)
        [(found, at)] = woken
        assert found and at - asked < LOST_AFTER_S, "the wake-up was lost"
        assert producer.result(entry) is not None
        assert producer.words[R.COMPLETION_SLEEPERS_WORD] == 0
