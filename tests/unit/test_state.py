"""The partition state table in one process: rows round-trip, claiming and
freeing, bounds and header checks.

Method: real POSIX shared memory, unlinked at teardown (and checked gone).
"""

from __future__ import annotations

import os
import uuid

import pytest

from shmlog.common.errors import LocalProtocolError, PeerProtocolError, ShmlogError
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, topic_key


@pytest.fixture
def table_name():
    name = f"shmlog-test-state-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    shared_memory.unlink(name)
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
