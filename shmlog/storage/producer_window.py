"""A producer's window: what is remembered of one idempotent producer's last batches in
one partition (Kafka's ``ProducerStateEntry``), shared by the appender's sequence table
and the producer-state snapshots.

Rules
-----
* A window is a tuple of int64 (``typed_containers.WINDOW``), kept as a typed dict's
  value and changed only by the kernels here, which return a new window: its
  producer epoch, the next sequence expected, how many batches it holds (``HELD``),
  then for each batch held, newest first, its first sequence, last sequence and base
  offset. Only the first ``HELD`` batches are read.
* It holds the producer's last :data:`limits.PRODUCER_BATCHES_MAX` batches (Kafka's
  ``NUM_BATCHES_TO_RETAIN``) under its epoch: a batch of another epoch starts it
  again with that batch alone (Kafka's ``maybeUpdateProducerEpoch`` clears the
  batches), and the oldest goes when a batch comes to a full window.
* A batch held is a duplicate of a new one when both its first and last sequence
  match (Kafka's ``batchWithSequenceRange``); so is a run of batches held, from one
  whose first sequence is the new one's to one (as new or newer) whose last is:
  a Kafka client's batch stored in pieces (``kafka_batches.from_kafka``), which a
  leader remembers whole but a restart (the log's walk) and a follower remember
  piece by piece. The caller checks the epoch first.
* Sequences wrap to 0 after ``SEQUENCE_MODULUS - 1``, as Kafka's ``incrementSequence``.
* :data:`EMPTY_WINDOW` holds nothing (``HELD`` 0): the start of every producer.
* An end-transaction marker is no batch of its producer's: it takes no sequence and
  only raises the window's epoch (:func:`window_fence`), so a zombie of an older
  epoch is fenced even before the new epoch's first batch.

Theory of operation
-------------------
Kafka's producers keep up to five requests in flight per connection: when a
connection drops, any of them may be re-sent after later ones were appended, and
the broker must acknowledge each with the offset it was first given, not append
it again. A window of the last five batches (first and last sequence, base offset:
three words each) with the epoch and next sequence is 18 words, held inline in the
dict entry: no allocation per producer, and a duplicate search is a scan of five
pairs in three cache lines. A tuple is immutable in numba, so a push builds
the next window whole: the new header and batch, then the batches held but the
oldest, one place older (a slice of constant bounds, so no word is copied twice).
The kernels are inlined into their callers, the drain's per-batch checks among them:
called, a push that passes and returns 18 words measured ~100 ns, inlined a few. A
window is read from its dict in one lookup (``typed_containers.get_or``).
"""

from __future__ import annotations

import numpy as np

from ..common import limits
from ..native import typed_containers as typed
from ..native.jit import kernel
from ..shm.completion import SEQUENCE_MODULUS

__all__ = ["EMPTY_WINDOW", "WINDOW_WORDS", "EPOCH", "NEXT_SEQUENCE", "HELD",
           "window_of", "window_push", "window_fence", "window_duplicate", "window_batch",
           "window_last_offset", "last_sequence"]

# The window's words: a header, then the batches held, newest first.
EPOCH = 0
NEXT_SEQUENCE = 1
HELD = 2
BATCHES = 3
# A batch's words, from BATCHES + BATCH_WORDS * age (age 0: the newest).
FIRST_SEQUENCE = 0
LAST_SEQUENCE = 1
BASE_OFFSET = 2
BATCH_WORDS = 3

# typed_containers.WINDOW, the dicts' value type, is this wide (a test holds them equal).
WINDOW_WORDS = BATCHES + BATCH_WORDS * limits.PRODUCER_BATCHES_MAX
EMPTY_WINDOW = (0,) * WINDOW_WORDS                 # a global tuple: a constant to numba
_OLDEST = WINDOW_WORDS - BATCH_WORDS                # where a full window's oldest batch is


@kernel(inline="always")
def last_sequence(first_sequence, last_offset_delta):
    """The sequence of a batch's last record (Kafka's ``DefaultRecordBatch.lastSequence``)."""
    return (first_sequence + last_offset_delta) % SEQUENCE_MODULUS


@kernel(inline="always")
def window_of(table, key):
    """The window a typed dict holds for ``key``, or :data:`EMPTY_WINDOW`."""
    return typed.get_or(table, key, EMPTY_WINDOW)


@kernel(inline="always")
def window_push(window, epoch, first_sequence, last_sequence, base_offset):
    """``window`` with the batch given as its newest: alone if the epoch is another
    (or the window is empty), else the oldest dropped from a full window.

    Built whole, as one tuple of the new header, the new batch and the batches held
    but the oldest (slices of constant bounds): words past ``HELD`` batches may hold
    an earlier epoch's batches, which nothing reads."""
    held = window[HELD] if window[HELD] > 0 and window[EPOCH] == epoch else 0
    return (np.int64(epoch), np.int64((last_sequence + 1) % SEQUENCE_MODULUS),
            np.int64(min(held + 1, limits.PRODUCER_BATCHES_MAX)), np.int64(first_sequence),
            np.int64(last_sequence), np.int64(base_offset)) + window[BATCHES:_OLDEST]


@kernel(inline="always")
def window_fence(window, epoch):
    """``window`` after an end-transaction marker of ``epoch``: a higher epoch holds no
    batch and fences every lower one (Kafka's ``appendEndTxnMarker`` bumps the entry's
    epoch); the same or a lower one changes nothing. A marker takes no sequence."""
    if epoch <= window[EPOCH]:
        return window
    return (np.int64(epoch), np.int64(0), np.int64(0)) + window[BATCHES:]


@kernel(inline="always")
def window_duplicate(window, first_sequence, last_sequence):
    """The base offset of the batch held whose first sequence is ``first_sequence``
    when it, or a batch held after it, ends at ``last_sequence``; else -1.

    Under one epoch the batches held run on without a gap (any other sequence is
    refused before it is remembered), so the batches from the first match to the
    last are the pieces of the batch asked about, or that batch itself."""
    ends_at = -1                    # the oldest age seen so far ending at last_sequence
    for age in range(window[HELD]):
        batch = BATCHES + BATCH_WORDS * age
        if window[batch + LAST_SEQUENCE] == last_sequence and ends_at < 0:
            ends_at = age
        if window[batch + FIRST_SEQUENCE] == first_sequence:
            return window[batch + BASE_OFFSET] if ends_at >= 0 else -1
    return -1


@kernel(inline="always")
def window_batch(window, age):
    """(first sequence, last sequence, base offset) of the batch held ``age`` places
    before the newest (0: the newest)."""
    batch = BATCHES + BATCH_WORDS * age
    return (window[batch + FIRST_SEQUENCE], window[batch + LAST_SEQUENCE],
            window[batch + BASE_OFFSET])


@kernel(inline="always")
def window_last_offset(window, age):
    """The last offset of the batch held ``age`` places before the newest: its base
    offset and its records' span of sequences."""
    first, last, base_offset = window_batch(window, age)
    return base_offset + (last - first) % SEQUENCE_MODULUS
