"""The completion codes the appender writes into a producer's ring are frozen (two
processes share them), and each maps to the typed error a producer raises.

Method: table-style, plain numbers; the Kafka error each code stands for is named.
"""

from __future__ import annotations

import pytest

from shmlog.common.errors import (
    ConcurrentTransactionsError,
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidTopicError,
    InvalidTxnStateError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RequestTimedOutError,
    ResourceLimitError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from shmlog.shm.completion import CompletionCode, completion_error

# code, its value for ever, the error it maps to, words its message must carry
CODES = [
    (CompletionCode.UNKNOWN_PARTITION, 100, UnknownTopicOrPartitionError, "not hosted"),
    (CompletionCode.RECORD_TOO_LARGE, 101, RecordTooLargeError, "too large"),
    (CompletionCode.STORAGE_ERROR, 102, StorageError, "could not write"),
    (CompletionCode.NOT_ONE_BATCH, 103, CorruptRecordError, "code 103"),
    (CompletionCode.OUT_OF_ORDER_SEQUENCE, 104, OutOfOrderSequenceError, "sequence"),
    (CompletionCode.INTERNAL_TOPIC, 105, InvalidTopicError, "internal topic"),
    (CompletionCode.INVALID_PRODUCER_EPOCH, 106, InvalidProducerEpochError, "fenced"),
    # Kafka's NotEnoughReplicasException: refused before the append
    (CompletionCode.NOT_ENOUGH_REPLICAS, 107, NotEnoughReplicasError, "nothing appended"),
    # Kafka's NotEnoughReplicasAfterAppendException: in the log, not committed
    (CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 108, NotEnoughReplicasAfterAppendError,
     "was appended"),
    # Kafka's NotLeaderOrFollowerException
    (CompletionCode.NOT_LEADER_OR_FOLLOWER, 109, NotLeaderOrFollowerError, "no longer leads"),
    # Kafka's TimeoutException for a produce request
    (CompletionCode.REQUEST_TIMED_OUT, 110, RequestTimedOutError, "may or may not"),
    # the broker at its open-files or mappings limit (a StorageError, as Kafka's)
    (CompletionCode.RESOURCE_LIMIT, 111, ResourceLimitError, "process limit"),
    # transactions: what only a transaction (or its coordinator) may write
    (CompletionCode.INVALID_TXN_STATE, 112, InvalidTxnStateError, "no transaction open"),
    (CompletionCode.CONTROL_FROM_PRODUCER, 113, CorruptRecordError, "coordinator"),
    # a cluster's held batch (never a producer's answer): retriable
    (CompletionCode.TRANSACTION_VERIFYING, 114, ConcurrentTransactionsError, "verifies"),
]


def test_every_code_is_listed_once():
    assert sorted(code for code, *_ in CODES) == sorted(CompletionCode)


@pytest.mark.parametrize("code, value, error_type, words", CODES,
                         ids=[code.name for code, *_ in CODES])
def test_each_code_keeps_its_value_and_maps_to_its_error(code, value, error_type, words):
    assert code.value == value
    error = completion_error(int(code), "orders", 3)
    assert type(error) is error_type
    assert words in str(error)
    if code not in (CompletionCode.INTERNAL_TOPIC,):
        assert "orders-3" in str(error)


def test_a_batch_status_maps_to_a_corrupt_record_carrying_it():
    error = completion_error(7, "orders", 0)
    assert type(error) is CorruptRecordError and error.status == 7
