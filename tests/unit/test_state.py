"""The partition state table in one process: rows round-trip, claiming and
freeing, bounds and header checks; the journal of changed rows round-trips, laps
and survives scribbles.

Method: real POSIX shared memory, unlinked at teardown (and checked gone).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import uuid

import numpy as np
import pytest

from shmlog.common.errors import (
    LocalProtocolError,
    PeerProtocolError,
    ShmlogError,
    StateTableInconsistentError,
)
from shmlog.shm import state_layout as S
from shmlog.shm.state import (
    JOURNAL_LAPPED,
    PartitionStateTable,
    RowSnapshot,
    bells_name,
    check_row,
    publish_row,
    topic_key,
    unlink_table,
)


@pytest.fixture
def table_name():
    name = f"shmlog-test-state-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    unlink_table(name)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_a_published_row_reads_back(table_name):
    with PartitionStateTable.create(table_name, 8) as table, \
            PartitionStateTable.attach(table_name) as reader:
        key = topic_key(uuid.uuid4().hex)
        table.claim(5, key, 3)
        assert reader.high_watermark(5) == -1
        table.publish(5, 2, 40, 38, 30, 4096, 7)
        snapshot = reader.snapshot(5)
        assert (snapshot.log_start_offset, snapshot.log_end_offset, snapshot.high_watermark,
                snapshot.active_segment_base_offset, snapshot.active_segment_size,
                snapshot.segment_generation, snapshot.topic_key,
                snapshot.partition) == (2, 40, 38, 30, 4096, 7, key, 3)
        assert (snapshot.last_stable_offset, snapshot.aborted_generation) == (38, 0), \
            "no transaction open: the last stable offset is the high watermark"
        table.publish(5, 2, 41, 41, 30, 4200, 7, last_stable_offset=35, aborted_generation=2)
        snapshot = reader.snapshot(5)
        assert (snapshot.high_watermark, snapshot.last_stable_offset,
                snapshot.aborted_generation) == (41, 35, 2)
        assert reader.snapshot(4).topic_key == 0, "other rows untouched"
        table.free(5)
        assert reader.snapshot(5).topic_key == 0 and reader.high_watermark(5) == -1
        assert reader.broker_epoch == table.broker_epoch > 0


@pytest.mark.parametrize("row", [-1, 8, 1.5])
def test_rows_outside_the_table_are_rejected(table_name, row):
    with PartitionStateTable.create(table_name, 8) as table:
        with pytest.raises(LocalProtocolError):
            table.high_watermark(row)


def test_attach_checks_the_header_and_existence(table_name):
    with pytest.raises(ShmlogError, match="no partition state table"):
        PartitionStateTable.attach(table_name)
    with PartitionStateTable.create(table_name, 2) as table:
        table.control[0] = 0
        with pytest.raises(PeerProtocolError):
            PartitionStateTable.attach(table_name)


def test_topic_keys_are_never_the_free_marker():
    assert topic_key("0" * 32) == 1
    assert topic_key("f" * 32) > 0


# -- the journal of changed rows -------------------------------------------------------------

def _slots() -> np.ndarray:
    return np.empty(S.JOURNAL_CAPACITY, np.int64)


def _published(table) -> int:
    return int(table.control[S.JOURNAL_SEQUENCE_WORD])


def test_the_journal_names_published_rows_in_order_once_per_flush(table_name):
    """Round trip: every publish names its row after the row's stores; a row
    published again before the sequence moves takes no second slot."""
    with PartitionStateTable.create(table_name, 8) as table, \
            PartitionStateTable.attach(table_name) as reader:
        assert reader.journal_changes(0, _slots()) == (0, 0)
        for row in (3, 5):
            table.claim(row, topic_key(uuid.uuid4().hex), 0)
        table.publish(3, 0, 10, 10, 0, 100, 0)
        table.publish(5, 0, 1, 1, 0, 100, 0)
        slots = _slots()
        sequence, count = reader.journal_changes(0, slots)
        assert (sequence, count, list(slots[:count])) == (2, 2, [3, 5])
        # Compiled publishes (the appender's) flush only every UNFLUSHED_MAX or when
        # told: until then nothing is new to a reader, and a row named once.
        for high_watermark in range(11, 16):
            publish_row(table.rows, table.control, 3, 0, high_watermark, high_watermark, 0,
                        100, 0, high_watermark, 0)
        publish_row(table.rows, table.control, 5, 0, 2, 2, 0, 100, 0, 2, 0)
        assert reader.journal_changes(sequence, slots) == (2, 0)
        table.flush_journal()
        sequence, count = reader.journal_changes(sequence, slots)
        assert (sequence, count, list(slots[:count])) == (4, 2, [3, 5])
        assert reader.snapshot(3).high_watermark == 15
        table.free(5)
        sequence, count = reader.journal_changes(sequence, slots)
        assert (count, list(slots[:count])) == (1, [5])
        assert reader.journal_sequence() == sequence == 5


def test_the_journal_flushes_itself_every_unflushed_max_publishes(table_name):
    with PartitionStateTable.create(table_name, S.JOURNAL_UNFLUSHED_MAX + 1) as table:
        for row in range(S.JOURNAL_UNFLUSHED_MAX):
            publish_row(table.rows, table.control, row, 0, 1, 1, 0, 100, 0, 1, 0)
        slots = _slots()
        sequence, count = table.journal_changes(0, slots)
        assert sequence == count == S.JOURNAL_UNFLUSHED_MAX
        assert list(slots[:count]) == list(range(S.JOURNAL_UNFLUSHED_MAX))
        assert table.control[S.JOURNAL_PENDING_WORD] == 0


def test_a_lapped_reader_is_told_to_look_at_every_row(table_name):
    """More new slots than the broker leaves unwritten: the slots cannot be trusted."""
    with PartitionStateTable.create(table_name, 4) as table:
        limit = S.JOURNAL_CAPACITY - S.JOURNAL_UNFLUSHED_MAX
        for position in range(limit + 1):
            table.publish(position % 4, 0, 1, 1, 0, 100, 0)
        assert table.journal_changes(0, _slots()) == (limit + 1, JOURNAL_LAPPED)
        sequence, count = table.journal_changes(1, _slots())
        assert (sequence, count) == (limit + 1, limit), "just within: read"
        # A reader that starts again from the sequence follows on.
        table.publish(2, 0, 2, 2, 0, 100, 0)
        slots = _slots()
        assert table.journal_changes(sequence, slots) == (sequence + 1, 1) and slots[0] == 2


@pytest.mark.parametrize("garbage", [-7, 2**62, -(2**63)])
def test_a_scribbled_journal_costs_a_full_look_never_memory(table_name, garbage):
    """Another member of the data group may write the table: a sequence gone back or
    ahead is a lap for the reader; the broker's cursor, if scribbled, starts again
    from the sequence, and its slots stay inside the journal."""
    with PartitionStateTable.create(table_name, 4) as table:
        table.publish(1, 0, 1, 1, 0, 100, 0)
        table.control[S.JOURNAL_SEQUENCE_WORD] = garbage
        sequence, count = table.journal_changes(1, _slots())
        assert count == JOURNAL_LAPPED and sequence == garbage
        table.control[S.JOURNAL_WRITTEN_WORD] = garbage // 2 + 12345
        table.control[S.JOURNAL_PENDING_WORD] = garbage
        table.publish(3, 0, 1, 1, 0, 100, 0)
        slots = _slots()
        assert table.journal_changes(garbage, slots) == (garbage + 1, 1) and slots[0] == 3
        for row in range(4):
            publish_row(table.rows, table.control, row, 0, 1, 1, 0, 100, 0, 1, 0)
        table.flush_journal()
        assert table.journal_changes(garbage + 1, slots) == (garbage + 5, 4)
        assert list(slots[:4]) == [0, 1, 2, 3]
        # Garbage rows in the slots are the reader's to ignore (it maps rows to its own
        # partitions), not a fault.
        table.control[S.journal_slot_word(garbage + 5)] = -99
        table.control[S.JOURNAL_WRITTEN_WORD] = garbage + 6
        table.flush_journal()
        assert table.journal_changes(garbage + 5, slots)[1] == 1 and slots[0] == -99


def test_the_layout_keeps_the_journal_between_the_control_page_and_the_rows():
    assert S.VERSION == 5
    assert S.JOURNAL_SLOTS_OFFSET >= S.JOURNAL_PENDING_OFFSET + S.WORD_SIZE
    assert S.ROWS_OFFSET == S.JOURNAL_SLOTS_OFFSET + S.JOURNAL_CAPACITY * S.JOURNAL_SLOT_SIZE
    assert S.journal_slot_word(S.JOURNAL_CAPACITY + 2) == S.JOURNAL_SLOTS_WORD + 2
    assert S.journal_slot_word(-1) == S.JOURNAL_SLOTS_WORD + S.JOURNAL_CAPACITY - 1
    # The Spark bulk reader's Java finds the rows at the same place.
    java = (pathlib.Path(S.__file__).parents[1] / "spark" / "jvm" / "io" / "shmlog" / "spark"
            / "BulkSource.java").read_text()
    rows = re.search(r"ROWS = ([^,]+),", java).group(1)
    assert eval(rows, {}) == S.ROWS_OFFSET, rows
    assert int(re.search(r"ROW_SIZE = (\d+),", java).group(1)) == S.ROW_SIZE
    # The transactions' words have a line of their own, after every reader's.
    assert S.LAST_STABLE_OFFSET_OFFSET == S.CACHE_LINE_SIZE and S.ROW_SIZE == 128


def test_a_row_word_no_broker_publishes_is_named_as_tampering():
    good = RowSnapshot(log_start_offset=0, log_end_offset=10, high_watermark=10,
                       active_segment_base_offset=5, segment_generation=2, topic_key=7,
                       partition=0, active_segment_size=300, last_stable_offset=8,
                       aborted_generation=0)
    assert check_row("table", 3, good) is good
    for field, value in (("log_start_offset", -1), ("log_end_offset", 2**63 - 1),
                         ("high_watermark", 2**63 - 1), ("active_segment_base_offset", 11),
                         ("active_segment_base_offset", -3), ("active_segment_size", -1),
                         ("active_segment_size", 2**31), ("segment_generation", -2),
                         ("last_stable_offset", -1), ("last_stable_offset", 2**63 - 1)):
        with pytest.raises(StateTableInconsistentError, match="tampered") as raised:
            check_row("table", 3, dataclasses.replace(good, **{field: value}))
        assert (raised.value.table, raised.value.row) == ("table", 3)


def test_a_client_maps_the_table_read_only_and_only_the_doorbells_writable(table_name):
    with PartitionStateTable.create(table_name, 2) as table, \
            PartitionStateTable.attach(table_name) as reader:
        assert not reader.rows.flags.writeable and not reader.control.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            reader.rows[0] = 1
        reader.appender_doorbell.ring()                   # a producer's one write
        assert table.appender_doorbell.sequence == 1
        assert os.path.exists(f"/dev/shm/{bells_name(table_name)}")
    unlink_table(table_name)
    assert not os.path.exists(f"/dev/shm/{bells_name(table_name)}")
