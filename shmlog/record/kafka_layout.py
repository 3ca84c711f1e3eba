"""Kafka's record batch, magic 2 (``DefaultRecordBatch``): where each header field
sits, and what shmlog's record fields take (``kafka_batches`` converts between them).

::

      0 baseOffset int64          27 baseTimestamp int64      53 baseSequence int32
      8 batchLength int32         35 maxTimestamp int64       57 recordsCount int32
     12 partitionLeaderEpoch i32  43 producerId int64         61 records ...
     16 magic int8 (2)            51 producerEpoch int16
     17 crc uint32 (CRC32C of attributes .. end)
     21 attributes int16
     23 lastOffsetDelta int32

All big-endian. ``batchLength`` counts the bytes after itself. A record is a zigzag
varint length, then attributes (int8), timestampDelta (varlong), offsetDelta,
keyLength (-1: null), key, valueLength (-1: null), value, headersCount, and per
header keyLength, key, valueLength (-1: null), value, each length a zigzag varint.
Attributes: bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3
timestamp type (1: LogAppendTime), bit 4 transactional, bit 5 control.
"""

from __future__ import annotations

K_BASE_OFFSET = 0
K_LENGTH = 8                 # counts the bytes after itself
K_LEADER_EPOCH = 12
K_MAGIC = 16
K_CRC = 17
K_ATTRIBUTES = 21            # the CRC covers from here to the end
K_LAST_OFFSET_DELTA = 23
K_BASE_TIMESTAMP = 27
K_MAX_TIMESTAMP = 35
K_PRODUCER_ID = 43
K_PRODUCER_EPOCH = 51
K_BASE_SEQUENCE = 53
K_RECORD_COUNT = 57
KAFKA_HEADER_LENGTH = 61
K_LENGTH_OVERHEAD = 12       # base offset and length: not counted by the length
KAFKA_MAGIC = 2
K_CODEC_MASK = 0x07
K_GZIP, K_SNAPPY, K_LZ4, K_ZSTD = 1, 2, 3, 4
K_TIMESTAMP_TYPE_BIT = 0x08
K_TRANSACTIONAL_BIT = 0x10
K_CONTROL_BIT = 0x20
# shmlog's record: length, offset delta, timestamp delta, key and value lengths,
# header count; a header entry: key and value lengths.
RECORD_FIXED = 28
HEADER_FIXED = 8
