"""Idempotent producers: what the appender remembers of each producer's last batches per
partition, and the verdict on a batch's sequence (Kafka's ``ProducerStateManager``).

Rules
-----
* One table for every hosted partition: (row, producer id) -> the producer's window
  (``storage.producer_window``): its epoch, the next sequence expected, and its last
  :data:`limits.PRODUCER_BATCHES_MAX` appended batches' first and last sequences and
  base offsets (Kafka's ``NUM_BATCHES_TO_RETAIN``). A batch without a producer id
  (-1) is never checked nor remembered.
* The compiled loop reads and writes the table itself (:attr:`ProducerStateTable.sequences`,
  through :func:`check_sequence` and :func:`remember_sequence`); Python goes through
  :class:`ProducerStateTable`. Both run on the draining thread only.
* A refused batch changes nothing remembered: a batch is remembered only once it is
  in the log, as the log's copy holds it.

Theory of operation
-------------------
A batch with a producer id carries the per-partition sequence number of its first
record, and the producer's epoch. Under the same epoch, a batch whose first and last
sequences are those of one of the last five batches is a re-send of it (a Kafka
producer keeps up to five requests in flight per connection and re-sends them when
it drops; or a broker died after appending a batch but before acknowledging it, and
the new broker found it still in the ring): it is acknowledged with that batch's
own base offset and not appended again. A Kafka client's batch the broker stored in
pieces (``kafka_batches.from_kafka``: its stored form passed ``max.message.bytes``)
is checked and remembered as its client sent it, from its first sequence to its
last piece's last (``LogAppends.append_batch``); where its pieces are remembered
one by one (the log's walk after a restart, a follower's appends), a re-send
matches the run of them (``producer_window.window_duplicate``), as long as the
window still holds its first piece. Any other sequence but the next expected is
out of order, a re-send of a batch older than those five too (Kafka answers it
``OUT_OF_ORDER_SEQUENCE_NUMBER``: its ``checkSequence`` compares the first sequence
with the last batch's alone once no batch held matches). A higher epoch must start
again at sequence 0 (KIP-360: a producer whose batch was refused bumps its epoch and
resets the partition's sequence once nothing of it is in flight, since the refused
batch left a gap); a lower epoch is fenced (``INVALID_PRODUCER_EPOCH``).

The memory is rebuilt from the whole log when a partition is opened, and after a
truncation: the producer snapshot below the active segment (each producer's last
five batches) and a walk of that segment (``PartitionLog.producer_batches``,
``producer_snapshots``), so every window comes back as far as the log still holds
its batches. A follower's appends are remembered unchecked
(:meth:`ProducerStateTable.remember_batches`), so the replica that becomes leader
knows every producer's last five batches.
"""

from __future__ import annotations

import numpy as np

from ...native import typed_containers as typed
from ...native.jit import kernel, load_i16, load_i32, load_i64, load_u16
from ...record import batch_layout as B
from ...record.records import batch_frame
from ...shm.completion import CompletionCode
from ...storage.producer_window import (
    EPOCH,
    HELD,
    NEXT_SEQUENCE,
    last_sequence,
    window_duplicate,
    window_fence,
    window_of,
    window_push,
)

__all__ = ["ProducerStateTable", "check_sequence", "remember_sequence", "sequence_refusal",
           "SEQUENCE_NEW", "SEQUENCE_DUPLICATE", "SEQUENCE_OUT_OF_ORDER", "SEQUENCE_FENCED"]

# A batch's sequence verdict
SEQUENCE_NEW = 0               # append, then remember
SEQUENCE_DUPLICATE = 1         # acknowledge with the remembered base offset
SEQUENCE_OUT_OF_ORDER = 2
SEQUENCE_FENCED = 3            # an epoch older than the remembered one


@kernel
def check_sequence(sequences, row, producer_id, producer_epoch, base_sequence,
                   last_offset_delta):
    """(verdict, base offset to acknowledge a duplicate with) of a batch whose
    records span ``base_sequence`` to ``base_sequence + last_offset_delta``."""
    if producer_id < 0:
        return SEQUENCE_NEW, -1
    window = window_of(sequences, (row, producer_id))
    epoch = window[EPOCH]
    if producer_epoch < epoch:
        return SEQUENCE_FENCED, -1
    if window[HELD] == 0:
        return SEQUENCE_NEW, -1
    if producer_epoch > epoch:
        return (SEQUENCE_NEW if base_sequence == 0 else SEQUENCE_OUT_OF_ORDER), -1
    duplicate_offset = window_duplicate(window, base_sequence,
                                        last_sequence(base_sequence, last_offset_delta))
    if duplicate_offset >= 0:
        return SEQUENCE_DUPLICATE, duplicate_offset
    if base_sequence != window[NEXT_SEQUENCE]:
        return SEQUENCE_OUT_OF_ORDER, -1
    return SEQUENCE_NEW, -1


@kernel
def remember_sequence(sequences, row, producer_id, producer_epoch, base_sequence, base_offset,
                      record_count):
    """Remember a batch of ``record_count`` records appended at ``base_offset``: the
    newest of its producer's window."""
    if producer_id >= 0:
        key = (row, producer_id)
        sequences[key] = window_push(window_of(sequences, key), producer_epoch,
                                     base_sequence, last_sequence(base_sequence, record_count - 1),
                                     base_offset)


@kernel
def fence_epoch(sequences, row, producer_id, producer_epoch):
    """An end-transaction marker of ``producer_epoch`` was appended for the producer:
    ``producer_window.window_fence``."""
    if producer_id >= 0:
        key = (row, producer_id)
        sequences[key] = window_fence(window_of(sequences, key), producer_epoch)


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
    """Remember every producer's batches in a (valid) segment, in order: each window
    ends with that producer's last ones."""
    position = 0
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            return
        producer_id = load_i64(log, position + B.PRODUCER_ID_OFFSET)
        epoch = np.int64(load_i16(log, position + B.PRODUCER_EPOCH_OFFSET))
        if load_u16(log, position + B.ATTRIBUTES_OFFSET) & B.CONTROL_BIT:
            fence_epoch(sequences, row, producer_id, epoch)
        else:
            remember_sequence(sequences, row, producer_id, epoch,
                              np.int64(load_i32(log, position + B.BASE_SEQUENCE_OFFSET)),
                              load_i64(log, position + B.BASE_OFFSET_OFFSET),
                              np.int64(load_i32(log, position + B.LAST_OFFSET_DELTA_OFFSET)) + 1)
        position += length


@kernel
def _remember_producers(sequences, row, producers):
    """Remember the producers' last batches a log gives
    (``PartitionLog.producer_batches``: id, epoch, base sequence, base offset, last
    offset delta per row; a producer's rows in log order) for the partition at ``row``."""
    for index in range(producers.shape[0]):
        remember_sequence(sequences, row, producers[index, 0], producers[index, 1],
                          producers[index, 2], producers[index, 3], producers[index, 4] + 1)


class ProducerStateTable:
    """Every hosted partition's producers and their last batches (see the module's
    rules), by the partition's row."""

    def __init__(self):
        # (row, producer id) -> the producer's window (storage.producer_window); the
        # compiled loop takes it as it is.
        self.sequences = typed.sequence_table()

    def check(self, row: int, producer_id: int, producer_epoch: int, base_sequence: int,
              last_offset_delta: int) -> tuple[int, int]:
        """The verdict on a batch's sequence (``SEQUENCE_*``), and the base offset to
        acknowledge it with when it is a duplicate (else -1)."""
        return check_sequence(self.sequences, row, producer_id, producer_epoch, base_sequence,
                              last_offset_delta)

    def remember(self, row: int, producer_id: int, producer_epoch: int, base_sequence: int,
                 base_offset: int, record_count: int) -> None:
        """Remember a batch appended to the partition at ``row``."""
        remember_sequence(self.sequences, row, producer_id, producer_epoch, base_sequence,
                          base_offset, record_count)

    def fence(self, row: int, producer_id: int, producer_epoch: int) -> None:
        """A marker of the producer's at ``producer_epoch`` was appended to the partition
        at ``row``: :func:`fence_epoch`."""
        fence_epoch(self.sequences, row, producer_id, producer_epoch)

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
