"""Replication's codec: a :class:`~shmlog.cluster.replication.messages.Message` to
the frames ``layout`` draws, and back.

Rules
-----
* :func:`encode` gives a message's frames: the envelope, the JSON body, then each
  partition entry's records as frames of their own, as given (a numpy view of a
  segment is sent without a copy).
* :func:`decode` checks everything a peer sent (each field's type and range, no
  unknown or missing field, no partition named twice, the record frames' count and
  lengths) and raises only ``ReplicationProtocolError``; records come back as uint8
  numpy views of their frames.
* :func:`encode` runs the same checks on what it builds, so a broker never sends
  what its peer would refuse (``LocalProtocolError``).

Theory of operation
-------------------
A body is its dataclass's ``SCHEMA`` fields as one JSON object; an entry that
carries records says how many bytes (``records_bytes``) and its records follow the
body in the entries' order. Decoding checks the envelope first (magic, version,
type), then the body against the schema, then matches the record frames to the
entries. The check of an integer in range, the common case, is done inline.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import struct
from typing import Any, Sequence

import numpy as np

from ...common import limits
from ...common.errors import LocalProtocolError, ReplicationProtocolError
from . import layout as replication_layout
from .layout import MessageType
from .messages import (
    INT32_MAX,
    INT64_MAX,
    TYPE_OF_BODY,
    DeleteRecords,
    DeleteRecordsPartition,
    DeleteRecordsResponse,
    DeleteRecordsResponsePartition,
    EpochEnd,
    EpochEndPartition,
    EpochEndResponse,
    EpochEndResponsePartition,
    ErrorCode,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchResponsePartition,
    Message,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceResponsePartition,
)

__all__ = ["encode", "decode"]

_BODY_OF = {message_type: body for body, message_type in TYPE_OF_BODY.items()}
_ENTRY_OF = {Fetch: FetchPartition, FetchResponse: FetchResponsePartition,
             EpochEnd: EpochEndPartition, EpochEndResponse: EpochEndResponsePartition,
             Produce: ProducePartition, ProduceResponse: ProduceResponsePartition,
             DeleteRecords: DeleteRecordsPartition,
             DeleteRecordsResponse: DeleteRecordsResponsePartition}
_ENVELOPE = struct.Struct(replication_layout.ENVELOPE_FORMAT)


def _refuse(message: str) -> ReplicationProtocolError:
    return ReplicationProtocolError(message)


def _check(value: Any, kind: tuple, where: str) -> Any:
    """A body field of its kind, or a ReplicationProtocolError naming it."""
    name = kind[0]
    if name == "int":
        if type(value) is not int or not kind[1] <= value <= kind[2]:
            raise _refuse(f"{where} must be an integer in [{kind[1]}, {kind[2]}], "
                          f"got {value!r:.80}")
        return value
    if name == "bool":
        if type(value) is not bool:
            raise _refuse(f"{where} must be true or false, got {value!r:.80}")
        return value
    if name == "error":
        if type(value) is not int or value not in _ERROR_CODES:
            raise _refuse(f"{where} must be a known error code, got {value!r:.80}")
        return ErrorCode(value)
    if name == "list":
        if type(value) is not list:
            raise _refuse(f"{where} must be a list, got {type(value).__name__}")
        return value
    if name == "names":
        return _names(value, kind[1], where)
    assert name == "str", kind
    if type(value) is not str or len(value) > kind[1]:
        raise _refuse(f"{where} must be a string of at most {kind[1]} characters, "
                      f"got {type(value).__name__} {value!r:.80}")
    return value


_ERROR_CODES = frozenset(int(code) for code in ErrorCode)


def _names(value: Any, partition_max: int, where: str) -> tuple:
    """A list of ``[topic_key, partition]`` pairs (a FETCH's forgotten partitions)."""
    if type(value) not in (list, tuple):
        raise _refuse(f"{where} must be a list, got {type(value).__name__}")
    names = []
    for index, pair in enumerate(value):
        if type(pair) not in (list, tuple) or len(pair) != 2 or \
                any(type(number) is not int for number in pair) or \
                not -2**63 <= pair[0] <= INT64_MAX or not 0 <= pair[1] <= partition_max:
            raise _refuse(f"{where}[{index}] must be [topic_key, partition], got {pair!r:.80}")
        names.append((pair[0], pair[1]))
    return tuple(names)


def _fields(obj: Any, schema: dict, where: str) -> dict:
    """The schema's fields of a decoded JSON object (exactly those, each checked)."""
    if not isinstance(obj, dict):
        raise _refuse(f"{where} must be a JSON object, got {type(obj).__name__}")
    if obj.keys() != schema.keys():
        missing, extra = schema.keys() - obj.keys(), obj.keys() - schema.keys()
        raise _refuse(f"{where} has fields {sorted(obj)[:20]!r:.300}: "
                      f"missing {sorted(missing)}, unknown {sorted(extra)[:10]!r:.200}")
    fields = {}
    for name, kind in schema.items():
        value = obj[name]
        # The common case inline: an integer in range needs no call and no message.
        if kind[0] == "int" and type(value) is int and kind[1] <= value <= kind[2]:
            fields[name] = value
        else:
            fields[name] = _check(value, kind, f"{where}.{name}")
    return fields


def _records_size(records: Any, where: str) -> int:
    try:
        view = memoryview(records)
    except TypeError:
        raise LocalProtocolError(f"{where}.records must be a bytes-like buffer, "
                                 f"got {type(records).__name__}") from None
    if not view.contiguous:
        raise LocalProtocolError(f"{where}.records must be contiguous")
    return view.nbytes


def _encode_entries(body: Any) -> tuple[list[dict], list]:
    """The body's partition entries as JSON objects, and their record frames."""
    entries, frames = [], []
    for index, entry in enumerate(body.partitions):
        item = {name: _plain(getattr(entry, name), f"partitions[{index}].{name}")
                for name in entry.SCHEMA}
        if hasattr(entry, "RECORDS_SIZE_MIN"):
            size = 0 if entry.records is None else \
                _records_size(entry.records, f"partitions[{index}]")
            item["records_bytes"] = size
            if size:
                frames.append(entry.records)
        entries.append(item)
    return entries, frames


def encode(message: Message) -> list:
    """The frames of a message (replication_layout): the envelope, the JSON body,
    then each partition entry's records, as given (no copy).

    Raises
    ------
    LocalProtocolError
        A field is out of range or of the wrong type, or the body is too large:
        a peer would refuse the message, so it is not sent.
    """
    body = message.body
    message_type = TYPE_OF_BODY.get(type(body))
    if message_type is None:
        raise LocalProtocolError(f"not a replication message body: {type(body).__name__}")
    if message_type is MessageType.ERROR:
        body = dataclasses.replace(
            body, message=body.message[:limits.REPLICATION_ERROR_MESSAGE_LENGTH_MAX])
    fields = {name: _plain(getattr(body, name), name) for name in body.SCHEMA}
    record_frames: list = []
    if type(body) in _ENTRY_OF:
        fields["partitions"], record_frames = _encode_entries(body)
    frames = [_envelope_bytes(message, message_type), json.dumps(
        fields, separators=(",", ":"), ensure_ascii=False).encode()] + record_frames
    try:                        # what the peer will check, checked before it is sent
        _body_from_object(message_type, fields, record_frames, message.sender_broker_id)
    except ReplicationProtocolError as error:
        raise LocalProtocolError(f"cannot send {message_type.name}: {error}") from None
    return frames


def _plain(value: Any, where: str) -> Any:
    """A field as JSON takes it: bools and strings as they are, integers (enums,
    numpy integers) as int; anything else is the caller's mistake."""
    if type(value) is int or isinstance(value, (bool, str)):
        return value
    if type(value) is tuple:                   # a FETCH's forgotten pairs
        return [[_plain(number, where) for number in pair] for pair in value]
    try:
        return operator.index(value)
    except TypeError:
        raise LocalProtocolError(f"field {where} must be an integer, "
                                 f"got {type(value).__name__} {value!r:.80}") from None


def _envelope_bytes(message: Message, message_type: MessageType) -> bytes:
    _check_envelope(message.sender_broker_id, message.sender_broker_epoch,
                    message.correlation_id, message_type, LocalProtocolError)
    return _ENVELOPE.pack(replication_layout.MAGIC, replication_layout.VERSION,
                          message_type, message.sender_broker_id,
                          message.sender_broker_epoch, message.correlation_id)


def _check_envelope(sender_broker_id: Any, sender_broker_epoch: Any, correlation_id: Any,
                    message_type: MessageType, error_class: type) -> None:
    for name, value, low in (("sender_broker_id", sender_broker_id, 0),
                             ("sender_broker_epoch", sender_broker_epoch, 0),
                             ("correlation_id", correlation_id, 0)):
        high = INT32_MAX if name == "sender_broker_id" else INT64_MAX
        if type(value) is not int or not low <= value <= high:
            raise error_class(f"envelope {name} must be an integer in [{low}, {high}], "
                              f"got {value!r:.80}")
    if correlation_id == 0 and message_type is not MessageType.ERROR:
        raise error_class(f"a {message_type.name} needs a correlation id above 0")


def decode(frames: Sequence) -> Message:
    """The message in ``frames`` (bytes-like objects: bytes, memoryviews, zmq frames'
    buffers). Records come back as uint8 numpy views of their frames (no copy).

    Raises
    ------
    ReplicationProtocolError
        Anything that is not a well-formed message of this version: every field's
        type and range, the frame count and each record frame's length are checked.
    """
    if len(frames) < replication_layout.FIRST_RECORDS_FRAME:
        raise _refuse(f"a message has at least 2 frames (envelope, body), got {len(frames)}")
    envelope = _bytes(frames[replication_layout.ENVELOPE_FRAME], "envelope")
    if len(envelope) != replication_layout.ENVELOPE_LENGTH:
        raise _refuse(f"the envelope is {replication_layout.ENVELOPE_LENGTH} bytes, "
                      f"got {len(envelope)}")
    magic, version, type_number, sender_id, sender_epoch, correlation_id = \
        _ENVELOPE.unpack(envelope)
    if magic != replication_layout.MAGIC:
        raise _refuse(f"bad magic {magic:#06x} (expected {replication_layout.MAGIC:#06x}): "
                      f"not a replication message")
    if version != replication_layout.VERSION:
        raise _refuse(f"unsupported version {version}; this broker speaks "
                      f"{replication_layout.VERSION}")
    if type_number not in _TYPE_NUMBERS:
        raise _refuse(f"unknown message type {type_number}")
    message_type = MessageType(type_number)
    _check_envelope(sender_id, sender_epoch, correlation_id, message_type, ReplicationProtocolError)
    body = _decode_body(message_type, frames[replication_layout.BODY_FRAME],
                        frames[replication_layout.FIRST_RECORDS_FRAME:], sender_id)
    return Message(sender_id, sender_epoch, correlation_id, body)


_TYPE_NUMBERS = frozenset(int(message_type) for message_type in MessageType)


def _bytes(frame: Any, where: str) -> bytes:
    try:
        return memoryview(frame).tobytes()
    except TypeError:
        raise _refuse(f"the {where} frame is not a byte buffer ({type(frame).__name__})") from None


def _decode_body(message_type: MessageType, body_frame: Any, record_frames: Sequence,
                 sender_id: int) -> Any:
    text = _bytes(body_frame, "body")
    if len(text) > limits.REPLICATION_BODY_SIZE_MAX:
        raise _refuse(f"a body of {len(text)} bytes exceeds {limits.REPLICATION_BODY_SIZE_MAX}")
    try:
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise _refuse(f"the body is not UTF-8 JSON ({error})") from None
    except RecursionError:
        raise _refuse("the body nests too deep") from None
    return _body_from_object(message_type, obj, record_frames, sender_id)


def _body_from_object(message_type: MessageType, obj: Any, record_frames: Sequence,
                      sender_id: int) -> Any:
    body_class = _BODY_OF[message_type]
    entry_class = _ENTRY_OF.get(body_class)
    schema = dict(body_class.SCHEMA)
    if entry_class is not None:
        schema["partitions"] = ("list",)
    fields = _fields(obj, schema, message_type.name)
    if entry_class is None:
        if record_frames:
            raise _refuse(f"a {message_type.name} has 2 frames, got {2 + len(record_frames)}")
        return body_class(**fields)
    fields["partitions"] = _decode_entries(entry_class, fields["partitions"], record_frames,
                                           message_type.name)
    if body_class is Fetch and fields["replica_id"] != sender_id:
        raise _refuse(f"FETCH replica_id {fields['replica_id']} is not the sender's broker "
                      f"id {sender_id}")
    return body_class(**fields)


def _decode_entries(entry_class: type, items: list, record_frames: Sequence, where: str) -> tuple:
    schema = dict(entry_class.SCHEMA)
    carries_records = hasattr(entry_class, "RECORDS_SIZE_MIN")
    if carries_records:
        schema["records_bytes"] = ("int", entry_class.RECORDS_SIZE_MIN,
                                   limits.REPLICATION_RECORDS_SIZE_MAX)
    decoded = [_fields(item, schema, f"{where}.partitions[{index}]")
               for index, item in enumerate(items)]
    names = {(fields["topic_key"], fields["partition"]) for fields in decoded}
    if len(names) != len(decoded):
        raise _refuse(f"{where} names a partition twice")
    sizes = [fields.pop("records_bytes") for fields in decoded] if carries_records else []
    expected = sum(1 for size in sizes if size)
    if expected != len(record_frames):
        raise _refuse(f"{where} has {expected} record frames in its body and "
                      f"{len(record_frames)} after it")
    frames = iter(record_frames)
    entries = []
    for index, fields in enumerate(decoded):
        if carries_records:
            fields["records"] = _records(next(frames), sizes[index], where, index) \
                if sizes[index] else None
        entries.append(entry_class(**fields))
    return tuple(entries)


def _records(frame: Any, size: int, where: str, index: int) -> np.ndarray:
    try:
        records = np.frombuffer(frame, dtype=np.uint8)
    except (TypeError, ValueError):
        raise _refuse(f"{where}.partitions[{index}] records frame is not a byte buffer") from None
    if records.nbytes != size:
        raise _refuse(f"{where}.partitions[{index}] records_bytes is {size}, its frame has "
                      f"{records.nbytes}")
    return records
