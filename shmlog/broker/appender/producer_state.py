"""Idempotent producers: what the appender remembers of each producer's last batches
per partition, and the verdict on a batch's sequence (Kafka's ``ProducerStateManager``).

Rules
-----
* One table for every hosted partition: (row, producer id) -> the producer's epoch,
  the next sequence expected, and its last :data:`BATCHES_RETAINED` batches' (first
  sequence, base offset), newest last (Kafka's ``NUM_BATCHES_TO_RETAIN``: a client
  keeps up to five requests in flight, and after a reconnection re-sends them all).
  A batch without a producer id (-1) is never checked nor remembered.
* The compiled loop reads and writes the table itself (:attr:`ProducerStateTable.sequences`,
  through :func:`check_sequence` and :func:`remember_sequence`); Python goes through
  :class:`ProducerStateTable`. Both run on the draining thread only.
* A refused batch changes nothing remembered: a batch is remembered only once it is
  in the log, as the log's copy holds it.

Theory of operation
-------------------
A batch with a producer id carries the per-partition sequence number of its first
record, and the producer's epoch. Under the same epoch, a batch whose first sequence
is one of the remembered batches' is a re-send of it (a broker died after appending
it but before acknowledging it, or a client re-sent its requests in flight after a
reconnection): it is acknowledged with that batch's base offset and not appended
again; a sequence that is neither that nor the next expected is out of order. A
higher epoch must start again at sequence 0 (KIP-360: a producer whose batch was
refused bumps its epoch and resets the partition's sequence once nothing of it is in
flight, since the refused batch left a gap), and forgets the old epoch's batches; a
lower epoch is fenced (``INVALID_PRODUCER_EPOCH``). Each entry is 12 words (96
bytes) per producer and partition.

The memory is rebuilt from the whole log when a partition is opened, and after a
truncation: the producer snapshot below the active segment (the last batch of each
producer, as Kafka's snapshot keeps) and a walk of that segment, which remembers its
batches in order (``PartitionLog.producer_batches``, ``producer_snapshots``). A
follower's appends are remembered unchecked (:meth:`ProducerStateTable.remember_batches`),
so the replica that becomes leader knows every producer's last batches.
"""

from __future__ import annotations

import numpy as np

from ...native import typed_containers as typed
from ...native.jit import kernel, load_i16, load_i32, load_i64
from ...record import batch_layout as B
from ...record.records import batch_frame
from ...shm.completion import SEQUENCE_MODULUS, CompletionCode

__all__ = ["ProducerStateTable", "check_sequence", "remember_sequence", "sequence_refusal",
           "SEQUENCE_NEW", "SEQUENCE_DUPLICATE", "SEQUENCE_OUT_OF_ORDER", "SEQUENCE_FENCED",
           "BATCHES_RETAINED"]

# A batch's sequence verdict
SEQUENCE_NEW = 0               # append, then remember
SEQUENCE_DUPLICATE = 1         # acknowledge with the remembered base offset
SEQUENCE_OUT_OF_ORDER = 2
SEQUENCE_FENCED = 3            # an epoch older than the remembered one


BATCHES_RETAINED = 5                 # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
_EMPTY = -1                          # a batch slot not used yet


@kernel
def check_sequence(sequences, row, producer_id, producer_epoch, base_sequence):
    """(verdict, base offset to acknowledge a duplicate with)."""
    key = (row, producer_id)
    if producer_id < 0 or key not in sequences:
        return SEQUENCE_NEW, -1
    entry = sequences[key]
    epoch = entry[0]
    if producer_epoch < epoch:
        return SEQUENCE_FENCED, -1
    if producer_epoch > epoch:
        return (SEQUENCE_NEW if base_sequence == 0 else SEQUENCE_OUT_OF_ORDER), -1
    for slot in range(BATCHES_RETAINED):
        first = entry[2 + 2 * slot]
        if first != _EMPTY and first == base_sequence:
            return SEQUENCE_DUPLICATE, entry[3 + 2 * slot]
    if base_sequence != entry[1]:
        return SEQUENCE_OUT_OF_ORDER, -1
    return SEQUENCE_NEW, -1


@kernel
def remember_sequence(sequences, row, producer_id, producer_epoch, base_sequence, base_offset,
                      record_count):
    if producer_id < 0:
        return
    key = (row, producer_id)
    following = (base_sequence + record_count) % SEQUENCE_MODULUS
    if key in sequences and sequences[key][0] == producer_epoch:
        old = sequences[key]          # the oldest of the five makes room
        sequences[key] = (producer_epoch, following, old[4], old[5], old[6], old[7],
                          old[8], old[9], old[10], old[11], base_sequence, base_offset)
    else:                             # new, or a new epoch: its batches start again
        sequences[key] = (producer_epoch, following, _EMPTY, _EMPTY, _EMPTY, _EMPTY,
                          _EMPTY, _EMPTY, _EMPTY, _EMPTY, base_sequence, base_offset)


@kernel
def sequence_refusal(verdict):
    """The completion result of a batch its sequence keeps out (0: none)."""
    if verdict == SEQUENCE_OUT_OF_ORDER:
        return -CompletionCode.OUT_OF_ORDER_SEQUENCE.value
    if verdict == SEQUENCE_FENCED:
        return -CompletionCode.INVALID_PRODUCER_EPOCH.value
    return 0


@kernel
def _forget_sequences(sequences, row):
    """Forget every producer's sequence for the partition at ``row``. Compiled (and
    so cached on disk): a typed dict walked from Python compiles its iterator in
    every process, which stalled a broker's first topic deletion for seconds."""
    stale = [key for key in sequences.keys() if key[0] == row]
    for key in stale:
        del sequences[key]


@kernel
def _rebuild_sequences(log, end, row, sequences):
    """Remember every producer's batches of a (valid) segment, in order (so its last
    ``BATCHES_RETAINED``)."""
    position = 0
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return
        remember_sequence(sequences, row, load_i64(log, position + B.PRODUCER_ID_OFFSET),
                          np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET)),
                          np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                          load_i64(log, position + B.BASE_OFFSET_OFFSET),
                          np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)) + 1)
        position += length


@kernel
def _remember_producers(sequences, row, producers):
    """Remember the producers' last batches a log gives
    (``PartitionLog.producer_batches``: id, epoch, base sequence, base offset, last
    offset delta per row) for the partition at ``row``."""
    for index in range(producers.shape[0]):
        remember_sequence(sequences, row, producers[index, 0], producers[index, 1],
                          producers[index, 2], producers[index, 3], producers[index, 4] + 1)


class ProducerStateTable:
    """Every hosted partition's producers and their last batches (see the module's
    rules), by the partition's row."""

    def __init__(self):
        # (row, producer id) -> (epoch, next sequence, five (first sequence, base
        # offset), newest last); the compiled loop takes it as it is.
        self.sequences = typed.sequence_table()

    def check(self, row: int, producer_id: int, producer_epoch: int,
              base_sequence: int) -> tuple[int, int]:
        """The verdict on a batch's sequence (``SEQUENCE_*``), and the base offset to
        acknowledge it with when it is a duplicate (else -1)."""
        return check_sequence(self.sequences, row, producer_id, producer_epoch, base_sequence)

    def remember(self, row: int, producer_id: int, producer_epoch: int, base_sequence: int,
                 base_offset: int, record_count: int) -> None:
        """Remember a batch appended to the partition at ``row``."""
        remember_sequence(self.sequences, row, producer_id, producer_epoch, base_sequence,
                          base_offset, record_count)

    def remember_batches(self, row: int, batches: np.ndarray) -> None:
        """Remember every producer's batches in ``batches`` (whole, valid batches
        appended to the partition at ``row``), unchecked."""
        _rebuild_sequences(batches, batches.size, row, self.sequences)

    def remember_producers(self, row: int, producers: np.ndarray) -> None:
        """Remember the producers' last batches a log gives
        (``PartitionLog.producer_batches``) for the partition at ``row``."""
        _remember_producers(self.sequences, row, producers)

    def forget(self, row: int) -> None:
        """Forget every producer of the partition at ``row``."""
        _forget_sequences(self.sequences, row)
