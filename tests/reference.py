"""Slow, obviously correct reference implementations that the kernels are checked against.

Rules
-----
* Nothing here imports shmlog. The record batch layout and the ring entry header are
  written out again from the diagrams in ``shmlog/record/batch_layout.py`` and
  ``shmlog/shm/ring_layout.py`` as ``struct`` formats, so a wrong offset in
  the layout module or the kernels shows up as a mismatch instead of being shared.
* Speed does not matter; each function does the plainest thing that is right:
  a bit-at-a-time CRC, ``struct.pack`` per field, ``bytes`` concatenation.

Theory of operation
-------------------
:func:`reference_encode` builds a batch in three layers, each public so that tests
can craft malformed batches at any layer: :func:`encode_record` packs one record,
the records are concatenated (and, for zstd, compressed as one frame), and
:func:`build_batch` prepends the 64-byte header with a CRC32C over everything from
``attributes`` to the end. :func:`reference_decode` walks batches back to back and
checks every length, the magic, the version and the CRC on the way, raising
``ValueError`` on anything it does not expect.
"""

from __future__ import annotations

import struct

import zstandard

# --- CRC32C -------------------------------------------------------------------------

CRC32C_POLYNOMIAL_REFLECTED = 0x82F63B78


def reference_crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of ``data``, one bit at a time; ``crc`` continues an earlier result."""
    register = crc ^ 0xFFFFFFFF
    for byte in bytes(data):
        register ^= byte
        for _ in range(8):
            if register & 1:
                register = (register >> 1) ^ CRC32C_POLYNOMIAL_REFLECTED
            else:
                register >>= 1
    return register ^ 0xFFFFFFFF


# --- layout, restated from the diagram -------------------------------------------------

# batch_length u32, magic u16, version u8, reserved u8, base_offset i64, leader_epoch i32,
# crc u32 | attributes u16, producer_epoch i16, record_count i32, last_offset_delta i32,
# base_sequence i32, producer_id i64, first_timestamp i64, max_timestamp i64
BATCH_PREFIX = struct.Struct("<IHBBqiI")          # the fields in front of the CRC'd region
BATCH_COVERED = struct.Struct("<Hhiiiqqq")
BATCH_HEADER_SIZE = BATCH_PREFIX.size + BATCH_COVERED.size
CRC_POSITION = 20                                  # the u32 right before the CRC'd region
CRC_COVERED_POSITION = BATCH_PREFIX.size
# record_length u32, offset_delta u32, timestamp_delta i64, key_length i32,
# value_length i32, header_count u32
RECORD_HEADER = struct.Struct("<IIqiiI")
# key_length u32, value_length i32
HEADER_ENTRY = struct.Struct("<Ii")

BATCH_MAGIC = 0x4C53                               # b"SL"
BATCH_VERSION = 1
CODEC_NONE = 0
CODEC_ZSTD = 4
LOG_APPEND_TIME_BIT = 0x08
CONTROL_BIT = 0x10
NULL = -1

assert BATCH_HEADER_SIZE == 64
assert CRC_COVERED_POSITION == 24
assert RECORD_HEADER.size == 28
assert HEADER_ENTRY.size == 8
assert struct.pack("<H", BATCH_MAGIC) == b"SL"

# --- ring entries (shmlog/shm/ring_layout.py) ----------------------------------------------

# entry_length u32, row u32, entry_number u64, topic_key i64, partition u32, reserved u32
RING_ENTRY_HEADER = struct.Struct("<IIQqII")
RING_ENTRY_ALIGNMENT = 8

assert RING_ENTRY_HEADER.size == 32


def reference_ring_entry(row: int, entry_number: int, topic_key: int, partition: int,
                         payload: bytes) -> bytes:
    """One ring entry as it sits in the data region, padded to the next multiple of 8."""
    entry = RING_ENTRY_HEADER.pack(RING_ENTRY_HEADER.size + len(payload), row, entry_number,
                                   topic_key, partition, 0) + payload
    return entry + bytes(-len(entry) % RING_ENTRY_ALIGNMENT)


def _length(field: bytes | None) -> int:
    return NULL if field is None else len(field)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers) -> bytes:
    """One record: its 28-byte header, key, value, then each header entry."""
    body = (key or b"") + (value or b"")
    for name, header_value in headers:
        name_bytes = name.encode() if isinstance(name, str) else bytes(name)
        body += HEADER_ENTRY.pack(len(name_bytes), _length(header_value))
        body += name_bytes + (header_value or b"")
    record_length = RECORD_HEADER.size + len(body)
    return RECORD_HEADER.pack(record_length, offset_delta, timestamp_delta, _length(key),
                              _length(value), len(headers)) + body


def compress_zstd(records_region: bytes) -> bytes:
    """The zstd frame the format expects: level 3, content size in the frame header."""
    return zstandard.ZstdCompressor(level=3).compress(records_region)


def build_batch(records_region: bytes, *, record_count: int, last_offset_delta: int,
                first_timestamp: int, max_timestamp: int, attributes: int = 0,
                base_offset: int = 0, leader_epoch: int = 0, producer_id: int = -1,
                producer_epoch: int = -1, base_sequence: int = -1, magic: int = BATCH_MAGIC,
                version: int = BATCH_VERSION, reserved: int = 0, crc: int | None = None) -> bytes:
    """A batch around ``records_region`` (already compressed if ``attributes`` say so).

    Every field can be set, so tests can build batches that are wrong in exactly one
    way; ``crc`` defaults to the correct CRC32C of the covered region.
    """
    covered = BATCH_COVERED.pack(attributes, producer_epoch, record_count, last_offset_delta,
                                 base_sequence, producer_id, first_timestamp,
                                 max_timestamp) + records_region
    if crc is None:
        crc = reference_crc32c(covered)
    batch_length = BATCH_HEADER_SIZE + len(records_region)
    return BATCH_PREFIX.pack(batch_length, magic, version, reserved, base_offset,
                             leader_epoch, crc) + covered


def reference_encode(records, *, base_offset: int = 0, compression: str | None = None,
                     producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                     control: bool = False, log_append_time: bool = False,
                     leader_epoch: int = 0) -> bytes:
    """Encode ``records``, a non-empty list of (timestamp, key, value, headers).

    ``headers`` is a list of (str, bytes | None). The first record's timestamp is the
    batch's ``first_timestamp``; every record stores its timestamp relative to it.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    first_timestamp = records[0][0]
    max_timestamp = max(record[0] for record in records)
    region = b"".join(
        encode_record(index, timestamp - first_timestamp, key, value, headers)
        for index, (timestamp, key, value, headers) in enumerate(records))
    attributes = 0
    if compression == "zstd":
        region = compress_zstd(region)
        attributes |= CODEC_ZSTD
    elif compression is not None:
        raise ValueError(f"unknown compression {compression!r}")
    if log_append_time:
        attributes |= LOG_APPEND_TIME_BIT
    if control:
        attributes |= CONTROL_BIT
    return build_batch(region, record_count=len(records), last_offset_delta=len(records) - 1,
                       first_timestamp=first_timestamp, max_timestamp=max_timestamp,
                       attributes=attributes, base_offset=base_offset,
                       leader_epoch=leader_epoch, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence)


def with_crc(batch: bytes) -> bytes:
    """``batch`` with its CRC field recomputed over the covered region (as a forger would)."""
    batch = bytes(batch)
    crc = reference_crc32c(batch[CRC_COVERED_POSITION:])
    return batch[:CRC_POSITION] + struct.pack("<I", crc) + batch[CRC_COVERED_POSITION:]


# --- decoding -------------------------------------------------------------------------

def reference_batch_frame(data: bytes, position: int, end: int) -> tuple[str, int]:
    """The documented framing of the batch at ``position`` in ``data[:end]``:
    (status name, length as read): a zero length ends the data, a length shorter
    than a header is bad, a batch (or header) past ``end`` is truncated."""
    available = end - position
    if available < 4:
        return "TRUNCATED", 0
    (length,) = struct.unpack_from("<I", data, position)
    if length == 0:
        return "END_OF_DATA", 0
    if available < BATCH_HEADER_SIZE:
        return "TRUNCATED", length
    if length < BATCH_HEADER_SIZE:
        return "BAD_LENGTH", length
    if length > available:
        return "TRUNCATED", length
    return "OK", length


def _take(data: bytes, position: int, length: int, what: str) -> bytes:
    if length < 0 or position + length > len(data):
        raise ValueError(f"{what}: {length} bytes at {position} run past {len(data)}")
    return data[position:position + length]


def _decode_records(region: bytes, base_offset: int, first_timestamp: int,
                    batch_timestamp: int | None, record_count: int) -> list:
    records = []
    position = 0
    while position < len(region):
        (record_length, offset_delta, timestamp_delta, key_length, value_length,
         header_count) = RECORD_HEADER.unpack(
            _take(region, position, RECORD_HEADER.size, "record header"))
        record = _take(region, position, record_length, "record")
        field = RECORD_HEADER.size
        key = None if key_length == NULL else _take(record, field, key_length, "key")
        field += max(key_length, 0)
        value = None if value_length == NULL else _take(record, field, value_length, "value")
        field += max(value_length, 0)
        headers = []
        for _ in range(header_count):
            name_length, header_value_length = HEADER_ENTRY.unpack(
                _take(record, field, HEADER_ENTRY.size, "header entry"))
            field += HEADER_ENTRY.size
            name = _take(record, field, name_length, "header name").decode()
            field += name_length
            header_value = (None if header_value_length == NULL
                            else _take(record, field, header_value_length, "header value"))
            field += max(header_value_length, 0)
            headers.append((name, header_value))
        if field != record_length:
            raise ValueError(f"record at {position}: fields end at {field}, "
                             f"record_length is {record_length}")
        timestamp = (first_timestamp + timestamp_delta if batch_timestamp is None
                     else batch_timestamp)
        records.append((base_offset + offset_delta, timestamp, key, value, headers))
        position += record_length
    if len(records) != record_count:
        raise ValueError(f"{len(records)} records, header says {record_count}")
    return records


def reference_decode(batch_bytes: bytes) -> list:
    """Decode batches laid back to back into (offset, timestamp, key, value, headers).

    With LogAppendTime set, every record's timestamp is the batch's ``max_timestamp``
    (Kafka's rule). Raises ``ValueError`` on any structural problem or CRC mismatch.
    """
    data = bytes(batch_bytes)
    records = []
    position = 0
    while position < len(data):
        prefix = _take(data, position, BATCH_HEADER_SIZE, "batch header")
        batch_length, magic, version, reserved, base_offset, _epoch, crc = \
            BATCH_PREFIX.unpack(prefix[:BATCH_PREFIX.size])
        (attributes, _producer_epoch, record_count, _last_offset_delta, _base_sequence,
         _producer_id, first_timestamp, max_timestamp) = BATCH_COVERED.unpack(
            prefix[BATCH_PREFIX.size:])
        if magic != BATCH_MAGIC or version != BATCH_VERSION or reserved != 0:
            raise ValueError(f"batch at {position}: magic {magic:#x} version {version}")
        if batch_length < BATCH_HEADER_SIZE:
            raise ValueError(f"batch at {position}: length {batch_length}")
        batch = _take(data, position, batch_length, "batch")
        actual = reference_crc32c(batch[CRC_COVERED_POSITION:])
        if actual != crc:
            raise ValueError(f"batch at {position}: crc {actual:#x}, header says {crc:#x}")
        region = batch[BATCH_HEADER_SIZE:]
        codec = attributes & 0x07
        if codec == CODEC_ZSTD:
            region = zstandard.ZstdDecompressor().decompress(region)
        elif codec != CODEC_NONE:
            raise ValueError(f"batch at {position}: codec {codec}")
        batch_timestamp = max_timestamp if attributes & LOG_APPEND_TIME_BIT else None
        records += _decode_records(region, base_offset, first_timestamp, batch_timestamp,
                                   record_count)
        position += batch_length
    return records
