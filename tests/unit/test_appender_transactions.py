"""The appender's side of transactions: a transactional batch is admitted only in a
partition its coordinator added, opens the transaction there and holds the last
stable offset below it until its marker; markers fence older epochs and index what
aborted; a follower's appends are followed the same way."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode, HighWatermarkPolicy
from shmlog.record.control import EndTransactionMarker
from shmlog.record.records import encode_batch
from shmlog.ring import Ring
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name
from shmlog.storage.producer_snapshots import read_snapshot

PRODUCER, OTHER = 7, 9
# A partition's aborted generation once registered: its .txnindex files read (again).
REGISTERED = 1


@pytest.fixture
def world(tmp_path):
    """A log manager, a state table, an appender with one producer's ring, and the
    table as a reader maps it; all cleaned up."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(prefix + "-state", 16)
    reader = PartitionStateTable.attach(prefix + "-state")
    appender = Appender(logs, table)
    producer = Ring.create(prefix + "-ring", 1 << 20)
    appender.add_ring(Ring.attach(prefix + "-ring"))
    yield logs, reader, appender, producer
    reader.close()
    logs.close()
    for name in (prefix + "-state", bells_name(prefix + "-state"), prefix + "-ring"):
        shared_memory.unlink(name)
        assert not os.path.exists(f"/dev/shm/{name}")


def send(appender, producer, topic, values, *, producer_id=PRODUCER, epoch=0, sequence=0,
         transactional=True):
    """Put one batch into the ring, drain, and give its completion result."""
    entry = producer.put(appender.destination(topic, 0), encode_batch(
        values, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
        transactional=transactional), 1000)
    appender.drain()
    return producer.result(entry)[0]


def end(appender, row, committed, *, producer_id=PRODUCER, epoch=0):
    return appender.write_marker(row, EndTransactionMarker(producer_id, epoch, committed, 0))


def test_a_transaction_holds_the_last_stable_offset_until_it_commits(world):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    assert send(appender, producer, "t", [b"plain"], producer_id=OTHER,
                transactional=False) == 0
    assert appender.expect_transaction(row, PRODUCER, 0)
    assert send(appender, producer, "t", [b"t1", b"t2"]) == 1          # opens it: Python's
    assert send(appender, producer, "t", [b"t3"], sequence=2) == 3    # the compiled loop's
    assert send(appender, producer, "t", [b"plain2"], producer_id=OTHER, sequence=1,
                transactional=False) == 4
    snapshot = reader.snapshot(row)
    assert (snapshot.high_watermark, snapshot.last_stable_offset) == (5, 1)
    assert appender.open_transactions(row) == [(PRODUCER, 0, 1)]
    assert end(appender, row, True) == 5
    snapshot = reader.snapshot(row)
    assert (snapshot.high_watermark, snapshot.last_stable_offset) == (6, 6)
    assert snapshot.aborted_generation == REGISTERED, "nothing aborted"
    assert appender.open_transactions(row) == []
    partition_log = logs.partition_log("t", 0)
    assert partition_log.aborted_transactions(0, 6) == []
    assert [r.value for r in all_records(partition_log)] == [b"plain", b"t1", b"t2", b"t3",
                                                             b"plain2"]
    # The same epoch goes on with its sequence in its next transaction.
    assert appender.expect_transaction(row, PRODUCER, 0)
    assert send(appender, producer, "t", [b"t4"], sequence=3) == 6


def test_an_abort_is_indexed_before_the_last_stable_offset_passes_it(world):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    appender.expect_transaction(row, OTHER, 0)
    assert send(appender, producer, "t", [b"a1"]) == 0
    assert send(appender, producer, "t", [b"b1"], producer_id=OTHER) == 1
    assert send(appender, producer, "t", [b"a2"], sequence=1) == 2
    assert end(appender, row, False) == 3
    snapshot = reader.snapshot(row)
    # OTHER's transaction, open from offset 1, holds the last stable offset.
    assert (snapshot.last_stable_offset, snapshot.aborted_generation) == (1, REGISTERED + 1)
    aborted = logs.partition_log("t", 0).aborted_transactions(0, 4)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(PRODUCER, 0, 3)]
    assert end(appender, row, True, producer_id=OTHER) == 4
    assert reader.snapshot(row).last_stable_offset == 5


def test_a_transactional_batch_needs_its_partition_added_and_its_epoch(world):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    assert send(appender, producer, "t", [b"x"]) == -CompletionCode.INVALID_TXN_STATE
    appender.expect_transaction(row, PRODUCER, 1)
    assert send(appender, producer, "t", [b"x"], epoch=2) == -CompletionCode.INVALID_TXN_STATE
    assert send(appender, producer, "t", [b"x"], epoch=0) == \
        -CompletionCode.INVALID_PRODUCER_EPOCH
    assert send(appender, producer, "t", [b"in"], epoch=1) == 0
    # Not transactional, from a producer with its transaction open here.
    assert send(appender, producer, "t", [b"x"], epoch=1, sequence=1,
                transactional=False) == -CompletionCode.INVALID_TXN_STATE
    # Another epoch cannot be added while the transaction is open.
    assert not appender.expect_transaction(row, PRODUCER, 2)
    assert end(appender, row, False, epoch=2) == 1          # the coordinator's abort, fencing
    # A late batch (a zombie's) finds the transaction over, and its epoch fenced.
    assert send(appender, producer, "t", [b"late"], epoch=1, sequence=1) == \
        -CompletionCode.INVALID_PRODUCER_EPOCH
    assert send(appender, producer, "t", [b"late"], epoch=2, sequence=0) == \
        -CompletionCode.INVALID_TXN_STATE
    assert reader.snapshot(row).last_stable_offset == 2
    assert [r.value for r in all_records(logs.partition_log("t", 0))] == [b"in"]


def test_a_marker_with_nothing_written_ends_the_expectation(world):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    assert end(appender, row, False) == 0
    assert reader.snapshot(row).aborted_generation == REGISTERED, "nothing aborted here"
    assert send(appender, producer, "t", [b"x"]) == -CompletionCode.INVALID_TXN_STATE


def test_a_restart_finds_the_open_transactions_in_the_log(world, tmp_path):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    appender.expect_transaction(row, OTHER, 0)
    send(appender, producer, "t", [b"a"])
    send(appender, producer, "t", [b"b"], producer_id=OTHER)
    end(appender, row, False)
    appender.unregister_partition("t", 0)
    row = appender.register_partition("t", 0)
    assert appender.open_transactions(row) == [(OTHER, 0, 1)]
    assert reader.snapshot(row).last_stable_offset == 1
    assert len(logs.partition_log("t", 0).aborted_transactions(0, 3)) == 1, \
        "the walk found the abort indexed already"


def test_a_follower_follows_the_leaders_transactions(world, tmp_path):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    send(appender, producer, "t", [b"a"])
    send(appender, producer, "t", [b"plain"], producer_id=-1, epoch=-1, sequence=-1,
         transactional=False)
    end(appender, row, False)
    leader_bytes = logs.partition_log("t", 0).read(0, 1 << 20).data.copy()

    follower_logs = LogManager(str(tmp_path / "follower"))
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    table = PartitionStateTable.create(prefix + "-state", 4)
    try:
        follower = Appender(follower_logs, table)
        follower_logs.create_topic("t")
        follower_row = follower.register_partition("t", 0)
        follower.set_high_watermark_policy(follower_row, HighWatermarkPolicy.EXTERNAL, 0)
        sizes = []                       # the leader's batches one append at a time
        position = 0
        while position < leader_bytes.size:
            length = int(np.frombuffer(leader_bytes[position:position + 4], "<u4")[0])
            sizes.append(length)
            position += length
        follower.append_replicated(follower_row, leader_bytes[:sizes[0] + sizes[1]])
        follower.advance_high_watermark(follower_row, 2)
        assert table.snapshot(follower_row).last_stable_offset == 0
        follower.append_replicated(follower_row, leader_bytes[sizes[0] + sizes[1]:])
        follower.advance_high_watermark(follower_row, 3)
        snapshot = table.snapshot(follower_row)
        assert (snapshot.last_stable_offset, snapshot.aborted_generation) == \
            (3, REGISTERED + 1)
        aborted = follower_logs.partition_log("t", 0).aborted_transactions(0, 3)
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == \
            [(PRODUCER, 0, 2)]
    finally:
        follower_logs.close()
        table.close()
        table.unlink()


def test_a_transaction_open_across_rolls_is_found_from_the_snapshot(world):
    """The open transaction began two segments before the active one: the snapshot
    written at each roll carries it (version 3), so a restart's walk of the active
    segment alone finds it, and its abort after the restart is indexed."""
    logs, reader, appender, producer = world
    logs.create_topic("t", config={"segment.bytes": 4096})
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    assert send(appender, producer, "t", [b"open"]) == 0
    for sequence in range(60):                  # another producer rolls the log
        assert send(appender, producer, "t", [b"x" * 200], producer_id=OTHER,
                    sequence=sequence, transactional=False) == sequence + 1
    partition_log = logs.partition_log("t", 0)
    assert len(partition_log.segments) >= 3
    _, transactions = read_snapshot(partition_log.directory, partition_log.active.base_offset)
    assert transactions.tolist() == [[PRODUCER, 0, 0]]
    appender.unregister_partition("t", 0)
    row = appender.register_partition("t", 0)
    assert appender.open_transactions(row) == [(PRODUCER, 0, 0)]
    assert reader.snapshot(row).last_stable_offset == 0
    assert end(appender, row, False) == 61
    assert reader.snapshot(row).last_stable_offset == 62
    aborted = partition_log.aborted_transactions(0, 62)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == \
        [(PRODUCER, 0, 61)]


def test_an_abort_whose_index_entry_was_lost_is_indexed_again(world):
    """A crash between the abort marker and its .txnindex entry: the next open finds
    the marker in its walk and indexes the transaction."""
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, PRODUCER, 0)
    send(appender, producer, "t", [b"a"])
    send(appender, producer, "t", [b"b"], sequence=1)
    assert end(appender, row, False) == 2
    partition_log = logs.partition_log("t", 0)
    appender.unregister_partition("t", 0)
    for segment in partition_log.segments:
        segment.txn_index.truncate_to(0)          # the entry the crash lost
    assert partition_log.aborted_transactions(0, 3) == []
    row = appender.register_partition("t", 0)
    aborted = partition_log.aborted_transactions(0, 3)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(PRODUCER, 0, 2)]
    assert reader.snapshot(row).last_stable_offset == 3


def test_a_restart_holds_the_last_stable_offset_at_the_oldest_open_transaction(world):
    """The open transactions come back from the log in producer-id order, not log
    order: the last stable offset is still the oldest one's first offset (a broker
    restart once published the newer one's, and a reader saw the older one's records)."""
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.expect_transaction(row, OTHER, 0)        # the higher id opens first
    appender.expect_transaction(row, PRODUCER, 0)
    send(appender, producer, "t", [b"older"], producer_id=OTHER)
    send(appender, producer, "t", [b"newer"])
    assert reader.snapshot(row).last_stable_offset == 0
    appender.unregister_partition("t", 0)
    row = appender.register_partition("t", 0)
    assert sorted(appender.open_transactions(row)) == [(PRODUCER, 0, 1), (OTHER, 0, 0)]
    assert reader.snapshot(row).last_stable_offset == 0


def test_batches_held_for_a_coordinator_elsewhere_go_in_in_order(world):
    """A verifier that must ask a coordinator on another broker holds the first batch;
    the producer's later batches for the partition, which the compiled loop would
    otherwise refuse as out of sequence, are held behind it, their completions
    parked in ring order; once verified they go in in order, their sequences
    checked then."""
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    asked, held = [], []
    appender.set_transaction_verifier(
        lambda *named: asked.append(named) or CompletionCode.TRANSACTION_VERIFYING,
        held.append)
    entries = [producer.put(appender.destination("t", 0), encode_batch(
        [b"v%d" % n], producer_id=PRODUCER, producer_epoch=0, base_sequence=n,
        transactional=True), 1000) for n in range(3)]
    appender.drain()
    assert asked == [("t", 0, PRODUCER, 0)], "one verification for the three"
    assert [entry.number for entry in held] == [0, 1, 2]
    assert [producer.result(entry) for entry in entries] == [None, None, None], "parked"
    assert appender.transaction_verified(row, PRODUCER, 0, True)
    for entry in held:
        result, append_time = appender.append(entry.row, entry.batch)
        assert appender.resolve_forwarded(entry.ring, entry.number, result, append_time)
    assert [producer.result(entry)[0] for entry in entries] == [0, 1, 2]
    assert appender.open_transactions(row) == [(PRODUCER, 0, 0)]
    # The next batch is the compiled loop's again.
    assert send(appender, producer, "t", [b"v3"], sequence=3) == 3


def test_a_refused_verification_releases_the_hold(world):
    logs, reader, appender, producer = world
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    held = []
    appender.set_transaction_verifier(
        lambda *named: CompletionCode.TRANSACTION_VERIFYING, held.append)
    entry = producer.put(appender.destination("t", 0), encode_batch(
        [b"x"], producer_id=PRODUCER, producer_epoch=0, transactional=True), 1000)
    appender.drain()
    assert not appender.transaction_verified(row, PRODUCER, 0, False)
    assert appender.resolve_forwarded(held[0].ring, held[0].number,
                                      -CompletionCode.INVALID_TXN_STATE, -1)
    assert producer.result(entry)[0] == -CompletionCode.INVALID_TXN_STATE
    assert appender.open_transactions(row) == [], "nothing held, nothing open"
    appender.set_transaction_verifier(lambda *named: CompletionCode.INVALID_TXN_STATE)
    assert send(appender, producer, "t", [b"y"]) == -CompletionCode.INVALID_TXN_STATE, \
        "verified again, not held"
