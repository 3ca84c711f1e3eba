"""Record batch layout, version 1: the unit of the log, the ring and the wire.

A batch is a 64-byte header followed by its records. All integers are
little-endian; fields may sit at any byte position (batches are packed back to
back in a segment, with no padding between them).

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                     batch_length (u32)                        |
    +-------------------------------+---------------+---------------+
  4 |          magic (u16)          | version (u8)  | reserved (u8) |
    +-------------------------------+---------------+---------------+
  8 |                                                               |
    +                      base_offset (i64)                        +
 12 |                                                               |
    +---------------------------------------------------------------+
 16 |                     leader_epoch (i32)                        |
    +---------------------------------------------------------------+
 20 |                         crc (u32)                             |
    +===============================+===============================+ <- CRC from here
 24 |       attributes (u16)        |     producer_epoch (i16)      |
    +-------------------------------+-------------------------------+
 28 |                     record_count (i32)                        |
    +---------------------------------------------------------------+
 32 |                   last_offset_delta (i32)                     |
    +---------------------------------------------------------------+
 36 |                     base_sequence (i32)                       |
    +---------------------------------------------------------------+
 40 |                      producer_id (i64)                        |
    +                                                               +
    +---------------------------------------------------------------+
 48 |                    first_timestamp (i64)                      |
    +                                                               +
    +---------------------------------------------------------------+
 56 |                     max_timestamp (i64)                       |
    +                                                               +
    +===============================================================+
 64 | records ... (or one zstd frame holding them)                  |
    +---------------------------------------------------------------+

* ``batch_length`` counts the whole batch, header included. In a segment file a
  zero length marks preallocated space that was never written: the end of the log.
* ``magic`` and ``version`` come right after the length so a reader rejects a
  foreign or future batch before trusting any other field.
* ``base_offset`` and ``leader_epoch`` are assigned by the log at append time, so
  they sit before the CRC and are not covered by it (as in Kafka). The CRC32C
  covers bytes ``[CRC_COVERED_OFFSET, batch_length)``: every other field and all
  records. A batch whose CRC does not match is torn or corrupt and is never served;
  recovery truncates the log at the first such batch of an unflushed segment.
* ``attributes``: bits 0-2 codec (0 none, 4 zstd: Kafka's numbering), bit 3
  timestamp type (1 = LogAppendTime), bit 4 control batch, bit 5 transactional (a
  batch of a transaction, or its end marker: ``control.py``). Other bits must be 0.
  (Kafka numbers the last two the other way round: ``kafka_layout``.)
* ``last_offset_delta`` is ``record_count - 1`` when written; compaction may drop
  records, so the next offset after a batch is ``base_offset + last_offset_delta + 1``
  and never depends on ``record_count``.
* ``producer_id`` -1 means "no idempotent producer".

Record (inside the records region, uncompressed; packed back to back)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                     record_length (u32)                       |
    +---------------------------------------------------------------+
  4 |                     offset_delta (u32)                        |
    +---------------------------------------------------------------+
  8 |                   timestamp_delta (i64)                       |
    +                                                               +
    +---------------------------------------------------------------+
 16 |                      key_length (i32)                         |
    +---------------------------------------------------------------+
 20 |                     value_length (i32)                        |
    +---------------------------------------------------------------+
 24 |                     header_count (u32)                        |
    +---------------------------------------------------------------+
 28 | key bytes | value bytes | header entries ...                  |
    +---------------------------------------------------------------+

* ``record_length`` counts the whole record, its header included; records fill the
  records region exactly.
* ``key_length`` / ``value_length`` of -1 mean null (a null value is a tombstone),
  distinct from 0 (empty).
* ``timestamp_delta`` is relative to the batch's ``first_timestamp``.

Header entry (``header_count`` of them after the value)::

  0 | key_length (u32) | 4 | value_length (i32, -1 = null) | 8 | key | value |
"""

from __future__ import annotations

import numpy as np

from ..common import limits

MAGIC = 0x4C53                       # "SL" read as little-endian bytes
VERSION = 1

# --- batch header ---------------------------------------------------------------
BATCH_LENGTH_OFFSET = 0
BATCH_LENGTH_SIZE = 4
MAGIC_OFFSET = BATCH_LENGTH_OFFSET + BATCH_LENGTH_SIZE
MAGIC_SIZE = 2
VERSION_OFFSET = MAGIC_OFFSET + MAGIC_SIZE
VERSION_SIZE = 1
RESERVED_OFFSET = VERSION_OFFSET + VERSION_SIZE
RESERVED_SIZE = 1
BASE_OFFSET_OFFSET = RESERVED_OFFSET + RESERVED_SIZE
BASE_OFFSET_SIZE = 8
LEADER_EPOCH_OFFSET = BASE_OFFSET_OFFSET + BASE_OFFSET_SIZE
LEADER_EPOCH_SIZE = 4
CRC_OFFSET = LEADER_EPOCH_OFFSET + LEADER_EPOCH_SIZE
CRC_SIZE = 4
ATTRIBUTES_OFFSET = CRC_OFFSET + CRC_SIZE
ATTRIBUTES_SIZE = 2
PRODUCER_EPOCH_OFFSET = ATTRIBUTES_OFFSET + ATTRIBUTES_SIZE
PRODUCER_EPOCH_SIZE = 2
RECORD_COUNT_OFFSET = PRODUCER_EPOCH_OFFSET + PRODUCER_EPOCH_SIZE
RECORD_COUNT_SIZE = 4
LAST_OFFSET_DELTA_OFFSET = RECORD_COUNT_OFFSET + RECORD_COUNT_SIZE
LAST_OFFSET_DELTA_SIZE = 4
BASE_SEQUENCE_OFFSET = LAST_OFFSET_DELTA_OFFSET + LAST_OFFSET_DELTA_SIZE
BASE_SEQUENCE_SIZE = 4
PRODUCER_ID_OFFSET = BASE_SEQUENCE_OFFSET + BASE_SEQUENCE_SIZE
PRODUCER_ID_SIZE = 8
FIRST_TIMESTAMP_OFFSET = PRODUCER_ID_OFFSET + PRODUCER_ID_SIZE
FIRST_TIMESTAMP_SIZE = 8
MAX_TIMESTAMP_OFFSET = FIRST_TIMESTAMP_OFFSET + FIRST_TIMESTAMP_SIZE
MAX_TIMESTAMP_SIZE = 8
HEADER_LENGTH = MAX_TIMESTAMP_OFFSET + MAX_TIMESTAMP_SIZE

CRC_COVERED_OFFSET = CRC_OFFSET + CRC_SIZE
RECORDS_OFFSET = HEADER_LENGTH

# --- attributes -------------------------------------------------------------------
CODEC_MASK = 0x07
CODEC_NONE = 0
CODEC_ZSTD = 4                        # Kafka's codec number for zstd
TIMESTAMP_TYPE_BIT = 0x08             # set: LogAppendTime; clear: CreateTime
CONTROL_BIT = 0x10
TRANSACTIONAL_BIT = 0x20
ATTRIBUTES_KNOWN_MASK = CODEC_MASK | TIMESTAMP_TYPE_BIT | CONTROL_BIT | TRANSACTIONAL_BIT

TIMESTAMP_CREATE_TIME = 0             # Kafka's timestampType values, as Spark shows them
TIMESTAMP_LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
PRODUCER_EPOCH_MAX = (1 << 15) - 1      # the field is an i16; then a new producer id
NO_SEQUENCE = -1
NO_TIMESTAMP = -1                     # Kafka's "no timestamp"; smaller values are invalid

# --- record -----------------------------------------------------------------------
RECORD_LENGTH_OFFSET = 0
RECORD_LENGTH_SIZE = 4
OFFSET_DELTA_OFFSET = RECORD_LENGTH_OFFSET + RECORD_LENGTH_SIZE
OFFSET_DELTA_SIZE = 4
TIMESTAMP_DELTA_OFFSET = OFFSET_DELTA_OFFSET + OFFSET_DELTA_SIZE
TIMESTAMP_DELTA_SIZE = 8
KEY_LENGTH_OFFSET = TIMESTAMP_DELTA_OFFSET + TIMESTAMP_DELTA_SIZE
KEY_LENGTH_SIZE = 4
VALUE_LENGTH_OFFSET = KEY_LENGTH_OFFSET + KEY_LENGTH_SIZE
VALUE_LENGTH_SIZE = 4
HEADER_COUNT_OFFSET = VALUE_LENGTH_OFFSET + VALUE_LENGTH_SIZE
HEADER_COUNT_SIZE = 4
RECORD_HEADER_LENGTH = HEADER_COUNT_OFFSET + HEADER_COUNT_SIZE

NULL_LENGTH = -1

# --- header entry -----------------------------------------------------------------
HEADER_KEY_LENGTH_OFFSET = 0
HEADER_KEY_LENGTH_SIZE = 4
HEADER_VALUE_LENGTH_OFFSET = HEADER_KEY_LENGTH_OFFSET + HEADER_KEY_LENGTH_SIZE
HEADER_VALUE_LENGTH_SIZE = 4
HEADER_ENTRY_LENGTH = HEADER_VALUE_LENGTH_OFFSET + HEADER_VALUE_LENGTH_SIZE

# A numpy mirror of the batch header, for tools that inspect batches from Python.
BATCH_HEADER_DTYPE = np.dtype([
    ("batch_length", "<u4"), ("magic", "<u2"), ("version", "u1"), ("reserved", "u1"),
    ("base_offset", "<i8"), ("leader_epoch", "<i4"), ("crc", "<u4"),
    ("attributes", "<u2"), ("producer_epoch", "<i2"), ("record_count", "<i4"),
    ("last_offset_delta", "<i4"), ("base_sequence", "<i4"), ("producer_id", "<i8"),
    ("first_timestamp", "<i8"), ("max_timestamp", "<i8"),
])

assert HEADER_LENGTH == 64, "the header is one cache line"
assert BATCH_HEADER_DTYPE.itemsize == HEADER_LENGTH
for _name in BATCH_HEADER_DTYPE.names:
    assert BATCH_HEADER_DTYPE.fields[_name][1] == globals()[_name.upper() + "_OFFSET"], _name
assert RECORD_HEADER_LENGTH == 28
assert limits.BATCH_SIZE_MIN == HEADER_LENGTH + RECORD_HEADER_LENGTH, \
    "limits.BATCH_SIZE_MIN is one header-only record's batch"
assert HEADER_ENTRY_LENGTH == 8
assert CODEC_NONE & ~CODEC_MASK == 0 and CODEC_ZSTD & ~CODEC_MASK == 0
