"""PartitionReader in one process with the appender: reads stop at the high
watermark, survive rolls, follow retention, use the index for seeks, and report
a flipped byte as a corrupt segment.

Method: a real appender, ring, state table and partition log in this process; the
reader maps the same files read-only, as a consumer process would.
"""

from __future__ import annotations

import os
import uuid

import pytest

from helpers import flip_bits
from shmlog import LogManager, batch_layout as B, shared_memory
from shmlog.appender import Appender
from shmlog.errors import CorruptSegmentError, OffsetOutOfRangeError
from shmlog.reader import PartitionReader
from shmlog.records import decode_columns, encode_batch
from shmlog.ring import Ring
from shmlog.state import PartitionStateTable


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
    reader = PartitionReader(str(tmp_path / "data" / "topics" / "t" / "0"), table, tag)

    def send(first: int, count: int, timestamp: int = 10**12):
        producer.put(tag, encode_batch([b"v%d" % (first + i) for i in range(count)],
                                       timestamps=[timestamp] * count), 1000)
        appender.drain()

    yield logs, appender, tag, reader, send
    reader.close()
    logs.close()
    for name in (prefix + "-state", prefix + "-ring"):
        shared_memory.unlink(name)


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
