"""The partition log on disk: append, read, index lookups, roll, recovery, retention,
truncation and bad input.

Method: real files in a temporary directory, small segment and index sizes so that
rolls and index entries happen often; lookups are checked against brute-force scans
of everything that was written; crashes are simulated by abandoning a log without
closing it (what the page cache holds after kill -9) and by cutting or flipping
bytes of its files before reopening. A full disk is a small tmpfs filled by a
ballast file (the tests skip where mounting one is not permitted).
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from helpers import abandon, all_records, fill_disk, flip_bits, small_tmpfs, values_batch
from shmlog.common import limits
from shmlog.common.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ResourceLimitError,
    StorageError,
)
from shmlog.record import batch_layout as B
from shmlog.record.records import decode_records, encode_batch, iter_batches
from shmlog.segments import LogChange
from shmlog.storage import mapped_file

SMALL = {"segment.bytes": 16 << 10, "index.interval.bytes": 256, "segment.index.bytes": 4096}


def log_files(directory, suffix):
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(suffix))


def fill(partition_log, batches, count=10, **options):
    expected = []
    for seed in range(batches):
        batch = values_batch(count, seed, **options)
        result = partition_log.append(batch)
        records = decode_records(batch)
        expected += [(result.base_offset + r.offset, r.key, r.value) for r in records]
    return expected


def triples(records):
    return [(r.offset, r.key, r.value) for r in records]


# --- append and read ---------------------------------------------------------------

def test_offsets_are_dense_and_read_returns_what_was_appended(open_log):
    partition_log = open_log(**SMALL)
    expected = fill(partition_log, 40)
    assert partition_log.log_end_offset == 400
    assert [offset for offset, _, _ in expected] == list(range(400))
    assert triples(all_records(partition_log)) == expected
    assert len(partition_log.segments) > 1, "small segment.bytes should have rolled"


def test_read_returns_zero_copy_views_of_the_segment(open_log):
    partition_log = open_log()
    partition_log.append(values_batch(5, 0))
    result = partition_log.read(0)
    assert np.shares_memory(result.data, partition_log.active.log)


def test_read_starts_at_the_batch_holding_the_offset_and_respects_the_budget(open_log):
    partition_log = open_log(**SMALL)
    fill(partition_log, 10, count=10)
    result = partition_log.read(25, max_bytes=1)
    batches = list(iter_batches(result.data))
    assert len(batches) == 1, "a tiny budget still returns one whole batch"
    assert batches[0].base_offset == 20 and result.next_offset == 30
    result = partition_log.read(25, max_bytes=10_000, max_offset=50)
    assert [b.base_offset for b in iter_batches(result.data)] == [20, 30, 40]


def test_multi_batch_append_assigns_consecutive_offsets(open_log):
    partition_log = open_log(**SMALL)
    joined = np.concatenate([values_batch(3, seed) for seed in range(5)])
    result = partition_log.append(joined)
    assert (result.base_offset, result.last_offset, result.batch_count) == (0, 14, 5)
    assert [r.offset for r in all_records(partition_log)] == list(range(15))


def test_log_append_time_replaces_producer_timestamps(open_log):
    partition_log = open_log(**{"message.timestamp.type": "LogAppendTime"})
    result = partition_log.append(values_batch(3, 0, timestamps=[1, 2, 3]))
    records = all_records(partition_log)
    assert result.log_append_time > 1_600_000_000_000
    assert {r.timestamp for r in records} == {result.log_append_time}
    assert {r.timestamp_type for r in records} == {B.TIMESTAMP_LOG_APPEND_TIME}
    assert list(iter_batches(partition_log.read(0).data))  # the CRC was recomputed


# --- index lookups -----------------------------------------------------------------

def batch_positions(partition_log):
    """Brute force: (segment, position, base, last) of every batch in the log."""
    found = []
    for segment in partition_log.segments:
        for info in iter_batches(segment.log[:segment.size]):
            found.append((segment, info.position, info.base_offset, info.last_offset))
    return found


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_offset_lookup_matches_a_brute_force_scan(open_log, compression):
    partition_log = open_log(**SMALL)
    rng = random.Random(7)
    for seed in range(60):
        partition_log.append(values_batch(rng.randint(1, 30), seed, compression=compression))
    for segment, position, base, last in batch_positions(partition_log):
        for offset in range(base, last + 1):
            assert segment.position_of(offset) == position
            assert partition_log.read(offset).data[:8].tobytes() == \
                segment.log[position:position + 8].tobytes()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_timestamp_lookup_matches_a_brute_force_scan(open_log, compression):
    partition_log = open_log(**SMALL)
    rng = random.Random(11)
    for seed in range(50):
        count = rng.randint(1, 20)
        stamps = [rng.randint(1_000, 50_000) for _ in range(count)]   # out of order on purpose
        partition_log.append(values_batch(count, seed, timestamps=stamps, compression=compression))
    records = all_records(partition_log)
    for target in list(range(900, 50_200, 97)) + [r.timestamp for r in records[::13]]:
        expected = next(((r.offset, r.timestamp) for r in records if r.timestamp >= target), None)
        assert partition_log.offset_for_timestamp(target) == expected, target


def test_time_index_lookup_respects_the_log_start_offset(open_log):
    partition_log = open_log(**SMALL)
    partition_log.append(values_batch(10, 0, timestamps=list(range(100, 110))))
    partition_log.advance_log_start_offset(4)
    assert partition_log.offset_for_timestamp(0) == (4, 104)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(3)


# --- rolling -----------------------------------------------------------------------

def test_roll_by_size_trims_closed_segments_and_keeps_them_under_the_limit(open_log):
    partition_log = open_log(**SMALL)
    fill(partition_log, 50)
    segments = partition_log.segments
    for before, after in zip(segments, segments[1:]):
        assert after.base_offset == before.next_offset
        assert os.path.getsize(before.log_path) == before.size <= SMALL["segment.bytes"]


def test_roll_by_time_uses_the_first_batch_timestamp(open_log):
    partition_log = open_log(**{"segment.ms": 1000})
    for index, stamp in enumerate([10_000, 10_500, 11_000, 11_001, 12_500]):
        partition_log.append(values_batch(2, index, timestamps=[stamp, stamp]))
    # 11_001 - 10_000 > 1000 rolls; 12_500 - 11_001 > 1000 rolls again.
    assert [s.base_offset for s in partition_log.segments] == [0, 6, 8]


def test_roll_when_the_index_is_full(open_log):
    partition_log = open_log(**{"index.interval.bytes": 0, "segment.index.bytes": 48})
    fill(partition_log, 12, count=1)
    segments = partition_log.segments
    assert len(segments) > 2
    assert all(segment.offset_entries().size <= 48 // 8 for segment in segments)


# --- recovery ----------------------------------------------------------------------

def test_clean_close_and_reopen_scans_nothing(open_log, tmp_path):
    partition_log = open_log(**SMALL)
    expected = fill(partition_log, 30)
    partition_log.close()
    reopened = open_log(**SMALL)
    assert reopened.recovery_report.clean and reopened.recovery_report.segments_scanned == 0
    assert triples(all_records(reopened)) == expected
    assert reopened.append(values_batch(2, 99)).base_offset == 300


def test_crash_without_flush_keeps_everything_written(open_log):
    partition_log = open_log(**SMALL)
    expected = fill(partition_log, 30)
    abandon(partition_log)
    reopened = open_log(**SMALL)
    assert reopened.recovery_report.truncated_bytes == 0
    assert triples(all_records(reopened)) == expected
    assert reopened.append(values_batch(1, 77)).base_offset == len(expected)


def test_recovering_a_crashed_active_segment_reserves_index_for_what_was_written(
        open_log, tmp_path):
    """The active segment's file is sparse to its full capacity: recovery scans and
    reserves index slots up to the file's first hole (what was written), not up to
    the capacity (megabytes of zero-filled index per partition, thousands of them
    after a broker's kill -9)."""
    directory = tmp_path / "partition"
    for batches in (0, 3):
        partition_log = open_log(directory)
        expected = fill(partition_log, batches) if batches else []
        abandon(partition_log)
        reopened = open_log(directory)
        assert reopened.recovery_report.truncated_bytes == 0
        assert triples(all_records(reopened)) == expected
        for suffix in (".index", ".timeindex"):
            for path in log_files(directory, suffix):
                capacity = os.stat(path).st_size
                allocated = os.stat(path).st_blocks * 512
                assert allocated <= 16 * 4096 < capacity, (path, allocated, capacity)
        assert reopened.append(values_batch(1, 7)).base_offset == len(expected)
        reopened.close()
        for path in log_files(directory, ""):
            os.remove(path)


def test_torn_last_batch_at_every_byte_is_cut_exactly(open_log, tmp_path):
    """Cut the active segment at every byte inside its last batch: reopening gives
    exactly the batches before it, and the log accepts appends again."""
    partition_log = open_log(tmp_path / "source", **SMALL)
    fill(partition_log, 3, count=4)
    last_base = partition_log.log_end_offset - 4
    partition_log.close()
    path = log_files(tmp_path / "source", ".log")[-1]
    with open(path, "rb") as source:
        original = source.read()
    infos = list(iter_batches(np.frombuffer(original, np.uint8)))
    last_start = infos[-1].position
    for cut in range(last_start, len(original)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        for name in os.listdir(tmp_path / "source"):
            if name.endswith(".log"):
                data = original[:cut] if os.path.join(tmp_path / "source", name) == path else None
                with open(directory / name, "wb") as target:
                    target.write(data if data is not None else
                                 open(tmp_path / "source" / name, "rb").read())
        reopened = open_log(directory, **SMALL)
        assert reopened.log_end_offset == last_base, cut
        expected = last_start if cut > last_start else -1
        assert reopened.recovery_report.truncated_position == expected
        assert [r.offset for r in all_records(reopened)] == list(range(last_base))
        assert reopened.append(values_batch(1, 5)).base_offset == last_base
        reopened.close()


def test_torn_tail_after_a_crash_is_cut_and_zeroed(open_log, tmp_path):
    partition_log = open_log(**SMALL)
    fill(partition_log, 5)
    active = partition_log.active
    end = active.size
    # A batch half-written when the process died: a header and some records.
    torn = values_batch(10, 50)
    active.log[end:end + 100] = torn[:100]
    abandon(partition_log)
    reopened = open_log(**SMALL)
    report = reopened.recovery_report
    assert (report.truncated_position, report.truncated_bytes) == (end, 100)
    # The file runs on (sparse zeros) past the torn bytes, so the batch's claimed
    # length fits and its CRC over the zeros is what fails.
    assert report.truncated_reason == "BAD_CRC"
    assert reopened.log_end_offset == 50
    assert not np.any(reopened.active.log[end:end + 4096]), "the torn bytes were zeroed"


def test_a_bit_flip_above_the_recovery_point_cuts_the_log_there(open_log, tmp_path):
    partition_log = open_log(**SMALL)
    fill(partition_log, 40)
    segments = partition_log.segments
    victim = segments[1]
    infos = list(iter_batches(victim.log[:victim.size]))
    position = infos[2].position + 70
    abandon(partition_log)
    assert not os.path.exists(tmp_path / "partition" / "checkpoint.json"), "never flushed"
    flip_bits(victim.log_path, position, 0x10)
    reopened = open_log(**SMALL)
    report = reopened.recovery_report
    assert report.truncated_reason == "BAD_CRC"
    assert report.truncated_position == infos[2].position
    assert len(report.deleted_segments) == len(segments) - 2
    assert reopened.log_end_offset == infos[2].base_offset
    assert [r.offset for r in all_records(reopened)] == list(range(infos[2].base_offset))


def test_a_bit_flip_in_a_flushed_segment_is_an_error_on_read(open_log, tmp_path):
    partition_log = open_log(**SMALL)
    fill(partition_log, 40)
    victim = partition_log.segments[0]
    infos = list(iter_batches(victim.log[:victim.size]))
    partition_log.close()                       # flushed: below the recovery point
    flip_at = infos[3].position + B.HEADER_LENGTH + 5
    flip_bits(victim.log_path, flip_at, 0x01)
    reopened = open_log(**SMALL)
    assert reopened.recovery_report.clean, "flushed data is not rescanned on open"
    assert triples(all_records(reopened, infos[4].base_offset))   # later data still serves
    with pytest.raises(CorruptSegmentError) as raised:
        reopened.read(infos[3].base_offset)
    assert raised.value.path == victim.log_path and raised.value.position == infos[3].position
    assert "BAD_CRC" in str(raised.value)


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_missing_or_corrupt_indexes_are_rebuilt_equal(open_log, tmp_path, damage):
    partition_log = open_log(**SMALL)
    fill(partition_log, 40, timestamps=None)
    partition_log.close()
    directory = tmp_path / "partition"
    indexes = log_files(directory, ".index") + log_files(directory, ".timeindex")
    originals = {path: open(path, "rb").read() for path in indexes}
    assert any(originals.values())
    for path in indexes:
        if damage == "delete":
            os.unlink(path)
        else:
            with open(path, "wb") as target:
                target.write(os.urandom(len(originals[path]) + 3))
    reopened = open_log(**SMALL)
    assert len(reopened.recovery_report.rebuilt_indexes) == len(indexes) // 2 - 1
    reopened.close()
    for path in indexes:
        assert open(path, "rb").read() == originals[path], path


# --- retention and truncation --------------------------------------------------------

def test_retention_by_time_deletes_whole_expired_segments(open_log):
    partition_log = open_log(**SMALL, **{"retention.ms": 10_000})
    for seed in range(40):
        stamp = 1_000 * seed
        partition_log.append(values_batch(10, seed, timestamps=[stamp] * 10))
    segments = partition_log.segments
    now = 30_000 + 10_000 + 1          # everything with max timestamp < 30_001 is expired
    deleted = partition_log.delete_old_segments(now=now)
    expired = [s.base_offset for s in segments if s.max_timestamp < now - 10_000]
    assert deleted == expired[:len(deleted)] and deleted
    assert partition_log.log_start_offset == partition_log.segments[0].base_offset
    assert all(not os.path.exists(s.log_path) for s in segments if s.base_offset in deleted)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(0)


def test_retention_rolls_and_deletes_an_expired_active_segment(open_log):
    partition_log = open_log(**{"retention.ms": 1000})
    partition_log.append(values_batch(5, 0, timestamps=[100] * 5))
    assert partition_log.delete_old_segments(now=10_000) == [0]
    assert partition_log.log_start_offset == partition_log.log_end_offset == 5
    assert partition_log.append(values_batch(1, 1)).base_offset == 5


def test_retention_by_size_keeps_the_newest_bytes(open_log):
    partition_log = open_log(**SMALL, **{"retention.bytes": 40_000})
    fill(partition_log, 100)
    before = partition_log.size
    partition_log.delete_old_segments()
    assert partition_log.size <= 40_000 + SMALL["segment.bytes"] < before
    assert partition_log.size - partition_log.segments[0].size < 40_000


def test_retention_never_deletes_above_the_high_watermark(open_log):
    partition_log = open_log(**SMALL, **{"retention.ms": 0})
    fill(partition_log, 30)
    high_watermark = partition_log.segments[1].base_offset
    deleted = partition_log.delete_old_segments(now=10**15, high_watermark=high_watermark)
    assert deleted == [0]


@pytest.mark.parametrize("target", [0, 5, 10, 137, 200, 399])
def test_truncate_to_drops_everything_at_and_above_the_offset(open_log, target):
    partition_log = open_log(**SMALL)
    fill(partition_log, 40)              # batches of 10: 10, 200 are boundaries
    end = partition_log.truncate_to(target)
    assert end == target - target % 10
    assert [r.offset for r in all_records(partition_log)] == list(range(end))
    assert partition_log.append(values_batch(3, 99)).base_offset == end
    partition_log.close()
    reopened = open_log(**SMALL)
    assert reopened.log_end_offset == end + 3
    assert [r.offset for r in all_records(reopened)] == list(range(end + 3))


def test_the_segment_generation_is_even_when_stable_and_odd_while_files_go(open_log):
    """The generation is a seqlock for readers: every change moves it, stays even
    when done, and a change that deletes files publishes an odd value before the
    first deletion (the hook sees which files are still there) and an even one after
    the last. A retention check that deletes nothing publishes nothing."""
    partition_log = open_log(**SMALL, **{"retention.ms": 10_000})
    published = []

    def publish(change):
        if change is LogChange.SEGMENT_FILES_CHANGING:
            files = set(os.listdir(partition_log.directory))
            published.append((partition_log.generation, files))

    partition_log.set_listener(publish)
    for seed in range(40):
        partition_log.append(values_batch(40, seed, timestamps=[1_000 * seed] * 40))
    assert len(partition_log.segments) > 3 and partition_log.generation % 2 == 0
    assert not published, "rolls publish nothing themselves (the appender refreshes after)"
    before = partition_log.generation
    partition_log.roll()
    assert partition_log.generation == before + 2

    assert partition_log.delete_old_segments(now=0) == [] and not published
    first = partition_log.segments[0]
    deleted = partition_log.delete_old_segments(now=30_000 + 10_000 + 1)
    assert deleted and [generation % 2 for generation, _ in published] == [1, 0]
    assert os.path.basename(first.log_path) in published[0][1]
    assert os.path.basename(first.log_path) not in published[1][1]
    assert published[1][0] == partition_log.generation

    for change in (lambda: partition_log.truncate_to(partition_log.log_end_offset - 50),
                   lambda: partition_log.truncate_fully_and_start_at(1000)):
        published.clear()
        before = partition_log.generation
        change()
        assert [generation for generation, _ in published] == [before + 1, before + 2]
        assert partition_log.generation == before + 2


# --- bad input -------------------------------------------------------------------------

def test_oversized_batch_is_rejected_and_nothing_is_appended(open_log):
    partition_log = open_log(**{"max.message.bytes": 1000})
    partition_log.append(values_batch(2, 0))
    with pytest.raises(RecordTooLargeError, match="max.message.bytes=1000"):
        partition_log.append(encode_batch([b"x" * 2000]))
    with pytest.raises(RecordTooLargeError):         # all or nothing across batches
        partition_log.append(np.concatenate([values_batch(1, 1), encode_batch([b"y" * 5000])]))
    assert partition_log.log_end_offset == 2


@pytest.mark.parametrize("payload", [b"", b"\x00" * 64, os.urandom(300), b"not a batch at all"])
def test_garbage_is_rejected_with_a_typed_error(open_log, payload):
    partition_log = open_log()
    with pytest.raises(CorruptRecordError):
        partition_log.append(payload)
    assert partition_log.log_end_offset == 0


def test_a_corrupt_batch_after_good_ones_rejects_the_whole_append(open_log):
    partition_log = open_log()
    bad = values_batch(3, 1).copy()
    bad[B.HEADER_LENGTH + 2] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="BAD_CRC"):
        partition_log.append(np.concatenate([values_batch(3, 0), bad]))
    assert partition_log.log_end_offset == 0


@pytest.mark.parametrize("offset", [-1, 1, 10**6])
def test_offsets_outside_the_log_are_out_of_range(open_log, offset):
    partition_log = open_log()
    partition_log.append(values_batch(1, 0))
    with pytest.raises(OffsetOutOfRangeError) as raised:
        partition_log.read(offset + 1 if offset == 1 else offset)
    assert raised.value.log_end_offset == 1


def test_reading_at_the_log_end_returns_nothing(open_log):
    partition_log = open_log()
    partition_log.append(values_batch(4, 0))
    result = partition_log.read(4)
    assert result.data.size == 0 and result.next_offset == 4


# --- durability knobs ----------------------------------------------------------------

def test_flush_messages_advances_the_recovery_point(open_log, tmp_path):
    partition_log = open_log(**{"flush.messages": 5})
    partition_log.append(values_batch(3, 0))
    assert partition_log.recovery_point == 0
    partition_log.append(values_batch(3, 1))
    assert partition_log.recovery_point == 6
    abandon(partition_log)
    reopened = open_log(**{"flush.messages": 5})
    assert reopened.recovery_report.recovery_point == 6


def test_flush_ms_is_met_by_the_scheduler_even_when_idle(open_log):
    hour = 3_600_000
    partition_log = open_log(**{"flush.ms": hour})
    partition_log.append(values_batch(2, 0))
    assert not partition_log.maybe_flush(now=partition_log._last_flush_ms + 10)
    assert partition_log.maybe_flush(now=partition_log._last_flush_ms + hour)
    assert partition_log.recovery_point == 2
    assert not partition_log.maybe_flush(now=partition_log._last_flush_ms + 2 * hour), "nothing new"


def test_a_segment_larger_than_a_lowered_segment_bytes_still_opens_and_recovers(open_log):
    partition_log = open_log(**{"segment.bytes": 1 << 20})
    expected = fill(partition_log, 20)
    abandon(partition_log)                       # the active file is 1 MiB, sparse
    reopened = open_log(**{"segment.bytes": 8 << 10})
    assert reopened.active.size > 8 << 10
    assert triples(all_records(reopened)) == expected
    reopened.append(values_batch(10, 99))        # and it rolls at the new size
    assert [s.base_offset for s in reopened.segments] == [0, 200]


def test_a_cleanly_closed_last_segment_is_still_verified_on_first_read(open_log):
    partition_log = open_log(**SMALL)
    fill(partition_log, 3)
    path = partition_log.active.log_path
    partition_log.close()
    flip_bits(path, B.HEADER_LENGTH + 3, 0x08)
    reopened = open_log(**SMALL)
    with pytest.raises(CorruptSegmentError, match="BAD_CRC"):
        reopened.read(0)
    reopened.append(values_batch(2, 9))          # appending does not vouch for old bytes
    with pytest.raises(CorruptSegmentError):
        reopened.read(0)


def test_opening_a_partition_populates_nothing_until_it_is_appended_to(open_log, tmp_path):
    partition_log = open_log()
    active = partition_log.active
    paths = (active.log_path, active.offset_index_path, active.time_index_path)
    assert not any(os.path.exists(path) for path in paths), \
        "an idle partition holds no segment file (the first append makes them)"
    assert partition_log.read(0).data.size == 0 and partition_log.size == 0
    generation = partition_log.generation
    partition_log.append(values_batch(1, 0))
    assert all(os.path.exists(path) for path in paths)
    assert os.stat(active.log_path).st_blocks > 0
    # A reader that listed the directory before the files existed lists it again.
    assert partition_log.generation == generation + 2
    assert [r.value for r in all_records(partition_log)] == \
        [r.value for r in decode_records(values_batch(1, 0))]


def test_a_first_append_refused_its_files_leaves_the_partition_empty_and_pending(
        open_log, monkeypatch):
    from shmlog.native import mapping
    partition_log = open_log()
    active = partition_log.active
    generation = partition_log.generation

    def at_the_limit():
        raise ResourceLimitError("65530 mappings: vm.max_map_count reached",
                                 limit="vm.max_map_count")

    with monkeypatch.context() as patched:
        patched.setattr(mapping, "check_room", at_the_limit)
        with pytest.raises(ResourceLimitError, match="vm.max_map_count"):
            partition_log.append(values_batch(1, 0))
    assert active.pending and active.active and partition_log.log_end_offset == 0
    assert partition_log.generation == generation
    assert not os.path.exists(active.log_path), "no file of the refused segment is left"
    assert partition_log.append(values_batch(1, 0)).base_offset == 0, "the next one makes it"


def test_a_partition_never_appended_to_reopens_empty_and_appends(open_log):
    partition_log = open_log()
    partition_log.close()
    reopened = open_log()
    assert reopened.recovery_report.clean and reopened.log_end_offset == 0
    assert reopened.active.pending
    reopened.append(values_batch(3, 1))
    reopened.close()
    again = open_log()
    assert again.log_end_offset == 3 and not again.active.pending


@pytest.mark.parametrize("left", ["log only", "log with data, no index", "indexes only"])
def test_a_crash_while_a_segment_s_files_are_made_is_recovered(open_log, left):
    """The first append makes the log, then the two indexes: a crash (kill -9) can
    leave any prefix of them, and the next open takes what it finds."""
    first = open_log()
    if left == "log with data, no index":
        first.append(values_batch(3, 0))
    first.active.materialize()
    paths = (first.active.log_path, first.active.offset_index_path,
             first.active.time_index_path)
    abandon(first)
    removed = {"log only": paths[1:], "log with data, no index": paths[1:],
               "indexes only": paths[:1]}[left]
    for path in removed:
        os.unlink(path)
    reopened = open_log()
    expected = decode_records(values_batch(3, 0)) if left.startswith("log with") else []
    assert [r.value for r in all_records(reopened)] == [r.value for r in expected]
    reopened.append(values_batch(2, 1))
    assert reopened.log_end_offset == len(expected) + 2
    assert [r.value for r in all_records(reopened)][len(expected):] == \
        [r.value for r in decode_records(values_batch(2, 1))]


@pytest.mark.parametrize("topic_codec, producer_codec, stored", [
    ("producer", None, "NONE"), ("producer", "zstd", "ZSTD"),
    ("zstd", None, "ZSTD"), ("zstd", "zstd", "ZSTD"),
    ("uncompressed", "zstd", "NONE"), ("uncompressed", None, "NONE"),
])
def test_compression_type_decides_the_stored_codec(open_log, topic_codec, producer_codec,
                                                   stored):
    partition_log = open_log(**{"compression.type": topic_codec})
    batches = [values_batch(20, seed, compression=producer_codec) for seed in range(3)]
    expected = [r.value for batch in batches for r in decode_records(batch)]
    partition_log.append(np.concatenate(batches[:2]))
    partition_log.append(batches[2])
    data = partition_log.read(0, max_bytes=1 << 20).data
    assert {info.compression.name for info in iter_batches(data)} == {stored}
    assert [r.value for r in all_records(partition_log)] == expected


# --- a full disk -------------------------------------------------------------------
# Each test mounts a small tmpfs (skipped, saying why, where that is not permitted):
# there posix_fallocate really allocates pages, and a store into a page nobody
# allocated on a full tmpfs is a SIGBUS. Scenarios that would die of one if a store
# went past a reservation run in a child process (full_disk_child.py).

FULL_DISK_SEGMENT = {"segment.bytes": 256 << 10}
FULL_DISK_BATCH = 40                # records per batch of full_disk_child.py


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    with small_tmpfs(mount_point, 16 << 20):
        yield mount_point


def on_full_disk(scenario: str, disk, slack: int = 0, **overrides) -> dict:
    """Run a scenario of full_disk_child.py on ``disk``: what it printed."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.run(
        [sys.executable, os.path.join(tests, "unit", "full_disk_child.py"), scenario,
         str(disk), str(slack), json.dumps({**FULL_DISK_SEGMENT, **overrides})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ,
             "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])})
    assert child.returncode == 0, \
        f"the child died (status {child.returncode}): {child.stderr[-3000:]}"
    return json.loads(child.stdout)


def full_disk_values(batches: int, records: int = FULL_DISK_BATCH) -> list[bytes]:
    """The values the first ``batches`` batches of full_disk_child.py hold."""
    size = 100 if records == FULL_DISK_BATCH else 20
    return [r.value for seed in range(batches)
            for r in decode_records(values_batch(records, seed, size=size))]


@pytest.mark.parametrize("slack", [0, 5000, (256 << 10) + 100, (256 << 10) + 4096 + 100,
                                   600_000, 1_000_000])
def test_a_full_disk_refuses_the_append_before_any_store_past_a_reservation(small_disk,
                                                                             open_log, slack):
    outcome = on_full_disk("fill_until_refused", small_disk, slack)
    assert "disk full" in outcome["refusal"]
    for name, (stored, reserved, allocated) in outcome["files"].items():
        assert stored <= reserved <= allocated, name
    partition_log = open_log(small_disk / "partition", **FULL_DISK_SEGMENT)
    assert [r.value for r in all_records(partition_log)] == full_disk_values(outcome["batches"])
    assert partition_log.append(values_batch(1, 0)).base_offset == \
        outcome["batches"] * FULL_DISK_BATCH


def test_a_flush_that_finds_the_disk_full_does_not_fail_the_append(small_disk):
    outcome = on_full_disk("flush_on_full_disk", small_disk, **{"flush.messages": 1})
    assert outcome["offset"] == FULL_DISK_BATCH, "the append was acknowledged"
    assert outcome["recovery_point_full"] == FULL_DISK_BATCH, "the recovery point stayed"
    assert outcome["flushed"] and outcome["recovery_point"] == 2 * FULL_DISK_BATCH


def test_sealing_on_a_full_disk_writes_its_closing_entry_into_reserved_space(small_disk,
                                                                             open_log):
    outcome = on_full_disk("close_on_full_disk", small_disk)
    assert outcome["released"]
    partition_log = open_log(small_disk / "partition", **FULL_DISK_SEGMENT)
    assert partition_log.recovery_report.clean, "it was closed cleanly"
    assert [r.value for r in all_records(partition_log)] == \
        full_disk_values(outcome["batches"], records=1)


def test_closing_when_the_checkpoint_cannot_be_written_releases_the_log(open_log, tmp_path):
    partition_log = open_log()
    expected = fill(partition_log, 5)
    (tmp_path / "partition" / "checkpoint.json.tmp").mkdir()     # the write fails
    partition_log.close()
    assert not partition_log.segments, "the mappings are released all the same"
    (tmp_path / "partition" / "checkpoint.json.tmp").rmdir()
    assert triples(all_records(open_log())) == expected


def test_a_roll_on_a_full_disk_changes_nothing_and_the_next_append_rolls(small_disk,
                                                                         open_log):
    partition_log = open_log(small_disk / "partition", **FULL_DISK_SEGMENT)
    batch = values_batch(40, 0, size=100)
    while partition_log.active.size + batch.size <= FULL_DISK_SEGMENT["segment.bytes"]:
        partition_log.append(batch)
    before = (partition_log.log_end_offset, sorted(os.listdir(small_disk / "partition")))
    ballast = fill_disk(small_disk, 0)
    with pytest.raises(StorageError, match="disk full"):
        partition_log.append(batch)             # must roll: the new segment cannot be had
    assert len(partition_log.segments) == 1 and partition_log.active.active, \
        "the active segment stays the active one"
    assert (partition_log.log_end_offset, sorted(os.listdir(small_disk / "partition"))) == \
        before, "a refused roll leaves no file and no record"
    os.unlink(ballast)
    assert partition_log.append(batch).base_offset == before[0]
    assert len(partition_log.segments) == 2
    assert len(all_records(partition_log)) == before[0] + 40


def test_a_failing_background_reservation_is_reported_once_not_per_append(small_disk,
                                                                          open_log, caplog):
    # The first append reserves its batch and the distance kept ahead; then the disk
    # fills, so every background reservation past that fails, while appends still fit
    # in what the first one reserved.
    partition_log = open_log(small_disk / "partition")
    partition_log.append(values_batch(1, 0, size=1024))
    fill_disk(small_disk, 0)
    # Past half the distance (the prefaulter is asked), within all of it.
    count = limits.SEGMENT_RESERVE_AHEAD_MIN * 3 // 4 // 1024
    for seed in range(1, count):
        partition_log.append(values_batch(1, seed, size=1024))   # in the reserved room
        mapped_file._prefaulter.submit(lambda: None).result(timeout=60)   # its job is done
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(complaints) == 1 and "disk full" in complaints[0], complaints
    assert partition_log.log_end_offset == count


def test_a_reservation_writes_zeros_only_past_what_is_stored(tmp_path):
    # A file whose data ends mid-page: reserving from the page it ends in, with the
    # data's end as where nothing is stored, keeps every stored byte and makes the
    # whole pages past it read as zeros, in the mapping and in the file.
    page = mapped_file.PAGE_SIZE
    path = str(tmp_path / "log")
    stored = page + 1000
    capacity = 8 * page
    data = np.frombuffer(random.Random(7).randbytes(stored), np.uint8)
    written = mapped_file.MappedFile(path, capacity)
    written.bytes[:stored] = data
    written.bytes[stored:3 * page] = 0xEE                 # no data: bytes past its end
    written.reserve(page, capacity, fresh_from=stored)
    assert np.array_equal(written.bytes[:stored], data)
    assert not written.bytes[2 * page:].any(), "whole pages past the data are zeros"
    assert (written.bytes[stored:2 * page] == 0xEE).all(), \
        "the page the data ends in is only populated"
    written.close()
    with open(path, "rb") as stored_file:
        on_disk = stored_file.read()
    assert len(on_disk) == capacity and on_disk[:stored] == data.tobytes()


def test_a_new_file_reserved_before_it_is_mapped_reads_as_zeros(tmp_path):
    reserved = 5 * mapped_file.PAGE_SIZE + 100          # not whole pages: the rest faults
    made = mapped_file.MappedFile(str(tmp_path / "log"), 1 << 20, reserved=reserved)
    assert made.bytes.size == 1 << 20 and not made.bytes.any()
    made.bytes[:reserved] = 1
    made.close()
    assert os.path.getsize(tmp_path / "log") == 1 << 20
