"""A producer's window: what is remembered of one idempotent producer's last batches in
one partition (Kafka's ``ProducerStateEntry``), shared by the appender's sequence table
and the producer-state snapshots.

Rules
-----
* A window is a tuple of int64 (``typed_containers.WINDOW``), kept as a typed dict's
  value and changed only by the kernels here, which return a new window: its
  producer epoch, the next sequence expected, how many batches it holds, then for
  each batch held, newest first, its first sequence, last sequence and base offset.
* It holds the producer's last :data:`limits.PRODUCER_BATCHES_MAX` batches (Kafka's
  ``NUM_BATCHES_TO_RETAIN``) under its epoch: a batch of another epoch starts it
  again with that batch alone (Kafka's ``maybeUpdateProducerEpoch`` clears the
  batches), and the oldest goes when a batch comes to a full window.
* A batch held is a duplicate of a new one when both its first and last sequence
  match (Kafka's ``batchWithSequenceRange``); the caller checks the epoch first.
* Sequences wrap to 0 after ``SEQUENCE_MODULUS - 1``, as Kafka's ``incrementSequence``.
* :data:`EMPTY_WINDOW` holds nothing (``HELD`` 0): the start of every producer.

Theory of operation
-------------------
Kafka's producers keep up to five requests in flight per connection: when a
connection drops, any of them may be re-sent after later ones were appended, and
the broker must acknowledge each with the offset it was first given, not append
it again. A window of the last five batches (first and last sequence, base offset:
three words each) with the epoch and next sequence is 18 words, held inline in the
dict entry: no allocation per producer, and a duplicate search is a scan of five
pairs in one cache line or two. A tuple is immutable in numba, so a push builds
the next window through ``tuple_setitem`` (a store into a stack copy), shifting
the batches held one place older.
"""

from __future__ import annotations

from numba.cpython.unsafe.tuple import tuple_setitem

from ..common import limits
from ..native.jit import kernel
from ..shm.completion import SEQUENCE_MODULUS

__all__ = ["EMPTY_WINDOW", "WINDOW_WORDS", "EPOCH", "NEXT_SEQUENCE", "HELD",
           "window_of", "window_push", "window_duplicate", "window_batch", "window_last_offset",
           "last_sequence"]

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


@kernel
def last_sequence(first_sequence, last_offset_delta):
    """The sequence of a batch's last record (Kafka's ``DefaultRecordBatch.lastSequence``)."""
    return (first_sequence + last_offset_delta) % SEQUENCE_MODULUS


@kernel
def window_of(table, key):
    """The window a typed dict holds for ``key``, or :data:`EMPTY_WINDOW` (a dict's
    ``get`` gives an optional, which ``tuple_setitem`` does not take)."""
    if key in table:
        return table[key]
    return EMPTY_WINDOW


@kernel
def window_push(window, epoch, first_sequence, last_sequence, base_offset):
    """``window`` with the batch given as its newest: alone if the epoch is another
    (or the window is empty), else the oldest dropped from a full window."""
    held = window[HELD] if window[HELD] > 0 and window[EPOCH] == epoch else 0
    kept = min(held, limits.PRODUCER_BATCHES_MAX - 1)
    for age in range(kept, 0, -1):        # one place older, oldest first
        for word in range(BATCH_WORDS):
            window = tuple_setitem(window, BATCHES + BATCH_WORDS * age + word,
                                   window[BATCHES + BATCH_WORDS * (age - 1) + word])
    window = tuple_setitem(window, BATCHES + FIRST_SEQUENCE, first_sequence)
    window = tuple_setitem(window, BATCHES + LAST_SEQUENCE, last_sequence)
    window = tuple_setitem(window, BATCHES + BASE_OFFSET, base_offset)
    window = tuple_setitem(window, EPOCH, epoch)
    window = tuple_setitem(window, NEXT_SEQUENCE, (last_sequence + 1) % SEQUENCE_MODULUS)
    return tuple_setitem(window, HELD, kept + 1)


@kernel
def window_duplicate(window, first_sequence, last_sequence):
    """The base offset of the batch held whose first and last sequence are those
    given, or -1."""
    for age in range(window[HELD]):
        batch = BATCHES + BATCH_WORDS * age
        if window[batch + FIRST_SEQUENCE] == first_sequence \
                and window[batch + LAST_SEQUENCE] == last_sequence:
            return window[batch + BASE_OFFSET]
    return -1


@kernel
def window_batch(window, age):
    """(first sequence, last sequence, base offset) of the batch held ``age`` places
    before the newest (0: the newest)."""
    batch = BATCHES + BATCH_WORDS * age
    return (window[batch + FIRST_SEQUENCE], window[batch + LAST_SEQUENCE],
            window[batch + BASE_OFFSET])


@kernel
def window_last_offset(window, age):
    """The last offset of the batch held ``age`` places before the newest: its base
    offset and its records' span of sequences."""
    first, last, base_offset = window_batch(window, age)
    return base_offset + (last - first) % SEQUENCE_MODULUS
