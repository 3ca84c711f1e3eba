"""The high-watermark checkpoint file (Kafka's replication-offset-checkpoint).

Goal: a replica hosted again starts from what was committed, never past its log;
the file round-trips, a damaged one is ignored (a lower start is safe), and a
snapshot equal to the last written costs no write.

Method: plain numbers for the start rule (``Partition.createLogIfNotExists`` with
``Log.updateHighWatermark``'s clamp); a real file in a temporary directory for the
rest.
"""

from __future__ import annotations

import json
import os

import pytest

from shmlog.cluster.replication.high_watermark_checkpoint import (
    CHECKPOINT_FILE,
    HighWatermarkCheckpoint,
    read_checkpoint,
    start_high_watermark,
)


@pytest.mark.parametrize("checkpointed, log_start, log_end, expected", [
    (None, 0, 100, 0),        # no entry: the log start (Kafka: 0, clamped to the log)
    (None, 40, 100, 40),
    (70, 0, 100, 70),         # the checkpointed HW
    (150, 0, 100, 100),       # past the log end (the log lost its unflushed tail): the end
    (10, 40, 100, 40),        # below the log start (retention since): the start
])
def test_a_replica_starts_at_its_checkpointed_high_watermark_kept_within_its_log(
        checkpointed, log_start, log_end, expected):
    assert start_high_watermark(checkpointed, log_start, log_end) == expected


def test_the_checkpoint_round_trips_through_its_file(tmp_path):
    checkpoint = HighWatermarkCheckpoint(str(tmp_path))
    assert checkpoint.checkpointed == {}
    checkpoint.write_soon({("orders", 0): 12, ("orders", 1): 0, ("a/b", 3): 5})
    checkpoint.close({("orders", 0): 15, ("orders", 1): 0, ("a/b", 3): 5})
    with open(os.path.join(tmp_path, CHECKPOINT_FILE)) as source:
        assert json.load(source) == {"orders/0": 15, "orders/1": 0, "a/b/3": 5}
    again = HighWatermarkCheckpoint(str(tmp_path))
    assert again.checkpointed == {("orders", 0): 15, ("orders", 1): 0, ("a/b", 3): 5}
    assert again.start("orders", 0, 0, 100) == 15
    assert again.start("orders", 7, 3, 100) == 3
    again.close({})


def test_an_unchanged_snapshot_is_not_written_again(tmp_path):
    path = os.path.join(tmp_path, CHECKPOINT_FILE)
    with open(path, "w") as target:
        target.write('{"t/0": 9}')
    before = os.stat(path).st_ino
    HighWatermarkCheckpoint(str(tmp_path)).close({("t", 0): 9})
    assert os.stat(path).st_ino == before, "the same snapshot: no rename"


@pytest.mark.parametrize("body", ["not json", "[1, 2]", ""])
def test_an_unreadable_file_is_ignored(tmp_path, body):
    path = os.path.join(tmp_path, CHECKPOINT_FILE)
    with open(path, "w") as target:
        target.write(body)
    assert read_checkpoint(path) == {}


def test_bad_entries_are_ignored_and_good_ones_kept(tmp_path):
    path = os.path.join(tmp_path, CHECKPOINT_FILE)
    with open(path, "w") as target:
        json.dump({"t/0": 4, "t/x": 1, "nopartition": 2, "t/1": -1, "t/2": "3",
                   "t/3": True, "u/1": 8}, target)
    assert read_checkpoint(path) == {("t", 0): 4, ("u", 1): 8}
