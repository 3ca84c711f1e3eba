"""Recovery of a log holding transactions, cut at every byte of its last segment:
the log ends at the last whole batch, the aborted transactions indexed are exactly
those whose ABORT marker survived, the transactions open are exactly those whose
marker was cut off (one of them open across the roll, found through the producer
snapshot), and a read_committed read returns exactly the committed records below
the last stable offset.

Method: a log of two transactional producers (commits, aborts, a transaction open
across a roll, plain batches in between) is written, indexed as the appender
indexes aborts, and abandoned as a killed process leaves it. Its files are kept in
memory; for every byte position of the last segment the directory is put back as
it was, that segment's file cut there (what follows reads as zeros, as the hole a
crash leaves in an active segment: a batch whose bytes from the cut on are zeros
is whole) and the log opened again, without fsyncs (durability is not what is
tested), ~2 ms a reopen. The expected state comes
from a model replayed over the batches the cut left whole.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import abandon
from shmlog.record import batch_layout as L
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.decoding import decode_records
from shmlog.record.records import encode_batch
from shmlog.segments import PartitionLog
from shmlog.storage.producer_snapshots import snapshot_offsets
from shmlog.storage.topic_config import TopicConfig
from shmlog.storage.transaction_index_layout import ENTRY_LENGTH

NOW = 1_700_000_000_000
CONFIG = TopicConfig.from_overrides({"segment.bytes": 1 << 16,
                                     "segment.index.bytes": 4096})


class Model:
    """The log as written: every batch (producer, kind, offsets, records), and what
    a prefix of them means for transactions."""

    def __init__(self, partition_log: PartitionLog):
        self.log = partition_log
        self.batches: list[dict] = []
        self.open: dict[int, int] = {}
        self.sequences: dict[int, int] = {}

    def send(self, producer_id: int, count: int) -> None:
        sequence = self.sequences.get(producer_id, 0)
        self.sequences[producer_id] = sequence + count
        values = [b"p%d-%d" % (producer_id, sequence + index) for index in range(count)]
        keys = [b"k%d" % (index % 3) for index in range(count)]
        base = self.log.append(encode_batch(values, keys=keys, producer_id=producer_id,
                                            producer_epoch=0, base_sequence=sequence,
                                            transactional=True,
                                            timestamps=[NOW] * count)).base_offset
        self.open.setdefault(producer_id, base)
        self.batches.append({"kind": "data", "producer": producer_id, "base": base,
                             "values": values})

    def plain(self, count: int) -> None:
        values = [b"plain-%d" % len(self.batches) + b"-%d" % index for index in range(count)]
        base = self.log.append(encode_batch(values, timestamps=[NOW] * count)).base_offset
        self.batches.append({"kind": "plain", "producer": -1, "base": base, "values": values})

    def end(self, producer_id: int, committed: bool) -> None:
        first = self.open.pop(producer_id)
        marker = self.log.append(encode_marker(EndTransactionMarker(producer_id, 0, committed, 0),
                                               NOW)).base_offset
        if not committed:
            stable = min(self.open.values(), default=marker + 1)
            self.log.append_aborted_transaction(producer_id, first, marker, stable)
        self.batches.append({"kind": "commit" if committed else "abort",
                             "producer": producer_id, "base": marker, "first": first,
                             "values": []})

    def expected(self, whole: int) -> dict:
        """What the first ``whole`` batches mean: the log end, the aborted
        transactions (producer, first, marker), the open ones (producer, first) and
        the committed records (offset, value) below the last stable offset."""
        batches = self.batches[:whole]
        last = batches[-1]
        end = last["base"] + max(1, len(last["values"]))
        open_: dict[int, int] = {}
        ended: dict[tuple[int, int], str] = {}      # (producer, first offset) -> kind
        aborted = []
        for batch in batches:
            if batch["kind"] == "data":
                open_.setdefault(batch["producer"], batch["base"])
            elif batch["kind"] in ("commit", "abort"):
                first = open_.pop(batch["producer"])
                ended[(batch["producer"], first)] = batch["kind"]
                if batch["kind"] == "abort":
                    aborted.append((batch["producer"], first, batch["base"]))
        stable = min(open_.values(), default=end)
        transaction_of: dict[int, tuple[int, int]] = {}
        current: dict[int, int] = {}
        committed = []
        for batch in batches:
            producer = batch["producer"]
            if batch["kind"] == "data":
                first = current.setdefault(producer, batch["base"])
                transaction_of[batch["base"]] = (producer, first)
            elif batch["kind"] in ("commit", "abort"):
                current.pop(producer)
                continue
            if batch["kind"] == "data" and ended.get(transaction_of[batch["base"]]) != "commit":
                continue
            committed += [(batch["base"] + index, value)
                          for index, value in enumerate(batch["values"])
                          if batch["base"] + index < stable]
        return {"end": end, "aborted": aborted,
                "open": sorted((producer, first) for producer, first in open_.items()),
                "committed": committed}


def build(directory: str) -> Model:
    """Two producers' transactions over two segments; the last holds every kind of
    batch, and producer 1's first transaction is open across the roll."""
    partition_log = PartitionLog(directory, CONFIG)
    model = Model(partition_log)
    model.send(2, 2)
    model.plain(1)
    model.end(2, committed=True)
    model.send(1, 3)                                   # open across the roll
    partition_log.roll()
    model.send(2, 2)
    model.send(1, 1)
    model.end(1, committed=False)                      # aborts the one open since segment 0
    model.plain(2)
    model.send(2, 1)
    model.end(2, committed=True)
    model.send(1, 2)
    model.send(2, 3)
    model.end(2, committed=False)
    model.plain(1)
    model.end(1, committed=True)
    model.send(1, 1)
    model.send(2, 2)
    model.end(1, committed=False)
    model.send(2, 1)
    return model


def read_committed(partition_log: PartitionLog) -> tuple[list, list]:
    """(the open transactions as (producer, first offset), the records a
    read_committed consumer reads from the log start as (offset, value))."""
    _, open_transactions = partition_log.producer_state()
    open_ = sorted((int(row[0]), int(row[2])) for row in open_transactions)
    stable = min((first for _, first in open_), default=partition_log.log_end_offset)
    data = np.concatenate([segment.log[:segment.size] for segment in partition_log.segments])
    aborted = np.array([(entry.producer_id, entry.first_offset, entry.last_offset)
                        for entry in partition_log.aborted_transactions(0, stable)],
                       np.int64).reshape(-1, 3)
    records = [(record.offset, record.value)
               for record in decode_records(data, aborted=aborted) if record.offset < stable]
    return open_, records


def batch_ends(data: bytes) -> list[int]:
    ends, position = [], 0
    while position + 4 <= len(data):
        length = int.from_bytes(data[position:position + 4], "little")
        if length < L.HEADER_LENGTH:
            break
        position += length
        ends.append(position)
    return ends


def restore(path: str, content: bytes) -> None:
    """Put ``content`` back in ``path``, written in place (a file emptied and written
    again is flushed at its close by ext4's auto_da_alloc: a disk write per reopen)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(descriptor, content, 0)
        if os.fstat(descriptor).st_size != len(content):
            os.ftruncate(descriptor, len(content))
    finally:
        os.close(descriptor)


def test_recovery_at_every_byte_of_a_segment_holding_markers(tmp_path, monkeypatch):
    # Durability is not what is tested: no fsync, so the reopens take milliseconds.
    monkeypatch.setattr(os, "fsync", lambda descriptor: None)
    directory = str(tmp_path / "p")
    model = build(directory)
    last = model.log.active
    last_path, last_size, last_base = last.log_path, last.size, last.base_offset
    abandon(model.log)
    files = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        with open(path, "rb") as source:
            files[name] = source.read()
    data = files[os.path.basename(last_path)][:last_size]
    file_size = len(files[os.path.basename(last_path)])
    ends = batch_ends(data)
    assert ends[-1] == last_size
    in_first = sum(1 for batch in model.batches if batch["base"] < last_base)
    assert any(batch["kind"] == "abort" for batch in model.batches[in_first:])

    prefixes = set()
    for cut in range(last_size + 1):
        for name in os.listdir(directory):
            if name not in files:
                os.unlink(os.path.join(directory, name))
        files[os.path.basename(last_path)] = data[:cut] + bytes(file_size - cut)   # torn
        for name, content in files.items():
            restore(os.path.join(directory, name), content)
        # A batch whose bytes from the cut on are zeros (a marker ends with its zero
        # coordinator epoch and header count) is whole: the hole reads as zeros.
        whole = in_first + sum(1 for end in ends if not any(data[cut:end]))
        prefixes.add(whole)
        expected = model.expected(whole)
        reopened = PartitionLog(directory, CONFIG)
        try:
            assert reopened.log_end_offset == expected["end"], cut
            assert [(entry.producer_id, entry.first_offset, entry.last_offset) for entry in
                    reopened.aborted_transactions(0, reopened.log_end_offset)] == \
                expected["aborted"], cut
            open_, records = read_committed(reopened)
            assert open_ == expected["open"], cut
            assert records == expected["committed"], cut
        finally:
            abandon(reopened)
    assert prefixes == set(range(in_first, len(model.batches) + 1)), "every prefix was met"


@pytest.mark.parametrize("kept_entries", [0, 1])
def test_aborts_an_os_crash_kept_out_of_a_closed_segments_index_are_indexed_again(
        tmp_path, kept_entries):
    """An OS crash can keep a closed segment's abort markers (written back by the
    kernel) and lose its ``.txnindex``, or its tail (never fsynced). Recovery scans
    every segment above the recovery point; it indexes their aborts again, so a
    read_committed read still leaves the aborted records out."""
    directory = str(tmp_path / "p")
    model = build(directory)
    model.log.roll()                        # the segment holding the aborts is closed
    model.send(2, 1)
    expected = model.expected(len(model.batches))
    lost = model.log.segments[-2].txn_index.path
    assert os.path.exists(lost) and expected["aborted"], "the closed segment indexes aborts"
    abandon(model.log)                      # nothing flushed: recovery scans every segment
    with open(lost, "r+b") as index:
        index.truncate(kept_entries * ENTRY_LENGTH)
    reopen_and_check(directory, expected)


def test_aborts_are_indexed_again_in_a_log_restarted_without_snapshots(tmp_path):
    """A follower's log restarted at an offset (its leader's log start) keeps no
    producer snapshot: the walk that finds a closed segment's aborts then starts at
    the log's first segment, with nothing below it."""
    directory = str(tmp_path / "p")
    model = Model(PartitionLog(directory, CONFIG))
    model.log.truncate_fully_and_start_at(100)
    model.send(1, 2)
    model.end(1, committed=False)
    model.send(2, 1)
    model.end(2, committed=True)
    model.log.roll()
    model.plain(1)
    expected = model.expected(len(model.batches))
    assert expected["aborted"] == [(1, 100, 102)]
    lost = model.log.segments[-2].txn_index.path
    abandon(model.log)
    assert all(offset > 100 for offset in snapshot_offsets(directory)), "none at or below 100"
    os.unlink(lost)
    reopen_and_check(directory, expected)


def reopen_and_check(directory: str, expected: dict) -> None:
    """Open the log again: its indexed aborts and a read_committed read are the
    model's."""
    reopened = PartitionLog(directory, CONFIG)
    try:
        assert [(entry.producer_id, entry.first_offset, entry.last_offset) for entry in
                reopened.aborted_transactions(0, reopened.log_end_offset)] == expected["aborted"]
        assert read_committed(reopened) == (expected["open"], expected["committed"])
    finally:
        reopened.close()
