"""kafka-python's ``kafka.errors`` names, bound to shmlog's error classes (aliases,
not copies: ``except KafkaError`` catches every :class:`~shmlog.common.errors.ShmlogError`,
``except TopicAlreadyExistsError`` catches ``TopicExistsError``, and so on).

Each name is the shmlog class that is raised where Kafka raises the named error.
Names kafka-python has for what cannot happen here (SASL, quotas, the wire
protocol's own errors) are not bound: a program that catches one fails at
import, where it is easy to see, rather than silently never catching.
"""

from __future__ import annotations

from ..common.errors import (
                             BrokerNotAvailableError,
                             ClientTimeoutError,
                             CommitFailedError,
                             ConcurrentTransactionsError,
                             CoordinatorLoadInProgressError,
                             CoordinatorNotAvailableError,
                             CorruptRecordError,
                             GroupIdNotFoundError,
                             IllegalGenerationError,
                             IllegalStateError,
                             InconsistentGroupProtocolError,
                             InvalidConfigError,
                             InvalidPartitionsError,
                             InvalidProducerEpochError,
                             InvalidProducerIdMappingError,
                             InvalidReplicaAssignmentError,
                             InvalidReplicationFactorError,
                             InvalidTopicError,
                             InvalidTransactionTimeoutError,
                             LocalProtocolError,
                             NonEmptyGroupError,
                             NotCoordinatorError,
                             NotEnoughReplicasAfterAppendError,
                             NotEnoughReplicasError,
                             NotLeaderOrFollowerError,
                             OffsetMetadataTooLargeError,
                             OffsetOutOfRangeError,
                             OutOfOrderSequenceError,
                             ProducerFencedError,
                             ReassignmentInProgressError,
                             RebalanceInProgressError,
                             RecordTooLargeError,
                             RequestTimedOutError,
                             ShmlogError,
                             StorageError,
                             TopicExistsError,
                             TransactionAbortedError,
                             UnknownMemberIdError,
                             UnknownTopicOrPartitionError,
                             UnsupportedKafkaOptionError,
)

__all__ = [
    "KafkaError", "BrokerResponseError", "KafkaTimeoutError", "NoBrokersAvailable",
    "KafkaConnectionError", "NodeNotReadyError", "BrokerNotAvailableError",
    "KafkaConfigurationError", "InvalidConfigurationError", "UnsupportedKafkaOptionError",
    "IllegalStateError", "IllegalArgumentError", "TopicAlreadyExistsError",
    "UnknownTopicOrPartitionError", "InvalidTopicError", "InvalidPartitionsError",
    "InvalidReplicationFactorError", "InvalidReplicationAssignmentError",
    "MessageSizeTooLargeError", "RecordTooLargeError", "OffsetOutOfRangeError",
    "OffsetMetadataTooLargeError", "CorruptRecordError", "CommitFailedError",
    "RebalanceInProgressError", "UnknownMemberIdError", "IllegalGenerationError",
    "InconsistentGroupProtocolError", "GroupIdNotFoundError", "NonEmptyGroupError",
    "NotCoordinatorError", "NotCoordinatorForGroupError", "CoordinatorNotAvailableError",
    "GroupCoordinatorNotAvailableError", "CoordinatorLoadInProgressError",
    "GroupLoadInProgressError", "NotEnoughReplicasError", "NotEnoughReplicasAfterAppendError",
    "NotLeaderForPartitionError", "NotLeaderOrFollowerError", "RequestTimedOutError",
    "OutOfOrderSequenceNumberError", "InvalidProducerEpochError", "KafkaStorageError",
    "ReassignmentInProgressError", "ProducerFencedError", "InvalidProducerIdMappingError",
    "ConcurrentTransactionsError", "InvalidTransactionTimeoutError", "TransactionAbortedError",
]

# IllegalStateError is shmlog's own: a closed client used (ClientClosedError), a
# position asked of a partition not assigned (NotAssignedError).

KafkaError = ShmlogError                       # the root of both trees
BrokerResponseError = ShmlogError              # kafka-python: any error the broker answered
KafkaTimeoutError = ClientTimeoutError         # get(timeout), flush(timeout)
NoBrokersAvailable = BrokerNotAvailableError   # no broker answers on the data directory
KafkaConnectionError = BrokerNotAvailableError
NodeNotReadyError = BrokerNotAvailableError
KafkaConfigurationError = InvalidConfigError   # a client setting (UnsupportedKafkaOption too)
InvalidConfigurationError = InvalidConfigError  # a topic setting the broker refused
IllegalArgumentError = LocalProtocolError
TopicAlreadyExistsError = TopicExistsError
InvalidReplicationAssignmentError = InvalidReplicaAssignmentError
MessageSizeTooLargeError = RecordTooLargeError
NotCoordinatorForGroupError = NotCoordinatorError
GroupCoordinatorNotAvailableError = CoordinatorNotAvailableError
GroupLoadInProgressError = CoordinatorLoadInProgressError
NotLeaderForPartitionError = NotLeaderOrFollowerError
OutOfOrderSequenceNumberError = OutOfOrderSequenceError
KafkaStorageError = StorageError
