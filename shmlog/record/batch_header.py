"""A batch's header as Python reads it: :class:`BatchInfo` (its fields, read by
:func:`batch_info` from validated bytes) and :class:`Compression` (its codec).

Rules
-----
* :func:`batch_info` trusts its bytes: call it only on a batch that passed
  ``validation.check_batch`` (or was just encoded here).
* The byte layout is ``batch_layout``'s; this module only names what Python code
  reads from it (offsets, codec, timestamp type, control bit).
* :func:`offset_span` reads lengths it does not trust (it runs before the log
  validates an entry): a length that cannot be a batch's ends its walk, never loops.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from ..common.errors import LocalProtocolError
from . import batch_layout as L

__all__ = ["Compression", "BatchInfo", "batch_info", "offset_span"]


class Compression(enum.Enum):
    NONE = L.CODEC_NONE
    ZSTD = L.CODEC_ZSTD

    @classmethod
    def parse(cls, value) -> "Compression":
        """Accept None, "none", "uncompressed", "zstd" or a member."""
        if value is None or isinstance(value, Compression):
            return value or cls.NONE
        names = {"none": cls.NONE, "uncompressed": cls.NONE, "zstd": cls.ZSTD}
        try:
            return names[str(value).lower()]
        except KeyError:
            raise LocalProtocolError(
                f"compression {value!r} is not supported; use None or 'zstd'") from None


class BatchInfo(NamedTuple):
    """The header of one batch, as Python values."""
    position: int
    batch_length: int
    base_offset: int
    leader_epoch: int
    crc: int
    attributes: int
    producer_epoch: int
    record_count: int
    last_offset_delta: int
    base_sequence: int
    producer_id: int
    first_timestamp: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & L.CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        return (L.TIMESTAMP_LOG_APPEND_TIME if self.attributes & L.TIMESTAMP_TYPE_BIT
                else L.TIMESTAMP_CREATE_TIME)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & L.CONTROL_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & L.TRANSACTIONAL_BIT)


def batch_info(buffer: np.ndarray, position: int) -> BatchInfo:
    """Read the header at ``position`` (the caller has validated the batch)."""
    header = buffer[position:position + L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)[0]
    return BatchInfo(position, int(header["batch_length"]), int(header["base_offset"]),
                     int(header["leader_epoch"]), int(header["crc"]), int(header["attributes"]),
                     int(header["producer_epoch"]), int(header["record_count"]),
                     int(header["last_offset_delta"]), int(header["base_sequence"]),
                     int(header["producer_id"]), int(header["first_timestamp"]),
                     int(header["max_timestamp"]))


def offset_span(buffer: np.ndarray) -> int:
    """How many offsets the batches back to back in ``buffer`` take, each its last
    offset delta + 1: one batch's, or a Kafka client's batch stored in pieces
    (``kafka_batches.from_kafka``), whose sequences run on as its offsets do, so
    the span also counts the sequences the client's batch used. The walk stops at
    a length that cannot be a whole batch (unvalidated bytes: the log refuses them)."""
    span = position = 0
    while position + L.HEADER_LENGTH <= buffer.size:
        header = buffer[position:position + L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)[0]
        length = int(header["batch_length"])
        if length < L.HEADER_LENGTH or position + length > buffer.size:
            break
        span += int(header["last_offset_delta"]) + 1
        position += length
    return span
