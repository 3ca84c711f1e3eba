"""The Fetch response (versions 4-12), written by hand: small header pieces packed
here, each partition's record batches passed through as buffers, never joined.

Rules
-----
* The result is a list of buffers for ``sendmsg``, the 4-byte size first; the
  record buffers given are in it as given (the same objects: nothing copied here).
* Per partition a handful of packs; nothing per record.
* v4 has the last stable offset and the aborted transactions, v5 the log start
  offset, v7 the top-level error code and fetch session id, v11 the preferred read
  replica; v12 is flexible (compact arrays, strings and bytes, tagged fields, and
  the response header's tagged fields).

Theory of operation
-------------------
Kafka's ``FetchResponse`` schema, field by field, for the versions served. A
partition's records field is nullable bytes: its length (v12: the length plus one
as an unsigned varint), then the batches back to back.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Sequence

__all__ = ["FetchedPartition", "encode_fetch_response"]

FLEXIBLE_FROM = 12
_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_PARTITION = struct.Struct(">ihqqq")        # index, error, HW, LSO, log start (v5+)
_PARTITION_V4 = struct.Struct(">ihqq")      # index, error, HW, LSO
_ABORTED = struct.Struct(">qq")


@dataclasses.dataclass
class FetchedPartition:
    """One partition's answer: its records are whole batches as buffers."""
    partition: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] | None = None    # (producer id, first offset)
    records: Sequence = ()
    preferred_read_replica: int = -1

    @property
    def records_size(self) -> int:
        return sum(len(buffer) for buffer in self.records)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _array_length(count: int, flexible: bool) -> bytes:
    return _uvarint(count + 1) if flexible else _I32.pack(count)


def _string(text: str, flexible: bool) -> bytes:
    data = text.encode()
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def encode_fetch_response(version: int, correlation_id: int,
                          topics: list[tuple[str, list[FetchedPartition]]], *,
                          error_code: int = 0, session_id: int = 0,
                          throttle_time_ms: int = 0) -> list:
    """The framed response: [size, header and fields..., records..., ...]."""
    flexible = version >= FLEXIBLE_FROM
    buffers: list = [b""]                           # the size, once known
    head = bytearray(_I32.pack(correlation_id))
    if flexible:
        head += b"\x00"                             # the response header's tagged fields
    head += _I32.pack(throttle_time_ms)
    if version >= 7:
        head += _I16.pack(error_code) + _I32.pack(session_id)
    head += _array_length(len(topics), flexible)
    for name, partitions in topics:
        head += _string(name, flexible) + _array_length(len(partitions), flexible)
        for answer in partitions:
            head += _partition_fields(version, answer, flexible)
            size = answer.records_size
            head += _uvarint(size + 1) if flexible else _I32.pack(size)
            buffers.append(bytes(head))
            buffers.extend(buffer for buffer in answer.records if len(buffer))
            head = bytearray(b"\x00" if flexible else b"")   # the partition's tagged fields
        if flexible:
            head += b"\x00"                          # the topic's tagged fields
    if flexible:
        head += b"\x00"                              # the response's tagged fields
    buffers.append(bytes(head))
    buffers[0] = _I32.pack(sum(len(buffer) for buffer in buffers[1:]))
    return buffers


def _partition_fields(version: int, answer: FetchedPartition, flexible: bool) -> bytes:
    """A partition's fields before its records."""
    if version >= 5:
        fields = _PARTITION.pack(answer.partition, answer.error_code, answer.high_watermark,
                                 answer.last_stable_offset, answer.log_start_offset)
    else:
        fields = _PARTITION_V4.pack(answer.partition, answer.error_code,
                                    answer.high_watermark, answer.last_stable_offset)
    if answer.aborted is None:
        fields += _uvarint(0) if flexible else _I32.pack(-1)
    else:
        fields += _array_length(len(answer.aborted), flexible) + b"".join(
            _ABORTED.pack(producer_id, first) + (b"\x00" if flexible else b"")
            for producer_id, first in answer.aborted)
    if version >= 11:
        fields += _I32.pack(answer.preferred_read_replica)
    return fields
