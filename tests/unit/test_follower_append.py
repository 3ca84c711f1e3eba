"""A follower's append (Kafka's ``Log.appendAsFollower``) and the appender's seams
for it: the leader's batches are kept as they are, offsets, epochs and timestamps
included, and what a follower refuses leaves its log untouched.

Goal: a follower's log is byte for byte its leader's (a compaction gap, leader
epochs and LogAppendTime stamps kept), whatever the chunks it is fetched in and
across segment rolls; a first base below the log end and offsets out of order
are refused with nothing appended, as is what ``append`` refuses; the epoch cache
learns the leader's epochs; ``Appender.append_replicated`` publishes the log end
but not the high watermark and remembers producers, so a client's re-send of any
of its last five batches once the follower leads is a duplicate;
``Appender.rebuild_producer_state`` forgets what a truncation removed.

Method: real partition logs on disk (a leader's, written through ``append`` and
compacted by the real cleaner, and a follower's), compared through ``read``; a
real appender with a real state table in /dev/shm for the seams.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from helpers import values_batch
from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode, HighWatermarkPolicy
from shmlog.common.errors import (
    CorruptRecordError,
    LocalProtocolError,
    OffsetsOutOfOrderError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from shmlog.record import batch_layout as B
from shmlog.record.records import encode_batch, iter_batches, now_ms
from shmlog.segments import PartitionLog, warm_follower_kernels
from shmlog.shm.state import PartitionStateTable, unlink_table
from shmlog.storage import cleaner
from shmlog.storage import index_layout as I
from shmlog.storage.topic_config import TopicConfig

SMALL = {"segment.bytes": 16 << 10, "index.interval.bytes": 256, "segment.index.bytes": 4096}
NOW = 1_700_000_000_000


def log_bytes(partition_log, start=None) -> list[bytes]:
    """Every batch of the log from ``start`` (default: its log start), one bytes each."""
    offset = partition_log.log_start_offset if start is None else start
    batches = []
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, max_bytes=1 << 12)
        if not result.data.size:
            break
        batches += [bytes(result.data[info.position:info.position + info.batch_length])
                     for info in iter_batches(result.data)]
        offset = result.next_offset
    return batches


def fetch_chunks(partition_log, max_bytes: int):
    """The leader's log as a fetcher would get it: reads of ``max_bytes`` from the
    log start to the end, each a copy (as a frame off the wire is)."""
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, max_bytes=max_bytes)
        if not result.data.size:
            return
        yield result.data.copy()
        offset = result.next_offset


@pytest.fixture
def compacted_leader(tmp_path):
    """A LogAppendTime, compacted leader log with several epochs: keys repeat, so
    the cleaner leaves gaps inside batches and whole batches out."""
    config = TopicConfig.from_overrides({**SMALL, "cleanup.policy": "compact",
                                         "message.timestamp.type": "LogAppendTime",
                                         "min.cleanable.dirty.ratio": 0.01})
    leader = PartitionLog(str(tmp_path / "leader"), config)
    for seed in range(60):
        keys = [(f"kept-{seed}-{index}" if seed % 4 == 0 else f"key-{(seed * 5 + index) % 23}")
                .encode() for index in range(5)]
        leader.append(encode_batch([b"value-%d-%d" % (seed, index) for index in range(5)],
                                   keys=keys, timestamps=[NOW + seed] * 5),
                      leader_epoch=seed // 20 * 3)
    leader.roll()
    later = now_ms() + 10_000           # past the LogAppendTime stamps
    planned = cleaner.plan(leader, later)
    assert leader.replace_segments(cleaner.clean(planned, later, 1 << 20))
    yield leader
    leader.close()


def test_the_follower_keeps_the_leaders_bytes(compacted_leader, tmp_path):
    leader = compacted_leader
    infos = [info for chunk in fetch_chunks(leader, 1 << 20) for info in iter_batches(chunk)]
    assert any(info.last_offset_delta + 1 > info.record_count for info in infos), "no gap inside"
    assert any(after.base_offset > before.last_offset + 1
               for before, after in zip(infos, infos[1:])), "no gap between batches"
    assert all(info.timestamp_type == 1 for info in infos)          # LogAppendTime stamps
    tiny = TopicConfig.from_overrides({**SMALL, "segment.bytes": 1024})   # rolls often
    follower = PartitionLog(str(tmp_path / "follower"), tiny)
    for chunk in fetch_chunks(leader, 3000):                       # several batches a call
        result = follower.append_as_follower(chunk)
        first = next(iter_batches(chunk))
        assert result.base_offset == first.base_offset and result.log_append_time == -1
    assert follower.log_end_offset == leader.log_end_offset
    assert log_bytes(follower) == log_bytes(leader)
    assert len(follower.segments) > 2                                  # it rolled on the way
    assert follower.epochs.entries() == leader.epochs.entries() == [(0, 0), (3, 100), (6, 200)]
    follower.close()
    reopened = PartitionLog(str(tmp_path / "follower"), tiny)
    assert log_bytes(reopened) == log_bytes(leader)
    assert reopened.recovery_report.clean
    reopened.close()


def test_the_follower_does_not_recompress_or_stamp(tmp_path):
    leader = PartitionLog(str(tmp_path / "leader"), TopicConfig.from_overrides(SMALL))
    leader.append(values_batch(10, 0, timestamps=[NOW] * 10), leader_epoch=2)
    # A follower whose topic says otherwise still keeps the leader's bytes.
    follower = PartitionLog(str(tmp_path / "follower"), TopicConfig.from_overrides(
        {**SMALL, "compression.type": "zstd", "message.timestamp.type": "LogAppendTime"}))
    follower.append_as_follower(next(fetch_chunks(leader, 1 << 20)))
    assert log_bytes(follower) == log_bytes(leader)
    follower.close()
    leader.close()


def with_base(batch: np.ndarray, base_offset: int) -> np.ndarray:
    """A copy of a batch with another base offset (not under the CRC)."""
    copy = batch.copy()
    copy[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)["base_offset"] = base_offset
    return copy


def files(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if not name.endswith(".json")}


def test_what_a_follower_refuses_leaves_the_log_untouched(open_log):
    follower = open_log(**SMALL)
    follower.append_as_follower(np.concatenate([with_base(values_batch(5, 0), 0),
                                                with_base(values_batch(5, 1), 7)]))
    assert follower.log_end_offset == 12
    before, end = files(follower.directory), follower.log_end_offset
    good = with_base(values_batch(5, 2), 12)
    bad_crc = with_base(values_batch(5, 3), 17)
    bad_crc[-1] ^= 0xFF
    cases = [
        (UnexpectedAppendOffsetError, with_base(values_batch(5, 2), 11)),   # below the log end
        (UnexpectedAppendOffsetError, with_base(values_batch(5, 2), 0)),
        (OffsetsOutOfOrderError, np.concatenate([good, with_base(values_batch(5, 3), 16)])),
        (OffsetsOutOfOrderError, np.concatenate([good, with_base(values_batch(5, 3), 12)])),
        (CorruptRecordError, np.concatenate([good, bad_crc])),
        (CorruptRecordError, np.concatenate([good, good[:-3]])),
        (CorruptRecordError, with_base(values_batch(5, 2), -5)),
        (CorruptRecordError, np.zeros(0, np.uint8)),
        (RecordTooLargeError, with_base(values_batch(2000, 4), 12)),
    ]
    for error, data in cases:
        with pytest.raises(error):
            follower.append_as_follower(data)
        assert follower.log_end_offset == end and files(follower.directory) == before, error
    assert issubclass(UnexpectedAppendOffsetError, CorruptRecordError)
    assert issubclass(OffsetsOutOfOrderError, CorruptRecordError)
    assert follower.append_as_follower(good).base_offset == 12


def test_a_gap_past_an_index_relative_offset_rolls_to_the_batch(open_log):
    follower = open_log(**SMALL)
    follower.append_as_follower(with_base(values_batch(5, 0), 0))
    far = I.RELATIVE_OFFSET_MAX + 100
    follower.append_as_follower(with_base(values_batch(5, 1), far))
    assert follower.active.base_offset == far and follower.log_end_offset == far + 5
    assert [info.base_offset for info in iter_batches(follower.read(far).data)] == [far]
    assert [info.base_offset for info in iter_batches(follower.read(3).data)] == [0]


# --- the appender's seams -------------------------------------------------------------

@pytest.fixture
def replica(tmp_path):
    """A log manager with topic "t", a state table and an appender hosting t-0 with
    an EXTERNAL high watermark (a follower's row); cleaned up."""
    name = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}-state"
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(name, 8)
    appender = Appender(logs, table)
    logs.create_topic("t", 1, SMALL)
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    yield logs, table, appender, row
    logs.close()
    unlink_table(name)


def producer_batch(sequence: int, seed: int, producer_id: int = 7, epoch: int = 0):
    return encode_batch([b"p%d-%d" % (seed, index) for index in range(4)],
                        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def leader_bytes(*batches, base=0, leader_epoch=3) -> np.ndarray:
    """Batches as a leader's log holds them: dense offsets from ``base``, stamped."""
    out = []
    for batch in batches:
        copy = with_base(batch, base)
        copy[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)["leader_epoch"] = leader_epoch
        out.append(copy)
        base += next(iter_batches(batch)).last_offset_delta + 1
    return np.concatenate(out)


def test_append_replicated_publishes_the_log_end_not_the_high_watermark(replica):
    logs, table, appender, row = replica
    appender.take_appended()
    assert appender.append_replicated(row, leader_bytes(producer_batch(0, 0),
                                                        producer_batch(4, 1))) == (0, 7)
    snapshot = table.snapshot(row)
    assert snapshot.log_end_offset == 8 and snapshot.high_watermark == 0
    assert appender.take_appended() == [(row, 8)]
    assert logs.partition_log("t", 0).epochs.entries() == [(3, 0)]
    assert appender.advance_high_watermark(row, 100) == 8


def test_a_clients_resends_of_the_last_five_replicated_batches_are_duplicates(replica):
    logs, table, appender, row = replica
    batches = [producer_batch(4 * index, index) for index in range(7)]      # at 0, 4, ... 24
    appender.append_replicated(row, leader_bytes(*batches[:3]))
    appender.append_replicated(row, leader_bytes(*batches[3:], base=12))
    # This replica leads now; the producer re-sends its last five batches (a Kafka
    # producer's five in flight): each is acknowledged with its own offset.
    appender.set_leader_epoch(row, 4)
    for index in range(2, 7):
        assert appender.append(row, batches[index])[0] == 4 * index
    assert logs.partition_log("t", 0).log_end_offset == 28
    # The sixth-last is no longer known: out of order, as Kafka answers it.
    assert appender.append(row, batches[1])[0] == -CompletionCode.OUT_OF_ORDER_SEQUENCE
    assert appender.append(row, producer_batch(28, 7))[0] == 28
    assert logs.partition_log("t", 0).epochs.entries() == [(3, 0), (4, 28)]


def test_rebuild_producer_state_forgets_what_a_truncation_removed(replica):
    logs, table, appender, row = replica
    appender.append_replicated(row, leader_bytes(producer_batch(0, 0), producer_batch(4, 1)))
    logs.partition_log("t", 0).truncate_to(4)
    appender.rebuild_producer_state(row)
    # The batch at 4 is gone: its re-send is appended again, at the new log end.
    assert appender.append(row, producer_batch(4, 1))[0] == 4
    assert appender.append(row, producer_batch(4, 1))[0] == 4         # now a duplicate
    assert logs.partition_log("t", 0).log_end_offset == 8


def test_a_truncation_leaves_the_window_of_the_batches_it_kept(replica):
    logs, table, appender, row = replica
    batches = [producer_batch(4 * index, index) for index in range(5)]      # at 0, 4, ... 16
    appender.append_replicated(row, leader_bytes(*batches))
    logs.partition_log("t", 0).truncate_to(12)
    appender.rebuild_producer_state(row)
    # The three kept are duplicates; the two cut are appended again, in order.
    assert [appender.append(row, batch)[0] for batch in batches] == [0, 4, 8, 12, 16]
    assert logs.partition_log("t", 0).log_end_offset == 20
    assert [appender.append(row, batch)[0] for batch in batches] == [0, 4, 8, 12, 16]
    assert logs.partition_log("t", 0).log_end_offset == 20


def test_append_replicated_wants_an_external_high_watermark(replica):
    logs, table, appender, row = replica
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.LOG_END)
    with pytest.raises(LocalProtocolError):
        appender.append_replicated(row, leader_bytes(producer_batch(0, 0)))
    assert logs.partition_log("t", 0).log_end_offset == 0
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    appender.append_replicated(row, leader_bytes(producer_batch(0, 0)))
    with pytest.raises(UnexpectedAppendOffsetError):
        appender.append_replicated(row, leader_bytes(producer_batch(4, 1), base=2))
    assert table.snapshot(row).log_end_offset == 4


def test_a_read_only_source_and_the_warm_up(tmp_path):
    follower = PartitionLog(str(tmp_path / "follower"), TopicConfig.from_overrides(SMALL))
    frame = bytes(leader_bytes(producer_batch(0, 0), base=3))      # as a frame off the wire
    assert follower.append_as_follower(frame) == (3, 6, -1, 1)
    assert follower.epochs.entries() == [(3, 3)]
    follower.close()
    scratch = tmp_path / "warm-up"
    warm_follower_kernels(str(scratch))
    assert not scratch.exists()


def test_a_deposed_leader_truncates_where_the_epochs_say_and_ends_identical(tmp_path):
    """KIP-279's exchange on real logs: the new leader answers the deposed one's
    latest epoch from its cache, the deposed leader truncates there and copies the
    rest; both logs and both caches end equal."""
    config = TopicConfig.from_overrides(SMALL)
    old = PartitionLog(str(tmp_path / "old"), config)       # led epochs 0 and 1
    new = PartitionLog(str(tmp_path / "new"), config)       # followed epoch 0, leads 2
    for seed in range(2):
        new.append_as_follower(old.read(old.append(values_batch(5, seed)).base_offset).data.copy())
    for seed in range(2, 4):
        old.append(values_batch(5, seed), leader_epoch=1)   # never replicated
    new.epochs.assign(2, new.log_end_offset)                # Partition.makeLeader
    new.append(values_batch(3, 9), leader_epoch=2)
    epoch, end = new.epochs.end_offset_for(old.epochs.latest_epoch, new.log_end_offset)
    assert (epoch, end) == (0, 10)
    assert old.epochs.end_offset_for(epoch, old.log_end_offset) == (0, 10)
    old.truncate_to(min(end, old.log_end_offset))
    assert old.epochs.entries() == [(0, 0)]
    for chunk in fetch_chunks_from(new, old.log_end_offset):
        old.append_as_follower(chunk)
    assert log_bytes(old) == log_bytes(new)
    assert old.epochs.entries() == new.epochs.entries() == [(0, 0), (2, 10)]
    old.close()
    new.close()


def fetch_chunks_from(partition_log, offset: int):
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, max_bytes=1 << 12)
        yield result.data.copy()
        offset = result.next_offset
