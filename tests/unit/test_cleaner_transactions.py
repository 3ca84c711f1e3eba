"""Compaction of a log holding transactions, as Kafka's cleaner does it: the records
of aborted transactions go (and never hide a committed record of their key), the
keys of committed ones compact like any other, an end-transaction marker stays
until no batch of its transaction is left and ``delete.retention.ms`` passed, a
transaction still open (at or past the last stable offset) is never cleaned, a
producer's last batch stays (emptied) for its sequence, and a read_committed read
gives the same records before and after every cleaning.

Method: real files in a temporary directory; a :class:`TxnLog` appends
transactional batches and markers to a :class:`PartitionLog` and indexes each abort
as the appender does (its first offset, marker offset and the last stable offset
then), keeping the model: which offsets are committed, aborted, open.
"""

from __future__ import annotations

import os

import numpy as np

from helpers import all_records
from shmlog.record import batch_layout as L
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.decoding import decode_records, iter_batches
from shmlog.record.records import encode_batch
from shmlog.segments import PartitionLog
from shmlog.storage import cleaner
from shmlog.storage.producer_snapshots import SNAPSHOT_SUFFIX
from shmlog.storage.topic_config import TopicConfig

DAY_MS = 24 * 3600 * 1000
NOW = 1_700_000_000_000


def compact_config() -> TopicConfig:
    return TopicConfig.from_overrides({"cleanup.policy": "compact", "segment.bytes": 1 << 16,
                                       "min.cleanable.dirty.ratio": 0.01,
                                       "delete.retention.ms": DAY_MS})


class TxnLog:
    """A partition log written as a transaction coordinator and its producers would."""

    def __init__(self, partition_log: PartitionLog):
        self.log = partition_log
        self.open: dict[int, int] = {}          # producer id -> first offset
        self.sequences: dict[int, int] = {}

    def send(self, producer_id: int, keys, *, transactional: bool = True,
             timestamp: int = NOW, compression=None) -> int:
        keys = [key.encode() for key in keys]
        values = [b"%d:%s" % (producer_id, key) for key in keys]
        sequence = self.sequences.get(producer_id, 0)
        self.sequences[producer_id] = sequence + len(keys)
        batch = encode_batch(values, keys=keys, producer_id=producer_id, producer_epoch=0,
                             base_sequence=sequence, transactional=transactional,
                             timestamps=[timestamp] * len(keys), compression=compression)
        base = self.log.append(batch).base_offset
        if transactional:
            self.open.setdefault(producer_id, base)
        return base

    def plain(self, keys, timestamp: int = NOW) -> int:
        keys = [key.encode() for key in keys]
        return self.log.append(encode_batch([b"plain:" + key for key in keys], keys=keys,
                                            timestamps=[timestamp] * len(keys))).base_offset

    def end(self, producer_id: int, committed: bool, timestamp: int = NOW) -> int:
        first = self.open.pop(producer_id)
        marker = self.log.append(encode_marker(
            EndTransactionMarker(producer_id, 0, committed, 0), timestamp)).base_offset
        if not committed:
            stable = min(self.open.values(), default=marker + 1)
            self.log.append_aborted_transaction(producer_id, first, marker, stable)
        return marker

    def last_stable_offset(self) -> int:
        return min(self.open.values(), default=self.log.log_end_offset)


def read_committed(partition_log: PartitionLog) -> list[tuple]:
    """What a read_committed consumer reads from the log start: the records below the
    last stable offset, aborted transactions' left out (their .txnindex entries)."""
    _, open_transactions = partition_log.producer_state()
    stable = int(open_transactions[:, 2].min()) if len(open_transactions) \
        else partition_log.log_end_offset
    offset = partition_log.log_start_offset
    records = []
    while offset < stable:
        result = partition_log.read(offset, max_bytes=1 << 16)
        if not result.data.size:
            break
        aborted = np.array([(entry.producer_id, entry.first_offset, entry.last_offset)
                            for entry in partition_log.aborted_transactions(offset, stable)],
                           np.int64).reshape(-1, 3)
        records += [(record.offset, record.key, record.value) for record in
                    decode_records(result.data, start_offset=offset, aborted=aborted)
                    if record.offset < stable]
        offset = result.next_offset
    return records


def assert_compacted(before: list[tuple], after: list[tuple]) -> None:
    """A cleaning only removes records (in order), and keeps each key's latest."""
    assert set(after) <= set(before) and after == sorted(after)
    latest = {key: (offset, value) for offset, key, value in before}
    assert latest == {key: (offset, value) for offset, key, value in after}


def batches(partition_log: PartitionLog):
    """Every batch header of the log, control batches included."""
    found = []
    for segment in partition_log.segments:
        found += list(iter_batches(segment.log[:segment.size]))
    return found


def markers(partition_log: PartitionLog) -> list[int]:
    return [info.base_offset for info in batches(partition_log)
            if info.attributes & L.CONTROL_BIT]


def run_cleaning(partition_log, now: int, last_stable_offset: int | None = None) -> bool:
    planned = cleaner.plan(partition_log, now, last_stable_offset)
    if planned is None:
        return False
    return partition_log.replace_segments(cleaner.clean(planned, now, 1 << 20))


def test_aborted_records_go_committed_ones_compact_and_markers_wait(tmp_path):
    with PartitionLog(str(tmp_path / "p"), compact_config()) as partition_log:
        txn = TxnLog(partition_log)
        keys = [f"k{index}" for index in range(5)]
        a = txn.send(1, keys)                                    # committed
        a_commit = txn.end(1, committed=True)
        b = txn.send(2, keys, compression="zstd")                # aborted, later: must not
        b2 = txn.send(2, ["k9"])                                 # hide A's records
        b_abort = txn.end(2, committed=False)
        c = txn.send(1, ["k0"])                                  # committed: supersedes A's k0
        c_commit = txn.end(1, committed=True)
        txn.plain(["k1"])                                        # supersedes A's k1
        partition_log.roll()
        txn.send(2, ["k8"])                                      # producer 2's last data
        txn.end(2, committed=True)
        before = read_committed(partition_log)
        assert run_cleaning(partition_log, NOW + 1000)

        records = all_records(partition_log)
        offsets = {record.offset for record in records}
        assert not offsets & set(range(b, b_abort)), "the aborted records are gone"
        assert offsets >= {a + 2, a + 3, a + 4, c}, "A's keys not written since stay"
        assert not offsets & {a, a + 1}, "committed records compact by key"
        kept = [record for record in before if record[0] not in (a, a + 1)]
        assert read_committed(partition_log) == kept
        assert_compacted(before, kept)
        # The abort's marker stays with its index entry while this pass removed its
        # data; the commits stay (data of A and C is left).
        assert {a_commit, b_abort, c_commit} <= set(markers(partition_log))
        end = partition_log.log_end_offset
        assert [entry.last_offset for entry in partition_log.aborted_transactions(0, end)] \
            == [b_abort]

        # Cleaned again within delete.retention.ms: no data of B is left, so its entry
        # goes (Kafka's cleaned index), the marker stays until the retention passed.
        txn.plain(["k1"])
        partition_log.roll()
        before = read_committed(partition_log)
        assert run_cleaning(partition_log, NOW + 2000)
        assert b_abort in markers(partition_log)
        assert partition_log.aborted_transactions(0, partition_log.log_end_offset) == []
        assert_compacted(before, read_committed(partition_log))

        # Past delete.retention.ms: the empty abort's marker goes; the commits of A and
        # C (their data is left) stay.
        txn.plain(["k1"])
        partition_log.roll()
        before = read_committed(partition_log)
        assert run_cleaning(partition_log, NOW + DAY_MS + 10_000)
        assert b_abort not in markers(partition_log)
        assert {a_commit, c_commit} <= set(markers(partition_log))
        assert_compacted(before, read_committed(partition_log))
        assert b2 not in {record.offset for record in all_records(partition_log)}


def test_a_committed_transaction_s_marker_goes_once_its_records_are_compacted_away(tmp_path):
    with PartitionLog(str(tmp_path / "p"), compact_config()) as partition_log:
        txn = TxnLog(partition_log)
        txn.send(1, ["k0", "k1"])
        commit = txn.end(1, committed=True)
        txn.send(1, ["k2"])                        # producer 1's last data: stays
        txn.end(1, committed=True)
        txn.plain(["k0", "k1"])                    # every record of the first transaction
        partition_log.roll()
        txn.plain(["z"])
        assert run_cleaning(partition_log, NOW + DAY_MS + 10_000)
        # This pass met the transaction's batch (compacted empty now): its marker stays.
        assert commit in markers(partition_log)
        txn.plain(["z"])
        partition_log.roll()
        assert run_cleaning(partition_log, NOW + DAY_MS + 20_000)
        assert commit not in markers(partition_log)
        # The second transaction's record is left: its marker stays.
        assert len(markers(partition_log)) == 1


def test_an_open_transaction_is_never_cleaned(tmp_path):
    with PartitionLog(str(tmp_path / "p"), compact_config()) as partition_log:
        txn = TxnLog(partition_log)
        txn.send(2, ["k0"])
        abort = txn.end(2, committed=False)
        txn.plain(["k0", "k1"])
        partition_log.roll()
        first_open = txn.send(1, ["k0", "k1"])          # open across the next rolls
        txn.plain(["k0"])
        partition_log.roll()
        txn.plain(["k1"])
        partition_log.roll()
        txn.plain(["k2"])
        open_bases = [segment.base_offset for segment in partition_log.segments
                      if segment.next_offset > first_open]
        planned = cleaner.plan(partition_log, NOW + 1000)
        assert planned.end_offset <= first_open, "derived from the open transactions"
        assert cleaner.plan(partition_log, NOW + 1000, txn.last_stable_offset()) == planned
        before = read_committed(partition_log)
        sizes = {segment.base_offset: segment.size for segment in partition_log.segments}
        assert run_cleaning(partition_log, NOW + 1000, txn.last_stable_offset())
        assert all(segment.size == sizes[segment.base_offset] for segment in
                   partition_log.segments if segment.base_offset in open_bases), \
            "the segments from the open transaction on are as written"
        assert abort in markers(partition_log)
        assert read_committed(partition_log) == before
        # A last stable offset below every segment's end: nothing is cleanable.
        assert cleaner.plan(partition_log, NOW + 1000, 0) is None
        # Once it commits, its records compact like any other.
        txn.end(1, committed=True)
        partition_log.roll()
        assert run_cleaning(partition_log, NOW + 1000, txn.last_stable_offset())
        offsets = {record.offset for record in all_records(partition_log)}
        assert first_open not in offsets and first_open + 1 not in offsets


def test_a_producer_s_last_batch_stays_empty_for_its_sequence(tmp_path):
    directory = str(tmp_path / "p")
    with PartitionLog(directory, compact_config()) as partition_log:
        txn = TxnLog(partition_log)
        last = txn.send(7, ["k0", "k1"], transactional=False, compression="zstd")
        aborted = txn.send(8, ["k5"])
        txn.end(8, committed=False)
        txn.plain(["k0", "k1"])
        partition_log.roll()
        txn.plain(["z"])
        producers_before = partition_log.producer_batches()
        assert run_cleaning(partition_log, NOW + DAY_MS + 10_000)
        by_offset = {info.base_offset: info for info in batches(partition_log)}
        for base in (last, aborted):
            assert by_offset[base].record_count == 0, "kept empty: its producer's last"
            assert by_offset[base].attributes & L.CODEC_MASK == L.CODEC_NONE
        assert not [record for record in all_records(partition_log)
                    if record.offset in (last, last + 1, aborted)]
    # A walk of the cleaned log (no snapshot) finds both producers' last sequences.
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX):
            os.unlink(os.path.join(directory, name))
    with PartitionLog(directory, compact_config()) as reopened:
        assert np.array_equal(reopened.producer_batches(), producers_before)
