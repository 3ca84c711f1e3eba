"""Partition logs on a disk that fills up, run by ``test_segments.py`` in a child
process: on a full tmpfs a store past what was reserved is a SIGBUS, which must end
this process, not the test runner. Each scenario prints what it saw as JSON.

Usage: ``full_disk_child.py SCENARIO DISK SLACK CONFIG_JSON``; the partition lives
in ``DISK/partition`` and a ballast file leaves ``SLACK`` bytes free.
"""

from __future__ import annotations

import json
import os
import sys

from helpers import fill_disk, values_batch
from shmlog.common import limits
from shmlog.common.errors import StorageError
from shmlog.record.records import now_ms
from shmlog.segments import PartitionLog
from shmlog.storage.segment_state import (
    OFFSET_ENTRIES_WORD,
    OFFSET_RESERVED_WORD,
    POSITION_WORD,
    RESERVED_WORD,
    TIME_CAPACITY_WORD,
    TIME_ENTRIES_WORD,
    TIME_RESERVED_WORD,
)
from shmlog.storage.topic_config import TopicConfig

RECORDS_PER_BATCH = 40


def batch(seed: int):
    return values_batch(RECORDS_PER_BATCH, seed, size=100)


def reservations(segment) -> dict:
    """Per file: bytes stored, bytes the state says are reserved, bytes allocated
    on disk from the start (where the first hole is)."""
    state = segment.state
    closing = 1 if state[POSITION_WORD] else 0        # sealing writes a closing time entry
    stored = (int(state[POSITION_WORD]), int(state[OFFSET_ENTRIES_WORD]) * 8,
              min(int(state[TIME_ENTRIES_WORD]) + closing, int(state[TIME_CAPACITY_WORD])) * 12)
    reserved = (int(state[RESERVED_WORD]), int(state[OFFSET_RESERVED_WORD]),
                int(state[TIME_RESERVED_WORD]))
    files = {}
    for path, stored_size, reserved_size in zip(
            (segment.log_path, segment.offset_index_path, segment.time_index_path),
            stored, reserved):
        with open(path, "rb") as source:
            allocated = os.lseek(source.fileno(), 0, os.SEEK_HOLE)
        files[os.path.basename(path)] = (stored_size, reserved_size, allocated)
    return files


def fill_until_refused(partition_log, disk, slack) -> dict:
    """Append batches until one is refused."""
    ballast = fill_disk(disk, slack)
    appended, refusal = 0, None
    try:
        for seed in range(10_000):
            partition_log.append(batch(seed))
            appended += 1
    except StorageError as error:
        refusal = str(error)
    files = reservations(partition_log.active)
    partition_log.close()
    os.unlink(ballast)
    return {"batches": appended, "refusal": refusal, "files": files}


def flush_on_full_disk(partition_log, disk, slack) -> dict:
    """Append (each append flushes) where only the checkpoint finds the disk full."""
    partition_log.append(batch(0))               # reserves the whole (small) segment
    ballast = fill_disk(disk, slack)
    offset = partition_log.append(batch(1)).base_offset
    recovery_point = partition_log.recovery_point
    os.unlink(ballast)
    flushed = partition_log.maybe_flush(now_ms() + limits.FLUSH_RETRY_INTERVAL_MS)
    return {"offset": offset, "recovery_point_full": recovery_point, "flushed": flushed,
            "recovery_point": partition_log.recovery_point}


def close_on_full_disk(partition_log, disk, slack) -> dict:
    """Close a log of a few one-record batches (too few bytes for an index entry):
    sealing writes the first time-index entry, on a full disk."""
    for seed in range(5):
        partition_log.append(values_batch(1, seed))
    ballast = fill_disk(disk, slack)
    partition_log.close()
    os.unlink(ballast)
    return {"batches": 5, "released": not partition_log.segments}


SCENARIOS = {function.__name__: function
             for function in (fill_until_refused, flush_on_full_disk, close_on_full_disk)}


if __name__ == "__main__":
    scenario, disk, slack, config = sys.argv[1:]
    opened = PartitionLog(os.path.join(disk, "partition"),
                          TopicConfig.from_overrides(json.loads(config)))
    print(json.dumps(SCENARIOS[scenario](opened, disk, int(slack))))
