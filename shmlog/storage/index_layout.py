"""Offset index and time index entry layouts, version 1.

Each segment ``<base offset>.log`` has two sparse indexes beside it, as in Kafka.
Both are arrays of fixed-size little-endian entries, preallocated (sparse) to
``segment.index.bytes`` while the segment is active and trimmed to their used
length when it is closed. Entries are appended at most once every
``index.interval.bytes`` of log, so an index costs a few bytes per 4 KiB of data.

Offset index (``.index``): "the batch whose base offset is ``base + relative_offset``
starts at byte ``position`` of the log"::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                   relative_offset (u32)                       |
    +---------------------------------------------------------------+
  4 |                       position (u32)                          |
    +---------------------------------------------------------------+

Time index (``.timeindex``): "every record at or before offset
``base + relative_offset`` has a timestamp <= ``timestamp``"; the timestamp is the
running maximum of the segment, so entries are non-decreasing in both fields::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                                                               |
    +                       timestamp (i64)                         +
  4 |                                                               |
    +---------------------------------------------------------------+
  8 |                   relative_offset (u32)                       |
    +---------------------------------------------------------------+

Neither file has a header: both are derived data. An index that fails its sanity
check (length not a whole number of entries, entries not increasing, positions
past the end of the log) is rebuilt from the log, never trusted.
"""

from __future__ import annotations

import numpy as np

from ..common import limits

OFFSET_ENTRY_RELATIVE_OFFSET_OFFSET = 0
OFFSET_ENTRY_RELATIVE_OFFSET_SIZE = 4
OFFSET_ENTRY_POSITION_OFFSET = (OFFSET_ENTRY_RELATIVE_OFFSET_OFFSET
                                + OFFSET_ENTRY_RELATIVE_OFFSET_SIZE)
OFFSET_ENTRY_POSITION_SIZE = 4
OFFSET_ENTRY_LENGTH = OFFSET_ENTRY_POSITION_OFFSET + OFFSET_ENTRY_POSITION_SIZE

TIME_ENTRY_TIMESTAMP_OFFSET = 0
TIME_ENTRY_TIMESTAMP_SIZE = 8
TIME_ENTRY_RELATIVE_OFFSET_OFFSET = TIME_ENTRY_TIMESTAMP_OFFSET + TIME_ENTRY_TIMESTAMP_SIZE
TIME_ENTRY_RELATIVE_OFFSET_SIZE = 4
TIME_ENTRY_LENGTH = TIME_ENTRY_RELATIVE_OFFSET_OFFSET + TIME_ENTRY_RELATIVE_OFFSET_SIZE

OFFSET_INDEX_DTYPE = np.dtype([("relative_offset", "<u4"), ("position", "<u4")])
TIME_INDEX_DTYPE = np.dtype([("timestamp", "<i8"), ("relative_offset", "<u4")])

# Relative offsets and positions are u32, so a segment spans at most 2**32 - 1
# offsets and 2**31 - 1 bytes (Kafka's segment.bytes is an int for the same reason).
RELATIVE_OFFSET_MAX = 2**32 - 1
POSITION_MAX = 2**31 - 1

LOG_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"      # aborted transactions (transaction_index_layout)
FILE_NAME_DIGITS = 20                 # zero-padded base offset, as in Kafka

assert OFFSET_INDEX_DTYPE.itemsize == OFFSET_ENTRY_LENGTH == 8
assert TIME_INDEX_DTYPE.itemsize == TIME_ENTRY_LENGTH == 12
assert limits.SEGMENT_SIZE_MAX == POSITION_MAX, "a segment's positions fit the offset index"
assert limits.INDEX_SIZE_MIN == 4 * TIME_ENTRY_LENGTH, "an index holds at least four entries"
assert OFFSET_INDEX_DTYPE.fields["position"][1] == OFFSET_ENTRY_POSITION_OFFSET
assert TIME_INDEX_DTYPE.fields["relative_offset"][1] == TIME_ENTRY_RELATIVE_OFFSET_OFFSET


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for base offset 42."""
    assert 0 <= base_offset < 10**FILE_NAME_DIGITS
    return f"{base_offset:0{FILE_NAME_DIGITS}d}{suffix}"
