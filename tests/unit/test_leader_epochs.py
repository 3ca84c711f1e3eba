"""The leader-epoch cache (Kafka's LeaderEpochFileCache) and how a partition log
keeps it right.

Goal: each of Kafka's rules for the cache, one per test, named after the Kafka
function it follows (``LeaderEpochFileCache.assign``, ``endOffsetFor``,
``truncateFromEnd``, ``truncateFromStart``, ``clearAndFlush``); the checkpoint's
round trip and its rebuild from the log's batch headers; and the log's own paths
(appends, compiled appends through a real appender, truncation, a restart empty,
DeleteRecords, retention, recovery) keeping it equal to what the log holds.

Method: plain numbers for the rules (a cache in a temporary directory); real
partition logs on disk with small segments for the rest, with a crash simulated
by abandoning a log (its mappings dropped, nothing flushed) and a lost or damaged
checkpoint by writing the file by hand.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest

from helpers import abandon, values_batch
from shmlog import LogManager
from shmlog.broker.appender import Appender
from shmlog.common import limits
from shmlog.common.errors import LocalProtocolError
from shmlog.record import batch_layout as B
from shmlog.ring import Ring
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name
from shmlog.storage.leader_epochs import (
    CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
    epoch_starts,
)
from shmlog.storage.topic_config import TopicConfig

SMALL = {"segment.bytes": 16 << 10, "index.interval.bytes": 256, "segment.index.bytes": 4096}


def cache_with(tmp_path, *entries) -> LeaderEpochCache:
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def checkpoint(directory) -> dict:
    with open(os.path.join(str(directory), CHECKPOINT_FILE)) as source:
        return json.load(source)


# --- the rules, with plain numbers ------------------------------------------------------

def test_assign_appends_a_higher_epoch_and_ignores_the_latest_again(tmp_path):
    # LeaderEpochFileCache.assign: isUpdateNeeded is false for the latest epoch at no
    # lower start.
    cache = cache_with(tmp_path, (0, 0), (1, 10), (1, 15), (1, 10))
    assert cache.entries() == [(0, 0), (1, 10)]
    assert cache.latest_epoch == 1 and cache.latest() == (1, 10)


def test_assign_drops_entries_the_new_one_makes_non_monotonic(tmp_path):
    # LeaderEpochFileCache.maybeTruncateNonMonotonicEntries: an epoch at or above the
    # new one, or a start at or above its start, goes.
    table = [
        ([(0, 0), (1, 10)], (1, 5), [(0, 0), (1, 5)]),            # same epoch, lower start
        ([(0, 0), (3, 20)], (2, 25), [(0, 0), (2, 25)]),           # lower epoch
        ([(0, 0), (1, 5), (2, 25)], (4, 3), [(0, 0), (4, 3)]),     # higher epoch, lower start
        ([(0, 0), (1, 5)], (2, 5), [(0, 0), (2, 5)]),              # a leader that never appended
    ]
    for index, (before, new, after) in enumerate(table):
        directory = tmp_path / str(index)
        directory.mkdir()
        cache = cache_with(directory, *before)
        cache.assign(*new)
        assert cache.entries() == after, (before, new)
        assert checkpoint(directory)["entries"] == [list(entry) for entry in after]


def test_assign_refuses_negative_or_out_of_range_values(tmp_path):
    cache = cache_with(tmp_path)
    for epoch, start in ((-1, 0), (0, -1), (1 << 31, 0), (0, limits.OFFSET_MAX + 1), (True, 0)):
        with pytest.raises(LocalProtocolError):
            cache.assign(epoch, start)
    assert cache.entries() == [] and cache.latest() is None and cache.latest_epoch == -1


def test_end_offset_for_answers_the_four_cases(tmp_path):
    # LeaderEpochFileCache.endOffsetFor (design section 3.3).
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    log_end = 30
    table = [
        (5, (5, 30)),                      # the latest epoch: the log end
        (6, UNDEFINED_EPOCH_OFFSET),       # no entry above it
        (3, (3, 20)),                      # floor 3, the next epoch starts at 20
        (4, (3, 20)),                      # floor 3 (epoch 4 never appended here)
        (2, (1, 10)),
        (0, (0, 0)),                       # no floor: the requested epoch, the next start
        (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET),
    ]
    for epoch, answer in table:
        assert cache.end_offset_for(epoch, log_end) == answer, epoch
    (tmp_path / "empty").mkdir()
    assert LeaderEpochCache(str(tmp_path / "empty")).end_offset_for(0, 5) == UNDEFINED_EPOCH_OFFSET


def test_truncate_from_end_drops_epochs_that_began_at_or_after_the_end(tmp_path):
    # LeaderEpochFileCache.truncateFromEnd
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    cache.truncate_from_end(100)
    assert cache.entries() == [(1, 0), (3, 10), (5, 20)]
    cache.truncate_from_end(15)
    assert cache.entries() == [(1, 0), (3, 10)]
    cache.truncate_from_end(10)
    assert cache.entries() == [(1, 0)]
    assert checkpoint(tmp_path)["entries"] == [[1, 0]]


def test_truncate_from_start_keeps_the_epoch_of_the_first_records(tmp_path):
    # LeaderEpochFileCache.truncateFromStart: the last entry at or before the new
    # start stays, moved up to it.
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    cache.truncate_from_start(0)
    assert cache.entries() == [(1, 0), (3, 10), (5, 20)]
    cache.truncate_from_start(12)
    assert cache.entries() == [(3, 12), (5, 20)]
    cache.truncate_from_start(20)
    assert cache.entries() == [(5, 20)]
    cache.truncate_from_start(25)
    assert cache.entries() == [(5, 25)]
    assert checkpoint(tmp_path)["entries"] == [[5, 25]]


def test_clear_forgets_everything_and_writes_the_empty_file(tmp_path):
    # LeaderEpochFileCache.clearAndFlush
    cache = cache_with(tmp_path, (1, 0), (3, 10))
    cache.clear()
    assert cache.entries() == [] and cache.latest_epoch == UNDEFINED_EPOCH
    assert checkpoint(tmp_path) == {"version": 1, "entries": []}


def test_the_checkpoint_round_trips(tmp_path):
    cache_with(tmp_path, (0, 0), (2, 7), (9, 1000))
    assert checkpoint(tmp_path) == {"version": 1, "entries": [[0, 0], [2, 7], [9, 1000]]}
    reopened = LeaderEpochCache(str(tmp_path))
    assert not reopened.needs_rebuild
    assert reopened.entries() == [(0, 0), (2, 7), (9, 1000)]


def test_a_change_is_written_at_once_and_fsynced_by_the_flush(tmp_path, monkeypatch):
    # KAFKA-15046: becoming leader of thousands of partitions must not cost an fsync
    # each; the log's flush (before its recovery point moves) makes the file durable.
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(0, 0)
    cache.assign(3, 10)
    assert synced == []
    assert LeaderEpochCache(str(tmp_path)).entries() == [(0, 0), (3, 10)]   # written
    cache.flush()
    assert len(synced) == 1
    cache.flush()                                    # nothing new: no second fsync
    assert len(synced) == 1
    assert checkpoint(tmp_path) == {"version": 1, "entries": [[0, 0], [3, 10]]}


@pytest.mark.parametrize("body", [
    "not json", json.dumps({"version": 2, "entries": []}), json.dumps({"version": 1}),
    json.dumps({"version": 1, "entries": [[2, 5], [1, 9]]}),       # epochs go down
    json.dumps({"version": 1, "entries": [[1, 5], [2, 5]]}),       # starts do not rise
    json.dumps({"version": 1, "entries": [[1, True]]}),
    json.dumps({"version": 1, "entries": [[-1, 0]]}),
    json.dumps([1, 2]),
])
def test_a_bad_checkpoint_asks_for_a_rebuild(tmp_path, body):
    (tmp_path / CHECKPOINT_FILE).write_text(body)
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.needs_rebuild and cache.entries() == []
    cache.rebuild([])
    assert checkpoint(tmp_path) == {"version": 1, "entries": []}   # the bad file replaced


def test_a_failed_write_is_kept_and_written_by_the_next_flush(tmp_path):
    directory = tmp_path / "partition"
    directory.mkdir()
    cache = cache_with(directory, (0, 0))
    os.unlink(directory / CHECKPOINT_FILE)
    os.rmdir(directory)                       # the write fails (as a full disk would)
    cache.assign(1, 10)
    assert cache.entries() == [(0, 0), (1, 10)]
    directory.mkdir()
    cache.flush()
    assert checkpoint(directory)["entries"] == [[0, 0], [1, 10]]


def test_epoch_starts_walks_past_its_chunk_and_reports_changes(tmp_path):
    batches = []
    epochs = [0, 0, 1] + list(range(2, 2 * limits.LEADER_EPOCH_SCAN_CHUNK, 2)) + [1]
    for offset, epoch in enumerate(epochs):
        batch = values_batch(1, offset)
        header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)
        header["base_offset"], header["leader_epoch"] = offset, epoch   # neither under the CRC
        batches.append(batch)
    data = np.concatenate(batches)
    rises = epoch_starts(data, 0, data.size)
    assert rises == [(0, 0)] + [(epoch, offset) for offset, epoch in enumerate(epochs)
                                if 2 <= offset < len(epochs) - 1]
    changes = epoch_starts(data, 0, data.size, 0, increases_only=False)
    assert changes[-1] == (1, len(epochs) - 1) and changes[0] == (1, 2)
    assert len(changes) == len(epochs) - 2


# --- the log keeps it right -----------------------------------------------------------

def test_appends_assign_each_new_epoch_at_its_first_offset(open_log):
    partition_log = open_log(**SMALL)
    for epoch in (0, 0, 2, 2, 2, 5):
        partition_log.append(values_batch(10, epoch), leader_epoch=epoch)
    assert partition_log.epochs.entries() == [(0, 0), (2, 20), (5, 50)]
    # Written by the log's flush, before the recovery point passes those batches.
    assert not os.path.exists(os.path.join(partition_log.directory, CHECKPOINT_FILE))
    partition_log.flush()
    assert checkpoint(partition_log.directory)["entries"] == [[0, 0], [2, 20], [5, 50]]
    # A stale (lower) epoch stamped by a writer changes nothing.
    partition_log.append(values_batch(1, 9), leader_epoch=1)
    assert partition_log.epochs.entries() == [(0, 0), (2, 20), (5, 50)]


def test_epochs_appended_since_the_last_flush_are_learned_again_after_a_crash(open_log):
    partition_log = open_log(**SMALL)
    for epoch in (0, 2):
        partition_log.append(values_batch(10, epoch), leader_epoch=epoch)
    partition_log.flush()
    for epoch in (3, 7):             # not in the file when the process dies
        partition_log.append(values_batch(10, epoch), leader_epoch=epoch)
    assert checkpoint(partition_log.directory)["entries"] == [[0, 0], [2, 10]]
    abandon(partition_log)
    reopened = open_log(**SMALL)
    assert reopened.epochs.entries() == [(0, 0), (2, 10), (3, 20), (7, 30)]


def test_compiled_appends_through_the_appender_assign_the_row_epoch(tmp_path):
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(prefix + "-state", 4)
    try:
        appender = Appender(logs, table)
        logs.create_topic("t")
        row = appender.register_partition("t", 0)
        producer = Ring.create(prefix + "-ring", 1 << 20)
        appender.add_ring(Ring.attach(prefix + "-ring"))
        destination = appender.destination("t", 0)
        for epoch in (0, 4):
            appender.set_leader_epoch(row, epoch)
            for seed in range(3):
                assert producer.try_put(destination, values_batch(5, seed)) >= 0
            while appender.drain():
                pass
        assert logs.partition_log("t", 0).epochs.entries() == [(0, 0), (4, 15)]
        producer.close()
    finally:
        logs.close()
        for name in (prefix + "-state", bells_name(prefix + "-state"), prefix + "-ring"):
            shared_memory.unlink(name)


def leader_log(open_log, epochs=(0, 0, 1, 1, 3, 3, 3, 6), **overrides):
    partition_log = open_log(**{**SMALL, **overrides})
    for seed, epoch in enumerate(epochs):
        for _ in range(8):
            partition_log.append(values_batch(20, seed, size=40), leader_epoch=epoch)
    assert len(partition_log.segments) > 3
    return partition_log


def test_a_rebuild_from_the_batch_headers_equals_the_file(open_log, tmp_path):
    partition_log = leader_log(open_log)
    written = partition_log.epochs.entries()
    assert [epoch for epoch, _ in written] == [0, 1, 3, 6]
    partition_log.close()
    os.unlink(tmp_path / "partition" / CHECKPOINT_FILE)
    reopened = open_log()
    assert reopened.epochs.entries() == written
    assert checkpoint(reopened.directory)["entries"] == [list(entry) for entry in written]
    reopened.close()
    (tmp_path / "partition" / CHECKPOINT_FILE).write_text('{"version": 1, "entries": [[')
    assert open_log().epochs.entries() == written


def test_an_empty_partition_writes_no_checkpoint(open_log, tmp_path):
    open_log().close()
    assert not (tmp_path / "partition" / CHECKPOINT_FILE).exists()


def test_truncate_to_drops_the_epochs_that_began_at_or_after_the_cut(open_log):
    partition_log = leader_log(open_log)
    entries = partition_log.epochs.entries()            # [(0,0),(1,320),(3,640),(6,1120)]
    partition_log.truncate_to(entries[-1][1] + 1)        # inside the last epoch's first batch
    assert partition_log.epochs.entries() == entries[:-1]
    partition_log.truncate_to(entries[2][1] + 100)
    assert partition_log.epochs.entries() == entries[:3]
    partition_log.truncate_to(entries[2][1])
    assert partition_log.epochs.entries() == entries[:2]
    partition_log.truncate_to(partition_log.log_end_offset + 10)   # past the end: nothing
    assert partition_log.epochs.entries() == entries[:2]


def test_truncate_fully_and_start_at_clears_the_cache(open_log):
    partition_log = leader_log(open_log)
    partition_log.truncate_fully_and_start_at(5000)
    assert partition_log.epochs.entries() == []
    partition_log.append(values_batch(3, 0), leader_epoch=7)
    assert partition_log.epochs.entries() == [(7, 5000)]


def test_delete_records_and_retention_cut_the_cache_from_the_start(open_log):
    partition_log = leader_log(open_log)
    entries = partition_log.epochs.entries()
    partition_log.advance_log_start_offset(entries[1][1] + 5)
    assert partition_log.epochs.entries() == [(1, entries[1][1] + 5)] + entries[2:]
    partition_log.config = TopicConfig.from_overrides({**SMALL, "retention.bytes": 1})
    deleted = partition_log.delete_old_segments(high_watermark=partition_log.log_end_offset)
    assert deleted
    start = partition_log.log_start_offset
    expected = [(epoch, begin) for epoch, begin in entries if begin > start]
    floor = [epoch for epoch, begin in entries if begin <= start][-1]
    assert partition_log.epochs.entries() == [(floor, start)] + expected


def test_an_open_cuts_the_cache_to_the_recovered_log(open_log, tmp_path):
    partition_log = leader_log(open_log)
    entries = partition_log.epochs.entries()
    end = partition_log.log_end_offset
    partition_log.close()
    # An entry past the log end (a leader that never appended, or a tail lost).
    (tmp_path / "partition" / CHECKPOINT_FILE).write_text(json.dumps(
        {"version": 1, "entries": [list(entry) for entry in entries] + [[9, end + 50]]}))
    assert open_log().epochs.entries() == entries


def test_recovery_learns_the_epochs_a_crash_kept_out_of_the_file(open_log, tmp_path):
    partition_log = open_log(**SMALL)
    partition_log.append(values_batch(10, 0), leader_epoch=0)
    partition_log.flush()
    partition_log.append(values_batch(10, 1), leader_epoch=2)
    partition_log.append(values_batch(10, 2), leader_epoch=3)
    assert partition_log.epochs.entries() == [(0, 0), (2, 10), (3, 20)]
    abandon(partition_log)          # the crash: the file kept only what a flush saw
    (tmp_path / "partition" / CHECKPOINT_FILE).write_text('{"version": 1, "entries": [[0, 0]]}')
    reopened = open_log(**SMALL)
    assert reopened.log_end_offset == 30
    assert reopened.epochs.entries() == [(0, 0), (2, 10), (3, 20)]
