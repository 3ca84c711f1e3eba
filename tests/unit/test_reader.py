"""PartitionReader in one process with the appender: reads stop at the high
watermark, survive rolls, follow retention, use the index for seeks, report a
flipped byte as a corrupt segment, and never step over a record when a compaction
swap happens while they list the directory or read.

Method: a real appender, ring, state table and partition log in this process; the
reader maps the same files read-only, as a consumer process would. The swap is
interleaved at chosen points by running it from a patched ``os.stat`` (inside the
reader's rescan) or ``Segment.delete`` (between the swap's renames and deletions).
"""

from __future__ import annotations

import os
import uuid

import pytest

from helpers import all_records, flip_bits
from shmlog import LogManager
from shmlog.broker.appender import Appender
from shmlog.client.reader import PartitionReader
from shmlog.common.errors import (
    CorruptSegmentError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from shmlog.record import batch_layout as B
from shmlog.record.records import decode_columns, encode_batch
from shmlog.ring import Ring
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name, topic_key, unlink_table
from shmlog.storage import cleaner


@pytest.fixture
def setup(tmp_path):
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    logs = LogManager(str(tmp_path / "data"))
    logs.create_topic("t", config={"segment.bytes": 4096, "index.interval.bytes": 256,
                                   "retention.ms": 1000})
    table = PartitionStateTable.create(prefix + "-state", 4)
    appender = Appender(logs, table)
    tag = appender.register_partition("t", 0)
    producer = Ring.create(prefix + "-ring", 1 << 16)
    appender.add_ring(Ring.attach(prefix + "-ring"))
    reader = PartitionReader(str(tmp_path / "data" / "topics" / "t" / "0"), table, tag,
                             topic_key=topic_key(logs.describe_topic("t").topic_id), partition=0)

    def send(first: int, count: int, timestamp: int = 10**12):
        producer.put(appender.destination("t", 0),
                     encode_batch([b"v%d" % (first + i) for i in range(count)],
                                  timestamps=[timestamp] * count), 1000)
        appender.drain()

    yield logs, appender, tag, reader, send
    reader.close()
    logs.close()
    for name in (prefix + "-state", bells_name(prefix + "-state"), prefix + "-ring"):
        shared_memory.unlink(name)


def test_a_deleted_partition_is_unknown_never_corrupt_nor_another_partition(setup, tmp_path):
    logs, appender, tag, reader, send = setup
    send(0, 5)
    assert reader.read(0).next_offset == 5 and not reader.deleted()
    gone = PartitionReader(str(tmp_path / "data" / "topics" / "t" / "9"), reader.table, tag,
                           topic_key=reader.topic_key, partition=0)
    with pytest.raises(UnknownTopicOrPartitionError, match="its directory is gone"):
        gone.read(0)
    appender.unregister_partition("t", 0)
    assert reader.deleted()
    with pytest.raises(UnknownTopicOrPartitionError,
                       match=r"topic was deleted: its state table row \d+ is free now"):
        reader.read(0)
    logs.create_topic("u")
    assert appender.register_partition("u", 0) == tag, "the freed row goes to another topic"
    with pytest.raises(UnknownTopicOrPartitionError, match=r"topic was deleted and its state "
                       r"table row \d+ was reused by another partition"):
        reader.read(0)
    with pytest.raises(UnknownTopicOrPartitionError):
        reader.snapshot()


def test_reads_stop_at_the_high_watermark_and_resume(setup):
    logs, appender, tag, reader, send = setup
    send(0, 5)
    result = reader.read(0)
    assert [r.offset for r in decode_columns(result.data, verified=True).records()] == \
        list(range(5))
    assert reader.read(5).data.size == 0, "nothing at the high watermark"
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(6)
    send(5, 3)
    records = decode_columns(reader.read(5).data, verified=True).records()
    assert [(r.offset, r.value) for r in records] == [(5, b"v5"), (6, b"v6"), (7, b"v7")]


def test_a_reader_follows_a_log_whose_files_its_first_append_makes(setup):
    logs, appender, tag, reader, send = setup
    assert os.listdir(reader.directory) == [] and reader.read(0).data.size == 0
    send(0, 3)
    assert [r.offset for r in decode_columns(reader.read(0).data).records()] == [0, 1, 2]
    # A log restarted empty (a follower behind its leader's log start) has no segment
    # file until its next append: the reader lists the directory again then.
    logs.partition_log("t", 0).truncate_fully_and_start_at(10)
    assert not [name for name in os.listdir(reader.directory) if name.endswith(".log")]
    assert reader.read(10).data.size == 0
    send(10, 2)
    records = decode_columns(reader.read(10).data).records()
    assert [(r.offset, r.value) for r in records] == [(10, b"v10"), (11, b"v11")]


def test_seeks_use_the_index_across_rolled_segments(setup):
    logs, appender, tag, reader, send = setup
    for first in range(0, 600, 6):
        send(first, 6)
    assert len(logs.partition_log("t", 0).segments) > 3
    for offset in (0, 1, 97, 250, 301, 599, 42):
        records = decode_columns(reader.read(offset, max_bytes=1).data, start_offset=offset,
                                 verified=True).records()
        assert records[0].offset == offset and records[0].value == b"v%d" % offset


def test_retention_moves_the_start_and_readers_follow(setup):
    logs, appender, tag, reader, send = setup
    for first in range(0, 300, 10):
        send(first, 10, timestamp=1000 + first)
    reader.read(0)
    partition_log = logs.partition_log("t", 0)
    partition_log.delete_old_segments(now=1000 + 200 + 1000)
    appender.refresh(tag)
    start = partition_log.log_start_offset
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(0)
    records = decode_columns(reader.read(start).data, verified=True).records()
    assert records[0].offset == start


def test_a_flipped_byte_is_a_corrupt_segment_for_the_reader(setup):
    logs, appender, tag, reader, send = setup
    send(0, 4)
    flip_bits(logs.partition_log("t", 0).active.log_path, B.HEADER_LENGTH + 2, 0x04)
    with pytest.raises(CorruptSegmentError, match="BAD_CRC"):
        reader.read(0)


def test_a_segment_full_to_the_byte_is_mapped_again_after_its_roll(setup):
    """The roll trims the index but not the log (already at its full size): the
    reader must still map the index again before reading it as a sealed segment's
    (an old mapping at the active size would fault past the trimmed end)."""
    logs, appender, tag, reader, _ = setup
    value_size = 4096 // 32 - B.HEADER_LENGTH - B.RECORD_HEADER_LENGTH
    batch = encode_batch([b"x" * value_size], timestamps=[10**12])
    assert 4096 % batch.size == 0
    partition_log = logs.partition_log("t", 0)
    for _ in range(4096 // batch.size):
        partition_log.append(batch)
    appender.refresh(tag)
    assert partition_log.active.size == 4096
    assert len(decode_columns(reader.read(0, 1 << 20).data, verified=True)) == 32
    partition_log.append(batch)                    # rolls: the first segment is sealed
    appender.refresh(tag)
    assert len(partition_log.segments) == 2
    assert os.path.getsize(partition_log.segments[0].log_path) == 4096
    records = decode_columns(reader.read(0, 1 << 20).data, verified=True)
    assert [record.offset for record in records.records()] == list(range(32))
    assert reader.read(32).next_offset == 33


# --- compaction swaps under a reader ---------------------------------------------------
# A compacted topic whose closed segments are small enough that one cleaned segment
# replaces several: the swap renames the cleaned file over the first segment of the
# group and deletes the others, which is what a reader listing the directory can tear.

NOW = 1_700_000_000_000
SEGMENTS_CLEANED = 5


@pytest.fixture
def compacted(tmp_path):
    """(partition log, appender, tag, reader factory, written): a compacted partition
    holding SEGMENTS_CLEANED closed segments and an active one; ``written`` maps each
    offset to its (key, value). Every third record has a key of its own, so each
    segment keeps records after cleaning; the rest overwrite five shared keys."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    logs = LogManager(str(tmp_path / "data"))
    logs.create_topic("c", config={"cleanup.policy": "compact", "segment.bytes": 16384,
                                   "index.interval.bytes": 128,
                                   "min.cleanable.dirty.ratio": 0.01})
    table = PartitionStateTable.create(prefix + "-state", 4)
    appender = Appender(logs, table)
    tag = appender.register_partition("c", 0)
    partition_log = logs.partition_log("c", 0)
    written = {}
    for segment in range(SEGMENTS_CLEANED + 1):
        for _ in range(4):
            first = partition_log.log_end_offset
            keys = [b"own-%d" % (first + index) if (first + index) % 3 == 0
                    else b"shared-%d" % ((first + index) % 5) for index in range(6)]
            values = [b"value-%d" % (first + index) for index in range(6)]
            partition_log.append(encode_batch(values, keys=keys, timestamps=[NOW] * 6))
            written.update({first + index: (keys[index], values[index]) for index in range(6)})
        if segment < SEGMENTS_CLEANED:
            partition_log.roll()
    appender.refresh(tag)
    readers = []

    def open_reader():
        readers.append(PartitionReader(partition_log.directory, table, tag,
                                       topic_key=table.snapshot(tag).topic_key, partition=0))
        return readers[-1]

    yield partition_log, appender, tag, open_reader, written
    for reader in readers:
        reader.close()
    logs.close()
    unlink_table(prefix + "-state")


def consume(reader, offset: int, end: int, max_bytes: int = 1 << 20, reads_max: int = 1000):
    """Read from ``offset`` to ``end`` as Consumer._fetch does (an empty read moves the
    position to the next offset it names); (records, position reached)."""
    records = []
    for _ in range(reads_max):
        if offset >= end:
            break
        result = reader.read(offset, max_bytes)
        if not result.data.size:
            offset = max(offset, result.next_offset)
            continue
        records += decode_columns(result.data, start_offset=offset, verified=True).records()
        offset = result.next_offset
    return records, offset


def check_records(records, written, expected_offsets) -> None:
    """Offsets only grow, every record is the one written at its offset, and none of
    ``expected_offsets`` (what the cleaned log holds) was stepped over."""
    offsets = [record.offset for record in records]
    assert offsets == sorted(set(offsets)), "offsets only grow"
    for record in records:
        assert (record.key, record.value) == written[record.offset]
    missed = sorted(set(expected_offsets) - set(offsets))
    assert not missed, f"records stepped over: {missed}"


def plan_cleaning(partition_log):
    cleaning = cleaner.clean(cleaner.plan(partition_log, NOW + 1000), NOW + 1000, 1 << 20)
    assert len(cleaning.groups) == 1 and len(cleaning.groups[0].replaces) >= SEGMENTS_CLEANED
    return cleaning


def test_a_rescan_torn_by_a_swap_steps_over_nothing(compacted, monkeypatch):
    """The reader has read the first segment of the group and goes on at the second
    one's base; a roll moved the generation, so it rescans, and between its listing
    and its look at that second segment the whole swap happens: it holds the old
    first segment and finds the others gone. It must notice and rescan, not step over
    the offsets only the cleaned copy holds now."""
    partition_log, appender, tag, open_reader, written = compacted
    reader = open_reader()
    cleaning = plan_cleaning(partition_log)
    first_records, position = consume(reader, 0, cleaning.groups[0].replaces[1])
    partition_log.roll()                        # the generation moves: the reader rescans
    appender.refresh(tag)
    second = os.path.join(partition_log.directory, f"{cleaning.groups[0].replaces[1]:020d}.log")
    real_stat = os.stat
    swapped = []

    def stat_then_swap(path, *args, **kwargs):
        if os.fspath(path) == second and not swapped:
            swapped.append(True)
            # The broker's swap_cleaned, between the reader's listing and this stat.
            assert partition_log.replace_segments(cleaning)
            appender.refresh(tag)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_then_swap)
    records, _ = consume(reader, position, partition_log.log_end_offset)
    monkeypatch.undo()
    assert swapped, "the swap ran inside the reader's rescan"
    kept = [record.offset for record in all_records(partition_log)]
    check_records(first_records + records, written,
                  [offset for offset in kept if offset >= position])


def test_readers_during_a_swap_read_old_mappings_or_wait(compacted, monkeypatch):
    """In the middle of a swap (the cleaned file renamed in, the group's other
    segments not yet deleted) the published generation is odd. A reader mapped at
    the generation just before reads on through its old mappings, every record;
    one whose mappings are older (a roll since) or that has none reads nothing and
    keeps its position; after the swap both read every record the cleaned log holds."""
    from shmlog import segments

    partition_log, appender, tag, open_reader, written = compacted
    current, stale, fresh = open_reader(), open_reader(), open_reader()
    consume(stale, 0, 1, max_bytes=1)
    partition_log.roll()                   # stale's mappings predate this roll
    appender.refresh(tag)
    consume(current, 0, 1, max_bytes=1)
    cleaning = plan_cleaning(partition_log)
    end = partition_log.log_end_offset
    seen = {}
    real_delete = segments.Segment.delete

    def read_then_delete(segment):
        if not seen:
            seen["generation"] = appender.table.snapshot(tag).segment_generation
            seen["current"] = consume(current, 0, end)
            seen["stale"] = [stale.read(offset) for offset in (0, 30)]
            seen["fresh"] = fresh.read(30)
        real_delete(segment)

    monkeypatch.setattr(segments.Segment, "delete", read_then_delete)
    assert partition_log.replace_segments(cleaning)
    monkeypatch.undo()
    appender.refresh(tag)
    assert seen, "the reads ran between the renames and the deletions"
    assert seen["generation"] % 2 == 1, "odd while the swap is under way"
    assert appender.table.snapshot(tag).segment_generation % 2 == 0
    records, position = seen["current"]
    assert position == end
    check_records(records, written, range(end))          # the old segments: everything
    for offset, result in zip((0, 30), seen["stale"]):
        assert result.data.size == 0 and result.next_offset == offset
    assert seen["fresh"].data.size == 0 and seen["fresh"].next_offset == 30
    kept = [record.offset for record in all_records(partition_log)]
    for reader in (current, stale, fresh):
        records, position = consume(reader, 0, end)
        assert position == end
        check_records(records, written, kept)
