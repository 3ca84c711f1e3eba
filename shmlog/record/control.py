"""End-transaction markers: the control batches that close a transaction in each
partition it wrote to (Kafka's ``EndTransactionMarker``, KIP-98).

Rules
-----
* A marker is a batch with the control and transactional bits set
  (``batch_layout``), of one record, written under the transaction's producer id and
  epoch, with no sequence (``NO_SEQUENCE``): markers are the coordinator's, not the
  producer's, and take no place in its sequence.
* Its record's key and value are Kafka's bytes, big-endian as on Kafka's wire, so a
  Kafka client reading the batch (``kafka_batches.to_kafka``) finds what a Kafka broker
  writes:

  - key: ``version`` int16 (0), ``type`` int16 (:class:`ControlType`);
  - value: ``version`` int16 (0), ``coordinator_epoch`` int32. Kafka's readers ignore
    bytes past the fields of the version they know, and so does :func:`decode_marker`.

* A control batch whose type is not ABORT or COMMIT, or whose key or value is
  shorter than its fields, is refused with :class:`CorruptRecordError`: such a batch
  is no marker shmlog or Kafka writes.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

import numpy as np

from ..common.errors import CorruptRecordError
from ..native.jit import kernel, load_i32
from . import batch_layout as L
from .batch_header import batch_info
from .decoding import decode_records
from .encoding import encode_batch

__all__ = ["ControlType", "EndTransactionMarker", "encode_marker", "decode_marker",
           "control_record", "marker_type", "NOT_A_MARKER"]

_KEY = struct.Struct(">hh")              # version, type
_VALUE = struct.Struct(">hi")            # version, coordinator epoch
CONTROL_KEY_VERSION = 0
MARKER_VALUE_VERSION = 0
NOT_A_MARKER = -1                        # marker_type of a batch that is none
_TYPE_IN_KEY = 2                         # the type's place in the key (after the version)
_KEY_SIZE = _KEY.size                    # a constant to numba


class ControlType(enum.IntEnum):
    """A control record's type (Kafka's ``ControlRecordType``)."""
    ABORT = 0
    COMMIT = 1


_ABORT, _COMMIT = int(ControlType.ABORT), int(ControlType.COMMIT)   # constants to numba


@dataclasses.dataclass(frozen=True)
class EndTransactionMarker:
    """What a marker says: the transaction of ``producer_id`` at ``producer_epoch``
    ended, committed or aborted, by the coordinator of ``coordinator_epoch``."""
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int


def encode_marker(marker: EndTransactionMarker, timestamp_ms: int | None = None) -> np.ndarray:
    """The control batch that writes ``marker`` (base offset 0: the log assigns it).

    Raises
    ------
    LocalProtocolError
        The producer id or epoch cannot be a producer's (``encode_batch``'s checks).
    """
    kind = ControlType.COMMIT if marker.committed else ControlType.ABORT
    return encode_batch([_VALUE.pack(MARKER_VALUE_VERSION, marker.coordinator_epoch)],
                        keys=[_KEY.pack(CONTROL_KEY_VERSION, kind)], timestamp_ms=timestamp_ms,
                        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
                        control=True, transactional=True)


def decode_marker(batch: np.ndarray, position: int = 0) -> EndTransactionMarker:
    """The marker the validated control batch at ``position`` of ``batch`` writes.

    Raises
    ------
    CorruptRecordError
        The batch is no end-transaction marker: not a transactional control batch,
        not one record, or a key or value too short or of an unknown type.
    """
    info = batch_info(batch, position)
    if info.attributes & (L.CONTROL_BIT | L.TRANSACTIONAL_BIT) != \
            L.CONTROL_BIT | L.TRANSACTIONAL_BIT:
        raise CorruptRecordError(f"the batch at offset {info.base_offset} is not a "
                                 f"transaction's control batch (attributes {info.attributes:#x})")
    records = decode_records(batch[position:position + info.batch_length], control=True)
    if len(records) != 1:
        raise CorruptRecordError(f"the control batch at offset {info.base_offset} holds "
                                 f"{len(records)} records, not one")
    kind, coordinator_epoch = control_record(records[0].key, records[0].value,
                                             info.base_offset)
    return EndTransactionMarker(info.producer_id, info.producer_epoch,
                                kind == ControlType.COMMIT, coordinator_epoch)


def control_record(key: bytes | None, value: bytes | None,
                   offset: int) -> tuple[ControlType, int]:
    """(type, coordinator epoch) of the control record at ``offset`` with ``key``
    and ``value``.

    Raises
    ------
    CorruptRecordError
        The key or value is shorter than its fields, or the type is unknown.
    """
    key, value = key or b"", value or b""
    if len(key) < _KEY.size or len(value) < _VALUE.size:
        raise CorruptRecordError(f"the control record at offset {offset} is too short "
                                 f"(key {len(key)} B, value {len(value)} B)")
    _, kind = _KEY.unpack_from(key)
    if kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptRecordError(f"the control record at offset {offset} has type {kind}, "
                                 f"neither ABORT (0) nor COMMIT (1)")
    _, coordinator_epoch = _VALUE.unpack_from(value)
    return ControlType(kind), coordinator_epoch


@kernel
def marker_type(buffer, position, end):
    """The :class:`ControlType` of the validated, uncompressed control batch at
    ``position`` (its first record's key), or :data:`NOT_A_MARKER` when its record
    is too short to say, for compiled walks of the log; :func:`decode_marker` says
    why in Python."""
    record = position + L.RECORDS_OFFSET
    if end - record < L.RECORD_HEADER_LENGTH:
        return NOT_A_MARKER
    key_length = load_i32(buffer, record + L.KEY_LENGTH_OFFSET)
    key = record + L.RECORD_HEADER_LENGTH
    if key_length < _KEY_SIZE or key + _KEY_SIZE > end:
        return NOT_A_MARKER
    kind = (np.int64(buffer[key + _TYPE_IN_KEY]) << 8) | np.int64(buffer[key + _TYPE_IN_KEY + 1])
    if kind != _ABORT and kind != _COMMIT:
        return NOT_A_MARKER
    return kind
