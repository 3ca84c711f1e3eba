"""Damaged files, hostile batches and awkward histories against the log on disk:
each ends in a recovery or a named error, never a crash, a hang, silent loss of
flushed data, or an untyped exception.

Method: real partition directories; damage is done to the files between opens
(bit flips, rewritten fields that the CRC does not cover, bad checkpoints, stray
names), batches are forged with the encoder and patched, and histories that once
broke the log (a full time index reopened, a lowered index size) are replayed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from helpers import abandon, all_records, flip_bits
from shmlog.common.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    LocalProtocolError,
    RecordTooLargeError,
)
from shmlog.record import batch_layout as B
from shmlog.record.records import BatchStatus, encode_batch
from shmlog.storage.segment_state import (
    INDEXED_TIMESTAMP_WORD,
    MAX_TIMESTAMP_WORD,
    TIME_CAPACITY_WORD,
    TIME_ENTRIES_WORD,
)


def test_reopening_a_segment_with_a_full_time_index_and_rolling_it(open_log):
    # Batches smaller than the index interval: the one after the last indexed one is
    # not indexed, so sealing needs the closing entry, which takes the spare slot.
    config = {"segment.index.bytes": 480, "index.interval.bytes": 150}
    partition_log = open_log(**config)
    stamp = 1_000
    state = partition_log.active.state
    while not (state[TIME_ENTRIES_WORD] == state[TIME_CAPACITY_WORD] - 1
               and state[MAX_TIMESTAMP_WORD] > state[INDEXED_TIMESTAMP_WORD]):
        stamp += 1
        partition_log.append(encode_batch([b"x"], timestamp_ms=stamp))
    assert len(partition_log.segments) == 1
    count = partition_log.log_end_offset
    partition_log.close()
    reopened = open_log(**config)
    state = reopened.active.state
    assert state[TIME_ENTRIES_WORD] == state[TIME_CAPACITY_WORD], \
        "the closing entry took the last slot"
    reopened.append(encode_batch([b"y"], timestamp_ms=stamp + 10))
    reopened.roll()
    assert [r.offset for r in all_records(reopened)] == list(range(count + 1))


def test_truncation_after_segment_index_bytes_was_lowered(open_log):
    partition_log = open_log(**{"index.interval.bytes": 0})
    for number in range(300):
        partition_log.append(encode_batch([b"v"], timestamp_ms=1000 + number))
    partition_log.close()
    reopened = open_log(**{"index.interval.bytes": 0, "segment.index.bytes": 512})
    assert reopened.truncate_to(250) == 250
    assert [r.offset for r in all_records(reopened)] == list(range(250))


def lengths_of(batches):
    return np.cumsum([0] + [batch.size for batch in batches])


def closed_log_with(open_log, batches, **config):
    partition_log = open_log(**config)
    for batch in batches:
        partition_log.append(batch)
    partition_log.roll()
    partition_log.append(encode_batch([b"after"], timestamp_ms=10**13))
    path = partition_log.segments[0].log_path
    partition_log.close()                        # flushed: below the recovery point
    return path


def test_a_lost_length_in_a_flushed_segment_is_reported_not_hung_on(open_log):
    batches = [encode_batch([b"v%d" % n], timestamp_ms=1000 + n) for n in range(10)]
    path = closed_log_with(open_log, batches)
    position = int(lengths_of(batches)[5])
    with open(path, "r+b") as target:
        target.seek(position)
        target.write(bytes(4))                   # batch 5's length: zero
    reopened = open_log()
    with pytest.raises(CorruptSegmentError):
        reopened.offset_for_timestamp(1007)
    with pytest.raises(CorruptSegmentError):
        reopened.read(5)


def test_damage_in_a_flushed_segment_keeps_every_byte_and_reports_it(open_log):
    batches = [encode_batch([b"v%02d" % n], timestamp_ms=10**13 + n) for n in range(20)]
    path = closed_log_with(open_log, batches)
    size = os.path.getsize(path)
    flip_bits(path, int(lengths_of(batches)[10]) + 1, 0x01)     # batch 10's length
    reopened = open_log()
    report = reopened.recovery_report
    assert report.corrupt_segments and report.corrupt_segments[0][0] == path
    assert os.path.getsize(path) == size, "flushed bytes are never cut"
    first = reopened.read(0, max_bytes=1 << 20)
    assert first.next_offset == 10, "the good batches before the damage are served"
    with pytest.raises(CorruptSegmentError):
        reopened.read(10)
    assert [r.value for r in all_records(reopened, 20)] == [b"after"]


def test_recompressing_past_the_size_limit_is_rejected_whole(open_log):
    partition_log = open_log(**{"compression.type": "uncompressed", "segment.bytes": 1 << 20})
    good = encode_batch([b"ok"])
    bomb = encode_batch([bytes(4 << 20)], compression="zstd")
    with pytest.raises(RecordTooLargeError, match="compression.type=uncompressed"):
        partition_log.append(np.concatenate([good, bomb]))
    assert partition_log.log_end_offset == 0


@pytest.mark.parametrize("field, value", [("record_count", 0), ("last_offset_delta", 2**31 - 1)])
def test_producer_batches_must_have_dense_offsets(open_log, field, value):
    partition_log = open_log()
    batch = encode_batch([b"x"]).copy()
    header = batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)
    header[field] = value
    from reference import with_crc
    batch = np.frombuffer(with_crc(batch.tobytes()), np.uint8)
    with pytest.raises(CorruptRecordError):
        partition_log.append(batch)
    assert partition_log.log_end_offset == 0


def test_truncating_over_damage_changes_nothing(open_log, tmp_path):
    partition_log = open_log()
    batches = [encode_batch([b"v%d" % n]) for n in range(10)]
    for batch in batches:
        partition_log.append(batch)
    path = partition_log.active.log_path
    partition_log.close()
    flip_bits(path, int(lengths_of(batches)[3]) + B.HEADER_LENGTH + 2, 0x02)
    reopened = open_log()
    with pytest.raises(CorruptSegmentError, match="nothing was truncated"):
        reopened.truncate_to(8)
    assert reopened.log_end_offset == 10


def test_a_base_offset_that_would_wrap_cuts_the_log_there(open_log, tmp_path):
    partition_log = open_log()
    partition_log.append(encode_batch([b"a"]))
    path = partition_log.active.log_path
    abandon(partition_log)
    with open(path, "r+b") as target:
        target.seek(B.BASE_OFFSET_OFFSET)
        target.write((2**63 - 1).to_bytes(8, "little"))
    reopened = open_log()
    assert reopened.recovery_report.truncated_reason == BatchStatus.BAD_OFFSET.name
    assert reopened.append(encode_batch([b"b"])).base_offset == 0


def test_a_wrapping_base_offset_in_a_cleanly_closed_segment_is_rebuilt(open_log, tmp_path):
    partition_log = open_log()
    batches = [encode_batch([b"v"], timestamp_ms=1) for _ in range(3)]
    for batch in batches:
        partition_log.append(batch)
    path = partition_log.active.log_path
    partition_log.close()
    with open(path, "r+b") as target:
        target.seek(int(lengths_of(batches)[2]) + B.BASE_OFFSET_OFFSET)
        target.write((2**63 - 1).to_bytes(8, "little"))
    reopened = open_log()
    assert reopened.log_end_offset == 2


def test_a_start_offset_past_the_recovered_end_restarts_the_log_there(open_log, tmp_path):
    partition_log = open_log()
    for number in range(10):
        partition_log.append(encode_batch([b"v%d" % number]))
    partition_log.advance_log_start_offset(5)     # checkpointed; the data is not flushed
    path = partition_log.active.log_path
    abandon(partition_log)
    size = os.path.getsize(path)
    os.truncate(path, 0)                          # a power loss takes the unflushed pages
    os.truncate(path, size)
    reopened = open_log()
    assert reopened.log_start_offset == reopened.log_end_offset == 5
    assert reopened.append(encode_batch([b"acked"])).base_offset == 5
    assert [r.value for r in all_records(reopened)] == [b"acked"]


def test_timestamp_lookup_goes_on_after_a_compressed_batch_without_a_match(open_log):
    partition_log = open_log()
    base = 10**13
    partition_log.append(encode_batch([b"a", b"b", b"c"],
                                      timestamps=[base + 50, base + 1, base + 2],
                                      compression="zstd"))
    partition_log.append(encode_batch([b"d"], timestamp_ms=base + 60))
    partition_log.advance_log_start_offset(1)
    assert partition_log.offset_for_timestamp(base + 10) == (3, base + 60)


@pytest.mark.parametrize("checkpoint", ["[1, 2]", "not json",
                                        json.dumps({"version": 1, "recovery_point": -5,
                                                    "log_start_offset": -5}),
                                        json.dumps({"version": 1, "recovery_point": 10**20,
                                                    "log_start_offset": 0})])
def test_bad_checkpoints_are_ignored(open_log, tmp_path, checkpoint):
    directory = tmp_path / "partition"
    directory.mkdir()
    (directory / "checkpoint.json").write_text(checkpoint)
    partition_log = open_log()
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (0, 0)


def test_a_file_name_past_the_offset_range_is_ignored(open_log, tmp_path):
    directory = tmp_path / "partition"
    directory.mkdir()
    (directory / "99999999999999999999.log").write_bytes(b"")
    assert open_log().log_end_offset == 0


def test_records_without_timestamps_age_by_the_file(open_log):
    partition_log = open_log()
    partition_log.append(encode_batch([b"no time"], timestamp_ms=-1))
    assert partition_log.delete_old_segments() == []
    assert partition_log.log_end_offset == 1


def test_a_non_contiguous_value_is_a_local_protocol_error():
    with pytest.raises(LocalProtocolError, match="contiguous"):
        encode_batch([np.arange(10, dtype=np.uint8)[::2]])
