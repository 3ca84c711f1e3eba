"""What the appender tells a producer about a ring entry: the codes of a refusal,
and the wrap of the idempotent producer's sequence numbers.

Rules
-----
* The appender completes every ring entry with a result: the batch's base offset
  (>= 0) when it was appended, ``-code`` when it was refused. Codes below 100 are
  the :class:`~shmlog.record.records.BatchStatus` the batch failed validation with; the
  :class:`CompletionCode` members are the appender's own refusals. The values are
  in shared memory between two processes: they never change.
* A refused batch was not appended and used no sequence number, with two
  exceptions: ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` names a batch that *is* in the
  log (acks=all: the in-sync replicas fell under ``min.insync.replicas`` before it
  was committed), so its sequence is used; ``REQUEST_TIMED_OUT`` (a forwarded batch
  the leader never answered) leaves both unknown.
* Both sides count a partition's sequence numbers modulo :data:`SEQUENCE_MODULUS`,
  so they agree where the sequence wraps.
* The producer imports this module and the appender imports it back, so it
  imports nothing but the error tree: a producer loads neither the appender nor
  the log (the ring's two ends share these numbers, not code).
"""

from __future__ import annotations

import enum

from ..common.errors import (
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
    ShmlogError,
    StorageError,
    UnknownTopicOrPartitionError,
)

__all__ = ["CompletionCode", "SEQUENCE_MODULUS", "completion_error"]


class CompletionCode(enum.IntEnum):
    """Why an entry was not appended; its completion result is ``-code``. Codes
    below 100 are the :class:`~shmlog.record.records.BatchStatus` the batch failed with."""
    UNKNOWN_PARTITION = 100
    RECORD_TOO_LARGE = 101
    STORAGE_ERROR = 102
    NOT_ONE_BATCH = 103        # the entry holds bytes beyond its one batch
    OUT_OF_ORDER_SEQUENCE = 104  # an idempotent producer skipped or reordered a sequence
    INTERNAL_TOPIC = 105       # producers may not append to an internal topic (as in Kafka)
    INVALID_PRODUCER_EPOCH = 106  # older than an epoch the producer id already appended with
    # acks=all (Kafka's Partition.appendRecordsToLeader and checkEnoughReplicasReachOffset)
    NOT_ENOUGH_REPLICAS = 107  # the ISR was under min.insync.replicas: nothing appended
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 108  # appended (sequence used), but the ISR fell
    #                            under min.insync.replicas by the time the HW covered it
    NOT_LEADER_OR_FOLLOWER = 109  # leadership lost, or the batch truncated away: not in the log
    REQUEST_TIMED_OUT = 110    # a forwarded batch the leader never answered: outcome unknown
    RESOURCE_LIMIT = 111       # a process limit (open files, mappings) refused: nothing appended
    # Transactions (KIP-98): a producer writes no control batch (the coordinator writes
    # the markers: Kafka's INVALID_RECORD) and no transactional batch outside a
    # transaction it opened on the partition (Kafka's INVALID_TXN_STATE).
    INVALID_TXN_STATE = 112
    CONTROL_FROM_PRODUCER = 113
    # A cluster member's verifier asks a transaction coordinator on another broker
    # whether a batch's partition is in its producer's transaction: the batch is held
    # (``Appender.set_transaction_verifier``), never completed with this code.
    TRANSACTION_VERIFYING = 114


SEQUENCE_MODULUS = 1 << 31    # sequences wrap to 0 after 2**31 - 1, as in Kafka


def completion_error(code: int, topic: str, partition: int) -> ShmlogError:
    """The typed error of a refused batch (its completion result was ``-code``) for
    ``topic``-``partition``: what a producer raises from the batch's futures, and
    what the broker raises for a batch of its own that the appender refused."""
    where = f"{topic}-{partition}"
    if code == CompletionCode.UNKNOWN_PARTITION:
        return UnknownTopicOrPartitionError(f"{where} is not hosted by the broker any more")
    if code == CompletionCode.RECORD_TOO_LARGE:
        return RecordTooLargeError(f"the broker refused a batch for {where}: too large")
    if code == CompletionCode.STORAGE_ERROR:
        return StorageError(f"the broker could not write {where} (see its log)")
    if code == CompletionCode.RESOURCE_LIMIT:
        return ResourceLimitError(f"the broker could not write {where}: it is at a process "
                                  f"limit (RLIMIT_NOFILE or vm.max_map_count: its log says "
                                  f"which and how to raise it)")
    if code == CompletionCode.INTERNAL_TOPIC:
        return InvalidTopicError(f"cannot append to internal topic {topic!r}")
    if code == CompletionCode.INVALID_PRODUCER_EPOCH:
        return InvalidProducerEpochError(f"the broker fenced a batch for {where}: it has "
                                         f"appended a later epoch of this producer id")
    if code == CompletionCode.NOT_ENOUGH_REPLICAS:
        return NotEnoughReplicasError(f"the broker refused a batch for {where}: fewer in-sync "
                                      f"replicas than min.insync.replicas; nothing appended")
    if code == CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
        return NotEnoughReplicasAfterAppendError(
            f"a batch for {where} was appended, but the in-sync replicas fell under "
            f"min.insync.replicas before it was committed")
    if code == CompletionCode.NOT_LEADER_OR_FOLLOWER:
        return NotLeaderOrFollowerError(f"the broker no longer leads {where}: the batch is "
                                        f"not in its log; send it again")
    if code == CompletionCode.REQUEST_TIMED_OUT:
        return RequestTimedOutError(f"the leader of {where} did not answer for a forwarded "
                                    f"batch in time: it may or may not be in the log")
    if code == CompletionCode.INVALID_TXN_STATE:
        return InvalidTxnStateError(f"the broker refused a transactional batch for {where}: "
                                    f"the producer has no transaction open on it")
    if code == CompletionCode.TRANSACTION_VERIFYING:
        return ConcurrentTransactionsError(f"a transactional batch for {where} waits while "
                                           f"the coordinator verifies its partition: retry")
    if code == CompletionCode.CONTROL_FROM_PRODUCER:
        return CorruptRecordError(f"the broker refused a control batch for {where}: only the "
                                  f"transaction coordinator writes those", status=int(code))
    if code == CompletionCode.OUT_OF_ORDER_SEQUENCE:
        return OutOfOrderSequenceError(f"the broker expected another sequence number for "
                                       f"{where}: batches were lost or reordered")
    return CorruptRecordError(f"the broker refused a batch for {where}: code {code}",
                              status=int(code))
