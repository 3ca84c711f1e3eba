"""Forwarding's codes: what a ring's refusal is called on the wire (Kafka's Errors for
the same refusal, ``ReplicaManager.appendRecords``' answers) and back, and which
answers make the forwarder send the batch again (Kafka's retriable errors).

Method: plain numbers, table-style.
"""

from __future__ import annotations

import pytest

from shmlog.cluster.replication.forwarding import RETRIABLE_ERRORS, completion_result, wire_error
from shmlog.cluster.replication.messages import ErrorCode
from shmlog.record.records import BatchStatus
from shmlog.shm.completion import CompletionCode

ROUND_TRIPS = [
    (CompletionCode.UNKNOWN_PARTITION, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (CompletionCode.RECORD_TOO_LARGE, ErrorCode.MESSAGE_TOO_LARGE),
    (CompletionCode.STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
    (CompletionCode.OUT_OF_ORDER_SEQUENCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (CompletionCode.INTERNAL_TOPIC, ErrorCode.INVALID_REQUEST),
    (CompletionCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_EPOCH),
    (CompletionCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS),
    (CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    (CompletionCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (CompletionCode.REQUEST_TIMED_OUT, ErrorCode.REQUEST_TIMED_OUT),
    (CompletionCode.INVALID_TXN_STATE, ErrorCode.INVALID_TXN_STATE),
    (BatchStatus.BAD_CRC, ErrorCode.CORRUPT_MESSAGE),
    (BatchStatus.BAD_RECORD, ErrorCode.INVALID_RECORD),
]


@pytest.mark.parametrize("code, error", ROUND_TRIPS)
def test_a_refusal_crosses_the_wire_and_comes_back_as_itself(code, error):
    assert wire_error(-int(code)) is error
    assert completion_result(error, -1) == -int(code)


@pytest.mark.parametrize("code", [BatchStatus.BAD_MAGIC, BatchStatus.BAD_COMPRESSION,
                                  CompletionCode.NOT_ONE_BATCH])
def test_other_bad_batches_are_invalid_records(code):
    assert wire_error(-int(code)) is ErrorCode.INVALID_RECORD


def test_a_leader_at_a_process_limit_is_a_storage_error_on_the_wire():
    assert wire_error(-int(CompletionCode.RESOURCE_LIMIT)) is ErrorCode.KAFKA_STORAGE_ERROR
    assert completion_result(ErrorCode.KAFKA_STORAGE_ERROR, -1) == -CompletionCode.STORAGE_ERROR


def test_an_answer_with_no_refusal_of_ours_is_an_unknown_outcome():
    assert completion_result(ErrorCode.NONE, 42) == 42
    assert completion_result(ErrorCode.STALE_BROKER_EPOCH, -1) == \
        -CompletionCode.REQUEST_TIMED_OUT


def test_the_forwarder_retries_what_kafkas_producer_retries_and_nothing_final():
    assert {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.REQUEST_TIMED_OUT} <= RETRIABLE_ERRORS
    assert not {ErrorCode.NONE, ErrorCode.NOT_ENOUGH_REPLICAS,
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.MESSAGE_TOO_LARGE} & RETRIABLE_ERRORS
