"""The Fetch response (versions 4-12), written by hand: small header pieces packed
here, each partition's record batches passed through as buffers, never joined.

Rules
-----
* The result is a list of buffers for ``sendmsg``, the 4-byte size first (in the
  first piece); written in order, they are one framed response. Every record buffer
  given is in it as given: the same object, in order, nothing copied or joined here.
* Per partition a handful of ``struct`` packs into the current ``bytearray``;
  nothing per record, nothing per batch but passing its buffer on.
* Versions 4-12, the ones that name topics by name (v13 names them by id): v4 has
  the last stable offset and the aborted transactions, v5 the log start offset, v7
  the top-level error code and fetch session id, v11 the preferred read replica; v12
  is flexible (response header v1 with its tagged fields, compact arrays, strings
  and bytes, whose lengths are unsigned varints of the length plus one, and an empty
  tagged-field section closing every structure). v12's tagged fields of a partition
  (diverging epoch, current leader, snapshot id) are never written.
* A partition's records are Kafka's nullable bytes: ``None`` is null, no buffers
  (the default) zero bytes, what Kafka sends a partition with nothing new or an
  error. Their length is counted in bytes (``nbytes``: a buffer's ``len`` counts
  items, not bytes, for any buffer but a flat one of bytes, and one wrong length
  would tear the frame for every response after it on the connection).

Theory of operation
-------------------
Kafka's ``FetchResponse`` schema, field by field, for the versions served. The
encoder walks topics and partitions once, appending to one ``bytearray``; at a
partition with record buffers it closes that piece into the output, puts the buffers
after it untouched, and opens a new piece for what follows (v12's tagged fields, the
next partition). So a response is ``2 + 2 x partitions with records`` pieces at most
(the socket server writes them ``KAFKA_SEND_BUFFERS_MAX`` at a time), whatever the
number of partitions without records. The size prefix is reserved in the first piece
and packed last, from the bytes counted on the way.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Sequence

from ..common.errors import LocalProtocolError

__all__ = ["FetchedPartition", "encode_fetch_response", "VERSIONS"]

VERSIONS = range(4, 13)                      # v4: Kafka 4.0's baseline; v13: topic ids
FLEXIBLE_FROM = 12
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_TOP_V7 = struct.Struct(">ihi")              # throttle time, error code, session id
_PARTITION = struct.Struct(">ihqqq")         # index, error, HW, LSO, log start (v5+)
_PARTITION_V4 = struct.Struct(">ihqq")       # index, error, HW, LSO
_ABORTED = struct.Struct(">qq")              # producer id, first offset
_NULL = b"\xff\xff\xff\xff"                  # a null array or bytes: length -1
_COMPACT_NULL = b"\x00"                      # ... compact: length + 1 = 0
_NO_TAGS = b"\x00"                           # an empty tagged-field section


@dataclasses.dataclass
class FetchedPartition:
    """One partition's answer: its records are whole batches as buffers (``None``:
    null records); ``aborted`` is ``(producer id, first offset)`` pairs or ``None``
    (null: a read_uncommitted fetch)."""
    partition: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] | None = None
    records: Sequence | None = ()
    preferred_read_replica: int = -1

    @property
    def records_size(self) -> int:
        """The records' length in bytes (0 for null records)."""
        return sum(memoryview(buffer).nbytes for buffer in self.records or ())


def encode_fetch_response(version: int, correlation_id: int,
                          topics: Sequence[tuple[str, Sequence[FetchedPartition]]], *,
                          error_code: int = 0, session_id: int = 0,
                          throttle_time_ms: int = 0) -> list:
    """The framed response: ``[size, header and fields, records..., fields, ...]``.

    ``error_code`` and ``session_id`` are written from v7 (before it they do not
    exist).

    Raises
    ------
    LocalProtocolError
        ``version`` is outside 4-12.
    """
    if version not in VERSIONS:
        raise LocalProtocolError(
            f"Fetch response v{version} is not written here: only v{VERSIONS.start}-"
            f"v{VERSIONS.stop - 1} (v13 and later name topics by id); answer the request "
            f"UNSUPPORTED_VERSION")
    flexible = version >= FLEXIBLE_FROM
    head = bytearray(4)                               # the size, packed last
    head += _I32.pack(correlation_id)
    if flexible:
        head += _NO_TAGS                              # the response header's tagged fields
    head += (_TOP_V7.pack(throttle_time_ms, error_code, session_id) if version >= 7
             else _I32.pack(throttle_time_ms))
    _array_length(head, len(topics), flexible)
    buffers: list = []
    size = 0
    for name, partitions in topics:
        _string(head, name, flexible)
        _array_length(head, len(partitions), flexible)
        for answer in partitions:
            records_size = _partition_fields(head, version, answer, flexible)
            if answer.records:
                buffers.append(head)
                buffers.extend(answer.records)
                size += len(head) + records_size
                head = bytearray()
            if flexible:
                head += _NO_TAGS                      # the partition's tagged fields
        if flexible:
            head += _NO_TAGS                          # the topic's tagged fields
    if flexible:
        head += _NO_TAGS                              # the response's tagged fields
    buffers.append(head)
    size += len(head)
    _I32.pack_into(buffers[0], 0, size - 4)
    return buffers


def _partition_fields(head: bytearray, version: int, answer: FetchedPartition,
                      flexible: bool) -> int:
    """A partition's fields up to its records' length, appended to ``head``; returns
    the records' size in bytes."""
    if version >= 5:
        head += _PARTITION.pack(answer.partition, answer.error_code, answer.high_watermark,
                                answer.last_stable_offset, answer.log_start_offset)
    else:
        head += _PARTITION_V4.pack(answer.partition, answer.error_code,
                                   answer.high_watermark, answer.last_stable_offset)
    if answer.aborted is None:
        head += _COMPACT_NULL if flexible else _NULL
    else:
        _array_length(head, len(answer.aborted), flexible)
        for producer_id, first_offset in answer.aborted:
            head += _ABORTED.pack(producer_id, first_offset)
            if flexible:
                head += _NO_TAGS                      # the aborted transaction's tags
    if version >= 11:
        head += _I32.pack(answer.preferred_read_replica)
    if answer.records is None:
        head += _COMPACT_NULL if flexible else _NULL
        return 0
    records_size = answer.records_size
    if flexible:
        _uvarint(head, records_size + 1)
    else:
        head += _I32.pack(records_size)
    return records_size


def _array_length(head: bytearray, count: int, flexible: bool) -> None:
    if flexible:
        _uvarint(head, count + 1)
    else:
        head += _I32.pack(count)


def _string(head: bytearray, text: str, flexible: bool) -> None:
    data = text.encode()
    if flexible:
        _uvarint(head, len(data) + 1)
    else:
        head += _I16.pack(len(data))
    head += data


def _uvarint(head: bytearray, value: int) -> None:
    """Kafka's unsigned varint: 7 bits a byte, the low ones first, the high bit set
    on every byte but the last."""
    while value >= 0x80:
        head.append((value & 0x7F) | 0x80)
        value >>= 7
    head.append(value)
