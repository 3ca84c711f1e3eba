"""Kafka's error codes (the protocol's numbers, as Kafka's ``Errors`` names them), and
what each of shmlog's refusals is called on the wire.

Rules
-----
* A refusal has one code: :func:`for_completion` for a batch the appender refused,
  :func:`for_error` for a typed shmlog error. A code a Kafka client retries
  (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, ...) is given only where retrying can
  succeed.
* An error shmlog has no better name for is UNKNOWN_SERVER_ERROR, and the broker's
  log says what it was.
"""

from __future__ import annotations

from ..common import errors as E
from ..record.validation import BatchStatus
from ..shm.completion import CompletionCode

__all__ = ["for_completion", "for_error", "for_name"]

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
COORDINATOR_LOAD_IN_PROGRESS = 14
INVALID_TIMESTAMP = 32
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_PRODUCER_ID = 59
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
UNSUPPORTED_COMPRESSION_TYPE = 76
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
FENCED_INSTANCE_ID = 82
INVALID_RECORD = 87
PRODUCER_FENCED = 90
UNKNOWN_TOPIC_ID = 100
MISMATCHED_ENDPOINT_TYPE = 114
UNSUPPORTED_ENDPOINT_TYPE = 115

_COMPLETIONS = {
    CompletionCode.UNKNOWN_PARTITION: UNKNOWN_TOPIC_OR_PARTITION,
    CompletionCode.RECORD_TOO_LARGE: MESSAGE_TOO_LARGE,
    CompletionCode.STORAGE_ERROR: KAFKA_STORAGE_ERROR,
    CompletionCode.NOT_ONE_BATCH: INVALID_RECORD,
    CompletionCode.OUT_OF_ORDER_SEQUENCE: OUT_OF_ORDER_SEQUENCE_NUMBER,
    CompletionCode.INTERNAL_TOPIC: INVALID_TOPIC_EXCEPTION,
    CompletionCode.INVALID_PRODUCER_EPOCH: INVALID_PRODUCER_EPOCH,
    CompletionCode.NOT_ENOUGH_REPLICAS: NOT_ENOUGH_REPLICAS,
    CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    CompletionCode.NOT_LEADER_OR_FOLLOWER: NOT_LEADER_OR_FOLLOWER,
    CompletionCode.REQUEST_TIMED_OUT: REQUEST_TIMED_OUT,
    CompletionCode.RESOURCE_LIMIT: KAFKA_STORAGE_ERROR,
    CompletionCode.INVALID_TXN_STATE: INVALID_TXN_STATE,
    CompletionCode.CONTROL_FROM_PRODUCER: INVALID_RECORD,
    # A batch the validation refused (codes below 100 are its BatchStatus).
    BatchStatus.BAD_CRC: CORRUPT_MESSAGE,
    BatchStatus.BAD_LENGTH: CORRUPT_MESSAGE,
    BatchStatus.TRUNCATED: CORRUPT_MESSAGE,
    BatchStatus.END_OF_DATA: CORRUPT_MESSAGE,
    BatchStatus.BAD_MAGIC: INVALID_RECORD,
    BatchStatus.BAD_VERSION: INVALID_RECORD,
    BatchStatus.BAD_RECORD_COUNT: INVALID_RECORD,
    BatchStatus.BAD_RECORD: INVALID_RECORD,
    BatchStatus.BAD_OFFSET: INVALID_RECORD,
    BatchStatus.BAD_TIMESTAMP: INVALID_TIMESTAMP,
    BatchStatus.BAD_COMPRESSION: CORRUPT_MESSAGE,
    # Unknown attribute bits; a codec other than none and zstd is told apart by the
    # produce handler, which looks at the batch (UNSUPPORTED_COMPRESSION_TYPE).
    BatchStatus.BAD_ATTRIBUTES: INVALID_RECORD,
}


def for_completion(code: int) -> int:
    """The Kafka error code of a batch refused with completion code ``code`` (the
    completion result was ``-code``)."""
    return _COMPLETIONS.get(code, UNKNOWN_SERVER_ERROR)


# Most specific first: the first class an error is an instance of names its code.
_ERRORS = (
    (E.InternalTopicError, INVALID_TOPIC_EXCEPTION),
    (E.InvalidTopicError, INVALID_TOPIC_EXCEPTION),
    (E.TopicExistsError, TOPIC_ALREADY_EXISTS),
    (E.UnknownTopicOrPartitionError, UNKNOWN_TOPIC_OR_PARTITION),
    (E.InvalidPartitionsError, INVALID_PARTITIONS),
    (E.InvalidReplicationFactorError, INVALID_REPLICATION_FACTOR),
    (E.InvalidReplicaAssignmentError, INVALID_REPLICA_ASSIGNMENT),
    (E.InvalidConfigError, INVALID_CONFIG),
    (E.RecordTooLargeError, MESSAGE_TOO_LARGE),
    (E.OffsetOutOfRangeError, OFFSET_OUT_OF_RANGE),
    (E.CorruptRecordError, CORRUPT_MESSAGE),
    (E.OutOfOrderSequenceError, OUT_OF_ORDER_SEQUENCE_NUMBER),
    (E.InvalidProducerEpochError, INVALID_PRODUCER_EPOCH),
    (E.InvalidTxnStateError, INVALID_TXN_STATE),
    # The transaction coordinator's refusals. PRODUCER_FENCED is only for the versions
    # that know it (``transaction_apis`` answers older ones INVALID_PRODUCER_EPOCH).
    (E.ProducerFencedError, PRODUCER_FENCED),
    (E.InvalidProducerIdMappingError, INVALID_PRODUCER_ID_MAPPING),
    (E.ConcurrentTransactionsError, CONCURRENT_TRANSACTIONS),
    (E.InvalidTransactionTimeoutError, INVALID_TRANSACTION_TIMEOUT),
    (E.NotLeaderOrFollowerError, NOT_LEADER_OR_FOLLOWER),
    (E.NotEnoughReplicasAfterAppendError, NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    (E.NotEnoughReplicasError, NOT_ENOUGH_REPLICAS),
    (E.RequestTimedOutError, REQUEST_TIMED_OUT),
    (E.StorageError, KAFKA_STORAGE_ERROR),
    (E.CorruptSegmentError, KAFKA_STORAGE_ERROR),
    (E.NotCoordinatorError, NOT_COORDINATOR),
    (E.CoordinatorLoadInProgressError, COORDINATOR_LOAD_IN_PROGRESS),
    (E.CoordinatorError, COORDINATOR_NOT_AVAILABLE),
    (E.UnknownMemberIdError, UNKNOWN_MEMBER_ID),
    (E.IllegalGenerationError, ILLEGAL_GENERATION),
    (E.RebalanceInProgressError, REBALANCE_IN_PROGRESS),
    (E.FencedInstanceIdError, FENCED_INSTANCE_ID),
    # A commit of a partition this generation gives another member: the member's
    # view is stale, so it rejoins (Kafka's answer to a fenced commit).
    (E.CommitFailedError, ILLEGAL_GENERATION),
    (E.InconsistentGroupProtocolError, INCONSISTENT_GROUP_PROTOCOL),
    (E.GroupIdNotFoundError, GROUP_ID_NOT_FOUND),
    (E.NonEmptyGroupError, NON_EMPTY_GROUP),
    (E.LocalProtocolError, INVALID_REQUEST),
)


def for_error(error: BaseException) -> int:
    """The Kafka error code of a shmlog error (UNKNOWN_SERVER_ERROR for one with no
    Kafka name)."""
    for cls, code in _ERRORS:
        if isinstance(error, cls):
            return code
    return UNKNOWN_SERVER_ERROR


def for_name(name: str) -> int:
    """The code of a Kafka error named as Kafka's ``Errors`` names it (the names
    shmlog's replies carry, e.g. ``delete_records``' ``"OFFSET_OUT_OF_RANGE"``);
    UNKNOWN_SERVER_ERROR for a name without a code here."""
    code = globals().get(name) if name.isupper() else None
    return code if isinstance(code, int) else UNKNOWN_SERVER_ERROR
