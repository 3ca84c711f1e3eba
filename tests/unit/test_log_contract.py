"""The partition log's contract with its writer: a compiled writer appends through
an ``AppendTarget`` with ``append_batches`` and gives it back with
``appended_by_kernel``; the log tells its one listener of every change that makes
the target or the published offsets stale (``LogChange``); the segment generation's
seqlock (``segment_generation``) on both its sides.

Method: real partition logs on disk; for the writer's side, a real appender with a
real state table and a real ring in /dev/shm, changed behind its back (nobody calls
``refresh``) to show the log tells it itself. The seqlock's reader side is driven
with scripted generation loads, its writer side through a real log.
"""

from __future__ import annotations

import os
import uuid

import pytest

from helpers import all_records, values_batch
from shmlog import LogManager
from shmlog.broker.appender import Appender
from shmlog.common.errors import CorruptRecordError, LocalProtocolError
from shmlog.record import batch_layout as B
from shmlog.record.records import decode_records
from shmlog.ring import Ring
from shmlog.segments import LogChange, append_batches
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name
from shmlog.storage.segment_generation import SegmentGeneration, follow
from shmlog.storage.segment_state import (
    APPENDED,
    NEED_ROLL,
    NEED_SPACE,
    NEXT_OFFSET_WORD,
    TIMESTAMP_NONE,
)

SMALL = {"segment.bytes": 16 << 10, "index.interval.bytes": 256, "segment.index.bytes": 4096}


def append_through(target, batch):
    """What a compiled writer does with a batch of its own: the kernel, verifying
    the copy (the writer's source could change under it)."""
    return append_batches(batch, 0, batch.size, target.log, target.offset_index,
                          target.time_index, target.state, target.segment_bytes,
                          target.segment_ms, target.index_interval, TIMESTAMP_NONE, 0, True)


# --- the append target --------------------------------------------------------------

def test_a_writer_appends_through_its_target_and_gives_it_back(open_log):
    partition_log = open_log(**SMALL)
    first = partition_log.append_target()
    # A new log's segment has no file yet: its target has no room, and the writer's
    # slow path (append) makes the files, then tells the listener (a new target).
    assert first.segment.pending and first.log.size == 0
    assert append_through(first, values_batch(10, 0))[0] == NEED_SPACE
    partition_log.append(values_batch(10, 0))
    written, seed = decode_records(values_batch(10, 0)), 1
    target = partition_log.append_target()
    assert target.compiled and target.verified and target.segment is partition_log.active
    assert not target.segment.pending and target.log.size > 0
    while True:
        batch = values_batch(10, seed)
        status, position, batch_status = append_through(target, batch)
        if status == NEED_SPACE:
            target.segment.make_room(batch.size, target.index_interval)
            status, position, batch_status = append_through(target, batch)
        if status == NEED_ROLL:
            break
        assert (status, position, batch_status) == (APPENDED, batch.size, 0)
        written += decode_records(batch)
        seed += 1
    assert int(target.state[NEXT_OFFSET_WORD]) == len(written) == 10 * seed
    partition_log.appended_by_kernel(target, len(written) - 10)
    assert partition_log.log_end_offset == len(written)
    assert target.segment.verified_end == target.segment.size, "the kernel checked its copies"
    assert [r.value for r in all_records(partition_log)] == [r.value for r in written]
    partition_log.roll()
    rolled = partition_log.append_target()
    assert rolled.segment is partition_log.active is not target.segment
    assert append_through(rolled, values_batch(10, seed))[0] != APPENDED, "nothing reserved yet"
    assert partition_log.log_end_offset == len(written), "nothing of a refused batch is in"


def test_compiled_appends_are_allowed_only_where_the_log_stores_batches_as_sent(open_log,
                                                                                  tmp_path):
    assert open_log(**SMALL).append_target().compiled
    for name, config in (("log-append-time", {"message.timestamp.type": "LogAppendTime"}),
                         ("recompressed", {"compression.type": "zstd"})):
        assert not open_log(tmp_path / name, **config).append_target().compiled


# --- the listener -------------------------------------------------------------------

def test_the_log_tells_its_listener_of_every_change_and_nothing_else(open_log):
    partition_log = open_log(**SMALL, **{"retention.ms": 10_000})
    heard = []

    def listener(change):
        # What a writer does: take a new target at once; it must be the active one.
        assert partition_log.append_target().segment is partition_log.active
        heard.append(change)

    partition_log.set_listener(listener)
    for seed in range(30):
        partition_log.append(values_batch(40, seed, timestamps=[1_000 * seed] * 40))
    assert len(partition_log.segments) > 3
    assert heard == [LogChange.APPENDED] * 30, "one word per append, its rolls included"

    def told(change) -> list:
        heard.clear()
        change()
        return list(heard)

    target = partition_log.append_target()
    assert told(lambda: partition_log.appended_by_kernel(target, 0)) == []
    assert told(partition_log.flush) == []
    assert told(lambda: partition_log.delete_old_segments(now=0)) == [], "nothing deleted"
    assert told(partition_log.roll) == [LogChange.ROLLED]
    assert told(lambda: partition_log.roll()) == [], "an empty active segment does not roll"
    changing = [LogChange.SEGMENT_FILES_CHANGING] * 2
    assert told(lambda: partition_log.delete_old_segments(now=30_000 + 1)) == changing
    assert told(lambda: partition_log.truncate_to(partition_log.log_end_offset - 50)) == changing
    assert told(lambda: partition_log.truncate_to(partition_log.log_end_offset)) == []
    assert told(lambda: partition_log.advance_log_start_offset(
        partition_log.log_start_offset + 1)) == [LogChange.LOG_START_MOVED]
    config = partition_log.config
    assert told(lambda: setattr(partition_log, "config", config)) == [LogChange.CONFIG_CHANGED]
    partition_log.set_listener(None)
    assert told(lambda: partition_log.append(values_batch(1, 99))) == []


def test_an_append_refused_before_anything_changed_tells_nothing(open_log):
    partition_log = open_log(**SMALL)
    heard = []
    partition_log.set_listener(heard.append)
    bad = values_batch(3, 0).copy()
    bad[B.HEADER_LENGTH + 3] ^= 1
    with pytest.raises(CorruptRecordError):
        partition_log.append(bad)
    assert heard == [] and partition_log.log_end_offset == 0


# --- the seqlock ----------------------------------------------------------------------

def test_changes_of_the_segment_files_do_not_nest(tmp_path):
    generation = SegmentGeneration(str(tmp_path))
    published = []
    with generation.changing(lambda: published.append(generation.value)):
        assert generation.changing_now
        with pytest.raises(LocalProtocolError, match="do not nest"):
            with generation.changing(lambda: published.append(generation.value)):
                pass
        generation.rolled()
    assert published == [1, 4] and not generation.changing_now
    with pytest.raises(RuntimeError):
        with generation.changing(lambda: published.append(generation.value)):
            raise RuntimeError("a change failing half-way")
    assert published == [1, 4, 5, 6], "even again, and published, after a failed change"


def scripted(*values):
    loads = iter(values)
    return lambda: next(loads)


@pytest.mark.parametrize("loads, mapped, expected, rescans", [
    ((4,), 4, 4, 0),                   # unchanged: read on
    ((5,), 4, 4, 0),                   # a change under way: the set just before is whole
    ((5,), 2, None, 0),                # older mappings may miss a roll's files: wait
    ((5,), None, None, 0),
    ((6, 6), 4, 6, 1),                 # moved: list once, the same even value after
    ((6, 7), 4, None, 1),              # a change began during the listing: wait
    ((6, 8, 8), 4, 8, 2),              # moved during the listing, then stable
    ((6, 8, 10), 4, None, 2),          # kept moving past the attempts
])
def test_a_reader_follows_the_generation_as_the_seqlock_says(loads, mapped, expected, rescans):
    listed = []
    assert follow(scripted(*loads), mapped, lambda: listed.append(1), 2) == expected
    assert len(listed) == rescans


# --- a real writer: the appender --------------------------------------------------------

@pytest.fixture
def hosted(tmp_path):
    """A log manager, a state table, an appender hosting topic t-0, and one
    producer ring; cleaned up."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(prefix + "-state", 8)
    appender = Appender(logs, table)
    logs.create_topic("t", config=SMALL)
    row = appender.register_partition("t", 0)
    producer = Ring.create(prefix + "-ring", 1 << 20)
    appender.add_ring(Ring.attach(prefix + "-ring"))
    yield logs, table, appender, row, producer
    logs.close()
    for name in (prefix + "-state", bells_name(prefix + "-state"), prefix + "-ring"):
        shared_memory.unlink(name)


def test_the_appender_follows_changes_nobody_told_it_of(hosted):
    """Config, rolls and retention changed on the log alone (no refresh call): the
    log's listener points the appender at them and publishes."""
    logs, table, appender, row, producer = hosted
    to = appender.destination("t", 0)
    partition_log = logs.partition_log("t", 0)
    producer.put(to, values_batch(5, 0, timestamps=[1_000] * 5), 1000)
    assert appender.drain() == 1 and table.high_watermark(row) == 5

    logs.alter_topic_config("t", {"message.timestamp.type": "LogAppendTime"})
    entry = producer.put(to, values_batch(5, 1, timestamps=[2_000] * 5), 1000)
    assert appender.drain() == 1
    assert producer.result(entry)[0] == 5
    stamped = decode_records(partition_log.read(5).data, start_offset=5)
    assert {r.timestamp_type for r in stamped} == {B.TIMESTAMP_LOG_APPEND_TIME}

    partition_log.roll()
    assert table.snapshot(row).active_segment_base_offset == 10
    logs.alter_topic_config("t", {"message.timestamp.type": "CreateTime", "retention.ms": "1"})
    entry = producer.put(to, values_batch(5, 2, timestamps=[3_000] * 5), 1000)
    assert appender.drain() == 1 and producer.result(entry)[0] == 10
    assert partition_log.active.base_offset == 10, "appended to the new active segment"
    # (The LogAppendTime batch rolled the log too: its time was past segment.ms.)
    assert partition_log.delete_old_segments(high_watermark=10) == [0, 5]
    published = table.snapshot(row)
    assert (published.log_start_offset, published.high_watermark) == (10, 15)
    assert published.segment_generation == partition_log.generation
