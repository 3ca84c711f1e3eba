"""What the appender tells a producer about a ring entry: the codes of a refusal,
and the wrap of the idempotent producer's sequence numbers.

Rules
-----
* The appender completes every ring entry with a result: the batch's base offset
  (>= 0) when it was appended, ``-code`` when it was refused. Codes below 100 are
  the :class:`~shmlog.records.BatchStatus` the batch failed validation with; the
  :class:`CompletionCode` members are the appender's own refusals. The values are
  in shared memory between two processes: they never change.
* Both sides count a partition's sequence numbers modulo :data:`SEQUENCE_MODULUS`,
  so they agree where the sequence wraps.
* The producer imports this module and the appender imports it back, so it
  imports nothing: a producer loads neither the appender nor the log (the ring's
  two ends share these numbers, not code).
"""

from __future__ import annotations

import enum

__all__ = ["CompletionCode", "SEQUENCE_MODULUS"]


class CompletionCode(enum.IntEnum):
    """Why an entry was not appended; its completion result is ``-code``. Codes
    below 100 are the :class:`~shmlog.records.BatchStatus` the batch failed with."""
    UNKNOWN_PARTITION = 100
    RECORD_TOO_LARGE = 101
    STORAGE_ERROR = 102
    NOT_ONE_BATCH = 103        # the entry holds bytes beyond its one batch
    OUT_OF_ORDER_SEQUENCE = 104  # an idempotent producer skipped or reordered a sequence
    INTERNAL_TOPIC = 105       # producers may not append to an internal topic (as in Kafka)
    INVALID_PRODUCER_EPOCH = 106  # older than an epoch the producer id already appended with


SEQUENCE_MODULUS = 1 << 31    # sequences wrap to 0 after 2**31 - 1, as in Kafka
