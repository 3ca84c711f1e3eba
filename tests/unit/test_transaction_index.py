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

import pytest

from shmlog.common.errors import AbortedTransactionOrderError, StorageError
from shmlog.storage import index_layout as I
from shmlog.storage import transaction_index_layout as L
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
