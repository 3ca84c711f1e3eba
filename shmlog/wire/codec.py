"""The one door to Kafka's message classes: requests decoded and responses encoded
with kafka-python's ``kafka.protocol`` (built from Kafka's own JSON schemas; the
version is pinned in setup.cfg), behind names of our own.

Rules
-----
* No other module imports ``kafka.protocol``: a new kafka-python is checked here.
* kafka-python's classes take every version from 0; the broker serves only the
  ranges :mod:`apis` advertises, and :func:`decode_request` decodes only what it is
  asked to (the caller checked the range).
* Anything a client's bytes can make go wrong while decoding is a
  :class:`KafkaRequestError` naming the API, version and correlation id: the
  connection is closed (as Kafka does), never the broker.
* The request header is read by hand (it is the same for every API, and a header we
  cannot serve must still give its correlation id); bodies go through the classes.

Theory of operation
-------------------
A request frame is ``api_key int16, api_version int16, correlation_id int32,
client_id nullable string`` (header v1), then, for a flexible version, tagged fields
(header v2), then the body. A response is ``correlation_id int32`` (header v0), plus
tagged fields when the API's version is flexible (header v1), then the body, except
that ApiVersions' response header is always v0 (a client that does not know the
broker's versions must read it). :func:`encode_response` returns the framed bytes.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import struct
from typing import NamedTuple

from kafka.protocol import __path__ as _PROTOCOL_PATH  # noqa: N811 - the package's path
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.protocol.schemas.fields.codecs import Bytes, String

from ..common.errors import KafkaRequestError

__all__ = ["RequestHeader", "read_header", "decode_request", "encode_response",
           "response_class", "request_class", "API_VERSIONS_KEY", "Subscription",
           "decode_subscription", "encode_assignment", "encode_subscription"]

API_VERSIONS_KEY = 18
_HEADER = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_SIZE = struct.Struct(">i")


def _message_classes() -> tuple[dict[int, type], dict[int, type]]:
    """{api key: request class}, {api key: response class}: every message class of
    kafka-python's protocol package."""
    requests, responses = {}, {}
    for found in pkgutil.walk_packages(_PROTOCOL_PATH, "kafka.protocol."):
        module = importlib.import_module(found.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, ApiMessage) \
                    and value is not ApiMessage and getattr(value, "_json", None) \
                    and value._class_version is None:
                (requests if value.is_request() else responses)[value.API_KEY] = value
    return requests, responses


_REQUESTS, _RESPONSES = _message_classes()


def request_class(api_key: int) -> type | None:
    """The request class of ``api_key`` (None: kafka-python has none)."""
    return _REQUESTS.get(api_key)


def response_class(api_key: int) -> type:
    """The response class of ``api_key``: build responses with it (``cls(version=v,
    field=...)``; nested structs are its attributes, e.g.
    ``MetadataResponse.MetadataResponseBroker``)."""
    return _RESPONSES[api_key]


@dataclasses.dataclass(frozen=True)
class RequestHeader:
    """A request's header: what every API's request starts with."""
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int                # where the body starts in the frame

    def describe(self) -> str:
        cls = _REQUESTS.get(self.api_key)
        name = cls.name if cls is not None else f"API {self.api_key}"
        return f"{name} v{self.api_version} (correlation id {self.correlation_id})"


def _varint(frame, position: int) -> tuple[int, int]:
    """An unsigned varint at ``position``: (value, position after it)."""
    value = shift = 0
    while True:
        if position >= len(frame) or shift > 28:
            raise KafkaRequestError("a varint in the request header runs past its end")
        byte = frame[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _flexible(api_key: int, api_version: int) -> bool:
    cls = _REQUESTS.get(api_key)
    return cls is not None and cls.flexible_version_q(api_version)


def read_header(frame: memoryview) -> RequestHeader:
    """The header of one request frame (the bytes after its size).

    Raises
    ------
    KafkaRequestError
        The frame is too short for its header, or its client id or tagged fields
        run past its end.
    """
    if len(frame) < _HEADER.size + _INT16.size:
        raise KafkaRequestError(f"a request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(frame, 0)
    position = _HEADER.size
    (length,) = _INT16.unpack_from(frame, position)
    position += _INT16.size
    client_id = None
    if length >= 0:
        if position + length > len(frame):
            raise KafkaRequestError(f"the client id's {length} bytes run past the request's end "
                                    f"(correlation id {correlation_id})")
        client_id = bytes(frame[position:position + length]).decode("utf-8", "replace")
        position += length
    if _flexible(api_key, api_version):
        count, position = _varint(frame, position)
        for _ in range(count):
            _, position = _varint(frame, position)            # the tag
            size, position = _varint(frame, position)
            position += size
        if position > len(frame):
            raise KafkaRequestError(f"the header's tagged fields run past the request's end "
                                    f"(correlation id {correlation_id})")
    return RequestHeader(api_key, api_version, correlation_id, client_id, position)


def decode_request(header: RequestHeader, frame: memoryview):
    """The body of ``frame`` decoded as ``header`` says (a kafka-python message).

    Raises
    ------
    KafkaRequestError
        The body does not decode as that API's version.
    """
    cls = _REQUESTS[header.api_key]
    try:
        body = cls.decode(frame[header.body_offset:], version=header.api_version)
    except Exception as error:       # noqa: BLE001 - any decoding failure is the client's
        raise KafkaRequestError(f"{header.describe()}: the body does not decode: "
                                f"{type(error).__name__}: {error}") from None
    null = _null_field(_checks(cls._struct, header.api_version), body)
    if null is not None:
        raise KafkaRequestError(f"{header.describe()}: {null} is null, which that version "
                                f"does not allow")
    return body


class _Check(NamedTuple):
    """What to look at in one field of a decoded struct (see :func:`_checks`)."""
    name: str
    refuse_null: bool                 # a null here came as a length of -1, not allowed
    items: bool                       # an array of strings or bytes: no null item
    inner: tuple                      # a struct (array): the checks of its fields
    many: bool                        # ``inner`` applies to each item of an array


# {(id of a schema struct, version): its checks}; kafka-python's structs live as
# long as their classes (the process) and are not hashable, hence their ids.
_CHECKS: dict[tuple[int, int], tuple] = {}


def _checks(struct, version: int) -> tuple:
    """The fields of ``struct`` at ``version`` that may hold a null the schema does
    not allow, directly or in what they hold (computed once per struct and version:
    a request then visits only those, e.g. no Produce partition at all)."""
    key = (id(struct), version)
    if key not in _CHECKS:
        found = []
        for field in struct.untagged_fields(version):
            refuse_null = _length_prefixed(field) and \
                not field.nullable_for_version_q(version)
            nested = field.is_struct_array() or field.is_struct()
            inner = _checks(field, version) if nested else ()
            items = not nested and field.is_array() and _length_prefixed(field.array_of)
            if refuse_null or inner or items:
                found.append(_Check(field.name, refuse_null, items, inner,
                                    field.is_struct_array()))
        _CHECKS[key] = tuple(found)
    return _CHECKS[key]


def _null_field(checks: tuple, value) -> str | None:
    """The name of the first field of ``value`` (nested ones too) that is null where
    its version does not allow it, or None. kafka-python decodes a length of -1 as
    null whatever the schema says; Kafka's own readers refuse it, and the handlers
    rely on what the schema promises."""
    for check in checks:
        found = getattr(value, check.name)
        if found is None:
            if check.refuse_null:
                return check.name
        elif check.items:
            if None in found:
                return f"an item of {check.name}"
        elif check.inner:
            for item in found if check.many else (found,):
                inner = _null_field(check.inner, item)
                if inner is not None:
                    return f"{check.name}.{inner}"
    return None


def _length_prefixed(field) -> bool:
    """Whether a null of ``field`` came as a length of -1 (an array, struct, string or
    bytes): a UUID of zeros also decodes as None, and means "none" (Kafka's
    ZERO_UUID), not null."""
    kind = getattr(field, "_type", None)
    return kind is None or isinstance(kind, String) or kind is Bytes


def encode_response(header: RequestHeader, response, version: int | None = None) -> bytes:
    """``response`` framed: its size, its header for ``header``'s request, its body at
    ``version`` (the request's, unless given: ApiVersions answers an unsupported
    version with a v0 body)."""
    version = header.api_version if version is None else version
    body = response.encode(version=version)
    flexible_header = header.api_key != API_VERSIONS_KEY and \
        _RESPONSES[header.api_key].flexible_version_q(version)
    head = _SIZE.pack(header.correlation_id) + (b"\x00" if flexible_header else b"")
    return _SIZE.pack(len(head) + len(body)) + head + bytes(body)


# -- the consumer protocol's embedded messages (JoinGroup's and SyncGroup's bytes) ---------
@dataclasses.dataclass(frozen=True)
class Subscription:
    """What a Kafka consumer's ConsumerProtocolSubscription says."""
    topics: list[str]
    owned: list[list]                 # [[topic, partition], ...]
    generation: int                   # -1 when it names none (before v2)


def decode_subscription(data: bytes | None) -> Subscription:
    """A JoinGroup protocol's metadata (ConsumerProtocolSubscription, any version).

    Raises
    ------
    KafkaRequestError
        The bytes are not one.
    """
    try:
        decoded = ConsumerProtocolSubscription.decode(bytes(data or b""))
        owned = [[entry.topic, partition] for entry in (decoded.owned_partitions or [])
                 for partition in entry.partitions]
        generation = getattr(decoded, "generation_id", -1)
        return Subscription(list(decoded.topics), owned, -1 if generation is None else generation)
    except Exception as error:       # noqa: BLE001 - any decoding failure is the client's
        raise KafkaRequestError(f"a consumer subscription does not decode: {error}") from None


def encode_subscription(topics, owned=()) -> bytes:
    """ConsumerProtocolSubscription v1 bytes (DescribeGroups' member metadata)."""
    message = ConsumerProtocolSubscription(
        version=1, topics=list(topics), user_data=None,
        owned_partitions=_by_topic(ConsumerProtocolSubscription.TopicPartition, owned))
    return bytes(message.encode(version=1))


def encode_assignment(partitions) -> bytes:
    """A member's assignment ([[topic, partition], ...]) as ConsumerProtocolAssignment
    v0 bytes (SyncGroup's, DescribeGroups')."""
    message = ConsumerProtocolAssignment(
        version=0, user_data=None,
        assigned_partitions=_by_topic(ConsumerProtocolAssignment.TopicPartition, partitions))
    return bytes(message.encode(version=0))


def _by_topic(cls, partitions) -> list:
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return [cls(topic=topic, partitions=sorted(numbers))
            for topic, numbers in sorted(grouped.items())]
