"""The aborted-transaction index (``.txnindex``, Kafka's ``TransactionIndex``): its
format byte for byte, its lazy file, its order rule, truncation, a torn tail cut at
every byte, the collection across segments, and how the partition log keeps it:
truncation, retention, a compaction swap, recovery, ``shmlog dump``.

Method: real files in a temporary directory; the format is checked against entries
packed by hand with ``struct`` (Kafka's ``AbortedTxn``: version i16, then four i64,
big-endian); a kill in the middle of an append is a file cut at a byte; a crash is a
log abandoned as a killed process leaves it (``helpers.abandon``).
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest

from helpers import abandon, values_batch
from shmlog.common.errors import AbortedTransactionOrderError, StorageError
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.records import encode_batch, now_ms
from shmlog.segments import PartitionLog
from shmlog.storage import cleaner
from shmlog.storage import index_layout as I
from shmlog.storage import transaction_index_layout as L
from shmlog.storage.topic_config import TopicConfig
from shmlog.storage.transaction_index import AbortedTransaction, TransactionIndex

ENTRIES = [AbortedTransaction(7, 0, 4, 0), AbortedTransaction(2**40 + 3, 2, 9, 2),
           AbortedTransaction(9, 10, 12, 13)]


def kafka_entry(producer_id, first, last, stable, version=0) -> bytes:
    """An AbortedTxn as Kafka writes it: version i16, producerId, firstOffset,
    lastOffset, lastStableOffset i64, big-endian."""
    return struct.pack(">hqqqq", version, producer_id, first, last, stable)


def txn_path(directory, base_offset=0) -> str:
    return os.path.join(str(directory), I.segment_file_name(base_offset, I.TXN_INDEX_SUFFIX))


# --- the file ------------------------------------------------------------------------------

def test_an_entry_is_kafka_s_34_big_endian_bytes(tmp_path):
    assert L.ENTRY_LENGTH == 34
    assert ENTRIES[1].pack() == kafka_entry(2**40 + 3, 2, 9, 2)
    index = TransactionIndex(txn_path(tmp_path), 0)
    for entry in ENTRIES:
        index.append(entry)
    with open(index.path, "rb") as source:
        assert source.read() == b"".join(kafka_entry(*entry) for entry in ENTRIES)
    assert index.entries() == ENTRIES
    assert TransactionIndex(index.path, 0).entries() == ENTRIES, "read back from the file"
    assert L.read_transactions(index.path) == ENTRIES


def test_the_consumer_s_read_gives_producer_first_and_last_offsets(tmp_path):
    path = txn_path(tmp_path)
    with open(path, "wb") as target:
        target.write(b"".join(kafka_entry(*entry) for entry in ENTRIES))
    aborted = L.read_aborted(path)
    assert aborted.dtype.names == ("producer_id", "first_offset", "last_offset")
    assert [tuple(int(value) for value in row) for row in aborted] == \
        [entry[:3] for entry in ENTRIES]
    assert L.read_aborted(str(tmp_path / "missing.txnindex")).size == 0


def test_the_file_is_made_by_the_first_entry_only(tmp_path):
    index = TransactionIndex(txn_path(tmp_path), 0)
    assert index.entries() == []
    index.truncate_to(0)
    index.sync()
    index.close()
    assert not os.path.exists(index.path)
    assert index.append(ENTRIES[0]) is True
    assert index.append(ENTRIES[1]) is False
    assert os.path.getsize(index.path) == 2 * 34


def test_the_file_is_private_and_never_written_through_a_symbolic_link(tmp_path):
    index = TransactionIndex(txn_path(tmp_path), 0)
    index.append(ENTRIES[0])
    assert stat.S_IMODE(os.stat(index.path).st_mode) == 0o600
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    planted = tmp_path / I.segment_file_name(5, I.TXN_INDEX_SUFFIX)
    os.symlink(target, planted)
    with pytest.raises(StorageError):
        TransactionIndex(str(planted), 5).append(AbortedTransaction(1, 5, 6, 5))
    with pytest.raises(StorageError):
        L.read_aborted(str(planted))
    assert target.read_bytes() == b"", "nothing went through the link"


@pytest.mark.parametrize("entry", [
    AbortedTransaction(1, 3, 9, 3),          # the same last offset as the last entry's
    AbortedTransaction(1, 3, 8, 3),          # below it
    AbortedTransaction(1, 11, 10, 3),        # past it, but its first offset is past its last
])
def test_an_entry_out_of_order_is_refused_and_nothing_is_written(tmp_path, entry):
    index = TransactionIndex(txn_path(tmp_path), 0)
    index.append(ENTRIES[0])
    index.append(ENTRIES[1])
    before = open(index.path, "rb").read()
    with pytest.raises(AbortedTransactionOrderError):
        index.append(entry)
    assert open(index.path, "rb").read() == before
    assert index.entries() == ENTRIES[:2]


def test_an_entry_below_the_segment_is_refused(tmp_path):
    index = TransactionIndex(txn_path(tmp_path, 100), 100)
    with pytest.raises(AbortedTransactionOrderError):
        index.append(AbortedTransaction(1, 50, 99, 50))
    assert not os.path.exists(index.path)
    index.append(AbortedTransaction(1, 50, 100, 50))       # begun in an earlier segment


def test_truncate_to_drops_the_entries_with_a_marker_at_or_past_the_offset(tmp_path):
    index = TransactionIndex(txn_path(tmp_path), 0)
    for entry in ENTRIES:
        index.append(entry)
    index.truncate_to(13)                     # past every marker: nothing goes
    assert index.entries() == ENTRIES
    index.truncate_to(12)                     # the third's marker
    assert index.entries() == ENTRIES[:2]
    assert os.path.getsize(index.path) == 2 * 34
    index.truncate_to(5)
    assert index.entries() == ENTRIES[:1]
    assert TransactionIndex(index.path, 0).entries() == ENTRIES[:1]
    index.truncate_to(0)
    assert index.entries() == [] and os.path.getsize(index.path) == 0
    index.append(ENTRIES[0])                  # appends go on after a truncation
    assert TransactionIndex(index.path, 0).entries() == ENTRIES[:1]


def test_a_torn_tail_is_cut_at_every_byte_keeping_the_whole_entries(tmp_path, caplog):
    whole = b"".join(kafka_entry(*entry) for entry in ENTRIES)
    path = txn_path(tmp_path)
    for cut in range(len(whole) + 1):
        with open(path, "wb") as target:
            target.write(whole[:cut])
        kept = cut // 34
        assert [tuple(row) for row in L.read_aborted(path)] == \
            [entry[:3] for entry in ENTRIES[:kept]], "a reader stops at the tear"
        assert os.path.getsize(path) == cut, "a reader changes nothing"
        caplog.clear()
        with caplog.at_level(logging.WARNING, "shmlog.storage.transaction_index"):
            index = TransactionIndex(path, 0)
            assert index.entries() == ENTRIES[:kept]
        assert os.path.getsize(path) == kept * 34
        assert len(caplog.records) == (1 if cut % 34 else 0), cut
        index.append(AbortedTransaction(1, 20, 20 + cut, 20))    # after the whole entries
        assert TransactionIndex(path, 0).entries() == \
            ENTRIES[:kept] + [AbortedTransaction(1, 20, 20 + cut, 20)]


@pytest.mark.parametrize("damage", ["version", "order"])
def test_an_invalid_entry_ends_the_entries_kept(tmp_path, damage):
    entries = [kafka_entry(*entry) for entry in ENTRIES]
    entries[1] = kafka_entry(*ENTRIES[1], version=1) if damage == "version" \
        else kafka_entry(2, 0, 3, 0)          # a marker before the first entry's
    path = txn_path(tmp_path)
    with open(path, "wb") as target:
        target.write(b"".join(entries))
    assert L.read_aborted(path).size == 1
    assert TransactionIndex(path, 0).entries() == ENTRIES[:1]
    assert os.path.getsize(path) == 34


def test_rename_moves_the_file_and_delete_removes_it(tmp_path):
    index = TransactionIndex(txn_path(tmp_path), 0)
    index.append(ENTRIES[0])
    moved = index.path + ".deleted"
    index.rename(moved)
    assert index.path == moved and os.path.exists(moved)
    assert not os.path.exists(txn_path(tmp_path))
    assert TransactionIndex(moved, 0).entries() == ENTRIES[:1]
    index.delete()
    assert not os.path.exists(moved) and index.entries() == []
    index.delete()                            # nothing to delete: no error


# --- the partition log ------------------------------------------------------------------------

def marker(producer_id: int, committed: bool = False):
    return encode_marker(EndTransactionMarker(producer_id, 0, committed, 0))


def transactional(producer_id: int, count: int = 3):
    return encode_batch([b"t%d" % index for index in range(count)], producer_id=producer_id,
                        producer_epoch=0, base_sequence=0, transactional=True)


def abort_in(partition_log, producer_id: int, first: int, stable: int) -> AbortedTransaction:
    """Append an abort marker for ``producer_id`` and index its transaction."""
    last = partition_log.append(marker(producer_id)).base_offset
    partition_log.append_aborted_transaction(producer_id, first, last, stable)
    return AbortedTransaction(producer_id, first, last, stable)


def test_a_log_without_aborts_has_no_txnindex_and_the_first_abort_makes_one(open_log, tmp_path):
    partition_log = open_log()
    partition_log.append(values_batch(5, 0))
    partition_log.append(marker(3, committed=True))
    assert not [name for name in os.listdir(tmp_path / "partition")
                if name.endswith(I.TXN_INDEX_SUFFIX)]
    entry = abort_in(partition_log, 4, 2, 2)
    assert os.path.exists(partition_log.active.txn_index.path)
    assert partition_log.aborted_transactions(0, partition_log.log_end_offset) == [entry]
    partition_log.close()
    reopened = open_log()
    assert reopened.aborted_transactions(0, reopened.log_end_offset) == [entry]


def test_an_abort_below_the_active_segment_is_refused(open_log):
    partition_log = open_log()
    partition_log.append(values_batch(5, 0))
    partition_log.roll()
    partition_log.append(values_batch(5, 1))
    with pytest.raises(AbortedTransactionOrderError):
        partition_log.append_aborted_transaction(1, 0, 3, 0)


def three_segments(partition_log):
    """Kafka's example of a fetch's aborted transactions across segments:
    A (producer 1) and C (3) abort inside their own segments while B (2), begun in
    the first, stays open until the third."""
    partition_log.append(transactional(1))                        # 0..2  A
    partition_log.append(transactional(2))                        # 3..5  B
    a = abort_in(partition_log, 1, 0, 3)                          # 6: B still open
    partition_log.roll()
    partition_log.append(transactional(3))                        # 7..9  C
    c = abort_in(partition_log, 3, 7, 3)                          # 10
    partition_log.roll()
    partition_log.append(values_batch(4, 0))                      # 11..14
    b = abort_in(partition_log, 2, 3, 16)                         # 15: nothing open after
    partition_log.append(values_batch(4, 1))                      # 16..19
    return a, b, c


def test_aborted_transactions_are_collected_across_segments(open_log):
    partition_log = open_log()
    a, b, c = three_segments(partition_log)
    assert len(partition_log.segments) == 3
    end = partition_log.log_end_offset
    assert partition_log.aborted_transactions(0, end) == [a, c, b]
    assert partition_log.aborted_transactions(7, end) == [c, b], "A ended before 7"
    # B began at 3: a read of [0, 7) meets it, though its marker is two segments on.
    assert partition_log.aborted_transactions(0, 7) == [a, b]
    assert partition_log.aborted_transactions(11, 15) == [b]
    assert partition_log.aborted_transactions(16, end) == []
    assert partition_log.aborted_transactions(1000, 1001) == []


def test_truncate_to_cuts_the_entries_with_it(open_log):
    partition_log = open_log()
    a, b, c = three_segments(partition_log)
    partition_log.truncate_to(15)                       # B's marker goes
    assert partition_log.aborted_transactions(0, 100) == [a, c]
    assert partition_log.active.base_offset == 11
    assert TransactionIndex(partition_log.active.txn_index.path, 11).entries() == []
    partition_log.truncate_to(8)                        # C's segment's marker goes too
    assert partition_log.aborted_transactions(0, 100) == [a]
    assert not os.path.exists(txn_path(partition_log.directory, 11)), "deleted with its segment"
    assert TransactionIndex(txn_path(partition_log.directory, 7), 7).entries() == []
    partition_log.close()
    reopened = PartitionLog(partition_log.directory, TopicConfig())
    try:
        assert reopened.aborted_transactions(0, 100) == [a]
        b2 = abort_in(reopened, 2, 3, reopened.log_end_offset)
        assert reopened.aborted_transactions(0, 100) == [a, b2]
    finally:
        reopened.close()


def test_truncate_fully_deletes_every_txnindex(open_log):
    partition_log = open_log()
    three_segments(partition_log)
    partition_log.truncate_fully_and_start_at(100)
    assert not [name for name in os.listdir(partition_log.directory)
                if name.endswith(I.TXN_INDEX_SUFFIX)]
    assert partition_log.aborted_transactions(0, 200) == []


def test_retention_deletes_a_segment_s_txnindex_with_it(open_log):
    partition_log = open_log()
    a, b, c = three_segments(partition_log)
    first = txn_path(partition_log.directory, 0)
    assert os.path.exists(first)
    assert partition_log.advance_log_start_offset(7) == [0]
    assert not os.path.exists(first)
    assert partition_log.aborted_transactions(7, 100) == [c, b]


def test_flush_syncs_a_new_txnindex_and_its_directory_entry(open_log, monkeypatch):
    partition_log = open_log()
    partition_log.append(values_batch(3, 0))
    partition_log.flush()
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    abort_in(partition_log, 1, 0, 0)
    partition_log.flush()
    assert os.path.realpath(partition_log.active.txn_index.path) in synced
    assert os.path.realpath(partition_log.directory) in synced


def test_recovery_cuts_an_entry_whose_marker_was_lost(open_log):
    partition_log = open_log()
    partition_log.append(transactional(1))
    kept = abort_in(partition_log, 1, 0, 3)
    partition_log.append(transactional(2))
    lost = abort_in(partition_log, 2, 4, 7)
    log_path = partition_log.active.log_path
    marker_position = partition_log.active.position_of(lost.last_offset)
    abandon(partition_log)
    with open(log_path, "r+b") as target:      # the marker's batch torn (never synced)
        target.seek(marker_position + 20)
        target.write(b"\xff" * 8)
    reopened = open_log()
    assert reopened.log_end_offset == lost.last_offset
    assert reopened.aborted_transactions(0, 100) == [kept]
    assert TransactionIndex(reopened.active.txn_index.path, 0).entries() == [kept]


def test_an_orphan_txnindex_is_removed_at_open(open_log):
    partition_log = open_log()
    partition_log.append(values_batch(3, 0))
    directory = partition_log.directory
    partition_log.close()
    orphan = txn_path(directory, 500)
    with open(orphan, "wb") as target:
        target.write(kafka_entry(1, 500, 501, 500))
    open_log()
    assert not os.path.exists(orphan)


def test_compaction_carries_the_entries_into_the_cleaned_segment(tmp_path):
    config = TopicConfig.from_overrides({"cleanup.policy": "compact", "segment.bytes": 8192,
                                         "min.cleanable.dirty.ratio": 0.01})
    directory = str(tmp_path / "p")
    with PartitionLog(directory, config) as partition_log:
        expected = []
        for producer_id in (1, 2, 3):
            partition_log.append(encode_batch([b"x" * 40] * 5,
                                              keys=[b"k%d" % key for key in range(5)]))
            first = partition_log.append(transactional(producer_id)).base_offset
            expected.append(abort_in(partition_log, producer_id, first, first))
            partition_log.roll()
        partition_log.append(values_batch(2, 9))
        before = partition_log.aborted_transactions(0, partition_log.log_end_offset)
        assert before == expected
        now = now_ms() + 1000
        cleaning = cleaner.clean(cleaner.plan(partition_log, now), now, 1 << 20)
        assert partition_log.replace_segments(cleaning)
        assert len(partition_log.segments) < 4, "the cleaned segments were grouped"
        assert partition_log.aborted_transactions(0, partition_log.log_end_offset) == expected
        names = [name for name in os.listdir(directory) if name.endswith(I.TXN_INDEX_SUFFIX)]
        assert names == [I.segment_file_name(0, I.TXN_INDEX_SUFFIX)]
    with PartitionLog(directory, config) as reopened:
        assert reopened.aborted_transactions(0, reopened.log_end_offset) == expected


# --- shmlog dump ----------------------------------------------------------------------------

def shmlog(*arguments):
    return subprocess.run([sys.executable, "-m", "shmlog", *arguments], capture_output=True,
                          text=True, timeout=120)


def test_dump_prints_each_entry_as_kafka_s_dump_log_segments(open_log):
    partition_log = open_log()
    partition_log.append(transactional(5))
    first = abort_in(partition_log, 5, 0, 0)
    partition_log.append(transactional(2**40))
    second = abort_in(partition_log, 2**40, 4, 4)
    path = partition_log.active.txn_index.path
    partition_log.close()
    done = shmlog("dump", "--verify", path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"version: 0 producerId: {entry.producer_id} firstOffset: {entry.first_offset} "
        f"lastOffset: {entry.last_offset} lastStableOffset: {entry.last_stable_offset}"
        for entry in (first, second)]
    with open(path, "ab") as target:           # a torn tail, and an entry naming no marker
        target.write(b"\x00" * 5)
    done = shmlog("dump", "--verify", path)
    assert done.returncode == 1
    assert "PROBLEM" in done.stdout and "not a whole entry" in done.stdout
    assert np.array_equal(L.read_aborted(path)["last_offset"], [3, 7])
