"""Replication's messages: the bodies of the frames brokers send each other, their
error codes and the sentinel numbers their fields may carry.

Messages
--------
:class:`Message` is a replication message: the envelope's sender broker id and
epoch and correlation id, and a body (:class:`Fetch`, :class:`FetchResponse`,
:class:`EpochEnd`, :class:`EpochEndResponse`, :class:`Produce`,
:class:`ProduceResponse`, :class:`Error`; the design note's §3.1-3.3 bodies, each
with a ``partitions`` tuple of entries except ERROR; and :class:`GroupRequest`,
:class:`GroupResponse`, a consumer-group control request and its reply carried as
their control frames' text to and from the group's coordinator, ``cluster_groups``;
:class:`DeleteRecords`, :class:`DeleteRecordsResponse`, a client's DeleteRecords
forwarded to the partitions' leader, ``delete_records``; :class:`TransactionRequest`,
:class:`TransactionResponse`, transaction requests as text, ``cluster.transactions``).

Rules
-----
* Every body and entry is a frozen dataclass whose ``SCHEMA`` names each field the
  JSON body carries with its kind and range (``("int", lowest, highest)``,
  ``("bool",)``, ``("error",)``, ``("str", longest)``); an entry that carries records
  has a ``records`` field (not in the schema: its bytes travel as a frame of their
  own) and a ``RECORDS_SIZE_MIN``.
* Error codes are Kafka's numbers (:class:`ErrorCode`), so a log line reads as
  Kafka's would.

Theory of operation
-------------------
This module only describes: ``codec`` turns a :class:`Message` into frames and back
and checks every field against these schemas; ``rules`` and the replica service
build and read the bodies. :data:`TYPE_OF_BODY` ties each body class to the
envelope's :class:`~shmlog.cluster.replication.layout.MessageType`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from ...common import limits
from .layout import MessageType

__all__ = [
    "UNKNOWN_OFFSET", "UNDEFINED_EPOCH", "NO_EPOCH", "INT32_MAX", "NO_SESSION",
    "SESSIONLESS_EPOCH", "INITIAL_SESSION_EPOCH", "INT64_MIN", "INT64_MAX",
    "ErrorCode", "Message", "Fetch", "FetchPartition", "FetchResponse",
    "FetchResponsePartition", "EpochEnd", "EpochEndPartition", "EpochEndResponse",
    "EpochEndResponsePartition", "Produce", "ProducePartition", "ProduceResponse",
    "ProduceResponsePartition", "GroupRequest", "GroupResponse", "DeleteRecords",
    "DeleteRecordsPartition", "DeleteRecordsResponse", "DeleteRecordsResponsePartition",
    "TransactionRequest", "TransactionResponse", "Error", "TYPE_OF_BODY",
]

# Kafka's Log.UnknownOffset / UNDEFINED_EPOCH_OFFSET: a log end not yet known.
UNKNOWN_OFFSET = -1
# Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH: an epoch cache's "no such epoch".
UNDEFINED_EPOCH = -1
# A request that carries no current leader epoch (Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH
# in a request's current_leader_epoch): its epoch check is skipped.
NO_EPOCH = -1
# Fetch sessions (KIP-227, Kafka's FetchMetadata): no session id; the epoch of a full
# fetch that opens no session (FINAL_EPOCH); the epoch of a full fetch opening one.
NO_SESSION = 0
SESSIONLESS_EPOCH = -1
INITIAL_SESSION_EPOCH = 0


class ErrorCode(enum.IntEnum):
    """Error codes of replication messages: Kafka's numbers (``Errors.java``) for
    the errors Kafka has, so a log line reads as Kafka's would."""
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    INVALID_RECORD = 87


# The bodies of replication_layout's frames. Records are any contiguous byte buffer
# (bytes, memoryview, a uint8 numpy view of a segment); decode hands them on as uint8
# numpy views of the received frames, without a copy.

# The ranges of Kafka's INT32 and INT64 fields (the envelope's too: ``codec``).
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Field kinds: ("int", lowest, highest), ("bool",), ("error",), ("str", longest).
_TOPIC_KEY = ("int", INT64_MIN, INT64_MAX)
_PARTITION = ("int", 0, limits.PARTITIONS_PER_TOPIC_MAX - 1)
_EPOCH = ("int", UNDEFINED_EPOCH, INT32_MAX)          # -1: none / undefined
_OFFSET = ("int", 0, limits.OFFSET_MAX)
_OFFSET_OR_UNKNOWN = ("int", UNKNOWN_OFFSET, limits.OFFSET_MAX)
_ERROR = ("error",)


@dataclasses.dataclass(frozen=True)
class FetchPartition:
    """One partition of a FETCH (Kafka's FetchRequest partition, trimmed): the
    follower's log end as ``fetch_offset`` and its log start."""
    topic_key: int
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, current_leader_epoch=_EPOCH,
        fetch_offset=_OFFSET, log_start_offset=_OFFSET_OR_UNKNOWN,
        partition_max_bytes=("int", 0, limits.REPLICATION_RECORDS_SIZE_MAX))


@dataclasses.dataclass(frozen=True)
class Fetch:
    """FETCH: a follower (or observer) asks the leader for records past its log end,
    waiting up to ``max_wait_ms`` for some (§3.2). ``replica_id`` must be the
    sender's broker id.

    In a fetch session (KIP-227) ``session_epoch`` 0 opens one (``partitions`` is
    all of them); a later epoch names only the partitions added or whose request
    changed, and ``forgotten`` the ``(topic_key, partition)`` pairs leaving it.
    ``SESSIONLESS_EPOCH`` is a full fetch outside any session."""
    replica_id: int
    observer: bool
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: tuple[FetchPartition, ...]
    session_id: int = NO_SESSION
    session_epoch: int = SESSIONLESS_EPOCH
    forgotten: tuple[tuple[int, int], ...] = ()
    SCHEMA: ClassVar[dict] = dict(
        replica_id=("int", 0, INT32_MAX), observer=("bool",),
        max_wait_ms=("int", 0, limits.REPLICATION_FETCH_WAIT_MS_MAX),
        min_bytes=("int", 0, limits.FETCH_SIZE_MAX), max_bytes=("int", 0, limits.FETCH_SIZE_MAX),
        session_id=("int", 0, INT32_MAX), session_epoch=("int", SESSIONLESS_EPOCH, INT32_MAX),
        forgotten=("names", limits.PARTITIONS_PER_TOPIC_MAX - 1))


@dataclasses.dataclass(frozen=True)
class FetchResponsePartition:
    """One partition of a FETCH_RESPONSE: an error (OFFSET_OUT_OF_RANGE carries the
    leader's log start and end), the leader's high watermark, and the records read
    from ``fetch_offset`` (None: none)."""
    topic_key: int
    partition: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    records: Any = dataclasses.field(default=None, compare=False, repr=False)
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
        high_watermark=_OFFSET_OR_UNKNOWN, log_start_offset=_OFFSET_OR_UNKNOWN,
        log_end_offset=_OFFSET_OR_UNKNOWN)
    RECORDS_SIZE_MIN: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class FetchResponse:
    """FETCH_RESPONSE: one entry per partition of the FETCH; in a session, one per
    partition named or with news (records, a moved high watermark or log start, an
    error). ``error`` is the session's (``FETCH_SESSION_ID_NOT_FOUND``,
    ``INVALID_FETCH_SESSION_EPOCH``: fetch in full again), ``session_id`` the
    session the leader keeps (``NO_SESSION``: none)."""
    partitions: tuple[FetchResponsePartition, ...]
    error: ErrorCode = ErrorCode.NONE
    session_id: int = NO_SESSION
    SCHEMA: ClassVar[dict] = dict(error=_ERROR, session_id=("int", 0, INT32_MAX))


@dataclasses.dataclass(frozen=True)
class EpochEndPartition:
    """One partition of an EPOCH_END (Kafka's OffsetForLeaderEpoch): the end offset
    of ``leader_epoch`` on the leader, asked by a follower at ``current_leader_epoch``."""
    topic_key: int
    partition: int
    current_leader_epoch: int
    leader_epoch: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION,
                                     current_leader_epoch=_EPOCH, leader_epoch=_EPOCH)


@dataclasses.dataclass(frozen=True)
class EpochEnd:
    """EPOCH_END: a truncating follower asks where its epochs end on the leader (§3.3)."""
    partitions: tuple[EpochEndPartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class EpochEndResponsePartition:
    """The leader's ``end_offset_for``: ``(leader_epoch, end_offset)``, (-1, -1) when
    undefined."""
    topic_key: int
    partition: int
    error: ErrorCode
    leader_epoch: int
    end_offset: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
                                     leader_epoch=_EPOCH, end_offset=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class EpochEndResponse:
    """EPOCH_END_RESPONSE: one entry per partition of the EPOCH_END."""
    partitions: tuple[EpochEndResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class ProducePartition:
    """A batch (or run of batches) forwarded to a partition's leader; a transactional
    batch with its producer's transactional id (Kafka's ProduceRequest carries it),
    which the leader's verification asks the coordinator of ("": none)."""
    topic_key: int
    partition: int
    records: Any = dataclasses.field(compare=False, repr=False)
    transactional_id: str = ""
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION,
                                     transactional_id=("str", limits.TRANSACTIONAL_ID_LENGTH_MAX))
    RECORDS_SIZE_MIN: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class Produce:
    """PRODUCE: a broker forwards its local producers' batches to the leader (§5),
    with the producer's ``acks`` (-1 all, 0, 1) and a timeout."""
    acks: int
    timeout_ms: int
    partitions: tuple[ProducePartition, ...]
    SCHEMA: ClassVar[dict] = dict(acks=("int", -1, 1),
                                     timeout_ms=("int", 0, limits.CLIENT_WAIT_MS_MAX))


@dataclasses.dataclass(frozen=True)
class ProduceResponsePartition:
    """The leader's answer for one forwarded partition: the base offset (-1 on an
    error), the LogAppendTime stamp (-1 if none) and the log start."""
    topic_key: int
    partition: int
    error: ErrorCode
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    SCHEMA: ClassVar[dict] = dict(
        topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR, base_offset=_OFFSET_OR_UNKNOWN,
        log_append_time_ms=("int", -1, limits.TIMESTAMP_MS_MAX),
        log_start_offset=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class ProduceResponse:
    """PRODUCE_RESPONSE: one entry per partition of the PRODUCE."""
    partitions: tuple[ProduceResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """GROUP: a member's group request (join, sync, heartbeat, commit, ...) that its
    local broker forwards to the group's coordinator: the control request frame
    (``control.encode_request``) as text. The coordinator's broker checks it as it
    checks a control frame (``control.handle_frame``)."""
    request: str
    SCHEMA: ClassVar[dict] = dict(request=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class GroupResponse:
    """GROUP_RESPONSE: the coordinator's control reply frame (``control.encode_result``)
    as text, handed back to the member as its local broker's reply."""
    reply: str
    SCHEMA: ClassVar[dict] = dict(reply=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class TransactionRequest:
    """TRANSACTION: a transaction request as its control frame's text (as GROUP):
    a client's, forwarded by its local broker to the transactional id's coordinator;
    or a broker's own (``cluster.transactions``): a leader's verification of a held
    batch to the coordinator, the coordinator's markers and expectations to a
    partition's leader."""
    request: str
    SCHEMA: ClassVar[dict] = dict(request=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class TransactionResponse:
    """TRANSACTION_RESPONSE: the control reply frame's text."""
    reply: str
    SCHEMA: ClassVar[dict] = dict(reply=("str", limits.GROUP_FORWARD_TEXT_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class DeleteRecordsPartition:
    """One partition of a DELETE_RECORDS: the log start asked for (-1: the leader's
    high watermark)."""
    topic_key: int
    partition: int
    offset: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION,
                                     offset=("int", -1, limits.OFFSET_MAX))


@dataclasses.dataclass(frozen=True)
class DeleteRecords:
    """DELETE_RECORDS: a broker forwards its client's DeleteRecords to the leader of
    the partitions (``delete_records``' rules)."""
    partitions: tuple[DeleteRecordsPartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class DeleteRecordsResponsePartition:
    """The leader's answer for one partition: the offset it resolved (-1 resolved
    to its high watermark; the refused one with an error) and the low watermark
    (``UNKNOWN_OFFSET`` until every live follower reported its log start)."""
    topic_key: int
    partition: int
    error: ErrorCode
    offset: int
    low_watermark: int
    SCHEMA: ClassVar[dict] = dict(topic_key=_TOPIC_KEY, partition=_PARTITION, error=_ERROR,
                                     offset=("int", INT64_MIN, limits.OFFSET_MAX),
                                     low_watermark=_OFFSET_OR_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class DeleteRecordsResponse:
    """DELETE_RECORDS_RESPONSE: one entry per partition of the DELETE_RECORDS."""
    partitions: tuple[DeleteRecordsResponsePartition, ...]
    SCHEMA: ClassVar[dict] = dict()


@dataclasses.dataclass(frozen=True)
class Error:
    """ERROR: the answer to a message that could not be read (or not served)."""
    error: ErrorCode
    message: str
    SCHEMA: ClassVar[dict] = dict(
        error=_ERROR, message=("str", limits.REPLICATION_ERROR_MESSAGE_LENGTH_MAX))


@dataclasses.dataclass(frozen=True)
class Message:
    """A replication message: the envelope's fields and a body."""
    sender_broker_id: int
    sender_broker_epoch: int
    correlation_id: int
    body: (Fetch | FetchResponse | EpochEnd | EpochEndResponse | Produce | ProduceResponse
           | GroupRequest | GroupResponse | DeleteRecords | DeleteRecordsResponse
           | TransactionRequest | TransactionResponse | Error)

    @property
    def message_type(self) -> MessageType:
        return TYPE_OF_BODY[type(self.body)]


# The envelope's type of each body class.
TYPE_OF_BODY = {Fetch: MessageType.FETCH, FetchResponse: MessageType.FETCH_RESPONSE,
                EpochEnd: MessageType.EPOCH_END, EpochEndResponse: MessageType.EPOCH_END_RESPONSE,
                Produce: MessageType.PRODUCE, ProduceResponse: MessageType.PRODUCE_RESPONSE,
                GroupRequest: MessageType.GROUP, GroupResponse: MessageType.GROUP_RESPONSE,
                DeleteRecords: MessageType.DELETE_RECORDS,
                DeleteRecordsResponse: MessageType.DELETE_RECORDS_RESPONSE,
                TransactionRequest: MessageType.TRANSACTION,
                TransactionResponse: MessageType.TRANSACTION_RESPONSE,
                Error: MessageType.ERROR}
